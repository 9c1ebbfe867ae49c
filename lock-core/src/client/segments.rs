//! Segmented locks: one resource split into N parts, each with its own
//! mutex, and a request that takes whichever part is free.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use crate::client::LockClient;
use crate::error::{ErrorKind, LockError, Operation};
use crate::guard::LockGuard;

/// The most segments one request may span.
pub const MAX_SEGMENTS: u32 = 1024;

/// A request for any one of a key's segments, made by
/// [`LockClient::segments`].
///
/// Segment `i` of `key` is the mutex `key/i` (an ordinary lock: it can be
/// inspected, and taken on its own with [`LockClient::lock`]). A stock of
/// 1,000 items counted in 10 buckets lets 10 workers decrement at once,
/// each under the lock of one bucket.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_core::{LockClient, MemoryBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_core::LockError> {
/// let client = LockClient::new(MemoryBackend::new());
/// let (first, a) = client.segments("stock", 2).acquire_any().await?;
/// let (second, b) = client.segments("stock", 2).acquire_any().await?;
/// assert_ne!(first, second);
/// assert!(client.segments("stock", 2).acquire_any().await.is_err());
/// a.release().await?;
/// b.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a lock request does nothing until acquired"]
pub struct SegmentRequest<'a> {
    client: &'a LockClient,
    key: String,
    segments: u32,
    ttl: Option<Duration>,
    wait: Option<Duration>,
}

impl<'a> SegmentRequest<'a> {
    pub(crate) fn new(client: &'a LockClient, key: &str, segments: u32) -> Self {
        Self {
            client,
            key: key.to_owned(),
            segments,
            ttl: None,
            wait: None,
        }
    }

    /// The lease TTL of the segment taken (default: the client's).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long to wait when every segment is held (default: the
    /// client's; 0 = try each once).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The key of segment `index`.
    pub fn segment_key(&self, index: u32) -> String {
        format!("{}/{index}", self.key)
    }

    /// Takes a free segment if there is one (trying them from a random
    /// one on, so that clients spread), and otherwise waits for whichever
    /// frees first. Returns the segment's index and its guard.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a count of segments outside
    /// `1..=MAX_SEGMENTS` or a key whose segment keys are invalid;
    /// [`ErrorKind::Contended`] when every segment stayed held for the
    /// whole wait; otherwise the errors of
    /// [`LockRequest::acquire`](crate::LockRequest::acquire).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future withdraws every segment's request, as dropping
    /// [`LockRequest::acquire`](crate::LockRequest::acquire) does: nothing
    /// stays held past its TTL, and a segment granted to a request that
    /// lost the race is released.
    pub async fn acquire_any(self) -> Result<(u32, LockGuard), LockError> {
        if self.segments == 0 || self.segments > MAX_SEGMENTS {
            return Err(LockError::invalid_argument(
                Operation::Validate,
                format!(
                    "a segmented lock needs 1 to {MAX_SEGMENTS} segments, got {}",
                    self.segments
                ),
            )
            .with_key(&self.key));
        }
        let wait = self.wait.unwrap_or(self.client.defaults().wait);
        let start = crate::options::random_below(self.segments);
        let order: Vec<u32> = (0..self.segments)
            .map(|i| (start + i) % self.segments)
            .collect();
        for &index in &order {
            if let Some(guard) = self
                .request(index)
                .wait(Duration::ZERO)
                .try_acquire()
                .await?
            {
                return Ok((index, guard));
            }
        }
        if wait.is_zero() {
            return Err(LockError::new(
                ErrorKind::Contended,
                Operation::TryAcquire,
                format!("all {} segments are held", self.segments),
            )
            .with_key(&self.key)
            .with_backend(self.client.backend().name()));
        }
        type Attempt<'f> = Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send + 'f>>;
        let mut pending: Vec<(u32, Attempt<'_>)> = order
            .iter()
            .map(|&index| {
                let request = self.request(index).wait(wait);
                (index, Box::pin(request.acquire()) as Attempt<'_>)
            })
            .collect();
        let mut last_err = None;
        std::future::poll_fn(|cx| {
            let mut i = 0;
            while i < pending.len() {
                match pending[i].1.as_mut().poll(cx) {
                    Poll::Ready(Ok(guard)) => return Poll::Ready(Ok((pending[i].0, guard))),
                    Poll::Ready(Err(err)) => {
                        drop(pending.swap_remove(i));
                        // A real failure is worth more than a wait that
                        // ran out.
                        if !err.is_contended() || last_err.is_none() {
                            last_err = Some(err);
                        }
                    }
                    Poll::Pending => i += 1,
                }
            }
            if pending.is_empty() {
                return Poll::Ready(Err(last_err.take().unwrap_or_else(|| {
                    LockError::new(ErrorKind::Contended, Operation::Acquire, "no segment freed")
                })));
            }
            Poll::Pending
        })
        .await
    }

    fn request(&self, index: u32) -> crate::LockRequest<'a> {
        let mut request = self.client.lock(self.segment_key(index));
        if let Some(ttl) = self.ttl {
            request = request.ttl(ttl);
        }
        request
    }
}
