//! Who took a grant: host, process, program, an application label and the
//! time of the grant, written beside the lock by the backend at grant time
//! and read back by [`inspect`](crate::LockBackendExt::inspect) and
//! [`list`](crate::Listing::list), so an operator can tell which
//! process holds a key and since when.
//!
//! The details never replace the owner value a layout stores (other
//! clients compare it): each driver keeps them beside it (a side key, a
//! column, the value of an entry), in the compact text form of
//! [`HolderDetails::encode`].

use std::sync::{OnceLock, PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

use crate::error::{ErrorKind, LockError, Operation};

/// The longest label accepted, in bytes.
pub const MAX_LABEL_LEN: usize = 128;

/// The longest host or program name kept, in bytes (longer ones are cut at
/// a character boundary).
const MAX_NAME_LEN: usize = 128;

/// The longest encoded form [`HolderDetails::decode`] reads: the fields at
/// their longest, fully percent-encoded.
pub const MAX_ENCODED_LEN: usize = 3 * (MAX_LABEL_LEN + 2 * MAX_NAME_LEN) + 64;

/// What the encoded form escapes in its values: controls, and the
/// separators `;`, `=` and `%`.
const VALUE: &AsciiSet = &CONTROLS.add(b';').add(b'=').add(b'%').add(b' ');

/// Who took a grant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderDetails {
    /// The host name of the granting process.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// Its program name (the executable's file name).
    pub program: String,
    /// The label the application set ([`set_holder_label`]), if any.
    pub label: Option<String>,
    /// When the grant was made, in milliseconds since the Unix epoch, by
    /// the granting process's clock.
    pub granted_at_ms: u64,
}

/// The process facts, read once.
struct Process {
    host: String,
    pid: u32,
    program: String,
}

fn process() -> &'static Process {
    static PROCESS: OnceLock<Process> = OnceLock::new();
    PROCESS.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .unwrap_or_else(|| "unknown".to_owned());
        let program = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .or_else(|| std::env::args().next())
            .unwrap_or_else(|| "unknown".to_owned());
        Process {
            host: clip(host),
            pid: std::process::id(),
            program: clip(program),
        }
    })
}

fn clip(mut text: String) -> String {
    if text.len() > MAX_NAME_LEN {
        let mut end = MAX_NAME_LEN;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text.retain(|c| !c.is_control());
    text
}

/// The label, and the encoded process part (`h=..;p=..;n=..[;l=..]`)
/// built from it on first use: changed together, under one lock.
#[derive(Default)]
struct Label {
    label: Option<String>,
    encoded: Option<String>,
}

fn label_state() -> &'static RwLock<Label> {
    static LABEL: RwLock<Label> = RwLock::new(Label {
        label: None,
        encoded: None,
    });
    &LABEL
}

/// Sets the label every later grant of this process carries (for example
/// `"billing-worker/eu-1"`); `None` clears it.
///
/// # Errors
///
/// [`ErrorKind::InvalidArgument`] for a label longer than
/// [`MAX_LABEL_LEN`] bytes or with a control character.
pub fn set_holder_label(label: Option<&str>) -> Result<(), LockError> {
    if let Some(label) = label {
        if label.len() > MAX_LABEL_LEN {
            return Err(LockError::invalid_argument(
                Operation::Validate,
                format!("the holder label is longer than {MAX_LABEL_LEN} bytes"),
            ));
        }
        if label.chars().any(char::is_control) {
            return Err(LockError::invalid_argument(
                Operation::Validate,
                "the holder label contains a control character",
            ));
        }
    }
    *label_state()
        .write()
        .unwrap_or_else(PoisonError::into_inner) = Label {
        label: label.map(str::to_owned),
        encoded: None,
    };
    Ok(())
}

