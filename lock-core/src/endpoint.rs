//! One parser for every backend URL.
//!
//! Every driver's URL has the same shape,
//! `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?options]`
//! (or `scheme:opaque[?options]` for forms such as `sqlite::memory:`), and
//! the same rules for its parts. [`Endpoint::parse`] splits a URL once;
//! a driver then reads the parts it understands and maps them onto its own
//! configuration:
//!
//! ```
//! use std::time::Duration;
//! use lock_core::endpoint::Endpoint;
//!
//! let mut url = Endpoint::parse("redis://app:s%40cret@[::1]:7000,h2/3?ttl=5s&tls")?;
//! assert_eq!(url.scheme(), "redis");
//! assert_eq!(url.user(), Some("app"));
//! assert_eq!(url.password().map(|p| p.expose()), Some("s@cret"));
//! let hosts = url.hosts(Some(6379))?;
//! assert_eq!(hosts[0].to_string(), "[::1]:7000");
//! assert_eq!(hosts[1].port, 6379);
//! assert_eq!(url.path_segments()?, ["3"]);
//! let options = url.options();
//! assert_eq!(options.duration("ttl")?, Some(Duration::from_secs(5)));
//! assert_eq!(options.flag("tls")?, Some(true));
//! options.finish("redis")?; // an option nobody read is an error naming it
//! assert!(!format!("{url:?}").contains("s@cret"));
//! # Ok::<(), lock_core::LockError>(())
//! ```
//!
//! # The shared rules
//!
//! - **Credentials** are percent-decoded; the password is a [`Secret`],
//!   redacted in `Debug`, in [`Endpoint::redacted`] and in every message
//!   this module writes. A password may contain an unencoded `@`: the hosts
//!   follow the last one.
//! - **Hosts** are a comma-separated list; IPv6 addresses are written in
//!   brackets (`[::1]:2181`); a host without a port gets the driver's
//!   default port, or is an error when the driver has none.
//! - **Options** are `name=value` pairs separated by `&`, percent-decoded.
//!   One spelling per option across drivers: `ttl`, `timeout` (each network
//!   call), `connect_timeout`, `prefix`, `recheck`, `tls`, `ca`, `cert`,
//!   `key`, `insecure`, `domain`. An option given twice is an error, and so
//!   is an option no reader asked for ([`Options::finish`]), naming it.
//! - **Values**: durations need a unit (`250ms`, `2s`, `1m`,
//!   [`parse_duration`](crate::parse_duration)); booleans are `true`/`false`
//!   (also `1`/`0`, `yes`/`no`, `on`/`off`), and a bare name (`?tls`) means
//!   `true`, while an empty value (`?tls=`) is an error; integers are
//!   decimal; paths must not be empty.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::{LockError, redact_url};

/// A secret (a password) that never shows up in `Debug` or `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The secret itself, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The secret itself, by value.
    pub fn into_inner(self) -> String {
        self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One `host:port` of an endpoint's host list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl HostPort {
    /// A host and port.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
        }
    }
}

impl HostPort {
    /// Parses one `host[:port]` (`[v6]:port` for IPv6) with the rules of
    /// [`Endpoint::hosts`].
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) as for
    /// [`Endpoint::hosts`].
    pub fn parse(text: &str, default_port: Option<u16>) -> Result<Self, LockError> {
        parse_host(text.trim(), default_port)
    }
}

