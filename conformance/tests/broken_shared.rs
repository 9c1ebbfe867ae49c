//! Proof that the read-write lock and semaphore checks can fail: broken
//! backends on the in-memory service, each caught by the case written for
//! its mistake (the same cases pass on the correct memory backend, see
//! `memory_suite`).
//!
//! - `ReaderBesideWriter` grants a read share that conflicts with a writer.
//! - `OnePermitTooMany` grants permits past the semaphore's limit.
//! - `ReadsAreWrites` serves every read as a write (readers never share).
//! - `ReadTokenOff` hands readers a token that is not the write epoch's.
//! - `DowngradeGap` downgrades by releasing and re-acquiring.
//! - `PollingWriters` lets a waiting writer poll instead of queueing.

use std::sync::Arc;

use conformance::cases::{self, CaseResult};
use conformance::doubles::{Flaw, FlawedTarget, rogue_lease};
use conformance::{Harness, SuiteConfig};
use lock_core::{FencingToken, Lease, LeaseKind, LockKey};

#[derive(Debug)]
enum Broken {
    ReaderBesideWriter,
    OnePermitTooMany,
    ReadsAreWrites,
    ReadTokenOff,
    DowngradeGap,
    PollingWriters,
}

impl Flaw for Broken {
    fn name(&self) -> &'static str {
        "broken-shared"
    }

    fn grant(&self, lease: Lease) -> Lease {
        match self {
            Self::ReadTokenOff if lease.kind() == LeaseKind::Read => Lease::from_parts(
                lease.key().clone(),
                lease.owner(),
                FencingToken::new(lease.token().get() + 1),
                lease.ttl(),
                lease.validity_deadline(),
                lease.backend_data().to_owned(),
            )
            .with_kind(LeaseKind::Read),
            _ => lease,
        }
    }

    fn inner_kind(&self, kind: LeaseKind) -> LeaseKind {
        match (self, kind) {
            (Self::ReadsAreWrites, LeaseKind::Read) => LeaseKind::Write,
            _ => kind,
        }
    }

    fn contended_kind(
        &self,
        key: &LockKey,
        kind: LeaseKind,
        ttl: std::time::Duration,
    ) -> Option<Lease> {
        let rogue = |kind| {
            rogue_lease(key, ttl, FencingToken::new(0))
                .ok()
                .map(|l| l.with_kind(kind))
        };
        match (self, kind) {
            (Self::ReaderBesideWriter, LeaseKind::Read) => rogue(kind),
            (Self::OnePermitTooMany, LeaseKind::Permits { .. }) => rogue(kind),
            _ => None,
        }
    }

    fn downgrade_with_gap(&self) -> bool {
        matches!(self, Self::DowngradeGap)
    }

    fn writers_poll(&self) -> bool {
        matches!(self, Self::PollingWriters)
    }
}

fn harness(flaw: Broken) -> Harness {
    Harness::with_config(
        Arc::new(FlawedTarget::new(flaw)),
        SuiteConfig {
            iterations: 15,
            ..SuiteConfig::default()
        },
    )
}

fn assert_failed(outcome: CaseResult, what: &str) {
    println!("{what}: {outcome:?}");
    assert!(outcome.is_err(), "{what} was not caught: {outcome:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_beside_a_writer_is_caught() {
    let h = harness(Broken::ReaderBesideWriter);
    assert_failed(
        cases::readers_share_writers_exclude(&h).await,
        "reader beside writer",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_that_grants_one_too_many_is_caught() {
    let h = harness(Broken::OnePermitTooMany);
    assert_failed(
        cases::permits_never_exceed_limit(&h).await,
        "permits past the limit",
    );
    assert_failed(
        cases::semaphore_limits_are_checked(&h).await,
        "permits past the limit (limits case)",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_that_never_share_are_caught() {
    let h = harness(Broken::ReadsAreWrites);
    assert_failed(
        cases::readers_share_writers_exclude(&h).await,
        "serialised readers",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_tokens_off_the_write_epoch_are_caught() {
    let h = harness(Broken::ReadTokenOff);
    assert_failed(
        cases::readers_share_writers_exclude(&h).await,
        "read tokens off the epoch",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_with_a_gap_is_caught() {
    let h = harness(Broken::DowngradeGap);
    assert_failed(cases::downgrade_leaves_no_gap(&h).await, "downgrade gap");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_starved_by_readers_are_caught() {
    let h = harness(Broken::PollingWriters);
    assert_failed(
        cases::writers_are_not_starved(&h).await,
        "writer starvation",
    );
}
