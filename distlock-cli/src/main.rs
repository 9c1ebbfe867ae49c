//! The `distlock` command: run a command under a distributed lock, take,
//! renew, release and inspect locks from the shell. (Comparing backends is
//! `distlock-compare`'s job: this command links no test code.)
//!
//! Exit codes (see `distlock --help`):
//! 0 success; the command's own status for `run`; 1 `release`/`renew` of a
//! lock that is not held; 2 usage or configuration error; 69 backend
//! unavailable or failed; 75 lock held by someone else past `--wait`
//! (override with `--conflict-exit-code`); 76 lock lost while the command
//! ran; 77 lock lost before the command started (it did not run); 126 the
//! command could not be started.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use distlock::{Config, LockError, parse_duration};
use lock_core::{ErrorKind, Lease, LeaseKind, LockBackendExt, LockClient};

mod admin;
mod keeper;
mod listing;
mod metrics_http;
mod run;

/// Process exit codes.
mod exit {
    /// A `release`/`renew` found the lock not held.
    pub(crate) const NOT_HELD: u8 = 1;
    /// Bad usage, URL, duration, key or config.
    pub(crate) const USAGE: u8 = 2;
    /// The backend could not be reached or failed.
    pub(crate) const UNAVAILABLE: u8 = 69;
    /// The lock stayed held by someone else past --wait (like `flock -w`).
    pub(crate) const CONTENDED: u8 = 75;
    /// `run`/`elect`: the lock was lost while the command ran.
    pub(crate) const LOCK_LOST: u8 = 76;
    /// `run`/`elect`: the lock was lost before the command started (it
    /// did not run).
    pub(crate) const LOST_BEFORE_START: u8 = 77;
    /// `run --once-per`: a run under this lock succeeded within the period;
    /// the command was skipped.
    pub(crate) const RAN_RECENTLY: u8 = 78;
    /// The command could not be started.
    pub(crate) const CANNOT_EXEC: u8 = 126;
}

const AFTER_HELP: &str = "\
Backend: --url, or --config FILE (TOML), or the environment (DISTLOCK_URL,
DISTLOCK_CONFIG, DISTLOCK_TTL, DISTLOCK_WAIT, DISTLOCK_REQUIRE).
Durations: 500ms, 30s, 5m, 1h, 1m30s.

Exit codes: 0 ok (run: the command's own status); 1 not held (release,
renew); 2 usage or configuration error; 69 backend unavailable; 75 lock
held by someone else past --wait; 76 lock lost while the command ran;
77 lock lost before the command started (not run); 126 command could not
be started.";

/// Distributed locks from the shell.
#[derive(Parser, Debug)]
#[command(name = "distlock", version, about, after_help = AFTER_HELP)]
struct Cli {
    /// Backend URL (memory://, sqlite://path, postgres://, redis://, etcd://, zk://, ...).
    #[arg(long, global = true, long_help = url_help())]
    url: Option<String>,
    /// TOML config file (url, ttl, wait, require).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Serve the library's metrics in Prometheus text on this address
    /// (`127.0.0.1:9464`) while the command runs: a `run` holding its
    /// lock, an `elect` leading. Every path answers with the metrics.
    #[arg(long, global = true, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// A label every grant of this process carries beside its host, pid
    /// and program (shown by `inspect`, `list`, `watch`); also
    /// DISTLOCK_LABEL.
    #[arg(long, global = true, value_name = "TEXT", env = "DISTLOCK_LABEL")]
    label: Option<String>,
    #[command(subcommand)]
    command: Command,
}

