//! Interoperation with the real kazoo `Lock` (PyPI's `kazoo`, installed in
//! a virtualenv by `scripts/legacy-clients.sh`), run as a Python process
//! (`tests/kazoo/peer.py`) taking commands on stdin, against a real
//! ZooKeeper. Our mutex and kazoo's exclude each other on the same path in
//! both directions: while one holds, the other's single try and short wait
//! are refused; after the release, the waiting other gets it.
//!
//! kazoo sees our (and Curator's) `…-lock-<seq>` nodes only when its lock
//! is given `extra_lock_patterns=["-lock-"]` (kazoo 2.7.1+): the negative
//! control below shows a kazoo lock without it getting in beside ours, and
//! that the exclusion check reports it.
//!
//! With `nodes=kazoo` our nodes carry kazoo's own name
//! (`<owner hex>__lock__<seq>`), and an unmodified kazoo `Lock` (no
//! `extra_lock_patterns`) and ours exclude each other in both directions;
//! a backend of ours with the default names on the same path is the
//! control (that kazoo gets in beside it).
//!
//! The Python is `DISTLOCK_LEGACY_PYTHON`, by default
//! `target/legacy-clients/venv/bin/python` of the workspace. Missing, the
//! tests fail under CI (`CI` set) naming the installer, and skip otherwise.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::routed::{Request, Routed};
use common::{Standalone, TTL, key, soon, spawn_acquire};
use conformance::OrSkip;
use lock_core::{ErrorKind, ListQuery, LockBackend, LockBackendExt, LockKey, OwnerId};
use lock_zk::ZkBackend;
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep};

const PEER: &str = include_str!("kazoo/peer.py");
/// What a kazoo lock needs to see our nodes (and Curator's).
const SEE_OURS: &str = "-lock-";

/// The virtualenv's python, or `None` (skip) outside CI when it is
/// missing (under CI a missing one fails, naming the installer).
fn python() -> Option<PathBuf> {
    conformance::legacy::legacy_python().or_skip()
}

/// One kazoo process: commands on stdin, answers routed by request id.
struct Kazoo {
    _child: Child,
    io: Routed,
}

impl Kazoo {
    async fn start(python: &PathBuf, connect: &str) -> Self {
        let script = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("kazoo-peer-{}.py", std::process::id()));
        std::fs::write(&script, PEER).expect("write the kazoo peer");
        let mut child = Command::new(python)
            .arg(&script)
            .arg(connect)
            .arg("4000")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {} ({e})", python.display()));
        let io = Routed::start(
            &mut child,
            "kazoo",
            "k",
            "kazoo peer exited before connecting (is kazoo installed? scripts/legacy-clients.sh)",
        )
        .await;
        Self { _child: child, io }
    }

    async fn request(&self, command: &str) -> Request {
        self.io.request(command).await
    }

    /// `Lock(path, extra_lock_patterns=extra).acquire(...)`, answered.
    async fn lock(&self, path: &str, wait_ms: u64, extra: &[&str]) -> (Request, String) {
        self.io
            .take(&format!("lock {path} {wait_ms} {}", extra.join(" ")))
            .await
    }

    /// `ReadLock(path, extra_lock_patterns=extra).acquire(...)`, answered.
    async fn read_lock(&self, path: &str, wait_ms: u64, extra: &[&str]) -> (Request, String) {
        self.io
            .take(&format!("rlock {path} {wait_ms} {}", extra.join(" ")))
            .await
    }

    async fn release(&self, request: &mut Request) {
        self.io.release(request).await;
    }

    /// kazoo's `Lock(path).contenders()`: the data of each `__lock__`
    /// node, as a JSON list.
    async fn contenders(&self, path: &str) -> String {
        let mut request = self.request(&format!("contenders {path}")).await;
        request.answer(Duration::from_secs(10)).await
    }

    async fn children(&self, path: &str) -> String {
        let mut request = self.request(&format!("children {path}")).await;
        request.answer(Duration::from_secs(10)).await
    }
}

/// A fresh path `/legacy/app/locks/<name>-<random>` (kazoo's own layout)
/// and our key of the same name (for `layout=path`).
fn legacy_path(name: &str) -> (String, LockKey) {
    let path = format!(
        "/legacy/app/locks/{name}-{}",
        &OwnerId::random().to_hex()[..8]
    );
    let k = LockKey::new(path.clone()).expect("key");
    (path, k)
}

