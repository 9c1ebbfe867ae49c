//! One configuration struct, from a URL, a TOML file or the environment.

use std::path::Path;
use std::time::Duration;

use std::sync::Arc;

use lock_core::{
    LockBackend, LockDefaults, LockError, MigrationBackend, MigrationPhase, Requirements,
};
use serde::Deserialize;

use crate::duration::parse_duration;

/// Everything needed to connect: the backend URL, what the application
/// requires of it, and default lock options.
///
/// Built from a URL ([`Config::from_url`]), a TOML file
/// ([`Config::from_toml_str`], [`Config::from_file`]) or the environment
/// ([`Config::from_env`]); all three give the same struct.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// The backend URL (`memory://`, `sqlite://...`, `redis://...`, ...).
    pub url: String,
    /// Checked against the backend's capabilities at connect time.
    pub requirements: Requirements,
    /// Default TTL, wait and renewal for lock requests.
    pub defaults: LockDefaults,
    /// When set, the backend is a [`MigrationBackend`](lock_core::MigrationBackend)
    /// over these two URLs, and `url` is only a label.
    pub migration: Option<MigrationConfig>,
}

/// A migration between two backends (see [`lock_core::MigrationBackend`]).
#[derive(Clone, PartialEq, Eq)]
pub struct MigrationConfig {
    /// The backend being left.
    pub old_url: String,
    /// The backend being moved to.
    pub new_url: String,
    /// This process's phase.
    pub phase: MigrationPhase,
    /// The migration's name: its cutover marker is the old backend's key
    /// `__distlock/migration-cutover/<name>` (`None`: `default`). Every
    /// process of one fleet uses the same name.
    pub name: Option<String>,
    /// The longest TTL any process in phase `old` holds a lease with: how
    /// long after the cutover phase `new` keeps checking each key in the
    /// old backend (`None`: the configured default TTL).
    pub old_ttl: Option<Duration>,
}

impl MigrationConfig {
    /// The [`MigrationBackend`] over the opened `old` and `new` backends,
    /// with this config's name and wait-out (`default_ttl` when
    /// [`old_ttl`](Self::old_ttl) is unset).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad name.
    pub fn backend(
        &self,
        old: Arc<dyn LockBackend>,
        new: Arc<dyn LockBackend>,
        default_ttl: Duration,
    ) -> Result<MigrationBackend, LockError> {
        let backend = MigrationBackend::new(old, new, self.phase)
            .with_old_lease_max(self.old_ttl.unwrap_or(default_ttl));
        match &self.name {
            Some(name) => backend.with_name(name),
            None => Ok(backend),
        }
    }
}

impl std::fmt::Debug for MigrationConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrationConfig")
            .field("old_url", &redact_url(&self.old_url))
            .field("new_url", &redact_url(&self.new_url))
            .field("phase", &self.phase)
            .field("name", &self.name)
            .field("old_ttl", &self.old_ttl)
            .finish()
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("url", &redact_url(&self.url))
            .field("requirements", &self.requirements)
            .field("defaults", &self.defaults)
            .field("migration", &self.migration)
            .finish()
    }
}

pub use lock_core::redact_url;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileMigration {
    old: String,
    new: String,
    phase: String,
    name: Option<String>,
    old_ttl: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    url: Option<String>,
    migration: Option<FileMigration>,
    ttl: Option<String>,
    wait: Option<String>,
    #[serde(default)]
    require: Vec<String>,
}

impl Config {
    /// A config for `url` with no requirements and default options.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) when `url` has no
    /// `scheme://` (or is not `sqlite::memory:`).
    pub fn from_url(url: &str) -> Result<Self, LockError> {
        let url = url.trim();
        if !url.contains("://") && !url.starts_with("sqlite:") {
            return Err(LockError::config(format!(
                "bad backend URL {:?}: expected scheme://..., e.g. redis://127.0.0.1:6379 or sqlite:///var/lib/app/locks.db",
                redact_url(url)
            )));
        }
        Ok(Self {
            url: url.to_owned(),
            requirements: Requirements::none(),
            defaults: LockDefaults::default(),
            migration: None,
        })
    }

