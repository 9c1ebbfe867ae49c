//! Paging over the root's (or a shape directory's) children: the bounds a
//! `ListQuery` sets, the escaped keys among the children, the cursor.

use lock_core::{LockError, LockKey, Operation, check_list_limit};

use crate::error::NAME;
use crate::keys;

/// The prefix of a `list` cursor; the rest is the escaped name of the last
/// key directory the page examined.
const CURSOR_PREFIX: &str = "zk1:";

/// The bounds of one page of a listing (`list`, `list_shared`,
/// `list_elections`): the children of one parent directory that are
/// escaped keys, in escaped-name order, after the cursor, starting with
/// the prefix, at most `limit`.
pub(crate) struct PageBounds<'a> {
    prefix: &'a str,
    after: Option<&'a str>,
    limit: usize,
}

impl<'a> PageBounds<'a> {
    /// Checks `limit` and `cursor` (before any request is sent).
    pub(crate) fn new(
        prefix: &'a str,
        cursor: Option<&'a str>,
        limit: usize,
    ) -> Result<Self, LockError> {
        check_list_limit(limit).map_err(|e| e.with_backend(NAME))?;
        let after = cursor.map(parse_cursor).transpose()?;
        Ok(Self {
            prefix,
            after,
            limit,
        })
    }

    /// The page's keys among `keys` (escaped name, key), and the cursor of
    /// the next page while more matching directories remain.
    pub(crate) fn select(
        &self,
        mut keys: Vec<(String, LockKey)>,
    ) -> (Vec<(String, LockKey)>, Option<String>) {
        keys.retain(|(name, key)| {
            self.after.is_none_or(|a| name.as_str() > a) && key.as_str().starts_with(self.prefix)
        });
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        let more = keys.len() > self.limit;
        keys.truncate(self.limit);
        let next = if more {
            keys.last()
                .map(|(name, _)| format!("{CURSOR_PREFIX}{name}"))
        } else {
            None
        };
        (keys, next)
    }
}

/// The children of a parent directory that are escaped keys (see
/// [`keys::key_of_component`]), with their keys.
pub(crate) fn escaped_keys(children: Vec<String>) -> Vec<(String, LockKey)> {
    children
        .into_iter()
        .filter_map(|name| keys::key_of_component(&name).map(|key| (name, key)))
        .collect()
}

/// The escaped name a `list` cursor continues after.
fn parse_cursor(text: &str) -> Result<&str, LockError> {
    text.strip_prefix(CURSOR_PREFIX)
        .filter(|name| keys::key_of_component(name).is_some())
        .ok_or_else(|| {
            LockError::invalid_argument(
                Operation::Inspect,
                format!("{text:?} is not a list cursor of the ZooKeeper backend"),
            )
            .with_backend(NAME)
        })
}
