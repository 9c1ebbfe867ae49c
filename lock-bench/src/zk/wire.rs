//! ZooKeeper's client wire format (jute), as much of it as the hand-written
//! floors ([`super::ZkFloor`], [`super::ZkPermitFloor`]) speak.
//!
//! Every packet is a 4-byte big-endian length and that many bytes. The
//! first packet each way is the session handshake (`ConnectRequest` /
//! `ConnectResponse`, no header); after it every request starts with a
//! `RequestHeader` (`xid`, `type`) and every reply with a `ReplyHeader`
//! (`xid`, `zxid`, `err`), the body following only when `err` is 0. Jute
//! writes integers big-endian, a boolean as one byte, a string or a byte
//! buffer as an `int` length (-1 for null) and the bytes, a vector as an
//! `int` count (-1 for null) and the items.
//!
//! Decoding never panics: a short, oversized or malformed packet is a
//! [`WireError::Frame`].

use std::fmt;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Request types (`OpCode` in ZooKeeper's sources).
pub(crate) mod op {
    /// `delete`: path, version.
    pub(crate) const DELETE: i32 = 2;
    /// `getData`: path, watch flag; the reply carries the data and `Stat`.
    pub(crate) const GET_DATA: i32 = 4;
    /// `setData`: path, data, version.
    pub(crate) const SET_DATA: i32 = 5;
    /// `getChildren`: path, watch flag.
    pub(crate) const GET_CHILDREN: i32 = 8;
    /// `ping`: no body.
    pub(crate) const PING: i32 = 11;
    /// `create2`: like `create`, and the reply carries the node's `Stat`.
    pub(crate) const CREATE2: i32 = 15;
    /// `createContainer`: a `create2` of a container node.
    pub(crate) const CREATE_CONTAINER: i32 = 19;
    /// `auth`: an authentication packet.
    pub(crate) const AUTH: i32 = 100;
    /// `closeSession`: no body.
    pub(crate) const CLOSE_SESSION: i32 = -11;
}

/// Reserved xids.
pub(crate) mod xid {
    /// Watch notifications the server sends on its own.
    pub(crate) const NOTIFICATION: i32 = -1;
    /// Pings (the server answers them with this xid whatever was sent).
    pub(crate) const PING: i32 = -2;
    /// Authentication packets.
    pub(crate) const AUTH: i32 = -4;
}

/// `create` flags (`CreateMode`).
pub(crate) mod flags {
    /// A persistent node.
    pub(crate) const PERSISTENT: i32 = 0;
    /// An ephemeral node whose name gets a 10-digit sequence appended.
    pub(crate) const EPHEMERAL_SEQUENTIAL: i32 = 3;
    /// A container node (removed by the server once empty).
    pub(crate) const CONTAINER: i32 = 4;
}

/// Reply error codes (`KeeperException.Code`) the floor acts on.
pub(crate) mod code {
    /// Success.
    pub(crate) const OK: i32 = 0;
    /// The server does not implement the request (no container nodes).
    pub(crate) const UNIMPLEMENTED: i32 = -6;
    /// The node (or its parent) does not exist.
    pub(crate) const NO_NODE: i32 = -101;
    /// The ACL refuses the request.
    pub(crate) const NO_AUTH: i32 = -102;
    /// The node already exists.
    pub(crate) const NODE_EXISTS: i32 = -110;
    /// The credentials were rejected.
    pub(crate) const AUTH_FAILED: i32 = -115;
}

/// `ZooDefs.Perms.ALL`.
pub(crate) const PERMS_ALL: i32 = 31;

/// The largest packet accepted from a server (ZooKeeper's own default
/// `jute.maxbuffer` is 1 MiB; a long list of children stays well below this).
pub(crate) const MAX_FRAME: usize = 16 << 20;

/// The protocol version of the handshake.
const PROTOCOL_VERSION: i32 = 0;

/// The name of a reply error code, for messages.
pub(crate) fn code_name(code: i32) -> &'static str {
    match code {
        0 => "ok",
        -1 => "system error",
        -2 => "runtime inconsistency",
        -3 => "data inconsistency",
        -4 => "connection loss",
        -5 => "marshalling error",
        -6 => "unimplemented",
        -7 => "operation timeout",
        -8 => "bad arguments",
        -13 => "new config has no quorum",
        -14 => "reconfig in progress",
        -101 => "no node",
        -102 => "not authorized",
        -103 => "bad version",
        -108 => "no children for ephemerals",
        -110 => "node exists",
        -111 => "directory not empty",
        -112 => "session expired",
        -114 => "invalid ACL",
        -115 => "authentication failed",
        -118 => "session moved",
        -119 => "not a read-only call",
        -120 => "ephemeral on local session",
        -122 => "request timeout",
        -125 => "quota exceeded",
        -127 => "throttled",
        _ => "unknown error",
    }
}

