//! A shared, pipelined connection to one server that its callers drive
//! themselves: no connection task.
//!
//! The redis crate's multiplexed connection hands every request to a
//! connection task and the reply back through a channel: two task wake-ups
//! per request, which on a busy runtime cost more than the round trip
//! itself (our cycle measured 1.6-1.8x the floor's on one bare stream).
//! Here a caller writes its request (under the write lock, queueing itself
//! in wire order), then either receives its reply from whoever is reading,
//! or takes the read lock and reads: replies are handed out in order, and
//! the reader returns as soon as its own has arrived. Alone on the
//! connection, a caller writes and reads its own reply, like a bare
//! stream; concurrent callers still pipeline on one connection.
//!
//! Cancellation: a caller dropped after writing leaves its place in the
//! queue, and its reply is read and dropped; a caller dropped mid-write
//! (or any I/O or framing error) breaks the connection: every waiter gets
//! an I/O error, so [`Node`](crate::connection::node::Node) reconnects. Plain TCP only
//! (TLS connections stay on the multiplexed connection).

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;

mod resp;

/// A connection handle; clones share the connection.
#[derive(Clone)]
pub(crate) struct Direct {
    shared: Arc<Shared>,
    db: i64,
}

struct Shared {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    reader: tokio::sync::Mutex<Reader>,
    queue: Mutex<Queue>,
}

struct Reader {
    half: OwnedReadHalf,
    buf: Vec<u8>,
}

#[derive(Default)]
struct Queue {
    /// Callers whose requests are on the wire, in wire order.
    waiting: VecDeque<Waiter>,
    broken: bool,
}

struct Waiter {
    /// Replies to read and drop first (a transaction's `OK`/`QUEUED`).
    skip: usize,
    want: usize,
    got: Vec<Value>,
    reply: oneshot::Sender<RedisResult<Vec<Value>>>,
}

fn broken() -> redis::RedisError {
    io::Error::new(io::ErrorKind::BrokenPipe, "the connection broke").into()
}

impl Direct {
    /// Connects over TCP, then `AUTH` and `SELECT` when asked.
    pub(crate) async fn connect(
        host: &str,
        port: u16,
        username: Option<&str>,
        password: Option<&str>,
        db: i64,
    ) -> RedisResult<Self> {
        let stream = TcpStream::connect((host, port)).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        let mut conn = Self {
            shared: Arc::new(Shared {
                writer: tokio::sync::Mutex::new(write),
                reader: tokio::sync::Mutex::new(Reader {
                    half: read,
                    buf: Vec::with_capacity(4096),
                }),
                queue: Mutex::new(Queue::default()),
            }),
            db,
        };
        if let Some(password) = password {
            let mut auth = redis::cmd("AUTH");
            if let Some(username) = username {
                auth.arg(username);
            }
            auth.arg(password);
            auth.query_async::<()>(&mut conn).await?;
        }
        if db != 0 {
            redis::cmd("SELECT")
                .arg(db)
                .query_async::<()>(&mut conn)
                .await?;
        }
        Ok(conn)
    }

    /// Sends `bytes` (`skip + want` requests) and returns the last `want`
    /// replies.
    async fn request(&self, bytes: &[u8], skip: usize, want: usize) -> RedisResult<Vec<Value>> {
        if skip + want == 0 {
            return Ok(Vec::new());
        }
        let (reply, mut replied) = oneshot::channel();
        {
            let mut writer = self.shared.writer.lock().await;
            {
                let mut queue = self.shared.queue();
                if queue.broken {
                    return Err(broken());
                }
                queue.waiting.push_back(Waiter {
                    skip,
                    want,
                    got: Vec::with_capacity(want),
                    reply,
                });
            }
            // Dropped mid-write, the stream holds half a request.
            let mut breaks = BreakOnDrop(Some(&self.shared));
            if let Err(err) = writer.write_all(bytes).await {
                return Err(err.into());
            }
            breaks.0 = None;
        }
        // Nobody reading (alone on the connection): read our own reply
        // without polling `replied` first. A polled receiver holds this
        // task's waker, and `hand_out`'s send of our own reply would wake
        // the very task that is running it: a self-wake, which a
        // multi-threaded runtime turns into a yield plus a futex wake-up
        // of another worker, twice per cycle.
        if let Ok(mut reader) = self.shared.reader.try_lock() {
            return self.shared.read_until(&mut reader, &mut replied).await;
        }
        tokio::select! {
            biased;
            answer = &mut replied => answer.unwrap_or_else(|_| Err(broken())),
            mut reader = self.shared.reader.lock() => {
                self.shared.read_until(&mut reader, &mut replied).await
            }
        }
    }
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every waiter gets an error; no request is sent any more.
    fn break_all(&self) {
        let mut queue = self.queue();
        queue.broken = true;
        for waiter in queue.waiting.drain(..) {
            let _ = waiter.reply.send(Err(broken()));
        }
    }

