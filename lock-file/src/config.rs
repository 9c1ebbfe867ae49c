//! [`FileConfig`]: the lock directory, from a `file:///path/to/dir` URL or
//! built by hand.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};

use lock_core::endpoint::Endpoint;
use lock_core::{LockError, OwnerId};

/// Where the lock files live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileConfig {
    dir: PathBuf,
}

impl FileConfig {
    /// The locks under `dir` (an absolute path to an existing, writable
    /// directory; checked by [`check`](Self::check) when connecting).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Reads `file:///path/to/dir` (or `file://localhost/path/to/dir`).
    /// The path is percent-decoded; no option is accepted.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for another
    /// scheme, a host other than `localhost`, a relative or empty path, or
    /// any option.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::from_endpoint(Endpoint::parse(url)?)
    }

    /// The config of a parsed URL (what the facade hands the driver; see
    /// [`from_url`](Self::from_url) for the URL's form).
    ///
    /// # Errors
    ///
    /// As [`from_url`](Self::from_url).
    pub fn from_endpoint(mut endpoint: Endpoint) -> Result<Self, LockError> {
        const FORM: &str = "a file URL is file:///absolute/path/to/dir";
        if endpoint.scheme() != "file" || !endpoint.has_authority() {
            return Err(LockError::config(FORM));
        }
        endpoint.options().finish("file")?;
        let host = endpoint.raw_base()["file://".len()..]
            .split('/')
            .next()
            .unwrap_or("");
        if !host.is_empty() && !host.eq_ignore_ascii_case("localhost") {
            return Err(LockError::config(format!(
                "{FORM}: the host must be empty or localhost (file locks are for one host), \
                 got {host:?}"
            )));
        }
        let path = endpoint.path()?;
        if path.is_empty() || !Path::new(&path).is_absolute() {
            return Err(LockError::config(format!("{FORM}: no absolute path")));
        }
        Ok(Self::new(path))
    }

    /// The lock directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Checks that the directory is absolute, exists, is a directory and
    /// that files can be created in it (by creating and removing a probe
    /// file: permission bits say nothing to root, nor about a read-only
    /// mount).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config), naming the
    /// directory and the reason.
    pub fn check(&self) -> Result<(), LockError> {
        let dir = &self.dir;
        let bad =
            |why: String| LockError::config(format!("lock directory {}: {why}", dir.display()));
        if !dir.is_absolute() {
            return Err(bad("not an absolute path".into()));
        }
        let meta = std::fs::metadata(dir).map_err(|e| bad(format!("{e}")))?;
        if !meta.is_dir() {
            return Err(bad("not a directory".into()));
        }
        let probe = dir.join(format!(".distlock-probe-{}", OwnerId::random().to_hex()));
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .map_err(|e| bad(format!("cannot create files in it: {e}")))?;
        std::fs::remove_file(&probe).map_err(|e| bad(format!("cannot remove files in it: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::ErrorKind;

    #[test]
    fn urls_name_an_absolute_directory() {
        assert_eq!(
            FileConfig::from_url("file:///var/lock/app").unwrap().dir(),
            Path::new("/var/lock/app")
        );
        assert_eq!(
            FileConfig::from_url("file://localhost/tmp/a%20b")
                .unwrap()
                .dir(),
            Path::new("/tmp/a b")
        );
        for bad in [
            "file://relative/dir",
            "file:relative",
            "file://",
            "file:///tmp?ttl=1s",
            "redis:///tmp",
            "file://host.example/tmp",
        ] {
            let err = FileConfig::from_url(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{bad}: {err}");
        }
    }
}