/// Why an exchange with the server failed.
#[derive(Debug)]
pub(crate) enum WireError {
    /// The connection failed (reset, closed, refused).
    Io(std::io::Error),
    /// The server sent something that is not the expected packet.
    Frame(String),
    /// No complete reply within the operation timeout.
    TimedOut,
    /// The connection was already unusable.
    Broken(String),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(err) => write!(f, "connection failed: {err}"),
            Self::Frame(why) => write!(f, "bad packet from the server: {why}"),
            Self::TimedOut => write!(f, "no reply within the operation timeout"),
            Self::Broken(why) => write!(f, "the connection is unusable: {why}"),
        }
    }
}

impl std::error::Error for WireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(err) => Some(err),
            _ => None,
        }
    }
}

impl From<std::io::Error> for WireError {
    fn from(err: std::io::Error) -> Self {
        Self::Io(err)
    }
}

fn short(what: &str) -> WireError {
    WireError::Frame(format!("packet ends inside {what}"))
}

/// Writes one packet: the length prefix is patched in by [`finish`](Self::finish).
pub(crate) struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    /// A request with its header.
    pub(crate) fn request(xid: i32, op: i32) -> Self {
        let mut encoder = Self {
            buf: Vec::with_capacity(128),
        };
        encoder.buf.extend_from_slice(&[0; 4]);
        encoder.int(xid).int(op);
        encoder
    }

    /// The session handshake: a new session of `timeout_ms`, no password,
    /// not read-only.
    pub(crate) fn connect(timeout_ms: i32) -> Self {
        let mut encoder = Self {
            buf: Vec::with_capacity(48),
        };
        encoder.buf.extend_from_slice(&[0; 4]);
        encoder
            .int(PROTOCOL_VERSION)
            .long(0) // lastZxidSeen
            .int(timeout_ms)
            .long(0) // sessionId: a new session
            .buffer(&[0; 16]) // passwd
            .boolean(false); // readOnly
        encoder
    }

    pub(crate) fn int(&mut self, value: i32) -> &mut Self {
        self.buf.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub(crate) fn long(&mut self, value: i64) -> &mut Self {
        self.buf.extend_from_slice(&value.to_be_bytes());
        self
    }

    pub(crate) fn boolean(&mut self, value: bool) -> &mut Self {
        self.buf.push(u8::from(value));
        self
    }

    /// A byte buffer (lengths above `i32::MAX` cannot occur: the floor
    /// only writes paths, ACLs and credentials it was given, which the
    /// config and key validation keep short; they are clamped anyway).
    pub(crate) fn buffer(&mut self, bytes: &[u8]) -> &mut Self {
        let len = i32::try_from(bytes.len()).unwrap_or(i32::MAX);
        self.int(len);
        self.buf
            .extend_from_slice(&bytes[..usize::try_from(len).unwrap_or(0)]);
        self
    }

    pub(crate) fn string(&mut self, value: &str) -> &mut Self {
        self.buffer(value.as_bytes())
    }

    /// A one-entry ACL vector: all permissions for `scheme:id`.
    pub(crate) fn acl(&mut self, scheme: &str, id: &str) -> &mut Self {
        self.int(1).int(PERMS_ALL).string(scheme).string(id)
    }

    /// The packet with its length prefix.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let len = u32::try_from(self.buf.len() - 4).unwrap_or(u32::MAX);
        self.buf[..4].copy_from_slice(&len.to_be_bytes());
        self.buf
    }
}

