//! The `tracing` spans of every operation: acquire, release, inspect,
//! multi-lock and campaign each open a span named `distlock.<op>` with the
//! backend, the key (or keys, or election), and after the call the token
//! (or term), the owner and the outcome.
//!
//! A small recording subscriber stands in for a user's: it keeps every
//! span's name and field values, set at creation and recorded later.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lock_core::{LockClient, MemoryBackend};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

type Fields = BTreeMap<String, String>;

#[derive(Clone, Default)]
struct Recorder {
    next: Arc<AtomicU64>,
    spans: Arc<Mutex<BTreeMap<u64, (String, Fields)>>>,
}

struct Into<'a>(&'a mut Fields);

impl Visit for Into<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = Fields::new();
        attrs.record(&mut Into(&mut fields));
        self.spans
            .lock()
            .unwrap()
            .insert(id, (attrs.metadata().name().to_owned(), fields));
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        if let Some((_, fields)) = self.spans.lock().unwrap().get_mut(&span.into_u64()) {
            values.record(&mut Into(fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Recorder {
    /// Every recorded span called `name`, in creation order.
    fn named(&self, name: &str) -> Vec<Fields> {
        self.spans
            .lock()
            .unwrap()
            .values()
            .filter(|(n, _)| n == name)
            .map(|(_, f)| f.clone())
            .collect()
    }
}

#[test]
fn every_operation_has_a_span_with_its_outcome() {
    let recorder = Recorder::default();
    let dispatch = tracing::Dispatch::new(recorder.clone());
    let _default = tracing::dispatcher::set_default(&dispatch);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (token, owner, set_tokens, term) = runtime.block_on(async {
        let service = MemoryBackend::new();
        let client = LockClient::new(service.clone());
        let guard = client.lock("jobs/a").acquire().await.unwrap();
        let (token, owner) = (guard.token().get(), guard.owner().to_hex());
        client.inspect("jobs/a").await.unwrap();
        guard.release().await.unwrap();
        let set = client
            .lock_all(["jobs/c", "jobs/b"])
            .acquire()
            .await
            .unwrap();
        let set_tokens: Vec<String> = set
            .tokens()
            .iter()
            .map(|(_, t)| t.get().to_string())
            .collect();
        let other = LockClient::new(service);
        let refused = other.lock_all(["jobs/b"]).try_acquire().await.unwrap();
        assert!(refused.is_none());
        set.release().await.unwrap();
        let leading = client.elect("sched").campaign().await.unwrap();
        let term = leading.term().get();
        client.leader("sched").await.unwrap();
        leading.resign().await.unwrap();
        (token, owner, set_tokens.join(","), term)
    });

    let acquire = &recorder.named("distlock.acquire")[0];
    assert_eq!(acquire["backend"], "memory");
    assert_eq!(acquire["key"], "jobs/a");
    assert_eq!(acquire["token"], token.to_string());
    assert_eq!(acquire["owner"], owner);
    assert_eq!(acquire["outcome"], "granted");
    let inspect = &recorder.named("distlock.inspect")[0];
    assert_eq!(inspect["key"], "jobs/a");
    let release = &recorder.named("distlock.release")[0];
    assert_eq!(release["key"], "jobs/a");
    assert_eq!(release["token"], token.to_string());
    assert!(release.contains_key("outcome"), "{release:?}");

    let sets = recorder.named("distlock.lock_all");
    assert_eq!(sets.len(), 2, "{sets:?}");
    assert_eq!(sets[0]["backend"], "memory");
    assert_eq!(sets[0]["keys"], "jobs/c,jobs/b");
    assert_eq!(sets[0]["tokens"], set_tokens);
    assert_eq!(sets[0]["owner"].len(), owner.len());
    assert_eq!(sets[0]["outcome"], "granted");
    assert_eq!(sets[1]["outcome"], "contended");

    let campaign = &recorder.named("distlock.campaign")[0];
    assert_eq!(campaign["election"], "sched");
    assert_eq!(campaign["term"], term.to_string());
    assert_eq!(campaign["outcome"], "leading");
    assert_eq!(recorder.named("distlock.leader")[0]["election"], "sched");
}
