//! `distlock list` (every shape of lock, and elections, under a prefix)
//! and `distlock leader`.

use std::collections::BTreeMap;

use lock_core::{
    ErrorKind, FencingToken, ListQuery, LockBackendExt, LockClient, LockError, LockKey, LockShape,
    MAX_LIST_PAGE, Operation,
    election::{ElectionInfo, Leader},
};
use serde_json::{Value, json};

use crate::admin::{
    details_json, details_text, holder_json, holder_line, info_json, info_line, token_text,
    ttl_text,
};

/// What `list --shape` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ListShape {
    /// Mutexes.
    Mutex,
    /// Read-write locks (readers and writers).
    Rwlock,
    /// Semaphores (permit holders).
    Semaphore,
    /// Elections with a leader.
    Election,
    /// All of them (shapes the backend does not list are said on stderr).
    All,
}

impl ListShape {
    fn name(self) -> &'static str {
        match self {
            Self::Mutex => "mutex",
            Self::Rwlock => "rwlock",
            Self::Semaphore => "semaphore",
            Self::Election => "election",
            Self::All => "all",
        }
    }
}

/// What `list` found of one shape.
#[derive(Default)]
struct Found {
    /// One JSON value per lock or election.
    json: Vec<Value>,
    /// Where the next page starts.
    cursor: Option<String>,
}

/// `distlock leader NAME`: the election's current leader, with its term
/// and who campaigned.
pub(crate) async fn leader(client: &LockClient, name: &str, json: bool) -> Result<u8, LockError> {
    let backend = client.backend();
    let election = LockKey::new(name).map_err(|e| e.with_backend(backend.name()))?;
    let leader = backend.leader(&election).await?;
    if json {
        let value = match &leader {
            Some(l) => leader_json(&election, l),
            None => json!({ "election": name, "leader": Value::Null }),
        };
        println!("{value}");
    } else {
        match &leader {
            Some(l) => println!("{}", leader_line(&election, l)),
            None => println!("{name} has no leader"),
        }
    }
    Ok(0)
}

fn leader_json(election: &LockKey, l: &Leader) -> Value {
    json!({
        "election": election.as_str(),
        "leader": {
            "holder": l.holder,
            "term": l.term.map(FencingToken::get),
            "remaining_ttl_ms": l.remaining_ttl.map(|d| d.as_millis()),
            "details": details_json(l.details.as_ref()),
        },
    })
}

fn leader_line(election: &LockKey, l: &Leader) -> String {
    format!(
        "election {election} led by {} term {} ttl {}{}",
        l.holder,
        token_text(l.term),
        ttl_text(l.remaining_ttl),
        details_text(l.details.as_ref())
    )
}

/// One kind of thing `list` pages through.
#[derive(Clone, Copy)]
enum Listed {
    Mutex,
    Shared(LockShape),
    Election,
}

impl Listed {
    fn name(self) -> &'static str {
        match self {
            Self::Mutex => "mutex",
            Self::Shared(shape) => shape.as_str(),
            Self::Election => "election",
        }
    }
}

/// One page of `listed` from `cursor`, printed as text unless `json`.
async fn page(
    client: &LockClient,
    listed: Listed,
    prefix: &str,
    cursor: Option<&str>,
    limit: usize,
    json: bool,
) -> Result<Found, LockError> {
    let backend = client.backend();
    let mut found = Found::default();
    match listed {
        Listed::Mutex => {
            let page = backend
                .list(&ListQuery::new(prefix, limit).after(cursor))
                .await?;
            for info in &page.locks {
                if !json {
                    println!("{}", info_line(info));
                }
                found.json.push(info_json(info));
            }
            found.cursor = page.cursor;
        }
        Listed::Shared(shape) => {
            let page = backend
                .list_shared(shape, &ListQuery::new(prefix, limit).after(cursor))
                .await?;
            for lock in &page.locks {
                if !json {
                    for h in &lock.holders {
                        println!("{}", holder_line(&lock.key, shape, h));
                    }
                }
                found.json.push(json!({
                    "key": lock.key.as_str(),
                    "shape": shape.as_str(),
                    "holders": lock.holders.iter().map(|h| holder_json(shape, h)).collect::<Vec<_>>(),
                }));
            }
            found.cursor = page.cursor;
        }
        Listed::Election => {
            let page = backend
                .list_elections(&ListQuery::new(prefix, limit).after(cursor))
                .await?;
            for ElectionInfo { election, leader } in &page.elections {
                if !json {
                    println!("{}", leader_line(election, leader));
                }
                found.json.push(leader_json(election, leader));
            }
            found.cursor = page.cursor;
        }
    }
    Ok(found)
}

