//! The etcd driver of the distlock family: leases, revisions as fencing
//! tokens, FIFO waits, and the same layout as `etcdctl lock`.
//!
//! # URLs
//!
//! `etcd://[user[:password]@]host:port[,host:port...][/prefix][?options]`,
//! and `etcds://` for TLS. Options: `ttl` (default session TTL, e.g. `10s`),
//! `timeout` (per call), `connect_timeout`, `user`, `password`, and for TLS
//! `ca`, `cert`, `key` (PEM file paths) and `domain`. See
//! [`EtcdConfig::from_url`].
//!
//! ```no_run
//! # async fn example() -> Result<(), lock_core::LockError> {
//! use lock_core::LockClient;
//!
//! let backend = lock_etcd::connect("etcd://127.0.0.1:2379/locks?ttl=10s").await?;
//! let client = LockClient::new(backend);
//! let guard = client.lock("nightly-report").acquire().await?;
//! println!("fencing token {}", guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Layout (compatible with `etcdctl lock` and etcd's concurrency mutex)
//!
//! A lock named `k` lives under `<prefix>/k/` (`k/` without a prefix). To
//! take it, a client creates `<prefix>/k/<lease id in hex>` with its session
//! lease, in a transaction that only creates it if absent (create revision
//! 0) and reads the oldest entry under the prefix in the same revision. The
//! holder is the entry with the **lowest create revision**; a waiter watches
//! only the deletion of the entry just before its own (FIFO, no thundering
//! herd) and re-reads when the watch fires, is cancelled or compacted. This
//! is exactly what `etcdctl lock <prefix>/k` and Go's `concurrency.Mutex` do,
//! so they and this crate exclude each other on the same name.
//!
//! The prefix always ends with the separator, so `a` never matches `ab`. In
//! key names, `/` and `%` are percent-encoded (`a/b` becomes `a%2Fb`) so that
//! the locks `a` and `a/b` are disjoint; other keys appear unchanged (for
//! `etcdctl lock`, name the escaped form).
//!
//! **Two grants of one key from the same backend.** The entry name carries
//! the session's lease id, which two grants from one backend share. The
//! first entry of a session under a key uses the plain `<lease hex>` name;
//! while it exists, further grants (another task of the same process) get
//! `<lease hex>-<n>`. Both are ordinary entries under the key's prefix, so
//! they queue and exclude each other by create revision, and `etcdctl lock`
//! still sees them.
//!
//! # Read-write locks and semaphores
//!
//! Each shape has its own prefix, so a mutex, a read-write lock and a
//! semaphore named `k` are three different locks:
//!
//! - read-write lock: `<prefix>/k%rw/<lease hex>[-<n>]`, one entry per
//!   reader or writer, and the epoch key `<prefix>/k%rw-epoch`;
//! - semaphore: `<prefix>/k%sem/<lease hex>[-<n>]`, one entry per permit
//!   lease.
//!
//! (An escaped key never holds a `%` not followed by `25` or `2F`, so these
//! prefixes are disjoint from every mutex prefix `<prefix>/<key>/`, and
//! `etcdctl lock` never sees them.) Every entry is attached to the session
//! lease and has the per-grant TTL of the mutex's entries (same expiry
//! task, same renewal); its value is `<kind code> <owner hex> <holder
//! details>` (`r ..`, `w ..`, `p<count>-<limit> ..`; the details as in a
//! mutex entry, see *Operating* below). Entries are ordered by create
//! revision, as in etcd's own `recipes` read-write lock:
//!
//! - A **reader** is granted when no writer entry is older than its own; it
//!   waits on the newest older writer (its deletion, or its rewrite to a
//!   reader by a downgrade) and re-reads.
//! - A **writer** is granted when no entry at all is older than its own, so
//!   a waiting writer keeps every later reader out (writer preference). On
//!   a free key, one transaction creates the entry and puts the epoch key
//!   if the prefix is empty; otherwise the entry is created (a nested
//!   transaction, same round trip) and the writer waits on the entry just
//!   before its own. Its re-check is one transaction: if our entry exists
//!   and every entry under the prefix has a create revision >= ours, put
//!   the epoch key and our entry again.
//! - **Downgrade** rewrites the writer's own entry from `w <owner> ..` to
//!   `r <new owner> <details of now>` in one transaction guarded by its
//!   create revision and its kind and owner: same key, same create revision, so it keeps its place before
//!   every waiting writer and no writer can enter in between. The write
//!   lease is then no longer held (its owner is not the entry's). If the
//!   transaction's outcome is unknown (timeout), the entry is deleted in
//!   the background and both leases are dead.
//! - **Permits**: a request for `n` is granted when the counts of all older
//!   entries plus `n` fit in the limit (FIFO: a big request at the head is
//!   not overtaken by small later ones). The limit is in each entry's
//!   value; a request whose limit differs from an older entry's is removed
//!   at once and refused with `InvalidArgument`. Waiters watch the whole
//!   prefix for deletions. Caveat: a refused request's entry exists for one
//!   round trip, and a request racing with it may be refused too.
//!
//! **Tokens.** A writer's token is the revision of the transaction that
//! granted it (the one that put the epoch key): strictly above every grant
//! handed out before. A reader's token is the epoch key's mod revision read
//! in the same revision as its grant check, i.e. the token of the last
//! writer granted before it (0 if the key never had one): the writer put it
//! in its grant transaction, before it could be handed out, and a reader is
//! only granted once no writer is older than itself, so it cannot read an
//! epoch older than a write that was handed out before it, and no newer
//! write can be granted while it holds (readers of one epoch carry equal
//! tokens). A downgraded writer keeps its token. A permit's token is the
//! revision of the transaction that granted it (the create itself, or a
//! rewrite of its entry after waiting). The epoch key has no lease and
//! stays after the lock goes idle (one small key per read-write lock name).
//!
//! `holders(key, shape)` reads the prefix and the epoch key in one
//! revision and reports the entries whose turn has come with their kind,
//! owner, token, remaining TTL and holder details (as `inspect` does for
//! the mutex).
//!
//! # Elections (compatible with `etcdctl elect` and Go's `concurrency.Election`)
//!
//! [`LockBackend::campaign`](lock_core::LockBackend::campaign) on election
//! `name` uses the layout of etcd's `concurrency.Election` under the name
//! `<prefix>/<escaped name>%elect` (`<escaped name>%elect` without a
//! prefix; the name escaped as keys are, see above): a candidate creates
//! `<prefix>/<escaped name>%elect/<lease hex>` with its session lease, in a
//! transaction that only creates it if absent and reads the oldest
//! candidate in the same revision; the **leader is the candidate with the
//! lowest create revision**; a waiting candidate watches the deletion of
//! the candidate just older than its own (the mutex's queue, FIFO) and
//! re-reads. Resigning (releasing the leadership's lease) deletes the
//! entry, guarded by its create revision and value. So
//! `etcdctl elect <prefix>/<escaped name>%elect <proposal>` campaigns in
//! the same election as this crate, and `etcdctl elect -l` on that name
//! prints the same leader (tested both ways in `tests/compose.rs`).
//!
//! - The **term** (the leadership lease's token) is the leader entry's
//!   create revision: a later leader's entry was created after every
//!   earlier leader's, so terms strictly increase, across etcd leader
//!   changes and restarts.
//! - Our candidates' value (the "proposal") is the mutex entry's,
//!   `<owner hex> <holder details>`, written by the campaign's create
//!   transaction, so `etcdctl elect -l` and Go's `Election.Leader` /
//!   `Observe` print `<owner hex> h=<host>;p=<pid>;n=<program>[;l=<label>];t=<ms>`
//!   for our leader (earlier versions: the owner hex alone). This is a
//!   deliberate change of what `etcdctl` users see: our proposal was an
//!   opaque owner id that no `etcdctl` or Go user could act on, and it
//!   stays one token followed by readable details (who leads, since when),
//!   the same that `list` and `inspect` report for mutex holders; a Go
//!   program that needs its own proposal format campaigns with its own
//!   values, which we report untouched.
//!   [`leader`](lock_core::LockBackend::leader) reports, for a value whose
//!   part after the first space decodes as holder details, the owner part
//!   as `holder` and the details as `details`; for any other value (an
//!   `etcdctl elect` or Go leader's proposal, spaces included) the whole
//!   value as `holder` and no details; its create revision as `term`, and
//!   the remaining TTL as `inspect` does.
//! - The lease is keyed on `election/<name>`
//!   ([`election_lock_key`](lock_core::election::election_lock_key)) and
//!   its data says it is an election's (`elect:<leaf>`), so renew and
//!   release find the entry under the election's prefix. The `%elect` tag
//!   keeps the election disjoint from every mutex (also from the mutex of
//!   the key `election/<name>`, which other backends' generic election
//!   takes), read-write lock and semaphore.
//! - Two campaigns from one backend are two candidates: the second gets
//!   `<lease hex>-<n>`, as the mutex's second grant does (Go's
//!   `Campaign` on one session would re-use the first entry instead).
//! - Leadership expires as a mutex grant does: its own TTL without a
//!   renewal, or the session lease when this process is gone.
//! - [`watch_leader`](lock_core::LockBackend::watch_leader) wakes on an
//!   etcd watch (its `poll` is not used): on the leader's entry (deleted,
//!   or rewritten by a Go leader's `Proclaim`) while there is a leader, on
//!   the prefix's puts while there is none, and re-reads at once when the
//!   store moved between its read and the watch's creation (a write that
//!   lands in the instant between the server's answer header and the
//!   watch's registration is delivered by etcd's catch-up loop instead,
//!   within about 100 ms: observers may be that late). Each wake-up
//!   reads the leader again (one range read, plus a lease TTL read for a
//!   leader of another process).
//! - Cost: a campaign on a free election and its resignation are the
//!   mutex's 2 requests (the create transaction and the guarded delete;
//!   counted in `tests/round_trips.rs`).
//!
//! # Multi-locks in one transaction
//!
//! [`LockBackend::try_acquire_all`](lock_core::LockBackend::try_acquire_all)
//! takes a set of up to 128 keys (etcd's default `--max-txn-ops`) in **one
//! transaction**: it compares, for every key, that nothing is under the
//! key's prefix (a range compare: on an empty range etcd compares a
//! missing key, create revision 0), and then puts our entry under each
//! prefix with the session lease; when a key has any entry (a holder or a
//! waiter), nothing is written and the answer is "held" (tested in
//! `tests/compose/multi.rs`, also on a variant that keeps what it took). Every lease of a
//! set has the same token, the transaction's revision (each entry's create
//! revision: above every earlier grant of each key). Each lease is an
//! ordinary mutex grant (renewed, released and expired on its own, and
//! excluding `etcdctl lock` and plain locks of its key). A set of more
//! than 128 keys, or one the server refuses as too large, is
//! `Unsupported`, and `LockClient::lock_all` takes the keys one by one in
//! the global order instead, as it does when the set is held and the
//! request waits. Duplicate keys or an empty set are `InvalidArgument`.
//! On free keys a multi-lock of `n` keys costs 1 request to acquire and `n`
//! to release (checked in `tests/round_trips.rs`). Caveat: a set is
//! refused while any of its keys has a *waiter*, even if nobody holds it
//! (the waiter is queued first); a waiting `lock_all` then queues key by
//! key.
//!
//! # Operating: holder details, list, force-release, gc
//!
//! - **Holder details** live in the **value of the mutex entry**
//!   `<prefix>/<escaped key>/<lease hex>[-<n>]`: `<owner hex> <details>`,
//!   the owner id (32 hex digits), one space, and
//!   [`HolderDetails::encode_current`](lock_core::HolderDetails::encode_current)
//!   (`h=<host>;p=<pid>;n=<program>[;l=<label>];t=<ms>`), written by the
//!   grant's own create transaction (no extra request: still 2 per
//!   acquire+release cycle, `tests/round_trips.rs`), the same for each key
//!   of a multi-lock. Nothing is kept in client memory, and the details go
//!   with the entry (release, expiry, session loss, force-release).
//!   `inspect` and `list` decode them from the holder's entry
//!   ([`Capabilities::holder_details`](lock_core::Capabilities::holder_details)
//!   is true); a holder that is not ours (`etcdctl lock` writes an empty
//!   value) reports `None`. Release, expiry and renewal compare the owner
//!   part only: the value is above `<owner hex>` and below `<owner hex>!`
//!   (two value compares in the same transaction, beside the create
//!   revision). Election candidates carry the same value (see *Elections*:
//!   it is what `etcdctl elect -l` prints), and `leader` and
//!   `list_elections` report the details. Read-write lock and semaphore
//!   entries carry `<kind code> <owner hex> <details>`, written by the
//!   create transaction of the grant (still one request: a waiting grant
//!   keeps the details of its create, as a waiting mutex grant does);
//!   their release, downgrade and renewal from a handle compare `<kind
//!   code> <owner hex>` the same way (above it, below it with `!`), so a
//!   downgraded entry (`r <new owner> ..`) no longer matches the write
//!   lease; `holders` and `list_shared` decode the details. Caveat: an
//!   entry written by an earlier version (a mutex entry or candidate with
//!   the owner hex alone, a shared entry with `<kind code> <owner hex>`
//!   alone) is not recognised by this version's release or renewal from a
//!   handle; it goes with its TTL (its holders are still reported, without
//!   details).
//! - **`list(prefix, cursor, limit)`**: one range read, sorted by key, from
//!   `<prefix>/<escaped user prefix>` (or the cursor) to the end of that
//!   prefix, of at most `2 * limit + 8` entries (never more than 2,000),
//!   values included (most entries are holders, whose values carry the
//!   details). Entries are grouped by key (a key's entries are contiguous:
//!   they share `<escaped key>/`), the key unescaped; the holder is the
//!   entry with the lowest create revision, its token that revision, its
//!   remaining TTL as `inspect` reports it (our own grants' deadlines; one
//!   lease read per other lease on the page, 32 at a time). Only mutexes
//!   are listed (also those `etcdctl lock` holds under the prefix): the
//!   entries of read-write locks, semaphores and elections, the epoch keys
//!   and names with more segments are skipped. When the scan stops inside
//!   a key's queue, that key is left to the next page; a single key whose
//!   queue fills the whole scan gets one more read (its oldest entry). The
//!   cursor is `etcd:<entry name without the prefix>` (start there) or
//!   `etcd+:<name>` (start after it); anything else, or a cursor outside
//!   the listed prefix, is `InvalidArgument`.
//! - **`list_shared(shape, prefix, cursor, limit)`** for read-write locks
//!   and semaphores (the mutex: `list`'s page) and **`list_elections(prefix,
//!   cursor, limit)`** use the same machinery, bounds and cursor format:
//!   one range read per page over the same range, of which only the
//!   shape's entries are grouped (`<escaped key>%rw/..` with the epoch key
//!   `<escaped key>%rw-epoch`, which sorts just before them and is read in
//!   the same revision; `<escaped key>%sem/..`; `<escaped name>%elect/..`,
//!   also `etcdctl elect`'s candidates). A read-write lock or semaphore is
//!   listed with every holder as `holders` reports it (kind, owner, token,
//!   remaining TTL, details; waiting entries are not holders), an election
//!   with its leader (the candidate with the lowest create revision) as
//!   `leader` reports it. Keys with entries but no holder (an idle
//!   read-write lock's epoch key alone) are skipped. The other shapes'
//!   entries in the range count against the scan, so a page may hold
//!   fewer keys than `limit` (or none) and still have a cursor. When the
//!   scan stops inside a lock's entries it is left to the next page; one
//!   lock whose entries fill the whole scan gets one more read (`holders`
//!   or `leader` of it).
//! - **`force_release(key)`**: reads the holder (oldest entry) and deletes
//!   it in one transaction comparing its create revision (read again, up
//!   to 5 times, if the holder changed in between; `Contended` after
//!   that). It breaks any holder, ours or another process's, also an
//!   `etcdctl lock` holder. The next waiter in line is woken by its watch
//!   on that entry, as by a release. Tokens are the store's revisions,
//!   never reset, so the next grant's token is above the broken one. The
//!   broken holder's next `renew` fails `NotHeld` and its `release`
//!   returns `false`; a guard goes `Lost` at its next renewal.
//! - **Renewal checks the entry.** `renew` of a grant of our own session
//!   sends one transaction comparing the entry's create revision (no
//!   operations) before it moves the grant's deadline; the guards'
//!   batched renewal (`renew_many`) sends one `LeaseTimeToLive` with
//!   `keys` per session and renewal round, shared by the round's batches
//!   of up to 1,000 grants (a listing younger than a sixth of the session
//!   TTL is reused; it is kept as 8-byte hashes), and checks each grant's
//!   entry among the keys attached to the lease (the entry names carry the
//!   session's lease id, and a held name is never reused, so presence is
//!   enough). Each check is bounded by the operation timeout, a third of
//!   the session TTL and half the time left before the session's
//!   deadline, so a silent server makes the renewal fail (temporarily:
//!   `Suspect`) before the lease is lost. Cost: one request per session
//!   and renewal period, whose answer lists every entry of the session
//!   (about 40 bytes each: 4 MB a period at 100,000 held locks); a
//!   force-release is noticed at the next round (up to a third of the TTL
//!   plus a sixth).
//! - **`gc`** returns `Ok` with nothing removed or scanned: etcd keeps no
//!   per-key state after a release (the entries are deleted; tokens are
//!   global revisions, which never go backwards, so there is no counter to
//!   collect and no floor to keep). The one exception, a read-write lock's
//!   epoch key (one small key per name, no lease), is kept: without it the
//!   next readers would carry token 0, below the last writer's.
//!
//! Tested in the shared suite (`tests/etcd.rs`: single member and three
//! members; `tests/security.rs`: TLS and auth) by `holder_details_are_reported`,
//! `shared_holder_details_are_reported` (readers, a writer, permit holders
//! and a leader), `list_finds_held_locks`, `list_finds_shared_locks`
//! (`list_shared` of both shapes and `list_elections`, pages of 2 and 1)
//! and `force_release_fences_the_old_holder`, and in
//! `tests/admin.rs` (a guard broken by `force_release` goes `Lost` through
//! the batched renewal, a control guard beside it stays held; `list` over
//! long queues, raw `etcdctl`-style entries and bad cursors; `gc`).
//!
//! # Capability checklist
//!
//! - [x] Fencing tokens: the entry's **create revision**, global and
//!   strictly increasing across the cluster, kept across leader changes and
//!   restarts (it is raft state). ([`FencingScope::Global`](lock_core::FencingScope::Global),
//!   survives failover.)
//! - [x] Linearizable (CP): grants go through raft; a minority failure loses
//!   nothing.
//! - [x] Waiting by notification (watch on the predecessor), FIFO.
//! - [x] Release deletes the entry only if its create revision is the
//!   lease's token: a retried or stale release never deletes a newer grant.
//! - [x] Per-lock expiry: a lock not renewed within its TTL is deleted
//!   even while its session lives (see the TTL model below; tested in
//!   `tests/expiry.rs` with a raw lease, a guard without renewal and a
//!   guard with `max_hold`).
//! - [x] Lost-lock signal: every lease carries the session's state; the
//!   guard goes `Suspect` when a keep-alive fails and `Lost` when the server
//!   answers TTL <= 0 or at the local deadline (last keep-alive **sent** +
//!   TTL − drift), which is before the server can expire the lease.
//! - [x] Several endpoints. The client talks to one member at a time on
//!   one HTTP/2 connection of its own (`src/channel.rs`; rustls for
//!   `etcds://`): it moves to the next member, in the URL's order, when
//!   the connection breaks, misses its keep-alive PING (2 s without
//!   anything received, then 2 s for the answer), cannot be opened within
//!   `connect_timeout`, the member answers `Unavailable` (no leader,
//!   leader changed, request timed out, stopping), or a caller gives up on
//!   a call that waited a second or more for its answer, so a member cut
//!   off from the majority is left (`tests/channel.rs`). A unary request
//!   leaves in one TCP write (HEADERS and DATA together), where tonic's
//!   channel took two or three and etcd woke for each.
//! - [x] TLS (`etcds://` with `ca`, `cert`/`key` client certificates and
//!   `domain`), **tested** against etcd 3.4 with certificates generated at
//!   test time (`tests/security.rs`): the whole conformance suite over TLS,
//!   client certificates required by the server, and typed errors within
//!   the timeouts: `Config` for a server certificate that fails
//!   verification (wrong CA, wrong `domain`) or an unreadable PEM file,
//!   `Unavailable` for a plain `etcd://` client on a TLS port, and
//!   `Config` or `Unavailable` for a client certificate the server refuses
//!   or does not get (etcd may just close the connection).
//! - [x] User/password authentication (in the URL or with
//!   [`EtcdConfig::credentials`]), **tested** against etcd 3.4 with auth
//!   enabled: root and a user limited by a role to the lock prefix; a wrong
//!   password, an unknown user, no credentials or a key outside the user's
//!   permissions give `Config` errors that never show the password.
//! - [x] Leader election in `etcdctl elect`'s layout, terms = create
//!   revisions, observers woken by a watch (see above).
//! - [x] Multi-locks of up to 128 keys in one transaction (see above).
//! - [x] Shared (read-write) locks with writer preference and downgrade,
//!   and semaphores with FIFO waiters and per-permit leases (see above;
//!   tested in `tests/shared.rs`, each check also shown failing on a
//!   broken double).
//!
//! # TTL model: per lock, on one session lease
//!
//! A backend holds **one etcd lease per TTL** (normally just one: the
//! configured `ttl`, granted at connect time), kept alive by one keep-alive
//! stream every TTL/3; every lock acquired with that TTL is attached to it,
//! so holding 10,000 locks costs one keep-alive and acquiring never grants
//! a lease. Each lock still expires with **its own TTL**
//! ([`Capabilities::ttl_model`](lock_core::Capabilities::ttl_model) is
//! [`TtlModel::PerLease`](lock_core::TtlModel::PerLease)):
//!
//! - Every grant has a deadline of its own, `sent + TTL` (from when the
//!   deciding request was sent), kept by the session in memory. `renew`
//!   moves it once it has seen the entry still on the server (the session
//!   lease is kept alive anyway; see *Operating* below for what the check
//!   costs).
//!   When it passes without a renewal, one expiry task per session deletes
//!   the entry with a transaction that compares its create revision and
//!   owner, in the background. So a lock stops being held on the server when
//!   its TTL runs out whatever the reason its holder stopped renewing:
//!   renewal disabled or capped (`max_hold`, `max_renewals`), a guard that
//!   went `Lost`, a raw lease never renewed or dropped without a release
//!   (a guard's drop releases its lease). A renewal that comes after the
//!   deadline is refused with
//!   [`ErrorKind::NotHeld`](lock_core::ErrorKind::NotHeld) (the entry is
//!   being deleted). Cost: nothing on acquire or release (same round
//!   trips), one delete transaction per lock that expires, and per held
//!   lock one map slot (the escaped key, stored once without the prefix and
//!   the lease id, its revision, owner and deadline; no queue element: the
//!   expiry task looks over the slots when the earliest deadline comes up,
//!   at most every 20 ms, so an expired entry is deleted within 20 ms of
//!   its deadline) and no channel of its own: every lease carries a
//!   receiver of its session's state channel, and no entry name for the
//!   session's plain entry under its key (its owner id names the session;
//!   a lease rebuilt in another process finds its entry by create revision
//!   under the key's prefix, one read more).
//! - If this process cannot delete the entry (it crashed, was paused, or is
//!   cut off from etcd), the **session lease** frees it: within the lease's
//!   TTL, the lock TTL rounded **up** to whole seconds, of the last
//!   keep-alive. The local validity deadline uses the requested TTL and
//!   never outlives the session lease's own deadline. The minimum TTL is
//!   1 s (the server may raise it to 1.5 election timeouts).
//! - If the session lease is lost, **every** lock on it is lost at once; the
//!   next acquire creates a new session. An acquire that was waiting starts
//!   over on the new session (it loses its place in the queue).
//! - A session started for a TTL other than the configured one is revoked
//!   once it has had no entry (held, waiting or being cleaned up) for
//!   three of its TTLs, and at least 10 s (looked at every 5 s; the next
//!   grant of that TTL starts a new session, one lease grant more), so a
//!   client that used many TTLs does not keep a lease and a keep-alive
//!   stream for each forever. It is retired under the sessions' lock only
//!   when nothing else refers to it, so no grant can be on its way to it
//!   (`tests/sessions.rs`; retiring a session with a held lock fails it).
//! - `inspect` reports, as the remaining TTL, the grant's own deadline for
//!   locks held through this backend, and for locks of other backends an
//!   upper bound: the etcd lease's granted TTL (their local deadlines are not
//!   stored in etcd; each is at most one lock TTL, rounded up, away).
//! - `renew` of a lease from another process (rebuilt from a handle) sends
//!   one keep-alive for that process's lease and checks the entry. This is
//!   meant for the `distlock acquire` / `renew --handle` flow, where the
//!   granting process has exited: a granting backend that is still running
//!   deletes the entry at its own deadline, which a renewal from elsewhere
//!   cannot move.
//!
//! # Benchmarks
//!
//! `cargo run --release -p lock-etcd --example etcd_bench` compares our
//! acquire+release cycle (a waiting acquire, as users write it) with the
//! same two transactions issued by hand, gRPC over one bare HTTP/2
//! connection with a lease of their own ([`floor::EtcdFloor`], also used
//! by `distlock compare`), with 1 client
//! and with 8 independent clients; one permit of a semaphore against
//! [`floor::EtcdPermitFloor`] (the same two transactions the driver sends
//! for an uncontended permit: create-and-read, exact delete; also the
//! descriptor's `permit_floor`, one permit of 4); and 8 readers on one key
//! against 8 clients of the mutex. `tests/round_trips.rs` checks that a
//! cycle on a free key costs the floor's 2 RPCs. `etcd_parts` splits one
//! cycle's time between the wire, `etcd-client` and this driver.
//!
//! # Caveats
//!
//! - An entry deleted behind our back (`force_release`, `etcdctl del`) is
//!   noticed at the holder's next renewal (`NotHeld`; the guard goes
//!   `Lost`), not before: in between, only the fencing token protects the
//!   resource.
//! - etcd serves a watch that starts at or below its current revision from
//!   a catch-up loop that runs every 100 ms, and a watch created while a
//!   write commits can end up there without the client being told. A waiter
//!   therefore reads its predecessor once after creating its watch; if the
//!   store moved meanwhile (always the case under contention), it also reads
//!   it every 5 ms for the first 150 ms of that watch, so that a release is
//!   seen within a few milliseconds rather than up to 100 ms later.
//! - If a create request times out, its outcome is unknown: the entry is
//!   deleted in the background and checked again a few seconds later (a
//!   request still in flight could be applied after the delete); such an
//!   entry name is never reused by the session.
//! - Dropping the backend stops the keep-alive without revoking (like a
//!   crash: locks are freed after the TTL); call [`EtcdBackend::close`] to
//!   free everything at once.

