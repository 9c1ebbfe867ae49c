//! TLS (`rediss://`) against a real redis-server started with `--tls-port`
//! only, with a CA and a server certificate generated here (rcgen): the
//! shared conformance suite over `rediss://...?ca=<file>`, the lock
//! operations one by one, and the failures (untrusted CA, system roots,
//! plain `redis://` on the TLS port, bad CA files) as typed errors in
//! bounded time.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::opener_with;
use conformance::deploy::{DeployedTarget, Single};
use conformance::servers::redis::RedisServer;
use conformance::{Harness, HarnessError, OrSkip, run_suite};
use lock_core::{ErrorKind, LockBackend, LockBackendExt, LockError, LockKey};
use lock_redis::{RedisBackend, RedisConfig};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tempfile::TempDir;
use tokio::time::Instant;

/// Suites run one at a time: they measure timing on a shared machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A failing connection must report within this (operation timeout 1 s).
const BOUND: Duration = Duration::from_secs(5);

/// A CA, a server certificate it signed (127.0.0.1 and localhost), and an
/// unrelated second CA, as PEM files in a temp dir.
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
    fn other_ca(&self) -> PathBuf {
        self.dir.path().join("other-ca.pem")
    }
    fn cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }
    fn key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn make_pki() -> Result<Pki, HarnessError> {
    let dir = conformance::process::temp_dir("redis-tls-pki-")?;
    let pki = Pki { dir };

    let ca_key = KeyPair::generate().expect("CA key");
    let ca = ca_params("distlock test CA");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate().expect("server key");
    let mut server_params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("server params");
    server_params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let server_cert = server_params
        .signed_by(&server_key, &issuer)
        .expect("server certificate");

    let other_key = KeyPair::generate().expect("other CA key");
    let other_ca = ca_params("unrelated CA")
        .self_signed(&other_key)
        .expect("other CA certificate");

    std::fs::write(pki.ca(), ca_cert.pem())?;
    std::fs::write(pki.other_ca(), other_ca.pem())?;
    std::fs::write(pki.cert(), server_cert.pem())?;
    std::fs::write(pki.key(), server_key.serialize_pem())?;
    Ok(pki)
}

async fn start() -> Result<(Pki, RedisServer), HarnessError> {
    let pki = make_pki()?;
    let server = RedisServer::start_tls(&pki.cert(), &pki.key(), &pki.ca()).await?;
    Ok((pki, server))
}

fn tls_url(port: u16, ca: &Path) -> String {
    format!("rediss://127.0.0.1:{port}?ca={}&timeout=1s", ca.display())
}

fn key(name: &str) -> LockKey {
    LockKey::new(name).expect("valid key")
}

