//! Session-mode targets (`?mode=session`) on `postgres-session` and
//! `mariadb-session` deployments started by the harness, and the session-mode scenarios both
//! test files run.

#![allow(dead_code, unreachable_pub)] // each test binary uses part of this

pub mod rows;

use std::net::SocketAddr;
use std::sync::Arc;

use conformance::HarnessError;
use conformance::deploy::{self, DeployedTarget, Opener};
use conformance::proxy::FaultProxy;
use lock_core::{LockBackend, LockBackendExt};
use lock_sql::SqlSessionBackend;

/// Short operation timeouts so a cut-off session shows up quickly.
pub const CLIENT_OPTIONS: &str = "mode=session&timeout=1s&pool_size=4";

/// The suite's clients: [`CLIENT_OPTIONS`] with more sessions, so the
/// suite's concurrent cases rarely wait for a session's statement.
pub const SUITE_OPTIONS: &str = "mode=session&timeout=1s&pool_size=16";

/// The database behind a session target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// PostgreSQL 15.
    Pg,
    /// MariaDB 10.11.
    Maria,
}

/// A `postgres-session` or `mariadb-session` deployment: the suite runs
/// on [`SessionTarget::deployed`] (unreachable = SIGSTOP of the server,
/// proxied clients through a [`FaultProxy`]); the session scenarios below
/// also use the raw server (killing sessions, counting waits).
pub struct SessionTarget {
    pub server: Server,
    /// The suite's target.
    pub deployed: Arc<DeployedTarget>,
    /// Direct URL with [`CLIENT_OPTIONS`].
    pub url: String,
    port: u16,
}

impl SessionTarget {
    pub async fn postgres() -> Result<Self, HarnessError> {
        Self::start("postgres-session", Server::Pg).await
    }

    pub async fn mariadb() -> Result<Self, HarnessError> {
        Self::start("mariadb-session", Server::Maria).await
    }

    async fn start(kind: &str, server: Server) -> Result<Self, HarnessError> {
        let deployment = deploy::start(kind).await?;
        let port = deployment.port();
        let opener: Opener = Arc::new(|url: String| {
            Box::pin(async move {
                let url = with_options(&url, SUITE_OPTIONS);
                Ok(Arc::new(SqlSessionBackend::connect_url(&url).await?) as Arc<dyn LockBackend>)
            })
        });
        let deployed = Arc::new(DeployedTarget::new(deployment, opener));
        let url = with_options(&deployed.url(), CLIENT_OPTIONS);
        Ok(Self {
            server,
            deployed,
            url,
            port,
        })
    }

    /// The deployment's kind (`postgres-session`, `mariadb-session`).
    pub fn name(&self) -> String {
        conformance::Target::name(&*self.deployed)
    }

    /// The server's address (for a proxy in front of it).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `url` pointed at `port` instead of the server's.
    pub fn url_via(&self, url: &str, port: u16) -> String {
        url.replacen(&format!(":{}/", self.port), &format!(":{port}/"), 1)
    }

    /// A proxy in front of the server and `url` (with `options` added)
    /// pointed at it.
    pub async fn proxy(&self, options: &str) -> (FaultProxy, String) {
        let proxy = FaultProxy::start(self.addr()).await.expect("proxy");
        let url = self.url_via(&with_options(&self.url, options), proxy.port());
        (proxy, url)
    }
}

/// `url` with `options` set: appended, replacing an option of the same
/// name already there (the URL parser refuses an option given twice).
pub fn with_options(url: &str, options: &str) -> String {
    if options.is_empty() {
        return url.to_owned();
    }
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let name = |pair: &str| pair.split('=').next().unwrap_or("").to_owned();
    let new: Vec<&str> = options.split('&').filter(|p| !p.is_empty()).collect();
    let mut pairs: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty() && !new.iter().any(|n| name(n) == name(p)))
        .collect();
    pairs.extend(new);
    format!("{base}?{}", pairs.join("&"))
}

use lock_bench::sql::SessionFloor;
use lock_core::{LockClient, LockKey, OwnerId};
use lock_sql::sqlx::{self, Connection};
use std::time::Duration;
use tokio::time::{Instant, sleep, timeout};

fn key(name: &str) -> LockKey {
    LockKey::new(format!("s{}/{name}", &OwnerId::random().to_hex()[..8])).unwrap()
}

impl SessionTarget {
    /// The server's plain URL (no options of ours), for raw connections.
    pub async fn raw_url(&self) -> String {
        let url = self.deployed.url();
        url.split('?').next().unwrap_or_default().to_owned()
    }

    /// Ends server session `id` from a raw connection.
    pub async fn kill_session(&self, id: i64) {
        let url = self.raw_url().await;
        match &self.server {
            Server::Pg => {
                let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
                sqlx::query("SELECT pg_terminate_backend($1::int)")
                    .bind(id)
                    .execute(&mut conn)
                    .await
                    .unwrap();
            }
            Server::Maria => {
                let mut conn = sqlx::MySqlConnection::connect(&url).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                    .execute(&mut conn)
                    .await
                    .unwrap();
            }
        }
    }

