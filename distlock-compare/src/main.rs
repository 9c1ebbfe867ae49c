//! `distlock-compare`: the backends side by side (the conformance suite,
//! fault scenarios and benchmarks), and the suite against a server you run.
//!
//! It lives outside the `distlock` command so that the command a user
//! installs links neither the conformance suite nor the test kit. The
//! scenarios' lock holders are real `distlock run` processes: the
//! `distlock` binary next to this one (`cargo build --release -p
//! distlock-cli`), else `DISTLOCK_BIN`, else the one on `PATH`.
//!
//! Exit codes: 0 every verdict held; 1 a conformance case failed or a
//! scenario showed a violation; 2 usage or configuration error; 69 a
//! backend failed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use distlock::{Config, LockError, parse_duration};
use lock_core::ErrorKind;

mod compare;
mod fence_store;
mod floors;
mod holder;
mod html;
mod metrics;

// The comparison measures heap bytes per held lock.
#[global_allocator]
static ALLOCATOR: conformance::scale::CountingAllocator = conformance::scale::CountingAllocator;

/// The distlock backends compared side by side, and the conformance suite
/// against a server you run.
#[derive(Parser, Debug)]
#[command(name = "distlock-compare", version, about)]
struct Cli {
    /// Backend URL for `check` (memory://, sqlite://path, postgres://,
    /// redis://, etcd://, zk://, ...).
    #[arg(long, global = true)]
    url: Option<String>,
    /// TOML config file for `check` (its url).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// A label every grant of this process carries beside its host, pid
    /// and program; also DISTLOCK_LABEL.
    #[arg(long, global = true, value_name = "TEXT", env = "DISTLOCK_LABEL")]
    label: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Compare backends side by side: the conformance suite, fault
    /// scenarios and benchmarks, one row per backend.
    ///
    /// Without servers it compares the embedded backends (memory, SQLite, file locks).
    /// With --spawn it also starts every server it finds installed (Redis,
    /// etcd, ZooKeeper, PostgreSQL, MariaDB, plus a Redis master with an
    /// async replica and five Redlock servers; with --full also a 3-member
    /// etcd cluster, a 3-node ZooKeeper ensemble and a Redis Sentinel
    /// deployment) on loopback ports in
    /// temporary directories and stops them afterwards. The replicated and
    /// clustered deployments add the scenarios replica_failover,
    /// minority_down and majority_down.
    ///
    /// --quick checks the mutex only, in under 5 minutes with every server
    /// on two cores: its conformance cases and fault matrix (the verdict
    /// stages of three backends at a time, then the benchmarks one backend
    /// at a time), its figures with fewer rounds; the other shapes'
    /// cases, scenarios and figures are left to the run without --quick,
    /// and the report lists them. Exits 1 if any conformance case fails or
    /// any scenario shows a violation (including a negative control that
    /// was not flagged).
    #[command(after_help = "Examples:
  distlock-compare compare
  distlock-compare compare --spawn --quick --json report.json --html report.html
  distlock-compare compare --backends redis,etcd --spawn
  distlock-compare compare --backends redis-replica,redlock,etcd-cluster,zookeeper-ensemble --spawn
  distlock-compare compare --with redis://10.0.0.5:6379
  distlock-compare compare --spawn --soak 10m --backends etcd-cluster
  distlock-compare compare --spawn --soak 2m --netns --backends postgres-session,etcd-cluster")]
    Compare {
        /// Backends to compare (comma separated; the list is in the long
        /// help). Default: the embedded ones, plus with --spawn every server
        /// kind except etcd-cluster, zookeeper-ensemble and redis-sentinel,
        /// which only --full adds.
        #[arg(long, value_delimiter = ',', long_help = backends_help())]
        backends: Option<Vec<String>>,
        /// Start the servers on loopback.
        #[arg(long)]
        spawn: bool,
        /// Also compare the backend at this URL (repeatable; no fault
        /// injection there).
        #[arg(long = "with")]
        urls: Vec<String>,
        /// The mutex only, fewer rounds (under 5 minutes with every server
        /// on two cores); the report names the checks left to the run
        /// without --quick.
        #[arg(long, conflicts_with = "full")]
        quick: bool,
        /// Longer run: more iterations, 10,000 cancelled acquires, longer
        /// node-loss runs, and the etcd cluster and ZooKeeper ensemble.
        #[arg(long)]
        full: bool,
        /// Skip the fault scenarios.
        #[arg(long)]
        no_scenarios: bool,
        /// Write every figure as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write a self-contained HTML report to this file.
        #[arg(long)]
        html: Option<PathBuf>,
        /// Instead of the comparison: a randomized fault soak of this
        /// length per backend (clients take locks and update a counter
        /// under them while a nemesis injects partitions, latency, client
        /// and server pauses, server restarts, leader kills and, on the
        /// etcd cluster and ZooKeeper ensemble, member partitions). Exits 1
        /// on a violation the backend promises to avoid; violations in
        /// known unsafe cases are reported as negative controls.
        #[arg(long, value_parser = duration_arg, conflicts_with_all = ["full", "no_scenarios", "html"])]
        soak: Option<Duration>,
        /// With --soak: the seed of the fault schedule and the clients'
        /// choices (printed by every soak; replays its schedule).
        #[arg(long, requires = "soak")]
        seed: Option<u64>,
        /// With --soak: start each backend's servers in a lab of network
        /// namespaces (one host per server, per cluster member and per
        /// worker) and cut the partitions in the kernel instead of in
        /// proxies: a client partition isolates the worker's host, a
        /// member partition cuts a member's host from its peers', a
        /// member-client partition cuts the single-member worker's host
        /// from its member's. No client latency (it needs a proxy). Needs
        /// root and iproute2; for redis, redlock, etcd, etcd-cluster,
        /// zookeeper, zookeeper-ensemble, postgres, postgres-session,
        /// mariadb and mariadb-session.
        #[arg(long, requires = "soak")]
        netns: bool,
        /// With --soak: the real fenced store every write also goes to
        /// (lock-fence's SQL adapter on a SQLite file, or its Redis
        /// adapter on a redis-server of its own), outside the faults.
        #[arg(long, value_enum, requires = "soak", default_value = "sqlite")]
        fence_store: fence_store::Kind,
    },
    /// Run the conformance suite and the scenarios that need no process
    /// control against a server you point at (--url).
    #[command(after_help = "Example:
  distlock-compare --url redis://127.0.0.1:6379 check")]
    Check {
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Internal: one client shape of compare's benchmarks alone (8
    /// clients, 1 client shared by 8 tasks, or 8 floor connections) on a
    /// server kind it starts with its durable defaults, or on a URL;
    /// prints the threads, then the window's cycles/s, CPU and context
    /// switches per cycle as JSON. --pause leaves time to attach strace
    /// or perf to this process.
    #[command(hide = true)]
    ClientShape {
        /// Which side runs.
        #[arg(long, value_enum)]
        shape: compare::probe::Shape,
        /// Clients or tasks.
        #[arg(long, default_value_t = 8)]
        tasks: usize,
        /// How long it cycles.
        #[arg(long, value_parser = duration_arg, default_value = "10s")]
        window: Duration,
        /// How long it waits, connected, before the window.
        #[arg(long, value_parser = duration_arg, default_value = "0s")]
        pause: Duration,
        /// A server kind (postgres, redis, ...) or a backend URL.
        target: String,
    },
    /// Internal to compare: holds many locks on URL with one client in
    /// this process, counts the heap per held lock and the renewal round
    /// trips, and prints the report as JSON (compare runs it as a child,
    /// so that its own heap does not blur the measurement).
    #[command(hide = true)]
    HeldAtScale {
        /// How many locks to hold.
        #[arg(long)]
        locks: usize,
        /// The keys' prefix (keys are `<prefix><index>`).
        #[arg(long)]
        key_prefix: String,
        /// The backend URL.
        url: String,
    },
}

fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.message().to_owned())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("distlock-compare: {err}");
            ExitCode::from(code_for(&err))
        }
    }
}