/// Reads the fields of one packet's body.
pub(crate) struct Decoder<'a> {
    buf: &'a [u8],
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], WireError> {
        if self.buf.len() < n {
            return Err(short(what));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    pub(crate) fn int(&mut self) -> Result<i32, WireError> {
        let bytes = self.take(4, "an int")?;
        Ok(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    pub(crate) fn long(&mut self) -> Result<i64, WireError> {
        let bytes = self.take(8, "a long")?;
        let mut array = [0; 8];
        array.copy_from_slice(bytes);
        Ok(i64::from_be_bytes(array))
    }

    /// A buffer; null reads as empty.
    pub(crate) fn buffer(&mut self) -> Result<&'a [u8], WireError> {
        let len = self.int()?;
        if len < 0 {
            return Ok(&[]);
        }
        let len = usize::try_from(len).map_err(|_| short("a buffer"))?;
        self.take(len, "a buffer")
    }

    pub(crate) fn string(&mut self) -> Result<String, WireError> {
        let bytes = self.buffer()?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| WireError::Frame("a string is not UTF-8".to_owned()))
    }

    /// A vector of strings; null reads as empty.
    pub(crate) fn strings(&mut self) -> Result<Vec<String>, WireError> {
        let count = self.int()?;
        // Every item takes at least its 4-byte length: a count larger than
        // what is left is malformed (and must not size an allocation).
        let count = usize::try_from(count).unwrap_or(0);
        if count > self.buf.len() / 4 {
            return Err(short("a vector"));
        }
        let mut items = Vec::with_capacity(count);
        for _ in 0..count {
            items.push(self.string()?);
        }
        Ok(items)
    }

    /// A `Stat`, of which only `czxid` is kept.
    pub(crate) fn stat_czxid(&mut self) -> Result<i64, WireError> {
        let czxid = self.long()?;
        // mzxid, ctime, mtime, version, cversion, aversion, ephemeralOwner,
        // dataLength, numChildren, pzxid.
        self.take(8 * 3 + 4 * 3 + 8 + 4 * 2 + 8, "a stat")?;
        Ok(czxid)
    }

    /// A `Stat`, of which only `numChildren` is kept.
    pub(crate) fn stat_num_children(&mut self) -> Result<i32, WireError> {
        // czxid, mzxid, ctime, mtime, version, cversion, aversion,
        // ephemeralOwner, dataLength.
        self.take(8 * 4 + 4 * 3 + 8 + 4, "a stat")?;
        let children = self.int()?;
        // pzxid.
        self.take(8, "a stat")?;
        Ok(children)
    }

    /// How many bytes are left.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }
}

/// What the server answered to the handshake.
#[derive(Debug)]
pub(crate) struct ConnectResponse {
    /// The negotiated session timeout in milliseconds (0 or less: refused).
    pub(crate) timeout_ms: i32,
    pub(crate) session_id: i64,
}

impl ConnectResponse {
    pub(crate) fn decode(packet: &[u8]) -> Result<Self, WireError> {
        let mut decoder = Decoder::new(packet);
        let _protocol_version = decoder.int()?;
        let timeout_ms = decoder.int()?;
        let session_id = decoder.long()?;
        let _passwd = decoder.buffer()?;
        // A trailing read-only flag (servers since 3.4) is ignored: the
        // handshake asked for a read-write session.
        Ok(Self {
            timeout_ms,
            session_id,
        })
    }
}

/// A reply's header.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyHeader {
    pub(crate) xid: i32,
    pub(crate) err: i32,
}

