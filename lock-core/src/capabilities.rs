//! What a backend can promise, as data.

use std::time::Duration;

use crate::error::LockError;
use crate::options::MIN_TTL_FLOOR;

/// Where fencing tokens come from and how far they can be trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FencingScope {
    /// No safe token: tokens may repeat or go backwards (e.g. Redlock).
    None,
    /// Strictly increasing over successive grants of the same key.
    PerKey,
    /// Strictly increasing over all grants of all keys (e.g. etcd revisions).
    Global,
}

/// How a waiter learns that a key became free.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WaitStrategy {
    /// The backend notifies waiters (watch, pub/sub, LISTEN/NOTIFY, ...).
    Notify,
    /// Waiters poll with backoff and jitter.
    Poll,
}

/// What a lease's TTL attaches to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TtlModel {
    /// Every lease has its own TTL and is renewed on its own.
    PerLease,
    /// Leases hang off a client session whose TTL is renewed once for all.
    PerSession,
    /// Leases last as long as the holding process keeps them (a file lock:
    /// the kernel frees it when the holder's file is closed, at the latest
    /// when the process dies); there is no TTL to run out.
    PerProcess,
}

/// What a backend guarantees. A plain `Copy` struct: decide from these
/// fields, never from a backend's name.
///
/// Not `non_exhaustive` on purpose: drivers in other crates build it with
/// `Capabilities { fencing: .., ..Capabilities::minimal() }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Where fencing tokens come from.
    pub fencing: FencingScope,
    /// Whether tokens stay monotonic across a failover / restart of the
    /// store. `false` for Redis without fsync and replicas that lag.
    pub fencing_survives_failover: bool,
    /// Whether a held grant outlives a restart of the store (or a
    /// failover): `false` where the grant lives only in server memory
    /// (Redis without fsync, SQL session mode, whose locks are the server
    /// session's). The holder then learns of the loss only at its next
    /// renewal; until then only fencing protects the resource.
    pub grants_survive_restart: bool,
    /// How waiting works.
    pub waiting: WaitStrategy,
    /// Whether waiters are granted in arrival order.
    pub fifo: bool,
    /// What a TTL attaches to.
    pub ttl_model: TtlModel,
    /// Whether the store is linearizable (CP): a grant survives the failure
    /// of a minority of servers.
    pub linearizable: bool,
    /// The shortest TTL the backend accepts; never below
    /// [`MIN_TTL_FLOOR`](crate::MIN_TTL_FLOOR), which
    /// [`check_ttl`](crate::check_ttl) enforces for every backend.
    pub min_ttl: Duration,
    /// Shared (read-write) locks.
    pub shared_locks: bool,
    /// Counting semaphores.
    pub semaphores: bool,
    /// [`inspect`](crate::LockBackendExt::inspect) of a mutex granted by this
    /// library reports who took it ([`LockInfo::details`](crate::LockInfo::details):
    /// host, process, program, label, time of the grant).
    pub holder_details: bool,
    /// The most grants one backend value can hold at once, where a server
    /// limit applies (SQL session mode on PostgreSQL: the server's lock
    /// table, `max_locks_per_transaction` × (`max_connections` +
    /// `max_prepared_transactions`), read at connect); a grant past it
    /// fails with the server's error. `None` where only memory limits
    /// them.
    pub max_held: Option<u32>,
}

impl Capabilities {
    /// Capabilities with every flag at its weakest setting; drivers start
    /// from this and turn on what they provide. `min_ttl` is
    /// [`MIN_TTL_FLOOR`](crate::MIN_TTL_FLOOR).
    pub const fn minimal() -> Self {
        Self {
            fencing: FencingScope::None,
            fencing_survives_failover: false,
            grants_survive_restart: false,
            waiting: WaitStrategy::Poll,
            fifo: false,
            ttl_model: TtlModel::PerLease,
            linearizable: false,
            min_ttl: MIN_TTL_FLOOR,
            shared_locks: false,
            semaphores: false,
            holder_details: false,
            max_held: None,
        }
    }

    /// Whether fencing tokens are usable at all.
    pub fn has_fencing(&self) -> bool {
        self.fencing != FencingScope::None
    }

