//! `distlock-compare client-shape` (hidden): one client shape of
//! [`super::shapes`] alone, for finding where its time goes. It starts the
//! server kind it is given with the servers' durable defaults (or uses a
//! URL), opens the shape's clients, prints this process's threads by name,
//! then cycles for the window and prints what the window cost: cycles per
//! second, this process's CPU and context switches per cycle, the CPU of
//! the servers it started (its child processes) per cycle, and the threads
//! again. A pause before the window (`--pause`) leaves time to attach
//! `strace -c -f -p PID` or `perf` to this process alone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{Contender, Ours};
use conformance::servers::{Durability, set_durability};
use lock_core::LockError;

use super::shapes::{SHAPE_TTL, cycles_for, rate};

/// Which side of the client shapes runs.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Shape {
    /// `tasks` clients, each from `distlock::connect`, one task each.
    Clients,
    /// One client shared by `tasks` tasks.
    Shared,
    /// `tasks` hand-written floor connections, one task each.
    Floor,
    /// `tasks` raw server-lock connections (SQL session mode), one task
    /// each.
    Raw,
    /// `tasks` clients of the driver's client library alone (ZooKeeper,
    /// etcd, Redis on one server, Redlock), one task each.
    CrateAlone,
    /// One client of the driver's client library alone shared by `tasks`
    /// tasks.
    SharedCrateAlone,
}

/// The probe's settings (the hidden subcommand's arguments).
#[derive(Debug)]
pub(crate) struct ProbeOptions {
    pub(crate) target: String,
    pub(crate) shape: Shape,
    pub(crate) tasks: usize,
    pub(crate) window: Duration,
    pub(crate) pause: Duration,
}

/// CPU time (clock ticks) and context switches of a set of processes.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    ticks: u64,
    voluntary: u64,
    involuntary: u64,
}

impl Usage {
    fn since(self, before: Self) -> Self {
        Self {
            ticks: self.ticks.saturating_sub(before.ticks),
            voluntary: self.voluntary.saturating_sub(before.voluntary),
            involuntary: self.involuntary.saturating_sub(before.involuntary),
        }
    }
}

/// `utime + stime` of process `pid` (field 14 and 15 of its `stat`, after
/// the parenthesised name) and its parent's pid.
fn stat_of(pid: u32) -> Option<(u64, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime, ppid))
}

/// The context switches of every live thread of `pid`.
fn switches_of(pid: u32) -> (u64, u64) {
    let mut out = (0, 0);
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        for line in status.lines() {
            let value = |l: &str| l.split_whitespace().nth(1)?.parse::<u64>().ok();
            if line.starts_with("voluntary_ctxt_switches") {
                out.0 += value(line).unwrap_or(0);
            } else if line.starts_with("nonvoluntary_ctxt_switches") {
                out.1 += value(line).unwrap_or(0);
            }
        }
    }
    out
}

/// Every live descendant of `root` (its child processes, theirs, ...).
fn descendants(root: u32) -> Vec<u32> {
    let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            if let Some((_, ppid)) = stat_of(pid) {
                parent.insert(pid, ppid);
            }
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let of = found[i];
        found.extend(parent.iter().filter(|(_, p)| **p == of).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

fn usage(pids: &[u32]) -> Usage {
    pids.iter().fold(Usage::default(), |acc, &pid| {
        let (voluntary, involuntary) = switches_of(pid);
        Usage {
            ticks: acc.ticks + stat_of(pid).map_or(0, |(t, _)| t),
            voluntary: acc.voluntary + voluntary,
            involuntary: acc.involuntary + involuntary,
        }
    })
}

/// This process's threads, counted by name.
fn threads() -> BTreeMap<String, usize> {
    let mut names = BTreeMap::new();
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            let name = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            *names.entry(name.trim().to_owned()).or_insert(0) += 1;
        }
    }
    names
}

fn say_threads(when: &str) {
    let names = threads();
    let total: usize = names.values().sum();
    let list: Vec<String> = names.iter().map(|(n, c)| format!("{n} x{c}")).collect();
    eprintln!("threads {when}: {total} ({})", list.join(", "));
}

fn no_crate_alone() -> LockError {
    LockError::config("no client library alone here (ZooKeeper, etcd, Redis, Redlock only)")
}

