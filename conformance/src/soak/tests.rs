//! Attribution of violations to faults, on synthetic histories: a fault
//! excuses only the violations it covers.

use std::time::Duration;

use lock_core::{Capabilities, FencingScope};

use super::*;
use crate::history::{Event, EventKind, Op, check};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn event(process: u64, at: u64, op: Op, token: u64, valid_until: Option<u64>) -> Event {
    Event {
        at: ms(at),
        process,
        kind: EventKind::Ok,
        op,
        key: "k".into(),
        token: Some(token),
        valid_until: valid_until.map(ms),
        grant: None,
    }
}

/// Process 0 is granted at 100 ms until 1100 ms, process 1 at 500 ms
/// until 1500 ms: a double grant made at 500 ms, the windows overlapping
/// until 1100 ms.
fn double_grant() -> Vec<Event> {
    vec![
        event(0, 100, Op::Acquire, 1, Some(1100)),
        event(1, 500, Op::Acquire, 2, Some(1500)),
    ]
}

fn fault(kind: FaultKind, target: usize, start: u64, end: u64) -> InjectedFault {
    InjectedFault {
        kind,
        target,
        start: ms(start),
        end: ms(end),
    }
}

/// Tokens, but not across a restart (Redis without persistence): a
/// restart is a known unsafe case, a server pause is not.
fn tokens_lost_on_restart() -> Capabilities {
    Capabilities {
        fencing: FencingScope::PerKey,
        fencing_survives_failover: false,
        ..Capabilities::minimal()
    }
}

/// No tokens at all (Redlock): client freezes, partitions and latency are
/// known unsafe cases too.
fn no_fencing() -> Capabilities {
    Capabilities {
        fencing: FencingScope::None,
        fencing_survives_failover: false,
        ..Capabilities::minimal()
    }
}

fn judge(caps: &Capabilities, injected: &[InjectedFault], events: &[Event]) -> Vec<Violation> {
    judge_with_lost(caps, injected, events, &[])
}

fn judge_with_lost(
    caps: &Capabilities,
    injected: &[InjectedFault],
    events: &[Event],
    lost: &[LostIncrement],
) -> Vec<Violation> {
    let judged = Judged {
        caps,
        injected,
        workers: &[0, 1, 2, 3],
    };
    let stale = stale_writes(events);
    judged.violations(&check(events), &observed_in(events), events, lost, &stale)
}

fn the(what: &str, violations: &[Violation]) -> Violation {
    let found: Vec<&Violation> = violations.iter().filter(|v| v.what == what).collect();
    assert_eq!(found.len(), 1, "one {what} expected: {violations:?}");
    found[0].clone()
}

#[test]
fn an_unsafe_fault_after_the_double_grant_does_not_excuse_it() {
    let caps = tokens_lost_on_restart();
    assert!(known_unsafe(FaultKind::ServerRestart, &caps).is_some());
    // The restart comes while both hold, after the second grant: it
    // overlaps the violation (100..1100 ms) but cannot have made it.
    let injected = [fault(FaultKind::ServerRestart, 0, 700, 800)];
    let overlap = the("overlap", &judge(&caps, &injected, &double_grant()));
    assert!(!overlap.expected, "{overlap:?}");
    assert!(overlap.faults.is_empty(), "{overlap:?}");
    // Nor does one that was over before the first grant.
    let injected = [fault(FaultKind::ServerRestart, 0, 20, 80)];
    let overlap = the("overlap", &judge(&caps, &injected, &double_grant()));
    assert!(!overlap.expected, "{overlap:?}");
}

#[test]
fn an_unsafe_fault_between_the_two_grants_excuses_the_double_grant() {
    let caps = tokens_lost_on_restart();
    let injected = [fault(FaultKind::ServerRestart, 0, 300, 350)];
    let overlap = the("overlap", &judge(&caps, &injected, &double_grant()));
    assert!(overlap.expected, "{overlap:?}");
    assert_eq!(overlap.faults, vec![FaultKind::ServerRestart]);
    // Still active at the second grant, though begun before the first.
    let injected = [fault(FaultKind::ServerRestart, 0, 50, 500)];
    assert!(the("overlap", &judge(&caps, &injected, &double_grant())).expected);
}

#[test]
fn a_harmless_fault_covering_the_double_grant_does_not_excuse_it() {
    let caps = tokens_lost_on_restart();
    assert!(known_unsafe(FaultKind::ServerPause, &caps).is_none());
    let injected = [fault(FaultKind::ServerPause, 0, 300, 350)];
    let overlap = the("overlap", &judge(&caps, &injected, &double_grant()));
    assert!(!overlap.expected, "{overlap:?}");
    assert_eq!(overlap.faults, vec![FaultKind::ServerPause]);
}

/// Redis (single, Sentinel): tokens per key, lost with the data on a
/// restart or a failover, not linearizable.
fn redis() -> Capabilities {
    Capabilities {
        fencing: FencingScope::PerKey,
        fencing_survives_failover: false,
        grants_survive_restart: false,
        linearizable: false,
        ..Capabilities::minimal()
    }
}

