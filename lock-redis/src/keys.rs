//! The key layout: how a [`LockKey`](lock_core::LockKey) becomes Redis
//! names, and the Lua scripts that grant, release, renew and inspect under
//! those names.
//!
//! Public so that other tools (the benchmark floors of `lock-bench`, an
//! operator's script) take the same lock as the driver on the same key:
//! [`KeyNames`] for the mutex, [`SemNames`] and [`RwNames`] for the shared
//! kinds, [`Scripts`] and [`SHARED`] for the scripts' texts and hashes.
//! The layouts of other libraries (`layout=plain|redisson`) are described
//! on [`RedisLayout`](crate::RedisLayout).

pub(crate) mod fair;
pub(crate) mod layout;
pub(crate) mod names;
pub(crate) mod replies;
pub(crate) mod scripts;
pub(crate) mod shared;
pub(crate) mod space;

pub use names::KeyNames;
pub use scripts::{LuaScript, Scripts};
pub use shared::{RwNames, SHARED, SemNames, SharedScripts};

#[cfg(test)]
mod tests;
