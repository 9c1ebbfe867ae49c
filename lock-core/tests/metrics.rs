//! The metrics a client records, read back through a recorder installed in
//! this test process (metrics-util's debugging recorder): grants,
//! contended tries, timed-out waits, renewals with their margin, a
//! `Suspect` spell, the loss by its reason class, hold times; and nothing
//! at all while the metrics are off.

use std::collections::HashMap;
use std::time::Duration;

use lock_core::{
    KeyLabel, LockClient, LockState, MemoryBackend, MemoryFault, disable_metrics, enable_metrics,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// `name{label=value,...}` (labels sorted) -> counter value or histogram
/// sample count.
fn read(snapshotter: &Snapshotter) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let value = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(samples) => samples.len() as f64,
        };
        *out.entry(name).or_insert(0.0) += value;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_life_in_metrics() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let service = MemoryBackend::new();
    let a = LockClient::new(service.clone());
    let b = LockClient::new(service.clone());

    // Off: nothing recorded.
    disable_metrics();
    drop(a.lock("jobs/off").acquire().await.unwrap().release().await);
    assert!(read(&snapshotter).is_empty());

    enable_metrics(KeyLabel::Segments(1));
    let guard = a
        .lock("jobs/1")
        .ttl(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap();
    assert!(b.lock("jobs/1").try_acquire().await.unwrap().is_none());
    let waited = b
        .lock("jobs/1")
        .wait(Duration::from_millis(100))
        .acquire()
        .await;
    assert!(waited.unwrap_err().is_contended());
    // Renewals every 100 ms.
    tokio::time::sleep(Duration::from_millis(350)).await;
    // Cut off: renewals fail, the guard goes Suspect, then Lost at its deadline.
    service.set_fault(MemoryFault::Unavailable);
    let reason = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost within the TTL");
    service.set_fault(MemoryFault::None);
    assert!(matches!(guard.state(), LockState::Lost(_)), "{reason}");
    drop(guard);
    let held = a.lock("other/2").acquire().await.unwrap();
    assert!(held.release().await.unwrap());

    let m = read(&snapshotter);
    let mut names: Vec<_> = m.iter().collect();
    names.sort_by(|x, y| x.0.cmp(y.0));
    for (name, value) in &names {
        println!("{name} {value}");
    }
    let get = |name: &str| m.get(name).copied().unwrap_or(0.0);
    let jobs = "backend=memory,key=jobs";
    assert_eq!(
        get(&format!(
            "distlock_acquire_attempts_total{{{jobs},shape=mutex}}"
        )),
        3.0
    );
    assert_eq!(
        get(&format!(
            "distlock_acquire_grants_total{{{jobs},shape=mutex}}"
        )),
        1.0
    );
    assert_eq!(
        get(&format!(
            "distlock_acquire_contended_total{{{jobs},shape=mutex}}"
        )),
        1.0
    );
    assert_eq!(
        get(&format!(
            "distlock_acquire_timeouts_total{{{jobs},shape=mutex}}"
        )),
        1.0
    );
    assert_eq!(
        get(&format!(
            "distlock_acquire_wait_seconds{{{jobs},shape=mutex}}"
        )),
        1.0
    );
    let ok = get(&format!("distlock_renewals_total{{{jobs},outcome=ok}}"));
    assert!(ok >= 2.0, "{ok} renewals");
    assert_eq!(
        get(&format!("distlock_renewal_margin_seconds{{{jobs}}}")),
        ok
    );
    assert!(get(&format!("distlock_renewals_total{{{jobs},outcome=failed}}")) >= 1.0);
    assert_eq!(get(&format!("distlock_suspect_seconds{{{jobs}}}")), 1.0);
    assert_eq!(
        get(&format!(
            "distlock_locks_lost_total{{{jobs},reason=expired}}"
        )),
        1.0,
        "{reason}"
    );
    assert_eq!(get(&format!("distlock_hold_seconds{{{jobs}}}")), 1.0);
    // The other prefix is its own series; the raw keys appear nowhere.
    assert_eq!(get("distlock_hold_seconds{backend=memory,key=other}"), 1.0);
    assert!(
        m.keys()
            .all(|k| !k.contains("jobs/1") && !k.contains("jobs/off"))
    );
}
