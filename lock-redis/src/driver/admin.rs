//! Operating locks: `inspect` with the holder details, `list` by `SCAN`,
//! `force_release` in one script, `gc` of token counters under a floor
//! (see the crate docs, *Operating locks*).

use std::future::Future;
use std::time::Duration;

use lock_core::{
    ErrorKind, FencingToken, GcReport, LeaseKind, ListQuery, LockError, LockInfo, LockKey,
    LockPage, LockShape, Operation, OwnerId, SharedLockInfo, SharedPage, check_list_limit,
};
use redis::Value;

use super::RedisBackend;
use crate::config::RedisTopology;
use crate::error::{NAME, unexpected};
use crate::keys::layout::{LEGACY_OWNER_MARK, RedisLayout};
use crate::keys::{
    FLOOR_KEY, HOLDER_SUFFIX, KeyNames, LuaScript, TokenFloor, as_int, details_of, escape_tag,
    glob_escape, pttl, text, unescape_tag,
};

/// The `COUNT` of one `SCAN` (a hint: Redis examines about that many keys).
const SCAN_COUNT: usize = 200;

/// The most `SCAN` calls of one `list` page or one `gc` run: a call
/// examines at most about `SCAN_COUNT * MAX_SCANS` keys.
const MAX_SCANS: usize = 20;

/// The name through which `list_shared` found a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ShareMark {
    /// `:rw:writer`: listed while a writer holds it.
    Writer,
    /// `:rw:readers`: listed while readers hold it.
    Readers,
    /// `:sem:holders`: listed while permits are held.
    Permits,
}

/// One node's answer to the inspect or force-release script.
struct NodeHolder {
    holder: String,
    left: Option<Duration>,
    counter: Option<u64>,
    side: String,
}

/// Where a `SCAN` goes: the one server of a node, or one Cluster master.
type ScanTarget = (usize, Option<(String, u16)>);

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

impl RedisBackend {
    /// The mutex's holder on a majority of nodes, as `inspect` reports it,
    /// and which nodes had the key at all.
    pub(super) async fn inspect_nodes(
        &self,
        key: &LockKey,
    ) -> Result<(Option<LockInfo>, Vec<bool>), LockError> {
        let op = Operation::Inspect;
        let names = self.names(key, op)?;
        let script = &self.inner.scripts.inspect;
        let answers = self.eval_on_every_node(op, script, &names, &[]).await;
        self.majority_holder(key, op, answers)
    }

    /// `script` on every node at once, on the key's lock, counter and
    /// holder details, with `args`: the answers in node order.
    async fn eval_on_every_node(
        &self,
        op: Operation,
        script: &LuaScript,
        names: &KeyNames,
        args: &[&str],
    ) -> Vec<Result<Value, LockError>> {
        let timeout = self.inner.config.operation_timeout;
        let calls = self.inner.nodes.iter().map(|node| {
            node.run(op, timeout, move |mut conn| async move {
                conn.eval(script, &[&names.lock, &names.counter, &names.holder], args)
                    .await
            })
        });
        futures_util::future::join_all(calls).await
    }

    /// Reads the answers of the inspect (or force-release) script.
    fn majority_holder(
        &self,
        key: &LockKey,
        op: Operation,
        answers: Vec<Result<Value, LockError>>,
    ) -> Result<(Option<LockInfo>, Vec<bool>), LockError> {
        let inner = &self.inner;
        let mut present = vec![false; answers.len()];
        let mut holders: Vec<NodeHolder> = Vec::new();
        let mut errors = Vec::new();
        let mut free = 0;
        for (node, result) in answers.into_iter().enumerate() {
            match result {
                Ok(Value::Array(items)) if items.is_empty() => free += 1,
                Ok(Value::Array(items)) if items.len() == 4 => {
                    present[node] = true;
                    holders.push(NodeHolder {
                        holder: text(&items[0]).unwrap_or_default(),
                        left: as_int(&items[1], op).ok().and_then(pttl),
                        counter: text(&items[2]).and_then(|t| t.parse::<u64>().ok()),
                        side: text(&items[3]).unwrap_or_default(),
                    });
                }
                Ok(Value::Nil) => free += 1,
                Ok(other) => errors.push(unexpected(op, &other)),
                Err(err) => errors.push(err),
            }
        }
        if holders.len() + free < inner.quorum {
            let err = errors.into_iter().next().unwrap_or_else(|| {
                LockError::new(ErrorKind::Unavailable, op, "no majority answered")
                    .with_backend(NAME)
            });
            return Err(err.with_key(key));
        }
        // The holder is whoever holds it on a majority of nodes.
        for candidate in &holders {
            let same: Vec<&NodeHolder> = holders
                .iter()
                .filter(|h| h.holder == candidate.holder)
                .collect();
            if same.len() < inner.quorum {
                continue;
            }
            let holder = &candidate.holder;
            let remaining = same.iter().filter_map(|h| h.left).min();
            // Our holders store a 32-hex-digit owner id; then the counter
            // is their token. A foreign client's value tells nothing.
            let hex = if inner.config.layout.is_legacy() {
                holder.strip_prefix(LEGACY_OWNER_MARK)
            } else {
                Some(holder.as_str())
            };
            let ours = hex.is_some_and(|hex| OwnerId::from_hex(hex).is_ok());
            let token = if inner.redlock || !ours {
                None
            } else {
                same.first().and_then(|h| h.counter).map(FencingToken::new)
            };
            let details = if ours {
                same.iter().find_map(|h| details_of(holder, &h.side))
            } else {
                None
            };
            return Ok((
                Some(LockInfo {
                    key: key.clone(),
                    holder: holder.clone(),
                    token,
                    remaining_ttl: remaining,
                    details,
                }),
                present,
            ));
        }
        Ok((None, present))
    }

