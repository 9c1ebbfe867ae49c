//! The statements of read-write locks and semaphores, written once with
//! tokens that each [`Dialect`] spells its own way:
//!
//! - `{p}`: the next placeholder (`$n`, `?`, `?n`); every statement binds
//!   its placeholders once each, in the order they appear;
//! - `{now}`: now on the database's clock;
//! - `{exp}`: now plus a TTL in µs (the next placeholder);
//! - `{left}`: the µs `expires_at` is ahead of now.
//!
//! Tables (names derived from the validated lease table name `t`):
//!
//! - `t_keys (name, shape, token, epoch)`: per key and shape, the fencing
//!   counter (`token`, bumped by every write or permit attempt) and the
//!   last write token (`epoch`, what readers carry). Never deleted, so
//!   tokens of a key only grow. Locked by every grant transaction of the
//!   key: the grant decisions of one key and shape are serialised.
//! - `t_holders (name, shape, owner, kind, cnt, lim, token, expires_at,
//!   details)`: one row per lease; live while `expires_at` is ahead of the
//!   database's clock. `details` (nullable: rows of older versions, or of a
//!   table that got the column at connect) is the encoded
//!   [`lock_core::HolderDetails`] the grant's own insert wrote.
//! - `t_waiters (id, name, shape, owner, kind, cnt, lim, expires_at)`: one
//!   row per waiting acquire, in arrival order by the database's id; live
//!   while the waiter refreshes `expires_at` (every attempt).

use std::sync::Arc;

use crate::dialect::quote_with;
use crate::dialect::{Dialect, SharedNames};

