//! A config that requires fencing tokens refuses a Redis that may evict
//! keys (an evicted token counter would start again at 1); without the
//! requirement the same server is accepted (the driver warns).

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use lock_core::ErrorKind;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requiring_fencing_refuses_an_evicting_redis() {
    let Some(server) =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"])
            .await
            .or_skip()
    else {
        return;
    };
    let url = server.url();
    let plain = distlock::Config::from_toml_str(&format!("url = {url:?}")).unwrap();
    let backend = distlock::backend::open_config(&plain)
        .await
        .expect("accepted without the requirement");
    drop(backend);
    let strict =
        distlock::Config::from_toml_str(&format!("url = {url:?}\nrequire = [\"fencing\"]"))
            .unwrap();
    let err = distlock::backend::open_config(&strict)
        .await
        .expect_err("an evicting Redis must be refused when fencing is required");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("allkeys-lru"), "{err}");
    // The user can still say otherwise explicitly.
    let explicit = distlock::Config::from_toml_str(&format!(
        "url = \"{url}?eviction=warn\"\nrequire = [\"fencing\"]"
    ))
    .unwrap();
    assert!(distlock::backend::open_config(&explicit).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requiring_fencing_accepts_a_redis_that_never_evicts() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let strict = distlock::Config::from_toml_str(&format!(
        "url = {:?}\nrequire = [\"fencing\"]",
        server.url()
    ))
    .unwrap();
    assert!(distlock::backend::open_config(&strict).await.is_ok());
}
