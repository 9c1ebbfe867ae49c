//! The mapping from the ZooKeeper client's errors to [`LockError`] kinds,
//! the backend's name, and the operation timeout every request has.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use lock_core::{ErrorKind, LockError, Operation};
use zookeeper_client as zk;

pub(crate) const NAME: &str = "zookeeper";

/// A request that failed: the server's answer or our own timeout.
#[derive(Debug)]
pub(crate) enum CallError {
    Zk(zk::Error),
    TimedOut(Duration),
}

impl CallError {
    pub(crate) fn is(&self, err: &zk::Error) -> bool {
        matches!(self, Self::Zk(e) if e == err)
    }

    /// The request may or may not have been applied.
    pub(crate) fn outcome_unknown(&self) -> bool {
        matches!(
            self,
            Self::TimedOut(_) | Self::Zk(zk::Error::ConnectionLoss)
        )
    }

    pub(crate) fn ends_session(&self) -> bool {
        matches!(
            self,
            Self::Zk(zk::Error::SessionExpired | zk::Error::SessionMoved | zk::Error::ClientClosed)
        )
    }

    pub(crate) fn into_lock_error(self, operation: Operation) -> LockError {
        match self {
            Self::TimedOut(after) => LockError::new(
                ErrorKind::Timeout,
                operation,
                format!("no answer from ZooKeeper within the operation timeout of {after:?}"),
            )
            .with_backend(NAME),
            Self::Zk(err) => zk_error(operation, err),
        }
    }
}

/// The connection broke with the request in flight. The client reports
/// this as `ConnectionLoss`, or as a custom error carrying the reason
/// ("no response from connection in ...", an I/O error).
pub(crate) fn connection_failure(err: &zk::Error) -> bool {
    matches!(err, zk::Error::ConnectionLoss | zk::Error::Custom(_))
}

/// Opening a session failed: no session within the connect timeout, or
/// the client refused (bad arguments or failed authentication are
/// configuration errors; the rest is an unreachable ensemble).
pub(crate) fn connect_error(
    operation: Operation,
    connect_string: &str,
    err: CallError,
) -> LockError {
    match err {
        CallError::TimedOut(after) => LockError::new(
            ErrorKind::Unavailable,
            operation,
            format!("no ZooKeeper session with {connect_string} within {after:?}"),
        )
        .with_backend(NAME),
        CallError::Zk(err) => {
            let kind = match err {
                zk::Error::BadArguments(_) => ErrorKind::Config,
                zk::Error::AuthFailed => ErrorKind::Config,
                zk::Error::Timeout => ErrorKind::Unavailable,
                _ => ErrorKind::Unavailable,
            };
            LockError::new(
                kind,
                operation,
                format!("cannot open a ZooKeeper session with {connect_string}: {err}"),
            )
            .with_backend(NAME)
            .with_source(err)
        }
    }
}

pub(crate) fn zk_error(operation: Operation, err: zk::Error) -> LockError {
    let kind = match &err {
        err if connection_failure(err) => ErrorKind::Unavailable,
        zk::Error::ConnectionLoss
        | zk::Error::NoHosts
        | zk::Error::SessionExpired
        | zk::Error::SessionMoved
        | zk::Error::ClientClosed
        | zk::Error::Throttled
        | zk::Error::NotReadOnly => ErrorKind::Unavailable,
        zk::Error::Timeout => ErrorKind::Timeout,
        zk::Error::BadArguments(_) => ErrorKind::InvalidArgument,
        _ => ErrorKind::Backend,
    };
    LockError::new(kind, operation, format!("ZooKeeper: {err}"))
        .with_backend(NAME)
        .with_source(err)
}

pub(crate) async fn timed<T, F>(timeout: Duration, call: F) -> Result<T, CallError>
where
    F: Future<Output = Result<T, zk::Error>>,
{
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(CallError::Zk(err)),
        Err(_) => Err(CallError::TimedOut(timeout)),
    }
}

