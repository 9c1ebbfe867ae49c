//! The URL parser and the builder, without a server.

use super::*;

#[test]
fn parses_every_scheme() {
    let c = RedisConfig::from_url(
        "redis://:s3cr%40t@127.0.0.1:7000/2?ttl=5s&prefix=app:&timeout=250ms&replicas=1",
    )
    .unwrap();
    assert_eq!(
        c.topology,
        RedisTopology::Single(RedisNode::new("127.0.0.1", 7000))
    );
    assert_eq!(c.password.as_deref(), Some("s3cr@t"));
    assert_eq!(c.db, 2);
    assert_eq!(c.default_ttl, Duration::from_secs(5));
    assert_eq!(c.prefix, "app:");
    assert_eq!(c.operation_timeout, Duration::from_millis(250));
    assert_eq!(c.wait_replicas, 1);
    assert!(!c.tls);
    assert!(RedisConfig::from_url("rediss://h").unwrap().tls);
    assert!(
        RedisConfig::from_url("redis://h?fair=true")
            .unwrap()
            .is_fair()
    );
    assert!(!RedisConfig::from_url("redis://h").unwrap().is_fair());
    let err = RedisConfig::from_url("redlock://a,b,c?fair=true").unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::Unsupported, "{err}");
    assert!(RedisConfig::from_url("redlock://a,b,c?fair=false").is_ok());
    assert!(RedisConfig::from_url("redis+cluster://h?tls").unwrap().tls);
    // Older spellings of the shared options still read.
    let c = RedisConfig::from_url("redis://h?operation_timeout=3s&wait_replicas=2").unwrap();
    assert_eq!(
        (c.operation_timeout, c.wait_replicas),
        (Duration::from_secs(3), 2)
    );

    let c = RedisConfig::from_url("redis+sentinel://a:1,b,c:3/mymaster").unwrap();
    assert_eq!(
        c.topology,
        RedisTopology::Sentinel {
            sentinels: vec![
                RedisNode::new("a", 1),
                RedisNode::new("b", 26379),
                RedisNode::new("c", 3)
            ],
            master: "mymaster".into()
        }
    );
    let c = RedisConfig::from_url("redis+cluster://u:p@a:1,b:2?tls=true").unwrap();
    assert_eq!(
        c.topology,
        RedisTopology::Cluster(vec![RedisNode::new("a", 1), RedisNode::new("b", 2)])
    );
    assert_eq!(c.username.as_deref(), Some("u"));
    assert!(c.tls);
    let c = RedisConfig::from_url("redlock://a:1,b:2,[::1]:3/1").unwrap();
    assert_eq!(
        c.topology,
        RedisTopology::Redlock(vec![
            RedisNode::new("a", 1),
            RedisNode::new("b", 2),
            RedisNode::new("::1", 3)
        ])
    );
    assert_eq!(c.node_url(&RedisNode::new("::1", 3)), "redis://[::1]:3/1");
}

