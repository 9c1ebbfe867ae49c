//! One configuration struct, built from a URL or with a builder.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use lock_core::LockError;
use lock_core::endpoint::{Endpoint, HostPort, Secret};

/// The shortest TTL etcd leases have: one second (the server may raise it
/// further, to 1.5 election timeouts).
pub const MIN_TTL: Duration = Duration::from_secs(1);
/// The session TTL used when none is configured.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// The per-call timeout used when none is configured.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(2);
/// The port of an endpoint written without one (etcd's client port).
pub(crate) const DEFAULT_PORT: u16 = 2379;
/// The connect timeout used when none is configured.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The HTTP/2 keep-alive: a PING after this long without anything
/// received (also while no call is in flight), and the connection dropped
/// when its PONG takes longer.
const KEEP_ALIVE: (Duration, Duration) = (Duration::from_secs(2), Duration::from_secs(2));

/// TLS settings for `etcds://` URLs.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM file of the CA that signed the servers' certificates (the
    /// system's roots are not used: etcd clusters normally have their own CA).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for clusters that require client certificates.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of [`cert_file`](Self::cert_file).
    pub key_file: Option<PathBuf>,
    /// Server name to verify instead of the endpoint's host.
    pub domain: Option<String>,
}

impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            // The key file's path is not secret, but say only whether it is set.
            .field("key_file", &self.key_file.as_ref().map(|_| "<set>"))
            .field("domain", &self.domain)
            .finish()
    }
}

