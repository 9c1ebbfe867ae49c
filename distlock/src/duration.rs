//! Human durations: `250ms`, `30s`, `5m`, `1h`, `1m30s`.

use std::time::Duration;

use lock_core::LockError;

/// Parses `500ms`, `30s`, `5m`, `2h`, `1m30s`, or a bare number of seconds.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) naming the bad text.
pub fn parse_duration(text: &str) -> Result<Duration, LockError> {
    let bad = || {
        LockError::config(format!(
            "bad duration {text:?}: use a number with a unit, like 500ms, 30s, 5m or 1h"
        ))
    };
    let text = text.trim();
    if text.is_empty() {
        return Err(bad());
    }
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err(bad());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(value),
            "s" => Duration::from_secs(value),
            "m" => Duration::from_secs(value.checked_mul(60).ok_or_else(bad)?),
            "h" => Duration::from_secs(value.checked_mul(3600).ok_or_else(bad)?),
            _ => return Err(bad()),
        };
        total = total.checked_add(part).ok_or_else(bad)?;
    }
    Ok(total)
}

/// Formats a duration the way [`parse_duration`] reads it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) || ms == 0 {
        format!("{ms}ms")
    } else if !ms.is_multiple_of(60_000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{}m", ms / 60_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("12").unwrap(), Duration::from_secs(12));
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "ms", "5x", "-1s", "1.5s", "s5", "99999999999999999999h"] {
            let err = parse_duration(bad).unwrap_err();
            assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{bad}");
        }
    }
}
