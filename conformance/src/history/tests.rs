//! Unit tests of the history checker.

use super::*;

fn ev(at: u64, process: u64, kind: EventKind, op: Op, token: u64, until: Option<u64>) -> Event {
    Event {
        at: Duration::from_millis(at),
        process,
        kind,
        op,
        key: "k".into(),
        token: Some(token),
        valid_until: until.map(Duration::from_millis),
        grant: None,
    }
}

fn grant(at: u64, process: u64, code: &str, token: u64, until: u64) -> Event {
    Event {
        grant: Some(code.to_owned()),
        ..ev(at, process, EventKind::Ok, Op::Acquire, token, Some(until))
    }
}

/// Readers may overlap readers and permits permits up to their limit;
/// a writer beside anyone, one permit too many, or a read token that is
/// not the write epoch are each reported.
#[test]
fn shared_grants_are_judged_by_kind() {
    let readers = [grant(0, 1, "r", 0, 100), grant(10, 2, "r", 0, 100)];
    let report = check(&readers);
    assert!(report.is_safe_with_fencing(), "{}", report.summary());
    assert_eq!(report.max_concurrent_readers, 2);
    let writer_beside = [grant(0, 1, "r", 0, 100), grant(10, 2, "w", 5, 100)];
    assert_eq!(check(&writer_beside).overlap_count, 1);
    let epoch = [
        grant(0, 1, "w", 7, 50),
        grant(60, 2, "r", 7, 100),
        grant(70, 3, "r", 6, 100),
    ];
    let report = check(&epoch);
    assert_eq!(report.read_token_mismatches, 1, "{}", report.summary());
    assert!(report.is_exclusive());
    let permits = [
        grant(0, 1, "p2-3", 1, 100),
        grant(10, 2, "p1-3", 2, 100),
        grant(20, 3, "p1-3", 3, 100),
    ];
    let report = check(&permits);
    assert_eq!(report.permits_over_limit, 1);
    assert_eq!(report.max_permits_held, 4);
    assert!(!report.is_exclusive());
    assert!(check(&permits[..2]).is_exclusive());
}

#[test]
fn sequential_holds_are_clean() {
    use EventKind::*;
    let events = vec![
        ev(0, 1, Ok, Op::Acquire, 1, Some(100)),
        ev(10, 1, Invoke, Op::Release, 1, None),
        ev(12, 2, Ok, Op::Acquire, 2, Some(112)),
        ev(200, 3, Ok, Op::Acquire, 3, Some(300)),
    ];
    let report = check(&events);
    assert!(report.is_safe_with_fencing(), "{}", report.summary());
    assert_eq!(report.max_concurrent_holders, 1);
    assert_eq!(report.grants, 3);
}

#[test]
fn overlap_and_regression_are_reported() {
    use EventKind::*;
    let events = vec![
        ev(0, 1, Ok, Op::Acquire, 5, Some(100)),
        ev(50, 2, Ok, Op::Acquire, 4, Some(150)),
    ];
    let report = check(&events);
    assert_eq!(report.overlap_count, 1);
    assert_eq!(report.max_concurrent_holders, 2);
    assert_eq!(report.token_regressions, 1);
    assert!(!report.is_exclusive());
}

#[test]
fn renewal_extends_and_lost_cuts_the_window() {
    use EventKind::*;
    let events = vec![
        ev(0, 1, Ok, Op::Acquire, 1, Some(100)),
        ev(50, 1, Ok, Op::Renew, 1, Some(200)),
        ev(150, 2, Ok, Op::Acquire, 2, Some(250)),
    ];
    assert_eq!(
        check(&events).overlap_count,
        1,
        "renewed window still open at 150"
    );
    let events = vec![
        ev(0, 1, Ok, Op::Acquire, 1, Some(100)),
        ev(50, 1, Ok, Op::Renew, 1, Some(200)),
        ev(120, 1, Info, Op::Lost, 1, None),
        ev(150, 2, Ok, Op::Acquire, 2, Some(250)),
    ];
    assert_eq!(check(&events).overlap_count, 0, "lost at 120 closed it");
}

fn write(at: u64, process: u64, token: Option<u64>) -> Event {
    Event {
        at: Duration::from_millis(at),
        process,
        kind: EventKind::Ok,
        op: Op::Write,
        key: "k".into(),
        token,
        valid_until: None,
        grant: None,
    }
}