/// The label set with [`set_holder_label`].
pub fn holder_label() -> Option<String> {
    label_state()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .label
        .clone()
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `prefix` (the encoded process part) with the grant time appended, built
/// in one allocation (no `format!`: a grant's path on several drivers).
fn with_grant_time(prefix: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(prefix.len() + 3 + 20);
    out.push_str(prefix);
    out.push_str(";t=");
    // Writing into a String cannot fail.
    let _ = write!(out, "{}", now_ms());
    out
}

impl HolderDetails {
    /// This process, now.
    pub fn current() -> Self {
        Self::of_this_process(now_ms())
    }

    /// This process, with the grant made at `granted_at_ms`.
    pub fn of_this_process(granted_at_ms: u64) -> Self {
        let p = process();
        Self {
            host: p.host.clone(),
            pid: p.pid,
            program: p.program.clone(),
            label: holder_label(),
            granted_at_ms,
        }
    }

    /// This process's details for a grant made now, encoded
    /// ([`encode`](Self::encode)); the process part is built once per
    /// label.
    pub fn encode_current() -> String {
        let state = label_state();
        if let Some(prefix) = &state.read().unwrap_or_else(PoisonError::into_inner).encoded {
            return with_grant_time(prefix);
        }
        let mut state = state.write().unwrap_or_else(PoisonError::into_inner);
        let p = process();
        let encoded = Self {
            host: p.host.clone(),
            pid: p.pid,
            program: p.program.clone(),
            label: state.label.clone(),
            granted_at_ms: 0,
        }
        .encode_process();
        let out = with_grant_time(&encoded);
        state.encoded = Some(encoded);
        out
    }

    fn encode_process(&self) -> String {
        let mut out = format!(
            "h={};p={};n={}",
            utf8_percent_encode(&self.host, VALUE),
            self.pid,
            utf8_percent_encode(&self.program, VALUE)
        );
        if let Some(label) = &self.label {
            out.push_str(";l=");
            out.extend(utf8_percent_encode(label, VALUE));
        }
        out
    }

    /// The compact text form drivers store: `h=<host>;p=<pid>;n=<program>`
    /// then `;l=<label>` when set, then `;t=<ms since the epoch>`, values
    /// percent-encoded (`;`, `=`, `%`, spaces and controls).
    pub fn encode(&self) -> String {
        format!("{};t={}", self.encode_process(), self.granted_at_ms)
    }

    /// Reads [`encode`](Self::encode)'s form; `None` for anything else
    /// (another client's data, a truncated value, unknown fields are
    /// ignored so later versions can add some).
    pub fn decode(text: &str) -> Option<Self> {
        if text.len() > MAX_ENCODED_LEN {
            return None;
        }
        let (mut host, mut pid, mut program, mut label, mut at) = (None, None, None, None, None);
        for field in text.split(';') {
            let (name, value) = field.split_once('=')?;
            let decoded = || {
                percent_decode_str(value)
                    .decode_utf8()
                    .ok()
                    .map(|v| v.into_owned())
            };
            match name {
                "h" => host = Some(decoded()?),
                "p" => pid = Some(value.parse().ok()?),
                "n" => program = Some(decoded()?),
                "l" => label = Some(decoded()?),
                "t" => at = Some(value.parse().ok()?),
                _ => {}
            }
        }
        Some(Self {
            host: host?,
            pid: pid?,
            program: program?,
            label,
            granted_at_ms: at?,
        })
    }

    /// When the grant was made.
    pub fn granted_at(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.granted_at_ms)
    }
}

/// The refusal of an admin operation a backend does not have.
pub(crate) fn unsupported_admin(backend: &'static str, what: &str) -> LockError {
    LockError::new(
        ErrorKind::Unsupported,
        Operation::Inspect,
        format!("{backend} does not support {what}"),
    )
    .with_backend(backend)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn details_round_trip_and_escape_separators() {
        let details = HolderDetails {
            host: "web-1;x=y".into(),
            pid: 4242,
            program: "my prog%".into(),
            label: Some("billing/eu-1 = main".into()),
            granted_at_ms: 1_764_000_000_123,
        };
        let text = details.encode();
        assert_eq!(text.matches(';').count(), 4, "{text}");
        assert_eq!(HolderDetails::decode(&text), Some(details.clone()));
        let no_label = HolderDetails {
            label: None,
            ..details
        };
        assert_eq!(HolderDetails::decode(&no_label.encode()), Some(no_label));
    }

    #[test]
    fn other_data_is_not_details() {
        for text in [
            "",
            "0123456789abcdef0123456789abcdef",
            "h=a;p=1;n=b",
            "h=a;p=x;n=b;t=1",
            "h=a;p=1;n=b;t=",
            "garbage;p=1",
        ] {
            assert_eq!(HolderDetails::decode(text), None, "{text:?}");
        }
        assert_eq!(
            HolderDetails::decode(&"h=a;p=1;n=b;t=1;".repeat(200)),
            None,
            "too long"
        );
        // Unknown fields are skipped.
        let d = HolderDetails::decode("h=a;p=1;n=b;t=5;future=1").unwrap();
        assert_eq!(d.granted_at_ms, 5);
    }

    #[test]
    fn current_details_name_this_process_and_its_label() {
        set_holder_label(Some("worker/7")).unwrap();
        let d = HolderDetails::decode(&HolderDetails::encode_current()).unwrap();
        assert_eq!(d.pid, std::process::id());
        assert_eq!(d.label.as_deref(), Some("worker/7"));
        assert!(!d.host.is_empty() && !d.program.is_empty());
        assert!(d.granted_at_ms > 1_700_000_000_000);
        assert!(set_holder_label(Some("a\nb")).is_err());
        assert!(set_holder_label(Some(&"x".repeat(MAX_LABEL_LEN + 1))).is_err());
        set_holder_label(None).unwrap();
        let d = HolderDetails::decode(&HolderDetails::encode_current()).unwrap();
        assert_eq!(d.label, None);
    }
}