/// A server, `n` backends of ours (built from `config_url`'s options) and
/// a kazoo process, or `None` (skip) when kazoo is not installed.
async fn setup(options: &str) -> Option<(Standalone, ZkBackend, Kazoo)> {
    let python = python()?;
    let target = Standalone::start()
        .await
        .expect("the kazoo interop tests need ZooKeeper (Debian package zookeeper)");
    let ours = target.backend_with(options, "backend").await;
    let connect = target.base_url().trim_start_matches("zk://").to_owned();
    let kazoo = Kazoo::start(&python, &connect).await;
    Some((target, ours, kazoo))
}

/// While kazoo (with the `extra` patterns) holds `path`, our single try
/// and our short wait are refused; ours waiting is granted once kazoo
/// releases. Returns whether the exclusion held.
async fn kazoo_excludes_ours(
    ours: &ZkBackend,
    kazoo: &Kazoo,
    k: &LockKey,
    path: &str,
    extra: &[&str],
) -> bool {
    let (mut held, answer) = kazoo.lock(path, 5_000, extra).await;
    assert_eq!(answer, "ok", "kazoo on a free path");
    let tried = ours.try_acquire(k, TTL).await.expect("our try");
    let waited = ours.acquire(k, TTL, soon(300)).await;
    let excluded = tried.is_none()
        && waited
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::Contended);
    for lease in tried.iter().chain(waited.as_ref().ok()) {
        ours.release(lease).await.expect("release ours");
    }
    let waiter = spawn_acquire(ours, k);
    sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    kazoo.release(&mut held).await;
    let (granted_at, lease) = waiter.await.expect("join");
    let lease = lease.expect("ours after kazoo's release");
    assert!(
        granted_at >= released,
        "ours was granted before kazoo released"
    );
    assert!(ours.release(&lease).await.expect("release"));
    excluded
}

/// While ours holds `k`, a kazoo lock on `path` with `extra` patterns is
/// refused (single try and short wait), and its waiting acquire is granted
/// once ours releases. Returns whether the exclusion held; kazoo's locks
/// are released either way.
async fn ours_excludes_kazoo(
    ours: &ZkBackend,
    kazoo: &Kazoo,
    k: &LockKey,
    path: &str,
    extra: &[&str],
) -> bool {
    let lease = ours
        .try_acquire(k, TTL)
        .await
        .expect("our try")
        .expect("ours on a free key");
    let mut excluded = true;
    for wait in [0, 300] {
        let (mut request, answer) = kazoo.lock(path, wait, extra).await;
        match answer.as_str() {
            "busy" => {}
            "ok" => {
                excluded = false;
                kazoo.release(&mut request).await;
            }
            other => panic!("kazoo answered {other:?}"),
        }
    }
    let mut waiting = kazoo
        .request(&format!("lock {path} 10000 {}", extra.join(" ")))
        .await;
    if !waiting.silent(Duration::from_millis(300)).await {
        // Granted (or failed) while ours holds.
        excluded = false;
        ours.release(&lease).await.expect("release ours");
        kazoo.release(&mut waiting).await;
        return excluded;
    }
    assert!(ours.release(&lease).await.expect("release ours"));
    assert_eq!(
        waiting.answer(Duration::from_secs(5)).await,
        "ok",
        "kazoo after our release"
    );
    kazoo.release(&mut waiting).await;
    excluded
}

/// [`kazoo_excludes_ours`] and [`ours_excludes_kazoo`] must both hold;
/// `names` (ours, kazoo's) name the two sides when one does not.
async fn exclude_both_ways(
    ours: &ZkBackend,
    kazoo: &Kazoo,
    k: &LockKey,
    path: &str,
    extra: &[&str],
    [our_name, kazoo_name]: [&str; 2],
) {
    assert!(
        kazoo_excludes_ours(ours, kazoo, k, path, extra).await,
        "{our_name} got the lock while {kazoo_name} held {path}"
    );
    assert!(
        ours_excludes_kazoo(ours, kazoo, k, path, extra).await,
        "{kazoo_name} got the lock while {our_name} held {path}"
    );
}

/// The negative control: an unmodified kazoo lock (no extra patterns)
/// gets in beside `ours` on `path` (`expected` when it does not), and
/// nothing is left in `path` afterwards.
async fn kazoo_ignores(ours: &ZkBackend, kazoo: &Kazoo, k: &LockKey, path: &str, expected: &str) {
    assert!(
        !ours_excludes_kazoo(ours, kazoo, k, path, &[]).await,
        "{expected}"
    );
    assert_eq!(kazoo.children(path).await, "", "nodes left in {path}");
}

