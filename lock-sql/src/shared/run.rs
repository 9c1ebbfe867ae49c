//! Running a shared-table statement with its binds on a connection of any
//! dialect: the statements are the same text with the same binds (keys,
//! owners, kinds as text; counts, tokens, TTLs, ids as `BIGINT`), so one
//! body serves every connection type.

use std::sync::Arc;

use sqlx::Row;

use crate::conn::DbConn;
use crate::dialect::text;

/// One bound value.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bind<'a> {
    Text(&'a str),
    Int(i64),
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
}

/// The same body for every connection type (each arm is typed by its own
/// connection).
macro_rules! on_conn {
    ($conn:expr, |$c:ident| $body:expr) => {
        match $conn {
            #[cfg(feature = "postgres")]
            DbConn::Postgres($c) => $body,
            #[cfg(feature = "mysql")]
            DbConn::MySql($c) => $body,
            #[cfg(feature = "sqlite")]
            DbConn::Sqlite($c) => $body,
        }
    };
}

macro_rules! bound {
    ($sql:expr, $binds:expr) => {{
        let mut query = sqlx::query(text($sql));
        for bind in $binds {
            query = match *bind {
                Bind::Text(v) => query.bind(v),
                Bind::Int(v) => query.bind(v),
            };
        }
        query
    }};
}

/// Runs `sql` and reads every row as `spec` says (`i` integer, `t` text).
pub(crate) async fn fetch(
    conn: &mut DbConn,
    sql: &Arc<str>,
    binds: &[Bind<'_>],
    spec: &str,
) -> Result<Vec<Vec<Value>>, sqlx::Error> {
    on_conn!(conn, |c| {
        let rows = bound!(sql, binds).fetch_all(&mut *c).await?;
        rows.iter()
            .map(|row| {
                spec.chars()
                    .enumerate()
                    .map(|(i, t)| {
                        Ok(match t {
                            't' => Value::Text(row.try_get(i)?),
                            _ => Value::Int(row.try_get(i)?),
                        })
                    })
                    .collect()
            })
            .collect()
    })
}

/// Runs `sql`: the rows it changed (MySQL: matched).
pub(crate) async fn execute(
    conn: &mut DbConn,
    sql: &Arc<str>,
    binds: &[Bind<'_>],
) -> Result<u64, sqlx::Error> {
    on_conn!(conn, |c| {
        Ok(bound!(sql, binds).execute(&mut *c).await?.rows_affected())
    })
}
