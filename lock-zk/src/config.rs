//! Configuration: from a `zk://` URL or a builder.

use std::fmt;
use std::time::Duration;

use lock_core::LockError;
use lock_core::endpoint::{Endpoint, HostPort};

/// The port of a host written without one (ZooKeeper's client port).
pub(crate) const DEFAULT_PORT: u16 = 2181;

/// The shortest TTL accepted. A ZooKeeper lease lives as long as its
/// session; the TTL only paces renewals and bounds the local validity, so
/// it needs room for a few round trips.
pub const MIN_TTL: Duration = Duration::from_millis(100);

/// The default lock root inside the chroot.
pub const DEFAULT_ROOT: &str = "/distlock";

/// How a mutex key maps to its lock directory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ZkLayout {
    /// `<root>/<escaped key>`: the key is one path component, every byte
    /// outside `[A-Za-z0-9_-]` percent-encoded (the default; any key is
    /// safe).
    #[default]
    Escaped,
    /// The key *is* the lock directory's absolute path inside the chroot,
    /// used verbatim: the path kazoo's `Lock(client, path)` or Curator's
    /// `InterProcessMutex(client, path)` is given. A key that is not a
    /// valid absolute ZooKeeper path (or lies under `/zookeeper`) is
    /// refused with `InvalidArgument`. Such directories are created as
    /// persistent nodes and never removed by this driver (a kazoo `Lock`
    /// remembers that its path exists). Read-write locks, semaphores and
    /// elections stay under the root.
    Path,
}

/// Which names this driver's mutex nodes get (read-write locks, semaphores
/// and elections always keep Curator's names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ZkNodeNames {
    /// `_c_<attempt id as a UUID>-lock-<sequence>`: the protected name of
    /// Curator's `InterProcessMutex` (the default). Curator sorts these
    /// with its own; kazoo sees them only with
    /// `extra_lock_patterns=["-lock-"]`.
    #[default]
    Curator,
    /// `<attempt id, 32 lowercase hex>__lock__<sequence>`: the name of
    /// kazoo's `Lock` (`uuid4().hex + "__lock__"`), so an unmodified kazoo
    /// `Lock` counts our node as a contender and its waiter watches it.
    /// Curator's `InterProcessMutex` does **not** order these names (it
    /// sorts on the text after `lock-`): for kazoo fleets only.
    Kazoo,
}

/// How to reach a ZooKeeper ensemble and where to keep locks.
///
/// Built from a URL ([`ZkConfig::from_url`]) or with the builder methods:
///
/// ```
/// use std::time::Duration;
/// use lock_zk::ZkConfig;
///
/// let config = ZkConfig::from_url(
///     "zk://app:secret@127.0.0.1:2181,127.0.0.1:2182/myapp?session_timeout=6s&root=/locks",
/// )?;
/// assert_eq!(config.hosts(), ["127.0.0.1:2181", "127.0.0.1:2182"]);
/// assert_eq!(config.chroot(), Some("/myapp"));
/// assert_eq!(config.root(), "/locks");
/// assert_eq!(config.session_timeout(), Duration::from_secs(6));
/// // The password never shows up in Debug output.
/// assert!(!format!("{config:?}").contains("secret"));
///
/// let built = ZkConfig::new(["127.0.0.1:2181"]).with_session_timeout(Duration::from_secs(4));
/// assert_eq!(built.session_timeout(), Duration::from_secs(4));
/// # Ok::<(), lock_core::LockError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct ZkConfig {
    hosts: Vec<String>,
    chroot: Option<String>,
    root: String,
    session_timeout: Duration,
    connect_timeout: Duration,
    op_timeout: Duration,
    digest: Option<(String, String)>,
    containers: bool,
    layout: ZkLayout,
    nodes: ZkNodeNames,
}

impl fmt::Debug for ZkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkConfig")
            .field("hosts", &self.hosts)
            .field("chroot", &self.chroot)
            .field("root", &self.root)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("op_timeout", &self.op_timeout)
            .field(
                "digest_user",
                &self.digest.as_ref().map(|(user, _)| user.as_str()),
            )
            .field("containers", &self.containers)
            .field("layout", &self.layout)
            .field("nodes", &self.nodes)
            .finish()
    }
}

