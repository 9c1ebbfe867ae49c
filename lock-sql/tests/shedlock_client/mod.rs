//! ShedLock's own statements, as its `JdbcTemplateLockProvider` sends them
//! (ShedLock 7.x: `PostgresSqlServerTimeStatementsSource` and
//! `MySqlServerTimeStatementsSource` with `usingDbTime()`; on SQLite, which
//! has no `usingDbTime()`, the generic `SqlStatementsSource` with the
//! client's clock bound as epoch milliseconds, sqlite-jdbc's default
//! storage of a bound timestamp), run on a plain sqlx connection of their
//! own: not through the driver under test.
//!
//! Spring binds named parameters; a name used twice is bound twice. The
//! `lockAtMostFor`/`lockAtLeastFor` seconds ShedLock binds as a
//! `BigDecimal` on PostgreSQL travel here as `float8` (what
//! `make_interval(secs => ..)` takes).

#![allow(dead_code, unreachable_pub)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_sql::sqlx::{self, AssertSqlSafe, Connection};

/// One ShedLock "instance": its connection, table and `lockedBy` value.
pub struct ShedLock {
    conn: Conn,
    table: String,
    /// ShedLock writes the host name here.
    pub locked_by: String,
    /// The negative control: an update that ignores `lock_until`.
    pub ignore_lock_until: bool,
    /// SQLite: when the last lock was taken (ShedLock's `lockAtLeastFor`
    /// counts from there, on the client's clock).
    locked_at_ms: i64,
}

enum Conn {
    Pg(sqlx::PgConnection),
    My(sqlx::MySqlConnection),
    Lite(sqlx::SqliteConnection),
}

/// One value a statement binds: text, a duration as seconds (`float8`,
/// what PostgreSQL's `make_interval(secs => ..)` takes), or an integer.
#[derive(Clone, Copy)]
enum V<'a> {
    Text(&'a str),
    Secs(Duration),
    Int(i64),
}

impl Conn {
    /// Runs `sql` with `binds`: the rows affected.
    async fn execute(&mut self, sql: String, binds: &[V<'_>]) -> Result<u64, sqlx::Error> {
        macro_rules! run {
            ($c:expr) => {{
                let mut query = sqlx::query(AssertSqlSafe(sql));
                for bind in binds {
                    query = match *bind {
                        V::Text(v) => query.bind(v),
                        V::Secs(v) => query.bind(v.as_secs_f64()),
                        V::Int(v) => query.bind(v),
                    };
                }
                query.execute($c).await.map(|r| r.rows_affected())
            }};
        }
        match self {
            Conn::Pg(c) => run!(c),
            Conn::My(c) => run!(c),
            Conn::Lite(c) => run!(c),
        }
    }
}

const PG_NOW: &str = "timezone('utc', CURRENT_TIMESTAMP)";
const MY_NOW: &str = "UTC_TIMESTAMP(3)";

fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap()
}

fn us(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap()
}

impl ShedLock {
    /// Connects to `url` (`postgres://`, `mysql://`, `sqlite://`) like a
    /// JDBC client would (MySQL: no session time zone of its own).
    pub async fn connect(url: &str, table: &str, locked_by: &str) -> Self {
        let conn = if url.starts_with("postgres") {
            Conn::Pg(sqlx::PgConnection::connect(url).await.unwrap())
        } else if url.starts_with("mysql") {
            let options: sqlx::mysql::MySqlConnectOptions = url.parse().unwrap();
            let options = options.timezone(None::<String>);
            Conn::My(sqlx::MySqlConnection::connect_with(&options).await.unwrap())
        } else {
            Conn::Lite(sqlx::SqliteConnection::connect(url).await.unwrap())
        };
        Self {
            conn,
            table: table.to_owned(),
            locked_by: locked_by.to_owned(),
            ignore_lock_until: false,
            locked_at_ms: 0,
        }
    }

    /// Whether ShedLock's insert is an upsert that also takes an expired
    /// row (PostgreSQL with `usingDbTime()`).
    pub fn insert_is_upsert(&self) -> bool {
        matches!(self.conn, Conn::Pg(_))
    }