#[test]
fn a_paused_holders_late_write_is_judged_by_grant_order() {
    use EventKind::*;
    // Process 1 holds until 100 and is paused; process 2 is granted at
    // 150 and writes; process 1 wakes at 300 and writes with its token.
    let mut events = vec![
        ev(0, 1, Ok, Op::Acquire, 1, Some(100)),
        write(10, 1, Some(1)),
        ev(150, 2, Ok, Op::Acquire, 2, Some(250)),
        write(160, 2, Some(2)),
        write(300, 1, Some(1)),
    ];
    let fenced = check(&events);
    assert_eq!(fenced.stale_writes_accepted, 0, "{}", fenced.summary());
    assert_eq!(fenced.writes_rejected, 1);
    assert_eq!(fenced.current_holder_writes_rejected, 0);
    assert_eq!(fenced.writes_outside_window, 1);
    // Without tokens a resource cannot tell: the stale write gets in.
    for e in &mut events {
        if e.op == Op::Write {
            e.token = None;
        }
    }
    let unfenced = check(&events);
    assert_eq!(unfenced.stale_writes_accepted, 1, "{}", unfenced.summary());
    assert!(!unfenced.is_exclusive());
}

#[test]
fn an_older_grants_write_refused_inside_its_window_is_fencing_at_work() {
    use EventKind::*;
    // Process 1's promised window (an upper bound of a paused holder's
    // deadline, not aligned to a renewal) runs to 200; process 2 is granted
    // at 100 and writes; a write process 1 made before its pause is
    // recorded at 120, after process 2's: refused by the newer token, as
    // fencing should, although process 1's window is still open.
    let events = vec![
        ev(0, 1, Ok, Op::Acquire, 1, Some(200)),
        write(10, 1, Some(1)),
        ev(100, 2, Ok, Op::Acquire, 2, Some(300)),
        write(110, 2, Some(2)),
        write(120, 1, Some(1)),
    ];
    let report = check(&events);
    assert_eq!(report.overlap_count, 1, "{}", report.summary());
    assert_eq!(report.writes_rejected, 1);
    assert_eq!(report.writes_outside_window, 0);
    assert_eq!(
        report.current_holder_writes_rejected,
        0,
        "{}",
        report.summary()
    );
    assert_eq!(report.stale_writes_accepted, 0);
}

#[test]
fn a_token_that_went_backwards_lets_the_stale_write_in() {
    use EventKind::*;
    // The later grant got a lower token: its own write is accepted
    // (first write), and the stale holder's higher token then passes.
    let events = vec![
        ev(0, 1, Ok, Op::Acquire, 5, Some(100)),
        ev(150, 2, Ok, Op::Acquire, 3, Some(250)),
        write(160, 2, Some(3)),
        write(300, 1, Some(5)),
    ];
    let report = check(&events);
    assert_eq!(report.stale_writes_accepted, 1, "{}", report.summary());
    assert_eq!(report.token_regressions, 1);
}

#[test]
fn a_holder_writing_again_with_its_token_is_not_rejected() {
    use EventKind::*;
    let events = vec![
        ev(0, 1, Ok, Op::Acquire, 3, Some(100)),
        write(10, 1, Some(3)),
        write(20, 1, Some(3)),
        write(30, 1, Some(3)),
    ];
    let report = check(&events);
    assert_eq!(report.writes_rejected, 0, "{}", report.summary());
    assert!(report.is_safe_with_fencing());
}

#[test]
fn a_grant_past_its_deadline_is_reported() {
    use EventKind::*;
    let events = vec![ev(50, 1, Ok, Op::Acquire, 1, Some(40))];
    let report = check(&events);
    assert_eq!(report.grants_past_deadline, 1);
    assert!(!report.is_exclusive());
}

#[test]
fn a_current_holders_rejected_write_is_reported() {
    use EventKind::*;
    let events = vec![
        ev(0, 1, Ok, Op::Acquire, 5, Some(100)),
        write(10, 1, Some(5)),
        ev(101, 2, Ok, Op::Acquire, 4, Some(200)),
        write(110, 2, Some(4)),
    ];
    let report = check(&events);
    assert_eq!(report.current_holder_writes_rejected, 1);
    assert!(!report.is_safe_with_fencing());
}

#[test]
fn fenced_resource_rejects_stale_tokens() {
    let history = Arc::new(History::new());
    let rec = history.process();
    let key = LockKey::new("k").unwrap();
    let resource = FencedResource::new();
    assert!(resource.write(&rec, &key, FencingToken::new(2), |v| *v += 1));
    assert!(!resource.write(&rec, &key, FencingToken::new(1), |v| *v += 1));
    assert!(!resource.write(&rec, &key, FencingToken::new(2), |v| *v += 1));
    assert!(resource.write(&rec, &key, FencingToken::new(3), |v| *v += 1));
    assert_eq!(resource.value(), 2);
    assert_eq!(resource.rejected(), 2);
    let report = history.check();
    assert_eq!(report.stale_writes_accepted, 0);
    // The checker's rule rejects only the lower token; the repeated 2
    // reads as the same holder writing again.
    assert_eq!(report.writes_rejected, 1);
}