impl fmt::Display for HostPort {
    /// `host:port`, with an IPv6 address in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A parsed backend URL (see the [module](self) documentation).
#[derive(Clone)]
pub struct Endpoint {
    scheme: String,
    authority: Option<String>,
    user: Option<String>,
    password: Option<Secret>,
    path: String,
    raw_base: String,
    redacted: String,
    options: Options,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("url", &self.redacted)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Splits a URL into scheme, credentials, host list, path and options.
    /// The host list and the path are checked when read
    /// ([`hosts`](Self::hosts), [`path`](Self::path)), so that a driver
    /// whose "authority" is not a host list (a SQLite file name) can still
    /// use the rest.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for text without a
    /// scheme, credentials or options that are not valid percent-encoded
    /// UTF-8, or an option given twice. No message contains the password.
    pub fn parse(url: &str) -> Result<Self, LockError> {
        let url = url.trim();
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (url, ""),
        };
        let (scheme, rest) = base
            .split_once(':')
            .filter(|(scheme, _)| is_scheme(scheme))
            .ok_or_else(|| LockError::config("not a URL: expected <scheme>://..."))?;
        let mut endpoint = Self {
            scheme: scheme.to_ascii_lowercase(),
            authority: None,
            user: None,
            password: None,
            path: String::new(),
            raw_base: base.to_owned(),
            redacted: redact_url(url),
            options: Options::parse(query)?,
        };
        match rest.strip_prefix("//") {
            Some(hierarchical) => {
                let (authority, path) = match hierarchical.find('/') {
                    Some(i) => hierarchical.split_at(i),
                    None => (hierarchical, ""),
                };
                let hosts = match authority.rsplit_once('@') {
                    Some((userinfo, hosts)) => {
                        let (user, password) = match userinfo.split_once(':') {
                            Some((user, password)) => (user, Some(password)),
                            None => (userinfo, None),
                        };
                        let user = decode(user, "user name")?;
                        endpoint.user = (!user.is_empty()).then_some(user);
                        endpoint.password = password
                            .map(|p| decode(p, "password").map(Secret))
                            .transpose()
                            .map_err(|_| {
                                LockError::config("the password is not valid UTF-8 once decoded")
                            })?;
                        hosts
                    }
                    None => authority,
                };
                endpoint.authority = Some(hosts.to_owned());
                endpoint.path = path.to_owned();
            }
            None => endpoint.path = rest.to_owned(),
        }
        Ok(endpoint)
    }

    /// The scheme, lower-cased (`redis`, `etcds`, `redis+sentinel`, ...).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user name, percent-decoded (`None` when absent or empty).
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The password, percent-decoded (`Some("")` for `user:@host`).
    pub fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// Takes the credentials out (user, password).
    pub fn take_credentials(&mut self) -> (Option<String>, Option<Secret>) {
        (self.user.take(), self.password.take())
    }

    /// Whether the URL has `//` after the scheme (an authority).
    pub fn has_authority(&self) -> bool {
        self.authority.is_some()
    }

    /// The host list: comma-separated, IPv6 in brackets, hosts
    /// percent-decoded, `default_port` for a host written without one.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for no host, an empty
    /// entry, a bad or zero port, a missing port when `default_port` is
    /// `None`, an unbracketed IPv6 address, or a host with whitespace,
    /// control characters or one of `/?#@,`.
    pub fn hosts(&self, default_port: Option<u16>) -> Result<Vec<HostPort>, LockError> {
        let list = self.authority.as_deref().unwrap_or("");
        if list.trim().is_empty() {
            return Err(LockError::config("the URL names no host"));
        }
        list.split(',')
            .map(|item| parse_host(item.trim(), default_port))
            .collect()
    }

    /// The path after the host list (or the whole text after `scheme:` for
    /// a URL without `//`), percent-decoded, with its leading `/`; empty
    /// when there is none.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when it is not valid
    /// UTF-8 once decoded.
    pub fn path(&self) -> Result<String, LockError> {
        decode(&self.path, "path")
    }

    /// The path's non-empty segments, each percent-decoded (so `%2F` stays
    /// inside its segment).
    ///
    /// # Errors
    ///
    /// As [`path`](Self::path).
    pub fn path_segments(&self) -> Result<Vec<String>, LockError> {
        self.path
            .split('/')
            .filter(|s| !s.is_empty())
            .map(|s| decode(s, "path"))
            .collect()
    }

    /// Everything before `?`, as written (it may hold the password: for a
    /// driver that hands the URL on, never for a message).
    pub fn raw_base(&self) -> &str {
        &self.raw_base
    }

    /// The URL with its secrets replaced by `***`, for messages.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    /// The options, to read them.
    pub fn options(&mut self) -> &mut Options {
        &mut self.options
    }

    /// Takes the options out (the rest of the endpoint stays usable).
    pub fn take_options(&mut self) -> Options {
        std::mem::take(&mut self.options)
    }
}

fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
}

