//! Each check of `shared_checks` fails on the broken variant of the real
//! SQLite backend made for it: shifted read tokens, a detached wait. (The
//! suite's shared cases have their own broken doubles in `conformance`.)

mod common;
mod shared_checks;

use std::sync::Arc;
use std::time::Duration;

use lock_core::{
    Downgrade, Facets, FencingToken, GrantRequest, Lease, LeaseKind, LockBackend, LockBackendExt,
    LockError, LockKey, LockWrapper, RENEW_CONCURRENCY, async_trait, renew_concurrently,
};
use lock_sql::SqlBackend;
use shared_checks::*;
use tokio::time::Instant;

/// Ways to break the real backend, each one a check must catch.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Breakage {
    /// Reads carry the epoch + 1.
    ShiftedReadToken,
    /// The waiting acquire runs detached (dropping it withdraws nothing).
    Detached,
}

#[derive(Debug)]
struct Broken {
    inner: Backend,
    how: Breakage,
}

impl Broken {
    /// The lease as the caller asked for it (so renew/release use the
    /// real row), with the token rewritten where that is the breakage.
    fn back(&self, lease: Lease) -> Lease {
        if self.how == Breakage::ShiftedReadToken && lease.kind() == LeaseKind::Read {
            let token = FencingToken::new(lease.token().get() + 1);
            return Lease::from_parts(
                lease.key().clone(),
                lease.owner(),
                token,
                lease.ttl(),
                lease.validity_deadline(),
                String::new(),
            )
            .with_kind(LeaseKind::Read);
        }
        lease
    }

    fn real(&self, lease: &Lease) -> Lease {
        if self.how == Breakage::ShiftedReadToken && lease.kind() == LeaseKind::Read {
            return Lease::from_parts(
                lease.key().clone(),
                lease.owner(),
                FencingToken::new(lease.token().get() - 1),
                lease.ttl(),
                lease.validity_deadline(),
                String::new(),
            )
            .with_kind(LeaseKind::Read);
        }
        lease.clone()
    }
}

/// Overrides only what each breakage changes: grants of the shared kinds,
/// renewals and releases (through the real row of a shifted read token),
/// and the downgrade (a facet of its own, beside the inner backend's
/// other facets). `renew_many` renews lease by lease, as the hand-written
/// impl this replaces did, each through the real row.
#[async_trait]
impl LockWrapper for Broken {
    fn inner(&self) -> &dyn LockBackend {
        &*self.inner
    }
    fn name(&self) -> &'static str {
        "broken-sql"
    }
    fn facets(&self) -> Facets<'_> {
        Facets {
            downgrade: Some(self),
            ..self.inner.facets()
        }
    }
    async fn grant(&self, request: GrantRequest<'_>) -> Result<Option<Lease>, LockError> {
        let GrantRequest {
            key,
            kind,
            ttl,
            deadline,
        } = request;
        if kind == LeaseKind::Exclusive {
            return self.inner.grant(request).await;
        }
        match deadline {
            None => self.try_kind(key, kind, ttl).await,
            Some(deadline) => self.wait_kind(key, kind, ttl, deadline).await.map(Some),
        }
    }
    async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
        renew_concurrently(leases, RENEW_CONCURRENCY, |lease| async move {
            self.inner.renew(&self.real(lease)).await
        })
        .await
    }
    async fn release(&self, lease: &Lease) -> Result<bool, LockError> {
        self.inner.release(&self.real(lease)).await
    }
}

impl Broken {
    async fn try_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
    ) -> Result<Option<Lease>, LockError> {
        let lease = self.inner.try_acquire_kind(key, kind, ttl).await?;
        Ok(lease.map(|l| self.back(l)))
    }

    async fn wait_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: Duration,
        deadline: Instant,
    ) -> Result<Lease, LockError> {
        match self.how {
            Breakage::Detached => {
                let (inner, key) = (self.inner.clone(), key.clone());
                let task =
                    tokio::spawn(
                        async move { inner.acquire_kind(&key, kind, ttl, deadline).await },
                    );
                task.await.map_err(|e| LockError::config(e.to_string()))?
            }
            Breakage::ShiftedReadToken => {
                Ok(self.back(self.inner.acquire_kind(key, kind, ttl, deadline).await?))
            }
        }
    }
}

#[async_trait]
impl Downgrade for Broken {
    async fn downgrade(&self, lease: &Lease) -> Result<Lease, LockError> {
        Ok(self.back(self.inner.downgrade(&self.real(lease)).await?))
    }
}

/// Each check fails on the broken variant made for it (SQLite file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_catch_broken_variants() {
    let target = common::SqliteTarget::new();
    let real_sql = SqlBackend::connect_url(&target.url).await.unwrap();
    let real: Backend = Arc::new(real_sql.clone());
    let real_b: Backend = Arc::new(SqlBackend::connect_url(&target.url).await.unwrap());
    let broken = |how| -> (Backend, Backend) {
        (
            Arc::new(Broken {
                inner: real.clone(),
                how,
            }),
            Arc::new(Broken {
                inner: real_b.clone(),
                how,
            }),
        )
    };
    let mut caught = Vec::new();
    for how in [Breakage::ShiftedReadToken, Breakage::Detached] {
        let (a, b) = broken(how);
        let name = format!("broken/{how:?}");
        let result = match how {
            Breakage::ShiftedReadToken => tokens(&a, &b, &name).await,
            Breakage::Detached => cancel_leaves_nothing(&a, &b, &name).await,
        };
        println!("{how:?}: {result:?}");
        if how == Breakage::Detached {
            // The row-level check of `all_checks` sees the waiter row a
            // detached (undroppable) wait leaves behind.
            let waiters = leftover_rows(&real_sql, &name).await.0;
            assert!(waiters > 0, "the detached wait's row was not seen");
        }
        caught.push((how, result.is_err()));
        // Whatever the broken variant left behind expires (short TTLs) or
        // lives under its own key.
    }
    let missed: Vec<_> = caught.iter().filter(|(_, c)| !c).map(|(h, _)| h).collect();
    assert!(
        missed.is_empty(),
        "checks that passed a broken variant: {missed:?}"
    );
}
