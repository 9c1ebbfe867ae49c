//! Cases for writes guarded by the lock's own store: where the protected
//! data lives in the store that holds the lock (an etcd transaction, a
//! ZooKeeper `multi`, a Redis script, a SQL statement), the write checks in
//! the same atomic step that the lease still holds its lock, and needs no
//! token at the resource.
//!
//! A store plugs in through [`GuardedStore`]; [`run_guarded_cases`] runs
//! every case against it and a backend of the same store, and
//! [`CasesReport::assert_passed`](super::CasesReport::assert_passed) fails the test. The rule: a write made
//! with a lease that holds its lock lands; a write made with a lease that
//! was released, taken over or has expired is refused (told apart from an
//! error) and changes nothing.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lock_core::Lease;
use lock_core::{LockBackend, LockBackendExt, LockKey, TtlModel};

use super::{CaseResult, CasesReport, NamedCaseResult};

/// What a guarded write answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardedOutcome {
    /// The lease held its lock and the write landed.
    Written,
    /// The lease no longer held its lock: nothing was written.
    Refused,
}

/// A store whose writes check, atomically, that a lease holds its lock.
#[async_trait]
pub trait GuardedStore: Send + Sync {
    /// A name for reports.
    fn name(&self) -> String;

    /// Writes `value` to `resource` (data in the lock's own store) only if
    /// `lease` holds its lock, in one atomic step with that check.
    ///
    /// # Errors
    ///
    /// Anything but a refusal (a refusal is `Ok(Refused)`).
    async fn write(
        &self,
        lease: &Lease,
        resource: &str,
        value: &str,
    ) -> Result<GuardedOutcome, String>;

    /// The value `resource` holds (`None` before any write).
    ///
    /// # Errors
    ///
    /// The store's errors.
    async fn read(&self, resource: &str) -> Result<Option<String>, String>;
}

/// One guarded-write case's result: `Ok(Some(reason))` when skipped.
pub type GuardedCaseResult = NamedCaseResult<Option<String>>;

/// Every guarded-write case's result against one store.
pub type GuardedReport = CasesReport<Option<String>>;

impl CasesReport<Option<String>> {
    /// The names of the cases that ran and passed.
    pub fn passed(&self) -> Vec<&'static str> {
        self.cases
            .iter()
            .filter(|c| matches!(c.result, Ok(None)))
            .map(|c| c.name)
            .collect()
    }
}

/// The case names, in the order [`run_guarded_cases`] runs them.
pub const GUARDED_CASES: &[&str] = &[
    "holder_write_lands",
    "released_lease_is_refused",
    "taken_over_lease_is_refused",
    "expired_lease_is_refused",
];

/// The TTL the cases acquire with; the expiry case waits it out.
const TTL: Duration = Duration::from_secs(2);

/// Runs every guarded-write case: leases come from `backend`, writes go
/// through `store` (both over the same store). Keys and resources are
/// named after the case and the time, so a store can be reused.
///
/// `taken_over_lease_is_refused` takes the key from its holder with the
/// backend's [`Admin`](lock_core::Admin) facet (skipped without it);
/// `expired_lease_is_refused` lets a lease run out, for backends whose
/// leases have a TTL of their own ([`TtlModel::PerLease`]; skipped for
/// session and per-process leases, which a live client keeps).
pub async fn run_guarded_cases(
    backend: Arc<dyn LockBackend>,
    store: Arc<dyn GuardedStore>,
) -> GuardedReport {
    let run = super::run_stamp();
    let mut cases = Vec::new();
    for &name in GUARDED_CASES {
        let resource = format!("guarded-{run}-{name}");
        let key = match LockKey::new(format!("guarded-{run}-{name}")) {
            Ok(key) => key,
            Err(e) => {
                cases.push(GuardedCaseResult {
                    name,
                    result: Err(e.to_string()),
                });
                continue;
            }
        };
        let (b, s) = (&*backend, &*store);
        let result = match name {
            "holder_write_lands" => holder_writes(b, s, &key, &resource).await.map(|()| None),
            "released_lease_is_refused" => released(b, s, &key, &resource).await.map(|()| None),
            "taken_over_lease_is_refused" => taken_over(b, s, &key, &resource).await,
            _ => expired(b, s, &key, &resource).await,
        };
        cases.push(GuardedCaseResult { name, result });
    }
    GuardedReport {
        subject: store.name(),
        checks: "guarded-write",
        cases,
    }
}

