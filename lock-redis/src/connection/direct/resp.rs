//! The framing of RESP2 replies the direct connection reads: the five
//! reply types (simple string, error, integer, bulk string, array; nil
//! bulk and nil array).

/// One reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Simple(String),
    /// An error reply's text (`NOSCRIPT No matching script...`).
    Error(String),
    Int(i64),
    /// `None` is the nil bulk string (`$-1`).
    Bulk(Option<Vec<u8>>),
    /// `None` is the nil array (`*-1`).
    Array(Option<Vec<Reply>>),
}

/// A reply that is not RESP2 as we read it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) &'static str);

/// Replies bigger than this are refused: the driver's replies are far
/// smaller, so a huge length is a confused server or not Redis at all.
const MAX_BULK: usize = 1 << 20;
const MAX_ITEMS: usize = 1024;
const MAX_DEPTH: usize = 4;

/// One reply from the front of `buf`: `Ok(Some((reply, bytes used)))`,
/// `Ok(None)` when `buf` holds only part of it.
///
/// # Errors
///
/// [`Malformed`] for anything that is not a RESP2 reply of bounded size.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, Malformed> {
    parse_at(buf, 0, 0)
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Reply, usize)>, Malformed> {
    if depth > MAX_DEPTH {
        return Err(Malformed("replies nested too deep"));
    }
    let Some((line, next)) = line(buf, at) else {
        return Ok(None);
    };
    let (&kind, body) = line.split_first().ok_or(Malformed("empty reply line"))?;
    let text = || {
        std::str::from_utf8(body)
            .map(str::to_owned)
            .map_err(|_| Malformed("reply line is not UTF-8"))
    };
    match kind {
        b'+' => Ok(Some((Reply::Simple(text()?), next))),
        b'-' => Ok(Some((Reply::Error(text()?), next))),
        b':' => Ok(Some((Reply::Int(number(body)?), next))),
        b'$' => match length(body, MAX_BULK)? {
            None => Ok(Some((Reply::Bulk(None), next))),
            Some(len) => {
                let end = next + len;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                if &buf[end..end + 2] != b"\r\n" {
                    return Err(Malformed("bulk string without its CRLF"));
                }
                Ok(Some((Reply::Bulk(Some(buf[next..end].to_vec())), end + 2)))
            }
        },
        b'*' => match length(body, MAX_ITEMS)? {
            None => Ok(Some((Reply::Array(None), next))),
            Some(len) => {
                let mut items = Vec::with_capacity(len);
                let mut at = next;
                for _ in 0..len {
                    let Some((item, after)) = parse_at(buf, at, depth + 1)? else {
                        return Ok(None);
                    };
                    items.push(item);
                    at = after;
                }
                Ok(Some((Reply::Array(Some(items)), at)))
            }
        },
        _ => Err(Malformed("unknown reply type (not RESP2)")),
    }
}

/// The line starting at `at` (without its CRLF) and where the next starts.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], at + end + 2))
}

fn number(text: &[u8]) -> Result<i64, Malformed> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or(Malformed("bad integer in a reply"))
}

/// A bulk or array length: `None` for -1 (nil).
fn length(text: &[u8], max: usize) -> Result<Option<usize>, Malformed> {
    match number(text)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .ok()
            .filter(|n| *n <= max)
            .map(Some)
            .ok_or(Malformed("reply length out of range")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_reply_type_and_waits_for_the_rest() {
        let cases: [(&[u8], Reply); 7] = [
            (b"+OK\r\n", Reply::Simple("OK".into())),
            (b"-NOSCRIPT x\r\n", Reply::Error("NOSCRIPT x".into())),
            (b":-42\r\n", Reply::Int(-42)),
            (b"$3\r\na\r\n\r\n", Reply::Bulk(Some(b"a\r\n".to_vec()))),
            (b"$-1\r\n", Reply::Bulk(None)),
            (b"*-1\r\n", Reply::Array(None)),
            (
                b"*2\r\n:1\r\n$2\r\n17\r\n",
                Reply::Array(Some(vec![Reply::Int(1), Reply::Bulk(Some(b"17".to_vec()))])),
            ),
        ];
        for (wire, reply) in cases {
            assert_eq!(parse(wire), Ok(Some((reply, wire.len()))), "{wire:?}");
            // Every proper prefix is incomplete, never an error.
            for cut in 0..wire.len() {
                assert_eq!(parse(&wire[..cut]), Ok(None), "{wire:?} cut at {cut}");
            }
        }
        // Two replies back to back: the first one and its length.
        assert_eq!(parse(b":1\r\n:2\r\n"), Ok(Some((Reply::Int(1), 4))));
    }

    #[test]
    fn refuses_malformed_replies() {
        for wire in [
            &b"?x\r\n"[..],
            b"\r\n",
            b":abc\r\n",
            b"$-2\r\n",
            b"$99999999999\r\n",
            b"*-5\r\n",
            b"*99999999\r\n",
            b"$1\r\nab\r\n",
            b"+\xff\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
            b"%1\r\n+a\r\n+b\r\n",
        ] {
            assert!(parse(wire).is_err(), "{wire:?} must be refused");
        }
    }
}