/// How to reach etcd and how locks are laid out in it.
///
/// Built from a URL ([`EtcdConfig::from_url`]) or with the builder methods.
/// `Debug` never prints the password.
///
/// ```
/// use std::time::Duration;
/// use lock_etcd::EtcdConfig;
///
/// let config = EtcdConfig::from_url("etcd://user:secret@10.0.0.1:2379,10.0.0.2:2379/locks?ttl=15s")?;
/// assert_eq!(config.endpoints.len(), 2);
/// assert_eq!(config.prefix, "locks");
/// assert_eq!(config.ttl, Duration::from_secs(15));
/// assert!(!format!("{config:?}").contains("secret"));
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `host:port` of each member (at least one).
    pub endpoints: Vec<String>,
    /// Key prefix: a lock named `k` lives under `<prefix>/k/` (just `k/`
    /// when the prefix is empty), which is what `etcdctl lock <prefix>/k` uses.
    pub prefix: String,
    /// TTL of the default session lease, granted at connect time. Locks
    /// requested with another TTL get a session of their own (see the crate
    /// docs: TTLs are per session and rounded up to whole seconds).
    pub ttl: Duration,
    /// Timeout of every single network call.
    pub op_timeout: Duration,
    /// Timeout for establishing a connection.
    pub connect_timeout: Duration,
    /// User name for etcd's authentication.
    pub user: Option<String>,
    /// Password for etcd's authentication (never printed).
    pub password: Option<String>,
    /// TLS settings; `Some` means `https` to every endpoint.
    pub tls: Option<EtcdTls>,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .field("op_timeout", &self.op_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl EtcdConfig {
    /// A configuration for the given endpoints (`host:port`) with defaults:
    /// no prefix, [`DEFAULT_TTL`], [`DEFAULT_OP_TIMEOUT`], no auth, no TLS.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: String::new(),
            ttl: DEFAULT_TTL,
            op_timeout: DEFAULT_OP_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            user: None,
            password: None,
            tls: None,
        }
    }

    /// Parses `etcd://[user[:password]@]host[:port][,host[:port]...][/prefix][?options]`
    /// (`etcds://` for TLS) with the family's URL rules
    /// ([`lock_core::endpoint`]); a host without a port gets
    /// 2379, etcd's client port.
    ///
    /// Options: `ttl` (session TTL: `10s`, `1500ms`, `2m`; a unit is
    /// required), `timeout` (per call; `op_timeout` is the older spelling),
    /// `connect_timeout`, `user`, `password`, and for TLS `ca` (or `cacert`),
    /// `cert`, `key` (file paths) and `domain`. User, password and prefix are
    /// percent-decoded.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for anything
    /// malformed or unknown (the message never contains the password).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::from_endpoint(Endpoint::parse(url)?)
    }

    /// The config of a parsed URL (what the facade hands the driver; see
    /// [`from_url`](Self::from_url) for the URL's form).
    ///
    /// # Errors
    ///
    /// As [`from_url`](Self::from_url).
    pub fn from_endpoint(mut url: Endpoint) -> Result<Self, LockError> {
        let tls = match url.scheme() {
            "etcd" => false,
            "etcds" => true,
            other => {
                return Err(LockError::config(format!(
                    "unknown URL scheme {other:?}: expected etcd:// or etcds://"
                )));
            }
        };
        let endpoints = url.hosts(Some(DEFAULT_PORT))?;
        let mut config = Self::new(endpoints.iter().map(ToString::to_string));
        config.prefix = url
            .path()?
            .trim_start_matches('/')
            .trim_end_matches('/')
            .to_owned();
        let (user, password) = url.take_credentials();
        if password.is_some() && user.is_none() {
            return Err(LockError::config(
                "the URL has credentials but no user name",
            ));
        }
        config.user = user;
        config.password = password.map(Secret::into_inner);
        let options = url.options();
        options.alias("op_timeout", "timeout")?;
        options.alias("cacert", "ca")?;
        if let Some(ttl) = options.duration("ttl")? {
            config.ttl = ttl;
        }
        if let Some(timeout) = options.duration("timeout")? {
            config.op_timeout = timeout;
        }
        if let Some(timeout) = options.duration("connect_timeout")? {
            config.connect_timeout = timeout;
        }
        if let Some(user) = options.text("user")? {
            config.user = Some(user);
        }
        if let Some(password) = options.secret("password")? {
            config.password = Some(password.into_inner());
        }
        let tls_config = EtcdTls {
            ca_file: options.path("ca")?,
            cert_file: options.path("cert")?,
            key_file: options.path("key")?,
            domain: options.text("domain")?,
        };
        options.finish("etcd")?;
        if tls {
            config.tls = Some(tls_config);
        } else if tls_config != EtcdTls::default() {
            return Err(LockError::config(
                "TLS options (ca, cert, key, domain) need an etcds:// URL",
            ));
        }
        config.validate()?;
        Ok(config)
    }

    /// Sets the key prefix.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets the default session TTL.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the per-call timeout.
    #[must_use]
    pub fn op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// Sets user and password for etcd's authentication.
    #[must_use]
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Turns TLS on with these settings.
    #[must_use]
    pub fn tls(mut self, tls: EtcdTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Checks the configuration without connecting.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for no endpoint,
    /// a malformed endpoint, a zero timeout, a TTL below one second or above
    /// [`MAX_TTL`](lock_core::MAX_TTL), a password without a user, or a client
    /// certificate without its key.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.endpoints.is_empty() {
            return Err(LockError::config("at least one etcd endpoint is needed"));
        }
        for endpoint in &self.endpoints {
            HostPort::parse(endpoint, None)?;
        }
        if self.ttl < Duration::from_secs(1) || self.ttl > lock_core::MAX_TTL {
            return Err(LockError::config(format!(
                "etcd session TTL must be between 1 s and {:?}, got {:?}",
                lock_core::MAX_TTL,
                self.ttl
            )));
        }
        if self.op_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(LockError::config("timeouts must be positive"));
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(LockError::config("a password needs a user"));
        }
        if let Some(tls) = &self.tls
            && tls.cert_file.is_some() != tls.key_file.is_some()
        {
            return Err(LockError::config(
                "a TLS client certificate needs its key (and the other way round)",
            ));
        }
        if self.prefix.chars().any(char::is_control) {
            return Err(LockError::config("the prefix contains a control character"));
        }
        Ok(())
    }

    /// The endpoints as the driver hands them to `etcd-client`, with
    /// their scheme (`https://` with TLS, else `http://`).
    pub fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|endpoint| format!("{scheme}://{endpoint}"))
            .collect()
    }

    /// The `etcd-client` options the driver connects its client with:
    /// leader required, the connect timeout, an HTTP/2 keep-alive (a PING
    /// after 2 s without anything received, also while idle, 2 s to
    /// answer it), the credentials and TLS. Public so that a comparison
    /// with the client library alone (`lock-bench`, `distlock-compare`)
    /// opens the same client: `Client::connect(config.endpoint_urls(),
    /// Some(config.client_options()?))`.
    ///
    /// What these options cost a cycle, measured: `etcd-client` on its own
    /// channel with these options against the same with none
    /// (`etcd_parts`, `taskset -c 0`, 2,000 cycles, 4 runs): client CPU
    /// about 3 µs (1.5%) of about 215 µs a cycle, p50 about 8 µs (under
    /// 2%); with the keep-alive or the leader requirement turned off, about
    /// half that each. They buy the failure behaviour (a dead connection
    /// dropped within 4 s, an error at once from a member without a
    /// leader instead of a wait), so they stay. No option `etcd-client` exposes makes a cycle cheaper:
    /// `TCP_NODELAY` is already tonic's default, the rest (a request
    /// timeout, TCP keep-alive, credentials, TLS) add work or none; tonic's
    /// window and buffer settings are not reachable through
    /// `ConnectOptions` (only through a channel of one's own).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) when a TLS file
    /// cannot be read.
    pub fn client_options(&self) -> Result<ConnectOptions, LockError> {
        let (interval, timeout) = KEEP_ALIVE;
        let mut options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(self.connect_timeout)
            .with_keep_alive(interval, timeout)
            .with_keep_alive_while_idle(true);
        if let Some(user) = &self.user {
            options = options.with_user(user.clone(), self.password.clone().unwrap_or_default());
        }
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls_options(tls)?);
        }
        Ok(options)
    }
}

