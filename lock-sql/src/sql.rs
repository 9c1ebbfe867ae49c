//! The lock statements of a backend, built once from the validated table
//! name by its [`Dialect`] (the text lives in `crate::dialect`).
//!
//! Every value (key, owner, token, TTL, time) is a bound parameter; the only
//! text spliced into SQL is the table name, which
//! [`validate_table`](crate::config::validate_table) restricted to
//! `[A-Za-z_][A-Za-z0-9_]*` (optionally `schema.`) and which is quoted here.

use std::sync::Arc;

use crate::dialect::{Dialect, floor_table};

/// SQL text for one backend. `Arc<str>` so that issuing a statement does not
/// copy it (sqlx takes ownership of the SQL of each query).
#[derive(Debug)]
pub(crate) struct Statements {
    /// Creates the table if missing (idempotent).
    pub(crate) create: Vec<Arc<str>>,
    /// Inserts or takes over an expired row, bumping the token.
    pub(crate) grant: Arc<str>,
    /// Clears the owner and expires the row, if still ours and unexpired.
    pub(crate) release: Arc<str>,
    /// Extends the expiry, if still ours and unexpired.
    pub(crate) renew: Arc<str>,
    /// Reads the current unexpired holder.
    pub(crate) inspect: Arc<str>,
    /// The quoted table name.
    pub(crate) quoted_table: String,
    /// The quoted token floor table (`<table>_floor`, see crate::admin).
    pub(crate) quoted_floor: String,
}

/// Quotes each part of a validated (schema-qualified) name with `quote`.
pub(crate) fn quote_with(quote: char, table: &str) -> String {
    table
        .split('.')
        .map(|part| format!("{quote}{part}{quote}"))
        .collect::<Vec<_>>()
        .join(".")
}

/// The PostgreSQL notification channel for releases on `table`.
pub(crate) fn pg_channel(table: &str) -> String {
    format!("distlock_{}", table.replace('.', "_"))
}

impl Statements {
    /// The statements of `dialect` on `table` (validated, not yet quoted).
    pub(crate) fn new(dialect: &dyn Dialect, table: &str) -> Self {
        let quoted_floor = quote_with(dialect.quote(), &format!("{table}_floor"));
        let quoted_table = quote_with(dialect.quote(), table);
        let sql = dialect.statements(&quoted_table, &quoted_floor);
        Self {
            create: vec![sql.create.into(), floor_table(&quoted_floor).into()],
            grant: sql.grant.into(),
            release: sql.release.into(),
            renew: sql.renew.into(),
            inspect: sql.inspect.into(),
            quoted_table,
            quoted_floor,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SqlDialect;

    #[test]
    fn table_names_are_quoted_per_dialect() {
        assert_eq!(quote_with('"', "app.locks"), "\"app\".\"locks\"");
        assert_eq!(quote_with('`', "locks"), "`locks`");
        assert_eq!(pg_channel("app.locks"), "distlock_app_locks");
        let dialect = crate::dialect::of(SqlDialect::Sqlite).expect("sqlite compiled in");
        let s = Statements::new(dialect, "x");
        assert!(s.grant.contains("INSERT INTO \"x\""));
    }
}
