//! The resource side of fencing: stores that accept a write only when its
//! fencing token is not below the last token they accepted for that
//! resource, so that a holder paused past its lease (GC, a frozen VM, a
//! partition) cannot overwrite what the next holder wrote.
//!
//! A lock's [`FencingToken`] protects nothing until the resource checks it.
//! Each adapter here keeps the last accepted token beside the data, checks
//! and advances it in the same atomic step as the write, and answers a
//! stale write with [`FenceError::Stale`] (carrying the current token),
//! never with a silent "0 rows":
//!
//! | adapter | where the token lives | atomic with the write by |
//! |---|---|---|
//! | [`sql::SqlFence`] (PostgreSQL, MySQL/MariaDB, SQLite) | a `fences(resource, token)` table | the caller's transaction (row lock until commit) |
//! | [`redis::RedisFence`] | `{key}:fence`, same Cluster slot | one script |
//! | [`http::FencingLayer`] | the service, per resource | a per-resource lock around the handler |
//! | [`file`](mod@file) | `<file>.fence` beside the file | `flock` on the token file, then an atomic rename |
//!
//! The rule, the same everywhere: a token **below** the last accepted one
//! is refused; an **equal** token is accepted (the same grant writing
//! again); a higher one is accepted and becomes the last. The conformance
//! cases (`conformance::fencing`) hold every adapter to it.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use lock_fence::sql::SqlFence;
//!
//! let locks = distlock::connect("memory://").await?;
//! let db = lock_fence::sqlx::SqlitePool::connect("sqlite::memory:").await?;
//! let fence = SqlFence::new();
//! fence.create_table(&mut *db.acquire().await?).await?;
//!
//! let guard = locks.lock("balance").ttl(Duration::from_secs(30)).acquire().await?;
//! let mut tx = fence.begin(&db, "balance", guard.token()).await?; // refused if stale
//! lock_fence::sqlx::query("UPDATE balance SET amount = amount + 1").execute(&mut *tx).await?;
//! tx.commit().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod error;
pub mod file;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sql")]
pub mod sql;

pub use error::FenceError;
pub use lock_core::FencingToken;

#[cfg(feature = "redis")]
pub use ::redis as redis_crate;
#[cfg(feature = "sql")]
pub use ::sqlx;
