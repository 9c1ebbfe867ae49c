//! Multi-locks in one transaction (`try_acquire_all`): all or nothing,
//! checked on etcd and on a broken variant ([`OneByOne`]).

use super::*;

/// A broken `try_acquire_all`: the keys one by one, and at the first held
/// key it answers "held" without giving back the keys it took.
#[derive(Debug)]
struct OneByOne(EtcdBackend);

#[lock_core::async_trait]
impl lock_core::LockWrapper for OneByOne {
    fn inner(&self) -> &dyn LockBackend {
        &self.0
    }
    fn name(&self) -> &'static str {
        "etcd-one-by-one"
    }
    /// Each lease renewed on its own, not in etcd's batch.
    async fn renew_many(&self, leases: &[&lock_core::Lease]) -> Vec<Result<Instant, LockError>> {
        lock_core::renew_concurrently(leases, lock_core::RENEW_CONCURRENCY, |lease| {
            self.0.renew(lease)
        })
        .await
    }
    /// etcd's facets, with this double's sets.
    fn facets(&self) -> lock_core::Facets<'_> {
        lock_core::Facets {
            lock_sets: Some(self),
            ..self.0.facets()
        }
    }
}

#[lock_core::async_trait]
impl lock_core::LockSets for OneByOne {
    async fn try_acquire_all(
        &self,
        keys: &[LockKey],
        ttl: Duration,
    ) -> Result<Option<Vec<lock_core::Lease>>, LockError> {
        let mut leases = Vec::new();
        for key in keys {
            match self.0.try_acquire(key, ttl).await? {
                Some(lease) => leases.push(lease),
                None => return Ok(None),
            }
        }
        Ok(Some(leases))
    }
}

/// How many entries are under `prefix/`.
async fn entries_under(backend: &EtcdBackend, prefix: &str) -> i64 {
    crate::common::raw_count(backend, format!("{prefix}/")).await
}

/// `set` takes a set all or nothing: refused with nothing left behind while
/// `other` holds one key, then granted whole with fresh tokens, excluding
/// plain locks of its keys; its leases renew and release as any other.
async fn set_is_all_or_nothing(
    set: &dyn LockBackend,
    other: &EtcdBackend,
    prefix: &str,
) -> Result<(), String> {
    let ttl = Duration::from_secs(5);
    let keys = lock_core::lock_order(&["s/a", "s/b", "s/c"].map(|k| LockKey::new(k).unwrap()));
    let held = other.try_acquire(&keys[1], ttl).await.unwrap().unwrap();
    let refused = set
        .try_acquire_all(&keys, ttl)
        .await
        .map_err(|e| e.to_string())?;
    if refused.is_some() {
        return Err("granted while a key was held".into());
    }
    let left = entries_under(other, prefix).await;
    if left != 1 {
        return Err(format!("{} entries left behind by a refused set", left - 1));
    }
    assert!(other.release(&held).await.unwrap());
    let leases = set
        .try_acquire_all(&keys, ttl)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("refused on free keys")?;
    if leases.iter().map(|l| l.key()).ne(keys.iter()) {
        return Err("leases not in the keys' order".into());
    }
    for (lease, key) in leases.iter().zip(&keys) {
        if lease.token() <= held.token() {
            return Err(format!(
                "token {} not above the key's last {}",
                lease.token(),
                held.token()
            ));
        }
        if other.try_acquire(key, ttl).await.unwrap().is_some() {
            return Err(format!("a plain lock of {key} got in beside the set"));
        }
        let info = other.inspect(key).await.unwrap().ok_or("inspect: free")?;
        if info.token != Some(lease.token()) {
            return Err(format!("inspect shows {info:?}"));
        }
    }
    let refs: Vec<&lock_core::Lease> = leases.iter().collect();
    for renewed in set.renew_many(&refs).await {
        renewed.map_err(|e| format!("renew_many: {e}"))?;
    }
    for lease in &leases {
        if !set.release(lease).await.map_err(|e| e.to_string())? {
            return Err("release found nothing".into());
        }
    }
    match entries_under(other, prefix).await {
        0 => Ok(()),
        n => Err(format!("{n} entries left after releasing the set")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_all_takes_a_set_in_one_transaction() {
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let ttl = Duration::from_secs(5);
    let a = connect_at(&server, "multi").await;
    let b = connect_at(&server, "multi").await;
    set_is_all_or_nothing(&a, &b, "multi").await.unwrap();
    // The check fails on the broken variant (a refused set keeps a key).
    let err = set_is_all_or_nothing(&OneByOne(a.clone()), &b, "multi")
        .await
        .unwrap_err();
    println!("broken set caught: {err}");
    assert!(err.contains("left behind"), "{err}");
    let left = crate::common::raw_delete(&b, "multi/").await;
    // The other backend's held key and the broken variant's leftover.
    assert_eq!(left, 2);

    // One transaction: every entry of a set has the same create revision.
    let keys: Vec<LockKey> = ["x", "y"]
        .iter()
        .map(|k| LockKey::new(*k).unwrap())
        .collect();
    let set = a.try_acquire_all(&keys, ttl).await.unwrap().unwrap();
    assert_eq!(set[0].token(), set[1].token());
    for lease in &set {
        assert!(a.release(lease).await.unwrap());
    }
    // Bad sets are typed errors; a set beyond one transaction is Unsupported
    // (the multi-lock then takes the keys one by one).
    let err = a.try_acquire_all(&[], ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let twice = [keys[0].clone(), keys[0].clone()];
    let err = a.try_acquire_all(&twice, ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = a
        .try_acquire_all(&keys, Duration::from_millis(10))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let many: Vec<String> = (0..129).map(|i| format!("many/{i:03}")).collect();
    let many_keys: Vec<LockKey> = many.iter().map(|k| LockKey::new(k).unwrap()).collect();
    let err = a
        .try_acquire_all(&lock_core::lock_order(&many_keys), ttl)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let client = LockClient::new(a.clone());
    let guard = client
        .lock_all(&many)
        .ttl(ttl)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(entries_under(&a, "multi").await, 0);

    // A waiting multi-lock gets the whole set once the held key is free.
    let held = b.try_acquire(&keys[1], ttl).await.unwrap().unwrap();
    let waiter = tokio::spawn(async move {
        client
            .lock_all(["x", "y"])
            .ttl(ttl)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
    });
    let why = "the set was granted while y was held";
    crate::common::assert_waiting(&waiter, Duration::from_millis(300), why).await;
    assert!(b.release(&held).await.unwrap());
    let guard = timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    assert_eq!(entries_under(&a, "multi").await, 0);
}
