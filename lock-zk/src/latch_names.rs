//! The names of our election candidates' latch nodes, which carry the
//! holder details.
//!
//! A latch node's data is Curator's participant id: `LeaderLatch`'s
//! `getLeader()` and `getParticipants()` read the whole data as the id
//! (`new String(bytes, UTF-8)`), so nothing can follow our owner hex there
//! without changing the id Curator reports. The details go in the name
//! instead: `_c_<owner id as a UUID>-<escaped details>-latch-<sequence>`.
//! Curator sorts latch nodes on the text after the *last* `latch-`
//! (`fixForSorting`), so these names rank by their sequence number among
//! Curator's `_c_<uuid>-latch-<sequence>` nodes; our own order (the digits
//! after the last `latch-`) is the same. The details are
//! [`HolderDetails::encode_current`]'s text percent-encoded as a key
//! component (`[A-Za-z0-9_-]` kept, so the name holds no `/`), a few
//! hundred bytes at most. A plain `_c_<uuid>-latch-<seq>` (Curator's, or an
//! earlier version of ours) has no details.

use lock_core::HolderDetails;
use percent_encoding::{percent_decode_str, utf8_percent_encode};

use crate::paths::{COMPONENT, LATCH_NAME};

/// The separator between the details and the latch name.
const DETAILED_LATCH: &str = "-latch-";

/// This process's details for a candidacy starting now, escaped for a
/// node name.
pub(crate) fn details_component() -> String {
    utf8_percent_encode(&HolderDetails::encode_current(), COMPONENT).to_string()
}

/// What follows `_c_<uuid>-` in a latch node's name before the sequence:
/// `latch-` without details, `<details>-latch-` with them.
pub(crate) fn latch_name(details: &str) -> String {
    if details.is_empty() {
        LATCH_NAME.to_owned()
    } else {
        format!("{details}{DETAILED_LATCH}")
    }
}

/// Whether `text` is escaped details as [`details_component`] writes them
/// (possibly empty).
pub(crate) fn is_details_component(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'%'))
}

/// The escaped details in what follows `_c_<uuid>-` in a node's name
/// (`<details>-latch-<digits>`): `None` when it is no detailed latch name.
pub(crate) fn details_part(rest: &str) -> Option<&str> {
    let at = rest.rfind(DETAILED_LATCH)?;
    let digits = &rest[at + DETAILED_LATCH.len()..];
    let details = &rest[..at];
    (!details.is_empty()
        && !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && is_details_component(details))
    .then_some(details)
}

/// The escaped details in a latch node `name` of ours (`""` for a plain
/// latch name, Curator's or an earlier version of ours).
pub(crate) fn details_of_name(name: &str) -> &str {
    name.strip_prefix("_c_")
        .and_then(|rest| rest.get(37..))
        .and_then(details_part)
        .unwrap_or("")
}

/// The holder details a latch node's name carries, if any.
pub(crate) fn holder_details(name: &str) -> Option<HolderDetails> {
    let escaped = details_of_name(name);
    if escaped.is_empty() {
        return None;
    }
    HolderDetails::decode(&percent_decode_str(escaped).decode_utf8().ok()?)
}

#[cfg(test)]
mod tests {
    use lock_core::OwnerId;

    use super::*;
    use crate::paths::{named_node_path, owner_of, sequence_named, sorted_named};

    /// A detailed latch name keeps the owner, the sequence and Curator's
    /// order (the digits after the last `latch-`), and gives the details
    /// back; plain names have none.
    #[test]
    fn latch_names_carry_the_details() {
        let owner = OwnerId::random();
        let details = details_component();
        assert!(is_details_component(&details));
        let path = named_node_path("/e", owner, &latch_name(&details), 7);
        let name = path.strip_prefix("/e/").unwrap();
        assert!(!name.contains('/'));
        assert_eq!(owner_of(name), Some(owner));
        assert_eq!(sequence_named(name, LATCH_NAME), Some(7));
        assert_eq!(details_of_name(name), details);
        let found = holder_details(name).expect("details");
        assert_eq!(found.pid, std::process::id());
        let curator = "_c_5f1e6c8e-0000-0000-0000-000000000000-latch-0000000003";
        assert_eq!(holder_details(curator), None);
        assert_eq!(details_of_name(curator), "");
        let plain = named_node_path("/e", owner, LATCH_NAME, 9);
        assert_eq!(holder_details(plain.strip_prefix("/e/").unwrap()), None);
        let order: Vec<i64> = sorted_named(
            vec![name.to_owned(), curator.to_owned(), "x".to_owned()],
            LATCH_NAME,
        )
        .into_iter()
        .map(|(seq, _)| seq)
        .collect();
        assert_eq!(order, [3, 7]);
        // Curator's `fixForSorting`: the text after the last `latch-`.
        let after = |n: &str| n[n.rfind(LATCH_NAME).unwrap() + LATCH_NAME.len()..].to_owned();
        assert_eq!(after(name), "0000000007");
        for bad in ["h%3Dx-latch-", "h%3Dx-latch-1a", "h;x-latch-1", "-latch-1"] {
            assert_eq!(details_part(bad), None, "{bad}");
        }
    }
}
