//! An in-process TCP proxy between clients and a server, with faults:
//! added latency and jitter, partitions (traffic held, then delivered on
//! heal, like TCP retransmission across a healed link), blackholes (traffic
//! dropped, connections never recover) and resets (every connection cut).
//!
//! It also counts **round trips**: per connection, every time the server
//! answers after the client last sent something is one request/response
//! turn ([`FaultProxy::round_trips`]). Pipelined requests answered together
//! count once, as they cost one network round trip; traffic the server
//! sends on its own (a pub/sub message, a watch event) after a client's
//! request counts as a turn too, so measure on a quiet connection.
//!
//! Only for loopback test servers: it listens on 127.0.0.1.

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until};

pub use crate::faults::Flow;
use crate::faults::{FaultState, delay_for};
use crate::process::HarnessError;

mod cycles;

pub use cycles::{CycleCount, CyclePlan, count_cycles};

/// A running proxy. Stops (and closes every connection) on drop.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    state: watch::Sender<FaultState>,
    accept: JoinHandle<()>,
    connections: Arc<AtomicU64>,
    counters: Arc<Counters>,
}

/// What the proxy counted, over all its connections.
#[derive(Debug, Default)]
struct Counters {
    round_trips: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

/// Which way a connection's bytes last went (for counting turns).
const NONE: u8 = 0;
const UP: u8 = 1;
const DOWN: u8 = 2;

impl FaultProxy {
    /// Starts a proxy to `upstream` on a free loopback port.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub async fn start(upstream: SocketAddr) -> Result<Self, HarnessError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (state, state_rx) = watch::channel(FaultState::PASSING);
        let connections = Arc::new(AtomicU64::new(0));
        let counters = Arc::new(Counters::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            state_rx,
            connections.clone(),
            counters.clone(),
        ));
        Ok(Self {
            addr,
            upstream,
            state,
            accept,
            connections,
            counters,
        })
    }

    /// The same faults for an in-process backend: `inner` is reached through
    /// an in-process link that delays, holds, drops or cuts each request
    /// and reply as this proxy's settings say (see
    /// [`FaultLink`](crate::link::FaultLink)). The proxy has no listening
    /// socket (its address is `127.0.0.1:0`).
    pub fn in_process(
        inner: std::sync::Arc<dyn lock_core::LockBackend>,
        op_timeout: Duration,
    ) -> (std::sync::Arc<dyn lock_core::LockBackend>, Self) {
        let (state, state_rx) = watch::channel(FaultState::PASSING);
        let link = crate::link::FaultLink::new(inner, state_rx, op_timeout);
        let proxy = Self {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            upstream: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            state,
            accept: tokio::spawn(async {}),
            connections: Arc::new(AtomicU64::new(1)),
            counters: Arc::new(Counters::default()),
        };
        (std::sync::Arc::new(link), proxy)
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The server behind it.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Request/response turns seen so far, summed over connections: on each
    /// connection, one turn each time the server sends after the client
    /// last did. An in-process proxy ([`FaultProxy::in_process`]) has no
    /// wire and counts nothing.
    pub fn round_trips(&self) -> u64 {
        self.counters.round_trips.load(Ordering::Relaxed)
    }

    /// Bytes forwarded so far, client to server and server to client.
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.counters.bytes_up.load(Ordering::Relaxed),
            self.counters.bytes_down.load(Ordering::Relaxed),
        )
    }

    /// Sets the round-trip and byte counters back to zero (open
    /// connections keep their direction, so a reply in flight still
    /// counts once).
    pub fn reset_counters(&self) {
        self.counters.round_trips.store(0, Ordering::Relaxed);
        self.counters.bytes_up.store(0, Ordering::Relaxed);
        self.counters.bytes_down.store(0, Ordering::Relaxed);
    }

    /// Adds `latency ± jitter` to every chunk in both directions.
    pub fn set_latency(&self, latency: Duration, jitter: Duration) {
        self.state.send_modify(|s| {
            s.latency = latency;
            s.jitter = jitter;
        });
    }

    /// Tears every reply in two: of each chunk the server sends from now
    /// on, the first `head` bytes are delivered (after the latency) and the
    /// rest `pause` later, so that a client is caught mid-reply, with part
    /// of a message read; `None` stops it. Requests are not torn.
    pub fn tear_replies(&self, torn: Option<(usize, Duration)>) {
        self.state.send_modify(|s| s.torn = torn);
    }

    /// Holds all traffic until [`heal`](Self::heal).
    pub fn partition(&self) {
        self.state.send_modify(|s| s.flow = Flow::Partition);
    }

    /// Drops all traffic; connections open now are closed at heal.
    pub fn blackhole(&self) {
        self.state.send_modify(|s| s.flow = Flow::Blackhole);
    }

    /// Closes every open connection at once (clients see a reset / EOF).
    pub fn reset(&self) {
        self.state.send_modify(|s| s.generation += 1);
    }

    /// Back to normal flow (no latency change). Connections that lived
    /// through a blackhole are closed, since their streams lost data.
    pub fn heal(&self) {
        self.state.send_modify(|s| {
            if s.flow == Flow::Blackhole {
                s.generation += 1;
            }
            s.flow = Flow::Pass;
        });
    }

    /// Partitions for `duration`, then heals.
    pub async fn partition_for(&self, duration: Duration) {
        self.partition();
        sleep(duration).await;
        self.heal();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Cut every connection: their pumps watch the generation.
        self.state.send_modify(|s| s.generation += 1);
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    state: watch::Receiver<FaultState>,
    connections: Arc<AtomicU64>,
    counters: Arc<Counters>,
) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        connections.fetch_add(1, Ordering::Relaxed);
        let state = state.clone();
        let counters = counters.clone();
        tokio::spawn(async move {
            let _ = client.set_nodelay(true);
            // A partition also holds new connections: the SYN got through
            // (we accepted) but nothing else does.
            let generation = state.borrow().generation;
            if !wait_flowing(&mut state.clone(), generation).await {
                return;
            }
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            let _ = server.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let turn = Arc::new(AtomicU8::new(NONE));
            let up = tokio::spawn(pump(
                client_read,
                server_write,
                state.clone(),
                generation,
                Counting {
                    counters: counters.clone(),
                    turn: turn.clone(),
                    direction: UP,
                },
            ));
            let down = tokio::spawn(pump(
                server_read,
                client_write,
                state,
                generation,
                Counting {
                    counters,
                    turn,
                    direction: DOWN,
                },
            ));
            // When one direction ends, end the other too.
            tokio::select! {
                _ = up => {}
                _ = down => {}
            }
        });
    }
}

