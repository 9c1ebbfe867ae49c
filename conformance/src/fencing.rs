//! Cases for the resource side of fencing: a store that accepts a write
//! only when its token is not below the last token it accepted for that
//! resource. Any adapter (a SQL table, a Redis script, an HTTP service, a
//! file) plugs in through [`FencedResource`]; [`run_fence_cases`] runs
//! every case and [`CasesReport::assert_passed`] fails the test.
//!
//! The rule the cases hold adapters to: a token **below** the last accepted
//! one is refused with the current token (never reported as "0 rows"); an
//! **equal** token is accepted (the same grant writing again); a higher one
//! is accepted and becomes the last. Resources are independent.

pub mod guarded;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

/// What a fenced write answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceOutcome {
    /// The write landed; its token is now the resource's last.
    Accepted,
    /// The write was refused: `current` is the resource's last token.
    Refused {
        /// The last token the resource accepted.
        current: u64,
    },
}

/// A store whose writes carry a fencing token.
#[async_trait]
pub trait FencedResource: Send + Sync {
    /// A name for reports.
    fn name(&self) -> String;

    /// Writes `value` to `resource` under `token`.
    ///
    /// # Errors
    ///
    /// Anything but a refusal (a refusal is `Ok(Refused)`).
    async fn write(&self, resource: &str, token: u64, value: &str) -> Result<FenceOutcome, String>;

    /// The value `resource` holds (`None` before any write).
    ///
    /// # Errors
    ///
    /// The store's errors.
    async fn read(&self, resource: &str) -> Result<Option<String>, String>;
}

type CaseResult = Result<(), String>;

/// One case's result. `T` is what a case that did not fail says: `()`
/// for the fencing cases; for the guarded writes, `Some(why)` when the
/// case does not apply to the backend.
#[derive(Clone, Debug)]
pub struct NamedCaseResult<T> {
    /// The case.
    pub name: &'static str,
    /// `Err` with what went wrong.
    pub result: Result<T, String>,
}

/// Every case's result against one resource or store.
#[derive(Clone, Debug)]
pub struct CasesReport<T> {
    /// The resource's or store's name.
    pub subject: String,
    /// What the cases check ("fencing", "guarded-write"), for the failure
    /// message.
    pub checks: &'static str,
    /// The cases, in order.
    pub cases: Vec<NamedCaseResult<T>>,
}

impl<T> CasesReport<T> {
    /// The names of the failed cases.
    pub fn failed(&self) -> Vec<&'static str> {
        self.cases
            .iter()
            .filter(|c| c.result.is_err())
            .map(|c| c.name)
            .collect()
    }

    /// Panics naming every failed case and why.
    pub fn assert_passed(&self) {
        let failures: Vec<String> = self
            .cases
            .iter()
            .filter_map(|c| c.result.as_ref().err().map(|e| format!("{}: {e}", c.name)))
            .collect();
        assert!(
            failures.is_empty(),
            "{}: {} cases failed:\n{}",
            self.subject,
            self.checks,
            failures.join("\n")
        );
    }
}

/// One fencing case's result.
pub type FenceCaseResult = NamedCaseResult<()>;

/// Every fencing case's result against one resource.
pub type FenceReport = CasesReport<()>;

/// A stamp for the names of one run's keys and resources (nanoseconds
/// since the epoch), so that a store can be reused.
fn run_stamp() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default()
}

/// The case names, in the order [`run_fence_cases`] runs them.
pub const FENCE_CASES: &[&str] = &[
    "in_order_writes_are_accepted",
    "stale_write_is_refused_with_the_current_token",
    "equal_token_is_accepted",
    "resources_are_independent",
    "racing_writers_leave_the_highest_token",
];

/// Runs every fencing case against `store`, each on resources of its own
/// (named after the case and the time, so a store can be reused).
pub async fn run_fence_cases(store: Arc<dyn FencedResource>) -> FenceReport {
    let run = run_stamp();
    let mut cases = Vec::new();
    for &name in FENCE_CASES {
        let resource = format!("fence-{run}-{name}");
        let result = match name {
            "in_order_writes_are_accepted" => in_order(&*store, &resource).await,
            "stale_write_is_refused_with_the_current_token" => stale(&*store, &resource).await,
            "equal_token_is_accepted" => equal(&*store, &resource).await,
            "resources_are_independent" => independent(&*store, &resource).await,
            _ => racing(store.clone(), &resource).await,
        };
        cases.push(FenceCaseResult { name, result });
    }
    FenceReport {
        subject: store.name(),
        checks: "fencing",
        cases,
    }
}

