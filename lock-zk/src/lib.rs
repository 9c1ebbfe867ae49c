//! The ZooKeeper driver of the distlock family: Curator's lock recipe
//! (ephemeral sequential nodes, lowest sequence holds, each waiter watches
//! its predecessor), with `czxid` fencing tokens and a session-aware lost
//! signal.
//!
//! # URL
//!
//! `zk://[user:password@]host:port[,host:port...][/chroot][?options]`
//! (also `zookeeper://`). Options: `session_timeout`, `connect_timeout`,
//! `timeout` (each request; `op_timeout` is still read as its older
//! spelling), durations such as `6s` or `500ms` (a unit is required),
//! `root` (lock root inside the chroot, default `/distlock`), `containers`
//! (`true`/`false`), `layout` (`escaped`, the default, or `path`: see
//! [kazoo and Curator on their own paths](#kazoo-and-curator-on-their-own-paths)),
//! `nodes` (`curator`, the default, or `kazoo`: the names of our mutex
//! nodes, see [kazoo-named nodes](#kazoo-named-nodes-nodeskazoo)).
//! A user and password turn on `digest` authentication. See [`ZkConfig`].
//!
//! ```no_run
//! # #[tokio::main]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let client = lock_core::LockClient::new(
//!     lock_zk::connect("zk://10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181/myapp?session_timeout=10s").await?,
//! );
//! let guard = client.lock("nightly-report").acquire().await?;
//! println!("fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//!
//! - **One session per backend** (clones share it), kept by the
//!   `zookeeper-client` crate; its state is drained continuously into the
//!   [`SessionState`](lock_core::SessionState) signal every lease carries.
//! - **Acquire** creates an `EPHEMERAL_SEQUENTIAL` node
//!   `<root>/<escaped key>/_c_<attempt id>-lock-<sequence>` (with
//!   `nodes=kazoo`: `<attempt id hex>__lock__<sequence>`), lists the
//!   directory, and holds the lock when its node has the lowest sequence.
//!   Otherwise it watches only its immediate predecessor (no herd), and
//!   looks again when that node goes. A predecessor that vanished between
//!   the list and the watch is simply a new look. The attempt id (also the
//!   lease's [`OwnerId`](lock_core::OwnerId)) is in the node name, so a
//!   create whose reply was lost is found again instead of leaking a node
//!   that would block everyone until the session ends.
//!   A waiter also watches its own node, so a node deleted behind its back
//!   (an administrator, `deleteall` of the directory) ends the wait at once
//!   with [`ErrorKind::LeaseLost`](lock_core::ErrorKind::LeaseLost) and a
//!   message naming the node, instead of a wait that never ends.
//! - **Withdrawal**: a wait that times out, a contended `try_acquire`, or a
//!   dropped acquire future deletes its node (the last in the background,
//!   retried through disconnections; a dropped future whose create was still
//!   in flight has its node found by the attempt id).
//! - **Failures while waiting**: an `acquire` rides out disconnections and
//!   session expiry until its deadline (each failed attempt's node is
//!   deleted in the background and a new attempt joins the queue); every
//!   request has the operation timeout, and an `acquire` returns at most
//!   500 ms past its deadline even when no server answers.
//! - **Fencing token = the lock node's `czxid`**: grants of a key follow node
//!   creation order, and zxids only grow, across leader elections too. The
//!   sequence number is never used: it restarts when the directory is
//!   removed and wraps.
//! - **Keys** become one percent-encoded path component (`[A-Za-z0-9_-]`
//!   kept, everything else `%XX`): `/`, `.`, `..`, `%` cannot leave the
//!   directory or collide, and the lock root is never `/`, so `zookeeper`
//!   is harmless.
//! - **Release** deletes only the node named in the lease, and only if that
//!   name carries the lease's owner id; anything else is `Ok(false)`.
//! - **Empty key directories** are container nodes (ZooKeeper ≥ 3.5), which
//!   the server removes once empty; a waiter that finds its directory gone
//!   re-creates it. With `containers=false` or an older server, the client
//!   deletes the directory after a release, which the server refuses while
//!   waiters remain.
//!
//! # Capabilities and caveats
//!
//! - [x] Fencing tokens, per key, surviving leader failover (`czxid`).
//! - [x] Waiting by notification (predecessor watch), FIFO.
//! - [x] Linearizable store: writes go through the leader's quorum, and
//!   the two reads that decide something are read from the **leader's**
//!   view. Without that a follower answers from its own copy, and a
//!   follower cut off from the leader keeps doing so for up to `syncLimit`
//!   ticks: its clients could renew (or be granted on a stale list) while
//!   the leader had already expired their session and given the key to
//!   someone else (`tests/partition.rs` shows it on a 3-member ensemble).
//!   The list right after our own create needs nothing more: the create is
//!   a write the leader committed (a cut-off follower cannot complete it),
//!   a server answers a session's read only after applying that session's
//!   earlier writes, and the grant is dated from the create's sending. A
//!   list after a wait (a watch event) and the node check that confirms a
//!   renewal are preceded by a `sync` of the key directory, written
//!   back-to-back with the read (the server holds the read until the `sync`
//!   is done), and on a follower one follower-to-leader hop (no disk
//!   write) before the read is answered. **Cost**: an acquire on a free key
//!   is create + list, the list written right behind the create before its
//!   reply is awaited, so one round trip; with the release's delete 2 round
//!   trips per cycle, the floor's (`tests/round_trips.rs` counts them
//!   through a proxy); a renewal is one (`sync`, check) exchange. The
//!   client crate leaves Nagle's algorithm on, which held a request made
//!   right behind another until the first one's reply (3 round trips a
//!   cycle); the driver sets `TCP_NODELAY` on the crate's connections to
//!   the ensemble (on Linux: see `nodelay.rs`). A follower that cannot reach its leader now fails
//!   the renewal (operation timeout, or the client dropping the connection
//!   that stopped answering) instead of confirming it. `sync` + read is
//!   not strictly linearizable (ZOOKEEPER-1675: a deposed leader that has
//!   not noticed yet may answer a `sync`); such a leader steps down within
//!   `syncLimit` ticks, and a new leader restarts every session's timeout,
//!   so it cannot confirm a node that a newer leader already deleted.
//!   `inspect` reads without `sync` (it decides nothing).
//! - [x] Session signal: `Disconnected` → the guard is `Suspect` (the server
//!   may already have expired the session: the client learns of the expiry
//!   only on reconnecting, after the server deleted our nodes); `Expired` →
//!   `Lost` at once, and the next call opens a new session. A grant is never
//!   made on an old session's node. A connection is declared dead after 3/5
//!   of the session timeout without a byte from the server (the client
//!   crate's default of 2/5, 800 ms of a 2 s session, broke connections on
//!   a loaded host), and a release whose connection broke in flight is sent
//!   again on the reconnected session within the operation timeout.
//! - [x] Ensembles, chroot (created when missing), digest authentication
//!   (every node this driver creates, chroot and lock root included, then
//!   gets the `CREATOR_ALL` ACL: only sessions of the same user can list or
//!   delete them).
//! - **TTL model: per session.** The node lives as long as the session. The
//!   lease's TTL is capped at the negotiated session timeout (the server
//!   cannot expire the session before `last contact + timeout`, so the local
//!   validity deadline is safe), paces the guard's renewals, and is
//!   enforced by this client: a lease not renewed within its TTL has its
//!   node deleted by the backend that granted it (one expiry task per
//!   backend, sleeping until the earliest deadline, at most 20 ms plus a
//!   microsecond per held lock late; a grant spawns and wakes nothing
//!   unless its deadline is the earliest). If the process dies, the
//!   node goes when the session expires (after the session timeout), not
//!   after the TTL.
//! - Renewal checks, after a `sync`, that the node still exists with the
//!   grant's `czxid` and belongs to this backend's session, and refuses
//!   ([`ErrorKind::NotHeld`](lock_core::ErrorKind::NotHeld)) a lease whose
//!   local TTL already ran out (its node is being deleted), also when it ran
//!   out while the check was in flight. A lease handle moved to another
//!   process can be released there but not renewed. Guards are renewed in
//!   batches of up to 1,000 with one `multi` of existence checks each (a
//!   node deleted by an administrator makes its guard `Lost` at the next
//!   renewal, the others of the batch stay held).
//! - **Held locks at scale** (`tests/held_at_scale.rs`, one client, one
//!   session): a lease keeps its node's sequence number (the path follows
//!   from the key and the owner id), the backend one 32-byte map slot and
//!   the key's text per granted node. Client heap per held lock, everything
//!   included: 333 B at 1,000 locks, 420 B at 10,000, 394 B at 100,000
//!   (a 1 GB server heap); lock-core's own guard and scheduler state is about 310-350 B
//!   of that (the memory backend's measure). A renewal period costs about
//!   one round trip per 1,000 locks plus the session's pings. Each renewal
//!   `multi` is a transaction: the ensemble writes one log entry of about
//!   100 kB per 1,000 locks every renewal period (TTL / 3), so size the
//!   transaction-log disk and purge it (`autopurge.*`) accordingly.
//!   **Server heap:** a held lock costs the server about 2 kB (its
//!   ephemeral node, its container directory, the session's ephemeral set):
//!   100,000 held locks need about 210 MB of live heap, so run ZooKeeper
//!   with `-Xmx1g` or more (`zkServer.sh`'s default, `ZK_SERVER_HEAP`, is
//!   1000 MB). With 256 MB its collector thrashes (back-to-back full
//!   collections), it stops answering, and sessions expire: every lock of
//!   the session is lost.
//! - Curator compatibility (the default `nodes=curator`; not with
//!   `nodes=kazoo`, see below): nodes use Curator's protected names and sort on
//!   the digits after `lock-`, so an `InterProcessMutex` on
//!   `<root>/<escaped key>` (e.g. `/distlock/jobs%2Fnightly` for key
//!   `jobs/nightly`) excludes with this driver. Curator's lease renewal and
//!   reentrancy are not modelled. kazoo's `Lock` nodes in the same
//!   directory are contenders too (below).
//! - [x] Read-write locks and semaphores in Curator's layouts (below).
//! - [x] Leader election in Curator's `LeaderLatch` layout, terms =
//!   `czxid`, observers on a watch (below).
//!
//! # Read-write locks and semaphores
//!
//! Each shape has its own directory, so the mutex, the read-write lock and
//! the semaphore of one key are three different locks. The shapes' parent
//! directories start with `.`, which an escaped key never does.
//!
//! - **Read-write lock** of key K: `<root>/.rwlock/<escaped K>`
//!   ([`ZkBackend::rwlock_path`]), the layout of Curator's
//!   `InterProcessReadWriteLock`: `EPHEMERAL_SEQUENTIAL` nodes
//!   `_c_<owner id as a UUID>-__READ__<seq>` and `_c_<…>-__WRIT__<seq>`,
//!   sorted on the digits after `__READ__`/`__WRIT__`. A writer holds when
//!   its node is the first of all (it watches the node just before it); a
//!   reader holds when no write node comes before it (it watches the first
//!   write node), which is Curator's read predicate. So once a writer
//!   waits, new readers queue behind it (writer preference); a waiting
//!   writer that is dropped has its node deleted at once in the background
//!   (or it goes with the session). **Curator's `InterProcessReadWriteLock`
//!   on path X excludes ours on key K when X = `<chroot><root>/.rwlock/<escaped K>`**,
//!   e.g. `/distlock/.rwlock/jobs%2Fnightly` for key `jobs/nightly` with
//!   the default root (`tests/curator.rs` checks both directions with
//!   Curator 5.4: write/write, write/read, shared reads, writer
//!   preference, downgrade).
//! - **Downgrade**: one `multi` creates an `EPHEMERAL` read node named
//!   with the write node's own sequence digits (so it sorts exactly where
//!   the write node was, ahead of every waiter) and deletes the write node.
//!   No writer can come between, and readers queued behind a waiting writer
//!   stay behind it. This is how Curator 5.5+ names a read lock taken by the
//!   write lock's owner; Curator 5.4's own downgrade (read lock taken while
//!   holding the write lock, then the write lock released) creates a
//!   *sequential* read node behind any waiting writer, which that writer
//!   then overtakes: only our downgrade is gap-free. The read lease has a
//!   new owner id; the write lease is invalid afterwards.
//! - **Semaphore** of key K: `<root>/.semaphore/<escaped K>`
//!   ([`ZkBackend::semaphore_path`]), the layout of Curator's
//!   `InterProcessSemaphoreV2`: `<path>/locks` is a mutex (this crate's
//!   mutex recipe, Curator's `lock-` nodes), `<path>/leases` holds
//!   `EPHEMERAL_SEQUENTIAL` nodes `_c_<…>-lease-<seq>`. An acquirer takes
//!   the mutex, creates its lease nodes, and while **still holding the
//!   mutex** waits (watching `leases`) until the directory has at most
//!   `limit` children, then releases the mutex; the permits are held as
//!   long as the lease nodes exist. As every client (ours and Curator's)
//!   creates lease nodes only under the mutex, one waiter at most has
//!   nodes in `leases`, and granted nodes never exceed the limit.
//!   `Permits { count, .. }` creates `count` nodes in one transaction under
//!   the mutex (atomic: never a part of them; Curator takes `acquire(n)`
//!   one lease at a time). Waiters are FIFO (the mutex), so a large request
//!   at the head is not starved by small later ones. **Curator's
//!   `InterProcessSemaphoreV2` on path X with the same `maxLeases` shares
//!   ours on key K when X = `<chroot><root>/.semaphore/<escaped K>`.**
//!   A `try_acquire_kind` gives up (`Ok(None)`) at once when the leases
//!   already counted plus its own would pass the limit (which includes a
//!   waiter's nodes), and after at most 1 s waiting for the mutex.
//!   The internal mutex is not a lease: it is held only while an acquire
//!   runs (a dropped acquire deletes it in the background), and a process
//!   that dies while waiting for permits keeps every other acquirer of
//!   that semaphore (ours and Curator's) waiting until its session expires,
//!   as with Curator.
//! - **Limits**: our clients store the limit in the `leases` directory's
//!   data; a request with another limit while that directory has children
//!   (holders or the waiter) is
//!   [`ErrorKind::InvalidArgument`](lock_core::ErrorKind::InvalidArgument);
//!   when it is empty the new limit takes effect. Curator clients neither
//!   write nor read it: a Curator client configured with another limit is
//!   **not detected** and the two enforce their own limits on the same
//!   nodes (`tests/curator.rs` shows the overrun this allows).
//! - **Tokens**: a write grant's token is its node's `czxid`; grants of a
//!   key follow node creation order, so it is greater than every earlier
//!   grant's (reads included). The writer then stores it as the key's
//!   epoch before the lease is handed out, in a persistent node of its own,
//!   `<root>/.rwepoch/<escaped key>` (created at the key's first write; one
//!   small node per key ever write-locked, never deleted), and in the
//!   read-write directory's data (where earlier versions kept it; both
//!   writes sent at once). A read grant carries the greater of the two
//!   values, read right after its grant decision in the same pipelined
//!   exchange as the list: the token of the last write grant, 0 before
//!   any. The directory itself is a container node (as Curator makes it):
//!   the server deletes it once empty, which is why the epoch does not
//!   live only in its data (readers would carry 0 after a deletion;
//!   `tests/epoch.rs` shows it on a server that checks its containers
//!   every 100 ms). Readers of one epoch carry equal tokens; a downgraded
//!   writer keeps its token. Caveat: Curator's writers do not store an
//!   epoch (a read after a Curator write carries the last epoch one of
//!   *ours* wrote). A permit grant's token is
//!   the `czxid` of its first lease node: lease nodes are created under the
//!   mutex, in grant order, so permit tokens strictly increase.
//! - **Leases, renewal, expiry** as for the mutex: every read, write or
//!   permit lease is its own node(s) on the backend's session, renewed
//!   (`sync`, then existence and `czxid` of its nodes; `renew_many` renews
//!   these one by one) and released through `renew`/`release`, deleted by
//!   the local expiry task when not renewed within its TTL, and by the
//!   server when the session ends (a crashed holder's share comes back
//!   after the session timeout). The lease's data is
//!   `<seq>[,<seq>…];<czxid of the first node>`.
//! - **Cost**: a read grant on a free lock is one round trip (the create,
//!   with the directory's list and both epoch reads written behind it), a
//!   write grant two (the same, then storing its epoch); with the release's
//!   delete a cycle is 2 and 3 (`tests/round_trips.rs` counts them); a
//!   grant of one permit 5 (a look at the
//!   limit, the mutex's create + list in one exchange, the limit under the
//!   mutex, the lease's create + list in one exchange, mutex delete;
//!   several permits take their lease nodes in one transaction, listed
//!   after it, and add one `czxid` read); a release is one delete. The hand-written permit floor
//!   ([`floor::ZkPermitFloor`], the descriptor's `permit_floor`: one permit
//!   of a semaphore of 4) costs 5 per cycle, the driver 6: its early look
//!   (`tests/permit_floor.rs` counts both through a proxy).
//!
//! # kazoo and Curator on their own paths
//!
//! A fleet that locks with kazoo's `Lock(client, path)` or Curator's
//! `InterProcessMutex(client, path)` can move process by process: our mutex
//! on the same directory excludes theirs in both directions
//! (`tests/kazoo.rs` and `tests/curator.rs` run the real clients, kazoo
//! 2.11.0 and Debian's Curator).
//!
//! - **Where**: with `layout=path` ([`ZkLayout::Path`]) a mutex key *is*
//!   the lock directory's absolute path inside the chroot, verbatim: key
//!   `/app/locks/orders` locks the directory kazoo's
//!   `zk.Lock("/app/locks/orders")` and Curator's
//!   `new InterProcessMutex(client, "/app/locks/orders")` use. A kazoo or
//!   Curator chroot (`host:2181/myapp`, Curator's `namespace("myapp")`) is
//!   this URL's chroot (`zk://host:2181/myapp?layout=path`). A key that is
//!   not such a path, or is under `/zookeeper`, is refused with
//!   `InvalidArgument`, except the library's own keys (under
//!   `__distlock/`: a migration's cutover marker), which stay in the
//!   default layout under the root, so a migration from a kazoo or Curator
//!   fleet can announce its cutover here. These directories are created persistent (as kazoo
//!   and Curator create them) and never removed by this driver. The default
//!   layout is unchanged (`<root>/<escaped key>`); read-write locks,
//!   semaphores and elections stay under the root in both layouts.
//! - **Ours waits for theirs**: the contenders in the directory are our and
//!   Curator's `_c_<uuid>-lock-<seq>` nodes and kazoo's
//!   `<uuid hex>__lock__<seq>` (`Lock`, `WriteLock`) and
//!   `<uuid hex>__rlock__<seq>` (`ReadLock`: a mutex shares with no
//!   reader) nodes, ordered by sequence number (one parent, one counter);
//!   the lowest holds and a waiter watches its predecessor whatever its
//!   kind. kazoo's nodes are ephemeral: a dead kazoo holder frees the lock
//!   at its session's expiry.
//! - **Theirs waits for ours**: Curator's mutex already sorts our nodes with
//!   its own. **kazoo needs `extra_lock_patterns=["-lock-"]`** (kazoo
//!   2.7.1+): `zk.Lock(path, identifier, extra_lock_patterns=["-lock-"])`.
//!   Without it kazoo counts only `__lock__` nodes and takes the lock beside
//!   ours (`tests/kazoo.rs` keeps this as a negative control), unless our
//!   nodes carry kazoo's name (`nodes=kazoo`, next section).
//! - **kazoo and Curator between themselves** are not tested here, and
//!   Curator sorts on the text after `lock-`, which kazoo's names lack:
//!   check that pair before mixing it; ours in between does not fix it.
//! - A kazoo node whose sequence is negative (kazoo reads `-?\d{10}`: the
//!   server's counter past `i32::MAX`, after 2^31 creates in one directory)
//!   is not recognised as a contender.
//!
//! # kazoo-named nodes (`nodes=kazoo`)
//!
//! A kazoo fleet that cannot be redeployed with `extra_lock_patterns`
//! is excluded by giving our mutex nodes kazoo's own name:
//! `zk://host:2181/myapp?layout=path&nodes=kazoo`
//! ([`ZkConfig::with_node_names`]`(`[`ZkNodeNames::Kazoo`]`)`).
//!
//! - **Node names**: our mutex node is
//!   `<attempt id, 32 lowercase hex>__lock__<sequence>` (sequence as the
//!   server writes it, `%010d`), exactly what kazoo 2.11.0's `Lock` creates
//!   (`uuid4().hex + "__lock__"`); its data is the owner id in hex, a
//!   newline and the holder details (kazoo's `contenders()` lists the
//!   whole data: see [Operating locks](#operating-locks)). The default, `nodes=curator`
//!   ([`ZkNodeNames::Curator`]), keeps `_c_<uuid>-lock-<sequence>`.
//!   Read-write locks, semaphores (and a semaphore's internal mutex) and
//!   elections keep Curator's names either way.
//! - **Theirs waits for ours**: an unmodified kazoo `Lock` matches
//!   `__lock__(-?\d{10})$` against every child, so our node is one of its
//!   contenders; it orders contenders by those 10 digits (compared as
//!   text: numeric order while the counter is below `i32::MAX`), and a
//!   kazoo waiter watches our node and wakes when we delete it.
//! - **Ours waits for theirs**, and for Curator's: in both modes our mutex
//!   counts `lock-`, `__lock__` and `__rlock__` nodes as contenders by
//!   sequence number, so our processes with either setting exclude each
//!   other on one directory.
//! - **Owner parsing**: our code finds its own node (a create whose reply
//!   was lost, extra nodes of one attempt, the cleanup of an abandoned
//!   attempt) by the owner id in either naming. A mutex lease on a
//!   kazoo-named node has `backend_data` `kazoo:<sequence>`, so release
//!   and renew rebuild the right path on any backend of ours whatever its
//!   own setting. `inspect` reports the holder's owner id: with
//!   `nodes=kazoo` that is the 32-hex id in any `<hex>__lock__<seq>` node
//!   (ours, or a kazoo client's `uuid4().hex`); with the default, a kazoo
//!   node's holder is its whole name (ours cannot be told apart from
//!   kazoo's there).
//! - **Curator**: Curator's `InterProcessMutex` sorts on the text after
//!   `lock-`, which a kazoo-named node lacks, so it sorts our *whole name*
//!   against its own 10 digits: ours comes after Curator's (unless the owner
//!   id starts with about nine zero hex digits) and **Curator takes the
//!   lock beside ours** (ours still waits for Curator). `nodes=kazoo` is
//!   for kazoo fleets; keep the default names where Curator runs (a
//!   directory shared by kazoo *and* Curator fleets is not covered:
//!   kazoo without `extra_lock_patterns` cannot see Curator either).
//! - **Tested** (real kazoo 2.11.0, Debian's Curator 5.4, a real server):
//!   `tests/kazoo.rs` `kazoo_named_nodes_exclude_an_unmodified_kazoo_lock`:
//!   with `layout=path&nodes=kazoo`, an unmodified kazoo `Lock` and ours
//!   exclude each other both ways (single try and 300 ms wait refused,
//!   the waiter granted after the release, kazoo's within 5 s of its 10 s
//!   wait), our node's name, `node_path`, `inspect` (our owner, kazoo's
//!   id), renew, kazoo-named and Curator-named backends of ours excluding
//!   each other; control: the same kazoo gets in beside a Curator-named
//!   backend and the check reports it (and, in
//!   `kazoo_lock_and_ours_exclude_each_other`, beside the default layout).
//!   `tests/curator.rs` `curator_mutex_misorders_kazoo_named_nodes`:
//!   Curator holds, ours waits; ours holds, Curator's answer is the one
//!   its sort predicts (it got in beside ours in all 6 runs made when
//!   this was written).
//!   `tests/conformance.rs` `suite_with_kazoo_node_names` runs the shared
//!   suite with `nodes=kazoo`.
//!
//! # Operating locks
//!
//! - **Holder details** ([`HolderDetails`](lock_core::HolderDetails): host,
//!   pid, program, label, grant time) are the **data of our mutex node**,
//!   written by the grant's own create (no extra request:
//!   `tests/round_trips.rs` still counts 2 round trips per cycle), in both
//!   namings and both layouts: `<owner id, 32 hex>\n<details>`, the
//!   details in [`HolderDetails::encode_current`](lock_core::HolderDetails::encode_current)'s
//!   form (`h=<host>;p=<pid>;n=<program>[;l=<label>];t=<ms>`, at most
//!   about 700 bytes). They live and die with the node (release, TTL
//!   expiry, session expiry, `force_release`), and renewal does not touch
//!   them. Nothing other clients compare changes: Curator writes its
//!   client's IP address as data and never reads it, and kazoo's `Lock`
//!   never compares node data; kazoo's `contenders()` only *displays* it,
//!   and for our node now returns `"<owner hex>\n<details>"` (the owner
//!   on the first line, as before; `tests/kazoo.rs`
//!   `holder_details_beside_kazoos_identifier` checks it with an unmodified
//!   kazoo still refused beside our node). `inspect` reads the holder node
//!   with one `getData` instead of an `exists` (same request count: list +
//!   read) and reports the details when the data has that form: a kazoo
//!   or Curator holder (identifier, IP address) or a node of an earlier
//!   version of ours (no data) reports `details: None`. Capabilities:
//!   `holder_details` is `true`.
//! - **Details of the other shapes**: a read node, a write node (and the
//!   read node a downgrade creates) and every lease node of a permit grant
//!   carry the same `<owner hex>\n<details>` data, written by the create
//!   (or the downgrade's `multi`) that makes them, so a grant costs what it
//!   did. Curator's `InterProcessReadWriteLock` and
//!   `InterProcessSemaphoreV2` write their client's IP address there and
//!   never read it (a semaphore `Lease.getData()` hands it to the user
//!   only); our lease nodes used to hold the limit, which nothing read (the
//!   limit is the `leases` directory's data). `holders` of a read-write
//!   lock or semaphore reads the directory's children and data together,
//!   then one pipelined `getData` of each holder's (first) node, whose
//!   `czxid` is the token where the epoch does not give it (2 round
//!   trips); Curator's holders report `details: None`.
//! - **Leaders' details** are in the latch node's **name**, not its data:
//!   Curator's `LeaderLatch` reports a node's whole data as the
//!   participant id (`getLeader().getId()`), so details after the owner
//!   hex would change the id Curator shows for our leaders. Our candidate
//!   is `_c_<owner id as a UUID>-<escaped details>-latch-<sequence>`
//!   (details percent-encoded to `[A-Za-z0-9_%-]`), which Curator ranks by
//!   the text after the last `latch-`, as its own nodes; its data stays the
//!   owner hex. `leader` reads them with no extra request; a Curator
//!   leader (or an earlier version of ours, `_c_<uuid>-latch-<seq>`)
//!   reports `details: None`. `tests/curator.rs` checks that Curator's
//!   `getLeader().getId()` is still our owner hex alone (the peer escapes
//!   line breaks, so details after a newline in the data are caught: the
//!   check fails that way).
//! - **`list(prefix, cursor, limit)`**: one `getChildren` of the lock root
//!   per page (the whole child list of the root comes back in that one
//!   reply), then of the key directories after the cursor whose
//!   (unescaped) key starts with `prefix`, at most `limit`: one pipelined
//!   `getChildren` each, then one pipelined `getData` of each directory's
//!   lowest contender (ours, Curator's or kazoo's nodes, as `inspect`
//!   sees them), so a page costs at most `2 × limit + 1` requests in 3
//!   round trips (plus a look again at a key whose holder left between
//!   the two reads). Keys are in escaped-name order; the cursor is
//!   `zk1:<escaped name of the last directory examined>` and is handed
//!   out only while more matching directories remain; any other text (or
//!   a name not in the canonical escaped form) is `InvalidArgument`. Only
//!   mutexes: the `.rwlock`, `.semaphore` and `.election` directories
//!   (and any root child that is not an escaped key) are skipped.
//!   **Path layout**: only keys under the root are listed, which there are
//!   the library's own keys (`__distlock/…`); a path key lives at its own
//!   path outside the root and is not listed (`inspect` it by name).
//! - **`list_shared(shape, prefix, cursor, limit)`**: a mutex is `list`.
//!   Read-write locks: one `getChildren` of `<root>/.rwlock`, then the key
//!   directories of the page, chosen and paged exactly as `list` (escaped
//!   names after the cursor whose key starts with `prefix`, at most
//!   `limit`, the same `zk1:` cursor): each's children and data in one
//!   pipelined burst, then one pipelined `getData` per holder (every
//!   reader, or the writer), so a page is 3 round trips. Semaphores the
//!   same over `<root>/.semaphore/<K>/leases` (the permit holders within
//!   the limit, a grant of several permits as one holder). A key whose
//!   holders all left is skipped; each key comes with every live holder
//!   as `holders` reports it (kind, owner, token, details).
//! - **`list_elections(prefix, cursor, limit)`**: the latch directories
//!   (`<root>/.election`, see [Leader election](#leader-election)), not
//!   the generic election's mutexes: one `getChildren` of `.election`, the
//!   page's directories' children pipelined, then the first candidate's
//!   data pipelined (term = its `czxid`, holder, details from its name):
//!   3 round trips, paged and bounded as `list`. An election with no
//!   candidate is skipped.
//! - **`force_release(key)`**: finds the holder as `inspect` does and
//!   deletes its node (any version: it is the operator's to break), one
//!   atomic request; a holder that left before the delete is looked up
//!   again, so whoever holds at the delete is broken. Returns the broken
//!   holder (owner, `czxid` token, details). The token is the node's
//!   `czxid`: the next grant's node is created later and has a greater
//!   one, so a resource checking tokens rejects the broken holder's late
//!   writes; its renewal finds the node gone (`NotHeld`) and its release
//!   returns `false`. The next waiter watches the deleted node and is
//!   woken as by a release. A kazoo or Curator holder in a shared
//!   directory is broken the same way (`tests/kazoo.rs`), but **is not
//!   told**: kazoo's and Curator's locks do not watch their own node, so
//!   that process goes on as if it held, unfenced unless its resource
//!   checks our tokens. The break is logged (`tracing` warn with key,
//!   node, holder and token). Without containers the empty directory is
//!   removed after the break, as after a release.
//! - **`gc(older_than)`**: tokens are `czxid`s (global, never reset), so
//!   there is no token floor (`token_floor: None`) and removing a key
//!   directory never lets a token go backwards. What is left to collect
//!   is empty key directories under the root: one `getChildren` of the
//!   root, then up to 1,000 key directories from where this backend's
//!   previous `gc` call stopped (wrapping around, so repeated calls cover
//!   a larger root): one pipelined `exists` each, and a delete of each
//!   with no child whose `ctime` and `mtime` are at least `older_than` old
//!   (server clock against ours; ZooKeeper records no time of the last
//!   child change, so a directory's age is its creation time). The
//!   server refuses the delete of a directory that gained a node in
//!   between (a held or waited-on key is never collected), and a waiter
//!   that finds its directory gone re-creates it. With container
//!   directories (the default) the server already removes an empty
//!   directory that once had a child (its container check, every 60 s by
//!   default); `gc` removes the rest: containers that never had a child
//!   (a create that failed after its `mkdir`) and persistent directories
//!   (`containers=false`, older servers, a crash between a release and
//!   its directory delete). Path-layout directories (outside the root,
//!   kazoo's and Curator's) and the shapes' `.` directories are never
//!   touched. `scanned` counts the directories examined.
//! - **Tested**: the shared suite's `holder_details_are_reported`,
//!   `shared_holder_details_are_reported` (2 readers, a writer, 2 permit
//!   holders, a leader), `list_finds_held_locks`, `list_finds_shared_locks`
//!   (read-write and semaphore pages of 2, elections pages of 1) and
//!   `force_release_fences_the_old_holder`
//!   (`tests/conformance.rs`, default names and `nodes=kazoo`, and the
//!   3-member ensemble in `tests/ensemble.rs`); `tests/admin.rs`: `gc`
//!   keeps young directories (1 h), removes old empty ones, never a held
//!   key's or a `.` directory, the holder renews after it, a re-grant's
//!   token is above the earlier grant; `list` cursors, bad cursors and
//!   page sizes, details in pages, the path layout listing only the root;
//!   `tests/kazoo.rs` and `tests/curator.rs`: details beside kazoo's and
//!   Curator's holders (theirs report none), kazoo's holder broken;
//!   `tests/curator.rs` also lists a Curator writer (`holders` and
//!   `list_shared` agree, no details) and a Curator leader
//!   (`list_elections`), and `tests/shared.rs` checks the details of a
//!   downgraded reader and of a 2-permit grant (one `multi`).
//!
//! # Leader election
//!
//! [`LockClient::elect`](lock_core::LockClient::elect) on this backend uses
//! the layout of **Curator's `LeaderLatch`** (not the generic election on
//! the mutex `election/<name>`):
//!
//! - The election named N lives in `<root>/.election/<escaped N>`
//!   ([`ZkBackend::latch_path`]; a `.` directory like `.rwlock` and
//!   `.semaphore`, so it never meets a mutex's, a read-write lock's or a
//!   semaphore's nodes). **A Curator `LeaderLatch` on path
//!   `<chroot><root>/.election/<escaped N>` (e.g. `/distlock/.election/jobs%2Fnightly`
//!   for election `jobs/nightly`) is a candidate of the same election**:
//!   both see the same leader (`tests/curator.rs` checks both directions
//!   with Curator 5.4).
//! - A candidate creates an `EPHEMERAL_SEQUENTIAL` node
//!   `_c_<owner id as a UUID>-<escaped holder details>-latch-<sequence>`
//!   (Curator's protected name with the details before the latch name: a
//!   create whose reply was lost is found again by the id) whose data is
//!   its owner value in hex, which Curator reports as the participant id
//!   (`getLeader().getId()`). The node with the lowest sequence (the digits
//!   after the last `latch-`, Curator's sort) leads; every other candidate watches
//!   the node just before its own. Children that are not `latch-` nodes are
//!   ignored (Curator would rank them: keep the directory to the recipe).
//!   The campaign is the mutex's queue with another node name: the same
//!   withdrawal on a deadline or a dropped future, the same session
//!   handling, the same local TTL enforcement and renewal (`sync` + check,
//!   or the batched `multi`). Resigning deletes the node.
//! - **Term** = the leader node's `czxid` (as the mutex's token): a node
//!   leads only after every node created before it in the directory is
//!   gone, and zxids only grow, so each term is greater than every earlier
//!   term, Curator's leaders included. The sequence number is not used: it
//!   restarts when the empty container directory is deleted and created
//!   again.
//! - [`leader`](lock_core::LockBackend::leader) reads the first node's data
//!   and `czxid` (list + read, no `sync`: it decides nothing);
//!   `remaining_ttl` is known only for a leader of this backend.
//!   [`watch_leader`](lock_core::LockBackend::watch_leader) (what
//!   `observe_leader` calls) waits on a **ZooKeeper watch**, never polling:
//!   on the leader's node while there is one (no other candidate can lead
//!   before it goes), on the directory's children when nobody leads, on the
//!   directory's creation when it is missing.
//! - **Cost**: a campaign on a free election is create + list, with the
//!   resignation's delete 3 round trips (`tests/round_trips.rs`); reading
//!   the leader is 2 requests.
//! - Caveats: a plain lock of the key `election/<name>` is *not* excluded
//!   by a campaign here (it is the generic election's key on other
//!   backends). The lease's `backend_data` is
//!   `latch:<sequence>;<escaped details>` (`latch:<sequence>`, an earlier
//!   version's lease, names a node without details). Curator's
//!   latch re-creates its node after a session loss; ours ends the
//!   leadership (`Lost`) and a new campaign is the caller's.
//! - **Multi-locks** ([`LockBackend::try_acquire_all`](lock_core::LockBackend::try_acquire_all))
//!   keep the trait's default (`Unsupported`, so `lock_all` takes the keys
//!   one at a time in global order): a ZooKeeper `multi` can create every
//!   key's node in one transaction but cannot make that conditional on the
//!   directories holding no other node (its checks compare a node's data
//!   version, and reads and writes cannot share one `multi`), so deciding
//!   needs the lists after it, and a set that is not free would leave our
//!   nodes queued in front of other waiters until a second `multi` deletes
//!   them: not one atomic exchange.
//!
//! # Tests and benchmark
//!
//! `cargo test -p lock-zk` starts ZooKeeper itself (Debian package
//! `zookeeper`, Java 17; a missing server is a printed skip locally and a
//! failure under CI): the shared conformance suite on a standalone server
//! and on a 3-member ensemble, the leader killed during a contention run,
//! a follower cut off from the rest of the ensemble (peer links through
//! fault proxies) while its clients stay connected,
//! session expiry, nodes and directories deleted behind the driver's back,
//! vanishing predecessors, a paused server. `cargo run --release -p lock-zk
//! --example zk_bench` measures the acquire+release cycle (1 client and 8
//! independent clients) and the handoff against the same requests issued
//! by hand on one bare connection ([`floor::ZkFloor`], ZooKeeper's wire
//! protocol written out, also used by `distlock compare`);
//! `tests/round_trips.rs` checks that a cycle on a free key costs the
//! floor's 2 round trips, including what it defers to the lease's TTL.
//! `--example bench_parts` splits one client's cycle: the floor (create
//! and list in one write, then delete), the three requests one after the
//! other through the `zookeeper-client` crate alone, the backend, and the
//! user API. Most of the distance to the floor is the crate's:
//! its socket is an `async-net` stream served by `async-io`'s reactor
//! thread, and every request and reply passes through its session task,
//! so each reply crosses two threads before the caller runs.

#![deny(missing_docs)]

mod config;
mod descriptor;
mod driver;
mod error;
pub mod floor;
mod latch_names;
mod nodelay;
mod paths;
mod wire;

pub use config::{DEFAULT_ROOT, ZkConfig, ZkLayout, ZkNodeNames};
pub use descriptor::DRIVER;
pub use driver::{MIN_TTL, ZkBackend, capabilities};

use lock_core::LockError;

/// The URL schemes this driver accepts.
pub const URL_SCHEMES: &[&str] = &["zk", "zookeeper"];

/// Parses `url` (see [`ZkConfig::from_url`]) and connects.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad URL;
/// [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable) or
/// [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when no session can
/// be opened within the connect timeout.
///
/// # Cancel safety
///
/// Safe: a dropped connect leaves nothing behind.
pub async fn connect(url: &str) -> Result<ZkBackend, LockError> {
    ZkBackend::connect(ZkConfig::from_url(url)?).await
}