#![deny(missing_docs)]

mod channel;
mod cleanup;
mod config;
mod connect;
mod descriptor;
mod driver;
mod error;
pub mod floor;
mod keys;
mod session;

pub use config::{DEFAULT_CONNECT_TIMEOUT, DEFAULT_OP_TIMEOUT, DEFAULT_TTL, EtcdConfig, EtcdTls};
pub use descriptor::DRIVER;
pub use driver::{EtcdBackend, MIN_TTL, capabilities};

use lock_core::LockError;

/// The URL schemes this crate accepts: `etcd` and `etcds` (TLS).
pub const URL_SCHEMES: &[&str] = &["etcd", "etcds"];

/// Parses `url` (see [`EtcdConfig::from_url`]) and connects.
///
/// # Errors
///
/// [`ErrorKind::Config`](lock_core::ErrorKind::Config) for a bad URL or
/// rejected credentials; [`ErrorKind::Unavailable`](lock_core::ErrorKind::Unavailable)
/// or [`ErrorKind::Timeout`](lock_core::ErrorKind::Timeout) when etcd cannot
/// be reached in time.
///
/// # Cancel safety
///
/// Dropping the future may leave a granted session lease behind; it expires
/// with its TTL.
pub async fn connect(url: &str) -> Result<EtcdBackend, LockError> {
    EtcdBackend::connect(EtcdConfig::from_url(url)?).await
}
