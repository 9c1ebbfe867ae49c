//! One logical Redis endpoint (a server, a Sentinel-managed master, or a
//! cluster) behind a small fixed set of shared, multiplexed, reconnecting
//! connections (its lanes): the redis crate's own (its multiplexed
//! connection for one server, its cluster connection for a cluster). A
//! server has `connections` lanes; Sentinel and Cluster one.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use lock_core::{ErrorKind, LockError, Operation};
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, RedisError, Value};

use crate::config::{RedisConfig, RedisNode, conn_config};
use crate::error::{NAME, Redacted, map_redis_error, needs_reconnect};
use crate::keys::scripts::LuaScript;

/// A connection handle; cheap to clone (every kind is shared by its
/// clones and pipelines concurrent requests).
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server (plain TCP or TLS): the redis crate's multiplexed
    /// connection.
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    /// The handle with each request bounded by `timeout` inside the
    /// connection (the redis crate's response timeout; a cluster
    /// connection keeps the one its client was built with).
    fn with_response_timeout(mut self, timeout: Duration) -> Self {
        if let Self::Server(c) = &mut self {
            c.set_response_timeout(timeout);
        }
        self
    }

    pub(crate) async fn query<T: redis::FromRedisValue>(
        &mut self,
        cmd: &Cmd,
    ) -> redis::RedisResult<T> {
        cmd.query_async(self).await
    }

    /// `cmd` on the cluster master at `at` (Cluster: `SCAN` walks one
    /// node's keys), or on the connection's one server (`at` ignored).
    pub(crate) async fn query_at(
        &mut self,
        cmd: &Cmd,
        at: Option<&(String, u16)>,
    ) -> redis::RedisResult<Value> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        match (self, at) {
            (Self::Cluster(c), Some((host, port))) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                c.route_command(cmd.clone(), routing).await
            }
            (conn, _) => conn.query(cmd).await,
        }
    }

    async fn pipeline(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
        pipe.query_async(self).await
    }

    /// `EVALSHA`, falling back to `EVAL` (which also reloads the cache)
    /// when the server answers `NOSCRIPT` (e.g. after a restart).
    pub(crate) async fn eval(
        &mut self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&str],
    ) -> redis::RedisResult<Value> {
        self.eval_text(script.code, &script.hash, keys, args).await
    }

    /// [`eval`](Self::eval) of a script given as its text `code` and its
    /// SHA1 `hash` (a script made at run time: a caller's guarded script).
    pub(crate) async fn eval_text(
        &mut self,
        code: &str,
        hash: &str,
        keys: &[&str],
        args: &[&str],
    ) -> redis::RedisResult<Value> {
        self.eval_call(&ScriptCall::of_text(code, hash, keys, args))
            .await
    }

    /// [`eval`](Self::eval) of a [`ScriptCall`], whose `EVALSHA` request
    /// is already built (one request may go to several nodes); `EVAL`
    /// after a `NOSCRIPT` answer.
    pub(crate) async fn eval_call(&mut self, call: &ScriptCall<'_>) -> redis::RedisResult<Value> {
        match self.query(&call.evalsha).await {
            Err(err) if is_noscript(&err) => {
                // Boxed: the rare path (after a restart or a script
                // flush), whose request is held across its wait; inline it
                // would add its size to every script call's future (moved
                // whole into each caller's, and into the boxes of the
                // `LockBackend` calls).
                Box::pin(async move {
                    let eval = script_cmd("EVAL", call.code, call.keys, call.args);
                    self.query(&eval).await
                })
                .await
            }
            other => other,
        }
    }

    /// Many calls of one script. On one server they go as pipelines of at
    /// most [`PIPELINE_CHUNK`] calls, all sent at once (one round trip in
    /// all); on a cluster connection concurrently (the cluster client
    /// pipelines per node on its own).
    pub(crate) async fn eval_many(
        &mut self,
        script: &LuaScript,
        calls: &[(Vec<&str>, Vec<&str>)],
    ) -> redis::RedisResult<Vec<redis::RedisResult<Value>>> {
        match self {
            Self::Server(_) => {
                let chunks = calls.chunks(PIPELINE_CHUNK).map(|chunk| {
                    let mut conn = self.clone();
                    async move {
                        let mut pipe = redis::pipe();
                        pipe.ignore_errors();
                        for (keys, args) in chunk {
                            pipe.add_command(script_cmd("EVALSHA", &script.hash, keys, args));
                        }
                        let mut results = conn.pipeline(&pipe).await?;
                        for (result, (keys, args)) in results.iter_mut().zip(chunk) {
                            if matches!(result, Err(err) if is_noscript(err)) {
                                *result = conn.eval(script, keys, args).await;
                            }
                        }
                        Ok::<_, redis::RedisError>(results)
                    }
                });
                let mut results = Vec::with_capacity(calls.len());
                for chunk in futures_util::future::join_all(chunks).await {
                    results.extend(chunk?);
                }
                Ok(results)
            }
            Self::Cluster(_) => {
                let futures = calls.iter().map(|(keys, args)| {
                    let mut conn = self.clone();
                    async move { conn.eval(script, keys, args).await }
                });
                Ok(futures_util::future::join_all(futures).await)
            }
        }
    }
}

