//! The Redis driver of the distlock family: one server, a Sentinel-managed
//! master, Redis Cluster, or Redlock over independent servers.
//!
//! ```no_run
//! use std::time::Duration;
//! use lock_core::LockClient;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let backend = lock_redis::connect("redis://127.0.0.1:6379?ttl=10s").await?;
//! let client = LockClient::new(backend);
//! let total = client.with_lock("ledger", async { 40 + 2 }).await?;
//! # let _ = total; Ok(()) }
//! ```
//!
//! # URL schemes
//!
//! | scheme | topology |
//! |---|---|
//! | `redis://[[user]:pw@]host[:port][/db]` | one server |
//! | `rediss://...` | one server over TLS |
//! | `redis+sentinel://[[user]:pw@]s1[:port][,s2...]/master[/db]` | master found through Sentinel |
//! | `redis+cluster://[[user]:pw@]n1[:port][,n2...]` | Redis Cluster (seed nodes) |
//! | `redlock://[[user]:pw@]n1[:port],n2[:port],n3[:port][/db]` | Redlock over independent servers |
//!
//! Query options: `ttl`, `prefix`, `timeout` (operation timeout),
//! `replicas` and `wait_timeout` (WAIT after acquire), `recheck`, `tls`,
//! `sentinel_password`, `eviction=warn|refuse` (see *Eviction* below),
//! `fair=true` (FIFO mutexes, see *Fair mode* below), `layout=native|plain|redisson`
//! and `token_suffix` (other libraries' key layouts, see *Legacy layouts*
//! below), and for TLS `ca=/path/ca.pem` (trust this CA
//! instead of the system store) and `insecure=true` (**no certificate or
//! host name verification at all**; test setups only). See [`RedisConfig`].
//!
//! # TLS
//!
//! `rediss://` (and `tls=true`) use rustls with the ring crypto provider,
//! like every distlock driver (no OpenSSL). The server certificate is
//! verified against the system trust store (read by
//! `rustls-native-certs`), or only against the PEM file of the `ca` option
//! ([`RedisConfig::tls_ca_file`]), and must match the host name or IP
//! address of the URL. A certificate that fails verification is a `Config`
//! error at connect (retrying does not help), within the operation timeout.
//! The redis crate takes rustls's process-wide crypto provider: the backend
//! installs ring as that provider when a TLS connection is configured and
//! none is installed yet; one the application installed first is used
//! instead. Client certificates (mutual TLS) are not supported yet, and
//! `ca` is not available for `redis+cluster://` yet.
//!
//! # What it does
//!
//! - [x] **Acquire is one round trip**: one Lua script does
//!   `SET <prefix>{<key>} <owner> NX PX <ttl>` and, only on success, `INCR
//!   <prefix>{<key>}:token`, returning the new fencing token. The lock key
//!   holds the owner id (32 hex digits) as a plain string, so clients of
//!   other libraries that use `SET key <random> NX PX` on the same key
//!   exclude with ours (and [`RedisBackend::redis_key`] tells them the key).
//! - [x] **Idempotent acquire**: the cluster client resends a script after
//!   a lost reply, an I/O error or a MOVED/ASK redirect. A resent acquire
//!   that finds our own owner value in the key returns the grant it made
//!   (the token is read from the counter, which only a grant of a free key
//!   increments, so it still holds ours) and sets the TTL again, instead of
//!   reporting the key held by someone (us) until it expires.
//! - [x] **Release** is an atomic compare-and-delete, **renew** an atomic
//!   compare-and-`PEXPIRE`; both report "not held" when the value is not
//!   ours and never touch another owner's lock. Scripts go by `EVALSHA`,
//!   falling back to `EVAL` on `NOSCRIPT` (a restarted server).
//! - [x] **Notified waiting**: a release `PUBLISH`es on a per-key channel;
//!   a waiting acquire tries once first (on a free key that is the whole
//!   acquire: one round trip, no pub/sub traffic); only when it finds the
//!   key held does it subscribe (waiters share one pub/sub connection per
//!   node), and once the subscription is confirmed it tries again, so a
//!   release between the first try and the subscription is not missed.
//!   Then it re-checks on each notification and when the holder's TTL
//!   (reported by the failed attempt) runs out, at least every `recheck`
//!   (expiry publishes nothing). No busy polling.
//! - [x] **One shared, pipelined connection per node**, used by every lock
//!   of a backend (and its clones), re-established after an error or
//!   timeout; every call bounded by the operation timeout. Over plain TCP
//!   its callers drive it themselves (no connection task: a caller alone on
//!   it writes its request and reads its own reply, as on a bare stream;
//!   concurrent callers pipeline and hand each other their replies in wire
//!   order); over TLS it is the redis crate's multiplexed connection.
//! - [x] **Batched renewal**: renewals are queued per node and sent as one
//!   pipeline (up to 2,000 per round trip); guards renewed together stay
//!   together, so 10,000 held locks cost a handful of round trips per period.
//! - [x] **Cancellation**: an acquire whose answer was lost (timeout, dropped
//!   future) releases its possible grant in the background.
//! - [x] **Optional `WAIT`** for N replicas after each acquire (`replicas=N`):
//!   a grant fewer replicas acknowledged is undone and reported as
//!   `Unavailable`. It narrows the window in which a failover loses a lock,
//!   nothing more: replication stays asynchronous, a failover may promote a
//!   replica that did not acknowledge, and nothing is fsynced. `WAIT` blocks
//!   the connection it is sent on, so while it waits (at most
//!   `wait_timeout`, 100 ms by default) the backend's other calls queue
//!   behind it.
//! - [x] **Redlock** over N independent servers: majority quorum, validity =
//!   TTL − elapsed (from the first request sent) − drift (`ttl/100 + 2 ms`),
//!   a failed attempt releases on every node (also those whose reply was
//!   lost), a random delay after a split vote; renew and release need the
//!   same majority.
//! - [x] **Cluster**: the hash tag `{<key>}` puts the lock and its counter in
//!   one slot, so the scripts run on a single node.
//! - [x] **Sentinel**: the master is resolved through the sentinels, checked
//!   with `ROLE`, and re-resolved after a connection error, a timeout or a
//!   `READONLY` answer (the redis crate's own Sentinel client does not do
//!   that after a failover).
//! - [x] Passwords never appear in `Debug`, logs or errors.
//!
//! # Read-write locks and semaphores
//!
//! One server, Sentinel (the scripts run on the master) and Cluster grant
//! [`LeaseKind::Read`](lock_core::LeaseKind::Read),
//! [`Write`](lock_core::LeaseKind::Write) and
//! [`Permits`](lock_core::LeaseKind::Permits) (`shared_locks` and
//! `semaphores` in the capabilities); Redlock does not (below). Each grant
//! is a lease of its own (owner, TTL, renewal, lost signal, token), renewed
//! and released through the same `renew` / `renew_many` / `release` as the
//! mutex, which read the lease's kind. Every call is one script on one
//! slot: all keys of a lock carry the mutex's hash tag `{<key>}`, and each
//! shape has its own names, so the mutex, the read-write lock and the
//! semaphore called `<key>` are three different locks. Expiry is the
//! server's clock (`TIME` inside the script), never the client's.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix>{<key>}:rw:writer` | string, `PX` | the writer's owner id |
//! | `<prefix>{<key>}:rw:writer:holder` | string, the writer's `PX` | the writer's holder details, `<owner> <details>` (as the mutex's side key) |
//! | `<prefix>{<key>}:rw:readers` | sorted set | readers, scored by their own expiry (ms) |
//! | `<prefix>{<key>}:rw:details` | hash, expires with the readers | owner -> each reader's holder details |
//! | `<prefix>{<key>}:rw:queue` / `:queue-expiry` | sorted sets | waiting writers by arrival / by expiry |
//! | `<prefix>{<key>}:rw:counters` | hash, kept forever | `token` (grant counter), `epoch` (last write token), `seq` (arrivals) |
//! | `<prefix>{<key>}:sem:holders` | sorted set | permit holders, scored by their own expiry |
//! | `<prefix>{<key>}:sem:counts` / `:tokens` | hashes | each holder's permit count / token |
//! | `<prefix>{<key>}:sem:details` | hash, expires with the holders | owner -> each permit holder's holder details |
//! | `<prefix>{<key>}:sem:queue` / `:queue-expiry` | sorted sets | waiting requests by arrival / by expiry |
//! | `<prefix>{<key>}:sem:counters` | hash, kept forever | `token`, `seq`, `limit` (the limit in use) |
//!
//! Channels `<prefix>{<key>}:rw:released` and `:sem:released` carry the
//! release notifications.
//!
//! - [x] **Shares expire on their own.** A member whose score (expiry)
//!   passed counts for nothing: every script first removes such members,
//!   renewals never extend them, and each set's own `PEXPIRE` is that of
//!   its latest member, so a dead reader or permit holder frees its share
//!   at its TTL and never keeps a key alive.
//! - [x] **Read-write lock.** A writer is granted when there is no writer,
//!   no live reader, and no waiting writer queued before it; a reader when
//!   there is no writer and **no live waiting writer** (writer preference:
//!   readers, trying or waiting, queue behind a waiting writer; readers can
//!   therefore starve while writers keep coming). Waiting writers are
//!   served in arrival order. A waiting writer's (or permit request's)
//!   entry has a short expiry of its own, the lease's TTL capped at three
//!   `recheck` intervals (1.5 s by default), refreshed at least every third
//!   of it while it waits; it is withdrawn at its deadline before
//!   `acquire_kind` returns `Contended`, in the background when the acquire
//!   is dropped, and by that expiry when the client dies.
//! - [x] **Downgrade** is one script: if the lease is the writer, the
//!   writer entry goes and the same owner joins the readers with the same
//!   token; the write lease is dead afterwards (`NotHeld` / `false`).
//! - [x] **Semaphore.** At most `limit` permits held in total; a request
//!   takes its `count` at once. The limit is stored while the semaphore is
//!   in use (holders or waiters); a request with another limit is
//!   `InvalidArgument`; an idle semaphore takes the next request's limit.
//!   **Waiting is FIFO**: a request is granted only when no waiting request
//!   arrived before it (try or wait), so a large request at the head is not
//!   overtaken by smaller later ones. (`Capabilities::fifo` stays `false`:
//!   it describes the mutex, whose waiting is not ordered.)
//! - [x] **Tokens.** Write and permit grants: `HINCRBY` of the shape's
//!   counter, strictly above every earlier grant of that key and shape.
//!   Read grants: the token of the latest write grant before them (the
//!   `epoch`; 0 when never written), so readers of one epoch carry equal
//!   tokens; a downgraded writer keeps its token. Like the mutex counter,
//!   these can go backwards after a failover or a restart without fsync.
//! - [x] **Waiting by notification**: the first try is the whole acquire
//!   on a free lock (one round trip, nothing subscribed); a refused one
//!   subscribes to the shape's channel, tries again once subscribed, and
//!   re-tries on each release / downgrade / withdrawal notification and
//!   when the blocker's TTL ends (at least every `recheck`).
//! - [x] **Batched renewal**: `renew_many` renews read and permit leases in
//!   pipelines of one script call each (2,000 per round trip), write leases
//!   through the mutex's renewal batches, mutex leases as before.
//! - [x] `replicas=N` applies to shared grants as to the mutex: `WAIT`
//!   after each grant, undone and `Unavailable` when too few replicas took it.
//! - [x] `holders(key, shape)` lists the writer or every live reader, or
//!   every live permit holder, with kind, owner, token, remaining TTL and
//!   holder details, read in the same script (one round trip).
//! - [x] **Holder details** ([`HolderInfo::details`]) of every read, write
//!   and permit grant are written by the script that grants it (no extra
//!   round trip), in the lock's slot: a reader's or permit holder's in its
//!   shape's `:details` hash (field = owner; the hash `PEXPIRE`s with its
//!   sorted set, renewals extend both, release `HDEL`s the field, and the
//!   sweep of an expired member removes its field too), the writer's in
//!   `<writer>:holder` like the mutex's (its `PX`, renewed by the mutex's
//!   renewal batches, deleted by release). A downgrade moves the writer's
//!   details to the readers' hash unchanged (same grant time). An abandoned
//!   grant (lost answer, too few replicas) takes its details with it.
//! - [x] **`list_shared(shape, prefix, cursor, limit)`** for
//!   [`LockShape::ReadWrite`](lock_core::LockShape::ReadWrite) and
//!   [`Semaphore`](lock_core::LockShape::Semaphore) (one server, Sentinel,
//!   Cluster): `list`'s `SCAN` walk, bounds and cursor (below), with the
//!   pattern `<prefix>{<escaped user prefix>*}:rw:*` (no `TYPE`; only
//!   `:rw:writer` and `:rw:readers` names are kept) or
//!   `…}:sem:holders` (`TYPE zset`); each key found is read by the
//!   `holders` script and listed with every live holder. A held read-write
//!   lock has a writer key or a readers set, never both with live holders;
//!   it is listed through the one that holds it now, so each key once.
//!   The mutex is listed from `list`.
//! - **Redlock refuses both** (`Unsupported`, saying why; `list_shared`
//!   of them too, and the legacy layouts refuse them): its majority
//!   rule over independent nodes gives no consistent order of readers,
//!   writers or permits across nodes; two majorities can each count a
//!   different set of holders, so neither exclusion nor the limit could be
//!   promised.
//!
//! # Fair mode (`fair=true`)
//!
//! One server, Sentinel and Cluster; Redlock refuses it at connect
//! (`Unsupported`: independent nodes would keep independent queues, and
//! no node's order is the majority's). `Capabilities::fifo` is `true`, and
//! the descriptor's `fair_option` is `fair=true`.
//!
//! | key | type | holds |
//! |---|---|---|
//! | `<prefix>{<key>}` and `:token` | the mutex's | the holder (plain string, `PX`) and the token counter, shared with unfair clients |
//! | `<prefix>{<key>}:fair:queue` | sorted set | waiters (their owner ids) by arrival sequence |
//! | `<prefix>{<key>}:fair:queue_expiry` | sorted set | the same waiters by the server instant (ms) their entry lease ends |
//! | `<prefix>{<key>}:fair:seq` | string | the arrival sequence (goes with the queue) |
//!
//! - [x] **Only the queue's live head takes a free key.** Every fair
//!   acquire script first removes waiters whose entry lease ended, then
//!   grants a free key to the head of the queue, or to anyone when the
//!   queue is empty. A `try_acquire` of a key with live waiters is refused
//!   (nobody jumps the queue), and so is a fair `lock_all` set containing
//!   it.
//! - [x] **A lease per waiter.** A waiting acquire joins the queue in the
//!   same script call as its first refused try, with an entry lease of
//!   min(TTL, 3 × `recheck`) (1.5 s by default, at least 30 ms), refreshed
//!   by every attempt, at least every third of it. A waiter that died
//!   (process killed, connection cut) is skipped as soon as its entry
//!   lease ends: the next attempt sweeps it and, when that leaves a free
//!   key to the new head, publishes so it goes on at once; waiters behind
//!   a dead head re-check when the head's entry lease ends (the refused
//!   answer says when). Nothing stalls for a fixed wait time. Measured
//!   (`tests/fair_and_multi.rs`, `recheck=500ms`): the next waiter was
//!   granted ~0.5 ms after the release behind a cancelled waiter and
//!   ~1.4 s after it behind a killed one (its 1.5 s entry lease).
//! - [x] **Cancelled waiters withdraw**: an acquire dropped while waiting,
//!   or ending at its deadline (`Contended`) or on an error, removes its
//!   entry in the background; the withdrawal publishes, so the next waiter
//!   is not held up.
//! - [x] **Fair, unfair and foreign clients exclude each other**: the lock
//!   key, its value and the token counter are the mutex's. Unfair clients
//!   (and plain `SET NX PX` clients) ignore the queue: mixed on one key,
//!   they can take a free key before the fair head (exclusion holds, order
//!   does not). Release, renew, `renew_many` and `inspect` are the mutex's.
//! - [x] **Cost**: a try, or a waiting acquire, on a free key with an empty
//!   queue is one script call (one round trip, no pub/sub), as unfair;
//!   the queue work (join, refresh, leave) only begins once the key is
//!   contended. A release wakes every waiter of the key on its channel
//!   (pub/sub has no "wake the head only"); only the head is granted, the
//!   others re-check and wait again.
//! - A waiter whose own entry lease ended before it refreshed it (a pause
//!   longer than the lease) joins again at the end of the queue.
//! - The read-write lock's writers and the semaphore's requests queue in
//!   arrival order in both modes; `fair` changes the mutex only.
//!
//! # Legacy layouts (`layout=plain`, `layout=redisson`)
//!
//! For a fleet that already locks with another library and moves to this
//! one (or through it to etcd or ZooKeeper, see lock-core's migration):
//! with a legacy layout our mutex *is* the lock those clients take, on the
//! exact key they use, so the two exclude each other in both directions.
//! URL options `layout=plain` / `layout=redisson` (default `native`), or
//! [`RedisConfig::layout`] with [`RedisLayout`]; `token_suffix=<text>`
//! ([`RedisConfig::token_suffix`], default [`DEFAULT_TOKEN_SUFFIX`],
//! `:token`). Neither adds a hash tag or a default prefix: the Redis key is
//! the lock's name itself (an explicit `prefix=` is prepended verbatim,
//! and still may not contain braces: put a hash tag in the key).
//!
//! | layout | lock key | fencing counter | release channel | clients |
//! |---|---|---|---|---|
//! | `plain` | `<key>`: string, `SET <key> distlock:<owner hex> NX PX <ttl>` | `<key>:token` (`<key><token_suffix>`) | `<key>:released` | redis-py `Lock` (`r.lock(name)`), redsync, node-redlock, hand-written `SET NX PX` locks |
//! | `redisson` | `<key>`: hash `{distlock:<owner hex>: 1}` with `PEXPIRE <ttl>` | `<key>:token` (`<key><token_suffix>`) | `redisson_lock__channel:{<key>}` (`redisson_lock__channel:<key>` when the key has a `{`), message `0` | Redisson `RLock` (`getLock(name)`) |
//!
//! - [x] **Plain**: acquire is `SET NX PX` + `INCR` of the counter in one
//!   script, release compare-and-`DEL` (then `PUBLISH 1` on
//!   `<key>:released`), renew compare-and-`PEXPIRE`: the rules of redis-py,
//!   redsync and node-redlock. Any value at the key holds it (redis-py
//!   stores a uuid1 hex, node-redlock 16 random bytes in hex, others
//!   anything); ours is `distlock:` + our 32 hex digits, so [`inspect`]
//!   tells ours (with our token) from theirs (their value, no token).
//! - [x] **Redisson**: the rules of Redisson's own scripts
//!   (`RedissonLock.tryLockInnerAsync`, `unlockInnerAsync`, the renewal
//!   `LockTask`). Our acquire is granted only when the key does not exist
//!   (`HINCRBY <field> 1`, `PEXPIRE`, `INCR` of the counter); finding our
//!   own field is a resent script of ours (same grant, TTL set again, no
//!   second count). Renewal is `HEXISTS` before `PEXPIRE`; release is
//!   `HINCRBY -1` when our field is there, and at 0 `DEL` and the unlock
//!   message `0` on Redisson's channel by `PUBLISH` and (Redis 7+)
//!   `SPUBLISH`, so Redisson waiters, plain or sharded, wake. Our waiters
//!   subscribe to the same channel, so Redisson's unlock wakes them.
//!   Redisson's field is `<uuid>:<threadId>`, counted up on re-entry; ours
//!   is `distlock:<owner hex>`, one per grant, never above 1 (re-entry is
//!   by scope in lock-core, with no round trip). Redisson's unlock latch
//!   (`redisson_unlock_latch:…`) is its own retry bookkeeping; we neither
//!   read nor write it.
//! - [x] **Cluster**: the scripts touch the lock and its counter in one
//!   call, so both must hash to one slot: a key without a hash tag (whose
//!   `<key>:token` lands elsewhere) is refused before anything is sent with
//!   `InvalidArgument`, saying to put a hash tag in the key (`{jobs}:a`,
//!   counter `{jobs}:a:token`). The other clients must then use the same
//!   tagged key. In Cluster our waiters hear Redisson's unlock only when it
//!   `PUBLISH`es (Redisson 3.x uses `SPUBLISH` on Redis 7 clusters): they
//!   then re-check at the holder's PTTL, at least every `recheck`.
//! - [x] **Sentinel** and one server: as above. **Redlock** takes
//!   `layout=plain` (the layout node-redlock and redsync keep on each of N
//!   servers; the same majority rules; no safe token, as always on
//!   Redlock) and refuses `layout=redisson` (`Unsupported` at connect).
//! - **Mutex only.** Read-write locks, semaphores and `holders` of those
//!   shapes answer `Unsupported` (`shared_locks` and `semaphores` are
//!   `false` in the capabilities); `fair=true` is refused at connect
//!   (`Unsupported`: the other clients do not see our queue); a one-script
//!   `try_acquire_all` answers `Unsupported`, so `lock_all` takes the keys
//!   one at a time in global order.
//! - **The library's own keys** (under `__distlock/`: a migration's
//!   cutover marker) keep the native names `<prefix>{<key>}` in every
//!   layout, so a migration can announce its cutover in Cluster too.
//! - **Fencing is ours alone.** Only our grants `INCR` the counter; a
//!   legacy client's grant does not, carries no token, and the resource
//!   cannot tell it from a stale holder. During a migration the resource
//!   can only fence our processes against each other; exclusion against
//!   the legacy clients rests on their TTLs and their compare-and-delete.
//! - **Clocks and TTLs.** The key's TTL is the server's (`PX` /
//!   `PEXPIRE`); each client computes its own validity from its own clock
//!   and its own drift allowance (redis-py tracks none; node-redlock and
//!   ours `ttl/100 + 2 ms`), so a client paused past its TTL can still believe
//!   it holds the lock, in any layout. A release by redis-py, redsync or
//!   node-redlock publishes nothing: our waiters see it at the holder's
//!   PTTL or within `recheck` (500 ms by default); a key set without a TTL
//!   is re-checked every `recheck` and never taken over.
//!
//! Tested with the real clients, as processes or their own scripts
//! (`tests/legacy.rs`, `tests/legacy_redisson.rs`; installed by
//! `scripts/legacy-clients.sh`): redis-py 8.1 `Lock` on one server and
//! through Sentinel, node-redlock 4.2.0 (ioredis 4) on one server and as
//! Redlock over three, Redisson's scripts (re-entry, renewal of a foreign
//! field, unlock message both ways); each both ways, each with a control
//! (our native layout on the same name gets in beside them and the check
//! reports it); Cluster's hash-tag rule; the refused shapes; and the whole
//! conformance suite on one server with each legacy layout.
//!
//! [`inspect`]: lock_core::LockBackend::inspect
//!
//! # Multi-locks (`try_acquire_all`)
//!
//! `LockClient::lock_all` first asks for the whole set in one script
//! (`EVALSHA`, one round trip): the script checks every key (free, and in
//! fair mode no live waiters) and only then sets every lock (`SET <owner>
//! PX <ttl>`, an owner per key) and `INCR`s every counter (a fresh token
//! per key, from the key's own counter), or writes nothing and answers
//! "held". One server and Sentinel take any set; Cluster takes a set whose
//! keys all hash to one slot (the hash tag is the whole key name, so
//! different keys rarely share one: most sets of two or more keys are
//! `Unsupported` there, checked before anything is sent); Redlock answers
//! `Unsupported`. On `Unsupported`, or a held key with a wait, lock-core
//! takes the keys one at a time in global order. Each lease is a plain
//! mutex lease of its key (a plain lock of that key excludes it). An answer
//! that was lost (timeout, dropped future) releases the whole set in the
//! background; a resent script finds its own grants and returns them.
//!
//!
//! - **Not linearizable.** Replication is asynchronous: a failover (or a
//!   restart without `appendfsync always`) can lose a granted lock, and
//!   another client is then granted the same key while the first still
//!   holds it. The fencing counter lives in the same store, so it can go
//!   **backwards** too (the suite's negative control shows both). Hence
//!   `fencing_survives_failover = false` and `linearizable = false`.
//! - **Fencing tokens** are per key (`FencingScope::PerKey`) on one server,
//!   Sentinel and Cluster. The counter key `<prefix>{<key>}:token` is kept
//!   forever (a few dozen bytes per key ever locked) so tokens keep growing.
//! - **Redlock has no safe fencing token** (`FencingScope::None`): each node
//!   has its own counter and a majority can be formed by different nodes
//!   each time, so the token (the highest node counter) may repeat or go
//!   backwards. Its safety also rests on timing: a client paused (GC, page
//!   faults) past its validity, a node whose clock jumps, or a node that
//!   restarts without persistence and without waiting a TTL before serving
//!   can each let two clients hold the lock. Use it for efficiency, not for
//!   correctness; use etcd or ZooKeeper for the latter.
//! - TTL precision is one millisecond; the shortest TTL accepted is
//!   [`MIN_TTL`]. Waiting for the mutex is not FIFO unless `fair=true`
//!   (waiting writers and permit requests always are, see above).
//! - `WAIT` is refused for Cluster and Redlock.
//! - Renewals wait up to TTL/30 (at most 100 ms) to join a batch; their
//!   validity is still computed from when the batch was sent.
//! - Cluster pub/sub uses one seed node (`PUBLISH` is broadcast cluster-wide);
//!   renewals on a cluster go as concurrent calls that the cluster client
//!   pipelines per node, not as one pipeline.
//! - Sentinels are contacted without a password unless `sentinel_password`
//!   is given; data nodes use the URL's credentials.
//!
//! # Operating locks (holder details, `list`, `force_release`, `gc`)
//!
//! - **Holder details** ([`LockInfo::details`]: host, pid, program,
//!   label, grant time) live beside the lock in the side key
//!   `<lock>:holder` (`<prefix>{<key>}:holder` natively, `<prefix><key>:holder`
//!   in the legacy layouts; same hash tag, so same Cluster slot), a string
//!   `<owner value> <HolderDetails::encode_current()>`. Every mutex grant
//!   writes it in its own script with the lock's `PX` (plain, fair and
//!   multi-lock acquires, every layout and topology, each Redlock node):
//!   no extra round trip. The renew script (single and batched) `PEXPIRE`s
//!   it with the lock, release and `force_release` `DEL` it, and it
//!   expires with the lock. The lock key keeps exactly the bytes other
//!   clients compare (the owner string, Redisson's hash); `inspect` reads
//!   the side key in its script and reports details only when the side
//!   key names the current holder, so a foreign holder has none. Read-write
//!   locks and semaphores keep theirs beside each share (see *Read-write
//!   locks and semaphores*). Elections are the renewed mutex, so a
//!   leader's details are its mutex's. `Capabilities::holder_details` is
//!   true everywhere.
//! - **`list(prefix, cursor, limit)`**: `SCAN <cursor> MATCH <pattern>
//!   COUNT 200 TYPE string` (`hash` for Redisson), the pattern
//!   `<prefix>{<escaped user prefix>*` natively (`<prefix><user prefix>*`
//!   in the legacy layouts), glob characters escaped; only lock keys are
//!   kept (natively `<prefix>{<tag>}` exactly, so counters, side keys,
//!   channels, fair queues, read-write and semaphore keys are not; in the
//!   legacy layouts names ending in the token suffix or `:holder` are
//!   skipped), then each is inspected (holder, token, TTL, details). At
//!   most 20 `SCAN`s per call. The cursor is `<target>:<Redis cursor>`
//!   (`:<hex of the last key>` when a page filled inside one `SCAN`
//!   batch): target = the node (Redlock: each server in turn; a lock is
//!   listed with the first server that has it, when a majority holds it; a
//!   server that does not answer is passed over, its locks are on others)
//!   or, in Cluster, the master's index in address order
//!   (`CLUSTER SLOTS`). Any other cursor is `InvalidArgument`. Holders of
//!   other clients in the legacy layouts are listed like ours (no token).
//! - **`force_release(key)`**: one script per node: reads the holder (as
//!   `inspect` would: our owner, another library's value, or `<type>`),
//!   `DEL`s the lock and its side key, and publishes the release on the
//!   key's channel (Redisson's unlock message `0`, also by `SPUBLISH`, in
//!   that layout) so waiters go on at once. The token counter is left
//!   alone: the next grant's token is above the broken one. The broken
//!   holder's renew answers `NotHeld`, its release `false`. Redlock: on
//!   every node, a majority must answer.
//! - **`gc(older_than)`** (one server, Sentinel, Cluster and Redlock,
//!   `layout=native`): scans `<prefix>{*}:token` (20 `SCAN`s of 200 per
//!   call, continuing where the last call stopped; in Cluster every master
//!   in turn, on Redlock every node in turn, as `list` walks them) and
//!   removes, one script per counter (pipelined, on the node scanned;
//!   concurrent in Cluster), each counter whose lock is free (on that node),
//!   that has no TTL, and whose `OBJECT IDLETIME` (every grant and inspect
//!   touches it) is at least `older_than`, after raising the counter's
//!   token floor to its value in the same script. On one server and
//!   Sentinel the floor is one key, `distlock:token-floor`, for every
//!   prefix and layout, and the report's `token_floor` is its value. In
//!   Cluster the floor is one key per hash slot,
//!   `distlock:token-floor:{<n>%}` with `<n>` the smallest number whose tag
//!   `<n>%` hashes (CRC16, as the servers) to that slot (a table of the
//!   16384 names, found once on connect by trying 0, 1, ...; a trailing
//!   `%` is never in a native name's tag, so no lock of any prefix is a
//!   floor key): each script gets the floor of its counter's slot as a key,
//!   so it stays within one slot, and `token_floor` is `None` (no single
//!   floor). Every script that creates a counter (`INCR` answering 1:
//!   plain, fair and multi-lock acquires, every layout) adds its floor, in
//!   the same script: no extra round trip. A server whose
//!   `maxmemory-policy` is LFU keeps no idle time: nothing is removed.
//!   Redlock: each node has its own `distlock:token-floor`, raised by gc
//!   on that node and passed to every acquire on that node, so each node's
//!   counter of a key stays strictly increasing over that node's grants,
//!   exactly as without gc; the lease's token (the highest counter of the
//!   nodes that granted) is still no fence (`FencingScope::None`: two
//!   majorities count on different nodes) and `inspect` still reports none.
//!   A node that does not answer is passed over (its counters wait for a
//!   later run); `token_floor` is `None` (one floor per node).
//!   Unsupported in the legacy layouts (their counters sit among
//!   application keys that gc cannot tell from ours; in Cluster they get
//!   no floor).
//!   `distlock:token-floor` is reserved in the legacy layouts.
//!
//! Tested: the shared cases `holder_details_are_reported`,
//! `list_finds_held_locks` and `force_release_fences_the_old_holder` pass
//! on one server, fair, Sentinel, Cluster (fair too), Redlock over five
//! and both legacy layouts (`tests/conformance.rs`, `tests/legacy.rs`);
//! `tests/admin.rs`: gc (a removed key's next token is above its last and
//! the floor, a held key's counter stays, nothing idle for an hour goes,
//! a counter made under another prefix starts above the floor; control:
//! a counter deleted by hand without the floor restarts at 1), gc on a
//! 3-master Cluster (12 keys in 12 slots spread over every master, each
//! counter removed, each slot's floor at or above its key's last token,
//! every next token above the last; controls: a counter deleted by hand
//! and a slot's floor key deleted by hand each restart at 1, which the
//! same check reports), gc on Redlock over three (each node's idle
//! counters removed under that node's floor, a held key's kept on every
//! node, every node's next counter and the next token above the last, a
//! dead node passed over; control: a node's counter deleted by hand
//! restarts at 1, which the same check reports; by hand: acquires sent
//! without the node's floor fail it), gc refused with the legacy layouts,
//! bad cursors, details beside the plain and Redisson values (value unchanged, `SET NX` excluded and
//! getting in on another key, TTL kept by renew, gone with release), and
//! `force_release` of a foreign holder (counter kept), `force_release`
//! waking a waiter at once (control: a lock deleted by hand leaves it
//! waiting for its re-check), and a `list` prefix with glob characters
//! matched literally (control: a key the unescaped pattern would match).
//!
//! The shared cases `shared_holder_details_are_reported` and
//! `list_finds_shared_locks` pass on the same targets (two readers, a
//! writer, two permit holders and a leader carry this process's details;
//! `list_shared` pages through exactly the held read-write locks and
//! semaphores; `list_elections` through the led elections). On Redlock and
//! the legacy layouts they check the leader and the elections only (their
//! shared shapes are `Unsupported`). `tests/shared.rs`
//! (`share_details_live_and_die_with_their_share`): the details' keys,
//! TTLs, renewal, release, sweep of an expired share and downgrade, and
//! nothing left but the counters (controls, run by hand: the grants sent
//! without details fail it and both shared cases; the sweep or the release
//! without the details' hash fail it). `tests/admin.rs`
//! (`list_shared_is_bounded_and_exact`): 12 read-write locks and 5
//! semaphores among 10,000 other keys, pages of 4, at most 20 `SCAN`s per
//! call by the server's own count (control, by hand: 60 per call fails
//! it), bad cursors and limits, the legacy layouts' refusal.
//!
//! [`LockInfo::details`]: lock_core::LockInfo::details
//! [`HolderInfo::details`]: lock_core::HolderInfo::details
//!
//! # Eviction
//!
//! A Redis allowed to evict keys breaks both promises: under any
//! `maxmemory-policy` other than `noeviction`, a server at its `maxmemory`
//! deletes keys to make room. `volatile-*` policies evict keys with a TTL,
//! i.e. every held lock (another client is then granted it while the
//! holder still works); `allkeys-*` also evict the token counters (tokens
//! start again at 1, so a fenced resource rejects every new holder, or
//! accepts an old one). Run lock servers with `maxmemory-policy
//! noeviction` (Redis' default): a full server then refuses the acquire
//! instead.
//!
//! At connect the backend reads `CONFIG GET maxmemory-policy` and
//! `maxmemory` on each node (one node of a cluster) and reports what it
//! found in [`RedisBackend::eviction`]. A policy other than `noeviction`
//! (even with `maxmemory 0`, which evicts nothing until a limit is set at
//! run time) is logged as a `tracing` warning, or refused with a `Config`
//! error when the URL says `eviction=refuse` ([`RedisConfig::eviction`]):
//! use that when you rely on fencing tokens or exclusion for correctness.
//! Managed services often disable or rename `CONFIG`: then the policy
//! cannot be checked, which is a warning, never a failure.
//!
//! # Tested
//!
//! `cargo test -p lock-redis` starts its own servers (redis-server 7 and
//! redis-cli on PATH): the whole conformance suite on one server, a
//! 3-master cluster, master + replica + sentinel, and 5-node Redlock (also
//! with one node killed); three of five Redlock nodes killed; Sentinel
//! failovers (graceful and master killed); interop with plain `SET NX PX`
//! clients; script-cache loss and restarts; `WAIT`; batched renewal; and the
//! failover negative control, which asserts that the history checker
//! reports the double grant and the token regression.
//! A resent acquire script returns its own grant (`scripts.rs`), and the
//! eviction check is tested against servers started with `--maxmemory 100mb
//! --maxmemory-policy allkeys-lru`, `volatile-ttl`, `noeviction`, and with
//! `CONFIG` renamed away (`tests/eviction.rs`).
//! TLS (`tests/tls.rs`): a CA and a server certificate for 127.0.0.1 /
//! localhost are generated at test time and redis-server runs with
//! `--port 0 --tls-port` only; the whole conformance suite passes over
//! `rediss://127.0.0.1:<port>?ca=<file>`, plus acquire, renew, inspect,
//! release and a notified wait over TLS (also by the name `localhost`);
//! a CA that did not sign the server certificate, and the system trust
//! store, fail as `Config` errors within the timeout; `insecure=true`
//! connects; a plain `redis://` client on the TLS port fails as
//! `Unavailable`/`Timeout` within the timeout; a missing or malformed CA
//! file and contradictory options are `Config` errors. Sentinel, Cluster
//! and Redlock over TLS are not tested.
//! Read-write locks and semaphores (`tests/shared.rs`), on one server, a
//! 3-master cluster and Sentinel: exclusion and sharing observed under
//! contention, writer preference, downgrade against a racing writer, FIFO
//! permits, limit mismatch, crashed holders and waiters, cancelled waits,
//! holders and tokens; each of those checks is shown failing on a broken
//! wrapper of the real backend (a reader beside a writer, a writer that does
//! not queue, a downgrade with a gap, one permit too many, permits that do
//! not queue, a stale write token); Redlock's refusal.
//! Fair mode: the whole conformance suite (the FIFO case included) on one
//! server and on a 3-master cluster with `fair=true`, and its mutex, FIFO,
//! deadline, dropped-waiter, multi-lock and election cases through
//! Sentinel; the fair script
//! against its broken variants (no head check: a later waiter and a try
//! take the key first; no sweep: a dead head stalls the queue) in
//! `fair_scripts.rs`; in `tests/fair_and_multi.rs` fair / unfair exclusion
//! both ways (a client on another layout is caught), no try or fair set
//! jumping a queue (unfair clients do), a cancelled waiter against a killed
//! one (connection cut before its withdrawal), and the multi-lock's all or
//! nothing (a held key: nothing written, counters untouched; the one-pass
//! script variant is caught), fresh tokens, Cluster slots and Redlock's
//! refusal.
//! `cargo run --release -p lock-redis --example redis_bench` measures the cycle
//! against the raw round trips.
//!
//! # Benchmarks
//!
//! [`floor::RedisFloor`] issues the driver's two script calls of an
//! uncontended acquire+release by hand, in RESP written by hand on one bare
//! TCP connection to one server (`redis://`), and [`floor::RedlockFloor`]
//! the same on one bare connection per node of a `redlock://` URL: the
//! floors that the `bench` example and `distlock compare` measure our cycle
//! against. `tests/round_trips.rs` counts round trips through the fault
//! proxy: a waiting acquire + release on a free key costs 2, as the floor's
//! cycle does (2 per node on Redlock), and one more fails the test; the
//! same in fair mode; a `lock_all` of 3 free keys costs 1 (3 on the
//! one-key-at-a-time path).

#![deny(missing_docs)]

mod batch;
mod config;
mod conn;
mod descriptor;
mod direct;
mod driver;
mod error;
mod eviction;
mod fair_scripts;
pub mod floor;
mod layout;
mod notify;
mod renew_many;
mod scripts;
mod shared_scripts;
#[cfg(test)]
mod test_redis;

pub use config::{
    DEFAULT_OPERATION_TIMEOUT, DEFAULT_PREFIX, DEFAULT_RECHECK, DEFAULT_TTL, RedisConfig,
    RedisNode, RedisTopology,
};
pub use descriptor::DRIVER;
pub use driver::{MIN_TTL, RedisBackend, RedisRenewalStats, capabilities, connect};
pub use eviction::{EvictionCheck, EvictionMode};
pub use layout::{DEFAULT_TOKEN_SUFFIX, RedisLayout};
