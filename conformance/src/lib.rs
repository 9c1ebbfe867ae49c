//! The shared conformance suite of the distlock family.
//!
//! - [`harness`]: the [`Target`] a driver implements in its tests, the
//!   [`Harness`] cases run against, and [`MemoryTarget`].
//! - [`cases`]: the cases, public async functions selected by capabilities;
//!   [`run_suite`] runs them all and returns a [`SuiteReport`].
//! - [`history`]: the invoke/ok/fail/info recorder, the checker (overlapping
//!   promised windows, token regressions, stale fenced writes) and a
//!   [`FencedResource`](history::FencedResource).
//! - [`recording`]: a backend wrapper and a guard that record every
//!   acquire, renewal, release and lost signal of a client into a history.
//! - [`doubles`]: deliberately broken backends for the tests that show a
//!   check failing.
//! - [`link`]: the fault proxy's faults for in-process backends (from
//!   `lock-testkit`).
//! - [`migration`]: the rollout simulation for migrating between backends.
//! - [`legacy`]: other libraries' lock clients as processes, and the
//!   rollout from a fleet of them.
//! - [`mod@bench`]: latency and throughput measurements for ratio benchmarks;
//!   [`cpu`]: CPU time of this process and of a server's process tree.
//! - [`scenarios`]: fault scenarios (crashed, paused, partitioned holders,
//!   restarted servers, injected latency, lost replies, cancellation storms)
//!   with negative controls.
//! - [`soak`]: a randomized fault soak (a seeded nemesis, clients updating
//!   a fenced counter, the checker over the whole run, counts per fault).
//! - [`proxy`]: an in-process TCP proxy that injects latency, partitions,
//!   blackholes and resets, and counts round trips.
//! - [`process`], [`servers`] and [`deploy`]: real servers on loopback,
//!   started from binaries on PATH in temporary directories, with pause /
//!   kill / restart, behind one `Deployment` trait; [`deploy::DeployedTarget`]
//!   makes any of them a suite [`Target`]. These come from the
//!   `lock-testkit` crate and are re-exported here.
//!
//! A driver's test runs the whole suite against a real server:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # async fn demo() {
//! use conformance::{Harness, MemoryTarget, run_suite};
//! let harness = Harness::new(Arc::new(MemoryTarget::new()));
//! run_suite(&harness).await.assert_passed();
//! # }
//! ```

#![deny(missing_docs)]

pub mod bench;
pub mod cases;
pub mod cpu;
pub mod deploy;
pub mod doubles;
pub mod fencing;
pub mod floor;
pub mod harness;
pub mod history;
pub mod legacy;
pub mod migration;
pub mod recording;
pub mod resource;
pub mod scale;
pub mod scenarios;
pub mod soak;
pub mod suite;

pub use harness::{Harness, MemoryTarget, SuiteConfig, Target, UrlTarget};
pub use lock_testkit::{HarnessError, OrSkip, link, netns, process, proxy, servers};
pub use suite::{Case, CaseReport, SuiteReport, all_cases, run_cases, run_suite, short_cases};
