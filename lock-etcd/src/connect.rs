//! Connecting an etcd client: endpoints, timeouts, credentials and TLS.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use lock_core::{LockError, Operation, with_timeout};

use crate::channel::BareChannel;
use crate::config::EtcdConfig;
use crate::error::from_etcd;

/// The HTTP/2 keep-alive: a PING after this long without anything
/// received, and the connection dropped when its PONG takes longer.
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(2));

/// Validates `config` and connects an etcd client with it (no lease yet).
pub(crate) async fn connect_client(config: &EtcdConfig) -> Result<Client, LockError> {
    config.validate()?;
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_keep_alive(KEEP_ALIVE.0, KEEP_ALIVE.1)
        .with_require_leader(true);
    if let Some(user) = &config.user {
        options = options.with_user(user.clone(), config.password.clone().unwrap_or_default());
    }
    let Some(tls) = &config.tls else {
        // Plaintext: the driver's own channel (see `channel.rs`).
        let channel = BareChannel::new(&config.endpoints, config.connect_timeout, KEEP_ALIVE)
            .map_err(LockError::config)?;
        let channel = etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(channel));
        return with_timeout(
            config.connect_timeout + config.op_timeout,
            Operation::Connect,
            async {
                Client::from_channel(channel, Some(options))
                    .await
                    .map_err(|e| from_etcd(Operation::Connect, e))
            },
        )
        .await;
    };
    options = options.with_tls(tls_options(tls)?);
    let endpoints: Vec<String> = config
        .endpoints
        .iter()
        .map(|e| format!("https://{e}"))
        .collect();
    with_timeout(
        config.connect_timeout + config.op_timeout,
        Operation::Connect,
        async {
            Client::connect(&endpoints, Some(options))
                .await
                .map_err(|e| from_etcd(Operation::Connect, e))
        },
    )
    .await
}

fn tls_options(tls: &crate::config::EtcdTls) -> Result<etcd_client::TlsOptions, LockError> {
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            LockError::config(format!(
                "cannot read the TLS {what} file {}",
                path.display()
            ))
            .with_source(e)
        })
    };
    let mut options = etcd_client::TlsOptions::new();
    if let Some(ca) = &tls.ca_file {
        options = options.ca_certificate(etcd_client::Certificate::from_pem(read(ca, "CA")?));
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        options = options.identity(etcd_client::Identity::from_pem(
            read(cert, "certificate")?,
            read(key, "key")?,
        ));
    }
    if let Some(domain) = &tls.domain {
        options = options.domain_name(domain.clone());
    }
    Ok(options)
}
