//! Reading the scripts' answers (as the redis crate parsed them).

use std::time::Duration;

use lock_core::{FencingToken, HolderDetails, LockError, Operation};
use redis::Value;

use crate::error::unexpected;

/// The holder details a side key's text `<owner> <details>` names for the
/// holder `holder` (`None` for another holder's leftovers or no details).
pub(crate) fn details_of(holder: &str, side: &str) -> Option<lock_core::HolderDetails> {
    let (owner, details) = side.split_once(' ')?;
    if owner != holder {
        return None;
    }
    lock_core::HolderDetails::decode(details)
}

/// What one node said to an acquire script.
pub(crate) enum NodeGrant {
    Granted(u64),
    Held(i64),
}

/// The acquire script's answer `{flag, answer}`: `{1, token}` granted,
/// the token an integer, or the counter's string when a retried acquire
/// found its own grant; `{0, pttl of the holder}` held.
pub(crate) fn parse_grant(value: &Value) -> Result<NodeGrant, LockError> {
    if let Value::Array(items) = value {
        match items.as_slice() {
            [Value::Int(1), Value::Int(n)] => {
                if let Ok(token) = u64::try_from(*n) {
                    return Ok(NodeGrant::Granted(token));
                }
            }
            [Value::Int(1), Value::BulkString(bytes)] => {
                if let Some(token) = std::str::from_utf8(bytes)
                    .ok()
                    .and_then(|t| t.parse::<u64>().ok())
                {
                    return Ok(NodeGrant::Granted(token));
                }
            }
            [Value::Int(0), Value::Int(ms)] => return Ok(NodeGrant::Held(*ms)),
            _ => {}
        }
    }
    Err(unexpected(Operation::Acquire, value))
}

pub(crate) fn as_int(value: &Value, op: Operation) -> Result<i64, LockError> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(unexpected(op, other)),
    }
}

pub(crate) fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}

pub(crate) fn pttl(ms: i64) -> Option<Duration> {
    u64::try_from(ms)
        .ok()
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// A TTL as the acquire script's `PX` argument (whole milliseconds).
pub(crate) fn ttl_ms(ttl: Duration) -> String {
    ttl.as_millis().to_string()
}

/// `{flag, n}` of an acquire or downgrade script.
pub(crate) fn pair(value: &Value, op: Operation) -> Result<(i64, i64), LockError> {
    if let Value::Array(items) = value {
        match items.as_slice() {
            [flag, n] => return Ok((as_int(flag, op)?, as_int(n, op)?)),
            [flag] => return Ok((as_int(flag, op)?, 0)),
            _ => {}
        }
    }
    Err(unexpected(op, value))
}

/// A share's entry in its shape's details hash (`''`: none).
pub(crate) fn share_details(value: &Value) -> Option<HolderDetails> {
    text(value).and_then(|t| HolderDetails::decode(&t))
}

pub(crate) fn token_of(n: i64, op: Operation, value: &Value) -> Result<FencingToken, LockError> {
    u64::try_from(n)
        .map(FencingToken::new)
        .map_err(|_| unexpected(op, value))
}
