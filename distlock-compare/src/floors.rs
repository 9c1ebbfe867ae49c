//! Raw floors: the minimal grant + release of each backend, written by hand
//! on one bare connection of its own (`lock_*::floor`), and the fault
//! proxy put in front of a server to count round trips.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use conformance::bench::{Contender, FloorCycle};
use conformance::floor::RawFloor;
use conformance::proxy::FaultProxy;
use lock_core::LockError;

/// The floor for the backend at `url`, from its driver's descriptor:
/// `Ok(None)` when its driver has none (memory, Sentinel, Cluster).
///
/// # Errors
///
/// An unknown scheme; the floor's connection errors.
pub(crate) async fn connect(url: &str) -> Result<Option<Box<dyn RawFloor>>, LockError> {
    match lock_bench::for_driver(distlock::backend::driver_for(url)?.name).floor {
        Some(floor) => floor(url).await,
        None => Ok(None),
    }
}

/// `n` independent floor clients (each its own connection), or `None`
/// when the backend has no floor or one cannot connect (said on stderr:
/// the ratio columns then stay empty).
pub(crate) async fn contenders(
    url: &str,
    ttl: Duration,
    n: usize,
) -> Option<Vec<Arc<dyn Contender>>> {
    let mut out: Vec<Arc<dyn Contender>> = Vec::with_capacity(n);
    for _ in 0..n {
        match connect(url).await {
            Ok(Some(floor)) => out.push(Arc::new(FloorCycle::new(floor, ttl))),
            Ok(None) => return None,
            Err(err) => {
                eprintln!(
                    "floor for {}: cannot connect ({err}); ratios left out",
                    distlock::redact_url(url)
                );
                return None;
            }
        }
    }
    Some(out)
}

/// `n` raw server locks (the bare advisory-lock / `GET_LOCK` exchange,
/// no token, each on a connection of its own: `lock_bench::sql::SqlRawLock`)
/// for a SQL session-mode URL; `None` for any other backend or mode, or
/// when one cannot connect (said on stderr: the raw columns then stay
/// empty).
pub(crate) async fn raw_server_locks(url: &str, n: usize) -> Option<Vec<Arc<dyn Contender>>> {
    if distlock::backend::driver_for(url).ok()?.name != "sql" {
        return None;
    }
    let mut out: Vec<Arc<dyn Contender>> = Vec::with_capacity(n);
    for _ in 0..n {
        match lock_bench::sql::raw_lock_of_session_url(url).await {
            Ok(Some(raw)) => out.push(Arc::new(raw)),
            Ok(None) => return None,
            Err(err) => {
                eprintln!(
                    "raw server lock for {}: cannot connect ({err}); raw ratios left out",
                    distlock::redact_url(url)
                );
                return None;
            }
        }
    }
    Some(out)
}

/// `n` clients of the driver's client library alone
/// (`lock_bench::crate_alone`), each its own connection, every grant
/// asking for `ttl`, and the library's name; `None` for a driver without
/// one here or a URL form without one, or when one cannot connect (said
/// on stderr: the crate-alone columns then stay empty).
pub(crate) async fn crate_alone(
    url: &str,
    ttl: Duration,
    n: usize,
) -> Option<(&'static str, Vec<Arc<dyn Contender>>)> {
    let alone = lock_bench::crate_alone::for_driver(distlock::backend::driver_for(url).ok()?.name)?;
    let mut out: Vec<Arc<dyn Contender>> = Vec::with_capacity(n);
    for _ in 0..n {
        match (alone.connect)(url, ttl).await {
            Ok(Some(client)) => out.push(client),
            Ok(None) => return None,
            Err(err) => {
                eprintln!(
                    "{} alone for {}: cannot connect ({err}); crate-alone ratios left out",
                    alone.library,
                    distlock::redact_url(url)
                );
                return None;
            }
        }
    }
    Some((alone.library, out))
}

/// The default port of a scheme whose URL names servers (from the
/// driver's descriptor).
fn default_port(scheme: &str) -> Option<u16> {
    distlock::backend::drivers()
        .iter()
        .find_map(|d| d.default_port(scheme))
}

/// A fault proxy in front of the one loopback server of `url`, and `url`
/// rewritten to go through it; `None` for URLs with no single loopback
/// server (several hosts, a file, a remote host: round trips are
/// only counted on loopback test servers).
pub(crate) async fn proxied(url: &str) -> Option<(String, FaultProxy)> {
    let (scheme, rest) = url.split_once("://")?;
    let port = default_port(&scheme.to_ascii_lowercase())?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..end];
    let at = authority.rfind('@').map_or(0, |i| i + 1);
    let server = &authority[at..];
    if server.contains(',') {
        return None;
    }
    let (host, port) = match server.rsplit_once(':') {
        Some((host, p)) if !host.is_empty() && !host.ends_with(':') => (host, p.parse().ok()?),
        _ => (server, port),
    };
    if !matches!(host, "127.0.0.1" | "localhost") {
        return None;
    }
    let proxy = FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
        .ok()?;
    let url = format!(
        "{scheme}://{}127.0.0.1:{}{}",
        &authority[..at],
        proxy.port(),
        &rest[end..]
    );
    Some((url, proxy))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn rewrites_single_loopback_servers_only() {
        let (url, proxy) = proxied("postgres://u:p@127.0.0.1:5433/db?x=1")
            .await
            .unwrap();
        assert_eq!(
            url,
            format!("postgres://u:p@127.0.0.1:{}/db?x=1", proxy.port())
        );
        assert_eq!(proxy.upstream().port(), 5433);
        let (url, proxy) = proxied("redis://localhost").await.unwrap();
        assert_eq!(url, format!("redis://127.0.0.1:{}", proxy.port()));
        assert_eq!(proxy.upstream().port(), 6379);
        assert!(proxied("redlock://127.0.0.1:1,127.0.0.1:2").await.is_none());
        assert!(proxied("zk://10.0.0.1:2181").await.is_none());
        assert!(proxied("sqlite:///tmp/x.db").await.is_none());
        // TLS is proxied like plain TCP (turns of TLS records count the same).
        let (url, _proxy) = proxied("rediss://127.0.0.1:6380").await.unwrap();
        assert!(url.starts_with("rediss://127.0.0.1:"), "{url}");
    }
}