    /// Server sessions blocked in a lock wait right now.
    pub async fn waiting_sessions(&self) -> i64 {
        let url = self.raw_url().await;
        match &self.server {
            Server::Pg => {
                let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
                sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                     AND wait_event = 'advisory'",
                )
                .fetch_one(&mut conn)
                .await
                .unwrap()
            }
            Server::Maria => {
                let mut conn = sqlx::MySqlConnection::connect(&url).await.unwrap();
                sqlx::query_scalar(
                    "SELECT CAST(count(*) AS SIGNED) FROM information_schema.PROCESSLIST \
                     WHERE STATE LIKE '%user lock%'",
                )
                .fetch_one(&mut conn)
                .await
                .unwrap()
            }
        }
    }

    /// A raw connection that starts a server-side wait for `key` and is
    /// then dropped without anything else: the broken variant of a
    /// dropped waiting acquire (no kill, no check interval). Returns the
    /// waiting sessions seen while it waits, and after it was dropped.
    pub async fn abandon_raw_wait(&self, lock_key: &LockKey) -> (i64, i64) {
        let url = self.raw_url().await;
        let table = "distlock_leases";
        let live = match &self.server {
            Server::Pg => {
                let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
                let k = pg_key(table, lock_key.as_str());
                let wait = sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(k)
                    .execute(&mut conn);
                let (_, live) = tokio::join!(timeout(Duration::from_millis(500), wait), async {
                    sleep(Duration::from_millis(300)).await;
                    self.waiting_sessions().await
                });
                live
            }
            Server::Maria => {
                let mut conn = sqlx::MySqlConnection::connect(&url).await.unwrap();
                let wait = sqlx::query("SELECT GET_LOCK(?, 30)")
                    .bind(mysql_name(table, lock_key.as_str()))
                    .execute(&mut conn);
                let (_, live) = tokio::join!(timeout(Duration::from_millis(500), wait), async {
                    sleep(Duration::from_millis(300)).await;
                    self.waiting_sessions().await
                });
                live
            }
        };
        (live, settle_waiting(self).await)
    }
}

/// The crate's documented key mapping, restated (FNV-1a 128 over
/// `table \0 key`), so the raw variant contends for the same lock.
fn fnv(table: &str, key: &str) -> u128 {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for b in table.bytes().chain([0u8]).chain(key.bytes()) {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
    }
    h
}

fn pg_key(table: &str, key: &str) -> i64 {
    let h = fnv(table, key);
    let folded = u64::try_from(h & u128::from(u64::MAX)).unwrap() ^ u64::try_from(h >> 64).unwrap();
    i64::from_ne_bytes(folded.to_ne_bytes())
}

fn mysql_name(table: &str, key: &str) -> String {
    let plain = format!("{table}:{key}");
    if plain.len() <= 64
        && plain
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_./:-".contains(&b))
    {
        plain
    } else {
        format!("#{:032x}", fnv(table, key))
    }
}

/// Waits until `guard` renewed once more (its deadline moved).
async fn next_renewal(guard: &lock_core::LockGuard) {
    let before = guard.validity_deadline();
    let until = Instant::now() + Duration::from_secs(10);
    while guard.validity_deadline() == before && Instant::now() < until {
        sleep(Duration::from_millis(1)).await;
    }
    assert!(guard.validity_deadline() > before, "no renewal within 10 s");
}

/// Polls until `probe` gets `key`; returns when, and the lease's token.
async fn probe_until_free(
    probe: &SqlSessionBackend,
    key: &LockKey,
    within: Duration,
) -> Option<(Instant, u64)> {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Ok(Some(lease)) = probe.try_acquire(key, Duration::from_secs(5)).await {
            let at = Instant::now();
            let token = lease.token().get();
            let _ = probe.release(&lease).await;
            return Some((at, token));
        }
        sleep(Duration::from_millis(2)).await;
    }
    None
}

/// The session scenarios every server runs after its own checks: tokens
/// across clients, a dropped wait, an unrenewed lease, force releases, a
/// killed session (by the server, by a connection reset), a partition.
pub async fn scenarios(target: &SessionTarget) {
    tokens_across_clients(target).await;
    dropped_wait(target).await;
    unrenewed_lease_expires(target, Duration::from_secs(1)).await;
    force_released(target).await;
    force_release_spares_foreign_sessions(target).await;
    killed_session(target, false).await;
    killed_session(target, true).await;
    partition(target, Duration::from_secs(2)).await;
    many_locks_on_two_sessions(target, 200).await;
    killed_session_loses_only_its_locks(target).await;
    waiting_blocks_no_other_lock(target).await;
    one_grant_of_a_key_per_backend(target).await;
    longer_ttl_rearms_a_reused_session(target).await;
    abandoned_grant_is_undone(target).await;
    let torn = torn_reply_leaves_no_half_read_session(target, true).await;
    assert_eq!(torn, Torn::Served, "{}", target.name());
}

/// What a session's next call saw after a try was dropped with its reply
/// half read (see [`torn_reply_leaves_no_half_read_session`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Torn {
    /// The next call worked and the session's other lock was kept.
    Served,
    /// It failed, hung, panicked or lost the other lock: what.
    Broken(String),
}