#[test]
fn a_sentinel_master_cut_from_its_peers_is_a_known_unsafe_double_grant_on_redis() {
    // The backend table: a Sentinel master cut from its peers double
    // grants, and so do a failover and a restart without persistence.
    let caps = redis();
    for kind in [
        FaultKind::MemberPartition,
        FaultKind::LeaderKill,
        FaultKind::ServerRestart,
    ] {
        assert!(known_unsafe(kind, &caps).is_some(), "{kind}");
        let injected = [fault(kind, 0, 300, 350)];
        let overlap = the("overlap", &judge(&caps, &injected, &double_grant()));
        assert!(overlap.expected, "{overlap:?}");
        assert_eq!(overlap.faults, vec![kind]);
        // Over before the first grant: it excuses nothing.
        let injected = [fault(kind, 0, 20, 80)];
        let overlap = the("overlap", &judge(&caps, &injected, &double_grant()));
        assert!(!overlap.expected, "{overlap:?}");
    }
    // A pause (no failover: the replica is frozen too) and a holder's own
    // partition are not known unsafe on Redis, and the second never
    // explains a double grant: the soak still finds Redis's own bugs.
    for kind in [FaultKind::ServerPause, FaultKind::ClientPartition] {
        assert!(known_unsafe(kind, &caps).is_none(), "{kind}");
        let injected = [fault(kind, 0, 50, 1200)];
        let overlap = the("overlap", &judge(&caps, &injected, &double_grant()));
        assert!(!overlap.expected, "{overlap:?}");
    }
}

#[test]
fn client_faults_do_not_excuse_a_double_grant_without_fencing() {
    // On a backend without tokens every client fault is a known unsafe
    // case, on both lanes: a freeze (the second lane) and a partition of a
    // holder's own link (the first), each active all along. Neither makes
    // a server grant twice.
    let caps = no_fencing();
    let injected = [
        fault(FaultKind::ClientFreeze, 0, 50, 1200),
        fault(FaultKind::ClientPartition, 1, 50, 1200),
        fault(FaultKind::ClientLatency, 2, 50, 1200),
    ];
    for f in &injected {
        assert!(known_unsafe(f.kind, &caps).is_some());
    }
    let overlap = the("overlap", &judge(&caps, &injected, &double_grant()));
    assert!(!overlap.expected, "{overlap:?}");
    assert!(overlap.faults.is_empty(), "{overlap:?}");
}

/// Process 0 is granted at 100 ms (until 400 ms) and writes late, at
/// 1000 ms, after process 1 (granted at 500 ms) wrote at 600 ms.
fn late_write() -> Vec<Event> {
    let mut events = vec![
        event(0, 100, Op::Acquire, 1, Some(400)),
        event(1, 500, Op::Acquire, 2, Some(1500)),
        event(1, 600, Op::Write, 2, None),
        event(0, 1000, Op::Write, 1, None),
    ];
    // Without tokens the resource has nothing to check.
    for e in &mut events {
        if e.op == Op::Write {
            e.token = None;
        }
    }
    events
}

#[test]
fn a_freeze_excuses_only_its_own_clients_late_write() {
    let caps = no_fencing();
    // The writer (process 0, worker 0) frozen from 150 ms to 1000 ms.
    let injected = [fault(FaultKind::ClientFreeze, 0, 150, 1000)];
    let stale = the("stale_write", &judge(&caps, &injected, &late_write()));
    assert!(stale.expected, "{stale:?}");
    assert_eq!(stale.faults, vec![FaultKind::ClientFreeze]);
    // Another client frozen at the same time explains nothing.
    let injected = [fault(FaultKind::ClientFreeze, 1, 150, 1000)];
    let stale = the("stale_write", &judge(&caps, &injected, &late_write()));
    assert!(!stale.expected, "{stale:?}");
    // Nor does a freeze of the writer that began after the newer grant
    // (the writer's lease had run out by then for some other reason).
    let injected = [fault(FaultKind::ClientFreeze, 0, 550, 1000)];
    let stale = the("stale_write", &judge(&caps, &injected, &late_write()));
    assert!(!stale.expected, "{stale:?}");
}

#[test]
fn a_freeze_excuses_a_lost_increment_only_of_a_writer_involved() {
    let caps = no_fencing();
    // Worker 1's write at 1200 ms overwrote an increment of worker 0,
    // whose grant came at 100 ms: worker 0, frozen, wrote late inside
    // worker 1's tenure, and worker 1's own write then overwrote it.
    let lost = [LostIncrement {
        grant_at: ms(100),
        write_at: ms(1200),
        lost: 1,
        key: "k".into(),
        writer: 1,
        overwritten: vec![0],
        newer_grant_at: None,
    }];
    let events = [event(0, 100, Op::Acquire, 1, Some(400))];
    let judged = |target: usize| {
        let injected = [fault(FaultKind::ClientFreeze, target, 150, 1000)];
        the(
            "lost_update",
            &judge_with_lost(&caps, &injected, &events, &lost),
        )
    };
    assert!(judged(0).expected, "the overwritten writer was frozen");
    assert!(judged(1).expected, "the overwriting writer was frozen");
    let other = judged(2);
    assert!(!other.expected, "{other:?}");
}