    /// ShedLock's insert: whether it inserted (or, on PostgreSQL, whose
    /// insert is an upsert, took an expired row). A duplicate key is
    /// `false`, as `insertRecord` reports it.
    pub async fn insert(&mut self, name: &str, at_most: Duration) -> bool {
        let t = &self.table;
        let (by, now_ms) = (self.locked_by.as_str(), now_ms());
        let (sql, binds) = match self.conn {
            Conn::Pg(_) => {
                let most = format!("{PG_NOW} + make_interval(secs => $2)");
                let sql = format!(
                    "INSERT INTO {t}(name, lock_until, locked_at, locked_by) VALUES($1, {most}, {PG_NOW}, $3) \
                     ON CONFLICT (name) DO UPDATE SET lock_until = {most}, locked_at = {PG_NOW}, locked_by = $3 \
                     WHERE {t}.name = $1 AND {t}.lock_until <= {PG_NOW}"
                );
                (sql, vec![V::Text(name), V::Secs(at_most), V::Text(by)])
            }
            Conn::My(_) => {
                let sql = format!(
                    "INSERT IGNORE INTO {t}(name, lock_until, locked_at, locked_by) \
                     VALUES(?, TIMESTAMPADD(MICROSECOND, ?, {MY_NOW}), {MY_NOW}, ?)"
                );
                (sql, vec![V::Text(name), V::Int(us(at_most)), V::Text(by)])
            }
            Conn::Lite(_) => {
                let sql = format!(
                    "INSERT INTO {t}(name, lock_until, locked_at, locked_by) VALUES(?, ?, ?, ?)"
                );
                let until = now_ms + ms(at_most);
                (
                    sql,
                    vec![V::Text(name), V::Int(until), V::Int(now_ms), V::Text(by)],
                )
            }
        };
        match self.conn.execute(sql, &binds).await {
            Ok(n) => {
                if n > 0 {
                    self.locked_at_ms = now_ms;
                }
                n > 0
            }
            Err(sqlx::Error::Database(db)) if db.is_unique_violation() => false,
            Err(e) => panic!("ShedLock insert failed: {e}"),
        }
    }

    /// ShedLock's update (takes the row when `lock_until <= now`; with
    /// [`ignore_lock_until`](Self::ignore_lock_until), always): rows
    /// affected.
    pub async fn update(&mut self, name: &str, at_most: Duration) -> u64 {
        let t = &self.table;
        let (by, now_ms) = (self.locked_by.as_str(), now_ms());
        let ignore = self.ignore_lock_until;
        let gate = |gate: String| if ignore { String::new() } else { gate };
        let (sql, binds) = match self.conn {
            Conn::Pg(_) => {
                let gate = gate(format!(" AND {t}.lock_until <= {PG_NOW}"));
                let sql = format!(
                    "UPDATE {t} SET lock_until = {PG_NOW} + make_interval(secs => $2), locked_at = {PG_NOW}, \
                     locked_by = $3 WHERE {t}.name = $1{gate}"
                );
                (sql, vec![V::Text(name), V::Secs(at_most), V::Text(by)])
            }
            Conn::My(_) => {
                let gate = gate(format!(" AND lock_until <= {MY_NOW}"));
                let sql = format!(
                    "UPDATE {t} SET lock_until = TIMESTAMPADD(MICROSECOND, ?, {MY_NOW}), \
                     locked_at = {MY_NOW}, locked_by = ? WHERE name = ?{gate}"
                );
                (sql, vec![V::Int(us(at_most)), V::Text(by), V::Text(name)])
            }
            Conn::Lite(_) => {
                let gate = if ignore {
                    " AND ? = ?"
                } else {
                    " AND lock_until <= ?"
                };
                let sql = format!(
                    "UPDATE {t} SET lock_until = ?, locked_at = ?, locked_by = ? WHERE name = ?{gate}"
                );
                let until = now_ms + ms(at_most);
                let mut binds = vec![
                    V::Int(until),
                    V::Int(now_ms),
                    V::Text(by),
                    V::Text(name),
                    V::Int(now_ms),
                ];
                if ignore {
                    binds.push(V::Int(now_ms));
                }
                (sql, binds)
            }
        };
        let rows = self.conn.execute(sql, &binds).await.unwrap();
        if rows > 0 {
            self.locked_at_ms = now_ms;
        }
        rows
    }

    /// ShedLock's `lock()`: the insert, and the update when it failed.
    pub async fn lock(&mut self, name: &str, at_most: Duration) -> bool {
        self.insert(name, at_most).await || self.update(name, at_most).await > 0
    }

    /// ShedLock's extend (`lock_until = now + at_most` while its own and
    /// unexpired): rows affected.
    pub async fn extend(&mut self, name: &str, at_most: Duration) -> u64 {
        let t = &self.table;
        let by = self.locked_by.as_str();
        let (sql, binds) = match self.conn {
            Conn::Pg(_) => {
                let sql = format!(
                    "UPDATE {t} SET lock_until = {PG_NOW} + make_interval(secs => $2) \
                     WHERE name = $1 AND locked_by = $3 AND lock_until > {PG_NOW}"
                );
                (sql, vec![V::Text(name), V::Secs(at_most), V::Text(by)])
            }
            Conn::My(_) => {
                let sql = format!(
                    "UPDATE {t} SET lock_until = TIMESTAMPADD(MICROSECOND, ?, {MY_NOW}) \
                     WHERE name = ? AND locked_by = ? AND lock_until > {MY_NOW}"
                );
                (sql, vec![V::Int(us(at_most)), V::Text(name), V::Text(by)])
            }
            Conn::Lite(_) => {
                let now = now_ms();
                let sql = format!(
                    "UPDATE {t} SET lock_until = ? WHERE name = ? AND locked_by = ? AND lock_until > ?"
                );
                let until = now + ms(at_most);
                (
                    sql,
                    vec![V::Int(until), V::Text(name), V::Text(by), V::Int(now)],
                )
            }
        };
        self.conn.execute(sql, &binds).await.unwrap()
    }

