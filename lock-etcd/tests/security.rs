//! TLS (`etcds://` with `ca`, `cert`, `key`, `domain`) and user/password
//! authentication against real etcd servers started by the harness, with
//! certificates generated at test time (rcgen) in a temporary directory.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use conformance::deploy::{DeployedTarget, Single};
use conformance::process::run_setup;
use conformance::servers::etcd::{EtcdServer, etcdctl};
use conformance::{Harness, OrSkip, run_suite};
use lock_core::LockBackendExt;
use lock_core::{ErrorKind, LockBackend, LockError, LockKey};
use lock_etcd::{EtcdBackend, EtcdConfig};
use tokio::time::{Instant, timeout};

mod certs;
mod common;

use certs::Certs;

/// `url` with a short per-call timeout, so that failures are quick.
fn config(url: &str) -> EtcdConfig {
    EtcdConfig::from_url(url)
        .expect("valid URL")
        .op_timeout(Duration::from_secs(1))
}

/// Acquire (and see it held), renew, inspect, release, and acquire again.
async fn lock_cycle(backend: &EtcdBackend, name: &str) {
    let key = LockKey::new(name).unwrap();
    let lease = backend
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .expect("try_acquire")
        .expect("a free key is granted");
    let info = backend.inspect(&key).await.expect("inspect").expect("held");
    assert_eq!(info.token, Some(lease.token()));
    assert!(
        backend
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .expect("second try_acquire")
            .is_none(),
        "granted twice"
    );
    let deadline = backend.renew(&lease).await.expect("renew");
    assert!(deadline > Instant::now());
    assert!(backend.release(&lease).await.expect("release"));
    assert!(backend.inspect(&key).await.expect("inspect").is_none());
    let again = backend
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .expect("try_acquire after release")
        .expect("free again after release");
    assert!(again.token() > lease.token(), "tokens increase");
    assert!(backend.release(&again).await.expect("release"));
}

/// Connecting with `config` fails with a typed, retryable-kind error well
/// within its timeouts (no hang, no panic).
async fn assert_connect_fails(config: EtcdConfig, secret: Option<&str>) -> LockError {
    let bound = config.connect_timeout + config.op_timeout + Duration::from_secs(2);
    let start = Instant::now();
    let err = match timeout(bound, EtcdBackend::connect(config)).await {
        Err(_) => panic!("connect hung for more than {bound:?}"),
        Ok(Ok(_)) => panic!("connect succeeded where it must fail"),
        Ok(Err(err)) => err,
    };
    println!("connect failed after {:?}: {err}", start.elapsed());
    if let Some(secret) = secret {
        assert!(!err.to_string().contains(secret), "{err}");
        assert!(!format!("{err:?}").contains(secret), "{err:?}");
    }
    err
}