#[test]
fn parses_the_legacy_layouts() {
    let c = RedisConfig::from_url("redis://h?layout=plain").unwrap();
    assert_eq!(c.key_layout(), RedisLayout::Plain);
    assert_eq!(c.key_prefix(), "", "no default prefix in a legacy layout");
    assert_eq!(c.counter_suffix(), ":token");
    let c = RedisConfig::from_url("redis://h?prefix=app:&layout=redisson&token_suffix=.f").unwrap();
    assert_eq!(c.key_layout(), RedisLayout::Redisson);
    assert_eq!((c.key_prefix(), c.counter_suffix()), ("app:", ".f"));
    let c = RedisConfig::single("h", 1).layout(RedisLayout::Plain);
    assert_eq!(c.key_prefix(), "");
    let c = RedisConfig::single("h", 1)
        .prefix("x:")
        .unwrap()
        .layout(RedisLayout::Plain);
    assert_eq!(c.key_prefix(), "x:");
    assert_eq!(
        RedisConfig::from_url("redis://h?layout=native")
            .unwrap()
            .key_prefix(),
        DEFAULT_PREFIX
    );
    assert!(RedisConfig::from_url("redlock://a,b,c?layout=plain").is_ok());
    for (bad, kind) in [
        ("redis://h?layout=Plain", lock_core::ErrorKind::Config),
        (
            "redis://h?layout=plain&token_suffix=",
            lock_core::ErrorKind::Config,
        ),
        ("redis://h?token_suffix=.f", lock_core::ErrorKind::Config),
        (
            "redis://h?layout=plain&fair=true",
            lock_core::ErrorKind::Unsupported,
        ),
        (
            "redlock://a,b,c?layout=redisson",
            lock_core::ErrorKind::Unsupported,
        ),
    ] {
        let err = RedisConfig::from_url(bad).unwrap_err();
        assert_eq!(err.kind(), kind, "{bad}: {err}");
    }
}

#[test]
fn rejects_bad_urls_without_leaking_the_password() {
    for bad in [
        "",
        "redis",
        "http://h",
        "redis://:pw@h:0",
        "redis://:pw@h:99999",
        "redis://:pw@a,b",
        "redis://:pw@h/x",
        "redis://:pw@h/1/2",
        "redis://:pw@h?ttl=forever",
        "redis://:pw@h?prefix=%7Bx",
        "redis://:pw@h?bogus=1",
        "redis://:pw@h?timeout=0",
        "redis+sentinel://:pw@h",
        "redis+cluster://:pw@a,,b",
        "redis+cluster://:pw@a/3?x",
        "redlock://:pw@",
        "redis://:pw@[::1",
        "redis://:pw@::1",
        "redis://:pw@h?tls=",
        "redis://:pw@h?ttl=1s&ttl=2s",
        "redis://:pw@h?timeout=1s&operation_timeout=1s",
    ] {
        let err = RedisConfig::from_url(bad).unwrap_err();
        assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{bad}");
        assert!(!err.to_string().contains("pw"), "{err}");
    }
}

#[test]
fn debug_never_shows_the_password() {
    let c = RedisConfig::from_url("redis://user:hunter2@h?sentinel_password=swordfish").unwrap();
    let text = format!("{c:?}");
    assert!(
        !text.contains("hunter2") && !text.contains("swordfish"),
        "{text}"
    );
    assert!(text.contains("<redacted>"));
    assert_eq!(c.secrets().len(), 2);
}

#[test]
fn connections_per_server() {
    let per = |url: &str| RedisConfig::from_url(url).map(|c| c.connections_per_server());
    assert_eq!(per("redis://h").unwrap(), DEFAULT_CONNECTIONS);
    assert_eq!(per("redis://h?connections=1").unwrap(), 1);
    assert_eq!(per("redis://h?connections=4").unwrap(), 4);
    assert_eq!(per("redlock://a,b,c").unwrap(), 1);
    assert_eq!(per("redlock://a,b,c?connections=2").unwrap(), 2);
    assert_eq!(per("redis+sentinel://a/m").unwrap(), 1);
    assert_eq!(per("redis+cluster://a,b").unwrap(), 1);
    assert_eq!(per("redis+cluster://a,b?connections=1").unwrap(), 1);
    for bad in [
        "redis://h?connections=0",
        "redis://h?connections=65",
        "redis://h?connections=two",
        "redis+sentinel://a/m?connections=2",
        "redis+cluster://a,b?connections=2",
    ] {
        let err = RedisConfig::from_url(bad).unwrap_err();
        assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{bad}: {err}");
    }
    let built = RedisConfig::single("h", 1).connections(3);
    assert_eq!(built.connections_per_server(), 3);
    assert!(
        RedisConfig::single("h", 1)
            .connections(0)
            .validate()
            .is_err()
    );
}
