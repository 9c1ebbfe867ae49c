//! Fenced writes to files: replace a file or append to it only with a
//! token not below the last one that wrote it, so that a job under
//! `distlock run` (its token in `DISTLOCK_FENCING_TOKEN`) cannot clobber a
//! newer run's output after losing its lock (`distlock fence-write` is the
//! shell's way in).
//!
//! The last accepted token of `path` is kept in `path.fence` beside it.
//! A write takes `flock(2)` on that file (writers on one host queue there),
//! checks the token, writes and syncs the new token first, then the data:
//! a replacement goes to a temporary file in the same directory, synced,
//! renamed over `path` and the directory synced; an append is written and
//! synced in place. A crash between the two steps leaves the new token
//! with the old data, which refuses stale writers and lets the new one
//! write again (an equal token is accepted). One host only: `flock` is not
//! reliable over network filesystems.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use lock_core::FencingToken;

use crate::FenceError;

/// The file that keeps `path`'s last accepted token.
pub fn token_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".fence");
    path.with_file_name(name)
}

/// Replaces `path`'s contents with `contents`, fenced.
///
/// # Errors
///
/// [`FenceError::Stale`] when `token` is below the last token that wrote
/// `path` (nothing written); [`FenceError::Store`] with the I/O error.
///
/// # Cancel safety
///
/// The write runs on a blocking thread and completes even if the future is
/// dropped.
pub async fn replace(
    path: impl AsRef<Path>,
    token: FencingToken,
    contents: Vec<u8>,
) -> Result<(), FenceError> {
    let path = path.as_ref().to_owned();
    blocking(move || write(&path, token, &contents, false)).await
}

/// Appends `contents` to `path` (created if missing), fenced.
///
/// # Errors
///
/// As [`replace`].
///
/// # Cancel safety
///
/// As [`replace`].
pub async fn append(
    path: impl AsRef<Path>,
    token: FencingToken,
    contents: Vec<u8>,
) -> Result<(), FenceError> {
    let path = path.as_ref().to_owned();
    blocking(move || write(&path, token, &contents, true)).await
}

/// The last token that wrote `path` (`None` before any).
///
/// # Errors
///
/// [`FenceError::Store`] with the I/O error; a token file that is not a
/// number is [`FenceError::InvalidArgument`].
pub fn current(path: impl AsRef<Path>) -> Result<Option<u64>, FenceError> {
    match File::open(token_path(path.as_ref())) {
        Ok(mut file) => read_token(&mut file),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(FenceError::store(err)),
    }
}

/// The synchronous write (what [`replace`] and [`append`] run on a blocking
/// thread), for programs that are not async.
///
/// # Errors
///
/// As [`replace`].
pub fn write(
    path: &Path,
    token: FencingToken,
    contents: &[u8],
    append: bool,
) -> Result<(), FenceError> {
    let fence = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(token_path(path))
        .map_err(FenceError::store)?;
    fence.lock().map_err(FenceError::store)?;
    let mut fence = fence;
    let current = read_token(&mut fence)?;
    if let Some(current) = current.filter(|c| token.get() < *c) {
        return Err(FenceError::Stale {
            resource: path.display().to_string(),
            token: token.get(),
            current,
        });
    }
    // The token first: a crash before the data refuses stale writers.
    fence.set_len(0).map_err(FenceError::store)?;
    fence.seek(SeekFrom::Start(0)).map_err(FenceError::store)?;
    fence
        .write_all(format!("{}\n", token.get()).as_bytes())
        .and_then(|()| fence.sync_data())
        .map_err(FenceError::store)?;
    if append {
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(FenceError::store)?;
        file.write_all(contents)
            .and_then(|()| file.sync_data())
            .map_err(FenceError::store)?;
    } else {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let mut tmp = tempfile_in(dir, path)?;
        tmp.1
            .write_all(contents)
            .and_then(|()| tmp.1.sync_all())
            .map_err(FenceError::store)?;
        std::fs::rename(&tmp.0, path).map_err(|err| {
            let _ = std::fs::remove_file(&tmp.0);
            FenceError::store(err)
        })?;
        if let Ok(dir) = File::open(dir) {
            let _ = dir.sync_all();
        }
    }
    // The lock goes with `fence`.
    Ok(())
}

fn tempfile_in(dir: &Path, path: &Path) -> Result<(PathBuf, File), FenceError> {
    let base = path.file_name().unwrap_or_default().to_string_lossy();
    for attempt in 0..100u32 {
        let candidate = dir.join(format!(".{base}.{}.{attempt}.tmp", std::process::id()));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&candidate)
        {
            Ok(file) => return Ok((candidate, file)),
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(err) => return Err(FenceError::store(err)),
        }
    }
    Err(FenceError::InvalidArgument(format!(
        "no free temporary name beside {}",
        path.display()
    )))
}

fn read_token(file: &mut File) -> Result<Option<u64>, FenceError> {
    let mut text = String::new();
    file.read_to_string(&mut text).map_err(FenceError::store)?;
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        FenceError::InvalidArgument(format!("the token file holds {text:?}, not a number"))
    })
}

async fn blocking(
    work: impl FnOnce() -> Result<(), FenceError> + Send + 'static,
) -> Result<(), FenceError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| FenceError::Store(Box::new(err)))?
}