    /// A config for a migration from `old_url` to `new_url` in `phase`.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad URL.
    pub fn migration(
        old_url: &str,
        new_url: &str,
        phase: MigrationPhase,
    ) -> Result<Self, LockError> {
        Self::from_url(old_url)?;
        Self::from_url(new_url)?;
        Ok(Self {
            url: format!(
                "migration({} -> {}, {})",
                redact_url(old_url),
                redact_url(new_url),
                phase.as_str()
            ),
            requirements: Requirements::none(),
            defaults: LockDefaults::default(),
            migration: Some(MigrationConfig {
                old_url: old_url.trim().to_owned(),
                new_url: new_url.trim().to_owned(),
                phase,
                name: None,
                old_ttl: None,
            }),
        })
    }

    /// Names the migration and sets its wait-out (see [`MigrationConfig`]);
    /// a no-op for a config without a migration.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for an empty or
    /// invalid name.
    pub fn migration_options(
        mut self,
        name: Option<&str>,
        old_ttl: Option<Duration>,
    ) -> Result<Self, LockError> {
        if let Some(m) = &mut self.migration {
            if let Some(name) = name {
                // Validated the same way the backend will.
                MigrationBackend::new(
                    Arc::new(lock_core::MemoryBackend::new()),
                    Arc::new(lock_core::MemoryBackend::new()),
                    m.phase,
                )
                .with_name(name)?;
                m.name = Some(name.trim().to_owned());
            }
            if old_ttl.is_some() {
                m.old_ttl = old_ttl;
            }
        }
        Ok(self)
    }

    /// Parses a TOML config:
    ///
    /// ```toml
    /// url = "redis://127.0.0.1:6379"
    /// ttl = "30s"                 # default lease TTL
    /// wait = "10s"                # default wait for a held key
    /// require = ["fencing", "linearizable"]
    /// ```
    ///
    /// or, during a migration (instead of `url`):
    ///
    /// ```toml
    /// [migration]
    /// old = "redis://127.0.0.1:6379"
    /// new = "etcd://127.0.0.1:2379/locks"
    /// phase = "dual"              # old, dual or new
    /// name = "billing"            # optional: the cutover marker's name
    /// old_ttl = "30s"             # optional: longest TTL of `old` processes
    ///                             # (default: `ttl`)
    /// ```
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for bad TOML,
    /// unknown fields, bad durations or unknown requirements.
    pub fn from_toml_str(text: &str) -> Result<Self, LockError> {
        let file: FileConfig = toml::from_str(text)
            .map_err(|e| LockError::config(format!("bad config file: {}", e.message())))?;
        let mut config = match (&file.url, &file.migration) {
            (Some(url), None) => Self::from_url(url)?,
            (None, Some(m)) => {
                let old_ttl = m.old_ttl.as_deref().map(parse_duration).transpose()?;
                Self::migration(&m.old, &m.new, MigrationPhase::parse(&m.phase)?)?
                    .migration_options(m.name.as_deref(), old_ttl)?
            }
            (Some(_), Some(_)) => {
                return Err(LockError::config(
                    "bad config file: give either `url` or a `[migration]` table, not both",
                ));
            }
            (None, None) => {
                return Err(LockError::config(
                    "bad config file: missing `url` (or a `[migration]` table)",
                ));
            }
        };
        if let Some(ttl) = &file.ttl {
            config.defaults.ttl = parse_duration(ttl)?;
        }
        if let Some(wait) = &file.wait {
            config.defaults.wait = parse_duration(wait)?;
        }
        config.requirements = parse_requirements(file.require.iter().map(String::as_str))?;
        Ok(config)
    }