/// The one place a request picks the connection kind: each arm hands back
/// the redis crate's own boxed future, so nothing is boxed twice.
impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Self::Server(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipe: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(c) => c.req_packed_commands(pipe, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipe, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// The most calls in one pipeline. The multiplexed connection keeps its
/// write buffer as large as the largest request it has written: a renewal
/// batch of 1,000 locks in one pipeline (about 150 KB) would stay allocated
/// for the connection's life, `tests/held_at_scale.rs` counts it per held
/// lock. The chunks of one batch are sent together, so the batch still
/// costs one round trip.
const PIPELINE_CHUNK: usize = 512;

/// One call of a script, its `EVALSHA` request built once: a Redlock
/// grant or release sends the same request to every node, which each
/// node's call would otherwise build again (`Conn::eval`); the `EVAL` of a
/// `NOSCRIPT` answer is built only then.
pub(crate) struct ScriptCall<'a> {
    /// The script's text, for `EVAL`.
    code: &'a str,
    keys: &'a [&'a str],
    args: &'a [&'a str],
    evalsha: Cmd,
}

impl<'a> ScriptCall<'a> {
    pub(crate) fn new(script: &'a LuaScript, keys: &'a [&'a str], args: &'a [&'a str]) -> Self {
        Self::of_text(script.code, &script.hash, keys, args)
    }

    /// A call of the script `code` whose SHA1 is `hash`.
    fn of_text(code: &'a str, hash: &str, keys: &'a [&'a str], args: &'a [&'a str]) -> Self {
        Self {
            evalsha: script_cmd("EVALSHA", hash, keys, args),
            code,
            keys,
            args,
        }
    }
}

/// `<verb> <body> <numkeys> <keys...> <args...>`, its buffers sized once
/// (the arguments' bytes, and up to 20 digits of `numkeys`).
fn script_cmd(verb: &str, body: &str, keys: &[&str], args: &[&str]) -> Cmd {
    let texts = keys.iter().chain(args).map(|t| t.len()).sum::<usize>();
    let mut cmd = Cmd::with_capacity(
        3 + keys.len() + args.len(),
        verb.len() + body.len() + 20 + texts,
    );
    cmd.arg(verb).arg(body).arg(keys.len()).arg(keys).arg(args);
    cmd
}

fn is_noscript(err: &RedisError) -> bool {
    err.code() == Some("NOSCRIPT")
}

/// Where connections come from.
enum Source {
    Server(redis::Client),
    Sentinel {
        sentinels: Vec<redis::Client>,
        master: String,
        config: Arc<RedisConfig>,
    },
    Cluster {
        client: Box<ClusterClient>,
        seeds: Vec<redis::Client>,
    },
}

/// Which of a node's connections a call goes on. The calls about one
/// grant take the lane of its owner value ([`Lane::of`]): the grant, its
/// `WAIT`, the undo of a grant whose answer was not seen and a waiter's
/// withdrawal then go on one connection, so the server processes them in
/// the order they were sent, as it did with one connection per node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lane(usize);

impl Lane {
    /// The lane of the renewal batches: batches in flight together share
    /// one connection's writes (one round trip), as with one connection.
    pub(crate) const RENEWALS: Self = Self(0);

    /// No lane in particular: a call that concerns no grant whose answer
    /// may still be on its way takes the next lane in turn (pass a
    /// [`Lane`] to pin a call; `Some` is implied).
    pub(crate) const ANY: Option<Self> = None;

    /// The lane of the owner value `owner` (FNV-1a of its text; owners are
    /// random, so grants spread evenly over the lanes).
    pub(crate) fn of(owner: &str) -> Self {
        let hash = owner.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        // Any bits of the hash pick a lane as well as all of them.
        #[allow(clippy::cast_possible_truncation)]
        Self(hash as usize)
    }

    /// Lane `n` (the tests, which block one connection).
    #[cfg(test)]
    pub(crate) fn nth(n: usize) -> Self {
        Self(n)
    }

    /// The lane after this one (the tests' deliberately unpinned calls).
    #[cfg(test)]
    pub(crate) fn next(self) -> Self {
        Self(self.0.wrapping_add(1))
    }
}

/// One lane's connection, made on first use and after a failure.
struct Slot {
    cached: Mutex<Option<Cached>>,
    connecting: tokio::sync::Mutex<()>,
}

struct Cached {
    generation: u64,
    conn: Conn,
    /// Where pub/sub connections go (the resolved master for Sentinel).
    pubsub: Option<redis::Client>,
}

/// One endpoint behind its lanes' shared connections, each re-established
/// (and, for Sentinel, re-resolved) after a connection error, a timeout or
/// a `READONLY` answer on it.
pub(crate) struct Node {
    source: Source,
    label: String,
    timeout: Duration,
    secrets: Arc<Vec<String>>,
    /// Custom trust roots (the `ca` option), for clients made later
    /// (a master re-resolved through Sentinel).
    tls: Option<redis::TlsCertificates>,
    lanes: Box<[Slot]>,
    /// The lane of the next call that concerns no grant (round robin).
    next_lane: AtomicUsize,
    generations: AtomicU64,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("label", &self.label)
            .finish_non_exhaustive()
    }
}

/// Makes sure rustls has a process-wide crypto provider before a TLS
/// connection is made. The redis crate builds its TLS config with
/// `rustls::ClientConfig::builder()`, which panics when none is installed
/// and rustls cannot choose one from its features (a program that also
/// links aws-lc-rs), and its `insecure` verifier reads the installed one.
/// Installs ring (the provider of every distlock driver) only when there is
/// none: a provider the application installed stays.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // An error means another thread installed one first: as good.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// A client for one URL; with `tls`, trusting its roots (the `ca` option).
pub(crate) fn open_client(
    url: &str,
    tls: Option<&redis::TlsCertificates>,
    secrets: &[String],
) -> Result<redis::Client, LockError> {
    let client = match tls {
        Some(certs) => redis::Client::build_with_tls(url, certs.clone()),
        None => redis::Client::open(url),
    };
    client.map_err(|err| {
        LockError::config("invalid Redis connection settings")
            .with_backend(NAME)
            .with_source(Redacted::new(&err, secrets))
    })
}

impl Node {
    /// A single server.
    pub(crate) fn server(config: &Arc<RedisConfig>, node: &RedisNode) -> Result<Self, LockError> {
        let secrets = Arc::new(config.secrets());
        let tls = config.tls_certificates()?;
        let client = open_client(&config.node_url(node), tls.as_ref(), &secrets)?;
        Ok(Self::new(
            Source::Server(client),
            node.to_string(),
            config,
            secrets,
            tls,
            config.connections_per_server(),
        ))
    }

    /// A master found through sentinels.
    pub(crate) fn sentinel(
        config: &Arc<RedisConfig>,
        sentinels: &[RedisNode],
        master: &str,
    ) -> Result<Self, LockError> {
        let secrets = Arc::new(config.secrets());
        let tls = config.tls_certificates()?;
        let clients = sentinels
            .iter()
            .map(|s| open_client(&config.sentinel_url(s), tls.as_ref(), &secrets))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(
            Source::Sentinel {
                sentinels: clients,
                master: master.to_owned(),
                config: config.clone(),
            },
            format!("sentinel master {master:?}"),
            config,
            secrets,
            tls,
            1,
        ))
    }

    /// A cluster.
    pub(crate) fn cluster(
        config: &Arc<RedisConfig>,
        seeds: &[RedisNode],
    ) -> Result<Self, LockError> {
        let secrets = Arc::new(config.secrets());
        let urls: Vec<String> = seeds.iter().map(|n| config.node_url(n)).collect();
        let client = ClusterClient::builder(urls.clone())
            .connection_timeout(config.operation_timeout)
            .response_timeout(config.operation_timeout)
            .retries(2)
            .build()
            .map_err(|err| {
                LockError::config("invalid Redis Cluster settings")
                    .with_backend(NAME)
                    .with_source(Redacted::new(&err, &secrets))
            })?;
        let seeds = urls
            .iter()
            .map(|u| open_client(u, None, &secrets))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::new(
            Source::Cluster {
                client: Box::new(client),
                seeds,
            },
            "cluster".to_owned(),
            config,
            secrets,
            None,
            1,
        ))
    }

    fn new(
        source: Source,
        label: String,
        config: &RedisConfig,
        secrets: Arc<Vec<String>>,
        tls: Option<redis::TlsCertificates>,
        lanes: usize,
    ) -> Self {
        if config.tls {
            ensure_crypto_provider();
        }
        Self {
            source,
            label,
            timeout: config.operation_timeout,
            secrets,
            tls,
            lanes: (0..lanes.max(1))
                .map(|_| Slot {
                    cached: Mutex::new(None),
                    connecting: tokio::sync::Mutex::new(()),
                })
                .collect(),
            next_lane: AtomicUsize::new(0),
            generations: AtomicU64::new(0),
        }
    }

    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The slot of `lane` (lanes wrap around the node's count).
    fn slot(&self, lane: Lane) -> &Slot {
        &self.lanes[lane.0 % self.lanes.len()]
    }

    /// `lane`, or for [`Lane::ANY`] (a call that concerns no grant) the
    /// next lane in turn.
    fn lane(&self, lane: Option<Lane>) -> Lane {
        lane.unwrap_or_else(|| Lane(self.next_lane.fetch_add(1, Ordering::Relaxed)))
    }

    fn cached(&self, lane: Lane) -> std::sync::MutexGuard<'_, Option<Cached>> {
        self.slot(lane)
            .cached
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn conn_config(&self) -> AsyncConnectionConfig {
        conn_config(self.timeout)
    }

    /// The shared connection of `lane`, connecting first if there is none.
    async fn connection(&self, lane: Lane) -> Result<(u64, Conn), LockError> {
        if let Some(c) = &*self.cached(lane) {
            return Ok((c.generation, c.conn.clone()));
        }
        let _connecting = self.slot(lane).connecting.lock().await;
        if let Some(c) = &*self.cached(lane) {
            return Ok((c.generation, c.conn.clone()));
        }
        // Boxed: connecting (Sentinel's resolution above all) is a large
        // future, and every call's future would carry its size (copied
        // whole where a call is boxed, as `LockBackend`'s are) for what
        // happens once per connection.
        let (conn, pubsub) = Box::pin(self.connect()).await?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        *self.cached(lane) = Some(Cached {
            generation,
            conn: conn.clone(),
            pubsub,
        });
        tracing::debug!(node = %self.label, lane = lane.0, generation, "connected");
        Ok((generation, conn))
    }

    /// Opens every lane's connection that is not open yet, each bounded
    /// by the operation timeout.
    pub(crate) async fn open_lanes(&self) -> Result<(), LockError> {
        for lane in 0..self.lanes.len() {
            tokio::time::timeout(self.timeout, self.connection(Lane(lane)))
                .await
                .map_err(|_| self.timed_out(Operation::Connect, self.timeout))??;
        }
        Ok(())
    }

    async fn connect(&self) -> Result<(Conn, Option<redis::Client>), LockError> {
        let op = Operation::Connect;
        match &self.source {
            Source::Server(client) => Ok((self.data_conn(client).await?, Some(client.clone()))),
            Source::Cluster { client, .. } => {
                let conn = client
                    .get_async_connection()
                    .await
                    .map_err(|e| self.map_err(op, e))?;
                Ok((Conn::Cluster(conn), None))
            }
            Source::Sentinel {
                sentinels,
                master,
                config,
            } => {
                let mut last = None;
                for sentinel in sentinels {
                    match self.resolve_through(sentinel, master, config).await {
                        Ok(found) => return Ok(found),
                        Err(err) => last = Some(err),
                    }
                }
                Err(last.unwrap_or_else(|| {
                    LockError::new(ErrorKind::Unavailable, op, "no sentinel configured")
                        .with_backend(NAME)
                }))
            }
        }
    }

    /// Asks one sentinel for the master, connects, and checks with `ROLE`
    /// that it really is a master (a stale sentinel or a demoted server is
    /// refused).
    async fn resolve_through(
        &self,
        sentinel: &redis::Client,
        master: &str,
        config: &RedisConfig,
    ) -> Result<(Conn, Option<redis::Client>), LockError> {
        let op = Operation::Connect;
        let mut conn = sentinel
            .get_multiplexed_async_connection_with_config(&self.conn_config())
            .await
            .map_err(|e| self.map_err(op, e))?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.map_err(op, e))?;
        let Some((host, port)) = addr else {
            return Err(LockError::new(
                ErrorKind::Unavailable,
                op,
                format!("the sentinel does not know the master {master:?}"),
            )
            .with_backend(NAME));
        };
        let node = RedisNode::new(host, port);
        let client = open_client(&config.node_url(&node), self.tls.as_ref(), &self.secrets)?;
        let mut data = self.data_conn(&client).await?;
        let role: Vec<Value> = data
            .query(&redis::cmd("ROLE"))
            .await
            .map_err(|e| self.map_err(op, e))?;
        let is_master = matches!(role.first(), Some(Value::BulkString(b)) if b == b"master")
            || matches!(role.first(), Some(Value::SimpleString(s)) if s == "master");
        if !is_master {
            return Err(LockError::new(
                ErrorKind::Unavailable,
                op,
                format!("{node} is not (or no longer) the master"),
            )
            .with_backend(NAME));
        }
        tracing::debug!(master = %node, "sentinel resolved the master");
        Ok((data, Some(client)))
    }

    /// A data connection to the server `client` names: the redis crate's
    /// multiplexed connection (plain TCP or TLS).
    async fn data_conn(&self, client: &redis::Client) -> Result<Conn, LockError> {
        client
            .get_multiplexed_async_connection_with_config(&self.conn_config())
            .await
            .map(Conn::Server)
            .map_err(|e| self.map_err(Operation::Connect, e))
    }

    fn invalidate(&self, lane: Lane, generation: Option<u64>) {
        let mut cached = self.cached(lane);
        if let (Some(c), Some(generation)) = (&*cached, generation)
            && c.generation == generation
        {
            *cached = None;
        }
    }

    /// Runs `call` on the shared connection of `lane` ([`Lane::ANY`]: the
    /// next in turn), bounded by `timeout` in all (connecting first if needed; `call` may send several requests). Each
    /// request is also bounded by `timeout` inside the connection (the
    /// handle's response timeout, so that a request allowed longer than the
    /// operation timeout, a grant's `WAIT`, is not cut short). Errors that
    /// suggest a dead or demoted server drop the connection so the next
    /// call reconnects (re-resolving the master under Sentinel).
    pub(crate) async fn run_on<T, F, Fut>(
        &self,
        lane: impl Into<Option<Lane>>,
        op: Operation,
        timeout: Duration,
        call: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let lane = self.lane(lane.into());
        let mut generation = None;
        let attempt = async {
            let (g, conn) = self.connection(lane).await?;
            generation = Some(g);
            call(conn.with_response_timeout(timeout))
                .await
                .map_err(|err| self.call_failed(lane, op, timeout, g, err))
        };
        let result = tokio::time::timeout(timeout, attempt).await;
        match result {
            Ok(result) => result,
            Err(_) => {
                self.invalidate(lane, generation);
                Err(self.timed_out(op, timeout))
            }
        }
    }

    /// Runs `call`, which sends **one** request (an [`eval`](Conn::eval):
    /// `EVALSHA`, and `EVAL` after a `NOSCRIPT` answer), on the shared
    /// connection of `lane` ([`Lane::ANY`]: the next in turn). On one
    /// server whose connection is open, the request is
    /// bounded by the redis crate's response timeout alone, set to
    /// `timeout` on the handle: one timer per request, as a user of the
    /// crate alone has with its defaults, and none of ours around it (an
    /// `EVAL` after `NOSCRIPT` is bounded the same, so such a call takes
    /// at most one round trip plus `timeout`). Otherwise (no connection
    /// yet, or a cluster, whose client retries) as [`run_on`](Self::run_on).
    /// Errors drop the connection as `run_on` does; a timeout gives the
    /// same [`ErrorKind::Timeout`] as `run_on`'s.
    pub(crate) async fn run_request_on<T, F, Fut>(
        &self,
        lane: impl Into<Option<Lane>>,
        op: Operation,
        timeout: Duration,
        call: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let lane = self.lane(lane.into());
        let Some((generation, conn)) = self.open_server_connection(lane) else {
            // Boxed: the rare path, kept out of the size of every call's
            // future.
            return Box::pin(self.run_on(lane, op, timeout, call)).await;
        };
        call(conn.with_response_timeout(timeout))
            .await
            .map_err(|err| self.call_failed(lane, op, timeout, generation, err))
    }

    /// The shared connection of `lane` when it is open and to one server.
    fn open_server_connection(&self, lane: Lane) -> Option<(u64, Conn)> {
        let cached = self.cached(lane);
        let c = cached.as_ref()?;
        matches!(c.conn, Conn::Server(_)).then(|| (c.generation, c.conn.clone()))
    }

    /// The error of a call on connection `generation` that failed with
    /// `err`, dropping that connection when `err` suggests a dead or
    /// demoted server; a request the connection timed out after `timeout`
    /// as [`timed_out`](Self::timed_out).
    fn call_failed(
        &self,
        lane: Lane,
        op: Operation,
        timeout: Duration,
        generation: u64,
        err: RedisError,
    ) -> LockError {
        if needs_reconnect(&err) {
            self.invalidate(lane, Some(generation));
        }
        if err.is_timeout() {
            return self
                .timed_out(op, timeout)
                .with_source(Redacted::new(&err, &self.secrets));
        }
        self.map_err(op, err)
    }

    /// The node did not answer `op` within `timeout`.
    fn timed_out(&self, op: Operation, timeout: Duration) -> LockError {
        LockError::new(
            ErrorKind::Timeout,
            op,
            format!("{} did not answer within {timeout:?}", self.label),
        )
        .with_backend(NAME)
    }

    /// A new pub/sub connection to where releases are published.
    pub(crate) async fn pubsub(&self) -> Result<redis::aio::PubSub, LockError> {
        let op = Operation::Connect;
        let attempt = async {
            match &self.source {
                Source::Cluster { seeds, .. } => {
                    // PUBLISH is broadcast to every cluster node: any one will do.
                    let mut last = None;
                    for seed in seeds {
                        match seed.get_async_pubsub().await {
                            Ok(pubsub) => return Ok(pubsub),
                            Err(err) => last = Some(self.map_err(op, err)),
                        }
                    }
                    Err(last
                        .unwrap_or_else(|| LockError::config("no seed node").with_backend(NAME)))
                }
                _ => {
                    // Every lane's connection goes to the same server.
                    let lane = Lane(0);
                    self.connection(lane).await?;
                    let client = self.cached(lane).as_ref().and_then(|c| c.pubsub.clone());
                    let client = client.ok_or_else(|| {
                        LockError::new(ErrorKind::Unavailable, op, "no connection")
                            .with_backend(NAME)
                    })?;
                    client
                        .get_async_pubsub()
                        .await
                        .map_err(|e| self.map_err(op, e))
                }
            }
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .unwrap_or_else(|_| {
                Err(
                    LockError::new(ErrorKind::Timeout, op, "pub/sub connection timed out")
                        .with_backend(NAME),
                )
            })
    }

    pub(crate) fn map_err(&self, op: Operation, err: RedisError) -> LockError {
        map_redis_error(&self.label, &self.secrets, op, err)
    }
}
