//! Session-mode targets (`?mode=session`) on real PostgreSQL and MariaDB
//! servers started by the harness, and the session-mode scenarios both
//! test files run.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this

use std::net::SocketAddr;
use std::sync::Arc;

use conformance::proxy::FaultProxy;
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use conformance::{HarnessError, Target};
use lock_core::{LockBackend, LockError, async_trait};
use lock_sql::SqlSessionBackend;

/// Short operation timeouts so a cut-off session shows up quickly.
pub const CLIENT_OPTIONS: &str = "mode=session&timeout=1s&pool_size=4";

/// The server behind a session target.
pub enum Server {
    /// PostgreSQL 15.
    Pg(tokio::sync::Mutex<PostgresServer>),
    /// MariaDB 10.11.
    Maria(tokio::sync::Mutex<MariaDbServer>),
}

/// A server used in session mode; unreachable = SIGSTOP of the server, a
/// proxied client goes through a [`FaultProxy`].
pub struct SessionTarget {
    pub server: Server,
    /// Direct URL with [`CLIENT_OPTIONS`].
    pub url: String,
    port: u16,
}

impl SessionTarget {
    pub async fn postgres() -> Result<Self, HarnessError> {
        let server = PostgresServer::start().await?;
        let port = server.port();
        let url = with_options(&server.url(), CLIENT_OPTIONS);
        Ok(Self {
            server: Server::Pg(tokio::sync::Mutex::new(server)),
            url,
            port,
        })
    }

    pub async fn mariadb() -> Result<Self, HarnessError> {
        let server = MariaDbServer::start().await?;
        let port = server.port();
        let url = with_options(&server.url(), CLIENT_OPTIONS);
        Ok(Self {
            server: Server::Maria(tokio::sync::Mutex::new(server)),
            url,
            port,
        })
    }

    /// The server's address (for a proxy in front of it).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `url` pointed at `port` instead of the server's.
    pub fn url_via(&self, url: &str, port: u16) -> String {
        url.replacen(&format!(":{}/", self.port), &format!(":{port}/"), 1)
    }

    /// A proxy in front of the server and `url` (with `options` added)
    /// pointed at it.
    pub async fn proxy(&self, options: &str) -> (FaultProxy, String) {
        let proxy = FaultProxy::start(self.addr()).await.expect("proxy");
        let url = self.url_via(&with_options(&self.url, options), proxy.port());
        (proxy, url)
    }
}

/// Appends `options` to `url`.
pub fn with_options(url: &str, options: &str) -> String {
    if options.is_empty() {
        return url.to_owned();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{options}")
}

#[async_trait]
impl Target for SessionTarget {
    fn name(&self) -> String {
        match self.server {
            Server::Pg(_) => "postgres-session".into(),
            Server::Maria(_) => "mariadb-session".into(),
        }
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(SqlSessionBackend::connect_url(&self.url).await?))
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        match &self.server {
            Server::Pg(s) => s.lock().await.pause()?,
            Server::Maria(s) => s.lock().await.process().pause()?,
        }
        Ok(true)
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        match &self.server {
            Server::Pg(s) => {
                let mut s = s.lock().await;
                if s.is_paused() {
                    s.resume()?;
                }
            }
            Server::Maria(s) => {
                let mut s = s.lock().await;
                if s.process().is_paused() {
                    s.process().resume()?;
                }
            }
        }
        Ok(())
    }

    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        let (proxy, url) = self.proxy("").await;
        let client = SqlSessionBackend::connect_url(&url)
            .await
            .map_err(|e| HarnessError::Io(std::io::Error::other(e)))?;
        Ok(Some((Arc::new(client), proxy)))
    }
}