    /// `force_release`: the force-release script on every node (a
    /// majority must answer); the holder it broke as inspect saw it.
    pub(super) async fn force_release_nodes(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockInfo>, LockError> {
        let op = Operation::Release;
        let names = self.names(key, op)?;
        // Redisson's waiters listen for its unlock message `0`, also on the
        // sharded channel; ours for `1`.
        let (message, sharded) = if self.inner.config.layout == RedisLayout::Redisson {
            ("0", "1")
        } else {
            ("1", "0")
        };
        let script = &self.inner.scripts.force_release;
        let args = [names.channel.as_str(), message, sharded, self.lock_type()];
        let answers = self.eval_on_every_node(op, script, &names, &args).await;
        Ok(self.majority_holder(key, op, answers)?.0)
    }

    /// The `SCAN` targets: each node (Redlock: each server), or each
    /// master of the Cluster (from `CLUSTER SLOTS`, in address order).
    async fn scan_targets(&self) -> Result<Vec<ScanTarget>, LockError> {
        if !matches!(self.inner.config.topology, RedisTopology::Cluster(_)) {
            return Ok((0..self.inner.nodes.len()).map(|n| (n, None)).collect());
        }
        let op = Operation::Inspect;
        let slots = self.inner.nodes[0]
            .run(
                op,
                self.inner.config.operation_timeout,
                |mut conn| async move {
                    conn.query::<Value>(redis::cmd("CLUSTER").arg("SLOTS"))
                        .await
                },
            )
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
    async fn scan(
        &self,
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
        let value = self.inner.nodes[*node]
            .run(op, self.inner.config.operation_timeout, |mut conn| {
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

    /// The Redis type of a lock key in this layout (`SCAN ... TYPE`).
    fn lock_type(&self) -> &'static str {
        if self.inner.config.layout == RedisLayout::Redisson {
            "hash"
        } else {
            "string"
        }
    }

    /// The `SCAN MATCH` pattern of the lock keys under the user's `prefix`.
    fn lock_pattern(&self, prefix: &str) -> String {
        let base = glob_escape(&self.inner.config.prefix);
        if self.inner.config.layout.is_legacy() {
            format!("{base}{}*", glob_escape(prefix))
        } else {
            format!("{base}{{{}*", glob_escape(&escape_tag(prefix)))
        }
    }

    /// The user's key of the Redis name `name` when it is a lock key of
    /// this layout under `prefix` (not a counter, a side key, a queue...).
    fn lock_key_of(&self, name: &str, prefix: &str) -> Option<LockKey> {
        let config = &self.inner.config;
        let rest = name.strip_prefix(config.prefix.as_str())?;
        let key = if config.layout.is_legacy() {
            let suffix = config.token_suffix.as_str();
            if (!suffix.is_empty() && rest.ends_with(suffix)) || rest.ends_with(HOLDER_SUFFIX) {
                return None;
            }
            rest.to_owned()
        } else {
            let tag = rest.strip_prefix('{')?.strip_suffix('}')?;
            if tag.contains('}') {
                return None;
            }
            unescape_tag(tag)?
        };
        if !key.starts_with(prefix) {
            return None;
        }
        let key = LockKey::new(key).ok()?;
        // The name must be the one this backend gives the key (a legacy
        // name that maps elsewhere, e.g. a reserved key, is skipped).
        (self.layout_names(&key).lock == name).then_some(key)
    }

    /// `list`: see the crate docs, *Operating locks*.
    pub(super) async fn list_page(&self, query: &ListQuery) -> Result<LockPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        check_list_limit(limit).map_err(|e| e.with_backend(NAME))?;
        let pattern = self.lock_pattern(prefix);
        let redlock = self.inner.redlock;
        let (locks, cursor) = self
            .scan_page(
                cursor,
                limit,
                &pattern,
                Some(self.lock_type()),
                |name| self.lock_key_of(name, prefix).map(|key| (key, ())),
                |key, (), target| async move {
                    let (info, present) = match self.inspect_nodes(&key).await {
                        Ok(found) => found,
                        // A name this topology refuses (an untagged legacy
                        // key in Cluster): not one of our locks.
                        Err(e) if e.kind() == ErrorKind::InvalidArgument => return Ok(None),
                        Err(e) => return Err(e),
                    };
                    // Redlock: a lock is on several nodes; it is listed
                    // with the first node that has it.
                    if redlock && present.iter().position(|p| *p) != Some(target) {
                        return Ok(None);
                    }
                    Ok(info)
                },
            )
            .await?;
        Ok(LockPage { locks, cursor })
    }

    /// `list_shared` of a read-write lock or a semaphore: see the crate
    /// docs, *Operating locks*.
    pub(super) async fn list_shared_page(
        &self,
        shape: LockShape,
        query: &ListQuery,
    ) -> Result<SharedPage, LockError> {
        let (prefix, cursor, limit) = query.parts();
        self.check_shared_listing()?;
        check_list_limit(limit).map_err(|e| e.with_backend(NAME))?;
        let base = format!(
            "{}{{{}*}}",
            glob_escape(&self.inner.config.prefix),
            glob_escape(&escape_tag(prefix))
        );
        // A held read-write lock has a writer key or a readers set (never
        // both with live holders: a writer is granted only once every
        // reader is gone, and a downgrade deletes the writer key); a held
        // semaphore has its holders set.
        let (pattern, kind, marks): (String, Option<&str>, &[(&str, ShareMark)]) = match shape {
            LockShape::Semaphore => (
                format!("{base}:sem:holders"),
                Some("zset"),
                &[(":sem:holders", ShareMark::Permits)],
            ),
            LockShape::ReadWrite => (
                format!("{base}:rw:*"),
                None,
                &[
                    (":rw:writer", ShareMark::Writer),
                    (":rw:readers", ShareMark::Readers),
                ],
            ),
            other => {
                return Err(LockError::new(
                    ErrorKind::Unsupported,
                    Operation::Inspect,
                    format!("listing {other} locks"),
                )
                .with_backend(NAME));
            }
        };
        let key_of = |name: &str| {
            marks.iter().find_map(|(suffix, mark)| {
                let key = self.lock_key_of(name.strip_suffix(suffix)?, prefix)?;
                Some((key, *mark))
            })
        };
        let (locks, cursor) = self
            .scan_page(
                cursor,
                limit,
                &pattern,
                kind,
                key_of,
                |key, mark, _| async move {
                    let holders = self.holders_shared(&key, shape).await?;
                    // Listed through the name of what holds it now, so a
                    // key is not listed once by each name.
                    let writes = holders.first().map(|h| h.kind == LeaseKind::Write);
                    let listed = match mark {
                        ShareMark::Writer => writes == Some(true),
                        ShareMark::Readers => writes == Some(false),
                        ShareMark::Permits => !holders.is_empty(),
                    };
                    Ok(listed.then_some(SharedLockInfo { key, holders }))
                },
            )
            .await?;
        Ok(SharedPage { locks, cursor })
    }

    /// One page of a `SCAN` listing (`list`, `list_shared`): `SCAN MATCH
    /// pattern [TYPE kind]` on each target in turn from `cursor` (a
    /// [`ListCursor`]), at most [`MAX_SCANS`] scans, each name that
    /// `key_of` takes for one of ours read by `fetch(key, mark, target)`
    /// (`None`: not listed), at most `limit` results, none twice on one
    /// page; the cursor of the next page (`None`: done).
    async fn scan_page<M, T, Fut>(
        &self,
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
        let targets = self.scan_targets().await?;
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
            let (next, found) = match self.scan(target, pos.redis, pattern, kind).await {
                Ok(found) => found,
                // Redlock: a held lock is on a majority, so on another
                // server too, and is listed with the first live one that
                // has it: a server that does not answer is passed over.
                Err(e) if self.inner.redlock && e.is_temporary() => {
                    pos.after = None;
                    pos.target += 1;
                    pos.redis = 0;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut keys: Vec<(LockKey, M)> =
                found.iter().filter_map(|name| key_of(name)).collect();
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

    /// `gc`: see the crate docs, *Operating locks*.
    pub(super) async fn gc_counters(&self, older_than: Duration) -> Result<GcReport, LockError> {
        let op = Operation::Inspect;
        let config = &self.inner.config;
        if config.layout.is_legacy() {
            // Nothing gc may collect: the counters of the legacy layouts sit
            // in the other library's key space, beside keys gc cannot tell
            // from application data. Removing nothing keeps every token.
            return Ok(GcReport::default());
        }
        let floors = self.inner.floor;
        if floors == TokenFloor::Absent {
            return Err(LockError::new(
                ErrorKind::Unsupported,
                op,
                "gc of token counters has no token floor here",
            )
            .with_backend(NAME));
        }
        let suffix = ":token";
        let pattern = format!("{}{{*}}{suffix}", glob_escape(&config.prefix));
        let idle = older_than.as_secs() + u64::from(older_than.subsec_nanos() > 0);
        let idle = idle.to_string();
        // One server: its one node; Cluster: every master in turn;
        // Redlock: every node in turn, each under its own floor.
        let targets = self.scan_targets().await?;
        let mut report = GcReport::default();
        let (mut at, mut cursor) = self.inner.gc_cursor();
        if at >= targets.len() {
            // The Cluster lost a master since the last run: start over.
            (at, cursor) = (0, 0);
        }
        for _ in 0..MAX_SCANS {
            let Some(target) = targets.get(at) else { break };
            let next = match self
                .gc_batch(target, cursor, &pattern, &idle, &mut report)
                .await
            {
                Ok(next) => next,
                // Redlock: a node that does not answer is passed over (its
                // counters wait for the next round); the others go on.
                Err(e) if self.inner.redlock && e.is_temporary() => 0,
                Err(e) => return Err(e),
            };
            cursor = next;
            if next == 0 {
                at += 1;
            }
            let done = at == targets.len();
            if done {
                at = 0;
            }
            self.inner.set_gc_cursor((at, cursor));
            if done {
                break;
            }
        }
        // Cluster: a floor per slot, Redlock: one per node; no one value to
        // report.
        if floors == TokenFloor::Server && !self.inner.redlock {
            let value = self.inner.nodes[0]
                .run(op, config.operation_timeout, |mut conn| async move {
                    conn.query::<Option<u64>>(redis::cmd("GET").arg(FLOOR_KEY))
                        .await
                })
                .await?;
            report.token_floor = Some(FencingToken::new(value.unwrap_or(0)));
        }
        Ok(report)
    }

    /// One `SCAN` of `gc` on `target` and the gc script on each counter it
    /// found, on that target's node (pipelined); the next Redis cursor.
    async fn gc_batch(
        &self,
        target: &ScanTarget,
        cursor: u64,
        pattern: &str,
        idle: &str,
        report: &mut GcReport,
    ) -> Result<u64, LockError> {
        let op = Operation::Inspect;
        let (suffix, floors) = (":token", self.inner.floor);
        let (next, found) = self.scan(target, cursor, pattern, Some("string")).await?;
        let calls: Vec<(Vec<&str>, Vec<&str>)> = found
            .iter()
            .filter_map(|counter| {
                let lock = counter.strip_suffix(suffix)?;
                let key = self.lock_key_of(lock, "")?;
                if self.layout_names(&key).counter != *counter {
                    return None;
                }
                // The counter's own floor: the server's (the node's),
                // or its slot's.
                let floor = floors.key_for(counter)?;
                Some((vec![lock, counter.as_str(), floor], vec![idle]))
            })
            .collect();
        report.scanned += u64::try_from(calls.len()).unwrap_or(u64::MAX);
        if calls.is_empty() {
            return Ok(next);
        }
        let scripts = &self.inner.scripts;
        let node = &self.inner.nodes[target.0];
        let results = node
            .run(op, self.inner.config.operation_timeout, |mut conn| {
                let calls = &calls;
                async move { conn.eval_many(&scripts.gc_counter, calls).await }
            })
            .await?;
        for result in results {
            match result {
                Ok(Value::Int(1)) => report.removed += 1,
                Ok(_) => {}
                Err(err) => return Err(node.map_err(op, err)),
            }
        }
        Ok(next)
    }
}