/// Waits until traffic may flow; `false` when the connection was cut.
async fn wait_flowing(state: &mut watch::Receiver<FaultState>, generation: u64) -> bool {
    loop {
        {
            let s = state.borrow_and_update();
            if s.generation != generation {
                return false;
            }
            if s.flow == Flow::Pass {
                return true;
            }
        }
        if state.changed().await.is_err() {
            return false;
        }
    }
}

/// One direction of a connection's share of the counters.
struct Counting {
    counters: Arc<Counters>,
    /// The connection's last direction, shared by its two pumps.
    turn: Arc<AtomicU8>,
    direction: u8,
}

impl Counting {
    /// Counts `n` bytes forwarded; a server chunk after a client one is a
    /// new turn.
    fn forwarded(&self, n: usize) {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        if self.direction == UP {
            self.turn.store(UP, Ordering::Relaxed);
            self.counters.bytes_up.fetch_add(n, Ordering::Relaxed);
        } else {
            if self.turn.swap(DOWN, Ordering::Relaxed) == UP {
                self.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            }
            self.counters.bytes_down.fetch_add(n, Ordering::Relaxed);
        }
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<FaultState>,
    generation: u64,
    counting: Counting,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut rng = generation.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    // Chunks read and not yet due: each is delivered at its own arrival
    // plus the delay, as a link with latency delivers packets, so chunks
    // that arrive together (a request written in several writes) arrive
    // together, not one delay after another. Never earlier than the chunk
    // before it (TCP keeps order).
    let mut in_flight: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    loop {
        // Partitions stop reading, so bytes wait in the kernel buffers and
        // flow on after the heal, as TCP would deliver them. Chunks already
        // in flight are still delivered.
        if in_flight.is_empty()
            && state.borrow().flow == Flow::Partition
            && !wait_flowing(&mut state, generation).await
        {
            return;
        }
        let due = in_flight.front().map(|(at, _)| *at);
        let reading = state.borrow().flow != Flow::Partition && in_flight.len() < MAX_IN_FLIGHT;
        let n = tokio::select! {
            read = from.read(&mut buf), if reading => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            () = sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                if let Some((_, chunk)) = in_flight.pop_front()
                    && !deliver(&mut to, &chunk, &counting).await
                {
                    return;
                }
                continue;
            }
            () = cut(&mut state, generation) => return,
        };
        let current = *state.borrow();
        if current.generation != generation {
            return;
        }
        match current.flow {
            Flow::Blackhole => continue,
            Flow::Partition => {
                if !wait_flowing(&mut state, generation).await {
                    return;
                }
            }
            Flow::Pass => {}
        }
        let delay = delay_for(current.latency, current.jitter, &mut rng);
        if let Some((head, pause)) = current.torn
            && counting.direction == DOWN
            && n > head
        {
            let at = Instant::now() + delay;
            let at = in_flight.back().map_or(at, |(last, _)| at.max(*last));
            in_flight.push_back((at, buf[..head].to_vec()));
            in_flight.push_back((at + pause, buf[head..n].to_vec()));
            continue;
        }
        if delay.is_zero() && in_flight.is_empty() {
            if !deliver(&mut to, &buf[..n], &counting).await {
                return;
            }
            continue;
        }
        let at = Instant::now() + delay;
        let at = in_flight.back().map_or(at, |(last, _)| at.max(*last));
        in_flight.push_back((at, buf[..n].to_vec()));
    }
}