/// Which kind of lock a command takes (default: the mutex).
#[derive(clap::Args, Debug, Clone, Copy)]
struct KindArgs {
    /// Take a read share of KEY's read-write lock (many readers at once,
    /// never beside a writer). A read-write lock is not the mutex of the
    /// same name.
    #[arg(long, conflicts_with_all = ["write", "semaphore"])]
    shared: bool,
    /// Take the write side of KEY's read-write lock (the counterpart of
    /// --shared: one writer, no reader).
    #[arg(long, conflicts_with = "semaphore")]
    write: bool,
    /// Take permits of KEY's semaphore of N permits (every client of it
    /// must say the same N).
    #[arg(long, value_name = "N")]
    semaphore: Option<u32>,
    /// With --semaphore: how many permits to take at once (default 1).
    #[arg(long, value_name = "M", requires = "semaphore")]
    permits: Option<u32>,
}

impl KindArgs {
    fn kind(self) -> LeaseKind {
        if self.shared {
            LeaseKind::Read
        } else if self.write {
            LeaseKind::Write
        } else if let Some(limit) = self.semaphore {
            LeaseKind::Permits {
                count: self.permits.unwrap_or(1),
                limit,
            }
        } else {
            LeaseKind::Exclusive
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a command while holding a lock (a distributed flock).
    ///
    /// The lock is renewed while the command runs and released when it
    /// exits; distlock exits with the command's status. The command sees
    /// DISTLOCK_KEY, DISTLOCK_FENCING_TOKEN, DISTLOCK_OWNER and
    /// DISTLOCK_HANDLE, runs in its own process group, and receives the
    /// signals distlock gets (INT, TERM, HUP, QUIT, USR1, USR2).
    ///
    /// When renewals do not keep up, the command is stopped BEFORE the
    /// lock's deadline, not after it: with --on-lost term it gets SIGTERM
    /// at deadline - kill_after - margin and SIGKILL at deadline - margin,
    /// where margin = max(100ms, 5% of the TTL); with --on-lost kill,
    /// SIGKILL at deadline - margin. The deadline is the lock's local
    /// validity deadline (send time + TTL - clock drift), which comes
    /// before the server can give the key to anyone else. Both points
    /// follow the deadline: a renewal that succeeds moves them out. A
    /// --kill-after longer than TTL/2 - margin does not fit and is
    /// shortened to that (with a warning). A lock lost before its
    /// deadline (renewal refused) means SIGTERM at once and SIGKILL after
    /// --kill-after, at the latest at deadline - margin.
    #[command(after_help = "Examples:
  distlock --url sqlite:///var/lib/app/locks.db run nightly -- ./backup.sh
  distlock --url redis://127.0.0.1:6379 run --wait 30s --ttl 10s jobs/report -- make report
  distlock run --on-lost kill --wait 0 cron/cleanup -- ./cleanup --fast
  distlock run --shared --wait 1m reports/db -- ./read-report.sh
  distlock run --semaphore 4 --wait 10m encoders -- ./encode.sh in.mp4

Stop margin: with --ttl 10s the command is gone 500ms before the lock's
deadline; --kill-after may be at most 4.5s (TTL/2 - margin).")]
    Run {
        /// Lease TTL (renewed about every TTL/3).
        #[arg(long, value_parser = duration_arg)]
        ttl: Option<Duration>,
        /// How long to wait for a held lock (0 = fail at once).
        #[arg(long, value_parser = duration_arg)]
        wait: Option<Duration>,
        /// What to do with the command if the lock may be lost (renewals
        /// not keeping up) or is lost: stop it before the deadline (term,
        /// kill), or let it run on (ignore).
        #[arg(long, value_enum, default_value = "term")]
        on_lost: run::OnLost,
        /// With --on-lost term: the time between SIGTERM and SIGKILL
        /// (default 10s, at most TTL/2 - margin).
        #[arg(long, value_parser = duration_arg)]
        kill_after: Option<Duration>,
        /// Exit code when the lock could not be had within --wait.
        #[arg(long, default_value_t = exit::CONTENDED)]
        conflict_exit_code: u8,
        /// Keep the lock until at least this long after it was granted,
        /// even when the command ends sooner (the process stays to renew
        /// it): a job started on several hosts with skewed clocks runs
        /// once per window (with --wait 0).
        #[arg(long, value_parser = duration_arg)]
        at_least: Option<Duration>,
        /// Run the command only if no run under this lock succeeded within
        /// this period (at most 24h): a successful run leaves a record
        /// beside the lock, written only while the lock is still held,
        /// that lasts the period; a host that gets the lock within it
        /// skips the command and exits 78. A failed or fenced-out run
        /// does not count.
        #[arg(long, value_parser = duration_arg)]
        once_per: Option<Duration>,
        #[command(flatten)]
        kind: KindArgs,
        /// The lock's name.
        key: String,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run a command only while this process leads election NAME, and stop
    /// it when leadership is lost (with the same stop margin as `run
    /// --on-lost`). Campaigns until it leads (--wait bounds that). The
    /// command sees DISTLOCK_ELECTION and DISTLOCK_TERM (the term, a fencing
    /// token that grows with every new leader), besides run's variables.
    /// The campaign uses the backend's election layout: etcd's
    /// `concurrency.Election` (seen by `etcdctl elect`), Curator's
    /// `LeaderLatch` on ZooKeeper, and the renewed lock `election/NAME`
    /// elsewhere.
    #[command(after_help = "Examples:
  distlock --url redis://127.0.0.1:6379 elect scheduler -- ./scheduler --serve
  distlock --url postgres://db/locks elect --ttl 10s --wait 1m reports -- ./report.sh")]
    Elect {
        /// Leadership lease TTL (renewed about every TTL/3).
        #[arg(long, value_parser = duration_arg)]
        ttl: Option<Duration>,
        /// How long to campaign (default: until it leads).
        #[arg(long, value_parser = duration_arg)]
        wait: Option<Duration>,
        /// What to do with the command if leadership may be lost.
        #[arg(long, value_enum, default_value = "term")]
        on_lost: run::OnLost,
        /// With --on-lost term: the time between SIGTERM and SIGKILL.
        #[arg(long, value_parser = duration_arg)]
        kill_after: Option<Duration>,
        /// Exit code when leadership could not be had within --wait.
        #[arg(long, default_value_t = exit::CONTENDED)]
        conflict_exit_code: u8,
        /// The election's name.
        name: String,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Write stdin to FILE only if the fencing token is not below the last
    /// token that wrote FILE (kept in FILE.fence): the resource side of
    /// `run`'s DISTLOCK_FENCING_TOKEN for a job that writes a file. Replaces
    /// FILE atomically (or appends with --append); a stale token changes
    /// nothing and exits 76.
    #[command(after_help = "Example:
  distlock --url redis://127.0.0.1:6379 run nightly -- sh -c './report | distlock fence-write out/report.txt'")]
    FenceWrite {
        /// Append instead of replacing.
        #[arg(long)]
        append: bool,
        /// The writer's fencing token (set by `distlock run`).
        #[arg(long, env = "DISTLOCK_FENCING_TOKEN")]
        token: u64,
        /// The file to write.
        file: std::path::PathBuf,
    },
    /// Take a lock and print a handle for `renew` / `release` (the lock is
    /// not renewed: it expires with its TTL unless renewed).
    #[command(after_help = "Example:
  h=$(distlock --url sqlite://locks.db acquire --ttl 5m deploy)
  distlock --url sqlite://locks.db renew --handle \"$h\"
  distlock --url sqlite://locks.db release --handle \"$h\"")]
    Acquire {
        /// Lease TTL.
        #[arg(long, value_parser = duration_arg)]
        ttl: Option<Duration>,
        /// How long to wait for a held lock.
        #[arg(long, value_parser = duration_arg)]
        wait: Option<Duration>,
        #[command(flatten)]
        kind: KindArgs,
        /// The lock's name.
        key: String,
    },
    /// Extend a lock taken with `acquire` by its TTL.
    Renew {
        /// The handle `acquire` printed.
        #[arg(long)]
        handle: String,
    },
    /// Release a lock taken with `acquire` (exit 1 if it was not held).
    Release {
        /// The handle `acquire` printed.
        #[arg(long)]
        handle: String,
    },
    /// Show who holds a lock: holder, fencing token, remaining TTL; on a
    /// backend with read-write locks or semaphores, also every reader,
    /// writer and permit holder of the read-write lock and the semaphore
    /// of that name.
    #[command(after_help = "Example:
  distlock --url redis://127.0.0.1:6379 inspect jobs/report --json")]
    Inspect {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The lock's name.
        key: String,
    },
    /// List the locks held under PREFIX (every key by default): mutexes,
    /// read-write locks, semaphores and elections with a leader (--shape
    /// picks one), each holder with its token, remaining TTL and who took
    /// it (host, program, pid, time, label). One bounded page of each
    /// shape at a time (--limit); `more: --shape S --cursor C` continues,
    /// --all pages to the end.
    #[command(after_help = "Examples:
  distlock --url redis://127.0.0.1:6379 list jobs/
  distlock --url redis://127.0.0.1:6379 list jobs/ --shape rwlock
  distlock --url postgres://db/locks list --all --json")]
    List {
        /// Only keys starting with this text.
        #[arg(default_value = "")]
        prefix: String,
        /// Locks per page (1 to 1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Continue from a previous page.
        #[arg(long)]
        cursor: Option<String>,
        /// Every page.
        #[arg(long)]
        all: bool,
        /// Which locks: mutexes, read-write locks, semaphores, elections
        /// with a leader, or all of them.
        #[arg(long, value_enum, default_value = "all")]
        shape: listing::ListShape,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Who leads the election NAME: holder, term, remaining TTL and who
    /// campaigned (host, program, pid, time of the win, label).
    #[command(after_help = "Example:
  distlock --url etcd://127.0.0.1:2379 leader scheduler --json")]
    Leader {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// The election's name.
        name: String,
    },
    /// Break a stuck lock, whoever holds it (logged with who ran it). On a
    /// backend with fencing tokens the next grant's token is above the
    /// broken one, so a resource that checks tokens rejects the old
    /// holder's late writes; a backend without tokens is refused unless
    /// --yes-unfenced, and distlock's own reserved keys (`__distlock/...`)
    /// unless --reserved. Exit 1 when the key was free.
    #[command(name = "force-release")]
    ForceRelease {
        /// The lock's name.
        key: String,
        /// Break it even though the backend has no fencing tokens.
        #[arg(long)]
        yes_unfenced: bool,
        /// Break it even though it is one of distlock's own reserved keys
        /// (`__distlock/...`, such as a migration's cutover marker, which
        /// keeps processes still on phase `old` out once `new` runs).
        #[arg(long)]
        reserved: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Follow a lock's holders: a line now and one each time the holder
    /// changes (polled every --interval).
    Watch {
        /// The lock's name.
        key: String,
        /// How often to look.
        #[arg(long, value_parser = duration_arg, default_value = "200ms")]
        interval: Duration,
        /// Stop after this many changes.
        #[arg(long)]
        changes: Option<u64>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Remove stale per-key state (Redis token counters, SQL rows) of keys
    /// nobody took for --older-than, never letting a key's token go
    /// backwards (a token floor that new keys start above).
    Gc {
        /// How long a key must have been unused (`30d`, `12h`).
        #[arg(long, value_parser = duration_arg)]
        older_than: Duration,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Moved to `distlock-compare`: `compare` and `check` link the
    /// conformance suite and the test kit, which the installed command does
    /// not carry. Says where they went (exit 2).
    #[command(hide = true, disable_help_flag = true)]
    Compare {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// See `Compare`.
    #[command(hide = true, disable_help_flag = true)]
    Check {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// Every holder of `key`: the mutex's, then, where the backend has them,
/// the read-write lock's and the semaphore's of the same name.
fn duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.message().to_owned())
}

fn main() -> ExitCode {
    // Before any thread exists: `distlock run` starts this binary again as
    // its command's keeper.
    keeper::run_if_keeper();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(async_main()),
        Err(err) => {
            eprintln!("distlock: cannot start the runtime: {err}");
            ExitCode::from(exit::UNAVAILABLE)
        }
    }
}

async fn async_main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli).await {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            eprintln!("distlock: {err}");
            ExitCode::from(code_for(&err))
        }
    }
}

fn code_for(err: &LockError) -> u8 {
    match err.kind() {
        ErrorKind::InvalidArgument | ErrorKind::Config | ErrorKind::Unsupported => exit::USAGE,
        ErrorKind::Contended => exit::CONTENDED,
        ErrorKind::NotHeld => exit::NOT_HELD,
        // A lease found lost by `renew` or `release` is simply not held;
        // 76 is for a command that ran under a lock that was lost.
        ErrorKind::LeaseLost => exit::NOT_HELD,
        _ => exit::UNAVAILABLE,
    }
}

fn config(url: Option<String>, file: Option<PathBuf>) -> Result<Config, LockError> {
    match (url, file) {
        (Some(url), _) => {
            let mut config = Config::from_url(&url)?;
            // Options from the environment still apply over a URL flag.
            if let Ok(ttl) = std::env::var("DISTLOCK_TTL") {
                config.defaults.ttl = parse_duration(&ttl)?;
            }
            if let Ok(wait) = std::env::var("DISTLOCK_WAIT") {
                config.defaults.wait = parse_duration(&wait)?;
            }
            if let Ok(require) = std::env::var("DISTLOCK_REQUIRE") {
                config.requirements = distlock::parse_requirements(require.split(','))?;
            }
            Ok(config)
        }
        (None, Some(file)) => Config::from_file(file),
        (None, None) => Config::from_env(),
    }
}

async fn client(url: Option<String>, file: Option<PathBuf>) -> Result<LockClient, LockError> {
    distlock::connect_config(&config(url, file)?).await
}

async fn dispatch(cli: Cli) -> Result<u8, LockError> {
    if let Some(label) = &cli.label {
        distlock::set_holder_label(Some(label))?;
    }
    if let Some(addr) = cli.metrics_addr {
        metrics_http::serve(addr, metrics_http::install()?).await?;
    }
    match cli.command {
        Command::Run {
            ttl,
            wait,
            on_lost,
            kill_after,
            conflict_exit_code,
            at_least,
            once_per,
            kind,
            key,
            command,
        } => {
            let client = client(cli.url, cli.config).await?;
            run::run(
                &client,
                run::RunArgs {
                    key,
                    kind: kind.kind(),
                    election: None,
                    at_least,
                    once_per,
                    ttl,
                    wait,
                    on_lost,
                    kill_after,
                    conflict_exit_code,
                    command,
                },
            )
            .await
        }
        Command::Elect {
            ttl,
            wait,
            on_lost,
            kill_after,
            conflict_exit_code,
            name,
            command,
        } => {
            let client = client(cli.url, cli.config).await?;
            run::run(
                &client,
                run::RunArgs {
                    key: lock_core::election::election_key(&name),
                    kind: LeaseKind::Exclusive,
                    ttl,
                    wait: Some(wait.unwrap_or(Duration::MAX)),
                    on_lost,
                    kill_after,
                    conflict_exit_code,
                    election: Some(name),
                    at_least: None,
                    once_per: None,
                    command,
                },
            )
            .await
        }
        Command::FenceWrite {
            append,
            token,
            file,
        } => fence_write(&file, token, append),
        Command::Acquire {
            ttl,
            wait,
            kind,
            key,
        } => {
            let client = client(cli.url, cli.config).await?;
            let mut request = client.lock_kind(&key, kind.kind()).no_renewal();
            if let Some(ttl) = ttl {
                request = request.ttl(ttl);
            }
            if let Some(wait) = wait {
                request = request.wait(wait);
            }
            let guard = request.acquire().await?;
            let lease = guard.lease();
            // The handle outlives this process: do not release on exit.
            std::mem::forget(guard);
            println!("{}", lease.to_handle());
            Ok(0)
        }
        Command::Renew { handle } => {
            let lease = Lease::from_handle(&handle)?;
            let client = client(cli.url, cli.config).await?;
            match client.backend().renew(&lease).await {
                Ok(deadline) => {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    println!(
                        "renewed {} for {}",
                        lease.key(),
                        distlock::format_duration(left)
                    );
                    Ok(0)
                }
                Err(err) if err.is_not_held() => {
                    eprintln!("distlock: {err}");
                    Ok(exit::NOT_HELD)
                }
                Err(err) => Err(err),
            }
        }
        Command::Release { handle } => {
            let lease = Lease::from_handle(&handle)?;
            let client = client(cli.url, cli.config).await?;
            if client.backend().release(&lease).await? {
                println!("released {}", lease.key());
                Ok(0)
            } else {
                eprintln!("distlock: {} was not held by this handle", lease.key());
                Ok(exit::NOT_HELD)
            }
        }
        Command::Inspect { json, key } => {
            let client = client(cli.url, cli.config).await?;
            admin::inspect(&client, &key, json).await
        }
        Command::List {
            prefix,
            limit,
            cursor,
            all,
            shape,
            json,
        } => {
            let client = client(cli.url, cli.config).await?;
            let request = listing::ListRequest {
                prefix: &prefix,
                shape,
                limit,
                cursor,
                all,
                json,
            };
            listing::list(&client, request).await
        }
        Command::Leader { json, name } => {
            let client = client(cli.url, cli.config).await?;
            listing::leader(&client, &name, json).await
        }
        Command::ForceRelease {
            key,
            yes_unfenced,
            reserved,
            json,
        } => {
            let client = client(cli.url, cli.config).await?;
            admin::force_release(&client, &key, yes_unfenced, reserved, json).await
        }
        Command::Watch {
            key,
            interval,
            changes,
            json,
        } => {
            let client = client(cli.url, cli.config).await?;
            admin::watch(&client, &key, interval, changes, json).await
        }
        Command::Gc { older_than, json } => {
            let client = client(cli.url, cli.config).await?;
            admin::gc(&client, older_than, json).await
        }
        Command::Compare { .. } => Ok(moved("compare")),
        Command::Check { .. } => Ok(moved("check")),
    }
}

/// `compare` and `check` from an older habit: where they went.
fn moved(what: &str) -> u8 {
    eprintln!(
        "distlock: `{what}` is not part of the distlock command; it moved to \
         distlock-compare, with the same flags: \
         cargo run --release -p distlock-compare -- {what} ..."
    );
    exit::USAGE
}

/// The long help of `--url`: one line per driver compiled in, from its
/// descriptor.
fn url_help() -> String {
    let mut help = String::from("Backend URL. This build knows:");
    for driver in distlock::backend::drivers() {
        help.push_str("\n  ");
        help.push_str(driver.summary);
    }
    help
}

/// `fence-write`: stdin to `file`, fenced by `token`.
fn fence_write(file: &std::path::Path, token: u64, append: bool) -> Result<u8, LockError> {
    use std::io::Read;
    let mut contents = Vec::new();
    if let Err(err) = std::io::stdin().read_to_end(&mut contents) {
        eprintln!("distlock: cannot read stdin: {err}");
        return Ok(exit::USAGE);
    }
    let token = lock_core::FencingToken::new(token);
    match lock_fence::file::write(file, token, &contents, append) {
        Ok(()) => Ok(0),
        Err(err @ lock_fence::FenceError::Stale { .. }) => {
            eprintln!("distlock: {err}; {} left unchanged", file.display());
            Ok(exit::LOCK_LOST)
        }
        Err(err) => {
            eprintln!("distlock: cannot write {}: {err}", file.display());
            Ok(exit::UNAVAILABLE)
        }
    }
}
