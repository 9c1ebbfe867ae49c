//! Connecting an etcd client: endpoints, timeouts, credentials and TLS.

use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use lock_core::{LockError, Operation, with_timeout};

use crate::config::EtcdConfig;
use crate::error::from_etcd;

/// Validates `config` and connects an etcd client with it (no lease yet).
pub(crate) async fn connect_client(config: &EtcdConfig) -> Result<Client, LockError> {
    config.validate()?;
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
        .with_require_leader(true);
    if let Some(user) = &config.user {
        options = options.with_user(user.clone(), config.password.clone().unwrap_or_default());
    }
    let scheme = if config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    if let Some(tls) = &config.tls {
        options = options.with_tls(tls_options(tls)?);
    }
    let endpoints: Vec<String> = config
        .endpoints
        .iter()
        .map(|e| format!("{scheme}://{e}"))
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