impl ZkConfig {
    /// A configuration for these `host:port` servers (an ensemble lists
    /// several), with defaults: lock root `/distlock`, session timeout 10 s,
    /// connect timeout 10 s, operation timeout 5 s, container parent nodes,
    /// no authentication. A host without a port gets 2181.
    pub fn new<I, S>(hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            hosts: hosts
                .into_iter()
                .map(Into::into)
                .map(|h| with_default_port(&h))
                .collect(),
            chroot: None,
            root: DEFAULT_ROOT.to_owned(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            op_timeout: Duration::from_secs(5),
            digest: None,
            containers: true,
            layout: ZkLayout::Escaped,
            nodes: ZkNodeNames::Curator,
        }
    }

    /// Parses `zk://[user:password@]host:port[,host:port...][/chroot][?options]`
    /// (`zookeeper://` is accepted too).
    ///
    /// Options: `session_timeout`, `connect_timeout`, `timeout` (each
    /// request; `op_timeout` is the older spelling), durations such as `6s`
    /// or `500ms` (a unit is required), `root` (the
    /// lock root inside the chroot, default `/distlock`), `containers`
    /// (`true`/`false`: create key directories as container nodes, default
    /// `true`), `layout` (`escaped`, the default, or `path`: mutex keys are
    /// the absolute paths kazoo or Curator lock, see [`ZkLayout`]), `nodes`
    /// (`curator`, the default, or `kazoo`: the names of our mutex nodes,
    /// see [`ZkNodeNames`]). A user
    /// and password in the URL (percent-encoded) turn on
    /// `digest` authentication.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for anything that
    /// is not such a URL. The message never contains the password.
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
        if !matches!(url.scheme(), "zk" | "zookeeper") || !url.has_authority() {
            return Err(LockError::config(
                "a ZooKeeper URL starts with zk:// or zookeeper://",
            ));
        }
        let hosts = url.hosts(Some(DEFAULT_PORT))?;
        let mut config = Self::new(hosts.iter().map(ToString::to_string));
        let chroot = url.path()?;
        if !chroot.is_empty() && chroot != "/" {
            config = config.with_chroot(chroot)?;
        }
        match url.take_credentials() {
            (None, None) => {}
            (Some(user), Some(password)) => {
                config = config.with_digest(user, password.into_inner())
            }
            _ => {
                return Err(LockError::config(
                    "digest credentials in the URL must be user:password",
                ));
            }
        }
        let options = url.options();
        options.alias("op_timeout", "timeout")?;
        options.alias("operation_timeout", "timeout")?;
        if let Some(timeout) = options.duration("session_timeout")? {
            config.session_timeout = timeout;
        }
        if let Some(timeout) = options.duration("connect_timeout")? {
            config.connect_timeout = timeout;
        }
        if let Some(timeout) = options.duration("timeout")? {
            config.op_timeout = timeout;
        }
        if let Some(root) = options.text("root")? {
            config = config.with_root(root)?;
        }
        if let Some(containers) = options.flag("containers")? {
            config.containers = containers;
        }
        if let Some(layout) = options.text("layout")? {
            config.layout = match layout.as_str() {
                "escaped" => ZkLayout::Escaped,
                "path" => ZkLayout::Path,
                other => {
                    return Err(LockError::config(format!(
                        "layout must be `escaped` or `path`, got {other:?}"
                    )));
                }
            };
        }
        if let Some(nodes) = options.text("nodes")? {
            config.nodes = match nodes.as_str() {
                "curator" => ZkNodeNames::Curator,
                "kazoo" => ZkNodeNames::Kazoo,
                other => {
                    return Err(LockError::config(format!(
                        "nodes must be `curator` or `kazoo`, got {other:?}"
                    )));
                }
            };
        }
        options.finish("zookeeper")?;
        config.validate()?;
        Ok(config)
    }

    /// Sets the chroot: every path of this client lives under it. It is
    /// created (as a persistent node) when missing.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) when `chroot` is
    /// not a valid absolute ZooKeeper path.
    pub fn with_chroot(mut self, chroot: impl Into<String>) -> Result<Self, LockError> {
        let chroot = chroot.into();
        validate_path(&chroot, "chroot")?;
        self.chroot = Some(chroot);
        Ok(self)
    }

    /// Sets the lock root inside the chroot (default `/distlock`). It must
    /// not be `/` so that no key can land on a reserved top-level name such
    /// as `/zookeeper`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) when `root` is not
    /// a valid absolute path below `/`.
    pub fn with_root(mut self, root: impl Into<String>) -> Result<Self, LockError> {
        let root = root.into();
        validate_path(&root, "root")?;
        if root == "/zookeeper" || root.starts_with("/zookeeper/") {
            return Err(LockError::config(
                "the lock root must not be inside /zookeeper (reserved by the server)",
            ));
        }
        self.root = root;
        Ok(self)
    }

    /// Sets the session timeout to ask for (the server clamps it to 2–20
    /// ticks). A lease's TTL is capped at the negotiated timeout.
    #[must_use]
    pub fn with_session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Sets how long establishing a session may take.
    #[must_use]
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the timeout of every single request.
    #[must_use]
    pub fn with_op_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = timeout;
        self
    }

    /// Authenticates the session with the `digest` scheme
    /// (`user:password`). Nodes are then created with the `CREATOR_ALL`
    /// ACL: only sessions authenticated as the same user can touch them.
    #[must_use]
    pub fn with_digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some((user.into(), password.into()));
        self
    }

    /// Whether key directories are container nodes (removed by the server
    /// once empty; ZooKeeper 3.5+). When `false`, or when the server does
    /// not know containers, they are persistent and removed by the client
    /// after a release when empty.
    #[must_use]
    pub fn with_containers(mut self, containers: bool) -> Self {
        self.containers = containers;
        self
    }

    /// Sets how mutex keys map to lock directories (see [`ZkLayout`]).
    #[must_use]
    pub fn with_layout(mut self, layout: ZkLayout) -> Self {
        self.layout = layout;
        self
    }

    /// How mutex keys map to lock directories.
    pub fn layout(&self) -> ZkLayout {
        self.layout
    }

    /// Sets the names of our mutex nodes (see [`ZkNodeNames`]):
    /// [`ZkNodeNames::Kazoo`] for a directory shared with kazoo `Lock`s
    /// that have no `extra_lock_patterns`.
    #[must_use]
    pub fn with_node_names(mut self, nodes: ZkNodeNames) -> Self {
        self.nodes = nodes;
        self
    }

    /// The names of our mutex nodes.
    pub fn node_names(&self) -> ZkNodeNames {
        self.nodes
    }

    /// The `host:port` servers.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The chroot, if any.
    pub fn chroot(&self) -> Option<&str> {
        self.chroot.as_deref()
    }

    /// The lock root inside the chroot.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// The session timeout asked for.
    pub fn session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The per-request timeout.
    pub fn op_timeout(&self) -> Duration {
        self.op_timeout
    }

    /// The digest user, if authentication is on (the password is never
    /// exposed).
    pub fn digest_user(&self) -> Option<&str> {
        self.digest.as_ref().map(|(user, _)| user.as_str())
    }

    pub(crate) fn digest(&self) -> Option<(&str, &str)> {
        self.digest.as_ref().map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// Whether key directories are container nodes.
    pub fn containers(&self) -> bool {
        self.containers
    }

    /// The connect string handed to the client: `host:port,host:port`.
    pub fn connect_string(&self) -> String {
        self.hosts.join(",")
    }

    /// Checks the whole configuration.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) naming the
    /// problem.
    pub fn validate(&self) -> Result<(), LockError> {
        if self.hosts.is_empty() {
            return Err(LockError::config("at least one ZooKeeper host is needed"));
        }
        for host in &self.hosts {
            validate_host(host)?;
        }
        for (name, value) in [
            ("session_timeout", self.session_timeout),
            ("connect_timeout", self.connect_timeout),
            ("timeout", self.op_timeout),
        ] {
            if value.is_zero() || value > Duration::from_secs(3600) {
                return Err(LockError::config(format!(
                    "{name} must be between 1 ms and 1 h, got {value:?}"
                )));
            }
        }
        if let Some((user, _)) = &self.digest
            && (user.is_empty() || user.contains(':'))
        {
            return Err(LockError::config(
                "the digest user must be non-empty and contain no ':'",
            ));
        }
        Ok(())
    }
}

