//! The holders of a read-write lock (the writer, or the readers, all with
//! the write epoch as their token) or of a semaphore (each permit holder
//! with its count and token).

use lock_core::{HolderInfo, LeaseKind, LockError, LockKey, LockShape, Operation};
use redis::Value;

use crate::connection::{Lane, Servers};
use crate::error::unexpected;
use crate::keys::replies::{as_int, details_of, pttl, share_details, text, token_of};
use crate::keys::shared::{RwNames, SHARED, SemNames};
use crate::shared::refusals::redlock_unsupported;

/// `holders` of a read-write lock or a semaphore.
pub(crate) async fn holders(
    servers: &Servers,
    key: &LockKey,
    shape: LockShape,
) -> Result<Vec<HolderInfo>, LockError> {
    let op = Operation::Inspect;
    if servers.redlock {
        return Err(redlock_unsupported(key, op));
    }
    let prefix = servers.keys.prefix();
    let (rw, sem) = (RwNames::new(prefix, key), SemNames::new(prefix, key));
    let (rw, sem) = (&rw, &sem);
    let timeout = servers.timeout();
    let value = servers
        .first()
        .run_on(Lane::ANY, op, timeout, move |mut conn| async move {
            if shape == LockShape::Semaphore {
                conn.eval(
                    &SHARED.sem_holders,
                    &[
                        &sem.holders,
                        &sem.counts,
                        &sem.tokens,
                        &sem.counters,
                        &sem.details,
                    ],
                    &[],
                )
                .await
            } else {
                conn.eval(
                    &SHARED.rw_holders,
                    &[
                        &rw.writer,
                        &rw.readers,
                        &rw.counters,
                        &rw.details,
                        &rw.writer_details,
                    ],
                    &[],
                )
                .await
            }
        })
        .await
        .map_err(|e| e.with_key(key))?;
    let Value::Array(items) = &value else {
        return Err(unexpected(op, &value));
    };
    let int = |v: &Value| as_int(v, op);
    let ms = |v: &Value| int(v).map(pttl);
    let mut out = Vec::new();
    if shape == LockShape::Semaphore {
        let [limit, rest @ ..] = items.as_slice() else {
            return Err(unexpected(op, &value));
        };
        let limit = u32::try_from(int(limit)?).map_err(|_| unexpected(op, &value))?;
        for holder in rest.chunks(5) {
            let [owner, left, count, token, details] = holder else {
                return Err(unexpected(op, &value));
            };
            let count = u32::try_from(int(count)?).map_err(|_| unexpected(op, &value))?;
            out.push(HolderInfo {
                details: share_details(details),
                kind: LeaseKind::permits(count, limit.max(count))
                    .map_err(|_| unexpected(op, &value))?,
                holder: text(owner).unwrap_or_default(),
                token: Some(token_of(int(token)?, op, &value)?),
                remaining_ttl: ms(left)?,
            });
        }
        return Ok(out);
    }
    let [writer, writer_ttl, epoch, writer_side, readers @ ..] = items.as_slice() else {
        return Err(unexpected(op, &value));
    };
    // The writer's token is the epoch (set by its grant); every live
    // reader was granted after it, or by its downgrade, so carries it too.
    let epoch = token_of(int(epoch)?, op, &value)?;
    let writer = text(writer).unwrap_or_default();
    if !writer.is_empty() {
        out.push(HolderInfo {
            details: text(writer_side).and_then(|side| details_of(&writer, &side)),
            kind: LeaseKind::Write,
            holder: writer,
            token: Some(epoch),
            remaining_ttl: ms(writer_ttl)?,
        });
    }
    for reader in readers.chunks(3) {
        let [owner, left, details] = reader else {
            return Err(unexpected(op, &value));
        };
        out.push(HolderInfo {
            details: share_details(details),
            kind: LeaseKind::Read,
            holder: text(owner).unwrap_or_default(),
            token: Some(epoch),
            remaining_ttl: ms(left)?,
        });
    }
    Ok(out)
}
