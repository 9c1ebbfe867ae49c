//! Properties of the history checker, 10,000 generated histories each:
//! it never panics on any event sequence; a history generated from a
//! serial schedule (each grant of a key starts after the previous one's
//! promised window ended, tokens grow, each holder writes inside its
//! window) is always reported clean; the same history with one injected
//! overlapping grant is always reported; a late write of an older grant
//! whose window was stretched over it is refused by the newer tokens and
//! never blamed on a current holder.

use std::time::Duration;

use conformance::history::{CheckReport, Event, EventKind, Op, check};
use proptest::prelude::*;

const CASES: u32 = 10_000;

fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(CASES)
    }
}

fn event(
    at_ms: u64,
    process: u64,
    kind: EventKind,
    op: Op,
    key: &str,
    token: Option<u64>,
    valid_until_ms: Option<u64>,
) -> Event {
    Event {
        at: Duration::from_millis(at_ms),
        process,
        kind,
        op,
        key: key.to_owned(),
        token,
        valid_until: valid_until_ms.map(Duration::from_millis),
        grant: None,
    }
}

fn any_event() -> impl Strategy<Value = Event> {
    let kind = prop_oneof![
        Just(EventKind::Invoke),
        Just(EventKind::Ok),
        Just(EventKind::Fail),
        Just(EventKind::Info),
    ];
    let op = prop_oneof![
        Just(Op::Acquire),
        Just(Op::Renew),
        Just(Op::Release),
        Just(Op::Lost),
        Just(Op::Write),
    ];
    let time = prop_oneof![8 => 0u64..200, 1 => Just(u64::MAX / 2), 1 => any::<u64>()];
    (
        time.clone(),
        0u64..4,
        kind,
        op,
        proptest::sample::select(vec!["a", "b", ""]),
        proptest::option::of(prop_oneof![8 => 0u64..6, 1 => Just(u64::MAX), 1 => any::<u64>()]),
        proptest::option::of(time),
    )
        .prop_map(|(at, process, kind, op, key, token, until)| {
            // Keep Duration arithmetic in range: u64 ms -> Duration is fine.
            event(at, process, kind, op, key, token, until)
        })
}

/// One grant of a serial schedule, as the checker will see it.
#[derive(Clone, Debug)]
struct Grant {
    process: u64,
    token: u64,
    start: u64,
    /// Where the checker's window ends (release, lost, or the last
    /// promised deadline).
    end: u64,
}

/// Per-grant choices: process, gap before it, initial validity, renewals
/// (each as (offset into the current window, new validity)), how it ends,
/// whether the holder writes, token step.
type GrantPlan = (u64, u64, u64, Vec<(u64, u64)>, u8, bool, u64);

fn grant_plan() -> impl Strategy<Value = GrantPlan> {
    (
        0u64..5,
        0u64..20,
        1u64..100,
        proptest::collection::vec((0u64..100, 1u64..100), 0..3),
        0u8..3,
        any::<bool>(),
        1u64..3,
    )
}

/// Builds the events of a serial schedule on `key` from `plans`, and the
/// grants with their windows.
fn serial(key: &str, plans: &[GrantPlan], token_base: u64) -> (Vec<Event>, Vec<Grant>) {
    let mut events = Vec::new();
    let mut grants = Vec::new();
    let mut now = 0u64;
    let mut token = token_base;
    for &(process, gap, validity, ref renewals, ending, writes, step) in plans {
        token += step;
        let start = now + gap;
        events.push(event(
            start,
            process,
            EventKind::Invoke,
            Op::Acquire,
            key,
            None,
            None,
        ));
        events.push(event(
            start,
            process,
            EventKind::Ok,
            Op::Acquire,
            key,
            Some(token),
            Some(start + validity),
        ));
        let mut end = start + validity;
        let mut last = start;
        for &(offset, extra) in renewals {
            // A renewal lands inside the current window (never after it).
            let at = last + offset % (end - last + 1);
            let until = at + extra;
            events.push(event(
                at,
                process,
                EventKind::Ok,
                Op::Renew,
                key,
                Some(token),
                Some(until),
            ));
            end = end.max(until);
            last = at;
        }
        if writes {
            // Strictly inside [start, end): a write at `end` would belong
            // to the next grant if the same process took it at once.
            events.push(event(
                start + (end - start - 1) / 2,
                process,
                EventKind::Ok,
                Op::Write,
                key,
                Some(token),
                None,
            ));
        }
        match ending {
            0 => {
                // Released before the deadline.
                let at = last.max(end - 1).max(start);
                events.push(event(
                    at,
                    process,
                    EventKind::Invoke,
                    Op::Release,
                    key,
                    Some(token),
                    None,
                ));
                end = end.min(at);
            }
            1 => {
                // Told lost at the deadline.
                events.push(event(
                    end,
                    process,
                    EventKind::Info,
                    Op::Lost,
                    key,
                    Some(token),
                    None,
                ));
            }
            _ => {} // Lapsed.
        }
        grants.push(Grant {
            process,
            token,
            start,
            end,
        });
        now = end;
    }
    (events, grants)
}

