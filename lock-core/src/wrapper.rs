//! Backends built around another backend: a delay, a recorder, a fault, a
//! deliberately broken double for a test.
//!
//! A [`LockWrapper`] names its inner backend and overrides only the calls
//! it changes; every other call goes to the inner backend unchanged. Every
//! `LockWrapper` is a [`LockBackend`] (a blanket implementation), so it can
//! stand wherever a backend does.
//!
//! A wrapper forwards the kernel's calls and, unless it overrides
//! [`facets`](LockWrapper::facets), the inner backend's facets unchanged
//! (a facet's calls then go straight to the inner backend). A wrapper that
//! changes what a facet does (a recorder, a delay) returns facets of its
//! own.
//!
//! ```
//! use lock_core::{LockBackend, LockClient, LockKey, LockWrapper, MemoryBackend};
//!
//! /// Counts releases, changes nothing.
//! #[derive(Debug)]
//! struct Counting {
//!     inner: MemoryBackend,
//!     releases: std::sync::atomic::AtomicU64,
//! }
//!
//! #[lock_core::async_trait]
//! impl LockWrapper for Counting {
//!     fn inner(&self) -> &dyn LockBackend {
//!         &self.inner
//!     }
//!     async fn release(&self, lease: &lock_core::Lease) -> Result<bool, lock_core::LockError> {
//!         self.releases.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
//!         self.inner.release(lease).await
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_core::LockError> {
//! let counting = std::sync::Arc::new(Counting { inner: MemoryBackend::new(), releases: 0.into() });
//! let client = LockClient::from_arc(counting.clone());
//! client.lock("k").acquire().await?.release().await?;
//! assert_eq!(counting.releases.load(std::sync::atomic::Ordering::Relaxed), 1);
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::{GrantRequest, LockBackend};
use crate::capabilities::Capabilities;
use crate::error::LockError;
use crate::facets::Facets;
use crate::key::LockKey;
use crate::kind::{HolderInfo, LockShape};
use crate::types::Lease;

/// A kernel call's future, as `async_trait` boxes it.
type Call<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Writes one call as `async_trait` expands `async fn $call(&self, ...)`
/// (the lifetimes besides `self`'s named, in their order), with `body`
/// handing back the boxed future it already has. `$this` is the `self` of
/// the caller's tokens, so that `body` may use it.
macro_rules! boxed_call {
    ($this:ident, $call:ident, [$($life:lifetime),+], [$($arg:ident: $ty:ty),+], $ret:ty, $body:block) => {
        fn $call<'life0, $($life,)+ 'async_trait>(
            &'life0 $this $(, $arg: $ty)+
        ) -> Call<'async_trait, $ret>
        where
            'life0: 'async_trait,
            $($life: 'async_trait,)+
            Self: 'async_trait,
        $body
    };
}

/// Writes [`LockWrapper`] and its blanket [`LockBackend`] implementation
/// from one list of the forwarded calls, so the two cannot drift apart.
///
/// Each call is written by `boxed_call!`, so that implementors still
/// write `async fn`, while the forwarding default and
/// the blanket implementation hand back the boxed future they already
/// have instead of boxing one more that only awaits it (an allocation, a
/// copy of the future and an indirect poll per layer and call: a
/// forwarded grant through a wrapper went through three boxes, now one).
macro_rules! wrapper {
    ($(fn $call:ident<$($life:lifetime),+>($($arg:ident: $ty:ty),+) -> $ret:ty;)*) => {
        /// A backend made of another one (see the [module docs](self)):
        /// each method defaults to the same call on [`inner`](Self::inner),
        /// and has the contract of the [`LockBackend`] method of the same
        /// name, which an override must keep unless breaking it is the
        /// point (a test double).
        ///
        /// Errors and cancel safety: those of the inner backend's call,
        /// for every method left to its default.
        #[async_trait]
        #[allow(missing_docs)] // Each method is the LockBackend method of its name.
        pub trait LockWrapper: Send + Sync + fmt::Debug {
            /// The backend every call not overridden goes to.
            fn inner(&self) -> &dyn LockBackend;

            fn name(&self) -> &'static str {
                self.inner().name()
            }
            fn capabilities(&self) -> Capabilities {
                self.inner().capabilities()
            }
            /// The inner backend's facets, forwarded unchanged: a wrapper
            /// that changes a facet's calls returns its own.
            fn facets(&self) -> Facets<'_> {
                self.inner().facets()
            }
            $(
                boxed_call!(self, $call, [$($life),+], [$($arg: $ty),+], $ret, {
                    self.inner().$call($($arg),+)
                });
            )*
        }

        /// Every [`LockWrapper`] is a backend: each call goes to the
        /// wrapper's method of the same name (its override, or the
        /// forwarding default), whose future is handed back as it is.
        #[async_trait]
        impl<W: LockWrapper> LockBackend for W {
            fn name(&self) -> &'static str {
                LockWrapper::name(self)
            }
            fn capabilities(&self) -> Capabilities {
                LockWrapper::capabilities(self)
            }
            fn facets(&self) -> Facets<'_> {
                LockWrapper::facets(self)
            }
            $(
                boxed_call!(self, $call, [$($life),+], [$($arg: $ty),+], $ret, {
                    LockWrapper::$call(self $(, $arg)+)
                });
            )*
        }
    };
}

