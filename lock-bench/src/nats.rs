//! The raw floor of the NATS backend: one KV create and one conditioned
//! purge written by hand in the NATS client protocol on one bare TCP
//! connection (no `async-nats`, no JetStream context, no watch).
//!
//! [`NatsFloor`] takes the lock the driver takes (the KV key from the
//! driver's public `keys` module, the same headers):
//!
//! 1. grant: `HPUB $KV.<bucket>.<key> <inbox>` with
//!    `Nats-Expected-Last-Subject-Sequence: 0` and `Nats-TTL`, then the
//!    JetStream ack (`{"stream":..,"seq":N}`) on the inbox: one round trip;
//!    the sequence is the token;
//! 2. release: `HPUB` with `KV-Operation: PURGE`, `Nats-Rollup: sub`,
//!    `Nats-Expected-Last-Subject-Sequence: N`, `Nats-TTL: 1`, and its
//!    ack: one round trip.
//!
//! The release leaves a purge marker (1 s of life) that waiters watch
//! for; as the driver does, the floor remembers its marker's sequence and
//! the next grant of the key expects it, so a cycle on the same key stays
//! two round trips (a marker that expired meanwhile costs one more try,
//! expecting 0). Unlike the driver, the floor does not read the entry
//! when its create is refused: a key whose last message is **another**
//! client's marker counts as held until the marker expires (1 s). The
//! benchmarks' floor cycles run on keys of their own.
//!
//! The bucket is opened (or created) once through the driver when the
//! floor connects: setup, outside the cycles.

use std::collections::HashMap;
use std::sync::PoisonError;
use std::time::Duration;

use async_trait::async_trait;
use conformance::floor::{FloorGrant, RawFloor};
use lock_core::{ErrorKind, LockError, LockKey, Operation, OwnerId, check_ttl};
use lock_nats::{NatsConfig, keys::kv_key};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::Mutex;

// The driver's hook in `crate::for_driver`.
crate::floor_fn!(pub(crate) fn floor = NatsFloor::connect);

/// How long one exchange may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// A hand-written KV create and purge (see the module docs).
#[derive(Debug)]
pub struct NatsFloor {
    bucket: String,
    inbox: String,
    owner: String,
    /// The purge marker each release left, by KV key.
    markers: std::sync::Mutex<HashMap<String, u64>>,
    io: Mutex<(BufReader<OwnedReadHalf>, OwnedWriteHalf)>,
}

fn error(operation: Operation, message: impl Into<String>) -> LockError {
    LockError::new(ErrorKind::Backend, operation, message).with_backend(lock_nats::NAME)
}

fn io_error(operation: Operation, e: std::io::Error) -> LockError {
    LockError::new(ErrorKind::Unavailable, operation, "nats floor connection")
        .with_backend(lock_nats::NAME)
        .with_source(e)
}

impl NatsFloor {
    /// A floor on the first server of `nats://host:port[,...]/bucket`.
    ///
    /// # Errors
    ///
    /// As [`lock_nats::connect`] (which opens or creates the bucket), and
    /// `Unavailable` when the bare connection fails.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let config = NatsConfig::from_url(url)?;
        drop(lock_nats::connect(url).await?);
        let server = &config.servers()[0];
        let op = Operation::Connect;
        let stream = TcpStream::connect((server.host.as_str(), server.port))
            .await
            .map_err(|e| io_error(op, e))?;
        stream.set_nodelay(true).map_err(|e| io_error(op, e))?;
        let (read, mut write) = stream.into_split();
        let mut read = BufReader::new(read);
        let mut info = String::new();
        read.read_line(&mut info)
            .await
            .map_err(|e| io_error(op, e))?;
        if !info.starts_with("INFO ") {
            return Err(error(op, format!("expected INFO, got {info:?}")));
        }
        let inbox = format!("_INBOX.{}", OwnerId::random().to_hex());
        let hello = format!(
            "CONNECT {{\"verbose\":false,\"pedantic\":false,\"headers\":true,\
             \"no_responders\":true,\"protocol\":1,\"lang\":\"rust-floor\",\"version\":\"0\"}}\r\n\
             SUB {inbox} 1\r\nPING\r\n"
        );
        write
            .write_all(hello.as_bytes())
            .await
            .map_err(|e| io_error(op, e))?;
        let mut floor = Self {
            bucket: config.bucket().to_owned(),
            inbox,
            owner: OwnerId::random().to_hex(),
            markers: std::sync::Mutex::default(),
            io: Mutex::new((read, write)),
        };
        floor.wait_pong().await?;
        Ok(floor)
    }

    async fn wait_pong(&mut self) -> Result<(), LockError> {
        let (read, _) = self.io.get_mut();
        let mut line = String::new();
        loop {
            line.clear();
            read.read_line(&mut line)
                .await
                .map_err(|e| io_error(Operation::Connect, e))?;
            match line.trim_end() {
                "PONG" => return Ok(()),
                l if l.starts_with("-ERR") => return Err(error(Operation::Connect, l.to_owned())),
                "" => return Err(error(Operation::Connect, "connection closed")),
                _ => {}
            }
        }
    }

    /// Publishes `payload` with `headers` to the key's subject and reads
    /// the JetStream ack: the sequence, or the error's JSON.
    async fn publish(
        &self,
        operation: Operation,
        key: &str,
        headers: &str,
        payload: &[u8],
    ) -> Result<Result<u64, String>, LockError> {
        let header_block = format!("NATS/1.0\r\n{headers}\r\n");
        let subject = format!("$KV.{}.{key}", self.bucket);
        let mut frame = format!(
            "HPUB {subject} {} {} {}\r\n{header_block}",
            self.inbox,
            header_block.len(),
            header_block.len() + payload.len()
        )
        .into_bytes();
        frame.extend_from_slice(payload);
        frame.extend_from_slice(b"\r\n");
        let mut io = self.io.lock().await;
        let (read, write) = &mut *io;
        let exchange = async {
            write.write_all(&frame).await?;
            read_reply(read, write).await
        };
        let reply = tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| {
                LockError::new(ErrorKind::Timeout, operation, "nats floor")
                    .with_backend(lock_nats::NAME)
            })?
            .map_err(|e| io_error(operation, e))?;
        let text = String::from_utf8_lossy(&reply).into_owned();
        if text.contains("\"error\"") || text.starts_with("NATS/1.0 503") {
            return Ok(Err(text));
        }
        let seq = text
            .split("\"seq\":")
            .nth(1)
            .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| error(operation, format!("unexpected ack {text:?}")))?;
        Ok(Ok(seq))
    }
}

