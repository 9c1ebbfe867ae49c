//! Counting round trips through the fault proxy (round_trips.rs,
//! shared_round_trips.rs): a database's URL through the proxy, the count
//! per cycle, and a floor with one extra statement per grant that the
//! count must see.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this

use std::net::SocketAddr;
use std::time::Duration;

use conformance::floor::{FloorGrant, RawFloor};
use conformance::proxy::{CyclePlan, FaultProxy};
use lock_core::LockError;
use lock_sql::sqlx::{self, Connection};

/// The options the proxied clients add to a server's URL.
const OPTIONS: &str = "timeout=2s";

/// A proxy in front of the server on `port`.
pub async fn proxy_to(port: u16) -> FaultProxy {
    FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port)))
        .await
        .expect("proxy")
}

/// `url` with its server's port replaced by the proxy's.
pub fn through(url: &str, server_port: u16, proxy: &FaultProxy) -> String {
    let url = url.replace(
        &format!("127.0.0.1:{server_port}/"),
        &format!("127.0.0.1:{}/", proxy.port()),
    );
    super::common::with_options(&url, OPTIONS)
}

/// Round trips per cycle through `proxy`, rounded to the nearest whole
/// number, over `cycles` cycles after `warm_up` ones.
pub async fn per_cycle(
    proxy: &FaultProxy,
    warm_up: usize,
    cycles: u64,
    cycle: impl AsyncFnMut(),
) -> u64 {
    proxy
        .count_cycles(CyclePlan::new(warm_up, cycles), cycle)
        .await
        .rounded()
}

/// A bare connection of its own through the proxy, for the extra
/// statement.
pub enum Extra {
    Pg(sqlx::PgConnection),
    My(sqlx::MySqlConnection),
}

impl Extra {
    /// A PostgreSQL connection to proxied `url` (from [`through`]).
    pub async fn postgres(url: &str) -> Self {
        Self::Pg(sqlx::PgConnection::connect(&bare(url)).await.unwrap())
    }

    /// A MySQL/MariaDB connection to proxied `url` (from [`through`]).
    pub async fn mariadb(url: &str) -> Self {
        Self::My(sqlx::MySqlConnection::connect(&bare(url)).await.unwrap())
    }
}

/// A proxied URL without the driver's options (sqlx's own URL).
fn bare(url: &str) -> String {
    url.replace(&format!("?{OPTIONS}"), "")
}

/// `floor` plus one `SELECT 1` per grant on a connection of its own
/// through the same proxy: one extra round trip per cycle, which the count
/// must see.
pub struct ExtraStatement<F> {
    floor: F,
    extra: tokio::sync::Mutex<Extra>,
}

impl<F> ExtraStatement<F> {
    pub fn new(floor: F, extra: Extra) -> Self {
        Self {
            floor,
            extra: tokio::sync::Mutex::new(extra),
        }
    }
}

#[lock_core::async_trait]
impl<F: RawFloor> RawFloor for ExtraStatement<F> {
    fn name(&self) -> &'static str {
        self.floor.name()
    }
    fn round_trips_per_cycle(&self) -> u32 {
        self.floor.round_trips_per_cycle()
    }
    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        match &mut *self.extra.lock().await {
            Extra::Pg(c) => sqlx::query("SELECT 1").execute(c).await.map(drop),
            Extra::My(c) => sqlx::query("SELECT 1").execute(c).await.map(drop),
        }
        .expect("extra statement");
        self.floor.try_grant(key, ttl).await
    }
    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        self.floor.release(grant).await
    }
}
