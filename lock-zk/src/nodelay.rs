//! `TCP_NODELAY` on the client crate's connections to the ensemble.
//!
//! The `zookeeper-client` crate opens its sockets with Nagle's algorithm
//! on and offers no way to turn it off. With Nagle on, a small request
//! written while an earlier one is still unacknowledged waits for that
//! acknowledgement, which the server sends with the earlier request's
//! reply: two requests made together (a create and the list behind it, a
//! `sync` and its read) then cost two round trips instead of one whenever
//! the crate writes them apart. Measured through the fault proxy: a cycle
//! on a free key counted 3.0 round trips with the list sent behind the
//! create, 2.0 with this (`tests/round_trips.rs`).
//!
//! The sockets are found by their peer: every TCP socket of this process
//! connected to one of the ensemble's addresses gets `TCP_NODELAY`, on
//! Linux through `/proc/self/fd` (each descriptor duplicated first, so
//! only our own duplicate is used and closed). Another client's socket to
//! the same servers gets it too, which only makes its small writes leave
//! at once. Elsewhere nothing is done, and requests made together may cost
//! a round trip each. Run after each connection the client makes: at
//! connect and whenever the session is connected again.

use std::net::SocketAddr;
use std::time::Duration;

/// The addresses `hosts` (`host:port`) resolve to, within `patience`;
/// what fails to resolve in time is left out (those connections keep
/// Nagle on).
pub(crate) async fn resolve(hosts: &[String], patience: Duration) -> Vec<SocketAddr> {
    let mut peers = Vec::new();
    for host in hosts {
        if let Ok(Ok(found)) = tokio::time::timeout(patience, tokio::net::lookup_host(host)).await {
            peers.extend(found);
        }
    }
    peers
}

/// Sets `TCP_NODELAY` on every TCP socket of this process connected to
/// one of `peers`; returns how many it set.
#[cfg(target_os = "linux")]
pub(crate) fn set_on_connections_to(peers: &[SocketAddr]) -> usize {
    use std::os::fd::{FromRawFd, OwnedFd};

    if peers.is_empty() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut set = 0;
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: F_DUPFD_CLOEXEC only reads the descriptor number; if it
        // was closed meanwhile the call fails with EBADF, and if it was
        // reused the duplicate is of whatever it is now (checked below).
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            continue;
        }
        // SAFETY: `dup` is a descriptor this call just made and nothing
        // else knows of: the OwnedFd is its only owner and closes it.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        // Any descriptor: for one that is not a connected TCP socket
        // `peer_addr` fails and nothing is set.
        let stream = std::net::TcpStream::from(owned);
        if stream.peer_addr().is_ok_and(|peer| peers.contains(&peer))
            && stream.set_nodelay(true).is_ok()
        {
            set += 1;
        }
    }
    set
}

/// Elsewhere: nothing (see the module docs).
#[cfg(not(target_os = "linux"))]
pub(crate) fn set_on_connections_to(_peers: &[SocketAddr]) -> usize {
    0
}