/// Fresh certificates and a TLS server with them (that requires client
/// certificates when `client_certs`); `None` when no etcd can be started.
async fn tls_server(client_certs: bool) -> Option<(Certs, EtcdServer)> {
    let certs = Certs::generate();
    let server = EtcdServer::start_tls(certs.server_files(client_certs))
        .await
        .or_skip()?;
    Some((certs, server))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_conformance_suite_and_lock_cycle() {
    let Some((certs, server)) = tls_server(false).await else {
        return;
    };
    let ca = certs.path("ca.pem");
    let url = server.url("tls", &format!("ca={}&ttl=1s", ca.display()));
    assert!(url.starts_with("etcds://"), "{url}");

    // The raw cycle over TLS, through the URL entry point.
    let backend = lock_etcd::connect(&url).await.expect("TLS connect");
    lock_cycle(&backend, "cycle").await;
    // `domain` overrides the name verified (the certificate names localhost).
    let named = config(&format!("{url}&domain=localhost"));
    let backend = EtcdBackend::connect(named).await.expect("domain=localhost");
    lock_cycle(&backend, "named").await;

    // A CA that did not sign the server's certificate.
    let wrong_ca = url.replace(
        &ca.display().to_string(),
        &certs.path("other-ca.pem").display().to_string(),
    );
    let err = assert_connect_fails(config(&wrong_ca), None).await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    // A name the certificate does not carry.
    let err = assert_connect_fails(config(&format!("{url}&domain=etcd.invalid")), None).await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    // Plain text against the TLS port.
    let plain = server
        .url("tls", "ttl=1s")
        .replacen("etcds://", "etcd://", 1);
    let err = assert_connect_fails(config(&plain), None).await;
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
    // A CA file that does not exist: a configuration error, no network.
    let missing = url.replace(&ca.display().to_string(), "/nonexistent/ca.pem");
    let err = assert_connect_fails(config(&missing), None).await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");

    // The whole shared suite over TLS: the TLS server as a one-server
    // deployment (no deployment kind starts one), every client a new
    // backend with the suite's options and the CA.
    let mut options = common::client_options();
    options.push(("ca", ca.display().to_string()));
    let target = DeployedTarget::new(
        Box::new(Single::new("etcd-tls", server, "")),
        common::opener(options),
    );
    let report = run_suite(&Harness::new(Arc::new(target))).await;
    println!("{}", report.table());
    report.assert_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_client_certificates() {
    let Some((certs, server)) = tls_server(true).await else {
        return;
    };
    let ca = certs.path("ca.pem").display().to_string();
    // The server's URL with our CA and the client certificate of `client`.
    let url_with_cert = |client: &Certs| {
        let cert = client.path("client.pem");
        let key = client.path("client-key.pem");
        let options = format!("ca={ca}&cert={}&key={}", cert.display(), key.display());
        server.url("mtls", &options)
    };
    let with_cert = url_with_cert(&certs);
    let backend = EtcdBackend::connect(config(&with_cert))
        .await
        .expect("connect with a client certificate");
    lock_cycle(&backend, "cycle").await;

    // Without a client certificate the server refuses the handshake (the
    // server just closes the connection, or sends an alert, depending on
    // timing: either way a typed error).
    let refused = |err: &LockError| {
        matches!(
            err.kind(),
            ErrorKind::Config | ErrorKind::Unavailable | ErrorKind::Timeout
        )
    };
    let err = assert_connect_fails(config(&server.url("mtls", &format!("ca={ca}"))), None).await;
    assert!(refused(&err), "{err}");
    // A client certificate from a CA the server does not trust.
    let foreign = Certs::generate();
    let untrusted = url_with_cert(&foreign);
    let err = assert_connect_fails(config(&untrusted), None).await;
    assert!(refused(&err), "{err}");
    // A certificate file that does not exist.
    let missing = with_cert.replace(
        &certs.path("client.pem").display().to_string(),
        "/nonexistent/client.pem",
    );
    let err = assert_connect_fails(config(&missing), None).await;
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}

/// Runs `etcdctl --endpoints=<endpoint> <args>` (v3 API), failing the test
/// on error.
fn etcdctl_run(etcdctl: &Path, endpoint: &str, user: Option<&str>, args: &[&str]) {
    let mut cmd = Command::new(etcdctl);
    cmd.env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://{endpoint}"))
        .arg("--dial-timeout=5s");
    if let Some(user) = user {
        cmd.arg(format!("--user={user}"));
    }
    cmd.args(args);
    run_setup(cmd, None, &format!("etcdctl {}", args.join(" "))).expect("etcdctl");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_password_authentication() {
    const PASSWORD: &str = "s3cr3t-Pa55";
    const WRONG: &str = "not-the-Pa55word";
    let Some(etcdctl) = etcdctl().or_skip() else {
        return;
    };
    let Some(server) = EtcdServer::start().await.or_skip() else {
        return;
    };
    let endpoint = server.endpoints()[0].clone();
    let root = format!("root:{PASSWORD}");
    etcdctl_run(
        &etcdctl,
        &endpoint,
        None,
        &["user", "add", &root, "--interactive=false"],
    );
    // A user allowed only under `app/`.
    etcdctl_run(
        &etcdctl,
        &endpoint,
        None,
        &[
            "user",
            "add",
            &format!("app:{PASSWORD}"),
            "--interactive=false",
        ],
    );
    etcdctl_run(&etcdctl, &endpoint, None, &["role", "add", "app-locks"]);
    etcdctl_run(
        &etcdctl,
        &endpoint,
        None,
        &[
            "role",
            "grant-permission",
            "app-locks",
            "--prefix=true",
            "readwrite",
            "app/",
        ],
    );
    etcdctl_run(
        &etcdctl,
        &endpoint,
        None,
        &["user", "grant-role", "app", "app-locks"],
    );
    etcdctl_run(&etcdctl, &endpoint, None, &["auth", "enable"]);
    // Auth is on: anonymous requests are refused now.
    let mut anonymous = Command::new(&etcdctl);
    anonymous
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=http://{endpoint}"))
        .args(["put", "x", "y"]);
    assert!(
        run_setup(anonymous, None, "anonymous put").is_err(),
        "auth is not enabled"
    );

    // Credentials in the URL, percent-encoding included.
    let url = |user: &str, password: &str, prefix: &str| {
        format!("etcd://{user}:{password}@{endpoint}/{prefix}?ttl=2s")
    };
    let backend = lock_etcd::connect(&url("root", PASSWORD, "locks"))
        .await
        .expect("root connects");
    lock_cycle(&backend, "cycle").await;
    // Credentials from the builder, a user limited to `app/`.
    let app = EtcdConfig::new([endpoint.clone()])
        .prefix("app")
        .credentials("app", PASSWORD)
        .op_timeout(Duration::from_secs(1));
    assert!(!format!("{app:?}").contains(PASSWORD));
    let backend = EtcdBackend::connect(app.clone())
        .await
        .expect("app connects");
    lock_cycle(&backend, "cycle").await;
    // The same user outside its prefix: a permission error, typed Config.
    let outside = EtcdBackend::connect(app.clone().prefix("other"))
        .await
        .expect("app connects (a lease needs no key permission)");
    let err = outside
        .try_acquire(&LockKey::new("k").unwrap(), Duration::from_secs(2))
        .await
        .expect_err("no permission outside app/");
    println!("outside the permitted prefix: {err}");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");

    // A wrong password: typed, bounded, and neither password is shown.
    for config in [
        EtcdConfig::from_url(&url("root", WRONG, "locks")).unwrap(),
        app.clone().credentials("app", WRONG),
        app.clone().credentials("nobody", PASSWORD),
    ] {
        let err = assert_connect_fails(config, Some(WRONG)).await;
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(!err.to_string().contains(PASSWORD), "{err}");
        assert!(!format!("{err:?}").contains(PASSWORD), "{err:?}");
    }
    // No credentials at all against an auth-enabled server.
    let err = match EtcdBackend::connect(
        EtcdConfig::new([endpoint.clone()])
            .prefix("locks")
            .op_timeout(Duration::from_secs(1)),
    )
    .await
    {
        Ok(backend) => backend
            .try_acquire(&LockKey::new("k").unwrap(), Duration::from_secs(2))
            .await
            .expect_err("anonymous acquire must fail"),
        Err(err) => err,
    };
    println!("anonymous: {err}");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
}
