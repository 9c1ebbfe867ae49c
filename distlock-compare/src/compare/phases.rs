//! How long each phase of a backend's comparison took: said on stderr as
//! it ends, kept in the report (`phases` in the JSON) and summed up in the
//! terminal table, so that a slow run says where its time went.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// One timed phase.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Phase {
    /// `start servers`, `suite mutual_exclusion`, `scenario holder_killed`,
    /// `bench latency`, ...
    pub(crate) name: String,
    /// Wall-clock seconds.
    pub(crate) seconds: f64,
}

/// The phases of one backend, in the order they ran.
#[derive(Debug, Default, Serialize)]
#[serde(transparent)]
pub(crate) struct Phases(Vec<Phase>);

impl Phases {
    /// Runs `work` as the phase `name` and records its wall-clock time.
    pub(crate) async fn time<T>(&mut self, name: &str, work: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = work.await;
        self.record(name, started.elapsed());
        out
    }

    /// Records a phase timed elsewhere.
    pub(crate) fn record(&mut self, name: &str, took: Duration) {
        self.0.push(Phase {
            name: name.to_owned(),
            seconds: took.as_secs_f64(),
        });
    }

    /// The seconds of every phase whose name starts with `prefix`.
    pub(crate) fn seconds(&self, prefix: &str) -> f64 {
        self.0
            .iter()
            .filter(|p| p.name.starts_with(prefix))
            .map(|p| p.seconds)
            .sum()
    }

    /// All phases.
    pub(crate) fn all(&self) -> &[Phase] {
        &self.0
    }
}

/// One line per backend: the total, then each group of phases (`start`,
/// `suite`, `scenarios`, `bench`) and the slowest phases within it.
pub(crate) fn summary(name: &str, phases: &Phases) -> String {
    let total: f64 = phases.all().iter().map(|p| p.seconds).sum();
    let mut line = format!("{name}: {total:.0} s");
    for (group, prefix) in [
        ("start", "start "),
        ("suite", "suite "),
        ("scenarios", "scenario "),
        ("bench", "bench "),
    ] {
        let mut parts: Vec<&Phase> = phases
            .all()
            .iter()
            .filter(|p| p.name.starts_with(prefix))
            .collect();
        if parts.is_empty() {
            continue;
        }
        line.push_str(&format!("; {group} {:.1}", phases.seconds(prefix)));
        parts.retain(|p| p.name.len() > prefix.len());
        if parts.is_empty() {
            continue;
        }
        parts.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        let slowest: Vec<String> = parts
            .iter()
            .take(4)
            .map(|p| format!("{} {:.1}", &p.name[prefix.len()..], p.seconds))
            .collect();
        line.push_str(&format!(" ({})", slowest.join(", ")));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_groups_and_names_the_slowest() {
        let mut phases = Phases::default();
        phases.record("start servers", Duration::from_secs(2));
        phases.record("suite mutual_exclusion", Duration::from_secs(30));
        phases.record("scenario holder_killed", Duration::from_secs(5));
        phases.record("scenario latency_injected", Duration::from_secs(9));
        phases.record("bench latency", Duration::from_secs(1));
        assert_eq!(
            summary("redis", &phases),
            "redis: 47 s; start 2.0 (servers 2.0); suite 30.0 (mutual_exclusion 30.0); scenarios 14.0 \
             (latency_injected 9.0, holder_killed 5.0); bench 1.0 (latency 1.0)"
        );
    }
}