    /// Checks `requirements` against these capabilities.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported), naming every
    /// requirement the backend cannot meet.
    pub fn check(&self, requirements: &Requirements) -> Result<(), LockError> {
        let mut missing = Vec::new();
        if requirements.fencing && !self.has_fencing() {
            missing.push("fencing tokens".to_owned());
        }
        if requirements.fencing_survives_failover
            && !(self.has_fencing() && self.fencing_survives_failover)
        {
            missing.push("fencing tokens that survive a failover".to_owned());
        }
        if requirements.linearizable && !self.linearizable {
            missing.push("a linearizable store".to_owned());
        }
        if requirements.fifo && !self.fifo {
            missing.push("FIFO waiting".to_owned());
        }
        if requirements.notify && self.waiting != WaitStrategy::Notify {
            missing.push("notified waiting".to_owned());
        }
        if requirements.shared_locks && !self.shared_locks {
            missing.push("read-write locks".to_owned());
        }
        if requirements.semaphores && !self.semaphores {
            missing.push("semaphores".to_owned());
        }
        if let Some(ttl) = requirements.max_min_ttl
            && self.min_ttl > ttl
        {
            missing.push(format!(
                "TTLs as short as {ttl:?} (minimum is {:?})",
                self.min_ttl
            ));
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(LockError::new(
                crate::ErrorKind::Unsupported,
                crate::Operation::Connect,
                format!("backend cannot provide {}", missing.join(", ")),
            ))
        }
    }
}

/// What a user's configuration demands of a backend; checked at connect
/// time by [`Capabilities::check`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requirements {
    /// Fencing tokens are required.
    pub fencing: bool,
    /// Fencing tokens must stay monotonic across a store failover.
    pub fencing_survives_failover: bool,
    /// The store must be linearizable.
    pub linearizable: bool,
    /// Waiters must be served in order.
    pub fifo: bool,
    /// Waiting must be by notification.
    pub notify: bool,
    /// The backend must accept TTLs at least this short.
    pub max_min_ttl: Option<Duration>,
    /// Read-write locks are required.
    pub shared_locks: bool,
    /// Semaphores are required.
    pub semaphores: bool,
}

impl Requirements {
    /// No requirement.
    pub fn none() -> Self {
        Self::default()
    }

    /// Require fencing tokens.
    #[must_use]
    pub fn fencing(mut self) -> Self {
        self.fencing = true;
        self
    }

    /// Require fencing tokens that survive a failover.
    #[must_use]
    pub fn fencing_survives_failover(mut self) -> Self {
        self.fencing = true;
        self.fencing_survives_failover = true;
        self
    }

    /// Require a linearizable store.
    #[must_use]
    pub fn linearizable(mut self) -> Self {
        self.linearizable = true;
        self
    }

    /// Require FIFO waiting.
    #[must_use]
    pub fn fifo(mut self) -> Self {
        self.fifo = true;
        self
    }

    /// Require waiting by notification.
    #[must_use]
    pub fn notify(mut self) -> Self {
        self.notify = true;
        self
    }

    /// Require read-write locks.
    #[must_use]
    pub fn shared_locks(mut self) -> Self {
        self.shared_locks = true;
        self
    }

    /// Require semaphores.
    #[must_use]
    pub fn semaphores(mut self) -> Self {
        self.semaphores = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn refuses_what_is_missing_and_names_it() {
        let caps = Capabilities::minimal();
        let err = caps
            .check(&Requirements::none().fencing().linearizable().semaphores())
            .unwrap_err();
        assert!(err.message().contains("semaphores"), "{err}");
        assert_eq!(err.kind(), ErrorKind::Unsupported);
        assert!(err.message().contains("fencing tokens"), "{err}");
        assert!(err.message().contains("linearizable"), "{err}");
        assert!(caps.check(&Requirements::none()).is_ok());
    }

    #[test]
    fn accepts_what_is_there() {
        let caps = Capabilities {
            fencing: FencingScope::PerKey,
            fencing_survives_failover: true,
            linearizable: true,
            ..Capabilities::minimal()
        };
        caps.check(
            &Requirements::none()
                .fencing_survives_failover()
                .linearizable(),
        )
        .unwrap();
    }
}