fn clean(report: &CheckReport) -> bool {
    report.is_safe_with_fencing()
        && report.overlap_count == 0
        && report.max_concurrent_holders <= 1
        && report.writes_outside_window == 0
        && report.writes_rejected == 0
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_checker_never_panics(events in proptest::collection::vec(any_event(), 0..24)) {
        let report = check(&events);
        prop_assert!(report.max_concurrent_holders <= events.len());
        let _ = report.summary();
    }

    #[test]
    fn serial_histories_are_clean(
        a in proptest::collection::vec(grant_plan(), 1..8),
        b in proptest::collection::vec(grant_plan(), 0..8),
    ) {
        let (mut events, grants_a) = serial("a", &a, 0);
        let (events_b, grants_b) = serial("b", &b, 100);
        events.extend(events_b);
        let report = check(&events);
        prop_assert!(clean(&report), "{}\n{grants_a:?}\n{grants_b:?}\n{events:#?}", report.summary());
        prop_assert_eq!(report.grants, grants_a.len() + grants_b.len());
    }

    #[test]
    fn an_injected_overlap_is_always_reported(
        plans in proptest::collection::vec(grant_plan(), 1..8),
        pick in any::<prop::sample::Index>(),
        offset in any::<u64>(),
        validity in 1u64..100,
        token in prop_oneof![Just(None), (0u64..20).prop_map(Some)],
    ) {
        let (mut events, grants) = serial("a", &plans, 0);
        // Only a grant whose window is not empty can be overlapped.
        let open: Vec<&Grant> = grants.iter().filter(|g| g.end > g.start).collect();
        prop_assume!(!open.is_empty());
        let victim = open[pick.index(open.len())];
        let at = victim.start + offset % (victim.end - victim.start);
        // A second holder granted the key inside the victim's window.
        events.push(event(at, 1_000, EventKind::Ok, Op::Acquire, "a", token, Some(at + validity)));
        let report = check(&events);
        prop_assert!(report.overlap_count >= 1, "{} (victim {victim:?}, injected at {at})", report.summary());
        prop_assert!(!report.is_exclusive());
        prop_assert!(report.max_concurrent_holders >= 2);
        let _ = victim.process + victim.token;
    }

    /// A paused holder's promised window, known only as an upper bound,
    /// may run past the next grants; its write stamped late is refused by
    /// their tokens, which is fencing at work: never counted as a current
    /// holder's write refused, never a stale write accepted, whatever the
    /// overlap (judged on its own).
    #[test]
    fn a_late_write_of_an_older_grant_is_refused_not_blamed(
        plans in proptest::collection::vec(grant_plan(), 2..8),
        pick in any::<prop::sample::Index>(),
        late in 0u64..400,
    ) {
        // One process per grant (a write is the writer's latest grant's),
        // each lapsing at its deadline (a release would cut the window).
        let plans: Vec<GrantPlan> = plans
            .into_iter()
            .zip(0u64..)
            .map(|(plan, process)| (process, plan.1, plan.2, plan.3, 2, plan.5, plan.6))
            .collect();
        let (mut events, grants) = serial("a", &plans, 0);
        let older = &grants[pick.index(grants.len())];
        let at = older.start + late;
        // Its window stretched over the write (a bound, not a renewal the
        // server saw), and the write.
        events.push(event(older.start, older.process, EventKind::Ok, Op::Renew, "a", Some(older.token), Some(at + 1)));
        events.push(event(at, older.process, EventKind::Ok, Op::Write, "a", Some(older.token), None));
        let report = check(&events);
        prop_assert_eq!(report.current_holder_writes_rejected, 0, "{} (older {:?}, write at {})", report.summary(), older, at);
        prop_assert_eq!(report.stale_writes_accepted, 0, "{}", report.summary());
    }
}
