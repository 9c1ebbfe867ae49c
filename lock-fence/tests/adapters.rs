//! Every adapter against the fencing cases (`conformance::fencing`), on
//! real stores (SQLite, PostgreSQL, MariaDB, redis-server, files, a tower
//! service), and each case shown failing on a variant of the adapter that
//! writes without the check.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use conformance::OrSkip;
use conformance::fencing::{FenceOutcome, FencedResource, run_fence_cases};
use conformance::servers::mariadb::MariaDbServer;
use conformance::servers::postgres::PostgresServer;
use conformance::servers::redis::RedisServer;
use lock_fence::sqlx;
use lock_fence::{FenceError, FencingToken};

fn outcome(result: Result<(), FenceError>) -> Result<FenceOutcome, String> {
    match result {
        Ok(()) => Ok(FenceOutcome::Accepted),
        Err(FenceError::Stale { current, .. }) => Ok(FenceOutcome::Refused { current }),
        Err(other) => Err(other.to_string()),
    }
}

/// The stale-write case must fail on a store that writes without the
/// check, and so must the race (a lower token landing last).
fn assert_unchecked_fails(report: &conformance::fencing::FenceReport) {
    let failed = report.failed();
    assert!(
        failed.contains(&"stale_write_is_refused_with_the_current_token"),
        "{}: the unchecked variant passed the stale case: {report:?}",
        report.subject
    );
}

// ---- SQL ------------------------------------------------------------------

/// A table `data(resource, value)`, written in the fenced transaction.
enum Pool {
    Postgres(sqlx::PgPool),
    MariaDb(sqlx::MySqlPool),
    Sqlite(sqlx::SqlitePool),
}

struct Sql {
    pool: Pool,
    fence: lock_fence::sql::SqlFence,
    checked: bool,
}

const PG_UPSERT: &str = "INSERT INTO data (resource, value) VALUES ($1, $2) \
    ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value";
const MY_UPSERT: &str = "INSERT INTO data (resource, value) VALUES (?, ?) \
    ON DUPLICATE KEY UPDATE value = VALUES(value)";
const LITE_UPSERT: &str = "INSERT INTO data (resource, value) VALUES (?1, ?2) \
    ON CONFLICT (resource) DO UPDATE SET value = excluded.value";

/// The same steps on each pool: a fenced transaction (or, unchecked, none),
/// the upsert, the commit.
macro_rules! on_pool {
    ($sql:expr, |$pool:ident, $upsert:ident, $select:ident| $body:expr) => {
        match &$sql.pool {
            Pool::Postgres($pool) => {
                let ($upsert, $select) = (PG_UPSERT, "SELECT value FROM data WHERE resource = $1");
                $body
            }
            Pool::MariaDb($pool) => {
                let ($upsert, $select) = (MY_UPSERT, "SELECT value FROM data WHERE resource = ?");
                $body
            }
            Pool::Sqlite($pool) => {
                let ($upsert, $select) =
                    (LITE_UPSERT, "SELECT value FROM data WHERE resource = ?1");
                $body
            }
        }
    };
}

impl Sql {
    async fn new(url: &str, checked: bool) -> Self {
        let (pool, key_type) = if url.starts_with("postgres") {
            (
                Pool::Postgres(sqlx::PgPool::connect(url).await.unwrap()),
                "TEXT",
            )
        } else if url.starts_with("mysql") {
            (
                Pool::MariaDb(sqlx::MySqlPool::connect(url).await.unwrap()),
                "VARCHAR(255)",
            )
        } else {
            (
                Pool::Sqlite(sqlx::SqlitePool::connect(url).await.unwrap()),
                "TEXT",
            )
        };
        let sql = Self {
            pool,
            fence: lock_fence::sql::SqlFence::new(),
            checked,
        };
        let create = format!(
            "CREATE TABLE IF NOT EXISTS data (resource {key_type} PRIMARY KEY, value TEXT)"
        );
        on_pool!(sql, |pool, _u, _s| {
            sqlx::query(sqlx::AssertSqlSafe(create))
                .execute(pool)
                .await
                .unwrap();
            sql.fence
                .create_table(&mut *pool.acquire().await.unwrap())
                .await
                .unwrap();
        });
        sql
    }
}

#[async_trait]
impl FencedResource for Sql {
    fn name(&self) -> String {
        let db = on_pool!(self, |_p, _u, _s| std::any::type_name_of_val(_p));
        format!("{db}{}", if self.checked { "" } else { " (unchecked)" })
    }

