//! The code that reads a dialect's [`Profile`], written once: its
//! accessors, and the lease statements run with the binds and answers the
//! profile names (every connection type through `crate::dialect::binds`).

use std::sync::Arc;
use std::time::Duration;

use lock_core::{HolderDetails, Lease, LockError, LockKey};

use super::{
    Arg, Batch, Dialect, GrantReply, Holder, Params, Renewed, SharedNames, micros, token_of,
    unix_micros,
};
use crate::config::SqlConfig;
use crate::connection::{DbConn, DbOptions, DbPool};
use crate::dialect::binds::{
    Bind, Binds, NO_BINDS, Value, execute, fetch, fetch_optional, fetch_optional_int,
};

/// The row a lease of ours matches: its key, owner (hex) and token.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LeaseRow<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) owner: &'a str,
    pub(crate) token: i64,
}

impl<'a> LeaseRow<'a> {
    /// The row of `lease`, whose owner is `owner` in hex.
    pub(crate) fn of(lease: &'a Lease, owner: &'a str) -> Self {
        Self {
            key: lease.key(),
            owner,
            token: token_of(lease),
        }
    }
}

/// The values one lease statement may bind, by [`Arg`].
struct Values<'a> {
    key: &'a str,
    owner: &'a str,
    token: i64,
    ttl: Duration,
    details: &'a str,
    channel: &'a str,
    ahead: Option<i64>,
    mark_for: Option<Duration>,
}

/// What one row-mode grant statement binds besides its holder details.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GrantValues<'a> {
    pub(crate) key: &'a LockKey,
    /// The owner, as hex.
    pub(crate) owner: &'a str,
    pub(crate) ttl: Duration,
    /// `Some(id)` for the fair statement ([`Dialect::fair_grant_sql`]): it
    /// grants only when no live mutex waiter with an id below `id` waits
    /// for the key.
    pub(crate) ahead: Option<i64>,
    /// `Some` for a waiter's grant ([`WaitingSql::grant`]), which marks a
    /// held row waited for that long.
    ///
    /// [`WaitingSql::grant`]: super::WaitingSql::grant
    pub(crate) mark_for: Option<Duration>,
}

impl<'a> Values<'a> {
    fn new(key: &'a str, owner: &'a str) -> Self {
        Self {
            key,
            owner,
            token: 0,
            ttl: Duration::ZERO,
            details: "",
            channel: "",
            ahead: None,
            mark_for: None,
        }
    }

    fn of(row: LeaseRow<'a>) -> Self {
        Self {
            token: row.token,
            ..Self::new(row.key.as_str(), row.owner)
        }
    }

    /// The binds of `args`, in their order (the fair grant's only when it
    /// is one), made as they are bound: the grant and the release bind
    /// them straight onto their query.
    fn each(&self, args: &'static [Arg]) -> impl Iterator<Item = Bind<'a>> {
        args.iter().filter_map(|arg| self.bind(*arg))
    }

    /// [`each`](Self::each) kept (a statement whose binds are not made as
    /// it runs).
    fn binds(&self, args: &'static [Arg]) -> Binds<'a> {
        let mut binds = Binds::new();
        binds.extend(self.each(args));
        binds
    }

    /// Inlined into [`each`](Self::each): a call per bind cost more than
    /// the match (callgrind of sql_parts' SqlBackend side).
    #[inline]
    fn bind(&self, arg: Arg) -> Option<Bind<'a>> {
        Some(match arg {
            Arg::Key => Bind::Text(self.key),
            Arg::KeyBytes => Bind::Bytes(self.key.as_bytes()),
            Arg::Owner => Bind::Text(self.owner),
            Arg::Token => Bind::Int(self.token),
            Arg::Ttl => Bind::Int(micros(self.ttl)),
            // Bound only by dialects whose profile says so, once a statement.
            Arg::Now => Bind::Int(unix_micros()),
            Arg::Details => Bind::Text(self.details),
            Arg::Channel => Bind::Text(self.channel),
            Arg::Ahead => Bind::Int(self.ahead?),
            Arg::AheadKeyBytes => {
                self.ahead?;
                Bind::Bytes(self.key.as_bytes())
            }
            Arg::MarkFor => Bind::Int(micros(self.mark_for?)),
        })
    }
}

/// The waiting mark's binds (the same on every database).
const MARK_BINDS: &[Arg] = &[Arg::Key, Arg::MarkFor];

impl dyn Dialect {
    /// The backend's name (`"postgres"`, `"mysql"`, `"sqlite"`).
    pub(crate) fn name(&self) -> &'static str {
        self.profile().name
    }