fn parse_host(item: &str, default_port: Option<u16>) -> Result<HostPort, LockError> {
    if item.is_empty() {
        return Err(LockError::config("empty entry in the host list"));
    }
    let (host, port) = if let Some(rest) = item.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| LockError::config("unclosed '[' in a host"))?;
        match after.strip_prefix(':') {
            Some(port) => (host.to_owned(), Some(port)),
            None if after.is_empty() => (host.to_owned(), None),
            None => return Err(LockError::config("bad text after an IPv6 address")),
        }
    } else {
        let (host, port) = match item.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (item, None),
        };
        if host.contains(':') {
            return Err(LockError::config(
                "an IPv6 address in a URL must be in brackets, like [::1]:2379",
            ));
        }
        (decode(host, "host")?, port)
    };
    if host.is_empty()
        || host
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "/?#@,[]".contains(c))
    {
        return Err(LockError::config(format!("bad host {host:?} in the URL")));
    }
    let port = match port {
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| LockError::config(format!("bad port {port:?} for host {host:?}")))?,
        None => default_port
            .ok_or_else(|| LockError::config(format!("host {host:?} needs a port (host:port)")))?,
    };
    Ok(HostPort { host, port })
}

fn decode(text: &str, what: &str) -> Result<String, LockError> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| LockError::config(format!("the {what} is not valid UTF-8 once decoded")))
}

#[derive(Clone, Debug)]
struct Entry {
    name: String,
    /// `None` for a bare name (`?tls`).
    value: Option<String>,
    read: bool,
}

/// The `?name=value&...` options of an [`Endpoint`], read by typed readers.
///
/// Each reader takes the option out (`None` when absent) and remembers its
/// name as known; [`finish`](Self::finish) then refuses whatever no reader
/// asked for, naming it and the known options.
#[derive(Clone, Debug, Default)]
pub struct Options {
    entries: Vec<Entry>,
    known: Vec<String>,
}