    async fn write(&self, resource: &str, token: u64, value: &str) -> Result<FenceOutcome, String> {
        let token = FencingToken::new(token);
        on_pool!(self, |pool, upsert, _s| {
            let mut tx = if self.checked {
                match self.fence.begin(pool, resource, token).await {
                    Ok(tx) => tx,
                    Err(err) => return outcome(Err(err)),
                }
            } else {
                pool.begin().await.map_err(|e| e.to_string())?
            };
            sqlx::query(upsert)
                .bind(resource)
                .bind(value)
                .execute(&mut *tx)
                .await
                .map_err(|e| e.to_string())?;
            tx.commit().await.map_err(|e| e.to_string())?;
            Ok(FenceOutcome::Accepted)
        })
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        on_pool!(self, |pool, _u, select| {
            sqlx::query_scalar(select)
                .bind(resource)
                .fetch_optional(pool)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

async fn sql_cases(url: &str) {
    run_fence_cases(Arc::new(Sql::new(url, true).await))
        .await
        .assert_passed();
    assert_unchecked_fails(&run_fence_cases(Arc::new(Sql::new(url, false).await)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_table() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("app.db").display());
    sql_cases(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_table() {
    let Some(server) = PostgresServer::start().await.or_skip() else {
        return;
    };
    sql_cases(&server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_table() {
    let Some(server) = MariaDbServer::start().await.or_skip() else {
        return;
    };
    sql_cases(&server.url()).await;
}

// ---- Redis ----------------------------------------------------------------

struct Redis {
    conn: redis::aio::MultiplexedConnection,
    fence: Option<lock_fence::redis::RedisFence<redis::aio::MultiplexedConnection>>,
}

#[async_trait]
impl FencedResource for Redis {
    fn name(&self) -> String {
        format!(
            "redis{}",
            if self.fence.is_some() {
                ""
            } else {
                " (unchecked)"
            }
        )
    }

    async fn write(&self, resource: &str, token: u64, value: &str) -> Result<FenceOutcome, String> {
        match &self.fence {
            Some(fence) => outcome(fence.set(resource, value, FencingToken::new(token)).await),
            None => {
                let mut conn = self.conn.clone();
                redis::cmd("SET")
                    .arg(resource)
                    .arg(value)
                    .query_async::<()>(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(FenceOutcome::Accepted)
            }
        }
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        let mut conn = self.conn.clone();
        redis::cmd("GET")
            .arg(resource)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_values_hashes_and_counters() {
    let Some(server) = RedisServer::start().await.or_skip() else {
        return;
    };
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    let fence = lock_fence::redis::RedisFence::new(conn.clone());
    run_fence_cases(Arc::new(Redis {
        conn: conn.clone(),
        fence: Some(fence.clone()),
    }))
    .await
    .assert_passed();
    assert_unchecked_fails(
        &run_fence_cases(Arc::new(Redis {
            conn: conn.clone(),
            fence: None,
        }))
        .await,
    );

    // A hash field and a counter, fenced by the same rule.
    let t = FencingToken::new;
    fence.hset("h", "field", "a", t(10)).await.unwrap();
    let err = fence.hset("h", "field", "stale", t(9)).await.unwrap_err();
    assert_eq!(err.current_token(), Some(10), "{err}");
    assert_eq!(fence.incr_by("n", 5, t(3)).await.unwrap(), 5);
    assert_eq!(
        fence.incr_by("n", 5, t(3)).await.unwrap(),
        10,
        "equal token"
    );
    assert!(fence.incr_by("n", 100, t(2)).await.unwrap_err().is_stale());
    let mut c = conn.clone();
    let (field, n): (String, i64) = redis::pipe()
        .cmd("HGET")
        .arg("h")
        .arg("field")
        .cmd("GET")
        .arg("n")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!((field.as_str(), n), ("a", 10));
    assert_eq!(fence.current("n").await.unwrap(), Some(3));
}

#[test]
fn redis_fence_keys_share_the_slot_of_their_key() {
    use lock_fence::redis::fence_key;
    assert_eq!(fence_key("balance"), "{balance}:fence");
    assert_eq!(fence_key("{user:1}:balance"), "{user:1}:balance:fence");
    // An empty tag is no tag: the whole key is hashed.
    assert_eq!(fence_key("a{}b"), "{a{}b}:fence");
}

// ---- Files ----------------------------------------------------------------

struct Files {
    dir: PathBuf,
    checked: bool,
}

#[async_trait]
impl FencedResource for Files {
    fn name(&self) -> String {
        format!("file{}", if self.checked { "" } else { " (unchecked)" })
    }

    async fn write(&self, resource: &str, token: u64, value: &str) -> Result<FenceOutcome, String> {
        let path = self.dir.join(resource);
        if self.checked {
            outcome(lock_fence::file::replace(&path, FencingToken::new(token), value.into()).await)
        } else {
            std::fs::write(&path, value).map_err(|e| e.to_string())?;
            Ok(FenceOutcome::Accepted)
        }
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        match std::fs::read_to_string(self.dir.join(resource)) {
            Ok(text) => Ok(Some(text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_replaced_and_appended() {
    let dir = tempfile::tempdir().unwrap();
    let files = |checked| {
        Arc::new(Files {
            dir: dir.path().to_owned(),
            checked,
        })
    };
    run_fence_cases(files(true)).await.assert_passed();
    assert_unchecked_fails(&run_fence_cases(files(false)).await);

    let log = dir.path().join("job.log");
    let t = FencingToken::new;
    lock_fence::file::append(&log, t(2), b"one\n".to_vec())
        .await
        .unwrap();
    lock_fence::file::append(&log, t(3), b"two\n".to_vec())
        .await
        .unwrap();
    let err = lock_fence::file::append(&log, t(2), b"late\n".to_vec())
        .await
        .unwrap_err();
    assert_eq!(err.current_token(), Some(3));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "one\ntwo\n");
    assert_eq!(lock_fence::file::current(&log).unwrap(), Some(3));
    // No temporary file is left beside a replaced one.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

// ---- HTTP -----------------------------------------------------------------

type Store = Arc<Mutex<HashMap<String, String>>>;

struct Http {
    store: Store,
    layer: Option<lock_fence::http::FencingLayer>,
}

#[async_trait]
impl FencedResource for Http {
    fn name(&self) -> String {
        format!(
            "http{}",
            if self.layer.is_some() {
                ""
            } else {
                " (unchecked)"
            }
        )
    }

    async fn write(&self, resource: &str, token: u64, value: &str) -> Result<FenceOutcome, String> {
        use lock_fence::http::FencedRequest;
        use tower::ServiceExt;
        let store = self.store.clone();
        let handler = tower::service_fn(move |req: http::Request<String>| {
            let store = store.clone();
            async move {
                let path = req.uri().path().trim_start_matches('/').to_owned();
                // A slow handler: a fence that did not hold the turn would
                // let a lower token land after a higher one.
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                store.lock().unwrap().insert(path, req.into_body());
                Ok::<_, Infallible>(http::Response::new(String::new()))
            }
        });
        let request = http::Request::builder()
            .uri(format!("/{resource}"))
            .method("PUT")
            .fencing(FencingToken::new(token), None)
            .body(value.to_owned())
            .unwrap();
        let response = match &self.layer {
            Some(layer) => {
                tower::ServiceBuilder::new()
                    .layer(layer.clone())
                    .service(handler)
                    .oneshot(request)
                    .await
            }
            None => handler.oneshot(request).await,
        }
        .unwrap();
        match response.status() {
            http::StatusCode::OK => Ok(FenceOutcome::Accepted),
            http::StatusCode::CONFLICT => {
                let current = response.headers()[lock_fence::http::TOKEN_HEADER]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                Ok(FenceOutcome::Refused { current })
            }
            other => Err(format!("status {other}")),
        }
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        Ok(self.store.lock().unwrap().get(resource).cloned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_layer() {
    let http = |layer| {
        Arc::new(Http {
            store: Store::default(),
            layer,
        })
    };
    run_fence_cases(http(Some(lock_fence::http::FencingLayer::new())))
        .await
        .assert_passed();
    assert_unchecked_fails(&run_fence_cases(http(None)).await);
}

#[tokio::test]
async fn http_layer_refuses_bad_and_missing_tokens_when_asked() {
    use tower::ServiceExt;
    let handler = tower::service_fn(|_: http::Request<String>| async {
        Ok::<_, Infallible>(http::Response::new(String::new()))
    });
    let service = tower::ServiceBuilder::new()
        .layer(lock_fence::http::FencingLayer::new().require_token())
        .service(handler);
    let missing = service
        .clone()
        .oneshot(
            http::Request::builder()
                .uri("/x")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(missing.status(), http::StatusCode::PRECONDITION_REQUIRED);
    let bad = service
        .oneshot(
            http::Request::builder()
                .uri("/x")
                .header("fencing-token", "soon")
                .body(String::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(bad.status(), http::StatusCode::BAD_REQUEST);
}