    /// Reads and hands out replies in wire order until `ours` has one.
    async fn read_until(
        &self,
        reader: &mut Reader,
        ours: &mut oneshot::Receiver<RedisResult<Vec<Value>>>,
    ) -> RedisResult<Vec<Value>> {
        loop {
            match ours.try_recv() {
                Ok(answer) => return answer,
                Err(oneshot::error::TryRecvError::Closed) => return Err(broken()),
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            if self.hand_out(reader)? {
                continue;
            }
            if reader.buf.capacity() - reader.buf.len() < 1024 {
                reader.buf.reserve(4096);
            }
            match reader.half.read_buf(&mut reader.buf).await {
                Ok(n) if n > 0 => {}
                Ok(_) => {
                    self.break_all();
                    return Err(broken());
                }
                Err(err) => {
                    self.break_all();
                    return Err(err.into());
                }
            }
        }
    }

    /// Hands out the complete replies in the buffer; `true` if any.
    fn hand_out(&self, reader: &mut Reader) -> RedisResult<bool> {
        let mut any = false;
        loop {
            let (reply, used) = match resp::parse(&reader.buf) {
                Ok(Some(parsed)) => parsed,
                Ok(None) => return Ok(any),
                Err(resp::Malformed(what)) => {
                    self.break_all();
                    return Err(io::Error::new(io::ErrorKind::InvalidData, what).into());
                }
            };
            // Error replies go through the redis crate's parser, which
            // types them (NOSCRIPT, READONLY, ...) as the driver expects.
            let value = match to_value(reply) {
                Some(value) => Ok(value),
                None => redis::parse_redis_value(&reader.buf[..used]),
            };
            reader.buf.drain(..used);
            any = true;
            let Ok(value) = value else {
                self.break_all();
                return Err(broken());
            };
            let mut queue = self.queue();
            let Some(front) = queue.waiting.front_mut() else {
                // A reply nobody asked for: the stream is out of step.
                drop(queue);
                self.break_all();
                return Err(broken());
            };
            if front.skip > 0 {
                front.skip -= 1;
            } else {
                front.got.push(value);
            }
            if front.skip == 0
                && front.got.len() == front.want
                && let Some(done) = queue.waiting.pop_front()
            {
                // A caller that went away does not take its reply.
                let _ = done.reply.send(Ok(done.got));
            }
        }
    }
}

/// A reply as the redis crate's parser gives it (`+OK` is `Okay`); `None`
/// when it holds an error reply.
fn to_value(reply: resp::Reply) -> Option<Value> {
    use resp::Reply;
    Some(match reply {
        Reply::Simple(s) if s == "OK" => Value::Okay,
        Reply::Simple(s) => Value::SimpleString(s),
        Reply::Error(_) => return None,
        Reply::Int(n) => Value::Int(n),
        Reply::Bulk(None) | Reply::Array(None) => Value::Nil,
        Reply::Bulk(Some(bytes)) => Value::BulkString(bytes),
        Reply::Array(Some(items)) => {
            Value::Array(items.into_iter().map(to_value).collect::<Option<_>>()?)
        }
    })
}

struct BreakOnDrop<'a>(Option<&'a Shared>);

impl Drop for BreakOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.0 {
            shared.break_all();
        }
    }
}

impl ConnectionLike for Direct {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut replies = self.request(&cmd.get_packed_command(), 0, 1).await?;
            replies.pop().ok_or_else(broken)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.request(&pipeline.get_packed_pipeline(), offset, count)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Many callers on one connection, a third of them cancelled at random
    /// points (before, during or after their write): everyone who finishes
    /// gets their own reply, never someone else's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replies_reach_their_callers_under_concurrency_and_cancellation() {
        let Some(server) = crate::test_redis::server().await else {
            return;
        };
        let conn = Direct::connect("127.0.0.1", server.port(), None, None, 0)
            .await
            .unwrap();
        let tasks: Vec<_> = (0..16)
            .map(|t| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    let mut done = 0;
                    for i in 0..300u64 {
                        let mut c = conn.clone();
                        let text = format!("{t}-{i}");
                        let mut pipe = redis::pipe();
                        pipe.cmd("ECHO").arg(&text).cmd("ECHO").arg(i);
                        let call = async {
                            let echoed: String =
                                redis::cmd("ECHO").arg(&text).query_async(&mut c).await?;
                            let both: (String, u64) = pipe.query_async(&mut c).await?;
                            Ok::<_, redis::RedisError>((echoed, both))
                        };
                        if i % 3 == 0 {
                            let cut = Duration::from_micros(i % 50);
                            if let Ok(result) = tokio::time::timeout(cut, call).await {
                                let (echoed, both) = result.unwrap();
                                assert_eq!(echoed, text);
                                assert_eq!(both, (text.clone(), i));
                            }
                        } else {
                            let (echoed, both) = call.await.unwrap();
                            assert_eq!(echoed, text);
                            assert_eq!(both, (text.clone(), i));
                            done += 1;
                        }
                    }
                    done
                })
            })
            .collect();
        for task in tasks {
            assert_eq!(task.await.unwrap(), 200);
        }
        // Replies read as the redis crate reads them.
        for wire in [
            &b"+OK\r\n"[..],
            b"+PONG\r\n",
            b":-3\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"$2\r\nhi\r\n",
            b"*3\r\n:1\r\n$1\r\nx\r\n*1\r\n+OK\r\n",
        ] {
            let (reply, _) = resp::parse(wire).unwrap().unwrap();
            assert_eq!(
                to_value(reply),
                Some(redis::parse_redis_value(wire).unwrap())
            );
        }
        let (reply, _) = resp::parse(b"*2\r\n:1\r\n-ERR x\r\n").unwrap().unwrap();
        assert_eq!(
            to_value(reply),
            None,
            "errors go to the redis crate's parser"
        );
        // Error replies come back as errors, and the connection goes on.
        let mut c = conn.clone();
        let err = redis::cmd("NOSUCHCOMMAND")
            .query_async::<Value>(&mut c)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("unknown command"), "{err}");
        let pong: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
        assert_eq!(pong, "PONG");
    }
}