async fn take(backend: &dyn LockBackend, key: &LockKey) -> Result<Lease, String> {
    backend
        .try_acquire(key, TTL)
        .await
        .map_err(|e| format!("acquire {key}: {e}"))?
        .ok_or_else(|| format!("{key} was not free"))
}

async fn expect(
    store: &dyn GuardedStore,
    lease: &Lease,
    r: &str,
    value: &str,
    want: GuardedOutcome,
    when: &str,
) -> CaseResult {
    let got = store.write(lease, r, value).await?;
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{when}: write of {value:?} expected {want:?}, got {got:?}"
        ))
    }
}

async fn expect_value(store: &dyn GuardedStore, r: &str, want: Option<&str>) -> CaseResult {
    let got = store.read(r).await?;
    if got.as_deref() == want {
        Ok(())
    } else {
        Err(format!("{r} holds {got:?}, expected {want:?}"))
    }
}

async fn holder_writes(
    backend: &dyn LockBackend,
    store: &dyn GuardedStore,
    key: &LockKey,
    r: &str,
) -> CaseResult {
    let lease = take(backend, key).await?;
    expect(store, &lease, r, "first", GuardedOutcome::Written, "holder").await?;
    expect(
        store,
        &lease,
        r,
        "second",
        GuardedOutcome::Written,
        "holder again",
    )
    .await?;
    expect_value(store, r, Some("second")).await?;
    backend.release(&lease).await.map_err(|e| e.to_string())?;
    Ok(())
}

async fn released(
    backend: &dyn LockBackend,
    store: &dyn GuardedStore,
    key: &LockKey,
    r: &str,
) -> CaseResult {
    let lease = take(backend, key).await?;
    expect(store, &lease, r, "held", GuardedOutcome::Written, "holder").await?;
    backend.release(&lease).await.map_err(|e| e.to_string())?;
    expect(
        store,
        &lease,
        r,
        "late",
        GuardedOutcome::Refused,
        "after release",
    )
    .await?;
    expect_value(store, r, Some("held")).await
}

async fn taken_over(
    backend: &dyn LockBackend,
    store: &dyn GuardedStore,
    key: &LockKey,
    r: &str,
) -> Result<Option<String>, String> {
    let facets = backend.facets();
    let Some(admin) = facets.admin else {
        return Ok(Some("no admin facet to take a key over".into()));
    };
    let old = take(backend, key).await?;
    admin
        .force_release(key)
        .await
        .map_err(|e| format!("force release: {e}"))?;
    let new = take(backend, key).await?;
    expect(store, &old, r, "old", GuardedOutcome::Refused, "old holder").await?;
    expect(store, &new, r, "new", GuardedOutcome::Written, "new holder").await?;
    expect(
        store,
        &old,
        r,
        "old again",
        GuardedOutcome::Refused,
        "old holder",
    )
    .await?;
    expect_value(store, r, Some("new")).await?;
    backend.release(&new).await.map_err(|e| e.to_string())?;
    Ok(None)
}

async fn expired(
    backend: &dyn LockBackend,
    store: &dyn GuardedStore,
    key: &LockKey,
    r: &str,
) -> Result<Option<String>, String> {
    let caps = backend.capabilities();
    if caps.ttl_model != TtlModel::PerLease {
        return Ok(Some(format!(
            "leases are {:?}: a live client keeps them",
            caps.ttl_model
        )));
    }
    let ttl = TTL.max(caps.min_ttl);
    let lease = backend
        .try_acquire(key, ttl)
        .await
        .map_err(|e| format!("acquire {key}: {e}"))?
        .ok_or_else(|| format!("{key} was not free"))?;
    // Not renewed: past its TTL (and a margin for the store's expiry) the
    // lease no longer holds the key, even though nobody took it.
    tokio::time::sleep(ttl + Duration::from_millis(1500)).await;
    expect(
        store,
        &lease,
        r,
        "late",
        GuardedOutcome::Refused,
        "after expiry",
    )
    .await?;
    expect_value(store, r, None).await?;
    Ok(None)
}