/// Spells the tokens of `template` for `dialect`.
pub(crate) fn render(dialect: &dyn Dialect, template: &str) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut n = 0;
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        let end = after.find('}').map_or(after.len(), |e| e + 1);
        let token = &after[..end];
        let mut next = || {
            n += 1;
            dialect.param(n)
        };
        match token {
            "{p}" => out.push_str(&next()),
            "{now}" => out.push_str(dialect.now_sql()),
            "{exp}" => {
                let micros = next();
                out.push_str(&dialect.plus_micros(&micros));
            }
            "{left}" => out.push_str(dialect.left_micros()),
            other => out.push_str(other),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The shared tables' statements for one backend.
#[derive(Debug)]
pub(crate) struct SharedSql {
    /// `CREATE .. IF NOT EXISTS` (run with the lease table's).
    pub(crate) create: Vec<Arc<str>>,
    pub(crate) begin: Arc<str>,
    pub(crate) commit: Arc<str>,
    pub(crate) rollback: Arc<str>,
    /// Creates and locks the key's counter row, adding the bump (1 for a
    /// write or permit attempt, 0 for a read) to its counter; the last
    /// returns `(token, epoch)`. Binds name, shape, bump (the first), name,
    /// shape (the others).
    pub(crate) lock_key: Vec<Arc<str>>,
    /// The same in share mode, for readers (binds name, shape each), where
    /// the database has row share locks (not SQLite, whose transactions
    /// take turns anyway).
    pub(crate) lock_key_shared: Option<Vec<Arc<str>>>,
    /// The key's holders and waiters, unlocked, in one read:
    /// `(0 holder | 1 waiter, owner, kind, cnt, lim, token | id, live)`.
    pub(crate) state: Arc<str>,
    /// Deletes one expired holder row (binds name, shape, owner): the
    /// decision that counted it as gone deletes exactly it, and starts
    /// again when it was renewed meanwhile.
    pub(crate) purge_holder: Arc<str>,
    /// Deletes the key's expired waiters.
    pub(crate) purge_waiters: Arc<str>,
    /// Sets the key's epoch (binds epoch, name, shape).
    pub(crate) set_epoch: Arc<str>,
    /// Adds a holder row (binds name, shape, owner, kind, count, limit,
    /// token, TTL, details).
    pub(crate) insert_holder: Arc<str>,
    /// Adds a waiter row; the last statement returns its id.
    pub(crate) insert_waiter: Vec<Arc<str>>,
    /// Moves a waiter's expiry (binds TTL, id).
    pub(crate) refresh_waiter: Arc<str>,
    /// Deletes a waiter row (binds id).
    pub(crate) delete_waiter: Arc<str>,
    /// Wakes the key's waiters after a withdrawal (PostgreSQL only).
    pub(crate) notify: Option<Arc<str>>,
    /// Extends a live holder row of ours (binds TTL, name, shape, owner,
    /// token, kind).
    pub(crate) renew: Arc<str>,
    /// Deletes a live holder row of ours (binds name, shape, owner, token,
    /// kind[, channel]); returns a row per change when `notifies`.
    pub(crate) release: Arc<str>,
    /// Turns our live write row into a read row (binds name, shape, owner,
    /// token[, channel]).
    pub(crate) downgrade: Arc<str>,
    /// Whether `release` and `downgrade` return rows (PostgreSQL's
    /// notification) instead of a row count.
    pub(crate) notifies: bool,
    /// The live holders: `(owner, kind, token, left µs, details)`.
    pub(crate) list: Arc<str>,
    /// One page of `list_shared`: every live holder of the first `limit`
    /// keys of a shape under a prefix after a cursor, in key order:
    /// `(name, owner, kind, token, left µs, details)`. Binds shape, prefix
    /// (a `LIKE` pattern when `page_like`), the name to scan after, limit,
    /// shape.
    pub(crate) list_page: Arc<str>,
    /// Whether `list_page`'s prefix bind is a `LIKE` pattern.
    pub(crate) page_like: bool,
    /// The holders table's quoted name (its `details` column is added at
    /// connect to a table created before it).
    pub(crate) holders_table: String,
    /// The waiters table's quoted name (fair mutex waiters queue there too,
    /// as shape `mutex`).
    pub(crate) waiters_table: String,
    /// Refreshes a fair mutex waiter's row while it is live (binds TTL,
    /// id): 0 when it expired meanwhile (it lost its place).
    pub(crate) refresh_live_waiter: Arc<str>,
    /// Deletes a granted fair waiter's row and the key's expired mutex
    /// waiters (binds name, id).
    pub(crate) granted_waiter: Arc<str>,
    /// Deletes a fair waiter's rows by owner (binds name, owner): before a
    /// registration is sent again on a fresh connection (the first may
    /// have committed).
    pub(crate) forget_waiter: Arc<str>,
}

impl SharedSql {
    /// The statements for lease table `table` (validated, unquoted).
    pub(crate) fn new(dialect: &dyn Dialect, table: &str) -> Self {
        let quote = dialect.quote();
        let named = |suffix: &str| quote_with(quote, &format!("{table}{suffix}"));
        let last = table.rsplit('.').next().unwrap_or(table);
        let names = SharedNames {
            keys: named("_keys"),
            holders: named("_holders"),
            waiters: named("_waiters"),
            waiters_unqualified: quote_with(quote, &format!("{last}_waiters")),
            index: quote_with(quote, &format!("{last}_waiters_by_key")),
            index_qualified: named("_waiters_by_key"),
        };
        let (keys, holders, waiters) = (&names.keys, &names.holders, &names.waiters);
        let arc = |s: String| -> Arc<str> { Arc::from(s) };
        let r = |template: String| arc(render(dialect, &template));
        let notifying = |template: String| {
            let plain = render(dialect, &template);
            match dialect.notifying(&plain) {
                Some(wrapped) => (arc(wrapped), true),
                None => (arc(plain), false),
            }
        };
        // The prefix test spelled with the next placeholder.
        let (predicate, page_like) = dialect.prefix_predicate("{p}");
        let (release, notifies) = notifying(format!(
            "DELETE FROM {holders} WHERE name = {{p}} AND shape = {{p}} AND owner = {{p}} \
             AND token = {{p}} AND kind = {{p}} AND expires_at > {{now}}"
        ));
        let (downgrade, _) = notifying(format!(
            "UPDATE {holders} SET kind = 'r' WHERE name = {{p}} AND shape = {{p}} \
             AND owner = {{p}} AND token = {{p}} AND kind = 'w' AND expires_at > {{now}}"
        ));
        Self {
            create: dialect.shared_schema(&names).into_iter().map(arc).collect(),
            begin: Arc::from(dialect.begin_sql()),
            commit: Arc::from("COMMIT"),
            rollback: Arc::from("ROLLBACK"),
            lock_key: dialect.lock_key_sql(keys).into_iter().map(arc).collect(),
            lock_key_shared: dialect
                .lock_key_shared_sql(keys)
                .map(|statements| statements.into_iter().map(arc).collect()),
            state: r(format!(
                "SELECT CAST(0 AS {int}), owner, kind, cnt, lim, token, \
                 CAST(CASE WHEN expires_at > {{now}} THEN 1 ELSE 0 END AS {int}) \
                 FROM {holders} WHERE name = {{p}} AND shape = {{p}} \
                 UNION ALL \
                 SELECT CAST(1 AS {int}), owner, kind, cnt, lim, id, \
                 CAST(CASE WHEN expires_at > {{now}} THEN 1 ELSE 0 END AS {int}) \
                 FROM {waiters} WHERE name = {{p}} AND shape = {{p}}",
                int = dialect.int_type()
            )),
            purge_holder: r(format!(
                "DELETE FROM {holders} WHERE name = {{p}} AND shape = {{p}} AND owner = {{p}} \
                 AND expires_at <= {{now}}"
            )),
            purge_waiters: r(format!(
                "DELETE FROM {waiters} WHERE name = {{p}} AND shape = {{p}} AND expires_at <= {{now}}"
            )),
            set_epoch: r(format!(
                "UPDATE {keys} SET epoch = {{p}} WHERE name = {{p}} AND shape = {{p}}"
            )),
            insert_holder: r(format!(
                "INSERT INTO {holders} \
                 (name, shape, owner, kind, cnt, lim, token, expires_at, details) \
                 VALUES ({{p}}, {{p}}, {{p}}, {{p}}, {{p}}, {{p}}, {{p}}, {{exp}}, {{p}})"
            )),
            insert_waiter: dialect
                .insert_waiter_sql(waiters, &named(""))
                .into_iter()
                .map(arc)
                .collect(),
            refresh_waiter: r(format!(
                "UPDATE {waiters} SET expires_at = {{exp}} WHERE id = {{p}}"
            )),
            delete_waiter: r(format!("DELETE FROM {waiters} WHERE id = {{p}}")),
            notify: notifies.then(|| {
                Arc::from(format!(
                    "SELECT pg_notify({}, {})",
                    dialect.param(1),
                    dialect.param(2)
                ))
            }),
            renew: r(format!(
                "UPDATE {holders} SET expires_at = {{exp}} WHERE name = {{p}} AND shape = {{p}} \
                 AND owner = {{p}} AND token = {{p}} AND kind = {{p}} AND expires_at > {{now}}"
            )),
            release,
            downgrade,
            notifies,
            list: r(format!(
                "SELECT owner, kind, token, {{left}}, details FROM {holders} \
                 WHERE name = {{p}} AND shape = {{p}} AND expires_at > {{now}} ORDER BY token, owner"
            )),
            refresh_live_waiter: r(format!(
                "UPDATE {waiters} SET expires_at = {{exp}} WHERE id = {{p}} AND expires_at > {{now}}"
            )),
            granted_waiter: r(format!(
                "DELETE FROM {waiters} WHERE name = {{p}} AND shape = 'mutex' \
                 AND (id = {{p}} OR expires_at <= {{now}})"
            )),
            forget_waiter: r(format!(
                "DELETE FROM {waiters} WHERE name = {{p}} AND shape = 'mutex' AND owner = {{p}}"
            )),
            list_page: r(format!(
                "SELECT {name}, owner, kind, token, {{left}}, details FROM {holders} \
                 JOIN (SELECT name AS k FROM {holders} WHERE shape = {{p}} AND {predicate} \
                 AND name > {{p}} AND expires_at > {{now}} GROUP BY name ORDER BY name \
                 LIMIT {{p}}) page ON name = page.k \
                 WHERE shape = {{p}} AND expires_at > {{now}} ORDER BY name, token, owner",
                name = dialect.name_text(),
            )),
            page_like,
            holders_table: holders.clone(),
            waiters_table: waiters.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SqlDialect;

    #[test]
    fn tokens_are_spelled_per_dialect() {
        let pg = crate::dialect::of(SqlDialect::Postgres).expect("postgres");
        let my = crate::dialect::of(SqlDialect::MySql).expect("mysql");
        let lite = crate::dialect::of(SqlDialect::Sqlite).expect("sqlite");
        let t = "UPDATE x SET e = {exp} WHERE a = {p} AND e > {now}";
        assert_eq!(
            render(pg, t),
            "UPDATE x SET e = now() + $1 * INTERVAL '1 microsecond' WHERE a = $2 AND e > now()"
        );
        assert_eq!(
            render(my, t),
            "UPDATE x SET e = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE a = ? AND e > UTC_TIMESTAMP(6)"
        );
        assert!(render(lite, t).contains("+ ?1) WHERE a = ?2 AND e > CAST("));
        let s = SharedSql::new(pg, "app.locks");
        assert!(s.create[0].contains("\"app\".\"locks_keys\""));
        assert!(s.create[3].contains("\"locks_waiters_by_key\" ON \"app\".\"locks_waiters\""));
        assert!(s.release.contains("pg_notify($6, name)"), "{}", s.release);
        assert!(
            s.downgrade.contains("pg_notify($5, name)"),
            "{}",
            s.downgrade
        );
        assert!(!SharedSql::new(my, "t").notifies);
    }
}
