//! Human durations: `250ms`, `30s`, `5m`, `1h`, `1m30s`.

use std::time::Duration;

use lock_core::LockError;

/// Parses `500ms`, `30s`, `5m`, `2h`, `1m30s`, `1.5s` (a unit is required;
/// a bare `0` is zero), with the family's one parser
/// ([`lock_core::parse_duration`]), so a URL option, a config file and a
/// command-line flag read durations the same way.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) naming the bad text.
pub fn parse_duration(text: &str) -> Result<Duration, LockError> {
    lock_core::parse_duration(text).ok_or_else(|| {
        LockError::config(format!(
            "bad duration {text:?}: use a number with a unit, like 500ms, 30s, 5m or 1h"
        ))
    })
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
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(30)), "30s");
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "ms", "5x", "-1s", "12", "s5", "99999999999999999999h"] {
            let err = parse_duration(bad).unwrap_err();
            assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{bad}");
        }
    }
}
