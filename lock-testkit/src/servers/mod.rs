//! Spawners for each real server the drivers are tested against. Each
//! starts its server on free loopback ports in a temporary directory and
//! stops it on drop; a missing binary is [`HarnessError::MissingBinary`]
//! naming the Debian package.
//!
//! [`HarnessError::MissingBinary`]: crate::process::HarnessError::MissingBinary

pub mod etcd;
pub mod mariadb;
pub mod postgres;
pub mod redis;
pub mod zookeeper;