/// Reads until one `MSG`/`HMSG` arrives (answering the server's pings),
/// and returns its headers and payload.
async fn read_reply(
    read: &mut BufReader<OwnedReadHalf>,
    write: &mut OwnedWriteHalf,
) -> std::io::Result<Vec<u8>> {
    let mut line = String::new();
    loop {
        line.clear();
        if read.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.first().copied() {
            Some("PING") => write.write_all(b"PONG\r\n").await?,
            Some("MSG" | "HMSG") => {
                let total: usize = words
                    .last()
                    .and_then(|n| n.parse().ok())
                    .ok_or(std::io::ErrorKind::InvalidData)?;
                let mut body = vec![0; total + 2];
                read.read_exact(&mut body).await?;
                body.truncate(total);
                return Ok(body);
            }
            Some(w) if w.starts_with("-ERR") => {
                return Err(std::io::Error::other(line.trim_end().to_owned()));
            }
            _ => {}
        }
    }
}

/// The JetStream refusal of a conditioned write: the key's last sequence
/// was not the expected one.
fn is_conflict(reply: &str) -> bool {
    reply.contains("10071") || reply.contains("10164") || reply.contains("wrong last sequence")
}

#[async_trait]
impl RawFloor for NatsFloor {
    fn name(&self) -> &'static str {
        lock_nats::NAME
    }

    fn round_trips_per_cycle(&self) -> u32 {
        2
    }

    async fn try_grant(&self, key: &str, ttl: Duration) -> Result<Option<FloorGrant>, LockError> {
        let op = Operation::TryAcquire;
        check_ttl(ttl, lock_nats::MIN_TTL, op)?;
        let kv = kv_key(&LockKey::new(key)?);
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let marker = self
            .markers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&kv);
        for expected in marker.into_iter().chain([0]) {
            let headers = format!(
                "Nats-Expected-Last-Subject-Sequence: {expected}\r\nNats-TTL: {seconds}\r\n"
            );
            match self
                .publish(op, &kv, &headers, self.owner.as_bytes())
                .await?
            {
                Ok(seq) => {
                    return Ok(Some(FloorGrant {
                        key: kv,
                        owner: self.owner.clone(),
                        token: seq,
                        handle: seq.to_string(),
                    }));
                }
                Err(reply) if is_conflict(&reply) => {}
                Err(reply) => return Err(error(op, reply)),
            }
        }
        Ok(None)
    }

    async fn release(&self, grant: &FloorGrant) -> Result<bool, LockError> {
        let op = Operation::Release;
        let headers = format!(
            "KV-Operation: PURGE\r\nNats-Rollup: sub\r\n\
             Nats-Expected-Last-Subject-Sequence: {}\r\nNats-TTL: 1\r\n",
            grant.token
        );
        match self.publish(op, &grant.key, &headers, b"").await? {
            Ok(marker) => {
                self.markers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(grant.key.clone(), marker);
                Ok(true)
            }
            Err(reply) if is_conflict(&reply) => Ok(false),
            Err(reply) => Err(error(op, reply)),
        }
    }
}