    /// Reads and parses a TOML config file.
    ///
    /// # Errors
    ///
    /// As [`from_toml_str`](Self::from_toml_str), or when the file cannot be
    /// read.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, LockError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            LockError::config(format!("cannot read config file {}", path.display())).with_source(e)
        })?;
        Self::from_toml_str(&text)
    }

    /// Reads `DISTLOCK_CONFIG` (a TOML file), or `DISTLOCK_URL`, or the
    /// three `DISTLOCK_MIGRATION_OLD` / `_NEW` / `_PHASE` (with the optional
    /// `DISTLOCK_MIGRATION_NAME` and `DISTLOCK_MIGRATION_OLD_TTL`), then
    /// applies `DISTLOCK_TTL`, `DISTLOCK_WAIT` and `DISTLOCK_REQUIRE` (a
    /// comma list) on top.
    ///
    /// # Errors
    ///
    /// When neither variable is set, or a value is bad.
    pub fn from_env() -> Result<Self, LockError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let migration = (
            var("DISTLOCK_MIGRATION_OLD"),
            var("DISTLOCK_MIGRATION_NEW"),
            var("DISTLOCK_MIGRATION_PHASE"),
        );
        let mut config = match (var("DISTLOCK_CONFIG"), var("DISTLOCK_URL"), migration) {
            (Some(path), _, _) => Self::from_file(path)?,
            (None, Some(url), _) => Self::from_url(&url)?,
            (None, None, (Some(old), Some(new), Some(phase))) => {
                let old_ttl = var("DISTLOCK_MIGRATION_OLD_TTL")
                    .as_deref()
                    .map(parse_duration)
                    .transpose()?;
                Self::migration(&old, &new, MigrationPhase::parse(&phase)?)?
                    .migration_options(var("DISTLOCK_MIGRATION_NAME").as_deref(), old_ttl)?
            }
            (None, None, _) => {
                return Err(LockError::config(
                    "no backend configured: set DISTLOCK_URL (e.g. sqlite://locks.db) or DISTLOCK_CONFIG",
                ));
            }
        };
        if let Some(ttl) = var("DISTLOCK_TTL") {
            config.defaults.ttl = parse_duration(&ttl)?;
        }
        if let Some(wait) = var("DISTLOCK_WAIT") {
            config.defaults.wait = parse_duration(&wait)?;
        }
        if let Some(require) = var("DISTLOCK_REQUIRE") {
            config.requirements = parse_requirements(require.split(','))?;
        }
        Ok(config)
    }

    /// Sets the default TTL.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.defaults.ttl = ttl;
        self
    }

    /// Sets the default wait.
    #[must_use]
    pub fn wait(mut self, wait: Duration) -> Self {
        self.defaults.wait = wait;
        self
    }

    /// Sets the requirements.
    #[must_use]
    pub fn require(mut self, requirements: Requirements) -> Self {
        self.requirements = requirements;
        self
    }
}