/// `distlock list`: one page of each shape asked for (from `cursor` when
/// one shape is), or with `all` every page (at most `MAX_PAGES` a shape).
/// Under `--shape all` a shape the backend does not list is said on
/// stderr and skipped; asked for by name, it is the command's error.
pub(crate) async fn list(client: &LockClient, request: ListRequest<'_>) -> Result<u8, LockError> {
    const MAX_PAGES: usize = 10_000;
    let ListRequest {
        prefix,
        shape,
        limit,
        cursor,
        all,
        json,
    } = request;
    if cursor.is_some() && shape == ListShape::All {
        return Err(LockError::new(
            ErrorKind::InvalidArgument,
            Operation::Inspect,
            "--cursor continues one shape's listing: pass its --shape too (as the `more:` line says)",
        ));
    }
    let caps = client.capabilities();
    let rwlock = Listed::Shared(LockShape::ReadWrite);
    let semaphore = Listed::Shared(LockShape::Semaphore);
    let shapes: Vec<Listed> = match shape {
        ListShape::All => [
            (Listed::Mutex, true),
            (rwlock, caps.shared_locks),
            (semaphore, caps.semaphores),
            (Listed::Election, true),
        ]
        .into_iter()
        .filter_map(|(s, has)| has.then_some(s))
        .collect(),
        ListShape::Mutex => vec![Listed::Mutex],
        ListShape::Rwlock => vec![rwlock],
        ListShape::Semaphore => vec![semaphore],
        ListShape::Election => vec![Listed::Election],
    };
    let limit = limit.clamp(1, MAX_LIST_PAGE);
    let mut results: BTreeMap<&str, Found> = BTreeMap::new();
    let mut unsupported = BTreeMap::new();
    for one in shapes {
        let mut found = Found::default();
        let mut at = cursor.clone();
        for _ in 0..MAX_PAGES {
            let mut next = match page(client, one, prefix, at.as_deref(), limit, json).await {
                Ok(next) => next,
                Err(e) if e.kind() == ErrorKind::Unsupported && shape == ListShape::All => {
                    eprintln!("distlock: {} not listed: {e}", one.name());
                    unsupported.insert(one.name(), e.to_string());
                    break;
                }
                Err(e) => return Err(e),
            };
            found.json.append(&mut next.json);
            found.cursor = next.cursor;
            at.clone_from(&found.cursor);
            if !all || found.cursor.is_none() {
                break;
            }
        }
        results.insert(one.name(), found);
    }
    if json {
        let mut value = json!({ "prefix": prefix, "shape": shape.name() });
        let cursors: BTreeMap<_, _> = results
            .iter()
            .map(|(k, f)| (*k, f.cursor.clone()))
            .collect();
        for (name, found) in results {
            let field = match name {
                "mutex" => "locks",
                "election" => "elections",
                _ => name,
            };
            value[field] = Value::Array(found.json);
        }
        // `cursor`: the mutex listing's, as before shapes were listed.
        value["cursor"] = json!(cursors.get("mutex").cloned().flatten());
        value["cursors"] = json!(cursors);
        value["unsupported"] = json!(unsupported);
        println!("{value}");
    } else {
        if results.values().all(|f| f.json.is_empty()) {
            println!("no lock held under {prefix:?} on this page");
        }
        for (name, found) in &results {
            if let Some(cursor) = &found.cursor {
                println!("more: --shape {name} --cursor {cursor}");
            }
        }
    }
    Ok(0)
}

/// `distlock list`'s arguments.
pub(crate) struct ListRequest<'a> {
    pub(crate) prefix: &'a str,
    pub(crate) shape: ListShape,
    pub(crate) limit: usize,
    pub(crate) cursor: Option<String>,
    pub(crate) all: bool,
    pub(crate) json: bool,
}