/// Both directions on the default layout (kazoo's path is our key's
/// directory, [`ZkBackend::key_path`]), kazoo's `ReadLock` against ours
/// both ways, and the negative control: a kazoo
/// lock without `extra_lock_patterns` ignores our node, and the check says
/// so.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kazoo_lock_and_ours_exclude_each_other() {
    let Some((_target, ours, kazoo)) = setup("").await else {
        return;
    };
    let k = key("kazoo");
    let path = ours.key_path(&k);
    exclude_both_ways(&ours, &kazoo, &k, &path, &[SEE_OURS], ["ours", "kazoo"]).await;
    // A kazoo reader excludes our mutex too (ours is a writer), and the
    // other way round for a reader that sees our nodes.
    let (mut reader, answer) = kazoo.read_lock(&path, 5_000, &[SEE_OURS]).await;
    assert_eq!(answer, "ok");
    assert!(
        ours.try_acquire(&k, TTL).await.unwrap().is_none(),
        "ours beside kazoo's ReadLock on {path}"
    );
    kazoo.release(&mut reader).await;
    let lease = ours
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("ours after the reader");
    let (_refused, answer) = kazoo.read_lock(&path, 0, &[SEE_OURS]).await;
    assert_eq!(answer, "busy", "kazoo's ReadLock beside ours on {path}");
    assert!(ours.release(&lease).await.unwrap());
    // Negative control: kazoo's default contenders are `__lock__` nodes
    // only, so without the extra pattern it takes the lock beside ours.
    kazoo_ignores(
        &ours,
        &kazoo,
        &k,
        &path,
        "kazoo without extra_lock_patterns was expected to ignore our node",
    )
    .await;
}

/// `layout=path`: our key is kazoo's own path, verbatim. Exclusion both
/// ways there, `inspect` names kazoo's holder, the directory (kazoo's,
/// persistent) is left in place, and a key that is no absolute path is
/// refused with `InvalidArgument`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn path_layout_locks_kazoos_own_path() {
    let Some((_target, ours, kazoo)) = setup("layout=path&containers=false").await else {
        return;
    };
    let (path, k) = legacy_path("orders");
    assert_eq!(ours.key_path(&k), path);
    exclude_both_ways(&ours, &kazoo, &k, &path, &[SEE_OURS], ["ours", "kazoo"]).await;
    let (mut held, answer) = kazoo.lock(&path, 5_000, &[SEE_OURS]).await;
    assert_eq!(answer, "ok");
    let info = ours
        .inspect(&k)
        .await
        .expect("inspect")
        .expect("kazoo holds");
    assert!(info.holder.contains("__lock__"), "{info:?}");
    assert!(info.token.is_some(), "{info:?}");
    kazoo.release(&mut held).await;
    assert_eq!(ours.inspect(&k).await.expect("inspect"), None);
    let lease = ours.try_acquire(&k, TTL).await.expect("try").expect("free");
    assert!(ours.release(&lease).await.expect("release"));
    // Empty after our release, but still there: a kazoo Lock object
    // remembers that its path exists and would fail its next create.
    assert_eq!(kazoo.children(&path).await, "");
    for bad in ["orders", "/legacy//x", "/zookeeper/x", "/legacy/"] {
        let bad = LockKey::new(bad).expect("key");
        let err = ours.try_acquire(&bad, TTL).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        let err = ours.inspect(&bad).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
}

