//! The driver's own channel under `etcd-client`: one HTTP/2 connection
//! (the `h2` crate over a tokio `TcpStream`, with `tokio-rustls` for
//! `etcds://`) to one member at a time, instead of tonic's balanced
//! channel (`etcd_client::Client::connect`).
//!
//! Why it stays: the test `a_client_leaves_a_member_cut_from_its_peers` in
//! `tests/partition.rs` (a three-member cluster in the kernel's partition
//! lab, the client listing first a follower that is then cut from its
//! peers while the client still reaches it) passes on this channel and
//! fails on `etcd-client`'s own: tonic's balancer keeps sending a share of
//! the calls to the cut member, which cannot commit anything ("no leader",
//! or no answer), for as long as the cut lasts, and the client cannot tell
//! which member served a call to take it out of the balancer. Latency does
//! not justify it: at 1 ms round-trip time (the fault proxy, `lock-bench`'s
//! `etcd_transport` probe) the two channels' p50 are within a few percent.
//!
//! What it does in tonic's place:
//! - **Members**: it talks to one member at a time and moves to the next
//!   one (in the configured order, wrapping around) when the connection
//!   breaks, cannot be opened within the connect timeout, the member
//!   answers `Unavailable` (etcd's "no leader", "leader changed", "request
//!   timed out", "server stopped"), or a caller gives up on a call that
//!   waited a second or more for its answer, so that a member cut off from
//!   the majority is left. Streams already open stay on their connection
//!   until they end.
//! - **Keep-alive**: an HTTP/2 PING after `interval` without anything
//!   received, and the connection dropped when its PONG is not back within
//!   `timeout` (what tonic's `http2_keep_alive_interval` does).
//! - **Streams** (watch, lease keep-alive): the request body is piped by
//!   a task that takes the next message only when the stream has send
//!   window, so a member that stops reading holds the body back.
//! - **Errors**: a transport failure is a gRPC `Unavailable` status whose
//!   message starts with "transport error", as the driver's error mapping
//!   expects from tonic.
//! - **TLS**: rustls (ring), ALPN `h2`, the server name from the endpoint
//!   or the configured `domain`; a certificate rejected either way is a
//!   handshake error whose text the driver's error mapping recognizes.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use h2::client::SendRequest;
use h2::{Ping, PingPong, RecvStream, SendStream};
use http_body::{Body, Frame};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::rustls;
use tonic::Status;

type TonicBody = tonic::body::Body;

/// The receive window of each stream and of the connection (hyper's
/// defaults for an HTTP/2 client, which tonic's channel uses).
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;

/// gRPC's `Unavailable` code, as it stands in a `grpc-status` header.
const UNAVAILABLE: &[u8] = b"14";

/// A tower service for `etcd_client::Channel::Custom`; clones share the
/// connection.
#[derive(Clone)]
pub(crate) struct BareChannel {
    shared: Arc<Shared>,
}

/// TLS for every member: the client configuration and the name to verify
/// instead of each endpoint's host.
pub(crate) struct ChannelTls {
    pub(crate) connector: tokio_rustls::TlsConnector,
    pub(crate) domain: Option<String>,
}

struct Shared {
    /// `host:port` of each member, in the configured order.
    endpoints: Vec<http::uri::Authority>,
    connect_timeout: Duration,
    /// (interval, timeout) of the keep-alive pings.
    keep_alive: (Duration, Duration),
    tls: Option<ChannelTls>,
    /// `https` with TLS, else `http`: the scheme of every request's URI.
    scheme: http::uri::Scheme,
    /// The connection requests go to, if one is open.
    current: Mutex<Option<Conn>>,
    /// Held while a connection is being opened, so that concurrent calls
    /// open one.
    connecting: tokio::sync::Mutex<()>,
    /// The member to try first when the next connection is opened.
    next: AtomicUsize,
    generations: AtomicU64,
}

#[derive(Clone)]
struct Conn {
    send: SendRequest<Bytes>,
    endpoint: usize,
    generation: u64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A transport failure, as tonic reports one.
fn transport_error(what: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("transport error: {what}"))
}

