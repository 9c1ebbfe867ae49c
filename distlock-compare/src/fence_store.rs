//! The soak's real fenced store: every write of the soak's workers also
//! goes, with the holder's token, to a store fenced by a `lock-fence`
//! adapter (a SQLite table, or a redis-server of its own), outside every
//! fault the soak injects, so that "no stale write accepted" is observed at
//! a real store and the negative controls read "lock double-granted,
//! resource refused".

use std::sync::Arc;

use async_trait::async_trait;
use conformance::fencing::{FenceOutcome, FencedResource};
use conformance::soak::FenceStore;
use lock_core::FencingToken;
use lock_fence::sql::SqlFence;
use lock_fence::sqlx::{self, SqlitePool};
use lock_fence::{FenceError, sqlx::sqlite::SqliteConnectOptions};

/// Which adapter the soak writes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kind {
    /// The SQL adapter on a SQLite file.
    Sqlite,
    /// The Redis adapter on a redis-server started for the run.
    Redis,
}

/// A fresh store of `kind`.
///
/// # Errors
///
/// It cannot be made (no redis-server, ...).
pub(crate) async fn start(kind: Kind) -> Result<FenceStore, String> {
    match kind {
        Kind::Sqlite => sqlite().await,
        Kind::Redis => redis().await,
    }
}

struct RedisFenced {
    fence: lock_fence::redis::RedisFence<redis::aio::MultiplexedConnection>,
    conn: redis::aio::MultiplexedConnection,
    _server: conformance::servers::redis::RedisServer,
}

async fn redis() -> Result<FenceStore, String> {
    let server = conformance::servers::redis::RedisServer::start()
        .await
        .map_err(|e| e.to_string())?;
    let client = redis::Client::open(server.url()).map_err(|e| e.to_string())?;
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    Ok(FenceStore(Arc::new(RedisFenced {
        fence: lock_fence::redis::RedisFence::new(conn.clone()),
        conn,
        _server: server,
    })))
}

#[async_trait]
impl FencedResource for RedisFenced {
    fn name(&self) -> String {
        "lock-fence Redis adapter on redis-server".to_owned()
    }

    async fn write(&self, resource: &str, token: u64, value: &str) -> Result<FenceOutcome, String> {
        match self
            .fence
            .set(resource, value, FencingToken::new(token))
            .await
        {
            Ok(()) => Ok(FenceOutcome::Accepted),
            Err(FenceError::Stale { current, .. }) => Ok(FenceOutcome::Refused { current }),
            Err(other) => Err(other.to_string()),
        }
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        let mut conn = self.conn.clone();
        redis::cmd("GET")
            .arg(resource)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }
}

struct SqliteFenced {
    pool: SqlitePool,
    fence: SqlFence,
    _dir: tempfile::TempDir,
}

/// A fresh SQLite store in a temporary directory (removed with the store).
async fn sqlite() -> Result<FenceStore, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("fenced.db"))
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(options)
        .await
        .map_err(|e| e.to_string())?;
    sqlx::query("CREATE TABLE data (resource TEXT PRIMARY KEY, value TEXT)")
        .execute(&pool)
        .await
        .map_err(|e| e.to_string())?;
    let fence = SqlFence::new();
    let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
    fence
        .create_table(&mut *conn)
        .await
        .map_err(|e| e.to_string())?;
    drop(conn);
    Ok(FenceStore(Arc::new(SqliteFenced {
        pool,
        fence,
        _dir: dir,
    })))
}

#[async_trait]
impl FencedResource for SqliteFenced {
    fn name(&self) -> String {
        "lock-fence SQL adapter on SQLite".to_owned()
    }

    async fn write(&self, resource: &str, token: u64, value: &str) -> Result<FenceOutcome, String> {
        let mut tx = match self
            .fence
            .begin(&self.pool, resource, FencingToken::new(token))
            .await
        {
            Ok(tx) => tx,
            Err(FenceError::Stale { current, .. }) => return Ok(FenceOutcome::Refused { current }),
            Err(other) => return Err(other.to_string()),
        };
        sqlx::query(
            "INSERT INTO data (resource, value) VALUES (?1, ?2) \
             ON CONFLICT (resource) DO UPDATE SET value = excluded.value",
        )
        .bind(resource)
        .bind(value)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(FenceOutcome::Accepted)
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        sqlx::query_scalar("SELECT value FROM data WHERE resource = ?1")
            .bind(resource)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| e.to_string())
    }
}