async fn expect_accepted(
    store: &dyn FencedResource,
    r: &str,
    token: u64,
    value: &str,
) -> CaseResult {
    match store.write(r, token, value).await? {
        FenceOutcome::Accepted => Ok(()),
        other => Err(format!(
            "token {token} on {r}: expected accepted, got {other:?}"
        )),
    }
}

async fn expect_value(store: &dyn FencedResource, r: &str, want: &str) -> CaseResult {
    let got = store.read(r).await?;
    if got.as_deref() == Some(want) {
        Ok(())
    } else {
        Err(format!("{r} holds {got:?}, expected {want:?}"))
    }
}

async fn in_order(store: &dyn FencedResource, r: &str) -> CaseResult {
    for token in [1, 2, 7, 1 << 56, (1 << 56) + 1] {
        expect_accepted(store, r, token, &format!("v{token}")).await?;
    }
    expect_value(store, r, &format!("v{}", (1u64 << 56) + 1)).await
}

async fn stale(store: &dyn FencedResource, r: &str) -> CaseResult {
    expect_accepted(store, r, 5, "five").await?;
    match store.write(r, 3, "three").await? {
        FenceOutcome::Refused { current: 5 } => {}
        other => {
            return Err(format!(
                "token 3 after 5: expected Refused {{ current: 5 }}, got {other:?}"
            ));
        }
    }
    expect_value(store, r, "five").await?;
    // Close to the top of the range (a migration's epoch tokens).
    let high = (1u64 << 56) + 2;
    expect_accepted(store, r, high, "high").await?;
    match store.write(r, high - 1, "lower").await? {
        FenceOutcome::Refused { current } if current == high => {}
        other => return Err(format!("token {} after {high}: got {other:?}", high - 1)),
    }
    expect_value(store, r, "high").await
}

async fn equal(store: &dyn FencedResource, r: &str) -> CaseResult {
    expect_accepted(store, r, 4, "first").await?;
    expect_accepted(store, r, 4, "second").await?;
    expect_value(store, r, "second").await
}

async fn independent(store: &dyn FencedResource, r: &str) -> CaseResult {
    let other = format!("{r}-other");
    expect_accepted(store, r, 9, "a").await?;
    expect_accepted(store, &other, 1, "b").await?;
    expect_value(store, r, "a").await?;
    expect_value(store, &other, "b").await
}

/// Twenty writers with tokens 1..=20 race (spawned highest first, so most
/// arrive out of order): whatever the interleaving, the resource ends with
/// the value of token 20, and a writer refused was told a current token
/// above its own.
async fn racing(store: Arc<dyn FencedResource>, r: &str) -> CaseResult {
    let mut tasks = Vec::new();
    for token in (1..=20u64).rev() {
        let store = store.clone();
        let r = r.to_owned();
        tasks.push(tokio::spawn(async move {
            (token, store.write(&r, token, &format!("v{token}")).await)
        }));
    }
    let mut refused = 0;
    for task in tasks {
        let (token, outcome) = task.await.map_err(|e| format!("writer panicked: {e}"))?;
        match outcome? {
            FenceOutcome::Accepted => {}
            FenceOutcome::Refused { current } if current > token => refused += 1,
            FenceOutcome::Refused { current } => {
                return Err(format!(
                    "token {token} refused with current {current}, not above it"
                ));
            }
        }
    }
    expect_value(&*store, r, "v20").await?;
    if refused == 0 {
        // Every write landed in order: possible, but then token 20 was last.
        tracing::debug!("no racing write was refused");
    }
    Ok(())
}

/// A fenced resource in memory that keeps the rule (or, built with
/// [`unchecked`](Self::unchecked), accepts every write): the reference the
/// adapters are compared with, and a store for tests that need one.
#[derive(Debug, Default)]
pub struct MemoryFenced {
    unchecked: bool,
    state: std::sync::Mutex<std::collections::HashMap<String, (u64, String)>>,
}

impl MemoryFenced {
    /// Keeps the rule.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts every write (a resource that does not check tokens).
    pub fn unchecked() -> Self {
        Self {
            unchecked: true,
            ..Self::default()
        }
    }
}

#[async_trait]
impl FencedResource for MemoryFenced {
    fn name(&self) -> String {
        if self.unchecked {
            "memory (unchecked)"
        } else {
            "memory"
        }
        .to_owned()
    }

    async fn write(&self, resource: &str, token: u64, value: &str) -> Result<FenceOutcome, String> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((last, _)) = state.get(resource)
            && token < *last
            && !self.unchecked
        {
            return Ok(FenceOutcome::Refused { current: *last });
        }
        state.insert(resource.to_owned(), (token, value.to_owned()));
        Ok(FenceOutcome::Accepted)
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        let state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(state.get(resource).map(|(_, v)| v.clone()))
    }
}