impl BareChannel {
    /// A channel to `endpoints` (`host:port` each); nothing is opened until
    /// the first call.
    ///
    /// # Errors
    ///
    /// A message naming the endpoint that is not a valid `host:port`.
    pub(crate) fn new(
        endpoints: &[String],
        connect_timeout: Duration,
        keep_alive: (Duration, Duration),
        tls: Option<ChannelTls>,
    ) -> Result<Self, String> {
        let endpoints = endpoints
            .iter()
            .map(|e| {
                e.parse::<http::uri::Authority>()
                    .map_err(|err| format!("bad etcd endpoint {e:?}: {err}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err("no etcd endpoint".to_owned());
        }
        Ok(Self {
            shared: Arc::new(Shared {
                endpoints,
                connect_timeout,
                keep_alive,
                scheme: if tls.is_some() {
                    http::uri::Scheme::HTTPS
                } else {
                    http::uri::Scheme::HTTP
                },
                tls,
                current: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                next: AtomicUsize::new(0),
                generations: AtomicU64::new(0),
            }),
        })
    }
}

impl tower::Service<http::Request<TonicBody>> for BareChannel {
    type Response = http::Response<TonicBody>;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is waited for in the call: a broken connection is
        // replaced there.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<TonicBody>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move { shared.call(request).await.map_err(Into::into) })
    }
}

impl Shared {
    async fn call(
        self: Arc<Self>,
        request: http::Request<TonicBody>,
    ) -> Result<http::Response<TonicBody>, Status> {
        // A connection found closed before anything was sent on it (the
        // server restarted, say) is replaced once: nothing of this call
        // has left yet.
        let mut retried = false;
        let (conn, mut send) = loop {
            let conn = self.connection().await?;
            match conn.send.clone().ready().await {
                Ok(send) => break (conn, send),
                Err(err) => {
                    self.broken(conn.endpoint, conn.generation);
                    if retried {
                        return Err(transport_error(err));
                    }
                    retried = true;
                }
            }
        };
        let (mut parts, mut body) = request.into_parts();
        let (data, ended) = take_ready(&mut body).await?;
        let path = parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
        parts.uri = http::Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.endpoints[conn.endpoint].clone())
            .path_and_query(path)
            .build()
            .map_err(|e| Status::internal(format!("request URI: {e}")))?;
        parts.version = http::Version::HTTP_2;
        let head = http::Request::from_parts(parts, ());
        let (response, mut stream) = send
            .send_request(head, ended && data.is_empty())
            .map_err(|e| self.failed(&conn, &e))?;
        if !data.is_empty() {
            stream
                .send_data(data, ended)
                .map_err(|e| self.failed(&conn, &e))?;
        }
        if !ended {
            tokio::spawn(pipe(body, stream));
        }
        let mut waiting = Waiting {
            shared: &self,
            conn: &conn,
            since: std::time::Instant::now(),
            answered: false,
        };
        let response = response.await;
        waiting.answered = true;
        let response = response.map_err(|e| self.failed(&conn, &e))?;
        // A member without a leader (or stopping) answers at once with the
        // status in the headers: the next calls go to another member.
        if response
            .headers()
            .get("grpc-status")
            .is_some_and(|s| s.as_bytes() == UNAVAILABLE)
        {
            self.move_on(&conn);
        }
        Ok(response.map(|recv| {
            TonicBody::new(Recv {
                recv,
                data_done: false,
            })
        }))
    }

    /// The open connection, or a new one.
    async fn connection(self: &Arc<Self>) -> Result<Conn, Status> {
        if let Some(conn) = lock(&self.current).clone() {
            return Ok(conn);
        }
        let _opening = self.connecting.lock().await;
        if let Some(conn) = lock(&self.current).clone() {
            return Ok(conn);
        }
        let first = self.next.load(Ordering::Relaxed);
        let count = self.endpoints.len();
        let mut last = String::new();
        for i in 0..count {
            let endpoint = (first + i) % count;
            // Moved past before the attempt: if the caller gives up during
            // it (a member that drops connection attempts can take the
            // whole connect timeout), the next call tries the next member.
            self.next.store((endpoint + 1) % count, Ordering::Relaxed);
            match tokio::time::timeout(self.connect_timeout, self.open(endpoint)).await {
                Ok(Ok(conn)) => {
                    self.next.store(endpoint, Ordering::Relaxed);
                    *lock(&self.current) = Some(conn.clone());
                    return Ok(conn);
                }
                Ok(Err(err)) => last = format!("{}: {err}", self.endpoints[endpoint]),
                Err(_) => {
                    last = format!(
                        "{}: no connection within {:?}",
                        self.endpoints[endpoint], self.connect_timeout
                    );
                }
            }
        }
        Err(transport_error(format_args!(
            "no etcd endpoint could be reached (last: {last})"
        )))
    }

    /// Opens a connection to member `endpoint` and starts its task.
    async fn open(self: &Arc<Self>, endpoint: usize) -> Result<Conn, String> {
        let authority = &self.endpoints[endpoint];
        let tcp = TcpStream::connect(authority.as_str())
            .await
            .map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return self.start(tcp, endpoint).await;
        };
        let host = tls.domain.as_deref().unwrap_or_else(|| {
            let host = authority.host();
            host.strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host)
        });
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| format!("bad TLS server name {host:?}: {e}"))?;
        let stream = tls
            .connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        self.start(stream, endpoint).await
    }

    /// Says hello in HTTP/2 over `io` and starts the connection's task.
    async fn start<T>(self: &Arc<Self>, io: T, endpoint: usize) -> Result<Conn, String>
    where
        T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let heard = Arc::new(AtomicBool::new(false));
        let io = Heard {
            io,
            heard: heard.clone(),
        };
        // Receive windows as hyper's defaults (tonic's channel): a large
        // answer (a key listing of megabytes) flows without a window
        // update per 64 KiB.
        let (send, mut connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake(io)
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let conn = Conn {
            send,
            endpoint,
            generation,
        };
        let pings = connection.ping_pong();
        let (interval, timeout) = self.keep_alive;
        let this: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let keep_alive = async move {
                match pings {
                    Some(pings) => keep_alive(pings, heard, interval, timeout).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = connection => {}
                () = keep_alive => {
                    tracing::debug!(target: "lock_etcd", "etcd connection missed its keep-alive");
                }
            }
            if let Some(shared) = this.upgrade() {
                shared.broken(endpoint, generation);
            }
        });
        Ok(conn)
    }

    /// The connection failed: the next call opens another one, starting
    /// with the next member.
    /// (The connection's task holds no `SendRequest`, or the connection
    /// would never end.)
    fn broken(&self, endpoint: usize, generation: u64) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|c| c.generation == generation) {
            *current = None;
            self.next
                .store((endpoint + 1) % self.endpoints.len(), Ordering::Relaxed);
        }
    }

    /// The member cannot serve now: with other members, the next call
    /// opens a connection to the next one (this one is left to its open
    /// streams).
    fn move_on(&self, conn: &Conn) {
        if self.endpoints.len() > 1 {
            self.broken(conn.endpoint, conn.generation);
        }
    }

    fn failed(&self, conn: &Conn, err: &h2::Error) -> Status {
        if err.is_io() || err.is_go_away() || err.reason().is_none() {
            self.broken(conn.endpoint, conn.generation);
        }
        transport_error(err)
    }
}

