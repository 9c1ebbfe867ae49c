//! [`FileBackend`]: the kernel over `flock(2)`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::{
    Capabilities, Downgrade, ErrorKind, Facets, FencingScope, FencingToken, GrantRequest,
    HolderInfo, Lease, LeaseKind, LockBackend, LockError, LockKey, LockShape, MIN_TTL_FLOOR,
    Operation, OwnerId, TtlModel, WaitStrategy, check_ttl, random_delay, unsupported_kind,
    unsupported_shape, validity_deadline,
};
use tokio::time::{Instant, sleep_until};

use crate::NAME;
use crate::config::FileConfig;
use crate::connection::{Session, Standing};
use crate::error::{io_error, task_error};
use crate::files::{FlockHolder, Record, flock_holders, read_token};
use crate::grants::{Attempt, Taken};
use crate::keys::KeyFiles;

/// The first pause between two polls of a held lock.
const FIRST_POLL: Duration = Duration::from_millis(1);
/// The longest pause between two polls: the most a waiter can lag behind
/// a release (plus up to half of it in jitter).
pub const MAX_POLL: Duration = Duration::from_millis(16);

/// How many times `holders` reads an exclusive holder without a record
/// before it names it as another program's: the pauses between looks
/// double from 2 ms, about 125 ms in all, so a grant or release whose
/// process was descheduled between its lock and its record (a loaded
/// machine) is still seen as ours in passing.
const HOLDER_LOOKS: u32 = 7;

/// What this backend guarantees (see the crate docs for each field).
pub const CAPABILITIES: Capabilities = Capabilities {
    fencing: FencingScope::PerKey,
    // The counter file is fsynced (and its directory when it is created)
    // before a token is handed out: tokens survive crashes and reboots on
    // a persistent file system (not on tmpfs).
    fencing_survives_failover: true,
    // Locks live in the kernel: a reboot frees them (with their holders).
    grants_survive_restart: false,
    // No notification of an unlock exists for flock: waiters poll.
    waiting: WaitStrategy::Poll,
    fifo: false,
    // A grant lasts as long as its open file description: until it is
    // released, this backend value is dropped, or the process dies; its
    // TTL frees nothing.
    ttl_model: TtlModel::PerProcess,
    // One kernel arbitrates every lock: each grant is atomic and seen by
    // every later one on the same host.
    linearizable: true,
    min_ttl: MIN_TTL_FLOOR,
    shared_locks: true,
    semaphores: false,
    holder_details: false,
    max_held: None,
};

/// Locks on one host: `flock(2)` on one file per key under a directory.
///
/// Clones share their grants (one session); dropping the last clone
/// releases every grant still held.
#[derive(Clone)]
pub struct FileBackend {
    config: Arc<FileConfig>,
    session: Arc<Session>,
}

impl fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileBackend")
            .field("dir", &self.config.dir())
            .field("held", &self.session.len())
            .finish()
    }
}

