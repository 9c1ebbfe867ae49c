//! Bad input is a typed error within a bounded time: malformed URLs are
//! `Config` errors, an unreachable server is `Unavailable` or `Timeout`.

use std::time::Duration;

use lock_core::ErrorKind;
use tokio::time::Instant;

#[tokio::test]
async fn bad_urls_are_config_errors() {
    for bad in [
        "nats://127.0.0.1:4222",
        "nats://127.0.0.1:4222/",
        "nats://127.0.0.1:4222/a/b",
        "nats://127.0.0.1:4222/bad.bucket",
        "nats://127.0.0.1:4222/b?unknown=1",
        "nats://127.0.0.1:4222/b?timeout=soon",
        "nats://127.0.0.1:99999/b",
        "nats:///b",
    ] {
        let err = lock_nats::connect(bad).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{bad}: {err}");
        let err = distlock::backend::open(bad).await.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::Config,
            "{bad} through the facade: {err}"
        );
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_typed_error_in_bounded_time() {
    // A port nothing listens on (refused at once), and an address that
    // drops packets (bounded by connect_timeout).
    let port = conformance::process::free_port().unwrap();
    for url in [
        format!("nats://127.0.0.1:{port}/locks?connect_timeout=1s&timeout=1s"),
        "nats://192.0.2.1:4222/locks?connect_timeout=1s&timeout=1s".to_owned(),
    ] {
        let start = Instant::now();
        let err = lock_nats::connect(&url).await.unwrap_err();
        let took = start.elapsed();
        assert!(
            matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
            "{url}: {err}"
        );
        assert!(took < Duration::from_secs(5), "{url}: {took:?}");
    }
}
