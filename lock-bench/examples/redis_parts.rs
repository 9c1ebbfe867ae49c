//! Probe (not a test): where one Redis acquire+release cycle's time goes,
//! one client, one connection per side, interleaved rounds, against a
//! redis-server this process starts (issue #39: ours over the client
//! crate alone, sending the same requests, at most 1.05x at p50; the hand
//! floor beside it, the crate's share over it reported, not chased):
//!
//! - the hand floor ([`lock_bench::redis::RedisFloor`]: the driver's
//!   acquire and release scripts by `EVALSHA`, RESP by hand on one bare
//!   TCP connection);
//! - redis-rs alone: exactly the two requests the driver sends for the
//!   cycle on one server in the native layout, on the crate's multiplexed
//!   connection opened with the driver's connection settings
//!   ([`RedisConfig::connection_config`]: the operation timeout to connect
//!   and as the crate's own response timeout, one timer per request, as
//!   the crate's defaults have too), with no lock-redis code but its key
//!   names, script texts and those settings:
//!   1. `EVALSHA <acquire> 4 <prefix>{<key>} <prefix>{<key>}:token
//!      <prefix>{<key>}:holder distlock:token-floor <owner> <ttl ms>
//!      <holder details>`;
//!   2. `EVALSHA <release> 2 <prefix>{<key>} <prefix>{<key>}:holder
//!      <owner> <prefix>{<key>}:released`;
//! - the same through redis-rs with no response timeout (no timer at
//!   all): what the crate's per-request timer costs by itself, the
//!   library's share beside the floor's (the driver bounds a single
//!   request with that timer alone, `Node::run_request`);
//! - `RedisBackend::acquire` (waiting) + `release` directly (no
//!   `LockClient`, guard or renewal scheduler);
//! - ours: `LockClient` with a waiting acquire, then `release`, as users
//!   write it.
//!
//! The floor's acquire names three keys, the driver's four (the token
//! floor key of `gc`, which the script reads only when a counter is new):
//! the same work on the server for every cycle here.
//!
//! Per side: p50, p99 and mean wall time, CPU per cycle of this process and
//! of redis-server; then ours / crate alone and crate alone / floor. With
//! `RTT_US=<µs>` each side goes through a fault proxy of its own that adds
//! that round-trip time (half each way) and counts its round trips per
//! cycle (the proxies run in this process: client CPU includes them).
//! Pin it to one CPU (the server inherits it) to take thread placement out:
//!
//! ```text
//! cargo build --release -p lock-bench --example redis_parts
//! taskset -c 0 target/release/examples/redis_parts 2000
//! RTT_US=1000 taskset -c 0 target/release/examples/redis_parts 2000
//! ```
//!
//! `ONLY=<0..4>` runs one side alone (for a profiler). `CONNECTIONS=<n>`
//! gives the driver's sides (direct and ours) `n` connections to the
//! server instead of the default (what the lanes cost one client).

mod parts_support;

use conformance::servers::redis::RedisServer;
use lock_bench::redis::{RedisFloor, cycle_requests};
use lock_core::{HolderDetails, LockClient, LockKey, OwnerId};
use lock_redis::RedisConfig;
use lock_redis::keys::{KeyNames, Scripts};
use parts_support::{BoxError, TTL};
use redis::aio::MultiplexedConnection;

const NAMES: [&str; 5] = [
    "hand floor",
    "redis-rs alone",
    "redis-rs, no timer",
    "RedisBackend direct",
    "ours (LockClient)",
];
const CRATE_ALONE: usize = 1;
const CRATE_UNTIMED: usize = 2;
const DIRECT: usize = 3;
const OURS: usize = 4;

/// The driver's two requests of a cycle through redis-rs alone.
struct CrateAlone {
    conn: MultiplexedConnection,
    scripts: Scripts,
    prefix: String,
    ttl_ms: String,
}

