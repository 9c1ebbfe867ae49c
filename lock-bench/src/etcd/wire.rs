//! The floors' own etcd wire: unary gRPC calls and the lease keep-alive
//! stream on one bare HTTP/2 connection (the `h2` crate over a tokio
//! `TcpStream`; not the driver's `etcd-client`, its tonic channel or its
//! generated messages), and the handful of protobuf messages the floors
//! send and read, encoded and decoded here by hand from etcd's
//! `rpc.proto` / `kv.proto` field numbers.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use h2::RecvStream;
use h2::client::SendRequest;
use lock_core::{ErrorKind, LockError, Operation};

use super::NAME;

/// One HTTP/2 connection to one etcd member, and the auth token to send.
#[derive(Clone)]
pub(super) struct Wire {
    send: SendRequest<Bytes>,
    authority: String,
    token: Option<String>,
}

/// A failure on the wire, as the driver's kinds.
fn failed(op: Operation, what: impl std::fmt::Display) -> LockError {
    LockError::new(ErrorKind::Unavailable, op, format!("etcd floor: {what}")).with_backend(NAME)
}

impl Wire {
    /// Connects to `endpoint` (`host:port`) and says hello in HTTP/2.
    pub(super) async fn connect(endpoint: &str, op: Operation) -> Result<Self, LockError> {
        let tcp = tokio::net::TcpStream::connect(endpoint)
            .await
            .map_err(|e| failed(op, format_args!("connect to {endpoint}: {e}")))?;
        let _ = tcp.set_nodelay(true);
        let (send, connection) = h2::client::handshake(tcp)
            .await
            .map_err(|e| failed(op, format_args!("HTTP/2 handshake: {e}")))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self {
            send,
            authority: endpoint.to_owned(),
            token: None,
        })
    }

    /// Logs in (`Auth/Authenticate`): later calls carry the token.
    pub(super) async fn authenticate(
        &mut self,
        user: &str,
        password: &str,
        op: Operation,
    ) -> Result<(), LockError> {
        let mut request = Vec::new();
        put_bytes(&mut request, 1, user.as_bytes());
        put_bytes(&mut request, 2, password.as_bytes());
        let reply = self
            .unary("/etcdserverpb.Auth/Authenticate", request, op)
            .await?;
        let token = bytes_field(&reply, 2)
            .ok_or_else(|| failed(op, "no token in the authenticate answer"))?;
        self.token = Some(String::from_utf8_lossy(token).into_owned());
        Ok(())
    }

    fn request(&self, path: &str) -> http::Request<()> {
        let mut builder = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("http://{}{path}", self.authority))
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        if let Some(token) = &self.token {
            builder = builder.header("token", token.as_str());
        }
        builder.body(()).unwrap_or_default()
    }

    /// One unary call: `message` out, the reply's message back.
    pub(super) async fn unary(
        &self,
        path: &str,
        message: Vec<u8>,
        op: Operation,
    ) -> Result<Bytes, LockError> {
        let mut send = self.send.clone().ready().await.map_err(|e| failed(op, e))?;
        let (response, mut stream) = send
            .send_request(self.request(path), false)
            .map_err(|e| failed(op, e))?;
        stream
            .send_data(framed(&message), true)
            .map_err(|e| failed(op, e))?;
        let response = response.await.map_err(|e| failed(op, e))?;
        let (head, mut body) = response.into_parts();
        grpc_status(&head.headers, op)?;
        let mut buffer = BytesMut::new();
        let message = read_message(&mut body, &mut buffer)
            .await
            .map_err(|e| failed(op, e))?;
        // The status follows the message in the trailers.
        if let Some(trailers) = body.trailers().await.map_err(|e| failed(op, e))? {
            grpc_status(&trailers, op)?;
        }
        message.ok_or_else(|| failed(op, format_args!("{path}: no answer")))
    }

    /// Opens a `LeaseKeepAlive` stream for `lease_id` and keeps it alive
    /// every `interval` until the task is aborted (reopened after a
    /// failure).
    pub(super) async fn keep_alive(self, lease_id: i64, interval: Duration) {
        let interval = interval.max(Duration::from_millis(100));
        let mut request = Vec::new();
        put_int(&mut request, 1, lease_id);
        let frame = framed(&request);
        loop {
            tokio::time::sleep(interval).await;
            let Ok(mut send) = self.send.clone().ready().await else {
                continue;
            };
            let Ok((response, mut stream)) =
                send.send_request(self.request("/etcdserverpb.Lease/LeaseKeepAlive"), false)
            else {
                continue;
            };
            if stream.send_data(frame.clone(), false).is_err() {
                continue;
            }
            let Ok(response) = response.await else {
                continue;
            };
            let mut body = response.into_body();
            let mut buffer = BytesMut::new();
            while let Ok(Some(_)) = read_message(&mut body, &mut buffer).await {
                tokio::time::sleep(interval).await;
                if stream.send_data(frame.clone(), false).is_err() {
                    break;
                }
            }
        }
    }
}