impl Options {
    /// Parses `name=value&name2=value2` (percent-decoded, a bare `name`
    /// has no value).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for an empty name or
    /// text that is not valid UTF-8 once decoded.
    pub fn parse(query: &str) -> Result<Self, LockError> {
        let mut entries = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = match pair.split_once('=') {
                Some((name, value)) => (name, Some(value)),
                None => (pair, None),
            };
            let name = decode(name, "option name")?;
            if name.is_empty() {
                return Err(LockError::config("an option without a name in the URL"));
            }
            let value = value
                .map(|v| decode(v, &format!("value of option {name}")))
                .transpose()?;
            entries.push(Entry {
                name,
                value,
                read: false,
            });
        }
        Ok(Self {
            entries,
            known: Vec::new(),
        })
    }

    /// Accepts `old` as an older spelling of `name` (read as `name`
    /// afterwards).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when both spellings
    /// are given.
    pub fn alias(&mut self, old: &str, name: &str) -> Result<(), LockError> {
        let has_new = self.entries.iter().any(|e| e.name == name);
        for entry in self.entries.iter_mut().filter(|e| e.name == old) {
            if has_new {
                return Err(LockError::config(format!(
                    "options {old} and {name} are the same option: give it once"
                )));
            }
            entry.name = name.to_owned();
        }
        Ok(())
    }

    /// Takes the raw value of `name` (`Some(None)` for a bare name).
    fn take(&mut self, name: &str) -> Result<Option<Option<String>>, LockError> {
        if !self.known.iter().any(|k| k == name) {
            self.known.push(name.to_owned());
        }
        let mut found = None;
        for entry in self
            .entries
            .iter_mut()
            .filter(|e| e.name == name && !e.read)
        {
            if found.is_some() {
                return Err(LockError::config(format!(
                    "option {name} is given twice in the URL"
                )));
            }
            entry.read = true;
            found = Some(entry.value.clone());
        }
        Ok(found)
    }

    /// Takes a value that must be present (`name=value`).
    fn take_value(&mut self, name: &str) -> Result<Option<String>, LockError> {
        match self.take(name)? {
            None => Ok(None),
            Some(None) => Err(LockError::config(format!("option {name} needs a value"))),
            Some(Some(value)) => Ok(Some(value)),
        }
    }

    /// A text value (may be empty: `prefix=`).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for a bare name
    /// without `=`, or the option given twice.
    pub fn text(&mut self, name: &str) -> Result<Option<String>, LockError> {
        self.take_value(name)
    }

    /// A secret value (a password option); never echoed in messages.
    ///
    /// # Errors
    ///
    /// As [`text`](Self::text).
    pub fn secret(&mut self, name: &str) -> Result<Option<Secret>, LockError> {
        Ok(self.take_value(name)?.map(Secret))
    }

    /// A duration with a unit (`250ms`, `2s`, `1m`).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the option
    /// and the bad text.
    pub fn duration(&mut self, name: &str) -> Result<Option<Duration>, LockError> {
        let Some(value) = self.take_value(name)? else {
            return Ok(None);
        };
        crate::parse_duration(&value).map(Some).ok_or_else(|| {
            LockError::config(format!(
                "option {name}: bad duration {value:?} (a number with a unit: 250ms, 2s, 1m)"
            ))
        })
    }

    /// A boolean: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, or a
    /// bare name for `true`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for any other text,
    /// including an empty value.
    pub fn flag(&mut self, name: &str) -> Result<Option<bool>, LockError> {
        let Some(value) = self.take(name)? else {
            return Ok(None);
        };
        match value.as_deref() {
            None | Some("true" | "1" | "yes" | "on") => Ok(Some(true)),
            Some("false" | "0" | "no" | "off") => Ok(Some(false)),
            Some(other) => Err(LockError::config(format!(
                "option {name}: {other:?} is not a boolean (true or false)"
            ))),
        }
    }

    /// A decimal integer of type `T`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the option
    /// when the text is not such a number (or out of `T`'s range).
    pub fn number<T: FromStr>(&mut self, name: &str) -> Result<Option<T>, LockError> {
        let Some(value) = self.take_value(name)? else {
            return Ok(None);
        };
        value.trim().parse::<T>().map(Some).map_err(|_| {
            LockError::config(format!("option {name}: {value:?} is not a valid number"))
        })
    }

    /// A file path (not empty).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for an empty path.
    pub fn path(&mut self, name: &str) -> Result<Option<PathBuf>, LockError> {
        match self.take_value(name)? {
            Some(path) if path.is_empty() => {
                Err(LockError::config(format!("option {name}: empty path")))
            }
            other => Ok(other.map(PathBuf::from)),
        }
    }

    /// Whether an option of this name was given and not read yet.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.name == name && !e.read)
    }

    /// The options no reader took, in order, as `(name, value)` (a bare
    /// name has an empty value): for a driver that hands them on.
    pub fn into_unread(self) -> Vec<(String, String)> {
        self.entries
            .into_iter()
            .filter(|e| !e.read)
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect()
    }

    /// Ends reading: any option no reader took is an error.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) naming the first
    /// unknown option and the ones `driver` knows.
    pub fn finish(&self, driver: &str) -> Result<(), LockError> {
        match self.entries.iter().find(|e| !e.read) {
            None => Ok(()),
            Some(entry) => Err(LockError::config(format!(
                "unknown option {:?} for {driver} (known: {})",
                entry.name,
                self.known.join(", ")
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn config_error(result: Result<impl fmt::Debug, LockError>) -> String {
        let err = result.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        err.to_string()
    }

    #[test]
    fn splits_every_part() {
        let mut e =
            Endpoint::parse("Redis+Sentinel://u%40x:p%3Ass@h1:1,h2,[::1]:3/my%2Fmaster/2?ttl=5s")
                .unwrap();
        assert_eq!(e.scheme(), "redis+sentinel");
        assert_eq!(e.user(), Some("u@x"));
        assert_eq!(e.password().unwrap().expose(), "p:ss");
        assert_eq!(
            e.hosts(Some(26379)).unwrap(),
            [
                HostPort::new("h1", 1),
                HostPort::new("h2", 26379),
                HostPort::new("::1", 3)
            ]
        );
        assert_eq!(e.path().unwrap(), "/my/master/2");
        assert_eq!(e.path_segments().unwrap(), ["my/master", "2"]);
        assert_eq!(
            e.options().duration("ttl").unwrap(),
            Some(Duration::from_secs(5))
        );
        e.take_options().finish("redis").unwrap();
    }

    #[test]
    fn credentials_forms() {
        let e = Endpoint::parse("redis://:pw@h").unwrap();
        assert_eq!(
            (e.user(), e.password().map(Secret::expose)),
            (None, Some("pw"))
        );
        let e = Endpoint::parse("redis://pw@h").unwrap();
        assert_eq!((e.user(), e.password()), (Some("pw"), None));
        // An unencoded '@' in the password: the hosts follow the last one.
        let e = Endpoint::parse("etcd://u:a@b@h:1").unwrap();
        assert_eq!(e.password().unwrap().expose(), "a@b");
        assert_eq!(e.hosts(None).unwrap(), [HostPort::new("h", 1)]);
    }

    #[test]
    fn opaque_urls_keep_their_text() {
        let mut e = Endpoint::parse("sqlite::memory:?table=t&cache=shared").unwrap();
        assert_eq!(e.scheme(), "sqlite");
        assert!(!e.has_authority());
        assert_eq!(e.path().unwrap(), ":memory:");
        assert_eq!(e.raw_base(), "sqlite::memory:");
        assert_eq!(e.options().text("table").unwrap().as_deref(), Some("t"));
        assert_eq!(
            e.take_options().into_unread(),
            [("cache".to_owned(), "shared".to_owned())]
        );
    }

    #[test]
    fn host_errors() {
        for (url, default) in [
            ("etcd://", Some(1)),
            ("etcd://h", None),
            ("etcd://h:0", None),
            ("etcd://h:99999", None),
            ("etcd://h:x", None),
            ("etcd://a,,b", Some(1)),
            ("etcd://::1", Some(1)),
            ("etcd://[::1", Some(1)),
            ("etcd://[::1]x", Some(1)),
            ("etcd://h%20x:1", None),
        ] {
            let e = Endpoint::parse(url).unwrap();
            config_error(e.hosts(default));
        }
    }

    #[test]
    fn option_values_have_one_syntax() {
        let mut o = Options::parse("a&b=no&c=on&d=&e=maybe").unwrap();
        assert_eq!(o.flag("a").unwrap(), Some(true));
        assert_eq!(o.flag("b").unwrap(), Some(false));
        assert_eq!(o.flag("c").unwrap(), Some(true));
        assert!(config_error(o.flag("d")).contains("option d"));
        config_error(o.flag("e"));
        assert_eq!(o.flag("absent").unwrap(), None);

        let mut o = Options::parse("t=250ms&n=12&bad=10&p=&q=%2Ftmp%2Fca.pem").unwrap();
        assert_eq!(o.duration("t").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(o.number::<u32>("n").unwrap(), Some(12));
        assert!(config_error(o.duration("bad")).contains("unit"));
        config_error(o.path("p"));
        assert_eq!(o.path("q").unwrap(), Some(PathBuf::from("/tmp/ca.pem")));

        let mut o = Options::parse("n=-1&x&ttl=1s&ttl=2s").unwrap();
        config_error(o.number::<u32>("n"));
        config_error(o.text("x"));
        assert!(config_error(o.duration("ttl")).contains("twice"));
    }

    #[test]
    fn unknown_options_are_named() {
        let mut o = Options::parse("ttl=1s&tmeout=2s").unwrap();
        o.duration("ttl").unwrap();
        o.duration("timeout").unwrap();
        let message = config_error(o.finish("zk"));
        assert!(
            message.contains("\"tmeout\"") && message.contains("ttl, timeout"),
            "{message}"
        );
    }

    #[test]
    fn aliases_read_as_the_one_spelling() {
        let mut o = Options::parse("op_timeout=3s").unwrap();
        o.alias("op_timeout", "timeout").unwrap();
        assert_eq!(o.duration("timeout").unwrap(), Some(Duration::from_secs(3)));
        o.finish("zk").unwrap();
        let mut o = Options::parse("op_timeout=3s&timeout=1s").unwrap();
        config_error(o.alias("op_timeout", "timeout"));
    }

    #[test]
    fn secrets_never_reach_debug_or_messages() {
        let mut e = Endpoint::parse("redis://u:hunter2@h?password=swordfish&x=1").unwrap();
        assert!(!format!("{e:?}").contains("hunter2"));
        assert!(!e.redacted().contains("hunter2") && !e.redacted().contains("swordfish"));
        let secret = e.options().secret("password").unwrap().unwrap();
        assert_eq!(format!("{secret:?} {secret}"), "<redacted> <redacted>");
        let message = config_error(e.take_options().finish("redis"));
        assert!(!message.contains("hunter2") && !message.contains("swordfish"));
        for bad in ["", "nonsense", "://x", "1redis://h"] {
            config_error(Endpoint::parse(bad));
        }
    }
}