    /// ShedLock's unlock: `lock_until = max(now, locked_at + at_least)`
    /// where its own (the row stays): rows affected.
    pub async fn unlock(&mut self, name: &str, at_least: Duration) -> u64 {
        let t = &self.table;
        let by = self.locked_by.as_str();
        let (sql, binds) = match self.conn {
            Conn::Pg(_) => {
                let least = "locked_at + make_interval(secs => $2)";
                let sql = format!(
                    "UPDATE {t} SET lock_until = CASE WHEN {least} > {PG_NOW} THEN {least} ELSE {PG_NOW} END \
                     WHERE name = $1 AND locked_by = $3"
                );
                (sql, vec![V::Text(name), V::Secs(at_least), V::Text(by)])
            }
            Conn::My(_) => {
                let least = "TIMESTAMPADD(MICROSECOND, ?, locked_at)";
                let sql = format!(
                    "UPDATE {t} SET lock_until = IF ({least} > {MY_NOW} , {least}, {MY_NOW}) \
                     WHERE name = ? AND locked_by = ?"
                );
                let least = V::Int(us(at_least));
                (sql, vec![least, least, V::Text(name), V::Text(by)])
            }
            Conn::Lite(_) => {
                let unlock_time = (self.locked_at_ms + ms(at_least)).max(now_ms());
                let sql = format!("UPDATE {t} SET lock_until = ? WHERE name = ? AND locked_by = ?");
                (sql, vec![V::Int(unlock_time), V::Text(name), V::Text(by)])
            }
        };
        self.conn.execute(sql, &binds).await.unwrap()
    }

    /// The row of `name` as it is: (`locked_by`, whether `lock_until` has
    /// passed on the database's clock); `None` without a row.
    pub async fn row(&mut self, name: &str) -> Option<(String, bool)> {
        let t = &self.table;
        match &mut self.conn {
            Conn::Pg(c) => {
                let sql = format!(
                    "SELECT locked_by, CAST(CASE WHEN lock_until <= {PG_NOW} THEN 1 ELSE 0 END AS BIGINT) \
                     FROM {t} WHERE name = $1"
                );
                sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(sql))
                    .bind(name)
                    .fetch_optional(c)
                    .await
            }
            Conn::My(c) => {
                let sql = format!(
                    "SELECT locked_by, CAST(lock_until <= {MY_NOW} AS SIGNED) FROM {t} WHERE name = ?"
                );
                sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(sql))
                    .bind(name)
                    .fetch_optional(c)
                    .await
            }
            Conn::Lite(c) => {
                let sql = format!("SELECT locked_by, lock_until <= ? FROM {t} WHERE name = ?");
                sqlx::query_as::<_, (String, i64)>(AssertSqlSafe(sql))
                    .bind(now_ms())
                    .bind(name)
                    .fetch_optional(c)
                    .await
            }
        }
        .unwrap()
        .map(|(by, expired)| (by, expired != 0))
    }

    /// Deletes the row of `name`, as an operator clearing a stuck lock.
    pub async fn delete(&mut self, name: &str) {
        let t = &self.table;
        let mark = if matches!(self.conn, Conn::Pg(_)) {
            "$1"
        } else {
            "?"
        };
        let sql = format!("DELETE FROM {t} WHERE name = {mark}");
        let done = self.conn.execute(sql, &[V::Text(name)]).await;
        assert_eq!(done.unwrap(), 1, "one row of {name}");
    }

    /// How many rows `name` has (ShedLock keeps exactly one).
    pub async fn rows(&mut self, name: &str) -> i64 {
        let t = &self.table;
        let sql = AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {t} WHERE name = {}",
            match self.conn {
                Conn::Pg(_) => "$1",
                _ => "?",
            }
        ));
        match &mut self.conn {
            Conn::Pg(c) => sqlx::query_scalar(sql).bind(name).fetch_one(c).await,
            Conn::My(c) => sqlx::query_scalar(sql).bind(name).fetch_one(c).await,
            Conn::Lite(c) => sqlx::query_scalar(sql).bind(name).fetch_one(c).await,
        }
        .unwrap()
    }
}
