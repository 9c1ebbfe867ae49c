//! The suite's targets: deployments from `conformance::deploy` (the
//! `etcd` and `etcd-cluster` kinds, or a TLS server wrapped the same way)
//! opened with this driver.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use conformance::OrSkip;
use conformance::deploy::Opener;
use conformance::history::{Op, Recorder};
use conformance::servers::etcd::EtcdServer;
use lock_core::LockBackendExt;
use lock_core::{Lease, LeaseKind, LockBackend, LockError, LockKey};
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::time::{Instant, sleep};

/// What the suite's clients set in a deployment's URL: a 1 s session TTL
/// (the deployments hand out `ttl=2s`) and a 1 s per-call timeout, so that
/// failures are quick.
pub const CLIENT_OPTIONS: &[(&str, &str)] = &[("ttl", "1s"), ("timeout", "1s")];

/// `url` with each `(name, value)` of `options` set: an option of the same
/// name already in the URL is replaced (the URL parser refuses one given
/// twice), the others are appended.
pub fn with_options(url: &str, options: &[(&str, &str)]) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut pairs: Vec<String> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            !pair.is_empty() && !options.iter().any(|(n, _)| *n == name)
        })
        .map(str::to_owned)
        .collect();
    pairs.extend(options.iter().map(|(n, v)| format!("{n}={v}")));
    format!("{base}?{}", pairs.join("&"))
}

