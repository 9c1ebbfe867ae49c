//! The connect-time check of `maxmemory-policy`: a Redis that may evict
//! keys can delete held locks and token counters. Warned by default,
//! refused with `eviction=refuse`, and a disabled `CONFIG` command is a
//! warning, never a failure.

use std::sync::{Arc, Mutex, PoisonError};

use conformance::OrSkip;
use conformance::servers::redis::RedisServer;
use lock_core::ErrorKind;
use lock_redis::{EvictionCheck, EvictionMode, RedisBackend, RedisConfig};

/// Collects the text of every `WARN` event (a minimal `tracing` subscriber).
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

impl Warnings {
    fn texts(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, _field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        use std::fmt::Write;
        let _ = write!(self.0, "{value:?} ");
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        if *event.metadata().level() == tracing::Level::WARN {
            let mut message = Message(String::new());
            event.record(&mut message);
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(message.0);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Connects to `url` on a runtime of its own with `warnings` as the
/// subscriber.
fn connect_watched(url: &str, warnings: &Warnings) -> Result<RedisBackend, lock_core::LockError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(warnings.clone(), || {
        runtime.block_on(async { RedisBackend::connect(RedisConfig::from_url(url)?).await })
    })
}

/// Starts a server on a runtime of its own (the spawner is async).
fn start(extra: &[&str]) -> Option<RedisServer> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(RedisServer::start_with(extra)).or_skip()
}

#[test]
fn an_evicting_server_is_warned_about_and_refused_on_request() {
    let Some(server) = start(&["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"]) else {
        return;
    };
    let warnings = Warnings::default();
    let backend = connect_watched(&server.url(), &warnings).expect("warn mode connects");
    assert_eq!(
        backend.eviction(),
        &EvictionCheck::MayEvict {
            node: format!("127.0.0.1:{}", server.port()),
            policy: "allkeys-lru".into(),
            maxmemory: 100 * 1024 * 1024,
        }
    );
    let texts = warnings.texts();
    assert!(
        texts
            .iter()
            .any(|t| t.contains("maxmemory-policy allkeys-lru") && t.contains("evict")),
        "no eviction warning: {texts:?}"
    );
    drop(backend);

    let refused = connect_watched(&format!("{}?eviction=refuse", server.url()), &warnings)
        .expect_err("eviction=refuse must refuse an evicting server");
    assert_eq!(refused.kind(), ErrorKind::Config, "{refused}");
    assert!(
        refused.to_string().contains("maxmemory-policy allkeys-lru"),
        "{refused}"
    );
    // The builder says the same as the URL option.
    let config = RedisConfig::from_url(&server.url())
        .unwrap()
        .eviction(EvictionMode::Refuse);
    assert_eq!(config.eviction_mode(), EvictionMode::Refuse);
}

#[test]
fn volatile_policies_are_refused_even_without_a_limit_yet() {
    // volatile-* evicts keys with a TTL: every lock key. maxmemory 0 evicts
    // nothing until a limit is set, which CONFIG SET can do at any time.
    let Some(server) = start(&["--maxmemory-policy", "volatile-ttl"]) else {
        return;
    };
    let warnings = Warnings::default();
    let backend = connect_watched(&server.url(), &warnings).unwrap();
    assert!(
        matches!(backend.eviction(), EvictionCheck::MayEvict { policy, maxmemory: 0, .. } if policy == "volatile-ttl"),
        "{:?}",
        backend.eviction()
    );
    assert!(!warnings.texts().is_empty());
    let refused =
        connect_watched(&format!("{}?eviction=refuse", server.url()), &warnings).unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::Config, "{refused}");
}

#[test]
fn a_noeviction_server_passes_silently() {
    let Some(server) = start(&["--maxmemory", "100mb", "--maxmemory-policy", "noeviction"]) else {
        return;
    };
    let warnings = Warnings::default();
    let backend = connect_watched(&format!("{}?eviction=refuse", server.url()), &warnings).unwrap();
    assert_eq!(backend.eviction(), &EvictionCheck::NoEviction);
    let texts = warnings.texts();
    assert!(
        !texts.iter().any(|t| t.contains("evict")),
        "unexpected warning: {texts:?}"
    );
}

#[test]
fn a_disabled_config_command_is_a_warning_never_a_failure() {
    // Managed services often rename or disable CONFIG.
    let Some(server) = start(&[
        "--maxmemory-policy",
        "allkeys-lru",
        "--rename-command",
        "CONFIG",
        "",
    ]) else {
        return;
    };
    let warnings = Warnings::default();
    let backend = connect_watched(&format!("{}?eviction=refuse", server.url()), &warnings)
        .expect("an unchecked policy never fails the connect");
    assert!(
        matches!(backend.eviction(), EvictionCheck::Unknown { .. }),
        "{:?}",
        backend.eviction()
    );
    let texts = warnings.texts();
    assert!(
        texts.iter().any(|t| t.contains("could not check")),
        "no could-not-check warning: {texts:?}"
    );
}

#[test]
fn bad_eviction_options_are_config_errors() {
    for bad in ["redis://h?eviction=maybe", "redis://h?eviction="] {
        let err = RedisConfig::from_url(bad).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{bad}");
    }
    assert_eq!(
        RedisConfig::from_url("redis://h?eviction=warn")
            .unwrap()
            .eviction_mode(),
        EvictionMode::Warn
    );
}
