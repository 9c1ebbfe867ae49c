//! This driver's entry in the family ([`lock_core::driver`]).

use lock_core::driver::Driver;

/// The ZooKeeper driver.
pub static DRIVER: Driver = Driver {
    name: "zk",
    schemes: &["zk", "zookeeper"],
    default_ports: &[("zk", 2181), ("zookeeper", 2181)],
    summary: "zk://host[:port][,host[:port]...][/chroot]",
    connect,
    capabilities: Some(|url| {
        crate::ZkConfig::from_endpoint(url.clone())?;
        Ok(crate::capabilities())
    }),
};

lock_core::connect_fn!(fn connect = crate::open);

#[cfg(test)]
mod tests {
    use lock_core::ErrorKind;

    use super::DRIVER;

    #[test]
    fn capabilities_come_from_the_url_alone() {
        let from_url = DRIVER
            .capabilities
            .expect("capabilities without connecting");
        let of = |url: &str| from_url(&lock_core::endpoint::Endpoint::parse(url)?);
        // Nothing listens there: no connection is made.
        assert_eq!(
            of("zk://127.0.0.1:1,127.0.0.1:2/app?session_timeout=4s").expect("caps"),
            crate::capabilities()
        );
        for bad in ["zk://", "zk://h:1?op_timeout=1s&timeout=1s", "zk://h:1?x=1"] {
            assert_eq!(of(bad).unwrap_err().kind(), ErrorKind::Config, "{bad}");
        }
    }
}
