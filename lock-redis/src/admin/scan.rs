//! Walking the key space by `SCAN` (each server, or each master of a
//! Cluster), page by page, for `list`, `list_shared` and `gc`.

use std::future::Future;

use lock_core::{LockError, LockKey, Operation};
use redis::Value;

use crate::config::RedisTopology;
use crate::connection::{Lane, Servers};
use crate::error::{NAME, unexpected};
use crate::keys::replies::text;

/// The `COUNT` of one `SCAN` (a hint: Redis examines about that many keys).
pub(crate) const SCAN_COUNT: usize = 200;

/// The most `SCAN` calls of one `list` page or one `gc` run: a call
/// examines at most about `SCAN_COUNT * MAX_SCANS` keys.
pub(crate) const MAX_SCANS: usize = 20;

/// Where a `SCAN` goes: the one server of a node, or one Cluster master.
pub(crate) type ScanTarget = (usize, Option<(String, u16)>);

/// A `list` position: the target, the Redis cursor of the batch to read,
/// and the last key already returned from that batch. Text:
/// `<target>:<redis cursor>` or `<target>:<redis cursor>:<key in hex>`.
struct ListCursor {
    target: usize,
    redis: u64,
    after: Option<String>,
}

impl ListCursor {
    fn parse(text: Option<&str>) -> Result<Self, LockError> {
        let Some(text) = text else {
            return Ok(Self {
                target: 0,
                redis: 0,
                after: None,
            });
        };
        let bad = || {
            LockError::invalid_argument(
                Operation::Inspect,
                format!("{text:?} is not a list cursor of this backend"),
            )
            .with_backend(NAME)
        };
        let mut parts = text.split(':');
        let target = parts.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
        let redis = parts.next().and_then(|t| t.parse().ok()).ok_or_else(bad)?;
        let after = match parts.next() {
            None => None,
            Some(hex) => Some(from_hex(hex).ok_or_else(bad)?),
        };
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Self {
            target,
            redis,
            after,
        })
    }

    fn encode(&self) -> String {
        match &self.after {
            None => format!("{}:{}", self.target, self.redis),
            Some(key) => {
                let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
                format!("{}:{}:{hex}", self.target, self.redis)
            }
        }
    }
}