/// Parses requirement names: `fencing`, `fencing-survives-failover`,
/// `linearizable`, `fifo`, `notify`.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for an unknown name.
pub fn parse_requirements<'a>(
    names: impl IntoIterator<Item = &'a str>,
) -> Result<Requirements, LockError> {
    let mut req = Requirements::none();
    for name in names {
        req = match name.trim() {
            "" => req,
            "fencing" => req.fencing(),
            "fencing-survives-failover" => req.fencing_survives_failover(),
            "linearizable" => req.linearizable(),
            "fifo" => req.fifo(),
            "notify" => req.notify(),
            "shared-locks" => req.shared_locks(),
            "semaphores" => req.semaphores(),
            other => {
                return Err(LockError::config(format!(
                    "unknown requirement {other:?}: expected fencing, fencing-survives-failover, linearizable, fifo, notify, shared-locks or semaphores"
                )));
            }
        };
    }
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_and_url_give_the_same_struct() {
        let from_toml = Config::from_toml_str(
            r#"
            url = "memory://"
            ttl = "10s"
            wait = "500ms"
            require = ["fencing", "fifo"]
            "#,
        )
        .unwrap();
        let by_hand = Config::from_url("memory://")
            .unwrap()
            .ttl(Duration::from_secs(10))
            .wait(Duration::from_millis(500))
            .require(Requirements::none().fencing().fifo());
        assert_eq!(from_toml, by_hand);
    }

    #[test]
    fn migration_tables_parse() {
        let config = Config::from_toml_str(
            "[migration]\nold = \"memory://a\"\nnew = \"memory://b\"\nphase = \"dual\"\n",
        )
        .unwrap();
        let m = config.migration.unwrap();
        assert_eq!(m.phase, MigrationPhase::Dual);
        assert_eq!(m.old_url, "memory://a");
        assert_eq!((m.name, m.old_ttl), (None, None));
        let named = Config::from_toml_str(
            "[migration]\nold = \"memory://a\"\nnew = \"memory://b\"\nphase = \"new\"\nname = \"billing\"\nold_ttl = \"45s\"\n",
        )
        .unwrap()
        .migration
        .unwrap();
        assert_eq!(named.name.as_deref(), Some("billing"));
        assert_eq!(named.old_ttl, Some(Duration::from_secs(45)));
        for bad in [
            "url = \"memory://\"\n[migration]\nold = \"memory://a\"\nnew = \"memory://b\"\nphase = \"old\"\n",
            "[migration]\nold = \"memory://a\"\nnew = \"memory://b\"\nphase = \"sideways\"\n",
            "[migration]\nold = \"memory://a\"\nphase = \"old\"\n",
            "[migration]\nold = \"memory://a\"\nnew = \"memory://b\"\nphase = \"new\"\nname = \"\"\n",
            "[migration]\nold = \"memory://a\"\nnew = \"memory://b\"\nphase = \"new\"\nold_ttl = \"later\"\n",
        ] {
            assert_eq!(
                Config::from_toml_str(bad).unwrap_err().kind(),
                lock_core::ErrorKind::Config,
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn the_migration_backend_takes_the_name_and_wait_out() {
        let config = Config::migration("memory://a", "memory://b", MigrationPhase::New)
            .unwrap()
            .migration_options(Some("fleet"), None)
            .unwrap();
        let m = config.migration.unwrap();
        let memory = || Arc::new(lock_core::MemoryBackend::new()) as Arc<dyn LockBackend>;
        let backend = m
            .backend(memory(), memory(), Duration::from_secs(7))
            .unwrap();
        assert_eq!(
            backend.cutover_key().as_str(),
            "__distlock/migration-cutover/fleet"
        );
        assert_eq!(backend.old_lease_max(), Duration::from_secs(7));
        let m = MigrationConfig {
            old_ttl: Some(Duration::from_secs(90)),
            name: None,
            ..m
        };
        let backend = m
            .backend(memory(), memory(), Duration::from_secs(7))
            .unwrap();
        assert_eq!(backend.old_lease_max(), Duration::from_secs(90));
        assert_eq!(backend.name(), lock_core::DEFAULT_MIGRATION_NAME);
    }

    #[test]
    fn bad_configs_are_config_errors() {
        for text in [
            "url = 5",
            "ttl = \"1s\"",
            "url = \"memory://\"\nttl = \"soon\"",
            "url = \"memory://\"\nrequire = [\"magic\"]",
            "url = \"memory://\"\ncolour = \"blue\"",
            "url = \"no-scheme\"",
        ] {
            let err = Config::from_toml_str(text).unwrap_err();
            assert_eq!(err.kind(), lock_core::ErrorKind::Config, "{text}: {err}");
        }
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://user:s3cret@host:6379/0?x=1"),
            "redis://user:***@host:6379/0?x=1"
        );
        assert_eq!(redact_url("redis://:s3cret@host"), "redis://:***@host");
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        let config = Config::from_url("postgres://app:hunter2@db/locks").unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}