impl ReplyHeader {
    pub(crate) fn decode(decoder: &mut Decoder<'_>) -> Result<Self, WireError> {
        let xid = decoder.int()?;
        let _zxid = decoder.long()?;
        let err = decoder.int()?;
        Ok(Self { xid, err })
    }
}

/// Reads one length-prefixed packet. Not cancel safe (a partial read is
/// lost): callers treat a dropped read as a broken connection.
pub(crate) async fn read_packet<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Vec<u8>, WireError> {
    let mut len = [0; 4];
    reader.read_exact(&mut len).await?;
    let len = i32::from_be_bytes(len);
    let len = usize::try_from(len)
        .ok()
        .filter(|len| *len <= MAX_FRAME)
        .ok_or_else(|| WireError::Frame(format!("packet length {len}")))?;
    let mut packet = vec![0; len];
    reader.read_exact(&mut packet).await?;
    Ok(packet)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_length_prefixed_big_endian() {
        let mut encoder = Encoder::request(7, op::DELETE);
        encoder.string("/a").int(-1);
        let packet = encoder.finish();
        assert_eq!(
            packet,
            [
                0, 0, 0, 18, // length
                0, 0, 0, 7, // xid
                0, 0, 0, 2, // type
                0, 0, 0, 2, b'/', b'a', // path
                0xff, 0xff, 0xff, 0xff, // version -1
            ]
        );
        let connect = Encoder::connect(4000).finish();
        // version, zxid, timeout, session, passwd (4 + 16), read-only.
        assert_eq!(connect.len(), 4 + 4 + 8 + 4 + 8 + 20 + 1);
        assert_eq!(&connect[16..20], &4000_i32.to_be_bytes());
    }

    #[test]
    fn malformed_packets_are_errors_not_panics() {
        // Truncated everywhere.
        let mut reply = Vec::new();
        reply.extend_from_slice(&5_i32.to_be_bytes());
        reply.extend_from_slice(&9_i64.to_be_bytes());
        reply.extend_from_slice(&0_i32.to_be_bytes());
        reply.extend_from_slice(&2_i32.to_be_bytes());
        reply.extend_from_slice(&1_i32.to_be_bytes());
        reply.push(b'x');
        reply.extend_from_slice(&1_i32.to_be_bytes());
        reply.push(b'y');
        for cut in 0..reply.len() {
            let mut decoder = Decoder::new(&reply[..cut]);
            let parsed = ReplyHeader::decode(&mut decoder).and_then(|_| decoder.strings());
            assert!(parsed.is_err(), "cut at {cut}");
        }
        let mut decoder = Decoder::new(&reply);
        let header = ReplyHeader::decode(&mut decoder).unwrap();
        assert_eq!((header.xid, header.err), (5, 0));
        assert_eq!(decoder.strings().unwrap(), ["x", "y"]);
        assert_eq!(decoder.remaining(), 0);
        // A huge count does not allocate; a negative length is not a slice.
        let mut decoder = Decoder::new(&[0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        assert!(decoder.strings().is_err());
        let mut decoder = Decoder::new(&[0, 0, 0, 1, 0x80, 0, 0, 0]);
        assert_eq!(decoder.strings().unwrap(), [""]);
        let mut decoder = Decoder::new(&[0, 0, 0, 1, 0, 0, 0, 2, 0xff, 0xfe]);
        assert!(decoder.strings().is_err(), "not UTF-8");
        assert!(ConnectResponse::decode(&[0; 10]).is_err());
    }

    #[tokio::test]
    async fn oversized_or_negative_lengths_are_refused() {
        for len in [-1_i32, i32::MAX] {
            let bytes = len.to_be_bytes();
            let err = read_packet(&mut &bytes[..]).await.unwrap_err();
            assert!(matches!(err, WireError::Frame(_)), "{err}");
        }
        let err = read_packet(&mut &[0u8, 0, 0, 9, 1][..]).await.unwrap_err();
        assert!(matches!(err, WireError::Io(_)), "{err}");
    }
}