/// A try dropped while its reply is half read: the proxy delivers the
/// reply's first 12 bytes (a whole first packet and part of the next: on
/// MySQL, a header read and its payload awaited), the rest 300 ms later,
/// and the try is dropped after 100 ms. The session holds another lock;
/// its next call (a keep-alive of that lock) must work and keep it, and the
/// dropped try's lock must be given back. With `check` off (the broken
/// variant, [`SqlSessionBackend::set_abandon_check`]), the statement is
/// dropped where it stands and the session serves on: sqlx's MySQL reader
/// then reads the rest of the old reply as the new one's (a panic, an
/// error or a hang), which this returns as [`Torn::Broken`].
pub async fn torn_reply_leaves_no_half_read_session(target: &SessionTarget, check: bool) -> Torn {
    let (proxy, url) = target.proxy("pool_size=1").await;
    let holder = Arc::new(SqlSessionBackend::connect_url(&url).await.unwrap());
    holder.set_abandon_check(check);
    let probe = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let ttl = Duration::from_secs(10);
    let suffix = if check { "" } else { "-broken" };
    let (kept, k) = (
        key(&format!("torn-kept{suffix}")),
        key(&format!("torn{suffix}")),
    );
    let other = holder.try_acquire(&kept, ttl).await.unwrap().unwrap();
    // Published (after `publish_delay`), so no publication runs on the
    // session while its replies are torn.
    let until = Instant::now() + Duration::from_secs(5);
    while probe.inspect(&kept).await.unwrap().and_then(|i| i.token) != Some(other.token()) {
        assert!(Instant::now() < until, "the kept lock was never published");
        sleep(Duration::from_millis(10)).await;
    }
    // The try's statement prepared on the session: it is sent whole.
    let warm = holder
        .try_acquire(&key(&format!("torn-warm{suffix}")), ttl)
        .await
        .unwrap();
    holder.release(&warm.unwrap()).await.unwrap();
    proxy.tear_replies(Some((12, Duration::from_millis(300))));
    let dropped = timeout(Duration::from_millis(100), holder.try_acquire(&k, ttl)).await;
    assert!(
        dropped.is_err(),
        "the try answered whole through a torn reply"
    );
    proxy.tear_replies(None);
    // The session's next call, on a task of its own (a panic is a verdict).
    let renewing = {
        let (holder, other) = (Arc::clone(&holder), other.clone());
        tokio::spawn(async move { timeout(Duration::from_secs(10), holder.renew(&other)).await })
    };
    let torn = match renewing.await {
        Err(panicked) => Torn::Broken(format!("the next call panicked: {panicked}")),
        Ok(Err(_)) => Torn::Broken("the next call hung".to_owned()),
        Ok(Ok(Err(e))) => Torn::Broken(format!("the next call failed: {e}")),
        Ok(Ok(Ok(_))) => match holder
            .try_acquire(&key(&format!("torn-after{suffix}")), ttl)
            .await
        {
            Ok(Some(after)) => {
                holder.release(&after).await.unwrap();
                Torn::Served
            }
            other => Torn::Broken(format!("a try after the keep-alive: {other:?}")),
        },
    };
    if torn == Torn::Served {
        // The dropped try's lock, taken when its statement finished, was
        // given back by the session's next call.
        let freed = probe.try_acquire(&k, ttl).await.unwrap();
        assert!(freed.is_some(), "the dropped try's lock was left held");
        probe.release(&freed.unwrap()).await.unwrap();
        assert!(
            holder.release(&other).await.unwrap(),
            "the kept lock was lost"
        );
    }
    println!(
        "{}{}: a try dropped with its reply half read: {torn:?}",
        target.name(),
        if check { "" } else { " (broken variant)" }
    );
    torn
}

/// A try whose future is dropped mid-statement (its request held by the
/// proxy, then delivered: the server takes the lock for a grant nobody
/// reads) leaves an orphan on the session, which holds another lock: the
/// key stays held until the session's next call, which releases it, and
/// the session's other lock is kept. The probe seeing the key held before
/// that call is the broken variant (no clean-up): the check can fail.
pub async fn abandoned_grant_is_undone(target: &SessionTarget) {
    let (proxy, url) = target.proxy("pool_size=1").await;
    let holder = SqlSessionBackend::connect_url(&url).await.unwrap();
    let probe = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let ttl = Duration::from_secs(10);
    let (kept, k) = (key("orphan-kept"), key("orphan"));
    let other = holder.try_acquire(&kept, ttl).await.unwrap().unwrap();
    // The kept lock's deferred publication (after `publish_delay`) runs on
    // the session under its mutex: once published, it cannot hold the
    // session through the partition below and keep the try from being
    // sent (seen on a loaded machine).
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let info = probe.inspect(&kept).await.unwrap();
        if info.and_then(|i| i.token) == Some(other.token()) {
            break;
        }
        assert!(Instant::now() < until, "the kept lock was never published");
        sleep(Duration::from_millis(10)).await;
    }
    // A grant on a session holding a lock once before, so its statement is
    // prepared on the connection and the try sends it whole (an
    // unprepared one would wait for the server's parse reply first, and
    // never send the grant).
    let warm = holder.try_acquire(&key("orphan-warm"), ttl).await.unwrap();
    holder.release(&warm.unwrap()).await.unwrap();
    proxy.partition();
    let dropped = timeout(Duration::from_millis(300), holder.try_acquire(&k, ttl)).await;
    assert!(dropped.is_err(), "the try answered through a partition");
    proxy.heal();
    // The held request reaches the server: the orphan takes the lock.
    let until = Instant::now() + Duration::from_secs(5);
    let mut seen_held = false;
    while Instant::now() < until {
        if probe.inspect(&k).await.unwrap().is_some() {
            seen_held = true;
            break;
        }
        sleep(Duration::from_millis(10)).await;
    }
    assert!(
        seen_held,
        "broken variant: the abandoned grant never took the lock, nothing to undo"
    );
    assert!(
        probe.try_acquire(&k, ttl).await.unwrap().is_none(),
        "the orphan's lock was free before any clean-up"
    );
    // The session's next call (a keep-alive) releases the orphan first.
    assert!(holder.renew(&other).await.is_ok(), "the kept lock was lost");
    let freed = probe.try_acquire(&k, ttl).await.unwrap();
    assert!(freed.is_some(), "the abandoned grant's lock was left held");
    probe.release(&freed.unwrap()).await.unwrap();
    assert!(holder.release(&other).await.unwrap());
    println!(
        "{} an abandoned try's lock was held until the session's next call, which released it",
        target.name()
    );
}