/// A gRPC message frame: uncompressed, its length, the message.
fn framed(message: &[u8]) -> Bytes {
    let mut frame = Vec::with_capacity(5 + message.len());
    frame.push(0);
    frame.extend_from_slice(
        &u32::try_from(message.len())
            .unwrap_or(u32::MAX)
            .to_be_bytes(),
    );
    frame.extend_from_slice(message);
    Bytes::from(frame)
}

/// Reads the next gRPC message of `body` (`None` at its end).
async fn read_message(
    body: &mut RecvStream,
    buffer: &mut BytesMut,
) -> Result<Option<Bytes>, h2::Error> {
    loop {
        if buffer.len() >= 5 {
            let len = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
            if buffer.len() >= 5 + len {
                buffer.advance(5);
                return Ok(Some(buffer.split_to(len).freeze()));
            }
        }
        match body.data().await {
            Some(chunk) => {
                let chunk = chunk?;
                let _ = body.flow_control().release_capacity(chunk.len());
                buffer.extend_from_slice(&chunk);
            }
            None => return Ok(None),
        }
    }
}

/// A non-zero `grpc-status` in `headers` as an error (etcd's codes mapped
/// as the driver maps them: a lost lease, a refused compare, else
/// unavailable).
fn grpc_status(headers: &http::HeaderMap, op: Operation) -> Result<(), LockError> {
    let Some(status) = headers.get("grpc-status") else {
        return Ok(());
    };
    if status.as_bytes() == b"0" {
        return Ok(());
    }
    let message = headers
        .get("grpc-message")
        .map(|m| String::from_utf8_lossy(m.as_bytes()).into_owned())
        .unwrap_or_default();
    let code = String::from_utf8_lossy(status.as_bytes()).into_owned();
    let kind = match code.as_str() {
        // NOT_FOUND: "requested lease not found".
        "5" => ErrorKind::LeaseLost,
        // INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE.
        "3" | "9" | "11" => ErrorKind::Backend,
        // UNAUTHENTICATED, PERMISSION_DENIED.
        "16" | "7" => ErrorKind::Config,
        _ => ErrorKind::Unavailable,
    };
    Err(LockError::new(
        kind,
        op,
        format!("etcd floor: grpc-status {code}: {message}"),
    )
    .with_backend(NAME))
}

// Protobuf by hand: varints and length-delimited fields, enough for the
// floors' messages.

// Each byte is masked to 7 bits (or below 0x80) before the cast.
#[allow(clippy::cast_possible_truncation)]
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// An `int64`/enum field (omitted at 0, as proto3 does).
pub(super) fn put_int(out: &mut Vec<u8>, field: u32, value: i64) {
    if value != 0 {
        put_int_always(out, field, value);
    }
}

/// An `int64` field written even at 0 (a `oneof` member).
fn put_int_always(out: &mut Vec<u8>, field: u32, value: i64) {
    put_varint(out, u64::from(field) << 3);
    // Protobuf writes a negative int64 as its two's complement.
    put_varint(out, value.cast_unsigned());
}