/// [`timed`] for two requests made together and awaited together, on one
/// timer instead of one each: each answer that has not come `timeout`
/// after the call is `TimedOut`, as with two [`timed`] calls joined (an
/// answer that came in time is kept when the other's did not). The
/// requests are polled in order, `first` before `second`, then the timer.
///
/// The client has no timeout of its own, so each request needs ours; a
/// tokio timer is registered in the runtime's wheel on its first poll and
/// removed when dropped, and the create and list of every acquire went
/// through two of them. Measured (callgrind of `zk_bench_parts`'
/// `LockClient` side, `ONLY=3`, 600 cycles, 4 runs a side): tokio's timer
/// code about 550 instructions a cycle fewer, of about 63,500 a cycle;
/// within noise in wall-clock time.
pub(crate) async fn timed_pair<A, B, FA, FB>(
    timeout: Duration,
    first: FA,
    second: FB,
) -> (Result<A, CallError>, Result<B, CallError>)
where
    FA: Future<Output = Result<A, zk::Error>>,
    FB: Future<Output = Result<B, zk::Error>>,
{
    let mut first = std::pin::pin!(first);
    let mut second = std::pin::pin!(second);
    let mut timer = std::pin::pin!(tokio::time::sleep(timeout));
    let (mut first_answer, mut second_answer) = (None, None);
    std::future::poll_fn(|cx| {
        if first_answer.is_none()
            && let Poll::Ready(answer) = first.as_mut().poll(cx)
        {
            first_answer = Some(answer.map_err(CallError::Zk));
        }
        if second_answer.is_none()
            && let Poll::Ready(answer) = second.as_mut().poll(cx)
        {
            second_answer = Some(answer.map_err(CallError::Zk));
        }
        let timed_out = first_answer.is_none() || second_answer.is_none();
        if timed_out && timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        Poll::Ready((
            first_answer
                .take()
                .unwrap_or(Err(CallError::TimedOut(timeout))),
            second_answer
                .take()
                .unwrap_or(Err(CallError::TimedOut(timeout))),
        ))
    })
    .await
}

/// [`timed`] for a request that is safe to send again (a delete of our own
/// node by path): made by `call`, the first time at once (so requests made
/// together leave together), and again after a pause when the connection
/// broke with it in flight (the client reconnects, and the session lives
/// on across a reconnection), until it gets an answer or `timeout` has
/// passed since the first try. A repeated delete whose first copy was
/// applied answers `NoNode`.
pub(crate) fn timed_resending<T, F>(
    timeout: Duration,
    mut call: impl FnMut() -> F,
) -> impl Future<Output = Result<T, CallError>>
where
    F: Future<Output = Result<T, zk::Error>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut sent = Some(call());
    async move {
        let mut pause = Duration::from_millis(25);
        loop {
            let request = match sent.take() {
                Some(request) => request,
                None => call(),
            };
            match tokio::time::timeout_at(deadline, request).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err))
                    if connection_failure(&err)
                        && tokio::time::Instant::now() + pause < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(400));
                }
                Ok(Err(err)) => return Err(CallError::Zk(err)),
                Err(_) => return Err(CallError::TimedOut(timeout)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_millis(50);

    /// An answer that comes after `after`.
    async fn answer<T>(after: Duration, value: Result<T, zk::Error>) -> Result<T, zk::Error> {
        tokio::time::sleep(after).await;
        value
    }

    #[tokio::test]
    async fn timed_pair_gives_both_answers_in_time() {
        let (first, second) = timed_pair(
            TIMEOUT,
            answer(Duration::ZERO, Ok(1)),
            answer(Duration::from_millis(5), Err::<u8, _>(zk::Error::NoNode)),
        )
        .await;
        assert!(matches!(first, Ok(1)));
        assert!(second.is_err_and(|e| e.is(&zk::Error::NoNode)));
    }

    #[tokio::test]
    async fn timed_pair_keeps_the_answer_that_came_in_time() {
        let started = tokio::time::Instant::now();
        let (first, second) = timed_pair(
            TIMEOUT,
            answer(Duration::from_millis(5), Ok(1)),
            std::future::pending::<Result<u8, zk::Error>>(),
        )
        .await;
        assert!(started.elapsed() >= TIMEOUT);
        assert!(matches!(first, Ok(1)), "{first:?}");
        assert!(matches!(second, Err(CallError::TimedOut(t)) if t == TIMEOUT));
        let (first, second) = timed_pair(
            TIMEOUT,
            answer(Duration::from_secs(5), Ok::<u8, _>(1)),
            answer(Duration::from_millis(5), Ok(2)),
        )
        .await;
        assert!(matches!(first, Err(CallError::TimedOut(_))), "{first:?}");
        assert!(matches!(second, Ok(2)), "{second:?}");
    }

    /// The property above is what sets the pair apart from one timeout
    /// around the joined requests (the obvious way to share a timer),
    /// which loses the create's answer when the list's is late: the
    /// broken variant, checked to fail the same case.
    #[tokio::test]
    async fn one_timeout_around_the_join_would_lose_the_answer() {
        let joined = tokio::time::timeout(TIMEOUT, async {
            tokio::join!(
                answer(Duration::from_millis(5), Ok::<u8, zk::Error>(1)),
                std::future::pending::<Result<u8, zk::Error>>(),
            )
        })
        .await;
        assert!(joined.is_err(), "the create's answer is gone with the join");
    }
}