impl FileBackend {
    /// A backend over `config`'s directory.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`] when the directory is not absolute, does not
    /// exist, is not a directory, or files cannot be created in it.
    pub fn new(config: FileConfig) -> Result<Self, LockError> {
        config.check().map_err(|e| e.with_backend(NAME))?;
        Ok(Self {
            config: Arc::new(config),
            session: Arc::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FileConfig {
        &self.config
    }

    /// The files of `key` in `shape` (the `.lock` file is the one
    /// `flock(1)` takes the same mutex on).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`] for semaphores.
    pub fn files(&self, key: &LockKey, shape: LockShape) -> Result<KeyFiles, LockError> {
        KeyFiles::new(self.config.dir(), key, shape)
            .ok_or_else(|| unsupported_shape(NAME, key, shape))
    }

    /// One attempt on a blocking thread. Dropping the returned future
    /// leaves nothing: the thread's outcome (a taken lock, a kept gate) is
    /// dropped with it, which closes the files and so unlocks them.
    async fn attempt(
        &self,
        attempt: Attempt,
        key: &LockKey,
        op: Operation,
    ) -> Result<(Option<std::fs::File>, Option<Taken>), LockError> {
        let (gate, taken) = tokio::task::spawn_blocking(move || attempt.run())
            .await
            .map_err(|e| task_error(op, key, e))?;
        let taken = taken.map_err(|e| io_error(op, key, e))?;
        Ok((gate, taken))
    }

    /// The lease of what an attempt took, kept in the session. No `await`
    /// between the attempt's end and here: a grant is either in the
    /// session or closed.
    fn keep(
        &self,
        request: &GrantRequest<'_>,
        files: &KeyFiles,
        owner: OwnerId,
        sent_at: Instant,
        taken: Taken,
    ) -> Result<Lease, LockError> {
        let lease = Lease::granted(
            request.key.clone(),
            owner,
            FencingToken::new(taken.token),
            request.ttl,
            sent_at,
            files.lock.display().to_string(),
        )
        .map_err(|e| e.with_backend(NAME))?
        .with_kind(request.kind);
        self.session.insert(
            owner,
            request.key.clone(),
            request.kind,
            files.lock.clone(),
            taken.file,
        );
        Ok(lease)
    }

    /// The holders `/proc/locks` shows on `files`, named from the holder
    /// record where the exclusive holder is one of ours.
    ///
    /// A grant locks the file a few system calls before it writes its
    /// record, and a release truncates the record just before it unlocks:
    /// an exclusive holder without a matching record may be one of ours
    /// in passing, so the files are read again a few times (over about
    /// 125 ms, see [`HOLDER_LOOKS`]) before such a holder is reported as
    /// another program's.
    fn read_holders(files: &KeyFiles, shape: LockShape) -> std::io::Result<Vec<HolderInfo>> {
        let mut looks = 0;
        let (flocks, record) = loop {
            let flocks = flock_holders(&files.lock)?;
            if flocks.is_empty() {
                return Ok(Vec::new());
            }
            let record = Record::read(&files.lock)?;
            let unnamed = flocks
                .iter()
                .any(|h| h.exclusive && record.as_ref().is_none_or(|r| r.pid != h.pid));
            looks += 1;
            if !unnamed || looks >= HOLDER_LOOKS {
                break (flocks, record);
            }
            std::thread::sleep(Duration::from_millis(1 << looks));
        };
        let epoch = read_token(&files.token)?;
        let foreign = |h: &FlockHolder| format!("pid {}", h.pid);
        Ok(flocks
            .iter()
            .map(|h| {
                let ours = record.as_ref().filter(|r| h.exclusive && r.pid == h.pid);
                let kind = match shape {
                    LockShape::ReadWrite if h.exclusive => LeaseKind::Write,
                    LockShape::ReadWrite => LeaseKind::Read,
                    _ => LeaseKind::Exclusive,
                };
                let (holder, token) = match (ours, kind) {
                    (Some(r), _) => (r.owner.clone(), Some(FencingToken::new(r.token))),
                    // Readers carry the epoch they read; no writer can
                    // bump the counter while they hold the lock.
                    (None, LeaseKind::Read) => (foreign(h), Some(FencingToken::new(epoch))),
                    (None, _) => (foreign(h), None),
                };
                HolderInfo {
                    kind,
                    holder,
                    token,
                    remaining_ttl: None,
                    details: None,
                }
            })
            .collect())
    }
}

fn contended(key: &LockKey) -> LockError {
    LockError::new(
        ErrorKind::Contended,
        Operation::Acquire,
        "the lock file was still locked at the deadline",
    )
    .with_key(key)
    .with_backend(NAME)
}

#[async_trait]
impl LockBackend for FileBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    /// Tries the lock without blocking; a waiting grant polls with a
    /// backoff from 1 ms doubling to [`MAX_POLL`], with jitter.
    ///
    /// Why polling rather than a blocking `flock` on a thread: a blocked
    /// `flock(2)` can be interrupted only by a signal, so a cancelled or
    /// timed-out waiter would keep its thread (and a writer its gate,
    /// shutting readers out) until the lock came free, which may be never.
    /// A poll is one system call on a local file; a dropped wait leaves
    /// nothing at once.
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let key = request.key;
        let op = request.operation();
        check_ttl(request.ttl, CAPABILITIES.min_ttl, op)
            .map_err(|e| e.with_key(key).with_backend(NAME))?;
        if !matches!(
            request.kind,
            LeaseKind::Exclusive | LeaseKind::Read | LeaseKind::Write
        ) {
            return Err(unsupported_kind(NAME, key, request.kind, op));
        }
        let files = self.files(key, request.kind.shape())?;
        let owner = OwnerId::random();
        let mut gate = None;
        let mut pause = FIRST_POLL;
        loop {
            let sent_at = Instant::now();
            let attempt = Attempt {
                files: files.clone(),
                kind: request.kind,
                owner,
                gate: gate.take(),
                waiting: request.deadline.is_some(),
            };
            let (kept, taken) = self.attempt(attempt, key, op).await?;
            if let Some(taken) = taken {
                return self.keep(&request, &files, owner, sent_at, taken).map(Some);
            }
            gate = kept;
            let Some(deadline) = request.deadline else {
                return Ok(None);
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(contended(key));
            }
            let wake = now + pause + random_delay(pause / 2);
            sleep_until(wake.min(deadline)).await;
            pause = (pause * 2).min(MAX_POLL);
        }
    }

    /// Checks each lease locally: still in this session, and its path
    /// still names the locked file. Nothing expires in the kernel, so a
    /// renewal sends nothing anywhere.
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        leases
            .iter()
            .map(|lease| {
                let sent_at = Instant::now();
                let why = match self.session.standing(lease) {
                    Standing::Held => return Ok(validity_deadline(sent_at, lease.ttl())),
                    Standing::Unknown => "not held by this backend (released, or another's)",
                    Standing::Replaced => {
                        "the lock file was deleted or replaced: others can lock the new one"
                    }
                };
                Err(LockError::new(ErrorKind::NotHeld, Operation::Renew, why)
                    .with_key(lease.key())
                    .with_backend(NAME))
            })
            .collect()
    }

    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        Ok(self.session.release(lease) == Standing::Held)
    }

    /// The only facet: [`Downgrade`].
    fn facets(&self) -> Facets<'_> {
        Facets {
            downgrade: Some(self),
            ..Facets::default()
        }
    }

    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        let files = self.files(key, shape)?;
        tokio::task::spawn_blocking(move || Self::read_holders(&files, shape))
            .await
            .map_err(|e| task_error(Operation::Inspect, key, e))?
            .map_err(|e| io_error(Operation::Inspect, key, e))
    }
}

/// A write grant becomes a read grant in one `flock` conversion (see
/// `Session::downgrade`), keeping its owner and token; the write lease is
/// no longer valid. A waiting writer (which holds the gate) cannot get in
/// between: the lock is never free during the conversion.
#[async_trait]
impl Downgrade for FileBackend {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        let key = lease.key();
        let sent_at = Instant::now();
        let converted = self
            .session
            .downgrade(lease)
            .map_err(|e| io_error(Operation::Downgrade, key, e))?;
        if !converted {
            return Err(LockError::new(
                ErrorKind::NotHeld,
                Operation::Downgrade,
                "not a write lease held by this backend",
            )
            .with_key(key)
            .with_backend(NAME));
        }
        Ok(Lease::from_parts(
            key.clone(),
            lease.owner(),
            lease.token(),
            lease.ttl(),
            validity_deadline(sent_at, lease.ttl()),
            lease.backend_data().to_owned(),
        )
        .with_kind(LeaseKind::Read))
    }
}