/// A `bytes`/`string`/message field.
pub(super) fn put_bytes(out: &mut Vec<u8>, field: u32, value: &[u8]) {
    put_varint(out, (u64::from(field) << 3) | 2);
    put_varint(out, value.len() as u64);
    out.extend_from_slice(value);
}

/// A field's value as read.
#[derive(Clone, Copy, Debug)]
pub(super) enum Value<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

impl<'a> Value<'a> {
    pub(super) fn int(self) -> Option<i64> {
        match self {
            Self::Int(v) => Some(v.cast_signed()),
            Self::Bytes(_) => None,
        }
    }

    pub(super) fn bytes(self) -> Option<&'a [u8]> {
        match self {
            Self::Bytes(b) => Some(b),
            Self::Int(_) => None,
        }
    }
}

fn get_varint(data: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = data.split_first()?;
        *data = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(value);
        }
    }
    None
}

/// The fields of one message, in order (stops at malformed input).
pub(super) fn fields(mut data: &[u8]) -> impl Iterator<Item = (u32, Value<'_>)> {
    std::iter::from_fn(move || {
        let key = get_varint(&mut data)?;
        let field = u32::try_from(key >> 3).ok()?;
        let value = match key & 7 {
            0 => Value::Int(get_varint(&mut data)?),
            2 => {
                let len = usize::try_from(get_varint(&mut data)?).ok()?;
                if len > data.len() {
                    return None;
                }
                let (bytes, rest) = data.split_at(len);
                data = rest;
                Value::Bytes(bytes)
            }
            1 => {
                let (bytes, rest) = data.split_at_checked(8)?;
                data = rest;
                Value::Int(u64::from_le_bytes(bytes.try_into().ok()?))
            }
            5 => {
                let (bytes, rest) = data.split_at_checked(4)?;
                data = rest;
                Value::Int(u64::from(u32::from_le_bytes(bytes.try_into().ok()?)))
            }
            _ => return None,
        };
        Some((field, value))
    })
}

/// The `bytes`/`string` field `field` of `data`, if present.
pub(super) fn bytes_field(data: &[u8], field: u32) -> Option<&[u8]> {
    fields(data)
        .filter(|(f, _)| *f == field)
        .find_map(|(_, v)| v.bytes())
}

/// The `int64` field `field` of `data` (0 when absent).
pub(super) fn int_field(data: &[u8], field: u32) -> i64 {
    fields(data)
        .filter(|(f, _)| *f == field)
        .find_map(|(_, v)| v.int())
        .unwrap_or(0)
}

// The KV messages the floors send.

/// `Compare.CompareResult`.
#[derive(Clone, Copy)]
pub(super) enum Cmp {
    Equal = 0,
    Greater = 1,
    Less = 2,
}

/// A `Compare`: on the create revision or on the value of `key`.
pub(super) enum Compare<'a> {
    CreateRevision(&'a str, Cmp, i64),
    Value(&'a str, Cmp, &'a [u8]),
}