/// Runs the probe (see the module docs); prints its figures as JSON on
/// stdout.
///
/// # Errors
///
/// The server could not start, a client or floor could not connect, a
/// cycle failed.
pub(crate) async fn run(opts: &ProbeOptions) -> Result<u8, LockError> {
    let keep;
    let url = if opts.target.contains(':') {
        keep = None;
        opts.target.clone()
    } else {
        set_durability(Durability::ServerDefaults);
        let started = super::candidate(&opts.target).await;
        set_durability(Durability::Fast);
        let c = started.map_err(LockError::config)?;
        let url = c.target.url().unwrap_or_else(|| c.url.clone());
        keep = Some(c);
        url
    };
    let me = std::process::id();
    say_threads("before connecting");
    let contenders: Vec<Arc<dyn Contender>> = match opts.shape {
        Shape::Clients => {
            let mut out: Vec<Arc<dyn Contender>> = Vec::with_capacity(opts.tasks);
            for _ in 0..opts.tasks {
                out.push(Arc::new(Ours::new(
                    distlock::connect(&url).await?,
                    SHAPE_TTL,
                )));
            }
            out
        }
        Shape::Shared => {
            let one: Arc<dyn Contender> =
                Arc::new(Ours::new(distlock::connect(&url).await?, SHAPE_TTL));
            vec![one; opts.tasks]
        }
        Shape::Floor => crate::floors::contenders(&url, SHAPE_TTL, opts.tasks)
            .await
            .ok_or_else(|| LockError::config("this backend has no floor"))?,
        Shape::Raw => crate::floors::raw_server_locks(&url, opts.tasks)
            .await
            .ok_or_else(|| LockError::config("no raw server lock here (SQL session mode only)"))?,
        Shape::CrateAlone => crate::floors::crate_alone(&url, SHAPE_TTL, opts.tasks)
            .await
            .map(|(_, alone)| alone)
            .ok_or_else(no_crate_alone)?,
        Shape::SharedCrateAlone => {
            let one = crate::floors::crate_alone(&url, SHAPE_TTL, 1)
                .await
                .and_then(|(_, mut alone)| alone.pop())
                .ok_or_else(no_crate_alone)?;
            vec![one; opts.tasks]
        }
    };
    let prefix = format!(
        "probe-{}/{:?}",
        &lock_core::OwnerId::random().to_hex()[..8],
        opts.shape
    );
    cycles_for(&contenders, &prefix, Duration::from_millis(200)).await?;
    say_threads("connected and warm");
    eprintln!(
        "pid {me}: measuring {:?} x{} for {:?} in {:?}",
        opts.shape, opts.tasks, opts.window, opts.pause
    );
    tokio::time::sleep(opts.pause).await;
    let servers = descendants(me);
    let (ours_before, servers_before) = (usage(&[me]), usage(&servers));
    let (cycles, wall) = cycles_for(&contenders, &prefix, opts.window).await?;
    let (ours, server) = (
        usage(&[me]).since(ours_before),
        usage(&servers).since(servers_before),
    );
    say_threads("after the window");
    // Clock ticks are 10 ms on Linux (USER_HZ 100).
    #[allow(clippy::cast_precision_loss)]
    let per_cycle = |v: u64, scale: f64| v as f64 * scale / cycles.max(1) as f64;
    let report = serde_json::json!({
        "url": distlock::redact_url(&url),
        "shape": clap::ValueEnum::to_possible_value(&opts.shape)
            .map(|v| v.get_name().to_owned()),
        "tasks": opts.tasks,
        "cycles_per_s": rate((cycles, wall)),
        "client_cpu_us_per_cycle": per_cycle(ours.ticks, 10_000.0),
        "client_voluntary_switches_per_cycle": per_cycle(ours.voluntary, 1.0),
        "client_involuntary_switches_per_cycle": per_cycle(ours.involuntary, 1.0),
        "server_processes": servers.len(),
        "server_cpu_us_per_cycle": per_cycle(server.ticks, 10_000.0),
        "server_voluntary_switches_per_cycle": per_cycle(server.voluntary, 1.0),
    });
    println!("{}", serde_json::to_string(&report).unwrap_or_default());
    drop(contenders);
    drop(keep);
    Ok(0)
}
