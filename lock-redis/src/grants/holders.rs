//! The mutex's holder as `inspect` reports it: the inspect (or
//! force-release) script on every node, and the holder a majority agrees
//! on.

use std::time::Duration;

use lock_core::{ErrorKind, FencingToken, LockError, LockInfo, LockKey, Operation};
use redis::Value;

use crate::connection::{Lane, Servers};
use crate::error::{NAME, unexpected};
use crate::keys::names::KeyNames;
use crate::keys::replies::{as_int, details_of, pttl, text};
use crate::keys::scripts::LuaScript;

/// One node's answer to the inspect or force-release script.
struct NodeHolder {
    holder: String,
    left: Option<Duration>,
    counter: Option<u64>,
    side: String,
}

/// The mutex's holder on a majority of nodes, as `inspect` reports it,
/// and which nodes had the key at all.
pub(crate) async fn inspect_nodes(
    servers: &Servers,
    key: &LockKey,
) -> Result<(Option<LockInfo>, Vec<bool>), LockError> {
    let op = Operation::Inspect;
    let names = servers.keys.mutex(key, op)?;
    let script = &servers.scripts.inspect;
    let answers = eval_on_every_node(servers, op, script, &names, &[]).await;
    majority_holder(servers, key, op, answers)
}

/// `script` on every node at once, on the key's lock, counter and
/// holder details, with `args`: the answers in node order.
pub(crate) async fn eval_on_every_node(
    servers: &Servers,
    op: Operation,
    script: &LuaScript,
    names: &KeyNames,
    args: &[&str],
) -> Vec<Result<Value, LockError>> {
    let timeout = servers.timeout();
    let calls = servers.nodes.iter().map(|node| {
        node.run_request_on(Lane::ANY, op, timeout, move |mut conn| async move {
            conn.eval(script, &[&names.lock, &names.counter, &names.holder], args)
                .await
        })
    });
    futures_util::future::join_all(calls).await
}

/// Reads the answers of the inspect (or force-release) script.
pub(crate) fn majority_holder(
    servers: &Servers,
    key: &LockKey,
    op: Operation,
    answers: Vec<Result<Value, LockError>>,
) -> Result<(Option<LockInfo>, Vec<bool>), LockError> {
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
    if holders.len() + free < servers.quorum {
        let err = errors.into_iter().next().unwrap_or_else(|| {
            LockError::new(ErrorKind::Unavailable, op, "no majority answered").with_backend(NAME)
        });
        return Err(err.with_key(key));
    }
    // The holder is whoever holds it on a majority of nodes.
    for candidate in &holders {
        let same: Vec<&NodeHolder> = holders
            .iter()
            .filter(|h| h.holder == candidate.holder)
            .collect();
        if same.len() < servers.quorum {
            continue;
        }
        let holder = &candidate.holder;
        let remaining = same.iter().filter_map(|h| h.left).min();
        // Our holders store a 32-hex-digit owner id; then the counter
        // is their token. A foreign client's value tells nothing.
        let ours = servers.keys.is_ours(holder);
        let token = if servers.redlock || !ours {
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