/// Connects and runs one operation, returning the error; panics when it
/// succeeds or takes longer than [`BOUND`].
async fn must_fail(url: &str) -> LockError {
    let started = Instant::now();
    let result = tokio::time::timeout(BOUND * 2, async {
        let backend = RedisBackend::connect(RedisConfig::from_url(url)?).await?;
        backend.inspect(&key("tls/never")).await
    })
    .await
    .unwrap_or_else(|_| panic!("{url}: still running after {:?}", BOUND * 2));
    let elapsed = started.elapsed();
    let err = result.expect_err("connecting must fail");
    assert!(
        elapsed < BOUND,
        "{url}: failed only after {elapsed:?}: {err}"
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn suite_over_tls() {
    let Some((pki, server)) = start().await.or_skip() else {
        return;
    };
    let _serial = SERIAL.lock().await;
    // The server as a deployment (pause, kill-and-restart, a proxied
    // client); its URL `redis://127.0.0.1:<port>` is opened as
    // `rediss://...?ca=<file>` (the proxy keeps 127.0.0.1, which the
    // certificate names).
    let ca = pki.ca();
    let opener = opener_with(move |url| {
        let url = url.replacen("redis://", "rediss://", 1);
        format!("{url}?ca={}", ca.display())
    });
    let target = DeployedTarget::new(Box::new(Single::new("redis-tls", server, "")), opener);
    let harness = Harness::new(Arc::new(target));
    run_suite(&harness).await.assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_operations_and_notified_wait_over_tls() {
    let Some((pki, server)) = start().await.or_skip() else {
        return;
    };
    let url = tls_url(server.port(), &pki.ca());
    let a = RedisBackend::connect(RedisConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let b = RedisBackend::connect(RedisConfig::from_url(&url).unwrap())
        .await
        .unwrap();
    let k = key("tls/job");
    let ttl = Duration::from_secs(10);

    let lease = a.try_acquire(&k, ttl).await.unwrap().expect("free");
    assert!(b.try_acquire(&k, ttl).await.unwrap().is_none(), "held");
    let info = b
        .inspect(&k)
        .await
        .unwrap()
        .expect("inspect sees the holder");
    assert_eq!(info.token, Some(lease.token()));
    assert_eq!(info.holder, lease.owner().to_hex());
    a.renew(&lease).await.unwrap();

    // A waiter on the other client is woken by the release notification
    // (over the TLS pub/sub connection), long before the TTL would expire.
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let got = b
            .acquire(
                &key("tls/job"),
                ttl,
                Instant::now() + Duration::from_secs(8),
            )
            .await;
        (got, started.elapsed(), b)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(a.release(&lease).await.unwrap());
    let (got, waited, b) = waiter.await.unwrap();
    let second = got.unwrap();
    assert!(
        waited < Duration::from_secs(3),
        "the waiter took {waited:?} after a release at ~300ms"
    );
    assert!(second.token() > lease.token(), "fencing token increases");
    assert!(b.release(&second).await.unwrap());
    assert!(a.inspect(&k).await.unwrap().is_none());

    // `localhost` is in the certificate too.
    let by_name = format!(
        "rediss://localhost:{}?ca={}&timeout=1s",
        server.port(),
        pki.ca().display()
    );
    let c = RedisBackend::connect(RedisConfig::from_url(&by_name).unwrap())
        .await
        .unwrap();
    assert!(c.inspect(&k).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_server_certificates_fail_fast_with_a_typed_error() {
    let Some((pki, server)) = start().await.or_skip() else {
        return;
    };
    let port = server.port();
    // A CA that did not sign the server certificate.
    let err = must_fail(&tls_url(port, &pki.other_ca())).await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    // No `ca`: the system trust store does not know the test CA.
    let err = must_fail(&format!("rediss://127.0.0.1:{port}?timeout=1s")).await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    // `insecure=true` skips verification: it connects (and says so in the docs).
    let insecure = format!("rediss://127.0.0.1:{port}?insecure=true&timeout=1s");
    let backend = RedisBackend::connect(RedisConfig::from_url(&insecure).unwrap())
        .await
        .unwrap();
    assert!(
        backend
            .inspect(&key("tls/insecure"))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_redis_on_the_tls_port_fails_fast_with_a_typed_error() {
    let Some((_pki, server)) = start().await.or_skip() else {
        return;
    };
    let err = must_fail(&format!("redis://127.0.0.1:{}?timeout=1s", server.port())).await;
    println!("plain redis:// on the TLS port: {err}");
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_options_are_config_errors() {
    let Some(pki) = make_pki().or_skip() else {
        return;
    };
    let ca = pki.ca();
    let garbage = pki.dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let missing = pki.dir.path().join("missing.pem");
    for url in [
        format!("redis://127.0.0.1:1?ca={}", ca.display()),
        "redis://127.0.0.1:1?insecure=true".to_owned(),
        format!("rediss://127.0.0.1:1?ca={}&insecure=true", ca.display()),
        format!(
            "rediss+cluster://127.0.0.1:1,127.0.0.1:2?ca={}",
            ca.display()
        ),
        "rediss://127.0.0.1:1?insecure=maybe".to_owned(),
        "rediss://127.0.0.1:1?ca=".to_owned(),
    ] {
        let err = RedisConfig::from_url(&url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
    }
    for file in [&missing, &garbage] {
        let url = format!("rediss://127.0.0.1:1?ca={}&timeout=1s", file.display());
        let err = must_fail(&url).await;
        assert_eq!(err.kind(), ErrorKind::Config, "{url}: {err}");
    }
}
