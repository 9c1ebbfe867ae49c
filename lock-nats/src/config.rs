//! [`NatsConfig`]: servers, bucket and timeouts, from a
//! `nats://host:port[,host:port]/bucket` URL or built by hand.

use std::fmt;
use std::time::Duration;

use lock_core::LockError;
use lock_core::endpoint::{Endpoint, HostPort, Secret};

use crate::NAME;

/// NATS's client port.
pub const DEFAULT_PORT: u16 = 4222;
/// How long one request (a KV create, update, purge or read) may take.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long connecting (TCP and the NATS handshake) may take.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the locks live: a JetStream key-value bucket.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsConfig {
    pub(crate) servers: Vec<HostPort>,
    pub(crate) bucket: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<Secret>,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) replicas: Option<usize>,
}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("servers", &self.servers)
            .field("bucket", &self.bucket)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("replicas", &self.replicas)
            .finish()
    }
}

impl NatsConfig {
    /// The bucket `bucket` on `servers` (`host:port` each), default
    /// timeouts, no credentials.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for an invalid
    /// bucket name (`[A-Za-z0-9_-]+`) or no server.
    pub fn new(servers: Vec<HostPort>, bucket: impl Into<String>) -> Result<Self, LockError> {
        let bucket = bucket.into();
        check_bucket(&bucket)?;
        if servers.is_empty() {
            return Err(
                LockError::config("a NATS URL names at least one server").with_backend(NAME)
            );
        }
        Ok(Self {
            servers,
            bucket,
            user: None,
            password: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            replicas: None,
        })
    }

    /// Reads `nats://[user:password@]host[:port][,host[:port]...]/bucket`
    /// with the options `timeout`, `connect_timeout` (durations) and
    /// `replicas` (the bucket's replica count when this backend creates
    /// it; default 1, at most 5).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for another
    /// scheme, no host, no bucket or more than one path segment, an invalid
    /// bucket name, an unknown option or a malformed value.
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        Self::from_endpoint(Endpoint::parse(url).map_err(|e| e.with_backend(NAME))?)
    }

    /// The config of a parsed URL (what the facade hands the driver; see
    /// [`from_url`](Self::from_url) for the URL's form).
    ///
    /// # Errors
    ///
    /// As [`from_url`](Self::from_url).
    pub fn from_endpoint(mut endpoint: Endpoint) -> Result<Self, LockError> {
        const FORM: &str = "a NATS URL is nats://host:port[,host:port]/bucket";
        if endpoint.scheme() != "nats" || !endpoint.has_authority() {
            return Err(LockError::config(FORM).with_backend(NAME));
        }
        let servers = endpoint
            .hosts(Some(DEFAULT_PORT))
            .map_err(|e| e.with_backend(NAME))?;
        let segments = endpoint.path_segments().map_err(|e| e.with_backend(NAME))?;
        let [bucket] = segments.as_slice() else {
            return Err(
                LockError::config(format!("{FORM}: one bucket name in the path"))
                    .with_backend(NAME),
            );
        };
        let mut config = Self::new(servers, bucket.clone())?;
        let (user, password) = endpoint.take_credentials();
        config.user = user;
        config.password = password;
        let options = endpoint.options();
        if let Some(timeout) = options.duration("timeout")? {
            config.timeout = positive(timeout, "timeout")?;
        }
        if let Some(timeout) = options.duration("connect_timeout")? {
            config.connect_timeout = positive(timeout, "connect_timeout")?;
        }
        if let Some(replicas) = options.number::<usize>("replicas")? {
            if !(1..=5).contains(&replicas) {
                return Err(LockError::config("replicas is 1 to 5").with_backend(NAME));
            }
            config.replicas = Some(replicas);
        }
        options.finish(NAME)?;
        Ok(config)
    }

    /// Sets the user name and password.
    #[must_use]
    pub fn credentials(mut self, user: &str, password: &str) -> Self {
        self.user = Some(user.to_owned());
        self.password = Some(Secret::new(password));
        self
    }

    /// Sets the timeout of each request.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the connect timeout.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the replica count of a bucket this backend creates.
    #[must_use]
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = Some(replicas);
        self
    }

    /// The bucket.
    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    /// The servers.
    pub fn servers(&self) -> &[HostPort] {
        &self.servers
    }

    /// The request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.timeout
    }
}

fn positive(value: Duration, name: &str) -> Result<Duration, LockError> {
    if value.is_zero() {
        return Err(LockError::config(format!("{name} must be positive")).with_backend(NAME));
    }
    Ok(value)
}

fn check_bucket(bucket: &str) -> Result<(), LockError> {
    let valid = !bucket.is_empty()
        && bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(LockError::config(format!(
            "bucket name {bucket:?}: JetStream bucket names are [A-Za-z0-9_-]+"
        ))
        .with_backend(NAME))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::ErrorKind;

    #[test]
    fn urls_name_servers_and_a_bucket() {
        let c = NatsConfig::from_url("nats://127.0.0.1:4333,127.0.0.2/locks?timeout=2s&replicas=3")
            .unwrap();
        assert_eq!(
            c.servers(),
            &[
                HostPort::new("127.0.0.1", 4333),
                HostPort::new("127.0.0.2", 4222)
            ]
        );
        assert_eq!(c.bucket(), "locks");
        assert_eq!(c.request_timeout(), Duration::from_secs(2));
        assert_eq!(c.replicas, Some(3));
        let c = NatsConfig::from_url("nats://u:secret@h/b").unwrap();
        assert!(!format!("{c:?}").contains("secret"));
    }

    #[test]
    fn bad_urls_are_config_errors() {
        for bad in [
            "nats://h",
            "nats://h/",
            "nats://h/a/b",
            "nats://h/a.b",
            "nats://h/b?ttl=1s",
            "nats://h/b?timeout=0s",
            "nats://h/b?replicas=9",
            "nats://h:99999/b",
            "redis://h/b",
            "nats:b",
            "",
        ] {
            let err = NatsConfig::from_url(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{bad}: {err}");
        }
    }
}
