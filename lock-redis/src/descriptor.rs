//! This driver's entry in the family ([`lock_core::driver`]).

use lock_core::driver::Driver;

/// The Redis driver: one server, Sentinel, Cluster and Redlock.
pub static DRIVER: Driver = Driver {
    name: "redis",
    schemes: &[
        "redis",
        "rediss",
        "redis+sentinel",
        "rediss+sentinel",
        "redis+cluster",
        "rediss+cluster",
        "redlock",
    ],
    default_ports: &[
        ("redis", 6379),
        ("rediss", 6379),
        ("redis+sentinel", 26379),
        ("rediss+sentinel", 26379),
        ("redis+cluster", 6379),
        ("rediss+cluster", 6379),
        ("redlock", 6379),
    ],
    summary: "redis://host[:port][/db], redis+sentinel://, redis+cluster://, redlock://a,b,c",
    connect,
    // From the URL alone (Redlock changes fencing); nothing connects.
    capabilities: Some(|url| {
        let config = crate::RedisConfig::from_endpoint(url.clone())?;
        config.validate()?;
        Ok(crate::capabilities(&config))
    }),
};

lock_core::connect_fn!(fn connect = crate::open);

#[cfg(test)]
mod tests {
    use lock_core::{ErrorKind, FencingScope};

    use super::DRIVER;

    #[test]
    fn capabilities_come_from_the_url_alone() {
        let from_url = DRIVER
            .capabilities
            .expect("capabilities without connecting");
        let of = |url: &str| from_url(&lock_core::endpoint::Endpoint::parse(url)?);
        // Nothing listens on port 1: no connection is made.
        let single = of("redis://127.0.0.1:1/2?ttl=5s").expect("caps");
        assert_eq!(single.fencing, FencingScope::PerKey);
        for url in [
            "rediss://127.0.0.1:1",
            "redis+sentinel://127.0.0.1:1,127.0.0.1:2/locks",
            "redis+cluster://127.0.0.1:1,127.0.0.1:2",
        ] {
            assert_eq!(of(url).expect("caps"), single, "{url}");
        }
        let redlock = of("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3").expect("caps");
        assert_eq!(redlock.fencing, FencingScope::None);
        assert_eq!(
            redlock,
            lock_core::Capabilities {
                fencing: FencingScope::None,
                shared_locks: false,
                semaphores: false,
                ..single
            },
            "only fencing and the shared kinds differ"
        );
        assert!(single.shared_locks && single.semaphores);
        // Fair mode (`fair=true`) is FIFO and nothing else changes;
        // Redlock refuses it.
        for url in [
            "redis://127.0.0.1:1?fair=true",
            "redis+sentinel://127.0.0.1:1/locks?fair=true",
            "redis+cluster://127.0.0.1:1,127.0.0.1:2?fair=true",
        ] {
            let fair = of(url).expect("caps");
            assert_eq!(
                fair,
                lock_core::Capabilities {
                    fifo: true,
                    ..single
                },
                "{url}"
            );
        }
        assert!(!single.fifo);
        let err = of("redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?fair=true").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        for bad in [
            "redis://",
            "redis://h:1?x=1",
            "redis://h:1?ttl=soon",
            "redis+sentinel://h:1",
            "redis+cluster://h:1/3",
        ] {
            assert_eq!(of(bad).unwrap_err().kind(), ErrorKind::Config, "{bad}");
        }
    }
}