fn from_hex(hex: &str) -> Option<String> {
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// The `SCAN` targets: each node (Redlock: each server), or each
/// master of the Cluster (from `CLUSTER SLOTS`, in address order).
pub(crate) async fn scan_targets(servers: &Servers) -> Result<Vec<ScanTarget>, LockError> {
    if !matches!(servers.config.topology, RedisTopology::Cluster(_)) {
        return Ok((0..servers.nodes.len()).map(|n| (n, None)).collect());
    }
    let op = Operation::Inspect;
    let slots = servers
        .first()
        .run_on(Lane::ANY, op, servers.timeout(), |mut conn| async move {
            conn.query::<Value>(redis::cmd("CLUSTER").arg("SLOTS"))
                .await
        })
        .await?;
    let mut masters: Vec<(String, u16)> = Vec::new();
    if let Value::Array(ranges) = &slots {
        for range in ranges {
            if let Value::Array(parts) = range
                && let Some(Value::Array(master)) = parts.get(2)
                && let (Some(host), Some(Value::Int(port))) = (master.first(), master.get(1))
                && let (Some(host), Ok(port)) = (text(host), u16::try_from(*port))
            {
                masters.push((host, port));
            }
        }
    }
    if masters.is_empty() {
        return Err(unexpected(op, &slots));
    }
    masters.sort();
    masters.dedup();
    Ok(masters.into_iter().map(|m| (0, Some(m))).collect())
}

/// One `SCAN` on `target` (of the keys of Redis type `kind`, any type
/// when `None`): the next cursor and the names found.
pub(crate) async fn scan(
    servers: &Servers,
    target: &ScanTarget,
    cursor: u64,
    pattern: &str,
    kind: Option<&str>,
) -> Result<(u64, Vec<String>), LockError> {
    let op = Operation::Inspect;
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(SCAN_COUNT);
    if let Some(kind) = kind {
        cmd.arg("TYPE").arg(kind);
    }
    let (node, at) = target;
    let value = servers.nodes[*node]
        .run_on(Lane::ANY, op, servers.timeout(), |mut conn| {
            let cmd = &cmd;
            async move { conn.query_at(cmd, at.as_ref()).await }
        })
        .await?;
    if let Value::Array(parts) = &value
        && let [next, Value::Array(found)] = parts.as_slice()
        && let Some(next) = text(next).and_then(|t| t.parse::<u64>().ok())
    {
        return Ok((next, found.iter().filter_map(text).collect()));
    }
    Err(unexpected(op, &value))
}

/// One page of a `SCAN` listing (`list`, `list_shared`): `SCAN MATCH
/// pattern [TYPE kind]` on each target in turn from `cursor` (a
/// [`ListCursor`]), at most [`MAX_SCANS`] scans, each name that
/// `key_of` takes for one of ours read by `fetch(key, mark, target)`
/// (`None`: not listed), at most `limit` results, none twice on one
/// page; the cursor of the next page (`None`: done).
pub(crate) async fn scan_page<M, T, Fut>(
    servers: &Servers,
    cursor: Option<&str>,
    limit: usize,
    pattern: &str,
    kind: Option<&str>,
    key_of: impl Fn(&str) -> Option<(LockKey, M)>,
    fetch: impl Fn(LockKey, M, usize) -> Fut,
) -> Result<(Vec<T>, Option<String>), LockError>
where
    M: Ord + Copy,
    Fut: Future<Output = Result<Option<T>, LockError>>,
{
    let mut pos = ListCursor::parse(cursor)?;
    let targets = scan_targets(servers).await?;
    if pos.target > targets.len() {
        return Err(LockError::invalid_argument(
            Operation::Inspect,
            "the list cursor names a node this backend does not have",
        )
        .with_backend(NAME));
    }
    let mut found_keys: Vec<LockKey> = Vec::new();
    let mut page = Vec::new();
    let mut scans = 0;
    while let Some(target) = targets.get(pos.target) {
        if scans == MAX_SCANS || page.len() == limit {
            return Ok((page, Some(pos.encode())));
        }
        scans += 1;
        let (next, found) = match scan(servers, target, pos.redis, pattern, kind).await {
            Ok(found) => found,
            // Redlock: a held lock is on a majority, so on another
            // server too, and is listed with the first live one that
            // has it: a server that does not answer is passed over.
            Err(e) if servers.redlock && e.is_temporary() => {
                pos.after = None;
                pos.target += 1;
                pos.redis = 0;
                continue;
            }
            Err(e) => return Err(e),
        };
        let mut keys: Vec<(LockKey, M)> = found.iter().filter_map(|name| key_of(name)).collect();
        keys.sort();
        keys.dedup();
        if let Some(after) = &pos.after {
            keys.retain(|(k, _)| k.as_str() > after.as_str());
        }
        let target_at = pos.target;
        let results = futures_util::future::join_all(
            keys.iter()
                .map(|(k, mark)| fetch(k.clone(), *mark, target_at)),
        )
        .await;
        for ((key, _), result) in keys.into_iter().zip(results) {
            let Some(item) = result? else { continue };
            // The same key by another name, or again after a rehash.
            if found_keys.contains(&key) {
                continue;
            }
            if page.len() == limit {
                let last = found_keys.last().map(|k| k.as_str().to_owned());
                let next_page = ListCursor {
                    target: pos.target,
                    redis: pos.redis,
                    after: last,
                };
                return Ok((page, Some(next_page.encode())));
            }
            found_keys.push(key);
            page.push(item);
        }
        pos.after = None;
        if next == 0 {
            pos.target += 1;
            pos.redis = 0;
        } else {
            pos.redis = next;
        }
    }
    Ok((page, None))
}