/// Opens this driver's backend from a deployment's URL with `options` set
/// ([`with_options`]).
pub fn opener(options: Vec<(&'static str, String)>) -> Opener {
    let options = Arc::new(options);
    Arc::new(move |url: String| {
        let options = options.clone();
        Box::pin(async move {
            let options: Vec<(&str, &str)> =
                options.iter().map(|(n, v)| (*n, v.as_str())).collect();
            let url = with_options(&url, &options);
            Ok(Arc::new(lock_etcd::connect(&url).await?) as Arc<dyn LockBackend>)
        })
    })
}

/// [`CLIENT_OPTIONS`] as owned values, for [`opener`] (extend it with
/// options of one target's own).
pub fn client_options() -> Vec<(&'static str, String)> {
    CLIENT_OPTIONS
        .iter()
        .map(|(n, v)| (*n, (*v).to_owned()))
        .collect()
}

/// [`opener`] with [`CLIENT_OPTIONS`].
pub fn suite_opener() -> Opener {
    opener(client_options())
}

/// A config for `server` under `prefix`: session TTL `ttl`, a 1 s
/// per-call timeout.
pub fn config_for(server: &EtcdServer, prefix: &str, ttl: Duration) -> EtcdConfig {
    EtcdConfig::new(server.endpoints())
        .prefix(prefix)
        .ttl(ttl)
        .op_timeout(Duration::from_secs(1))
}

/// This driver on `server` with [`config_for`]; panics when it cannot
/// connect.
pub async fn connect_for(server: &EtcdServer, prefix: &str, ttl: Duration) -> EtcdBackend {
    EtcdBackend::connect(config_for(server, prefix, ttl))
        .await
        .unwrap()
}

/// A mutex grant of `key` at once, for a test body: panics when refused.
pub async fn granted(b: &dyn LockBackend, key: &LockKey, ttl: Duration) -> Lease {
    b.try_acquire(key, ttl).await.unwrap().unwrap()
}

/// A `kind` grant of `key` at once, for a test body: panics when refused.
pub async fn granted_kind(
    b: &dyn LockBackend,
    key: &LockKey,
    kind: LeaseKind,
    ttl: Duration,
) -> Lease {
    b.try_acquire_kind(key, kind, ttl).await.unwrap().unwrap()
}

/// A server and the `etcdctl` binary beside it; `None` (with the skip
/// printed) when either is missing here.
pub async fn server_and_etcdctl() -> Option<(EtcdServer, std::path::PathBuf)> {
    let server = EtcdServer::start().await.or_skip()?;
    let etcdctl = conformance::servers::etcd::etcdctl().or_skip()?;
    Some((server, etcdctl))
}

/// After `pause`, `waiter` must still be waiting: `why` if it finished.
pub async fn assert_waiting<T>(waiter: &tokio::task::JoinHandle<T>, pause: Duration, why: &str) {
    sleep(pause).await;
    assert!(!waiter.is_finished(), "{why}");
}

/// How many entries lie under `prefix` on `b`'s server (counted raw).
pub async fn raw_count(b: &EtcdBackend, prefix: impl Into<Vec<u8>>) -> i64 {
    let options = etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    b.client()
        .kv_client()
        .get(prefix, Some(options))
        .await
        .expect("raw count")
        .count()
}

/// Deletes every entry under `prefix` on `b`'s server: how many went.
pub async fn raw_delete(b: &EtcdBackend, prefix: impl Into<Vec<u8>>) -> i64 {
    let options = etcd_client::DeleteOptions::new().with_prefix();
    b.client()
        .kv_client()
        .delete(prefix, Some(options))
        .await
        .expect("raw delete")
        .deleted()
}

/// One recorded acquire of a contention task: `Op::Acquire` is invoked,
/// then `acquire` runs; a failure is recorded and paced (20 ms) and gives
/// `None`. The caller records the grant (its kind is the caller's).
pub async fn recorded_acquire(
    rec: &Recorder,
    key: &LockKey,
    acquire: impl Future<Output = Result<Lease, LockError>>,
) -> Option<Lease> {
    rec.invoke(Op::Acquire, key, None);
    match acquire.await {
        Ok(lease) => Some(lease),
        Err(_) => {
            rec.failed(Op::Acquire, key, None);
            sleep(Duration::from_millis(20)).await;
            None
        }
    }
}

/// One recorded release of a contention task's `lease`.
pub async fn recorded_release(
    rec: &Recorder,
    backend: &dyn LockBackend,
    key: &LockKey,
    lease: &Lease,
) {
    rec.invoke(Op::Release, key, Some(lease.token()));
    match backend.release(lease).await {
        Ok(held) => rec.released(key, lease.token(), held),
        Err(_) => rec.failed(Op::Release, key, Some(lease.token())),
    }
}

/// Waits (polling every 50 ms) until `last_grant` is later than `after`,
/// or until `patience`: grants resumed after a fault.
pub async fn await_grant_after(
    last_grant: &Mutex<Option<Instant>>,
    after: Instant,
    patience: Instant,
) {
    while last_grant.lock().unwrap().is_none_or(|at| at <= after) && Instant::now() < patience {
        sleep(Duration::from_millis(50)).await;
    }
}

/// Acquires and releases `key` once with a 60 s TTL (the session's
/// keep-alives, every 20 s, make no call during a test), every call
/// bounded by the URL's `timeout`; `Err` carries the error's text.
pub async fn cycle(backend: &EtcdBackend, key: &LockKey) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(2);
    let lease = backend
        .acquire(key, Duration::from_secs(60), deadline)
        .await
        .map_err(|e| e.to_string())?;
    backend.release(&lease).await.map_err(|e| e.to_string())?;
    Ok(())
}

/// [`cycle`]s until 20 in a row succeed, within 20 s: `Ok` with the
/// failures before them, `Err` naming them when 20 s were not enough.
/// Every cycle is two calls: a client that still sends a third of them to
/// a member that cannot serve gets 20 cycles in a row through about once
/// in 10^7 tries.
pub async fn twenty_cycles_in_a_row(
    backend: &EtcdBackend,
    key: &LockKey,
) -> Result<Vec<String>, String> {
    let until = Instant::now() + Duration::from_secs(20);
    let (mut failures, mut in_a_row) = (Vec::new(), 0);
    while in_a_row < 20 {
        match cycle(backend, key).await {
            Ok(()) => in_a_row += 1,
            Err(err) => {
                failures.push(err);
                in_a_row = 0;
            }
        }
        if Instant::now() >= until {
            return Err(format!("no 20 cycles in a row within 20 s: {failures:?}"));
        }
    }
    Ok(failures)
}
