//! Tracing's `log` fallback (on when any crate of the build enables
//! tracing's `log` feature, as sqlx does): with no `tracing` subscriber, a
//! `log` logger at `debug` sees the acquire and release spans. The client
//! skips building spans nobody can see (`telemetry::debug_spans`); this
//! checks it still builds these. Its own test binary: a logger is set once
//! per process, and no `tracing` subscriber may ever be set in it.

use std::sync::Mutex;

use lock_core::{LockClient, MemoryBackend};

struct Lines(Mutex<Vec<String>>);

impl log::Log for Lines {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        self.0.lock().unwrap().push(record.args().to_string());
    }
    fn flush(&self) {}
}

static LINES: Lines = Lines(Mutex::new(Vec::new()));

async fn cycle(client: &LockClient) -> Vec<String> {
    LINES.0.lock().unwrap().clear();
    let guard = client.lock("jobs/logged").acquire().await.unwrap();
    assert!(guard.release().await.unwrap());
    LINES.0.lock().unwrap().clone()
}

#[tokio::test]
async fn a_log_logger_at_debug_sees_the_spans_without_a_subscriber() {
    log::set_logger(&LINES).unwrap();
    let client = LockClient::new(MemoryBackend::new());
    let named = |lines: &[String], name: &str| {
        lines
            .iter()
            .any(|l| l.starts_with(&format!("{name};")) && l.contains("jobs/logged"))
    };

    log::set_max_level(log::LevelFilter::Info);
    let lines = cycle(&client).await;
    assert!(!named(&lines, "distlock.acquire"), "{lines:?}");

    log::set_max_level(log::LevelFilter::Debug);
    let lines = cycle(&client).await;
    assert!(named(&lines, "distlock.acquire"), "{lines:?}");
    assert!(named(&lines, "distlock.release"), "{lines:?}");
}