/// A `RequestOp`.
pub(super) enum Op<'a> {
    /// Put `value` at `key` with the lease.
    Put(&'a str, &'a [u8], i64),
    /// Range over `key` alone.
    Get(&'a str),
    /// Range over every key starting with `prefix`, oldest created first,
    /// at most `limit` (0: all).
    Oldest(&'a str, i64),
    /// Delete `key` alone.
    Delete(&'a str),
}

/// The end of the range of keys that start with `prefix` (etcd's
/// `WithPrefix`): the prefix with its last byte below 0xff incremented.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn compare(out: &mut Vec<u8>, compare: &Compare<'_>) {
    let mut c = Vec::new();
    match compare {
        Compare::CreateRevision(key, result, revision) => {
            put_int(&mut c, 1, *result as i64);
            put_int(&mut c, 2, 1); // CREATE
            put_bytes(&mut c, 3, key.as_bytes());
            put_int_always(&mut c, 5, *revision);
        }
        Compare::Value(key, result, value) => {
            put_int(&mut c, 1, *result as i64);
            put_int(&mut c, 2, 3); // VALUE
            put_bytes(&mut c, 3, key.as_bytes());
            put_bytes(&mut c, 7, value);
        }
    }
    put_bytes(out, 1, &c);
}

fn request_op(out: &mut Vec<u8>, field: u32, op: &Op<'_>) {
    let mut inner = Vec::new();
    let which = match op {
        Op::Put(key, value, lease) => {
            put_bytes(&mut inner, 1, key.as_bytes());
            put_bytes(&mut inner, 2, value);
            put_int(&mut inner, 3, *lease);
            2
        }
        Op::Get(key) => {
            put_bytes(&mut inner, 1, key.as_bytes());
            1
        }
        Op::Oldest(prefix, limit) => {
            put_bytes(&mut inner, 1, prefix.as_bytes());
            put_bytes(&mut inner, 2, &prefix_end(prefix));
            put_int(&mut inner, 3, *limit);
            put_int(&mut inner, 5, 1); // ASCEND
            put_int(&mut inner, 6, 2); // CREATE
            1
        }
        Op::Delete(key) => {
            put_bytes(&mut inner, 1, key.as_bytes());
            3
        }
    };
    let mut request = Vec::new();
    put_bytes(&mut request, which, &inner);
    put_bytes(out, field, &request);
}

/// A `TxnRequest`.
pub(super) fn txn(compares: &[Compare<'_>], success: &[Op<'_>], failure: &[Op<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in compares {
        compare(&mut out, c);
    }
    for op in success {
        request_op(&mut out, 2, op);
    }
    for op in failure {
        request_op(&mut out, 3, op);
    }
    out
}

/// What the floors read of a `TxnResponse`.
#[derive(Debug, Default)]
pub(super) struct TxnReply {
    /// The header's revision.
    pub(super) revision: i64,
    pub(super) succeeded: bool,
    /// Per response op: the key-values of a range (empty for others).
    pub(super) ranges: Vec<Vec<Kv>>,
}

/// A `KeyValue` as the floors read it.
#[derive(Debug)]
pub(super) struct Kv {
    pub(super) key: Bytes,
    pub(super) create_revision: i64,
    pub(super) value: Bytes,
}

/// Decodes a `TxnResponse`.
pub(super) fn txn_reply(data: &Bytes) -> TxnReply {
    let mut reply = TxnReply::default();
    let slice = |part: &[u8]| data.slice_ref(part);
    for (field, value) in fields(data) {
        match (field, value) {
            (1, Value::Bytes(header)) => reply.revision = int_field(header, 3),
            (2, Value::Int(v)) => reply.succeeded = v != 0,
            (3, Value::Bytes(op)) => {
                let mut kvs = Vec::new();
                for (which, response) in fields(op) {
                    let (1, Value::Bytes(range)) = (which, response) else {
                        continue;
                    };
                    for (f, kv) in fields(range) {
                        let (2, Value::Bytes(kv)) = (f, kv) else {
                            continue;
                        };
                        let mut read = Kv {
                            key: Bytes::new(),
                            create_revision: 0,
                            value: Bytes::new(),
                        };
                        for (f, v) in fields(kv) {
                            match (f, v) {
                                (1, Value::Bytes(k)) => read.key = slice(k),
                                (2, Value::Int(r)) => read.create_revision = r.cast_signed(),
                                (5, Value::Bytes(v)) => read.value = slice(v),
                                _ => {}
                            }
                        }
                        kvs.push(read);
                    }
                }
                reply.ranges.push(kvs);
            }
            _ => {}
        }
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand encoding reads back, and a prefix's range end is etcd's.
    #[test]
    fn messages_round_trip() {
        let mut m = Vec::new();
        put_int(&mut m, 1, -1);
        put_int(&mut m, 2, 0);
        put_bytes(&mut m, 3, b"abc");
        put_int(&mut m, 4, 300);
        let read: Vec<(u32, String)> = fields(&m).map(|(f, v)| (f, format!("{v:?}"))).collect();
        assert_eq!(read.len(), 3, "{read:?}");
        assert_eq!(int_field(&m, 1), -1);
        assert_eq!(int_field(&m, 4), 300);
        assert_eq!(int_field(&m, 2), 0);
        assert_eq!(prefix_end("a/b/"), b"a/b0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }
}
