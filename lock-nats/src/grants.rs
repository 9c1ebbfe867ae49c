//! [`Grants`]: taking a key with a KV create.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{LockError, LockKey, Operation, OwnerId};

use crate::connection::{Change, Connection, Write};
use crate::keys::Value;

/// How many release markers [`Grants`] remembers before it forgets them
/// all (a cache: a forgotten marker costs two round trips, nothing else).
const MARKERS_KEPT: usize = 4096;

/// Takes keys: a create conditioned on "no message for this key" (one
/// round trip on a fresh key), or on the revision of the delete/purge
/// marker a release or an expiry left. The marker of a release by this
/// backend value is remembered, so taking the key again is one round trip
/// too; another's marker costs two more (read the entry, write on it)
/// during its one second of life.
#[derive(Debug, Clone)]
pub(crate) struct Grants {
    connection: Arc<Connection>,
    markers: Arc<Mutex<HashMap<String, u64>>>,
}

impl Grants {
    pub(crate) fn new(connection: Arc<Connection>) -> Self {
        Self {
            connection,
            markers: Arc::default(),
        }
    }

    /// Remembers the purge marker a release of ours left on `kv_key`.
    pub(crate) fn note_marker(&self, kv_key: &str, revision: u64) {
        let mut markers = self.markers.lock().unwrap_or_else(PoisonError::into_inner);
        if markers.len() >= MARKERS_KEPT {
            markers.clear();
        }
        markers.insert(kv_key.to_owned(), revision);
    }

    /// Creates `kv_key` for `owner` with `ttl`: its revision (the token),
    /// or `None` when the key is held.
    pub(crate) async fn try_take(
        &self,
        operation: Operation,
        key: &LockKey,
        kv_key: &str,
        owner: OwnerId,
        ttl: Duration,
    ) -> Result<Option<u64>, LockError> {
        let value = Value::encode(owner, None);
        let put = || Change::Put(value.clone());
        let c = &self.connection;
        let expected = self
            .markers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(kv_key)
            .unwrap_or(0);
        if let Write::Stored(revision) = c
            .write(operation, key, kv_key, put(), expected, ttl)
            .await?
        {
            return Ok(Some(revision));
        }
        match c.last(operation, key, kv_key).await? {
            Some(last) if last.is_value => Ok(None),
            // A marker (released, deleted, expired): create over it.
            Some(marker) => match c
                .write(operation, key, kv_key, put(), marker.revision, ttl)
                .await?
            {
                Write::Stored(revision) => Ok(Some(revision)),
                Write::Conflict => Ok(None),
            },
            // The marker expired in between: try once more from nothing.
            None => match c.write(operation, key, kv_key, put(), 0, ttl).await? {
                Write::Stored(revision) => Ok(Some(revision)),
                Write::Conflict => Ok(None),
            },
        }
    }
}
