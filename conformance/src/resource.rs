//! A protected resource that lives outside the lock holders, for holder
//! processes: a loopback TCP server that records every write it receives
//! (the line a writer sent, normally its fencing token, and when it
//! arrived). It judges nothing; the history checker does.
//!
//! The holder processes of the crash and pause scenarios find it through
//! the [`RESOURCE_ENV`] environment variable (`127.0.0.1:PORT`). While a
//! holder believes it holds the lock, it sends its fencing token as one
//! line every ~20 ms, one connection per write (`echo "$TOKEN"
//! >/dev/tcp/127.0.0.1/PORT` in bash does), after one line that reports its
//! lease ([`crate::scenarios::LEASE_REPORT`]), which is not a write.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::process::HarnessError;

/// The environment variable that tells a holder process where the
/// resource is.
pub const RESOURCE_ENV: &str = "DISTLOCK_TEST_RESOURCE";

/// One write that reached the resource.
#[derive(Clone, Debug)]
pub struct Arrival {
    /// When it arrived (the connection's data was read in full).
    pub at: Instant,
    /// What was sent, trimmed.
    pub line: String,
}

/// The resource server. Stops on drop.
#[derive(Debug)]
pub struct ResourceServer {
    addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    task: JoinHandle<()>,
}

impl ResourceServer {
    /// Starts on a free loopback port.
    ///
    /// # Errors
    ///
    /// When no port can be bound.
    pub async fn start() -> Result<Self, HarnessError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let sink = arrivals.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let sink = sink.clone();
                tokio::spawn(async move {
                    let mut text = String::new();
                    if stream.read_to_string(&mut text).await.is_err() {
                        return;
                    }
                    let at = Instant::now();
                    let mut list = sink.lock().unwrap_or_else(PoisonError::into_inner);
                    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
                        list.push(Arrival {
                            at,
                            line: line.to_owned(),
                        });
                    }
                });
            }
        });
        Ok(Self {
            addr,
            arrivals,
            task,
        })
    }

    /// Where writers connect (`127.0.0.1:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every write so far, in arrival order.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for ResourceServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