wrapper! {
    fn grant<'life1>(request: GrantRequest<'life1>) -> Result<Option<Lease>, LockError>;
    fn renew_many<'life1, 'life2>(leases: &'life1 [&'life2 Lease]) -> Vec<Result<Instant, LockError>>;
    fn release<'life1>(lease: &'life1 Lease) -> Result<bool, LockError>;
    fn holders<'life1>(key: &'life1 LockKey, shape: LockShape) -> Result<Vec<HolderInfo>, LockError>;
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{ErrorKind, LockBackendExt, MemoryBackend, Operation};
    use std::time::Duration;
    use tokio::time::Instant;

    /// Refuses renewals; everything else is the memory service's.
    #[derive(Debug)]
    struct NoRenewals(MemoryBackend);

    #[async_trait]
    impl LockWrapper for NoRenewals {
        fn inner(&self) -> &dyn LockBackend {
            &self.0
        }
        fn name(&self) -> &'static str {
            "no-renewals"
        }
        async fn renew_many(&self, leases: &[&Lease]) -> Vec<Result<Instant, LockError>> {
            leases
                .iter()
                .map(|_| {
                    Err(LockError::new(
                        ErrorKind::NotHeld,
                        Operation::Renew,
                        "refused",
                    ))
                })
                .collect()
        }
    }

    #[tokio::test]
    async fn overrides_win_and_the_rest_reaches_the_inner_backend() {
        let memory = MemoryBackend::new();
        let wrapped: Arc<dyn LockBackend> = Arc::new(NoRenewals(memory.clone()));
        assert_eq!(wrapped.name(), "no-renewals");
        assert_eq!(wrapped.capabilities(), memory.capabilities());
        let key = LockKey::new("wrapped").unwrap();
        let lease = wrapped
            .try_acquire(&key, Duration::from_secs(5))
            .await
            .unwrap()
            .expect("free");
        // Granted in the inner service: seen there, and through the wrapper.
        assert_eq!(
            memory.inspect(&key).await.unwrap().unwrap().token,
            Some(lease.token())
        );
        assert!(wrapped.inspect(&key).await.unwrap().is_some());
        assert!(wrapped.renew(&lease).await.unwrap_err().is_not_held());
        // Facets are the inner backend's.
        assert_eq!(wrapped.facets().names(), memory.facets().names());
        assert!(wrapped.release(&lease).await.unwrap());
        assert!(memory.inspect(&key).await.unwrap().is_none());
    }
}