/// A call waiting for its answer; when its caller gives up on it after
/// [`ABANDONED`] (the driver's per-call timeout, or any other reason), the
/// member is taken for unresponsive and the next calls go to the next one.
/// A member partitioned from its peers may still believe it has a leader
/// and hold every write until etcd's own request timeout (about 7 s),
/// longer than a caller waits.
struct Waiting<'a> {
    shared: &'a Shared,
    conn: &'a Conn,
    since: std::time::Instant,
    answered: bool,
}

/// How long a call waits for its answer before its caller giving up on it
/// counts against the member.
const ABANDONED: Duration = Duration::from_secs(1);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered && self.since.elapsed() >= ABANDONED {
            tracing::debug!(target: "lock_etcd", "a call was abandoned after {:?}: next member", self.since.elapsed());
            self.shared.move_on(self.conn);
        }
    }
}

/// Takes what the request body has ready now: (the data, whether the body
/// ended). A unary request's body is complete at once.
async fn take_ready(body: &mut TonicBody) -> Result<(Bytes, bool), Status> {
    let mut data = BytesMut::new();
    let ended = poll_fn(|cx| {
        loop {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(chunk) = frame.into_data() {
                        data.extend_from_slice(&chunk);
                    }
                }
                Poll::Ready(Some(Err(status))) => return Poll::Ready(Err(status)),
                Poll::Ready(None) => return Poll::Ready(Ok(true)),
                Poll::Pending => return Poll::Ready(Ok(false)),
            }
        }
    })
    .await?;
    Ok((data.freeze(), ended))
}