/// The `distlock` command's codes for the same errors.
fn code_for(err: &LockError) -> u8 {
    match err.kind() {
        ErrorKind::InvalidArgument | ErrorKind::Config | ErrorKind::Unsupported => 2,
        _ => 69,
    }
}

/// The backend `check` runs against: --url, --config, or the environment
/// (DISTLOCK_URL, DISTLOCK_CONFIG), as for `distlock`.
fn check_config(url: Option<String>, file: Option<PathBuf>) -> Result<Config, LockError> {
    match (url, file) {
        (Some(url), _) => Config::from_url(&url),
        (None, Some(file)) => Config::from_file(file),
        (None, None) => Config::from_env(),
    }
}

fn write_report(path: &std::path::Path, text: &str) -> Result<(), LockError> {
    std::fs::write(path, text).map_err(|e| {
        LockError::config(format!("cannot write {}", path.display())).with_source(e)
    })?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

async fn dispatch(cli: Cli) -> Result<u8, LockError> {
    if let Some(label) = &cli.label {
        distlock::set_holder_label(Some(label))?;
    }
    match cli.command {
        Command::Compare {
            backends,
            spawn,
            urls,
            quick,
            full,
            no_scenarios,
            json,
            html,
            soak,
            seed,
            netns,
            fence_store,
        } => {
            if let Some(duration) = soak {
                let opts = compare::CompareOptions {
                    backends,
                    urls,
                    spawn,
                    quick: false,
                    full: false,
                    scenarios: false,
                    json,
                    html: None,
                };
                let results = compare::soak(&opts, duration, seed, netns, fence_store).await?;
                compare::print_soak(&results);
                if let Some(path) = &opts.json {
                    let text = serde_json::to_string_pretty(&compare::soak_json(&results))
                        .unwrap_or_default();
                    write_report(path, &text)?;
                }
                return Ok(u8::from(results.iter().any(compare::SoakResult::failed)));
            }
            let opts = compare::CompareOptions {
                backends,
                urls,
                spawn,
                quick,
                full,
                scenarios: !no_scenarios,
                json,
                html,
            };
            let started = std::time::Instant::now();
            let results = compare::run(&opts).await?;
            compare::print_table(&results);
            println!("compare took {:.0} s", started.elapsed().as_secs_f64());
            if let Some(path) = &opts.json {
                let text =
                    serde_json::to_string_pretty(&compare::to_json(&results)).unwrap_or_default();
                write_report(path, &text)?;
            }
            if let Some(path) = &opts.html {
                write_report(path, &html::render(&results))?;
            }
            Ok(u8::from(results.iter().any(compare::BackendResult::failed)))
        }
        Command::HeldAtScale {
            locks,
            key_prefix,
            url,
        } => compare::held_at_scale_child(&url, locks, &key_prefix).await,
        Command::ClientShape {
            shape,
            tasks,
            window,
            pause,
            target,
        } => {
            let opts = compare::probe::ProbeOptions {
                target,
                shape,
                tasks,
                window,
                pause,
            };
            compare::probe::run(&opts).await
        }
        Command::Check { json } => {
            let config = check_config(cli.url, cli.config)?;
            if config.migration.is_some() {
                return Err(LockError::config("check takes a single backend URL"));
            }
            let results = compare::check(&config.url).await;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&compare::to_json(&results)).unwrap_or_default()
                );
            } else {
                compare::print_table(&results);
            }
            Ok(u8::from(results.iter().any(compare::BackendResult::failed)))
        }
    }
}

/// The long help of `compare --backends`, from the embedded backends and
/// the test kit's table of deployment kinds.
fn backends_help() -> String {
    format!(
        "Backends to compare, comma separated: {}, {}. Default: the embedded \
         ones, plus with --spawn every server kind except etcd-cluster, \
         zookeeper-ensemble, redis-sentinel and the other libraries' layouts (-plain, \
         -redisson, -kazoo, -shedlock), which only --full adds.",
        compare::EMBEDDED.join(", "),
        conformance::deploy::kind_names().join(", ")
    )
}
