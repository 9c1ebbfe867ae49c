//! Connecting an etcd client: endpoints, timeouts, credentials and TLS.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use lock_core::{LockError, Operation, with_timeout};

use crate::channel::{BareChannel, ChannelTls};
use crate::config::{EtcdConfig, EtcdTls};
use crate::error::from_etcd;

/// The HTTP/2 keep-alive: a PING after this long without anything
/// received, and the connection dropped when its PONG takes longer.
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(2));

/// Validates `config` and connects an etcd client with it (no lease yet).
pub(crate) async fn connect_client(config: &EtcdConfig) -> Result<Client, LockError> {
    config.validate()?;
    // The channel does the connecting, the keep-alive and TLS; these are
    // what `etcd-client` adds above it.
    let mut options = ConnectOptions::new().with_require_leader(true);
    if let Some(user) = &config.user {
        options = options.with_user(user.clone(), config.password.clone().unwrap_or_default());
    }
    let tls = config.tls.as_ref().map(channel_tls).transpose()?;
    let channel = BareChannel::new(&config.endpoints, config.connect_timeout, KEEP_ALIVE, tls)
        .map_err(LockError::config)?;
    let channel = etcd_client::Channel::Custom(tower::util::BoxCloneSyncService::new(channel));
    with_timeout(
        config.connect_timeout + config.op_timeout,
        Operation::Connect,
        async {
            Client::from_channel(channel, Some(options))
                .await
                .map_err(|e| from_etcd(Operation::Connect, e))
        },
    )
    .await
}

/// The channel's TLS from the configuration: the CA's certificates as the
/// only roots, the client certificate if given, ALPN `h2`.
fn channel_tls(tls: &EtcdTls) -> Result<ChannelTls, LockError> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto};

    let read = |path: &Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            LockError::config(format!(
                "cannot read the TLS {what} file {}",
                path.display()
            ))
            .with_source(e)
        })
    };
    let bad_pem = |path: &Path, what: &str, e: &dyn std::fmt::Display| {
        LockError::config(format!(
            "the TLS {what} file {} holds no usable PEM: {e}",
            path.display()
        ))
    };
    let mut roots = RootCertStore::empty();
    if let Some(ca) = &tls.ca_file {
        let pem = read(ca, "CA")?;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| bad_pem(ca, "CA", &e))?;
            roots.add(cert).map_err(|e| bad_pem(ca, "CA", &e))?;
        }
    }
    let builder = ClientConfig::builder_with_provider(Arc::new(crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| LockError::config(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let mut config = match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            let certs = CertificateDer::pem_slice_iter(&read(cert, "certificate")?)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad_pem(cert, "certificate", &e))?;
            let private = PrivateKeyDer::from_pem_slice(&read(key, "key")?)
                .map_err(|e| bad_pem(key, "key", &e))?;
            builder
                .with_client_auth_cert(certs, private)
                .map_err(|e| LockError::config(format!("TLS client certificate: {e}")))?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(ChannelTls {
        connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        domain: tls.domain.clone(),
    })
}
