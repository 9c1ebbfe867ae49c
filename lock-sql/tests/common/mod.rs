//! Targets for the shared conformance suite: real PostgreSQL and MariaDB
//! servers started by the harness, and SQLite files.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use conformance::HarnessError;
use conformance::Target;
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use lock_core::{LockBackend, LockError, async_trait};
use lock_sql::SqlBackend;
use lock_sql::sqlx::{self, Connection};

/// Options every test client uses: short operation timeouts so a paused
/// server shows up quickly as a timeout.
pub const CLIENT_OPTIONS: &str = "timeout=1s&pool_size=4";

/// Appends `options` to `url`.
pub fn with_options(url: &str, options: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{options}")
}

/// A PostgreSQL server; unreachable = SIGSTOP of its process group.
pub struct PgTarget {
    pub server: Mutex<PostgresServer>,
    pub url: String,
}

impl PgTarget {
    pub async fn start() -> Result<Self, HarnessError> {
        let server = PostgresServer::start().await?;
        let url = with_options(&server.url(), CLIENT_OPTIONS);
        Ok(Self {
            server: Mutex::new(server),
            url,
        })
    }
}

#[async_trait]
impl Target for PgTarget {
    fn name(&self) -> String {
        "postgres".into()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(SqlBackend::connect_url(&self.url).await?))
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        self.server.lock().unwrap().process().pause()?;
        Ok(true)
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        let mut server = self.server.lock().unwrap();
        if server.process().is_paused() {
            server.process().resume()?;
        }
        Ok(())
    }
}

/// A MariaDB server; unreachable = SIGSTOP of its process.
pub struct MariaTarget {
    pub server: Mutex<MariaDbServer>,
    pub url: String,
}

impl MariaTarget {
    pub async fn start() -> Result<Self, HarnessError> {
        let server = MariaDbServer::start().await?;
        let url = with_options(&server.url(), CLIENT_OPTIONS);
        Ok(Self {
            server: Mutex::new(server),
            url,
        })
    }
}

#[async_trait]
impl Target for MariaTarget {
    fn name(&self) -> String {
        "mariadb".into()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(SqlBackend::connect_url(&self.url).await?))
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        self.server.lock().unwrap().process().pause()?;
        Ok(true)
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        let mut server = self.server.lock().unwrap();
        if server.process().is_paused() {
            server.process().resume()?;
        }
        Ok(())
    }
}

/// A SQLite file. SQLite has no server to pause: "unreachable" is another
/// connection holding the file's exclusive write lock (`BEGIN EXCLUSIVE`),
/// which stalls every writer, in every process, until the busy timeout.
pub struct SqliteTarget {
    pub dir: tempfile::TempDir,
    pub path: PathBuf,
    pub url: String,
    blocker: tokio::sync::Mutex<Option<sqlx::SqliteConnection>>,
}

impl SqliteTarget {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("locks.db");
        let url = format!(
            "sqlite://{}?{CLIENT_OPTIONS}&busy_timeout=800ms",
            path.display()
        );
        Self {
            dir,
            path,
            url,
            blocker: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait]
impl Target for SqliteTarget {
    fn name(&self) -> String {
        "sqlite".into()
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(SqlBackend::connect_url(&self.url).await?))
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        let url = format!("sqlite://{}", self.path.display());
        let mut conn = sqlx::SqliteConnection::connect(&url)
            .await
            .map_err(|e| HarnessError::Io(std::io::Error::other(e)))?;
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut conn)
            .await
            .map_err(|e| HarnessError::Io(std::io::Error::other(e)))?;
        *self.blocker.lock().await = Some(conn);
        Ok(true)
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        if let Some(mut conn) = self.blocker.lock().await.take() {
            let _ = sqlx::query("ROLLBACK").execute(&mut conn).await;
            let _ = conn.close().await;
        }
        Ok(())
    }
}