/// Sends the rest of a streaming request's body, message by message, until
/// it ends or the stream is reset. The next message is taken from the body
/// only once the stream has send window again (as hyper does), so a member
/// that stops reading holds the body back instead of having every message
/// buffered in memory.
async fn pipe(mut body: TonicBody, mut stream: SendStream<Bytes>) {
    loop {
        stream.reserve_capacity(1);
        let next = poll_fn(|cx| {
            if stream.poll_reset(cx).is_ready() {
                return Poll::Ready(None);
            }
            while stream.capacity() == 0 {
                match ready!(stream.poll_capacity(cx)) {
                    Some(Ok(_)) => {}
                    // Reset, or the connection is gone.
                    Some(Err(_)) | None => return Poll::Ready(None),
                }
            }
            Pin::new(&mut body).poll_frame(cx).map(Some)
        })
        .await;
        match next {
            // Reset by the server, or the connection is gone.
            None => return,
            Some(Some(Ok(frame))) => {
                if let Ok(chunk) = frame.into_data()
                    && stream.send_data(chunk, false).is_err()
                {
                    return;
                }
            }
            Some(Some(Err(_))) => {
                stream.send_reset(h2::Reason::CANCEL);
                return;
            }
            Some(None) => {
                let _ = stream.send_data(Bytes::new(), true);
                return;
            }
        }
    }
}

/// Pings after `interval` without anything received; returns when a PONG
/// is not back within `timeout`.
async fn keep_alive(
    mut pings: PingPong,
    heard: Arc<AtomicBool>,
    interval: Duration,
    timeout: Duration,
) {
    loop {
        tokio::time::sleep(interval).await;
        if heard.swap(false, Ordering::Relaxed) {
            continue;
        }
        match tokio::time::timeout(timeout, pings.ping(Ping::opaque())).await {
            Ok(Ok(_)) => {}
            _ => return,
        }
    }
}

/// A response body: the data frames, then the trailers (where gRPC puts
/// the status).
struct Recv {
    recv: RecvStream,
    data_done: bool,
}

impl Body for Recv {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if !this.data_done {
            match ready!(this.recv.poll_data(cx)) {
                Some(Ok(chunk)) => {
                    let _ = this.recv.flow_control().release_capacity(chunk.len());
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                Some(Err(err)) => return Poll::Ready(Some(Err(transport_error(err)))),
                None => this.data_done = true,
            }
        }
        Poll::Ready(match ready!(this.recv.poll_trailers(cx)) {
            Ok(Some(trailers)) => Some(Ok(Frame::trailers(trailers))),
            Ok(None) => None,
            Err(err) => Some(Err(transport_error(err))),
        })
    }

    fn is_end_stream(&self) -> bool {
        self.recv.is_end_stream()
    }
}

/// A connection's stream that notes when something was received (for the
/// keep-alive).
struct Heard<T> {
    io: T,
    heard: Arc<AtomicBool>,
}

