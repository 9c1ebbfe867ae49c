//! This driver's entry in the family ([`lock_core::driver`]).

use lock_core::LockError;
use lock_core::driver::{BoxFuture, Driver};
use lock_core::floor::RawFloor;

use crate::floor::SqlFloor;
use crate::{SessionFloor, SqlConfig, SqlLayout, SqlMode};

/// The SQL driver: PostgreSQL, MySQL/MariaDB and SQLite, row or session mode.
pub static DRIVER: Driver = Driver {
    name: "sql",
    schemes: &["postgres", "postgresql", "mysql", "mariadb", "sqlite"],
    default_ports: &[
        ("postgres", 5432),
        ("postgresql", 5432),
        ("mysql", 3306),
        ("mariadb", 3306),
    ],
    summary: "postgres://, mysql://, mariadb://, sqlite://path or sqlite::memory: (?mode=session for server-session locks, ?fair=true for FIFO waiting)",
    connect,
    floor: Some(floor),
    permit_floor: Some(permit_floor),
    capabilities: None,
    // FIFO mutex waiting in row mode (session mode refuses it at connect).
    fair_option: Some("fair=true"),
};

lock_core::connect_fn!(fn connect = crate::connect);

/// One permit of a semaphore of 4, in row mode (session mode has no
/// semaphores: `Unsupported` before connecting).
async fn one_of_four(url: &str) -> Result<crate::floor::SqlPermitFloor, LockError> {
    crate::floor::SqlPermitFloor::connect(url, 1, 4).await
}

lock_core::floor_fn!(fn permit_floor = one_of_four);

fn floor(url: &str) -> BoxFuture<'_, Result<Option<Box<dyn RawFloor>>, LockError>> {
    Box::pin(async move {
        let config = SqlConfig::from_url(url)?;
        if config.layout == SqlLayout::ShedLock {
            // No floor: see `SqlFloor::connect` (benchmarks then show none,
            // as for a driver without one, instead of failing the row).
            return Ok(None);
        }
        let floor: Box<dyn RawFloor> = match config.lock_mode() {
            SqlMode::Session => Box::new(SessionFloor::connect(url).await?),
            _ => Box::new(SqlFloor::connect(url).await?),
        };
        Ok(Some(floor))
    })
}
