//! Running a shared-table statement with its binds on a connection of any
//! dialect: the statements are the same text with the same binds (keys,
//! owners, kinds as text; counts, tokens, TTLs, ids as `BIGINT`), so one
//! body serves every connection type.
//!
//! A statement's binds are any sequence of [`Bind`]s (or references to
//! them): a slice, [`Binds`], or an iterator that makes each as it is
//! bound (the lease statements', `Dialect::grant` and `release`: no
//! [`Binds`] in between).

use std::borrow::Borrow;
use std::sync::Arc;

use sqlx::Row;

use crate::connection::{DbConn, on_conn};
use crate::dialect::text;

/// One bound value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bind<'a> {
    Text(&'a str),
    Int(i64),
    /// A key as bytes (MySQL's `VARBINARY` lease table).
    Bytes(&'a [u8]),
}

/// The binds of one statement, kept inline up to [`Binds::INLINE`] (the
/// renewal's, the inspect's, a mark's: no allocation per statement), else
/// in a `Vec` (a batch's rows).
///
/// Five inline, the most a statement kept in `Binds` binds for one lease
/// (the renewal on SQLite; checked by `lease_statements_bind_inline`): the
/// binds are kept across the statement in its future. The grant and the
/// release, with up to six, make theirs as they are bound.
#[derive(Clone, Debug)]
pub(crate) enum Binds<'a> {
    Inline([Bind<'a>; Binds::INLINE], usize),
    Spilled(Vec<Bind<'a>>),
}

impl<'a> Binds<'a> {
    pub(crate) const INLINE: usize = 5;

    pub(crate) fn new() -> Self {
        Self::Inline([Bind::Int(0); Self::INLINE], 0)
    }

    #[inline]
    pub(crate) fn push(&mut self, bind: Bind<'a>) {
        match self {
            Self::Inline(items, len) if *len < Self::INLINE => {
                items[*len] = bind;
                *len += 1;
            }
            _ => self.push_spilled(bind),
        }
    }

    /// [`push`](Self::push) past [`INLINE`](Self::INLINE) binds (a batch's
    /// rows), out of line so that a lease statement's pushes stay small.
    #[cold]
    fn push_spilled(&mut self, bind: Bind<'a>) {
        match self {
            Self::Inline(items, len) => {
                let mut spilled = items[..*len].to_vec();
                spilled.push(bind);
                *self = Self::Spilled(spilled);
            }
            Self::Spilled(items) => items.push(bind),
        }
    }
}

impl<'a> Extend<Bind<'a>> for Binds<'a> {
    fn extend<I: IntoIterator<Item = Bind<'a>>>(&mut self, binds: I) {
        for bind in binds {
            self.push(bind);
        }
    }
}

impl<'s, 'a> IntoIterator for &'s Binds<'a> {
    type Item = &'s Bind<'a>;
    type IntoIter = std::slice::Iter<'s, Bind<'a>>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<'a> std::ops::Deref for Binds<'a> {
    type Target = [Bind<'a>];

    fn deref(&self) -> &[Bind<'a>] {
        match self {
            Self::Inline(items, len) => &items[..*len],
            Self::Spilled(items) => items,
        }
    }
}

/// One column read back: `Int` for `i` in the spec, `Text` for `t`.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    Int(Option<i64>),
    Text(Option<String>),
}

impl Value {
    pub(crate) fn int(&self) -> i64 {
        match self {
            Self::Int(Some(v)) => *v,
            _ => 0,
        }
    }

    pub(crate) fn text(&self) -> &str {
        match self {
            Self::Text(Some(v)) => v,
            _ => "",
        }
    }

    /// The text read, `None` for SQL `NULL` (or an integer column).
    pub(crate) fn into_text(self) -> Option<String> {
        match self {
            Self::Text(v) => v,
            Self::Int(_) => None,
        }
    }
}

macro_rules! bound {
    ($sql:expr, $binds:expr) => {{
        let mut query = sqlx::query(text($sql));
        for bind in $binds {
            query = match *bind.borrow() {
                Bind::Text(v) => query.bind(v),
                Bind::Int(v) => query.bind(v),
                Bind::Bytes(v) => query.bind(v),
            };
        }
        query
    }};
}

/// The pooled connection's query of `sql` with `binds`, and whether it
/// binds nothing (see `PooledPg::fetch_all`).
#[cfg(feature = "postgres")]
fn pooled<'a, B>(
    sql: &Arc<str>,
    binds: B,
) -> (
    bool,
    sqlx::query::Query<'a, sqlx::Postgres, sqlx::postgres::PgArguments>,
)
where
    B: IntoIterator<Item: Borrow<Bind<'a>>>,
{
    let mut binds = binds.into_iter().peekable();
    (binds.peek().is_none(), bound!(sql, binds))
}

/// No binds: a statement without parameters (schema set-up, `BEGIN`).
pub(crate) const NO_BINDS: [Bind<'static>; 0] = [];

/// One row read as `spec` says (`i` integer, `t` text).
macro_rules! read {
    ($row:expr, $spec:expr) => {
        $spec
            .chars()
            .enumerate()
            .map(|(i, t)| {
                Ok(match t {
                    't' => Value::Text($row.try_get(i)?),
                    _ => Value::Int($row.try_get(i)?),
                })
            })
            .collect::<Result<Vec<Value>, sqlx::Error>>()
    };
}

/// Runs `sql` and reads every row as `spec` says (`i` integer, `t` text).
pub(crate) async fn fetch<'a>(
    conn: &mut DbConn,
    sql: &Arc<str>,
    binds: impl IntoIterator<Item: Borrow<Bind<'a>>>,
    spec: &str,
) -> Result<Vec<Vec<Value>>, sqlx::Error> {
    #[cfg(feature = "postgres")]
    if let DbConn::PostgresPooled(p) = conn {
        let (unbound, query) = pooled(sql, binds);
        let rows = p.fetch_all(sql, unbound, query).await?;
        return rows.iter().map(|row| read!(row, spec)).collect();
    }
    on_conn!(conn, |c| {
        let rows = bound!(sql, binds).fetch_all(&mut *c).await?;
        rows.iter().map(|row| read!(row, spec)).collect()
    })
}

/// Runs `sql` and reads its first row, if any, as `spec` says (sqlx's
/// `fetch_optional`: a statement that answers at most one row).
pub(crate) async fn fetch_optional<'a>(
    conn: &mut DbConn,
    sql: &Arc<str>,
    binds: impl IntoIterator<Item: Borrow<Bind<'a>>>,
    spec: &str,
) -> Result<Option<Vec<Value>>, sqlx::Error> {
    #[cfg(feature = "postgres")]
    if let DbConn::PostgresPooled(p) = conn {
        let (unbound, query) = pooled(sql, binds);
        let rows = p.fetch_all(sql, unbound, query).await?;
        return rows.first().map(|row| read!(row, spec)).transpose();
    }
    on_conn!(conn, |c| {
        let row = bound!(sql, binds).fetch_optional(&mut *c).await?;
        row.map(|row| read!(row, spec)).transpose()
    })
}