    /// The identifier quote character.
    pub(crate) fn quote(&self) -> char {
        self.profile().quote
    }

    /// The key column as text in a `SELECT`.
    pub(crate) fn name_text(&self) -> &'static str {
        self.profile().name_text
    }

    /// "Now" bound by the statement, in the µs `expires_at` stores, where
    /// the mutex's statements bind it; `None` where the database's clock
    /// is used.
    pub(crate) fn bound_now(&self) -> Option<i64> {
        self.profile().binds_now.then(unix_micros)
    }

    /// The suffix of a `SELECT` that locks the rows it read.
    pub(crate) fn for_update(&self) -> &'static str {
        self.profile().for_update
    }

    /// Whether releases notify waiters through the database.
    pub(crate) fn notified(&self) -> bool {
        self.profile().notified
    }

    /// The default number of connections.
    pub(crate) fn default_pool_size(&self, memory: bool) -> u32 {
        let (server, in_memory) = self.profile().pool_size;
        if memory { in_memory } else { server }
    }

    /// Whether the process's writing statements take turns.
    pub(crate) fn single_writer(&self) -> bool {
        self.profile().single_writer
    }

    /// How many rows a batch of `leases` is sent as (padded to a power of
    /// two where the rows are spliced as placeholders).
    pub(crate) fn batch_rows(&self, leases: usize) -> usize {
        match self.profile().binds.batch {
            Batch::Arrays => leases,
            Batch::Spliced { .. } => leases.next_power_of_two(),
        }
    }

    /// The 64-bit integer type a `CAST` names.
    pub(crate) fn int_type(&self) -> &'static str {
        self.profile().int_type
    }

    /// "Now" on the database's clock, as stored in `expires_at`.
    pub(crate) fn now_sql(&self) -> &'static str {
        self.profile().now_sql
    }

    /// The microseconds `expires_at` is ahead of now.
    pub(crate) fn left_micros(&self) -> &'static str {
        self.profile().left_micros
    }

    /// Opens a grant transaction.
    pub(crate) fn begin_sql(&self) -> &'static str {
        self.profile().begin
    }

    /// The `n`th (1-based) placeholder of a shared statement.
    pub(crate) fn param(&self, n: usize) -> String {
        match self.profile().params {
            Params::Numbered(prefix) => format!("{prefix}{n}"),
            Params::Positional => "?".to_owned(),
        }
    }

    /// "Now" plus `micros` (a placeholder) microseconds.
    pub(crate) fn plus_micros(&self, micros: &str) -> String {
        let [before, after] = self.profile().micros_later;
        format!("{before}{micros}{after}")
    }

    /// The shared tables' `CREATE .. IF NOT EXISTS` statements.
    pub(crate) fn shared_schema(&self, names: &SharedNames) -> Vec<String> {
        super::shared_tables(names, &self.profile().shared)
    }

    /// sqlx's connect options for `config` and the users' pool (opened
    /// lazily) on the same options.
    pub(crate) fn open(&self, config: &SqlConfig) -> Result<(DbOptions, DbPool), LockError> {
        let options = self.connect_options(config)?;
        let acquire = if self.profile().busy_timeout {
            config.op_timeout.max(config.busy_timeout)
        } else {
            config.op_timeout
        };
        let pool = options.lazy_pool(super::pool_size(config), acquire);
        Ok((options, pool))
    }

    /// The grant's binds of `values`, in the dialect's order; a waiter's
    /// grant (`WaitingSql::grant`) binds its mark last.
    fn grant_binds<'a>(&self, values: &Values<'a>) -> impl Iterator<Item = Bind<'a>> {
        (values.each(self.profile().binds.grant)).chain(values.bind(Arg::MarkFor))
    }

    /// The grant: `Some(token)` when the row was inserted or an expired one
    /// taken over, `None` when someone holds it.
    pub(crate) async fn grant(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        grant: &GrantValues<'_>,
    ) -> Result<Option<i64>, sqlx::Error> {
        let details = HolderDetails::encode_current();
        let values = Values {
            ttl: grant.ttl,
            ahead: grant.ahead,
            mark_for: grant.mark_for,
            details: &details,
            ..Values::new(grant.key.as_str(), grant.owner)
        };
        // Bound straight onto the connection's query (no `Binds` between).
        let binds = self.grant_binds(&values);
        match self.profile().binds.grant_reply {
            GrantReply::Returning => fetch_optional_int(conn, sql, binds).await,
            #[cfg(feature = "mysql")]
            GrantReply::LastInsertId => {
                let token = crate::dialect::binds::last_insert_id(conn, sql, binds).await?;
                Ok((token != 0).then(|| i64::try_from(token).unwrap_or(i64::MAX)))
            }
            #[cfg(not(feature = "mysql"))]
            GrantReply::LastInsertId => Err(super::wrong_conn("mysql")),
        }
    }

    /// Marks `key`'s held row waited for during `mark_for`
    /// ([`WaitingSql::mark`](super::WaitingSql::mark)).
    pub(crate) async fn mark_waited(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
        mark_for: Duration,
    ) -> Result<(), sqlx::Error> {
        let values = Values {
            mark_for: Some(mark_for),
            ..Values::new(key.as_str(), "")
        };
        let binds = values.binds(MARK_BINDS);
        execute(conn, sql, &binds).await.map(|_| ())
    }

    /// The guarded release: whether it matched our row (PostgreSQL
    /// notifies `channel` in the same statement when someone waits, and
    /// answers the row either way).
    pub(crate) async fn release(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        row: &LeaseRow<'_>,
        channel: &str,
    ) -> Result<bool, sqlx::Error> {
        // As in `grant` (the row is taken by reference: the future keeps
        // its arguments).
        let values = Values {
            channel,
            ..Values::of(*row)
        };
        let binds = values.each(self.profile().binds.release);
        if self.notified() {
            Ok(fetch_optional(conn, sql, binds, "").await?.is_some())
        } else {
            Ok(execute(conn, sql, binds).await? == 1)
        }
    }

    /// The renewal: rows matched (1 when still ours and unexpired).
    pub(crate) async fn renew(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        row: LeaseRow<'_>,
        ttl: Duration,
    ) -> Result<u64, sqlx::Error> {
        let values = Values {
            ttl,
            ..Values::of(row)
        };
        execute(conn, sql, &values.binds(self.profile().binds.renew)).await
    }

    /// The current unexpired holder of `key`.
    pub(crate) async fn inspect(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        key: &LockKey,
    ) -> Result<Option<Holder>, sqlx::Error> {
        let values = Values::new(key.as_str(), "");
        let binds = values.binds(self.profile().binds.inspect);
        let row = fetch_optional(conn, sql, &binds, "tiit").await?;
        Ok(row.map(|row| {
            let mut columns = row.into_iter();
            let mut next = || columns.next().unwrap_or(Value::Int(None));
            (
                next().into_text(),
                next().int(),
                next().int(),
                next().into_text(),
            )
        }))
    }

    /// One batch renewal of `group` (`rows` rows, the last lease repeated
    /// as padding where they are spliced): the renewed rows, or `None` when
    /// the database only says that fewer rows than leases matched (MySQL).
    pub(crate) async fn renew_batch(
        &self,
        conn: &mut DbConn,
        sql: &Arc<str>,
        group: &[&Lease],
        owners: &[String],
        ttl: Duration,
        rows: usize,
    ) -> Result<Option<Renewed>, sqlx::Error> {
        let (lead, key, returns) = match self.profile().binds.batch {
            #[cfg(feature = "postgres")]
            Batch::Arrays => {
                return super::postgres::renew_arrays(conn, sql, group, owners, ttl).await;
            }
            #[cfg(not(feature = "postgres"))]
            Batch::Arrays => return Err(super::wrong_conn("postgres")),
            Batch::Spliced { lead, key, returns } => (lead, key, returns),
        };
        let values = Values {
            ttl,
            ..Values::new("", "")
        };
        let mut binds = values.binds(lead);
        let pick = |i: usize| i.min(group.len() - 1);
        let key_of = |i: usize| {
            let name = group[pick(i)].key().as_str();
            if key == Arg::KeyBytes {
                Bind::Bytes(name.as_bytes())
            } else {
                Bind::Text(name)
            }
        };
        for i in 0..rows {
            binds.push(key_of(i));
            binds.push(Bind::Text(owners[pick(i)].as_str()));
            binds.push(Bind::Int(token_of(group[pick(i)])));
        }
        binds.extend((0..rows).map(key_of));
        if returns {
            let renewed = fetch(conn, sql, &binds, "tti").await?;
            return Ok(Some(
                renewed
                    .into_iter()
                    .map(|row| {
                        let mut columns = row.into_iter();
                        let mut next = || columns.next().unwrap_or(Value::Int(None));
                        let (name, owner) = (next().into_text(), next().into_text());
                        (
                            name.unwrap_or_default(),
                            owner.unwrap_or_default(),
                            next().int(),
                        )
                    })
                    .collect(),
            ));
        }
        let matched = execute(conn, sql, &binds).await?;
        Ok(
            (usize::try_from(matched).ok() == Some(group.len())).then(|| {
                group
                    .iter()
                    .zip(owners)
                    .map(|(l, o)| (l.key().as_str().to_owned(), o.clone(), token_of(l)))
                    .collect()
            }),
        )
    }

    /// Runs one statement without binds (schema creation, `SELECT 1`).
    pub(crate) async fn plain(&self, conn: &mut DbConn, sql: &Arc<str>) -> Result<(), sqlx::Error> {
        execute(conn, sql, NO_BINDS).await.map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::{Binds, Values};
    use crate::config::SqlDialect;
    use std::time::Duration;

    /// Every lease statement's binds kept in [`Binds`] stay inline (no
    /// allocation per statement); the grant's and the release's are made
    /// as they are bound (`Values::each`), kept nowhere.
    #[test]
    fn lease_statements_bind_inline() {
        for dialect in [SqlDialect::Postgres, SqlDialect::MySql, SqlDialect::Sqlite] {
            let Ok(dialect) = super::super::of(dialect) else {
                continue; // its cargo feature is off
            };
            let values = Values {
                ttl: Duration::from_secs(30),
                mark_for: Some(Duration::from_secs(1)),
                ..Values::new("key", "owner")
            };
            let binds = &dialect.profile().binds;
            for (statement, bound) in [
                ("mark", values.binds(super::MARK_BINDS)),
                ("renew", values.binds(binds.renew)),
                ("inspect", values.binds(binds.inspect)),
            ] {
                assert!(
                    matches!(bound, Binds::Inline(..)),
                    "{} {statement}: {} binds, {} inline",
                    dialect.name(),
                    bound.len(),
                    Binds::INLINE
                );
            }
        }
    }
}
