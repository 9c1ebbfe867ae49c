//! Certificates for TLS tests and probes, generated with rcgen into a
//! temporary directory: a CA, a server certificate for `127.0.0.1` /
//! `localhost`, a client certificate, and an unrelated CA.
//! (`tests/security.rs`; `lock-bench/examples/etcd_tls.rs` includes it by path.)

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

use conformance::servers::etcd::EtcdTlsFiles;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;

/// A CA, a server certificate for `127.0.0.1` / `localhost` and a client
/// certificate signed by it, and an unrelated CA, as PEM files.
pub struct Certs {
    dir: TempDir,
}

impl Certs {
    pub fn generate() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("etcd-certs-")
            .tempdir()
            .expect("temp dir");
        let ca = new_ca("distlock test CA");
        let other_ca = new_ca("some other CA");
        write(dir.path(), "ca.pem", &ca.pem());
        write(dir.path(), "other-ca.pem", &other_ca.pem());

        for (name, sans, usages) in [
            (
                "server",
                vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
                // etcd's own gateway dials the server with this certificate
                // as a client certificate when client certificates are on.
                vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ],
            ),
            (
                "client",
                vec!["distlock-client".to_owned()],
                vec![ExtendedKeyUsagePurpose::ClientAuth],
            ),
        ] {
            let key = KeyPair::generate().expect("key");
            let mut params = CertificateParams::new(sans).expect("params");
            params.distinguished_name.push(DnType::CommonName, name);
            params.extended_key_usages = usages;
            let cert = params.signed_by(&key, &*ca).expect("signing");
            write(dir.path(), &format!("{name}.pem"), &cert.pem());
            write(dir.path(), &format!("{name}-key.pem"), &key.serialize_pem());
        }
        Self { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn server_files(&self, client_certs: bool) -> EtcdTlsFiles {
        EtcdTlsFiles {
            cert: self.path("server.pem"),
            key: self.path("server-key.pem"),
            client_ca: client_certs.then(|| self.path("ca.pem")),
        }
    }
}

fn new_ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.distinguished_name.push(DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("key")).expect("CA")
}

fn write(dir: &Path, name: &str, contents: &str) {
    std::fs::write(dir.join(name), contents).expect("writing a PEM file");
}
