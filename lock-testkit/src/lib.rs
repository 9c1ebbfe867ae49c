//! The distlock family's test kit: real servers on loopback and the faults
//! tests inject into them.
//!
//! - [`process`]: server processes found on PATH, started on free loopback
//!   ports in temporary directories, paused, killed, restarted, stopped on
//!   drop; a missing binary is an error naming its Debian package
//!   ([`HarnessError`]), a skip outside CI ([`OrSkip`]).
//! - [`servers`]: a spawner per server (redis-server, etcd, ZooKeeper,
//!   PostgreSQL, MariaDB), including clusters, ensembles and TLS setups.
//! - [`deploy`]: started servers behind one trait, [`Deployment`](deploy::Deployment)
//!   (URL, pause, resume, kill and restart, failover, losing nodes,
//!   partitioning members), and the table of kinds [`deploy::KINDS`].
//! - [`proxy`]: a TCP fault proxy (latency, partitions, blackholes, resets)
//!   that also counts round trips; [`link`] gives in-process backends the
//!   same faults.
//! - [`netns`]: real partitions in the kernel (network namespaces, veth
//!   pairs on loopback-range addresses, a blackhole of traffic-control
//!   queues), where TCP sees what a network failure does.
//!
//! The suite itself (cases, scenarios, the checker) lives in the
//! `conformance` crate, which re-exports these modules.

#![deny(missing_docs)]

pub mod deploy;
mod faults;
pub mod link;
pub mod netns;
mod netns_thread;
pub mod process;
pub mod proxy;
pub mod servers;

pub use process::{HarnessError, OrSkip};