/// Wraps a store so that its writes skip the ownership check (they always
/// land): the deliberately broken variant the cases must fail on.
pub struct Unchecked<S> {
    inner: S,
}

impl<S> Unchecked<S> {
    /// Reads go to `inner`; writes go to its
    /// [`write_unchecked`](UncheckedWrite::write_unchecked).
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

/// The write of a store without its ownership check, for [`Unchecked`].
#[async_trait]
pub trait UncheckedWrite: GuardedStore {
    /// Writes `value` to `resource` whatever `lease` holds.
    ///
    /// # Errors
    ///
    /// The store's errors.
    async fn write_unchecked(&self, resource: &str, value: &str) -> Result<(), String>;
}

#[async_trait]
impl<S: UncheckedWrite> GuardedStore for Unchecked<S> {
    fn name(&self) -> String {
        format!("{} (unchecked)", self.inner.name())
    }

    async fn write(
        &self,
        _lease: &Lease,
        resource: &str,
        value: &str,
    ) -> Result<GuardedOutcome, String> {
        self.inner.write_unchecked(resource, value).await?;
        Ok(GuardedOutcome::Written)
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        self.inner.read(resource).await
    }
}

/// Runs the cases on `broken` (a store without the check) and panics
/// unless they catch it (the released case must fail); the report, for
/// further checks.
pub async fn assert_unchecked_fails(
    backend: Arc<dyn LockBackend>,
    broken: Arc<dyn GuardedStore>,
) -> GuardedReport {
    let report = run_guarded_cases(backend, broken).await;
    let failed = report.failed();
    assert!(
        failed.contains(&"released_lease_is_refused"),
        "{}: the cases did not catch a write without the check: {report:?}",
        report.subject
    );
    report
}

/// A guarded store in memory over any backend: a write checks with
/// [`inspect`](LockBackendExt::inspect) that the lease's token holds
/// its key, then writes, under one mutex. Not atomic with the
/// backend (another client may take the key between the two): the
/// reference for the suite's own tests, not a product.
pub struct MemoryGuarded {
    backend: Arc<dyn LockBackend>,
    state: tokio::sync::Mutex<std::collections::HashMap<String, String>>,
}

impl MemoryGuarded {
    /// Checks leases against `backend`.
    pub fn new(backend: Arc<dyn LockBackend>) -> Self {
        Self {
            backend,
            state: Default::default(),
        }
    }
}

#[async_trait]
impl GuardedStore for MemoryGuarded {
    fn name(&self) -> String {
        format!("memory over {}", self.backend.name())
    }

    async fn write(
        &self,
        lease: &Lease,
        resource: &str,
        value: &str,
    ) -> Result<GuardedOutcome, String> {
        let mut state = self.state.lock().await;
        let info = self
            .backend
            .inspect(lease.key())
            .await
            .map_err(|e| e.to_string())?;
        let holds = info.is_some_and(|info| info.token == Some(lease.token()));
        if !holds {
            return Ok(GuardedOutcome::Refused);
        }
        state.insert(resource.to_owned(), value.to_owned());
        Ok(GuardedOutcome::Written)
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        Ok(self.state.lock().await.get(resource).cloned())
    }
}

#[async_trait]
impl UncheckedWrite for MemoryGuarded {
    async fn write_unchecked(&self, resource: &str, value: &str) -> Result<(), String> {
        self.state
            .lock()
            .await
            .insert(resource.to_owned(), value.to_owned());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::MemoryBackend;

    #[tokio::test]
    async fn the_cases_pass_on_the_checked_store_and_catch_the_unchecked_one() {
        let backend: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
        let report = run_guarded_cases(
            backend.clone(),
            Arc::new(MemoryGuarded::new(backend.clone())),
        )
        .await;
        report.assert_passed();
        assert_eq!(report.passed().len(), GUARDED_CASES.len(), "{report:?}");
        let broken = Arc::new(Unchecked::new(MemoryGuarded::new(backend.clone())));
        let report = assert_unchecked_fails(backend, broken).await;
        for case in [
            "released_lease_is_refused",
            "taken_over_lease_is_refused",
            "expired_lease_is_refused",
        ] {
            assert!(
                report.failed().contains(&case),
                "{case} did not fail: {report:?}"
            );
        }
    }
}
