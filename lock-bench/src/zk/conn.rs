//! The floor's one bare TCP connection: the session handshake, a
//! request's exchange (write, then read the reply of its xid), and the
//! keep-alive pings of an idle session. Everything here is jute
//! ([`super::wire`]) on a `TcpStream`, with no ZooKeeper client crate.

use std::sync::Weak;
use std::time::Duration;

use lock_core::{ErrorKind, LockError, Operation};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep_until, timeout};

use lock_zk::ZkConfig;

use super::wire::{
    ConnectResponse, Decoder, Encoder, ReplyHeader, WireError, op, read_packet, xid,
};
use super::{NAME, Shared};

/// The connection and what is known of its state.
pub(super) struct Conn {
    stream: TcpStream,
    next_xid: i32,
    last_sent: Instant,
    /// Why the connection can no longer be used.
    broken: Option<String>,
    /// A request was written and its reply not read yet; still set when a
    /// call is dropped mid-way, which makes the next call give up.
    in_flight: bool,
}

impl Conn {
    pub(super) fn take_xid(&mut self) -> i32 {
        let xid = self.next_xid;
        self.next_xid = if xid == i32::MAX { 1 } else { xid + 1 };
        xid
    }

    /// Writes `packet` (a request of `xid`) and reads its reply: the reply
    /// header's error code and the body after the header. Watch
    /// notifications are skipped (the floor sets no watch, but a server may
    /// still send one). Any failure breaks the connection for good.
    pub(super) async fn exchange(
        &mut self,
        packet: Vec<u8>,
        xid: i32,
        patience: Duration,
    ) -> Result<(i32, Vec<u8>), WireError> {
        let mut replies = self.exchange_all(packet, &[xid], patience).await?;
        Ok(replies.remove(0))
    }

    /// [`Conn::exchange`] of several requests written at once (`packets`,
    /// one after another, of `xids` in that order): their replies, in order.
    pub(super) async fn exchange_all(
        &mut self,
        packets: Vec<u8>,
        xids: &[i32],
        patience: Duration,
    ) -> Result<Vec<(i32, Vec<u8>)>, WireError> {
        if let Some(why) = &self.broken {
            return Err(WireError::Broken(why.clone()));
        }
        if self.in_flight {
            let why = "an earlier call was dropped mid-request".to_owned();
            self.broken = Some(why.clone());
            return Err(WireError::Broken(why));
        }
        self.in_flight = true;
        self.last_sent = Instant::now();
        let stream = &mut self.stream;
        let exchange = async {
            stream.write_all(&packets).await?;
            let mut replies = Vec::with_capacity(xids.len());
            while let Some(&xid) = xids.get(replies.len()) {
                let reply = read_packet(stream).await?;
                let mut decoder = Decoder::new(&reply);
                let header = ReplyHeader::decode(&mut decoder)?;
                if header.xid == xid::NOTIFICATION {
                    continue;
                }
                if header.xid != xid {
                    return Err(WireError::Frame(format!(
                        "reply for xid {} while waiting for xid {xid}",
                        header.xid
                    )));
                }
                let body = reply[reply.len() - decoder.remaining()..].to_vec();
                replies.push((header.err, body));
            }
            Ok(replies)
        };
        let result = match timeout(patience, exchange).await {
            Ok(result) => result,
            Err(_) => Err(WireError::TimedOut),
        };
        match &result {
            Ok(_) => self.in_flight = false,
            Err(err) => self.broken = Some(err.to_string()),
        }
        result
    }

    /// Ends the session: `closeSession` (best effort, within `patience`),
    /// then the socket's shutdown.
    pub(super) async fn close(&mut self, patience: Duration) {
        let xid = self.take_xid();
        let packet = Encoder::request(xid, op::CLOSE_SESSION).finish();
        let _ = self.exchange(packet, xid, patience).await;
        let _ = self.stream.shutdown().await;
    }
}

/// Opens the connection to the first of `hosts` that grants a session.
pub(super) async fn handshake(config: &ZkConfig) -> Result<(Conn, ConnectResponse), LockError> {
    let op = Operation::Connect;
    let give_up = Instant::now() + config.connect_timeout();
    let timeout_ms = i32::try_from(config.session_timeout().as_millis()).unwrap_or(i32::MAX);
    let mut failures = Vec::new();
    for host in config.hosts() {
        let attempt = async {
            let mut stream = TcpStream::connect(host.as_str()).await?;
            stream.set_nodelay(true)?;
            stream
                .write_all(&Encoder::connect(timeout_ms).finish())
                .await?;
            let response = ConnectResponse::decode(&read_packet(&mut stream).await?)?;
            Ok::<_, WireError>((stream, response))
        };
        match tokio::time::timeout_at(give_up, attempt).await {
            Ok(Ok((stream, response))) if response.timeout_ms > 0 => {
                let conn = Conn {
                    stream,
                    next_xid: 1,
                    last_sent: Instant::now(),
                    broken: None,
                    in_flight: false,
                };
                return Ok((conn, response));
            }
            Ok(Ok(_)) => failures.push(format!("{host}: session refused")),
            Ok(Err(err)) => failures.push(format!("{host}: {err}")),
            Err(_) => {
                failures.push(format!("{host}: no session within the connect timeout"));
                break;
            }
        }
    }
    Err(LockError::new(
        ErrorKind::Unavailable,
        op,
        format!(
            "the ZooKeeper floor could not open a session ({})",
            failures.join("; ")
        ),
    )
    .with_backend(NAME))
}

/// Pings when the connection has been idle for `interval`; ends with the
/// floor or the connection.
pub(super) async fn keep_alive(shared: Weak<Shared>, interval: Duration) {
    let interval = interval.max(Duration::from_millis(10));
    let mut next = Instant::now() + interval;
    loop {
        sleep_until(next).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut conn = shared.conn.lock().await;
        if conn.broken.is_some() {
            return;
        }
        let idle_until = conn.last_sent + interval;
        if Instant::now() < idle_until {
            next = idle_until;
            continue;
        }
        let packet = Encoder::request(xid::PING, op::PING).finish();
        if conn
            .exchange(packet, xid::PING, shared.op_timeout)
            .await
            .is_err()
        {
            return;
        }
        next = conn.last_sent + interval;
    }
}