/// The most chunks one direction holds in flight; past it, reading waits
/// (the sender then sees TCP's back-pressure).
const MAX_IN_FLIGHT: usize = 1024;

/// Writes a chunk on; `false` once the other side is gone.
async fn deliver(
    to: &mut tokio::net::tcp::OwnedWriteHalf,
    chunk: &[u8],
    counting: &Counting,
) -> bool {
    // Counted before the write: the other side may answer as soon as the
    // bytes are out, and its reply must see this direction.
    counting.forwarded(chunk.len());
    to.write_all(chunk).await.is_ok()
}

/// Resolves when the connection is cut (generation changed).
async fn cut(state: &mut watch::Receiver<FaultState>, generation: u64) {
    loop {
        if state.borrow().generation != generation {
            return;
        }
        if state.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::{Instant, timeout};

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn ping(stream: &mut TcpStream) -> std::io::Result<()> {
        stream.write_all(b"ping").await?;
        let mut buf = [0u8; 4];
        stream.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"ping");
        Ok(())
    }

    /// A proxy in front of an echo server, and a connection through it.
    async fn proxied_echo() -> (FaultProxy, TcpStream) {
        let proxy = FaultProxy::start(echo_server().await).await.unwrap();
        let stream = TcpStream::connect(proxy.addr()).await.unwrap();
        (proxy, stream)
    }

    /// A ping on `stream` gets no answer within 200 ms.
    async fn assert_unanswered(stream: &mut TcpStream) {
        assert!(
            timeout(Duration::from_millis(200), ping(stream))
                .await
                .is_err()
        );
    }

    /// The proxy closed `stream` within 2 s; `survived` says otherwise.
    async fn assert_closed(stream: &mut TcpStream, survived: &str) {
        let mut buf = [0u8; 4];
        let read = timeout(Duration::from_secs(2), stream.read(&mut buf))
            .await
            .unwrap();
        assert!(matches!(read, Ok(0) | Err(_)), "{survived}: {read:?}");
    }

    /// Chunks written one after another are each delayed from their own
    /// arrival, as a link with latency delivers packets: a request written
    /// in five writes 10 ms apart arrives about one delay after the last
    /// write, not five delays after the first (the proxy once slept before
    /// reading each next chunk, which charged clients that write a request
    /// in several writes, HTTP/2 frames, one delay per write).
    #[tokio::test]
    async fn chunks_are_delayed_from_their_own_arrival() {
        let (proxy, mut stream) = proxied_echo().await;
        // Each write its own segment (no Nagle coalescing on the way in).
        stream.set_nodelay(true).unwrap();
        ping(&mut stream).await.unwrap();
        let delay = Duration::from_millis(300);
        proxy.set_latency(delay, Duration::ZERO);
        let started = Instant::now();
        for _ in 0..5 {
            stream.write_all(b"x").await.unwrap();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut echoed = [0u8; 5];
        stream.read_exact(&mut echoed).await.unwrap();
        let took = started.elapsed();
        // Two legs of 300 ms after the last write: about 640 ms. One delay
        // per chunk would take at least 5 x 300 ms up and 300 ms down.
        assert!(took >= 2 * delay, "delivered early: {took:?}");
        assert!(
            took < 3 * delay,
            "delays added up chunk after chunk: {took:?}"
        );
        // Order kept under jitter: each chunk's own delay varies, the
        // stream does not reorder.
        proxy.set_latency(Duration::from_millis(20), Duration::from_millis(15));
        for b in b"abcdefgh" {
            stream.write_all(&[*b]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let mut echoed = [0u8; 8];
        stream.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"abcdefgh");
    }

    /// A torn reply arrives in two parts: its head at once, the rest one
    /// pause later; requests pass whole.
    #[tokio::test]
    async fn torn_replies_arrive_in_two_parts() {
        let (proxy, mut stream) = proxied_echo().await;
        stream.set_nodelay(true).unwrap();
        ping(&mut stream).await.unwrap();
        let pause = Duration::from_millis(300);
        proxy.tear_replies(Some((3, pause)));
        let started = Instant::now();
        stream.write_all(b"abcdefgh").await.unwrap();
        let mut head = [0u8; 3];
        timeout(pause / 2, stream.read_exact(&mut head))
            .await
            .expect("the head comes at once")
            .unwrap();
        assert_eq!(&head, b"abc");
        let mut rest = [0u8; 5];
        stream.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"defgh");
        assert!(started.elapsed() >= pause, "the rest came early");
        proxy.tear_replies(None);
        let started = Instant::now();
        ping(&mut stream).await.unwrap();
        assert!(started.elapsed() < pause, "still torn after None");
    }

    #[tokio::test]
    async fn passes_delays_partitions_and_resets() {
        let (proxy, mut stream) = proxied_echo().await;
        ping(&mut stream).await.unwrap();

        proxy.set_latency(Duration::from_millis(50), Duration::ZERO);
        let started = Instant::now();
        ping(&mut stream).await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(100),
            "two legs of 50 ms"
        );
        proxy.set_latency(Duration::ZERO, Duration::ZERO);

        proxy.partition();
        assert_unanswered(&mut stream).await;
        proxy.heal();
        // The held ping is delivered after the heal: read its echo, then a
        // fresh one works.
        let mut buf = [0u8; 4];
        timeout(Duration::from_secs(2), stream.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        ping(&mut stream).await.unwrap();

        proxy.reset();
        assert_closed(&mut stream, "reset connection still open").await;
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        ping(&mut fresh).await.unwrap();
    }

    #[tokio::test]
    async fn counts_one_round_trip_per_request_answered() {
        let (proxy, mut stream) = proxied_echo().await;
        for _ in 0..5 {
            ping(&mut stream).await.unwrap();
        }
        assert_eq!(proxy.round_trips(), 5);
        assert_eq!(proxy.bytes(), (20, 20));
        // Two requests in one write, answered together: one turn.
        proxy.reset_counters();
        stream.write_all(b"pingping").await.unwrap();
        let mut buf = [0u8; 8];
        stream.read_exact(&mut buf).await.unwrap();
        assert_eq!(proxy.round_trips(), 1);
        // A second connection counts on its own.
        let mut other = TcpStream::connect(proxy.addr()).await.unwrap();
        ping(&mut other).await.unwrap();
        ping(&mut stream).await.unwrap();
        assert_eq!(proxy.round_trips(), 3);
    }

    #[tokio::test]
    async fn blackhole_drops_and_closes_on_heal() {
        let (proxy, mut stream) = proxied_echo().await;
        ping(&mut stream).await.unwrap();
        proxy.blackhole();
        assert_unanswered(&mut stream).await;
        proxy.heal();
        assert_closed(&mut stream, "blackholed connection survived").await;
        let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
        ping(&mut fresh).await.unwrap();
        assert!(proxy.connections() >= 2);
    }
}
