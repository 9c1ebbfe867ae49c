//! One grant attempt, on a blocking thread: the non-blocking `flock`s, the
//! fencing counter and the holder record.
//!
//! # The read-write lock's writer gate
//!
//! `flock(2)` alone lets a stream of overlapping readers (`LOCK_SH`) keep
//! a writer (`LOCK_EX`) out for ever. So a read-write lock has a second
//! file, the gate:
//!
//! - a **reader** takes the gate shared, then the lock shared, then lets
//!   the gate go (it holds the gate for two system calls);
//! - a **writer** takes the gate exclusive, then the lock exclusive, then
//!   lets the gate go. A *waiting* writer keeps the gate between its polls
//!   of the lock, so new readers queue behind it while the readers inside
//!   finish.
//!
//! A waiting writer's gate is its wait's: dropping the acquire closes it,
//! so a cancelled writer blocks nobody. A process that knows nothing of the
//! gate (`flock -s` / `flock -x` on the `.rwlock` file) is still excluded
//! correctly; it only bypasses the writer preference.

use std::fs::File;
use std::io;

use lock_core::{LeaseKind, OwnerId};

use crate::files::{Counter, Record, read_token, try_lock_path};
use crate::keys::KeyFiles;

/// What an attempt took.
#[derive(Debug)]
pub(crate) struct Taken {
    /// The locked file: the lock lasts as long as it stays open.
    pub(crate) file: File,
    /// The grant's fencing token.
    pub(crate) token: u64,
}

/// One attempt at a grant of `kind` on `files` for `owner`.
#[derive(Debug)]
pub(crate) struct Attempt {
    pub(crate) files: KeyFiles,
    pub(crate) kind: LeaseKind,
    pub(crate) owner: OwnerId,
    /// The writer gate this wait already holds (a waiting writer's).
    pub(crate) gate: Option<File>,
    /// Whether the caller waits: a writer then keeps the gate it took when
    /// the lock itself is still held.
    pub(crate) waiting: bool,
}

/// What an attempt hands back: the gate it keeps for the next attempt of
/// the same wait, and the grant (`None`: a conflicting holder or a waiting
/// writer is in the way).
pub(crate) type Outcome = (Option<File>, io::Result<Option<Taken>>);

impl Attempt {
    /// Runs the attempt. Blocking (`fsync`): call it on a blocking thread.
    pub(crate) fn run(mut self) -> Outcome {
        match self.kind {
            LeaseKind::Read => (None, self.read()),
            LeaseKind::Write => {
                let result = self.write();
                (self.gate.take(), result)
            }
            _ => (None, self.exclusive_lock()),
        }
    }

    /// The exclusive lock, its token and record: the mutex, or a writer
    /// that is through the gate.
    fn exclusive_lock(&self) -> io::Result<Option<Taken>> {
        let Some(file) = try_lock_path(&self.files.lock, false)? else {
            return Ok(None);
        };
        let counter = Counter::open(&self.files.token)?;
        let token = counter.next()?;
        // The record first, right after the lock: `inspect` finds the new
        // holder's record within microseconds, not after the fsync.
        Record {
            owner: self.owner.to_hex(),
            token,
            pid: std::process::id(),
        }
        .write(&file)?;
        counter.store(token)?;
        Ok(Some(Taken { file, token }))
    }

    fn write(&mut self) -> io::Result<Option<Taken>> {
        let Some(gate_path) = &self.files.gate else {
            return self.exclusive_lock();
        };
        if self.gate.is_none() {
            self.gate = try_lock_path(gate_path, false)?;
            if self.gate.is_none() {
                return Ok(None);
            }
        }
        let taken = self.exclusive_lock();
        if !matches!(taken, Ok(None)) || !self.waiting {
            // Granted (or failed): the gate is let go for the readers that
            // queued behind us; a single try does not keep it either.
            self.gate = None;
        }
        taken
    }

    fn read(&self) -> io::Result<Option<Taken>> {
        let Some(gate_path) = &self.files.gate else {
            return Ok(None);
        };
        let Some(_gate) = try_lock_path(gate_path, true)? else {
            return Ok(None);
        };
        let Some(file) = try_lock_path(&self.files.lock, true)? else {
            return Ok(None);
        };
        // Writers bump the counter only under the exclusive lock, which
        // our shared lock keeps out: this is the epoch we read.
        let token = read_token(&self.files.token)?;
        Ok(Some(Taken { file, token }))
    }
}
