//! `try_acquire_all`: a whole set of mutexes in one script call (one round
//! trip), all or nothing, on one server, Sentinel, and Cluster when every
//! key hashes to one slot. Redlock and a cluster set spread over slots
//! answer `Unsupported` (lock-core then takes the keys one by one).

use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    ErrorKind, FencingToken, Lease, LockError, LockKey, LockSets, Operation, OwnerId, async_trait,
};
use redis::Value;
use redis::cluster_routing::Slot;
use tokio::time::Instant;

use crate::config::RedisTopology;
use crate::connection::{Lane, Servers};
use crate::error::{NAME, unexpected};
use crate::grants::undo::release_everywhere;
use crate::grants::{Grants, check_ttl};
use crate::keys::fair::{FAIR, FairNames};
use crate::keys::names::KeyNames;
use crate::keys::replies::ttl_ms;

/// Releases every key of a set whose answer was not seen (timeout,
/// dropped future, WAIT not satisfied) unless disarmed, in the background,
/// on the connection the set's grant went on (`lane`, of its first owner).
struct PendingSet {
    servers: Arc<Servers>,
    grants: Vec<(KeyNames, String)>,
    lane: Lane,
}

impl PendingSet {
    fn disarm(mut self) {
        self.grants.clear();
    }
}

impl Drop for PendingSet {
    fn drop(&mut self) {
        if self.grants.is_empty() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let servers = self.servers.clone();
            let grants = std::mem::take(&mut self.grants);
            let lane = servers.undo_lane(self.lane);
            handle.spawn(async move {
                for (names, owner) in &grants {
                    let _ = release_everywhere(
                        &servers,
                        names.release_keys(),
                        owner,
                        servers.timeout(),
                        lane,
                    )
                    .await;
                }
            });
        }
    }
}

fn unsupported(keys: &[LockKey], why: &str) -> LockError {
    LockError::new(
        ErrorKind::Unsupported,
        Operation::TryAcquire,
        why.to_owned(),
    )
    .with_backend(NAME)
    .with_key(keys.first().map_or("", LockKey::as_str))
}

/// A token of the script's answer: an integer from `INCR`, or the
/// counter's string when a resent script returned its own grants.
fn token(value: &Value) -> Option<u64> {
    match value {
        Value::Int(n) => u64::try_from(*n).ok(),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        _ => None,
    }
}

/// Sets of mutexes taken in one script: the `LockSets` facet.
#[derive(Clone)]
pub(crate) struct Sets {
    grants: Grants,
}

impl Sets {
    pub(crate) fn new(grants: Grants) -> Self {
        Self { grants }
    }

    /// See the module docs. In fair mode a key with live waiters counts as
    /// held (nobody jumps a queue).
    async fn try_acquire_set(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        let op = Operation::TryAcquire;
        let servers = self.grants.servers();
        if servers.redlock {
            return Err(unsupported(
                keys,
                "Redlock takes a set of keys one key at a time (no atomic exchange spans \
                 independent nodes)",
            ));
        }
        for key in keys {
            check_ttl(ttl, op, key)?;
        }
        let names: Vec<FairNames> = keys.iter().map(|k| servers.keys.fair(k)).collect();
        if matches!(servers.config.topology, RedisTopology::Cluster(_))
            && let Some(first) = names.first()
        {
            let slot = Slot::for_key(&first.mutex.lock);
            if names.iter().any(|n| Slot::for_key(&n.mutex.lock) != slot) {
                return Err(unsupported(
                    keys,
                    "the keys of this set are in different cluster slots: one script cannot \
                     take them; they are taken one at a time",
                ));
            }
        }
        let Some(first) = keys.first() else {
            return Ok(Some(Vec::new()));
        };
        let owners: Vec<OwnerId> = keys.iter().map(|_| OwnerId::random()).collect();
        let owner_hex: Vec<String> = owners.iter().map(|o| o.to_hex()).collect();
        // The set's one script goes on its first owner's lane, and so does
        // its undo.
        let lane = Lane::of(&owner_hex[0]);
        let pending = PendingSet {
            lane,
            servers: servers.clone(),
            grants: names
                .iter()
                .zip(&owner_hex)
                .map(|(n, o)| (n.mutex.clone(), o.clone()))
                .collect(),
        };
        let ttl_text = ttl_ms(ttl);
        let fair = if servers.config.fair { "1" } else { "0" };
        let mut script_keys: Vec<&str> = names.iter().flat_map(FairNames::multi_keys).collect();
        // In Cluster every key of the set is in the first one's slot (checked
        // above), so is its floor.
        script_keys.extend(
            names
                .first()
                .and_then(|n| servers.floor.key_for(&n.mutex.counter)),
        );
        let details = lock_core::HolderDetails::encode_current();
        let mut args: Vec<&str> = vec![&ttl_text, fair];
        args.extend(owner_hex.iter().map(String::as_str));
        args.push(&details);
        let timeout = servers.timeout();
        let sent_at = Instant::now();
        let (script_keys, args) = (&script_keys, &args);
        let (value, acked) = self
            .grants
            .run_grant(
                servers.first(),
                lane,
                op,
                timeout,
                move |mut conn| async move {
                    conn.eval(&FAIR.multi_acquire, script_keys, args).await
                },
                |value| {
                    matches!(value, Value::Array(items) if matches!(items.first(), Some(Value::Int(1))))
                },
            )
            .await
            .map_err(|e| e.with_key(first))?;
        let Value::Array(items) = &value else {
            return Err(unexpected(op, &value).with_key(first));
        };
        match items.split_first() {
            Some((Value::Int(0), _)) => {
                // Held: nothing was written.
                pending.disarm();
                Ok(None)
            }
            Some((Value::Int(1), tokens)) if tokens.len() == keys.len() => {
                let tokens: Option<Vec<u64>> = tokens.iter().map(token).collect();
                let Some(tokens) = tokens else {
                    return Err(unexpected(op, &value).with_key(first));
                };
                // `pending` releases the set on error.
                self.grants
                    .replicas_acked(op, acked)
                    .map_err(|e| e.with_key(first))?;
                let leases = keys
                    .iter()
                    .zip(owners)
                    .zip(tokens)
                    .map(|((key, owner), token)| {
                        Lease::granted(
                            key.clone(),
                            owner,
                            FencingToken::new(token),
                            ttl,
                            sent_at,
                            String::new(),
                        )
                        .map_err(|e| e.with_backend(NAME))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                pending.disarm();
                Ok(Some(leases))
            }
            _ => Err(unexpected(op, &value).with_key(first)),
        }
    }
}

#[async_trait]
impl LockSets for Sets {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<Lease>>, LockError> {
        if let Some(first) = keys.first() {
            // lock-core takes the keys one at a time on `Unsupported`.
            self.grants.servers().keys.refuse_legacy(
                Operation::TryAcquire,
                "one-script sets of keys",
                first,
            )?;
        }
        self.try_acquire_set(keys, ttl).await
    }
}