/// The client's TLS from the configuration: the CA's certificates as the
/// roots, the client certificate if given, the server name if given.
fn tls_options(tls: &EtcdTls) -> Result<TlsOptions, LockError> {
    let read = |path: &Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            LockError::config(format!(
                "cannot read the TLS {what} file {}",
                path.display()
            ))
            .with_source(e)
        })
    };
    let mut options = TlsOptions::new();
    if let Some(ca) = &tls.ca_file {
        options = options.ca_certificate(Certificate::from_pem(read(ca, "CA")?));
    }
    if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
        options = options.identity(Identity::from_pem(
            read(cert, "certificate")?,
            read(key, "key")?,
        ));
    }
    if let Some(domain) = &tls.domain {
        options = options.domain_name(domain.clone());
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_urls() {
        let c = EtcdConfig::from_url(
            "etcds://al%40ice:p%3Ass@h1:2379,10.0.0.2:2380/my%2Flocks/?ttl=1500ms&timeout=3s&ca=/tmp/ca.pem&domain=etcd",
        )
        .unwrap();
        assert_eq!(c.endpoints, vec!["h1:2379", "10.0.0.2:2380"]);
        assert_eq!(c.prefix, "my/locks");
        assert_eq!(c.ttl, Duration::from_millis(1500));
        assert_eq!(c.op_timeout, Duration::from_secs(3));
        assert_eq!(c.user.as_deref(), Some("al@ice"));
        assert_eq!(c.password.as_deref(), Some("p:ss"));
        let tls = c.tls.clone().unwrap();
        assert_eq!(tls.ca_file, Some(PathBuf::from("/tmp/ca.pem")));
        assert_eq!(tls.domain.as_deref(), Some("etcd"));
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("p:ss") && debug.contains("redacted"),
            "{debug}"
        );
    }

    #[test]
    fn a_host_without_a_port_gets_etcds_client_port() {
        let c = EtcdConfig::from_url("etcd://a,[::1]:2380?op_timeout=3s").unwrap();
        assert_eq!(c.endpoints, vec!["a:2379", "[::1]:2380"]);
        assert_eq!(
            c.op_timeout,
            Duration::from_secs(3),
            "older spelling of timeout"
        );
    }

    #[test]
    fn defaults_and_minimal_url() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.prefix, "");
        assert_eq!(c.ttl, DEFAULT_TTL);
        assert!(c.tls.is_none());
        assert!(c.user.is_none());
    }

    #[test]
    fn rejects_bad_urls_without_panicking() {
        for bad in [
            "",
            "etcd",
            "redis://h:1",
            "etcd://",
            "etcd://host:notaport",
            "etcd://host:0",
            "etcd://h:1,,h:2",
            "etcd://h:1/?ttl=abc",
            "etcd://h:1/?ttl=0",
            "etcd://h:1/?ttl=99999999999999999999",
            "etcd://h:1/?ttl=5x",
            "etcd://h:1/?bogus=1",
            "etcd://h:1/?ca=/x",
            "etcd://h:1/?timeout=0",
            "etcd://:pw@h:1",
            "etcds://h:1/?cert=/c",
            "etcd://h:1/%ff",
            "etcd://h:1/a%00b",
            "etcd://h:1/?ttl=1s&ttl=2s",
            "etcd://h:1/?domain",
        ] {
            let err = EtcdConfig::from_url(bad).unwrap_err();
            assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{bad}");
        }
    }

    #[test]
    fn errors_never_show_the_password() {
        let err = EtcdConfig::from_url("etcd://u:hunter2@h:1/?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
        assert!(!format!("{err:?}").contains("hunter2"));
    }
}