impl CrateAlone {
    /// The crate's multiplexed connection with the driver's settings (the
    /// operation timeout to connect and per request), or, with `untimed`,
    /// with no response timeout; and the two scripts loaded on it.
    async fn connect(url: &str, untimed: bool) -> Result<Self, BoxError> {
        let config = RedisConfig::from_url(url)?;
        let mut settings = config.connection_config();
        if untimed {
            settings = settings.set_response_timeout(None);
        }
        let mut conn = redis::Client::open(url)?
            .get_multiplexed_async_connection_with_config(&settings)
            .await?;
        let scripts = Scripts::new();
        for code in [scripts.acquire.code, scripts.release.code] {
            let _: String = redis::cmd("SCRIPT")
                .arg("LOAD")
                .arg(code)
                .query_async(&mut conn)
                .await?;
        }
        Ok(Self {
            conn,
            scripts,
            prefix: config.key_prefix().to_owned(),
            ttl_ms: TTL.as_millis().to_string(),
        })
    }

    /// The grant and the release of the free `key`, with a fresh owner and
    /// the holder details, as the driver makes them per grant.
    async fn cycle(&mut self, key: &LockKey) -> Result<(), BoxError> {
        let names = KeyNames::new(&self.prefix, key);
        let owner = OwnerId::random().to_hex();
        let details = HolderDetails::encode_current();
        let (acquire, release) =
            cycle_requests(&self.scripts, &names, &owner, &self.ttl_ms, &details);
        let (granted, _token): (i64, i64) = acquire.query_async(&mut self.conn).await?;
        assert_eq!(granted, 1, "the key is free");
        let released: i64 = release.query_async(&mut self.conn).await?;
        assert_eq!(released, 1, "the grant was still ours");
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let cycles = parts_support::cycles();
    let rtt = parts_support::rtt();
    let mut server = RedisServer::start().await?;
    let server_pid = server.process().pid();
    let proxies = parts_support::proxies(server.port(), NAMES.len(), rtt).await?;
    let url = |side: usize| {
        format!(
            "redis://127.0.0.1:{}",
            parts_support::port_of(&proxies, side, server.port())
        )
    };
    let floor = RedisFloor::connect(&url(0)).await?;
    let mut alone = CrateAlone::connect(&url(CRATE_ALONE), false).await?;
    let mut untimed = CrateAlone::connect(&url(CRATE_UNTIMED), true).await?;
    let driver_url = |side: usize| match std::env::var("CONNECTIONS") {
        Ok(n) => format!("{}?connections={n}", url(side)),
        Err(_) => url(side),
    };
    let direct = lock_redis::connect(&driver_url(DIRECT)).await?;
    let ours = LockClient::new(lock_redis::connect(&driver_url(OURS)).await?);
    let crate_key = LockKey::new("parts-crate")?;
    let untimed_key = LockKey::new("parts-untimed")?;
    let direct_key = LockKey::new("parts-direct")?;
    let measured = parts_support::interleaved(
        &NAMES,
        cycles,
        server_pid,
        &proxies,
        async |side| -> Result<(), BoxError> {
            match side {
                0 => floor.cycle("parts-floor", TTL).await?,
                CRATE_ALONE => alone.cycle(&crate_key).await?,
                CRATE_UNTIMED => untimed.cycle(&untimed_key).await?,
                DIRECT => parts_support::direct_cycle(&direct, &direct_key).await?,
                _ => parts_support::ours_cycle(&ours).await?,
            }
            Ok(())
        },
    )
    .await?;
    let rtt = rtt.map_or_else(|| "no injected RTT".to_owned(), |r| format!("{r:?} RTT"));
    println!("Redis, 1 client, {cycles} cycles per side, {rtt}:");
    measured.print(&[
        (OURS, CRATE_ALONE),
        (DIRECT, CRATE_ALONE),
        (CRATE_ALONE, CRATE_UNTIMED),
        (OURS, CRATE_UNTIMED),
        (CRATE_ALONE, 0),
        (CRATE_UNTIMED, 0),
        (OURS, 0),
    ]);
    Ok(())
}
