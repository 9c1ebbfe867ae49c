//! The NATS targets of the shared suite (deployments from
//! `conformance::deploy`, opened through the facade).

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;

use conformance::OrSkip;
use conformance::deploy::{self, DeployedTarget, Opener};
use lock_core::{LockKey, OwnerId};

/// A key of its own for each run: `name` and a random suffix.
pub fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}-{}", &OwnerId::random().to_hex()[..8])).expect("key")
}

/// Opens URLs through the facade, where this driver is registered.
pub fn opener() -> Opener {
    Arc::new(|url: String| Box::pin(async move { distlock::backend::open(&url).await }))
}

/// A started deployment of `kind` (`nats`, `nats-cluster`) as a target;
/// `None` (a printed skip) when `nats-server` is missing outside CI.
pub async fn deployed(kind: &str) -> Option<DeployedTarget> {
    let deployment = deploy::start(kind).await.or_skip()?;
    Some(DeployedTarget::new(deployment, opener()))
}