/// A session whose idle timeout was armed for a short TTL (then released)
/// takes a lock of a longer TTL: the server must not end it after the
/// short TTL of silence (a grant that kept the old timeout would free the
/// lock before its holder's deadline).
pub async fn longer_ttl_rearms_a_reused_session(target: &SessionTarget) {
    let url = with_options(&target.url, "pool_size=1");
    let holder = SqlSessionBackend::connect_url(&url).await.unwrap();
    let probe = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let (short, long) = (key("arm-short"), key("arm-long"));
    let first = holder
        .try_acquire(&short, Duration::from_secs(1))
        .await
        .unwrap()
        .unwrap();
    assert!(holder.release(&first).await.unwrap());
    let lease = holder
        .try_acquire(&long, Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(holder.session_id(&first), None);
    // Silent for longer than the short TTL, well within the long one.
    sleep(Duration::from_millis(2500)).await;
    assert!(
        probe
            .try_acquire(&long, Duration::from_secs(5))
            .await
            .unwrap()
            .is_none(),
        "the server freed a 5 s lease after 2.5 s of silence"
    );
    assert!(holder.renew(&lease).await.is_ok());
    assert!(holder.release(&lease).await.unwrap());
}

/// `n` locks held as guards by one backend of `pool_size=2`: at most two
/// connections, all renewed (one keep-alive per connection), each key
/// refused to another client, and all free after the releases.
pub async fn many_locks_on_two_sessions(target: &SessionTarget, n: usize) {
    let url = with_options(&target.url, "pool_size=2");
    let holder = SqlSessionBackend::connect_url(&url).await.unwrap();
    let probe = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let client = LockClient::new(holder.clone());
    let base = key("many");
    let keys: Vec<LockKey> = (0..n).map(|i| key_n(&base, i as u64)).collect();
    let ttl = Duration::from_secs(3);
    let mut guards = Vec::new();
    for chunk in keys.chunks(20) {
        let taken = futures_join(chunk.iter().map(|k| {
            let client = client.clone();
            let k = k.clone();
            async move { client.lock(k.as_str()).ttl(ttl).acquire().await.unwrap() }
        }))
        .await;
        guards.extend(taken);
    }
    assert_eq!(holder.held_locks(), n);
    let open = holder.open_sessions();
    assert!(open <= 2, "{open} sessions for {n} locks");
    next_renewal(&guards[0]).await;
    next_renewal(&guards[n - 1]).await;
    for (k, guard) in keys.iter().zip(&guards) {
        assert!(guard.is_held(), "{k} lost");
        assert!(
            probe.try_acquire(k, ttl).await.unwrap().is_none(),
            "{k} granted to another client while held"
        );
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert_eq!(holder.held_locks(), 0);
    for k in keys.iter().step_by(17) {
        let lease = probe.try_acquire(k, ttl).await.unwrap().expect("freed");
        probe.release(&lease).await.unwrap();
    }
    println!(
        "{} {n} locks held on {open} session(s) of one backend, renewed, refused to others, freed",
        target.name()
    );
}

/// Runs the futures at once, answers in order.
async fn futures_join<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// Locks held on two sessions of one backend; the server ends one
/// session: every lock on it goes Lost, and only those (the locks of the
/// other session are renewed on).
pub async fn killed_session_loses_only_its_locks(target: &SessionTarget) {
    let url = with_options(&target.url, "pool_size=2");
    let holder = SqlSessionBackend::connect_url(&url).await.unwrap();
    let client = LockClient::new(holder.clone());
    let base = key("kill-some");
    let ttl = Duration::from_secs(3);
    // Taken at once, so both sessions are opened and used.
    let guards = futures_join((0..40u64).map(|i| {
        let client = client.clone();
        let k = key_n(&base, i);
        async move { client.lock(k.as_str()).ttl(ttl).acquire().await.unwrap() }
    }))
    .await;
    let ids: Vec<i64> = guards
        .iter()
        .map(|g| holder.session_id(&g.lease()).unwrap())
        .collect();
    let victim = ids[0];
    let on_victim = ids.iter().filter(|&&id| id == victim).count();
    assert!(
        on_victim < guards.len(),
        "all 40 locks on one session: nothing to compare with"
    );
    target.kill_session(victim).await;
    for (guard, id) in guards.iter().zip(&ids) {
        if *id == victim {
            timeout(ttl, guard.lost())
                .await
                .expect("a lock of the killed session was not reported lost");
        }
    }
    // Two renewals later the others are still held.
    let survivor = guards
        .iter()
        .zip(&ids)
        .find(|(_, id)| **id != victim)
        .unwrap()
        .0;
    next_renewal(survivor).await;
    next_renewal(survivor).await;
    for (guard, id) in guards.iter().zip(&ids) {
        assert_eq!(
            guard.is_held(),
            *id != victim,
            "session {id} (killed {victim}): held {}",
            guard.is_held()
        );
    }
    assert_eq!(holder.held_locks(), guards.len() - on_victim);
    println!(
        "{} killed one of two sessions: its {on_victim} locks lost, the other {} held",
        target.name(),
        guards.len() - on_victim
    );
    for guard in guards {
        let _ = guard.release().await;
    }
}

/// A waiting acquire waits on a session of its own: while it waits, a
/// release and a grant of the same backend complete (they would queue
/// behind the wait on a shared session), then it is granted at the
/// holder's release.
pub async fn waiting_blocks_no_other_lock(target: &SessionTarget) {
    let url = with_options(&target.url, "pool_size=2");
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let other = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let ttl = Duration::from_secs(10);
    let (held, contended, fresh) = (key("w-held"), key("w-contended"), key("w-fresh"));
    let mine = backend.try_acquire(&held, ttl).await.unwrap().unwrap();
    let theirs = other.try_acquire(&contended, ttl).await.unwrap().unwrap();
    let waiter = {
        let backend = backend.clone();
        let contended = contended.clone();
        tokio::spawn(async move {
            backend
                .acquire(&contended, ttl, Instant::now() + Duration::from_secs(30))
                .await
        })
    };
    // Until the server shows the wait.
    let until = Instant::now() + Duration::from_secs(10);
    while target.waiting_sessions().await == 0 {
        assert!(Instant::now() < until, "the wait never reached the server");
        sleep(Duration::from_millis(10)).await;
    }
    assert!(backend.release(&mine).await.unwrap());
    let next = backend.try_acquire(&fresh, ttl).await.unwrap().unwrap();
    assert!(backend.renew(&next).await.is_ok());
    assert!(
        !waiter.is_finished(),
        "the wait ended before the holder's release"
    );
    assert!(other.release(&theirs).await.unwrap());
    let granted = waiter.await.unwrap().unwrap();
    assert!(backend.session_id(&granted).is_some());
    assert!(backend.release(&granted).await.unwrap());
    assert!(backend.release(&next).await.unwrap());
    println!(
        "{} a release, a grant and a keep-alive ran while a wait of the same backend waited",
        target.name()
    );
}

/// Two tasks of one backend take one key: never both hold it (the local
/// table of held keys; PostgreSQL and MySQL session locks are re-entrant
/// per session). The broken variant (the table off, one connection) shows
/// the double hold: the check can fail.
pub async fn one_grant_of_a_key_per_backend(target: &SessionTarget) {
    let url = with_options(&target.url, "pool_size=1");
    let ttl = Duration::from_secs(10);
    for exclusion in [true, false] {
        let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
        backend.set_local_exclusion(exclusion);
        let k = key("reentrant");
        let first = backend.try_acquire(&k, ttl).await.unwrap();
        let second = backend.try_acquire(&k, ttl).await.unwrap();
        let both = first.is_some() && second.is_some();
        // Two tasks, each acquiring with a wait.
        let holding = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for lease in [&first, &second].into_iter().flatten() {
            backend.release(lease).await.unwrap();
        }
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let (backend, k) = (backend.clone(), k.clone());
                let (holding, most) = (Arc::clone(&holding), Arc::clone(&most));
                tokio::spawn(async move {
                    let lease = backend
                        .acquire(&k, ttl, Instant::now() + Duration::from_secs(10))
                        .await
                        .unwrap();
                    let now = holding.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    sleep(Duration::from_millis(100)).await;
                    holding.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    backend.release(&lease).await.unwrap();
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let most = most.load(std::sync::atomic::Ordering::SeqCst);
        if exclusion {
            assert!(!both, "two tries of one backend both got the key");
            assert_eq!(most, 1, "two tasks of one backend held the key at once");
        } else {
            assert!(
                both && most == 2,
                "broken variant (no local table): expected the double hold, saw tries {both}, \
                 tasks {most}"
            );
        }
    }
    println!(
        "{} one grant of a key per backend; without the local table, the session's re-entrant lock \
         is granted twice",
        target.name()
    );
}

/// The holder's session is killed (by the server's admin command, or its
/// TCP connection reset by the proxy): the server frees the lock at once,
/// and the holder learns it at its next keep-alive. That window, when the
/// old holder still believes it holds while a new holder has the lock, is
/// the negative control of session mode: only the fencing token protects
/// the resource there, and the test asserts the window exists, and the new
/// token is larger.
pub async fn killed_session(target: &SessionTarget, by_proxy_reset: bool) -> (Duration, Duration) {
    let ttl = Duration::from_secs(3);
    let (proxy, url) = target.proxy("").await;
    let holder = SqlSessionBackend::connect_url(&url).await.unwrap();
    let probe = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let key = key("killed");
    let client = LockClient::new(holder.clone());
    let guard = client.lock(key.as_str()).ttl(ttl).acquire().await.unwrap();
    let id = holder.session_id(&guard.lease()).expect("holding session");
    // Right after a keep-alive, so the next one is ttl/3 away.
    next_renewal(&guard).await;
    let killed_at = Instant::now();
    if by_proxy_reset {
        proxy.reset();
    } else {
        target.kill_session(id).await;
    }
    let (freed_at, next_token) = probe_until_free(&probe, &key, Duration::from_secs(2))
        .await
        .expect("the server did not free a killed session's lock within 2 s");
    let lost = timeout(ttl, guard.lost())
        .await
        .expect("no lost signal within the TTL");
    let lost_at = Instant::now();
    assert!(
        next_token > guard.token().get(),
        "token went backwards: {next_token} after {}",
        guard.token()
    );
    assert!(
        freed_at < lost_at,
        "negative control: the server frees a killed session's lock before the holder's next keep-alive"
    );
    assert!(
        lost_at - killed_at <= ttl / 3 + Duration::from_millis(500),
        "lost {:?} after the kill, later than the next keep-alive",
        lost_at - killed_at
    );
    assert_eq!(holder.held_locks(), 0, "the dead session is still listed");
    println!(
        "{} killed ({}): server freed the lock {:?} after the kill; holder told {:?} after ({lost}); \
         window with two believers {:?}",
        target.name(),
        if by_proxy_reset {
            "proxy reset"
        } else {
            "admin kill"
        },
        freed_at - killed_at,
        lost_at - killed_at,
        lost_at - freed_at
    );
    (freed_at - killed_at, lost_at - killed_at)
}

/// The holder is partitioned (the proxy holds every byte, the server's
/// TCP connection stays up): the guard reports Lost at its deadline, and
/// the server frees the lock only when the session's idle timeout (the
/// TTL after the last keep-alive it received) ends it: after the Lost.
pub async fn partition(target: &SessionTarget, ttl: Duration) -> (Duration, Duration) {
    let (proxy, url) = target.proxy("").await;
    let holder = SqlSessionBackend::connect_url(&url).await.unwrap();
    let probe = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let key = key("partition");
    let guard = LockClient::new(holder)
        .lock(key.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    next_renewal(&guard).await;
    proxy.partition();
    let cut_at = Instant::now();
    let lost = async {
        let _ = timeout(ttl * 2, guard.lost()).await;
        Instant::now()
    };
    let freed = probe_until_free(&probe, &key, ttl * 4);
    let (lost_at, freed) = tokio::join!(lost, freed);
    proxy.heal();
    let (freed_at, _) = freed.expect("the server never freed the partitioned session's lock");
    assert!(
        matches!(guard.state(), lock_core::LockState::Lost(_)),
        "state {:?}",
        guard.state()
    );
    // The promise (the holder's validity deadline) ended before the
    // server freed the lock; the signal itself is observed by a task on a
    // loaded machine, so it is held to the deadline plus a margin.
    let deadline = guard.validity_deadline();
    assert!(
        deadline < freed_at,
        "the server freed the lock {:?} BEFORE the holder's deadline",
        deadline - freed_at
    );
    assert!(
        lost_at <= deadline + Duration::from_millis(500),
        "Lost observed {:?} after the deadline",
        lost_at - deadline
    );
    println!(
        "{} partition (TTL {ttl:?}): Lost observed {:?} after the cut; server freed {:?} after the cut; \
         freed {:?} after the holder's deadline, {:?} after the Lost was observed",
        target.name(),
        lost_at - cut_at,
        freed_at - cut_at,
        freed_at - deadline,
        freed_at.saturating_duration_since(lost_at)
    );
    (lost_at - cut_at, freed_at - lost_at)
}

/// A waiting acquire dropped mid-wait leaves no session waiting on the
/// server (it is killed in the background) and the key free at the
/// holder's release. The same check run on a broken variant (a raw
/// connection whose wait is dropped without the kill) sees the session
/// left waiting: the check can fail.
pub async fn dropped_wait(target: &SessionTarget) {
    let holder = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let waiter = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let probe = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let key = LockKey::new(format!("dropwait/{}", &OwnerId::random().to_hex()[..8])).unwrap();
    let lease = holder
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let wait = waiter.acquire(
        &key,
        Duration::from_secs(5),
        Instant::now() + Duration::from_secs(30),
    );
    assert!(timeout(Duration::from_millis(300), wait).await.is_err());
    assert_eq!(waiter.held_locks(), 0);
    let waiting = settle_waiting(target).await;
    assert_eq!(
        waiting, 0,
        "{waiting} session(s) still waiting on the server after the drop"
    );
    assert!(holder.release(&lease).await.unwrap());
    let next = probe
        .try_acquire(&key, Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        next.is_some(),
        "a dropped waiter's session took the lock at the release"
    );
    probe.release(&next.unwrap()).await.unwrap();

    // Broken variant: the wait dropped without the kill stays on the server.
    let lease = holder
        .try_acquire(&key, Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let (live, left) = target.abandon_raw_wait(&key).await;
    assert!(
        live >= 1,
        "the check did not see a live raw wait on the server (count {live})"
    );
    holder.release(&lease).await.unwrap();
    println!(
        "{} dropped wait: 0 sessions left waiting; the check sees a live raw wait ({live}); a raw wait \
         dropped without the kill is left on the server: {left} (PostgreSQL keeps waiting without \
         client_connection_check_interval; MariaDB notices the closed connection itself)",
        target.name()
    );
}

/// The waiting-session count once background kills had time to land.
async fn settle_waiting(target: &SessionTarget) -> i64 {
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let n = target.waiting_sessions().await;
        if n == 0 || Instant::now() >= until {
            return n;
        }
        sleep(Duration::from_millis(50)).await;
    }
}

/// A lease nobody renews frees its key when the server's idle timeout
/// ends the silent session: not before the holder's deadline, within
/// about the TTL (MySQL rounds the TTL up to whole seconds).
pub async fn unrenewed_lease_expires(target: &SessionTarget, ttl: Duration) {
    let holder = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let probe = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let key = key("expiry");
    let sent = Instant::now();
    let lease = holder.try_acquire(&key, ttl).await.unwrap().unwrap();
    let next = probe
        .acquire(&key, ttl, Instant::now() + ttl * 2 + Duration::from_secs(2))
        .await
        .unwrap();
    let freed = sent.elapsed();
    assert!(
        Instant::now() >= lease.validity_deadline(),
        "freed before the holder's deadline"
    );
    assert!(
        freed <= ttl + Duration::from_millis(1500),
        "freed only after {freed:?}"
    );
    assert!(next.token() > lease.token());
    assert!(
        holder
            .renew(&lease)
            .await
            .is_err_and(|e| e.is_lost() || e.is_not_held()),
        "the expired session renewed"
    );
    assert!(!holder.release(&lease).await.unwrap());
    probe.release(&next).await.unwrap();
    println!(
        "{} unrenewed lease (TTL {ttl:?}): freed {freed:?} after the grant was sent",
        target.name()
    );
}

/// Grants of one key alternate over three clients: every token is larger
/// than the one before.
pub async fn tokens_across_clients(target: &SessionTarget) {
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(SqlSessionBackend::connect_url(&target.url).await.unwrap());
    }
    // Many locks per connection: the limit is the server's lock table
    // (PostgreSQL: 64 per connection slot, 200 connections in the test
    // kit's server), none on MariaDB.
    let expected = match target.server {
        Server::Pg => Some(64 * 200),
        Server::Maria => None,
    };
    assert_eq!(clients[0].capabilities().max_held, expected);
    let key = key("tokens");
    let mut last = 0;
    for i in 0..60 {
        let c = &clients[i % 3];
        let lease = c
            .acquire(
                &key,
                Duration::from_secs(5),
                Instant::now() + Duration::from_secs(5),
            )
            .await
            .unwrap();
        assert!(
            lease.token().get() > last,
            "token {} after {last}",
            lease.token()
        );
        last = lease.token().get();
        assert!(c.release(&lease).await.unwrap());
    }
}

/// Round trips per cycle through the proxy, averaged over `cycles` after
/// a warm-up and rounded.
async fn per_cycle<F, Fut>(proxy: &FaultProxy, cycles: u64, mut cycle: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    for _ in 0..5 {
        cycle().await;
    }
    proxy.reset_counters();
    for _ in 0..cycles {
        cycle().await;
    }
    (proxy.round_trips() + cycles / 2) / cycles
}

/// One round trip per try-grant and one per release; 2 per waiting
/// acquire + release through the user API, as the floor's declared 2. A
/// cycle with one extra request (an inspect) counts 3: the check fails
/// on an extra round trip.
pub async fn round_trips(target: &SessionTarget) {
    // 50 locks held at once pin 50 connections. MariaDB writes a holder
    // row for a lock held past the publication delay (two more round trips,
    // off the caller's path): 1 s, longer than the holds counted here.
    let (proxy, url) = target.proxy("pool_size=60&publish_delay=1s").await;
    let backend = SqlSessionBackend::connect_url(&url).await.unwrap();
    let key = key("rt");
    let ttl = Duration::from_secs(30);
    let n = 50;
    let grants = per_cycle(&proxy, n, || async {
        let lease = backend.try_acquire(&key, ttl).await.unwrap().unwrap();
        backend.release(&lease).await.unwrap();
    })
    .await;
    assert_eq!(grants, 2, "try_acquire + release");
    // Grants alone, then releases alone, over 50 connections: the first
    // pass opens them (handshake, session id, statements prepared once per
    // connection; MySQL's wait_timeout once), the second is counted.
    let keys: Vec<LockKey> = (0..n).map(|i| key_n(&key, i)).collect();
    let mut counts = Vec::new();
    for _pass in 0..2 {
        proxy.reset_counters();
        let mut held = Vec::new();
        for k in &keys {
            held.push(backend.try_acquire(k, ttl).await.unwrap().unwrap());
        }
        let grant_rt = proxy.round_trips();
        proxy.reset_counters();
        for lease in &held {
            assert!(backend.release(lease).await.unwrap());
        }
        counts.push((grant_rt, proxy.round_trips()));
    }
    println!(
        "{} round trips: {n} grants + {n} releases on new connections {:?}, then on the same connections {:?}",
        target.name(),
        counts[0],
        counts[1]
    );
    assert_eq!(
        counts[1],
        (n, n),
        "one round trip per try-grant and one per release"
    );
    let client = LockClient::new(backend.clone());
    let acquire = || {
        client
            .lock(key.as_str())
            .ttl(ttl)
            .wait(Duration::from_secs(60))
            .acquire()
    };
    let ours = per_cycle(&proxy, n, || async {
        let guard = acquire().await.unwrap();
        guard.release().await.unwrap();
    })
    .await;
    let (floor_proxy, floor_url) = target.proxy("").await;
    let floor = SessionFloor::connect(&floor_url).await.unwrap();
    use conformance::floor::RawFloor;
    let floor_rt = per_cycle(&floor_proxy, n, || async {
        floor.cycle(key.as_str(), ttl).await.unwrap();
    })
    .await;
    assert_eq!(
        floor_rt,
        u64::from(floor.round_trips_per_cycle()),
        "the floor's declared count"
    );
    assert_eq!(ours, floor_rt, "waiting acquire + release vs the floor");
    // An extra request per cycle is caught.
    let extra = per_cycle(&proxy, n, || async {
        let guard = acquire().await.unwrap();
        let _ = backend.inspect(&key).await.unwrap();
        guard.release().await.unwrap();
    })
    .await;
    assert_ne!(
        extra, floor_rt,
        "a cycle with an extra request was not caught"
    );
    println!(
        "{} round trips per cycle: ours {ours}, floor {floor_rt}, with an extra inspect {extra}",
        target.name()
    );
}

fn key_n(base: &LockKey, i: u64) -> LockKey {
    LockKey::new(format!("{}-{i}", base.as_str())).unwrap()
}

/// `force_release` from another client (issue 18): returns the holder as
/// `inspect` reported it, ends only the holder's server session (the
/// holder's guard goes Lost at its next keep-alive, its backend keeps
/// nothing), the next grant's token is above the broken one, and a free
/// key reports nothing broken.
pub async fn force_released(target: &SessionTarget) {
    let ttl = Duration::from_secs(3);
    let holder = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let admin = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let key = key("force");
    assert_eq!(admin.force_release(&key).await.unwrap(), None, "free key");
    let client = LockClient::new(holder.clone());
    let guard = client.lock(key.as_str()).ttl(ttl).acquire().await.unwrap();
    // A lock of another backend, on another session: spared.
    let bystander = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let other = self::key("force-other");
    let spared = LockClient::new(bystander.clone())
        .lock(other.as_str())
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    let seen = admin.inspect(&key).await.unwrap().expect("held");
    let broken_at = Instant::now();
    let broken = admin
        .force_release(&key)
        .await
        .unwrap()
        .expect("force_release of a held key reported nothing");
    assert_eq!(broken, seen, "not the holder inspect reported");
    assert_eq!(broken.token, Some(guard.token()));
    // The server freed it when force_release returned.
    let next = admin
        .try_acquire(&key, ttl)
        .await
        .unwrap()
        .expect("still held after force_release");
    assert!(
        next.token() > guard.token(),
        "token went backwards: {} after {}",
        next.token(),
        guard.token()
    );
    let lost = timeout(ttl, guard.lost())
        .await
        .expect("the broken holder's guard did not go Lost within the TTL");
    println!(
        "{} force_release: holder told {:?} after ({lost})",
        target.name(),
        broken_at.elapsed()
    );
    assert!(
        holder.renew(&guard.lease()).await.is_err(),
        "the broken lease renewed"
    );
    assert!(spared.is_held(), "another session's lock was broken too");
    assert!(admin.inspect(&other).await.unwrap().is_some());
    assert_eq!(holder.held_locks(), 0, "the broken lock is still listed");
    assert_eq!(bystander.held_locks(), 1);
    assert!(admin.release(&next).await.unwrap());
    assert_eq!(admin.force_release(&key).await.unwrap(), None, "freed key");
    spared.release().await.unwrap();

    // A session holding two locks (one connection) is not ended for one of
    // them: both stay held.
    let url = with_options(&target.url, "pool_size=1");
    let shared = SqlSessionBackend::connect_url(&url).await.unwrap();
    let (a, b) = (self::key("force-a"), self::key("force-b"));
    let la = shared.try_acquire(&a, ttl).await.unwrap().unwrap();
    let lb = shared.try_acquire(&b, ttl).await.unwrap().unwrap();
    assert_eq!(shared.session_id(&la), shared.session_id(&lb));
    let err = admin.force_release(&b).await.unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::Unsupported, "{err}");
    assert!(shared.renew(&la).await.is_ok() && shared.renew(&lb).await.is_ok());
    assert!(shared.release(&la).await.unwrap() && shared.release(&lb).await.unwrap());
}

/// `admin`'s `force_release` of `key` is refused (Unsupported), then the
/// foreign session holding it is still `alive` and the key still held.
async fn refused_and_spared(
    admin: &SqlSessionBackend,
    key: &LockKey,
    alive: impl std::future::Future<Output = bool>,
) {
    let err = admin.force_release(key).await.unwrap_err();
    assert_eq!(err.kind(), lock_core::ErrorKind::Unsupported, "{err}");
    assert!(alive.await, "the foreign session was ended");
    assert!(admin.inspect(key).await.unwrap().is_some(), "freed");
}

/// `force_release` of a lock held by a session that is not a distlock
/// session-mode grant (a raw client that also holds another lock) is
/// refused with `Unsupported` and the session is left alone: ending it
/// would break that client's other lock too.
pub async fn force_release_spares_foreign_sessions(target: &SessionTarget) {
    let url = target.raw_url().await;
    let admin = SqlSessionBackend::connect_url(&target.url).await.unwrap();
    let key = key("foreign");
    let table = "distlock_leases";
    match &target.server {
        Server::Pg => {
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            sqlx::query("SELECT pg_advisory_lock($1), pg_advisory_lock(424242)")
                .bind(pg_key(table, key.as_str()))
                .execute(&mut conn)
                .await
                .unwrap();
            let alive = async { sqlx::query("SELECT 1").execute(&mut conn).await.is_ok() };
            refused_and_spared(&admin, &key, alive).await;
        }
        Server::Maria => {
            let mut conn = sqlx::MySqlConnection::connect(&url).await.unwrap();
            sqlx::query("SELECT GET_LOCK(?, 0), GET_LOCK('foreign-other', 0)")
                .bind(mysql_name(table, key.as_str()))
                .execute(&mut conn)
                .await
                .unwrap();
            let alive = async { sqlx::query("SELECT 1").execute(&mut conn).await.is_ok() };
            refused_and_spared(&admin, &key, alive).await;
        }
    }
    if target.server == Server::Pg {
        // The benchmark floor's one session holding two keys: its grant
        // statement publishes a distlock grant like the backend's, but
        // the session holds another advisory lock, so it is spared too.
        use conformance::floor::RawFloor;
        let floor = SessionFloor::connect(&target.url).await.unwrap();
        let (first, last) = (self::key("floor-a"), self::key("floor-b"));
        let ttl = Duration::from_secs(5);
        let a = floor.try_grant(first.as_str(), ttl).await.unwrap().unwrap();
        let b = floor.try_grant(last.as_str(), ttl).await.unwrap().unwrap();
        let err = admin.force_release(&last).await.unwrap_err();
        assert_eq!(err.kind(), lock_core::ErrorKind::Unsupported, "{err}");
        assert!(admin.inspect(&first).await.unwrap().is_some(), "freed");
        assert!(
            floor.release(&b).await.unwrap(),
            "the floor's session ended"
        );
        assert!(floor.release(&a).await.unwrap());
    }
}