/// `host:port` with ZooKeeper's port for a host written without one (text
/// that is no host is kept as it is, for [`validate_host`] to refuse).
fn with_default_port(host: &str) -> String {
    HostPort::parse(host, Some(DEFAULT_PORT))
        .map_or_else(|_| host.trim().to_owned(), |h| h.to_string())
}

fn validate_host(host: &str) -> Result<(), LockError> {
    HostPort::parse(host, Some(DEFAULT_PORT)).map(drop)
}

/// An absolute path with no empty, `.` or `..` component, not `/`.
pub(crate) fn validate_path(path: &str, what: &str) -> Result<(), LockError> {
    let bad = |why: &str| LockError::config(format!("bad {what} {path:?}: {why}"));
    if !path.starts_with('/') {
        return Err(bad("must start with '/'"));
    }
    if path == "/" {
        return Err(bad("must not be '/'"));
    }
    if path.ends_with('/') {
        return Err(bad("must not end with '/'"));
    }
    for component in path[1..].split('/') {
        if component.is_empty() || component == "." || component == ".." {
            return Err(bad("empty, '.' or '..' component"));
        }
        if component.chars().any(|c| {
            c.is_control()
                || ('\u{e000}'..='\u{f8ff}').contains(&c)
                || ('\u{fff0}'..='\u{ffff}').contains(&c)
        }) {
            return Err(bad("character not allowed in ZooKeeper paths"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::ErrorKind;

    #[test]
    fn parses_full_urls() {
        let c = ZkConfig::from_url(
            "zk://u%40x:p%3Ass@h1:1,h2,[::1]:3/a/b?session_timeout=4s&op_timeout=2s&connect_timeout=1m&root=/r&containers=false",
        )
        .unwrap();
        assert_eq!(c.hosts(), ["h1:1", "h2:2181", "[::1]:3"]);
        assert_eq!(c.chroot(), Some("/a/b"));
        assert_eq!(c.root(), "/r");
        assert_eq!(c.session_timeout(), Duration::from_secs(4));
        assert_eq!(c.op_timeout(), Duration::from_secs(2));
        assert_eq!(c.connect_timeout(), Duration::from_secs(60));
        assert_eq!(c.digest(), Some(("u@x", "p:ss")));
        assert!(!c.containers());
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("p:ss") && !debug.contains("p%3Ass"),
            "{debug}"
        );
    }

    #[test]
    fn minimal_url_has_defaults() {
        let c = ZkConfig::from_url("zookeeper://127.0.0.1:2181").unwrap();
        assert_eq!(c.chroot(), None);
        assert_eq!(c.root(), DEFAULT_ROOT);
        assert_eq!(c.connect_string(), "127.0.0.1:2181");
        assert_eq!(c.layout(), ZkLayout::Escaped);
        let c = ZkConfig::from_url("zk://127.0.0.1:2181/").unwrap();
        assert_eq!(c.chroot(), None);
        let c = ZkConfig::from_url("zk://127.0.0.1:2181/app?layout=path").unwrap();
        assert_eq!(c.layout(), ZkLayout::Path);
        assert!(format!("{c:?}").contains("Path"));
        assert_eq!(c.node_names(), ZkNodeNames::Curator);
        let c = ZkConfig::from_url("zk://127.0.0.1:2181/app?layout=path&nodes=kazoo").unwrap();
        assert_eq!(c.node_names(), ZkNodeNames::Kazoo);
        assert!(format!("{c:?}").contains("Kazoo"));
        let c = ZkConfig::from_url("zk://127.0.0.1:2181?nodes=curator").unwrap();
        assert_eq!(c.node_names(), ZkNodeNames::Curator);
        let built = ZkConfig::new(["h"]).with_node_names(ZkNodeNames::Kazoo);
        assert_eq!(built.node_names(), ZkNodeNames::Kazoo);
    }

    #[test]
    fn rejects_bad_urls_without_leaking_passwords() {
        for url in [
            "",
            "redis://x",
            "zk://",
            "zk://h:1,,h:2",
            "zk://h:0",
            "zk://h:99999",
            "zk://h:x",
            "zk://h:1/a//b",
            "zk://h:1/a/../b",
            "zk://h:1/a/",
            "zk://h:1?session_timeout=abc",
            "zk://h:1?session_timeout=0",
            "zk://h:1?nope=1",
            "zk://h:1?root=/",
            "zk://h:1?root=relative",
            "zk://h:1?root=/zookeeper/x",
            "zk://h:1?containers=maybe",
            "zk://user@h:1",
            "zk://:secretpw@h:1",
            "zk://u:%FFsecretpw@h:1",
            "zk://h:1?containers=",
            "zk://h:1?layout=raw",
            "zk://h:1?layout=",
            "zk://h:1?nodes=Kazoo",
            "zk://h:1?nodes=",
            "zk://h:1?nodes=kazoo&nodes=curator",
            "zk://h:1?timeout=1s&op_timeout=2s",
        ] {
            let err = ZkConfig::from_url(url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Config, "{url}");
            assert!(!err.to_string().contains("secretpw"), "{err}");
        }
    }
}
