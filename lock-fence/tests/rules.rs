//! The fencing cases themselves can fail: a reference resource in memory
//! passes them, and each deliberately wrong rule fails the case written
//! for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use conformance::fencing::{FenceOutcome, FencedResource, run_fence_cases};

#[derive(Clone, Copy, Debug)]
enum Rule {
    /// Below the last: refused; equal or above: accepted.
    Documented,
    /// No check at all.
    Unchecked,
    /// Equal tokens refused too.
    StrictlyAbove,
    /// Compares the other way round.
    Reversed,
    /// Refuses with a made-up current token.
    WrongCurrent,
    /// One token for every resource.
    Global,
}

struct Reference {
    rule: Rule,
    state: Mutex<HashMap<String, (u64, String)>>,
}

#[async_trait]
impl FencedResource for Reference {
    fn name(&self) -> String {
        format!("reference ({:?})", self.rule)
    }

    async fn write(&self, resource: &str, token: u64, value: &str) -> Result<FenceOutcome, String> {
        let mut state = self.state.lock().unwrap();
        let slot = match self.rule {
            Rule::Global => "",
            _ => resource,
        };
        let last = state.get(slot).map(|(t, _)| *t);
        let refuse = match (self.rule, last) {
            (_, None) | (Rule::Unchecked, _) => false,
            (Rule::StrictlyAbove, Some(last)) => token <= last,
            (Rule::Reversed, Some(last)) => token > last,
            (_, Some(last)) => token < last,
        };
        if refuse {
            let current = last.unwrap_or_default();
            let current = match self.rule {
                Rule::WrongCurrent => current + 1,
                _ => current,
            };
            return Ok(FenceOutcome::Refused { current });
        }
        state.insert(slot.to_owned(), (token, value.to_owned()));
        if slot != resource {
            state.insert(resource.to_owned(), (token, value.to_owned()));
        }
        Ok(FenceOutcome::Accepted)
    }

    async fn read(&self, resource: &str) -> Result<Option<String>, String> {
        Ok(self
            .state
            .lock()
            .unwrap()
            .get(resource)
            .map(|(_, v)| v.clone()))
    }
}

async fn failed(rule: Rule) -> Vec<&'static str> {
    let store = Arc::new(Reference {
        rule,
        state: Mutex::default(),
    });
    run_fence_cases(store).await.failed()
}

#[tokio::test]
async fn the_documented_rule_passes_and_each_wrong_rule_is_caught() {
    assert_eq!(failed(Rule::Documented).await, Vec::<&str>::new());
    let caught = [
        (
            Rule::Unchecked,
            "stale_write_is_refused_with_the_current_token",
        ),
        (Rule::StrictlyAbove, "equal_token_is_accepted"),
        (Rule::Reversed, "in_order_writes_are_accepted"),
        (
            Rule::WrongCurrent,
            "stale_write_is_refused_with_the_current_token",
        ),
        (Rule::Global, "resources_are_independent"),
        (Rule::Unchecked, "racing_writers_leave_the_highest_token"),
    ];
    for (rule, case) in caught {
        let failed = failed(rule).await;
        assert!(
            failed.contains(&case),
            "{rule:?} was not caught by {case}: failed {failed:?}"
        );
    }
}