/// [`fetch_optional`] of a statement that answers one integer column (a
/// grant's token), read without a row vector (`NULL` reads as 0, as
/// [`Value::int`]).
pub(crate) async fn fetch_optional_int<'a>(
    conn: &mut DbConn,
    sql: &Arc<str>,
    binds: impl IntoIterator<Item: Borrow<Bind<'a>>>,
) -> Result<Option<i64>, sqlx::Error> {
    #[cfg(feature = "postgres")]
    if let DbConn::PostgresPooled(p) = conn {
        let (unbound, query) = pooled(sql, binds);
        let rows = p.fetch_all(sql, unbound, query).await?;
        return rows
            .first()
            .map(|row| Ok(row.try_get::<Option<i64>, _>(0)?.unwrap_or(0)))
            .transpose();
    }
    on_conn!(conn, |c| {
        let row = bound!(sql, binds).fetch_optional(&mut *c).await?;
        row.map(|row| Ok(row.try_get::<Option<i64>, _>(0)?.unwrap_or(0)))
            .transpose()
    })
}

/// Runs `sql` on MySQL/MariaDB: the `LAST_INSERT_ID(expr)` its OK packet
/// carries.
#[cfg(feature = "mysql")]
pub(crate) async fn last_insert_id<'a>(
    conn: &mut DbConn,
    sql: &Arc<str>,
    binds: impl IntoIterator<Item: Borrow<Bind<'a>>>,
) -> Result<u64, sqlx::Error> {
    #[allow(irrefutable_let_patterns)] // with only MySQL compiled in
    let DbConn::MySql(c) = conn else {
        return Err(crate::dialect::wrong_conn("mysql"));
    };
    Ok(bound!(sql, binds).execute(&mut *c).await?.last_insert_id())
}

/// Runs `sql`: the rows it changed (MySQL: matched).
pub(crate) async fn execute<'a>(
    conn: &mut DbConn,
    sql: &Arc<str>,
    binds: impl IntoIterator<Item: Borrow<Bind<'a>>>,
) -> Result<u64, sqlx::Error> {
    #[cfg(feature = "postgres")]
    if let DbConn::PostgresPooled(p) = conn {
        let (unbound, query) = pooled(sql, binds);
        return p.execute(sql, unbound, query).await;
    }
    on_conn!(conn, |c| {
        Ok(bound!(sql, binds).execute(&mut *c).await?.rows_affected())
    })
}

#[cfg(test)]
mod tests {
    use super::{Bind, Binds};

    #[test]
    fn binds_keep_their_order_inline_and_past_it() {
        let mut binds = Binds::new();
        binds.extend((0..20).map(Bind::Int));
        let read: Vec<i64> = binds
            .iter()
            .map(|b| match b {
                Bind::Int(v) => *v,
                _ => -1,
            })
            .collect();
        assert_eq!(read, (0..20).collect::<Vec<i64>>());
        assert!(matches!(binds, Binds::Spilled(_)));
        let mut few = Binds::new();
        few.push(Bind::Text("key"));
        assert!(matches!(few, Binds::Inline(_, 1)));
        assert!(matches!(*few, [Bind::Text("key")]));
    }
}
