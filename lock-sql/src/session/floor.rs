//! The raw floor of session mode: the same grant statement and release as
//! [`SqlSessionBackend`](crate::SqlSessionBackend), by hand on one bare
//! connection.
//!
//! [`SessionFloor::try_grant`] is one round trip (`pg_try_advisory_lock` +
//! `nextval` in one `SELECT` / `INSERT .. SELECT .. WHERE GET_LOCK(?, 0)`),
//! [`SessionFloor::release`] one (`pg_advisory_unlock` / `RELEASE_LOCK`):
//! 2 round trips per cycle. Unlike the backend, the floor never arms the
//! MySQL/MariaDB session's `wait_timeout` (one more statement whenever the
//! TTL's whole seconds change): its session lives only as long as a
//! benchmark.
//!
//! The connection is opened with the backend's connect options (the same
//! session settings); the statements are issued here by hand on it, not
//! through the backend's session code.

use std::time::Duration;

use async_trait::async_trait;
use lock_core::floor::{FloorGrant, RawFloor};
use lock_core::{LockError, LockKey, Operation, OwnerId, check_ttl};
use tokio::sync::Mutex;

use super::conn::{Granted, Opts, ServerKey, Session};
use super::sql::SessionSql;
use crate::config::SqlConfig;
use crate::error::map_sqlx;

/// One bare session issuing the session-mode grant and release.
#[derive(Debug)]
pub struct SessionFloor {
    name: &'static str,
    config: SqlConfig,
    sql: SessionSql,
    session: Mutex<Session>,
}

impl SessionFloor {
    /// Opens one connection to `url` (same syntax as [`crate::connect`];
    /// `mode` is ignored) and creates the token sequence or table if
    /// missing.
    ///
    /// # Errors
    ///
    /// As [`SqlSessionBackend::connect`](crate::SqlSessionBackend::connect).
    ///
    /// # Cancel safety
    ///
    /// Safe: dropping the future closes the connection.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = SqlConfig::from_url(url)?;
        let opts = Opts::new(&config)?;
        let name = opts.dialect.session_name();
        let sql = SessionSql::new(opts.dialect, &config.table);
        let mut session = lock_core::with_timeout(config.op_timeout, Operation::Connect, async {
            Session::open(&opts, &sql)
                .await
                .map_err(|e| map_sqlx(&config, Operation::Connect, e))
        })
        .await?;
        session
            .prepare_schema(&sql, config.create_table)
            .await
            .map_err(|e| map_sqlx(&config, Operation::Connect, e))?;
        Ok(Self {
            name,
            config,
            sql,
            session: Mutex::new(session),
        })
    }
}

#[async_trait]
impl RawFloor for SessionFloor {
    fn name(&self) -> &'static str {
        self.name
    }

    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let key = LockKey::new(key)?;
        let min = self.session.lock().await.dialect.session_min_ttl();
        check_ttl(ttl, min, Operation::TryAcquire)?;
        let owner = OwnerId::random().to_hex();
        let server_key = ServerKey::new(&self.config.table, key.as_str());
        let mut session = self.session.lock().await;
        let err = |e| map_sqlx(&self.config, Operation::TryAcquire, e).with_backend(self.name);
        // The grant statement by hand (the backend's text and binds, without
        // arming the idle timeout): one round trip, the token in its answer.
        let session = &mut *session;
        let granted = session
            .dialect
            .session_grant(
                &mut session.conn,
                &self.sql,
                key.as_str().as_bytes(),
                &server_key,
                &owner,
                ttl,
                None,
            )
            .await
            .map_err(err)?;
        let token = match granted {
            Granted::Token(token) => Some(token),
            Granted::Held => None,
        };
        Ok(token.map(|token| FloorGrant {
            key: key.as_str().to_owned(),
            owner,
            token,
            handle: String::new(),
        }))
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let server_key = ServerKey::new(&self.config.table, &grant.key);
        let mut session = self.session.lock().await;
        let err = |e| map_sqlx(&self.config, Operation::Release, e).with_backend(self.name);
        let session = &mut *session;
        session
            .dialect
            .session_release(&mut session.conn, &self.sql, &server_key)
            .await
            .map_err(err)
    }
}
