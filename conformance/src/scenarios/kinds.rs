//! The fault scenarios for read-write locks and semaphores: the same
//! scenarios, run with the write side of a read-write lock, or a semaphore
//! of one permit, in the mutex's place.
//!
//! [`AsKind`] serves a backend's grants of one kind through the mutex's
//! calls (a mutex grant takes a write lease, the mutex's holders are the
//! first holder of that shape), so every scenario, its observers and its
//! history checker run unchanged; the holder process takes the same kind with
//! `distlock run --write` / `--semaphore 1` (see [`for_kind`]).

use std::sync::Arc;

use async_trait::async_trait;
use lock_core::{
    Capabilities, GrantRequest, HolderInfo, Lease, LeaseKind, LockBackend, LockError, LockInfo,
    LockKey, LockShape, LockWrapper,
};

use super::{HolderCommand, ScenarioEnv};
use crate::harness::Target;
use crate::process::HarnessError;
use crate::proxy::FaultProxy;

/// A backend whose mutex grants are grants of `kind` instead.
#[derive(Debug)]
pub struct AsKind {
    inner: Arc<dyn LockBackend>,
    kind: LeaseKind,
}

impl AsKind {
    /// `inner`'s grants of `kind` behind the mutex's methods.
    pub fn new(inner: Arc<dyn LockBackend>, kind: LeaseKind) -> Self {
        Self { inner, kind }
    }
}

#[async_trait]
impl LockWrapper for AsKind {
    fn inner(&self) -> &dyn LockBackend {
        &*self.inner
    }

    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let kind = match request.kind {
            LeaseKind::Exclusive => self.kind,
            other => other,
        };
        self.inner.grant(request.kind(kind)).await
    }

    /// The mutex's holder is the first holder of `kind`'s shape.
    async fn holders(&self, key: &LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError> {
        if shape != LockShape::Mutex {
            return self.inner.holders(key, shape).await;
        }
        let holders = self.inner.holders(key, self.kind.shape()).await?;
        Ok(lock_core::kind::mutex_holders(
            holders.into_iter().next().map(|h| LockInfo {
                details: None,
                key: key.clone(),
                holder: h.holder,
                token: h.token,
                remaining_ttl: h.remaining_ttl,
            }),
        ))
    }
}

/// A target whose clients are [`AsKind`] over the inner target's.
struct KindTarget {
    inner: Arc<dyn Target>,
    kind: LeaseKind,
}

#[async_trait]
impl Target for KindTarget {
    fn name(&self) -> String {
        format!("{} ({})", self.inner.name(), self.kind)
    }

    async fn client(&self) -> Result<Arc<dyn LockBackend>, LockError> {
        Ok(Arc::new(AsKind::new(self.inner.client().await?, self.kind)))
    }

    async fn make_unreachable(&self) -> Result<bool, HarnessError> {
        self.inner.make_unreachable().await
    }

    async fn heal(&self) -> Result<(), HarnessError> {
        self.inner.heal().await
    }

    fn url(&self) -> Option<String> {
        self.inner.url()
    }

    async fn kill_and_restart_server(&self) -> Result<bool, HarnessError> {
        self.inner.kill_and_restart_server().await
    }

    async fn proxied_client(
        &self,
    ) -> Result<Option<(Arc<dyn LockBackend>, FaultProxy)>, HarnessError> {
        Ok(self.inner.proxied_client().await?.map(|(client, proxy)| {
            (
                Arc::new(AsKind::new(client, self.kind)) as Arc<dyn LockBackend>,
                proxy,
            )
        }))
    }

    async fn hold_replication(&self) -> Result<bool, HarnessError> {
        self.inner.hold_replication().await
    }

    async fn fail_over(&self) -> Result<bool, HarnessError> {
        self.inner.fail_over().await
    }

    fn cluster_size(&self) -> Option<usize> {
        self.inner.cluster_size()
    }

    async fn stop_nodes(&self, n: usize) -> Result<Option<usize>, HarnessError> {
        self.inner.stop_nodes(n).await
    }

    async fn restart_nodes(&self) -> Result<(), HarnessError> {
        self.inner.restart_nodes().await
    }
}

/// The scenarios a kind runs: those around one holder and the server.
pub const KIND_SCENARIOS: &[&str] = &[
    "holder_killed",
    "holder_paused",
    "client_partitioned",
    "server_restarted",
];

/// The kinds the fault scenarios run with, where the backend has them: the
/// write side of a read-write lock, and a semaphore of one permit.
pub fn scenario_kinds(caps: &Capabilities) -> Vec<LeaseKind> {
    let mut kinds = Vec::new();
    if caps.shared_locks {
        kinds.push(LeaseKind::Write);
    }
    if caps.semaphores {
        kinds.push(LeaseKind::Permits { count: 1, limit: 1 });
    }
    kinds
}

/// The `distlock run` flags that take `kind`.
pub fn run_flags(kind: LeaseKind) -> Vec<String> {
    match kind {
        LeaseKind::Read => vec!["--shared".into()],
        LeaseKind::Write => vec!["--write".into()],
        LeaseKind::Permits { count, limit } => vec![
            "--semaphore".into(),
            limit.to_string(),
            "--permits".into(),
            count.to_string(),
        ],
        _ => Vec::new(),
    }
}

/// `env` with grants of `kind` in the mutex's place, and `holder` (a
/// holder command taking the same kind, e.g. from
/// [`distlock_run_holder_kind`](super::distlock_run_holder_kind)).
pub fn for_kind(env: &ScenarioEnv, kind: LeaseKind, holder: Option<HolderCommand>) -> ScenarioEnv {
    ScenarioEnv {
        target: Arc::new(KindTarget {
            inner: env.target.clone(),
            kind,
        }),
        holder,
        quick: env.quick,
        ttl: env.ttl,
    }
}
