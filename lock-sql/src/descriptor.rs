//! This driver's entry in the family ([`lock_core::driver`]).

use lock_core::driver::Driver;

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
    capabilities: None,
};

lock_core::connect_fn!(fn connect = crate::open);