/// `nodes=kazoo` on kazoo's own path: an unmodified kazoo `Lock` (no
/// `extra_lock_patterns`) and ours exclude each other in both directions
/// (kazoo's waiter is woken by our node's delete: it answers well inside
/// its 10 s wait). Our node is `<owner hex>__lock__<10 digits>`; `inspect`
/// names our owner and kazoo's id; renew works; our Curator-named backend
/// on the same path and the kazoo-named one exclude each other. Control:
/// the same unmodified kazoo gets in beside the Curator-named backend, and
/// the check reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kazoo_named_nodes_exclude_an_unmodified_kazoo_lock() {
    let options = "layout=path&containers=false";
    let Some((target, ours, kazoo)) = setup(&format!("{options}&nodes=kazoo")).await else {
        return;
    };
    let curator_named = target.backend_with(options, "backend").await;
    let (path, k) = legacy_path("kazoo-named");
    let names = ["ours (nodes=kazoo)", "an unmodified kazoo"];
    exclude_both_ways(&ours, &kazoo, &k, &path, &[], names).await;

    // Our node under kazoo's name, found again by owner and sequence.
    let lease = ours.try_acquire(&k, TTL).await.expect("try").expect("free");
    let children = kazoo.children(&path).await;
    let (hex, seq) = children.split_once("__lock__").expect("a __lock__ node");
    assert_eq!(hex, lease.owner().to_hex(), "{children}");
    assert!(
        seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()),
        "{children}"
    );
    assert_eq!(ours.node_path(&lease), Some(format!("{path}/{children}")));
    let info = ours.inspect(&k).await.expect("inspect").expect("held");
    assert_eq!(info.holder, lease.owner().to_hex(), "{info:?}");
    assert_eq!(info.token, Some(lease.token()), "{info:?}");
    assert!(info.remaining_ttl.is_some(), "{info:?}");
    ours.renew(&lease).await.expect("renew");
    // Both namings of ours exclude each other.
    assert!(
        curator_named.try_acquire(&k, TTL).await.unwrap().is_none(),
        "Curator-named ours beside kazoo-named ours"
    );
    assert!(ours.release(&lease).await.expect("release"));
    let other = curator_named
        .try_acquire(&k, TTL)
        .await
        .unwrap()
        .expect("free");
    assert!(
        ours.try_acquire(&k, TTL).await.unwrap().is_none(),
        "kazoo-named ours beside Curator-named ours"
    );
    assert!(curator_named.release(&other).await.unwrap());

    // kazoo holds: `inspect` names the id in kazoo's node.
    let (mut held, answer) = kazoo.lock(&path, 5_000, &[]).await;
    assert_eq!(answer, "ok");
    let children = kazoo.children(&path).await;
    let info = ours.inspect(&k).await.expect("inspect").expect("held");
    assert_eq!(
        Some(info.holder.as_str()),
        children.split_once("__lock__").map(|(hex, _)| hex),
        "{info:?}"
    );
    assert!(info.remaining_ttl.is_none(), "{info:?}");
    kazoo.release(&mut held).await;

    // Control: with Curator's names the same unmodified kazoo does not see
    // our node, and the check says so.
    kazoo_ignores(
        &curator_named,
        &kazoo,
        &k,
        &path,
        "an unmodified kazoo was expected to ignore a Curator-named node",
    )
    .await;
}

/// Holder details on kazoo's own path (`layout=path&nodes=kazoo`): our
/// node's data is `<owner hex>\n<details>`, so kazoo's `contenders()`
/// lists our owner id on the first line, and an unmodified kazoo `Lock` is
/// still refused beside it; our `inspect` reports the details. Control: a
/// kazoo holder's node (its identifier as data) has no details. Then
/// `force_release` breaks the kazoo holder (its node deleted, its id
/// reported) and ours gets in; `list` of the root does not report path
/// keys (they live outside the root).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holder_details_beside_kazoos_identifier() {
    let Some((_target, ours, kazoo)) = setup("layout=path&containers=false&nodes=kazoo").await
    else {
        return;
    };
    let (path, k) = legacy_path("details");
    let lease = ours.try_acquire(&k, TTL).await.expect("try").expect("free");
    let contenders = kazoo.contenders(&path).await;
    let expected_start = format!("[\"{}\\nh=", lease.owner().to_hex());
    assert!(
        contenders.starts_with(&expected_start),
        "kazoo's contenders() {contenders}, expected it to start {expected_start}"
    );
    let info = ours.inspect(&k).await.expect("inspect").expect("held");
    let details = info.details.expect("details of our grant");
    assert_eq!(details.pid, std::process::id(), "{details:?}");
    assert_eq!(info.holder, lease.owner().to_hex());
    let (_refused, answer) = kazoo.lock(&path, 0, &[]).await;
    assert_eq!(
        answer, "busy",
        "an unmodified kazoo beside our node with details"
    );
    let page = ours.list(&ListQuery::new("", 1000)).await.expect("list");
    assert!(
        page.locks.iter().all(|l| l.key != k),
        "list of the root reported the path key {path}"
    );
    assert!(ours.release(&lease).await.expect("release"));

    // Control: kazoo's own holder carries its identifier, no details.
    let (mut held, answer) = kazoo.lock(&path, 5_000, &[]).await;
    assert_eq!(answer, "ok");
    let info = ours.inspect(&k).await.expect("inspect").expect("held");
    assert!(info.details.is_none(), "details on kazoo's node: {info:?}");
    let contenders = kazoo.contenders(&path).await;
    assert!(
        contenders.contains(&format!("kazoo-{}", held.id)),
        "{contenders}"
    );

    // Breaking kazoo's holder: its node goes, ours gets in.
    let broken = ours
        .force_release(&k)
        .await
        .expect("force_release")
        .expect("kazoo held");
    assert_eq!(broken.holder, info.holder, "{broken:?}");
    assert_eq!(broken.token, info.token, "{broken:?}");
    let next = ours
        .try_acquire(&k, TTL)
        .await
        .expect("try")
        .expect("free after breaking kazoo's holder");
    assert!(Some(next.token()) > broken.token);
    assert!(ours.release(&next).await.expect("release"));
    // kazoo's release of a broken lock finds no node and says released.
    kazoo.release(&mut held).await;
}