impl<T: AsyncRead + Unpin> AsyncRead for Heard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.heard.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Heard<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member whose TCP handshake never completes (its accept queue is
    /// full, so the kernel drops the SYN): a call that gives up while
    /// connecting to it leaves the next call to the next member.
    #[tokio::test]
    async fn a_call_abandoned_while_connecting_moves_on() {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let full = socket.listen(0).unwrap();
        let addr = full.local_addr().unwrap();
        let mut queued = Vec::new();
        for _ in 0..4 {
            if let Ok(Ok(stream)) =
                tokio::time::timeout(Duration::from_millis(100), TcpStream::connect(addr)).await
            {
                queued.push(stream);
            }
        }
        let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoints = [addr.to_string(), other.local_addr().unwrap().to_string()];
        let channel = BareChannel::new(
            &endpoints,
            Duration::from_secs(30),
            (Duration::from_secs(2), Duration::from_secs(2)),
            None,
        )
        .unwrap();
        let shared = channel.shared.clone();
        let gave_up = tokio::time::timeout(Duration::from_millis(200), shared.connection()).await;
        assert!(
            gave_up.is_err(),
            "the connection to the full member was made"
        );
        assert_eq!(shared.next.load(Ordering::Relaxed), 1);
    }

    /// A gRPC server on loopback that answers every call at once with
    /// `grpc-status` in the headers (a trailers-only answer, as etcd gives
    /// "no leader"), counting the calls it got.
    async fn answering(status: &'static str) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = calls.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    let Ok(mut conn) = h2::server::handshake(tcp).await else {
                        return;
                    };
                    while let Some(Ok((_, mut respond))) = conn.accept().await {
                        counted.fetch_add(1, Ordering::Relaxed);
                        let answer = http::Response::builder()
                            .header("content-type", "application/grpc")
                            .header("grpc-status", status)
                            .body(())
                            .unwrap();
                        let _ = respond.send_response(answer, true);
                    }
                });
            }
        });
        (addr, calls)
    }

    /// A member answering `Unavailable` in the headers (etcd's "no
    /// leader", "leader changed", "server stopped") sends the next call to
    /// the next member; an answer with another status does not.
    #[tokio::test]
    async fn a_member_answering_unavailable_is_left() {
        let (no_leader, no_leader_calls) = answering("14").await;
        let (fine, fine_calls) = answering("0").await;
        let channel = BareChannel::new(
            &[no_leader, fine],
            Duration::from_secs(5),
            (Duration::from_secs(2), Duration::from_secs(2)),
            None,
        )
        .unwrap();
        let call = || {
            let request = http::Request::builder()
                .uri("http://etcd/etcdserverpb.KV/Txn")
                .body(TonicBody::empty())
                .unwrap();
            channel.shared.clone().call(request)
        };
        let first = call().await.unwrap();
        assert_eq!(first.headers()["grpc-status"], "14");
        for _ in 0..3 {
            let next = call().await.unwrap();
            assert_eq!(next.headers()["grpc-status"], "0");
        }
        assert_eq!(no_leader_calls.load(Ordering::Relaxed), 1);
        assert_eq!(fine_calls.load(Ordering::Relaxed), 3);
    }

    /// A streaming request body of `total` messages of 1 KiB, counting the
    /// messages taken from it; nothing is ready at its first poll (as a
    /// watch's body before its first message), so the call sends the
    /// headers alone and the rest is piped.
    struct Messages {
        taken: Arc<AtomicUsize>,
        total: usize,
        polled: bool,
    }

    impl Body for Messages {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            if !self.polled {
                self.polled = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            if self.taken.fetch_add(1, Ordering::Relaxed) >= self.total {
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![0u8; 1024])))))
        }

        fn is_end_stream(&self) -> bool {
            false
        }
    }

    /// A member that answers a streaming call's headers and then never
    /// reads it: the channel takes a send window's worth of messages from
    /// the body (HTTP/2's initial 64 KiB) and waits, instead of buffering
    /// all of them.
    #[tokio::test]
    async fn a_stream_nobody_reads_holds_its_body_back() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut conn = h2::server::handshake(tcp).await.unwrap();
            let mut kept = Vec::new();
            while let Some(Ok((request, mut respond))) = conn.accept().await {
                let answer = http::Response::builder()
                    .header("content-type", "application/grpc")
                    .body(())
                    .unwrap();
                kept.push((request, respond.send_response(answer, false).unwrap()));
            }
        });
        let channel = BareChannel::new(
            &[addr],
            Duration::from_secs(5),
            (Duration::from_secs(30), Duration::from_secs(30)),
            None,
        )
        .unwrap();
        let taken = Arc::new(AtomicUsize::new(0));
        let request = http::Request::builder()
            .uri("http://etcd/etcdserverpb.Watch/Watch")
            .body(TonicBody::new(Messages {
                taken: taken.clone(),
                total: 1000,
                polled: false,
            }))
            .unwrap();
        let _response = channel.shared.clone().call(request).await.unwrap();
        // Until a window's worth is taken (at most 10 s on a loaded
        // machine), then a while for anything beyond it.
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while taken.load(Ordering::Relaxed) < 64 && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let taken = taken.load(Ordering::Relaxed);
        assert!(
            (64..=66).contains(&taken),
            "{taken} messages of 1 KiB taken for a 64 KiB window"
        );
    }

    #[test]
    fn bad_endpoints_are_refused() {
        let keep_alive = (Duration::from_secs(2), Duration::from_secs(2));
        assert!(BareChannel::new(&[], Duration::from_secs(1), keep_alive, None).is_err());
        let err = BareChannel::new(
            &["a b:1".to_owned()],
            Duration::from_secs(1),
            keep_alive,
            None,
        )
        .err()
        .unwrap();
        assert!(err.contains("a b:1"), "{err}");
    }
}
