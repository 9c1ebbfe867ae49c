//! Leader election over a renewed lock: one leader at a time, terms that
//! strictly increase, observers that follow, a cancelled campaign that
//! never leads, and a Lost signal when leadership cannot be kept.

use std::time::Duration;

use lock_core::{LockClient, LockState, MemoryBackend, MemoryFault};

#[tokio::test]
async fn one_leader_terms_increase_and_observers_follow() {
    let service = MemoryBackend::new();
    let a = LockClient::new(service.clone());
    let b = LockClient::new(service.clone());
    let mut observed = a.observe_leader("jobs", Duration::from_millis(10));
    let first = a.elect("jobs").campaign().await.unwrap();
    assert!(first.is_leader());
    let b2 = b.clone();
    let second = tokio::spawn(async move { b2.elect("jobs").campaign().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!second.is_finished(), "two leaders at once");
    let leader = b.leader("jobs").await.unwrap().unwrap();
    assert_eq!(leader.term, Some(first.term()));
    observed
        .wait_for(|l| l.as_ref().is_some_and(|l| l.term == Some(first.term())))
        .await
        .unwrap();
    let term = first.term();
    assert!(first.resign().await.unwrap());
    let second = second.await.unwrap().unwrap();
    assert!(second.term() > term, "terms must increase");
    observed
        .wait_for(|l| l.as_ref().is_some_and(|l| l.term == Some(second.term())))
        .await
        .unwrap();
    second.resign().await.unwrap();
    assert!(a.leader("jobs").await.unwrap().is_none());
}

#[tokio::test]
async fn a_cancelled_campaign_never_leads() {
    let service = MemoryBackend::new();
    let a = LockClient::new(service.clone());
    let b = LockClient::new(service.clone());
    let leading = a.elect("e").campaign().await.unwrap();
    let campaign = b.elect("e").campaign();
    assert!(
        tokio::time::timeout(Duration::from_millis(50), campaign)
            .await
            .is_err()
    );
    leading.resign().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        b.leader("e").await.unwrap().is_none(),
        "the withdrawn candidate leads"
    );
    let err = b
        .elect("e")
        .wait(Duration::ZERO)
        .campaign()
        .await
        .map(|l| l.term());
    assert!(err.is_ok());
}

#[tokio::test]
async fn leadership_that_cannot_be_renewed_is_lost_before_its_deadline() {
    let service = MemoryBackend::with_op_timeout(Duration::from_millis(50));
    let a = LockClient::new(service.clone());
    let leader = a
        .elect("e")
        .ttl(Duration::from_millis(300))
        .campaign()
        .await
        .unwrap();
    let deadline = leader.guard().validity_deadline();
    service.set_fault(MemoryFault::Unavailable);
    let reason = leader.lost().await;
    assert!(
        tokio::time::Instant::now() <= deadline + Duration::from_millis(20),
        "{reason}"
    );
    assert!(matches!(leader.state(), LockState::Lost(_)));
    assert!(!leader.is_leader());
    let err = leader.run(async {}).await.unwrap_err();
    assert!(err.is_lost());
}
