//! `--metrics-addr`: the library's metrics in Prometheus text, served over
//! plain HTTP while the command runs (a `run` holding its lock, an `elect`
//! leading), and the same metrics as JSON for `compare`'s report.

#[cfg(feature = "compare")]
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::OnceLock;

use lock_core::{ErrorKind, KeyLabel, LockError, Operation, enable_metrics};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Installs the Prometheus recorder and turns the library's metrics on,
/// labelled by the key's first segment.
///
/// # Errors
///
/// `Config` when another recorder is installed already.
pub(crate) fn install() -> Result<PrometheusHandle, LockError> {
    let handle = install_once().ok_or_else(|| {
        LockError::new(
            ErrorKind::Config,
            Operation::Connect,
            "cannot install the metrics recorder (another one is installed)",
        )
    })?;
    enable_metrics(KeyLabel::Segments(1));
    Ok(handle)
}

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// The process's Prometheus recorder, installed on first use (`None` when
/// another recorder was installed first).
pub(crate) fn install_once() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| PrometheusBuilder::new().install_recorder().ok())
        .clone()
}

/// The counters and the histograms' counts and sums now (empty without
/// the recorder).
#[cfg(feature = "compare")]
pub(crate) fn snapshot() -> BTreeMap<String, f64> {
    let Some(handle) = HANDLE.get().and_then(Option::as_ref) else {
        return BTreeMap::new();
    };
    samples(&handle.render())
        .into_iter()
        .filter(|(series, _)| {
            let name = series.split('{').next().unwrap_or_default();
            name.ends_with("_total") || name.ends_with("_count") || name.ends_with("_sum")
        })
        .collect()
}

/// What grew from `before` to `after` (series that did not move are left
/// out).
#[cfg(feature = "compare")]
pub(crate) fn delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(series, value)| {
            let grown = value - before.get(series).copied().unwrap_or(0.0);
            (grown > 0.0).then(|| (series.clone(), grown))
        })
        .collect()
}

/// Binds `addr` and serves `handle`'s text to every request, on a task of
/// the current runtime, until the process ends.
///
/// # Errors
///
/// `Config` when the address cannot be bound.
pub(crate) async fn serve(addr: SocketAddr, handle: PrometheusHandle) -> Result<(), LockError> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        LockError::new(
            ErrorKind::Config,
            Operation::Connect,
            format!("--metrics-addr {addr}: cannot listen: {e}"),
        )
    })?;
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                // The request itself does not matter (every path is the
                // metrics); read what arrived, bounded, then answer.
                let mut request = [0u8; 4096];
                let _ = tokio::time::timeout(
                    std::time::Duration::from_secs(2),
                    stream.read(&mut request),
                )
                .await;
                let body = handle.render();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    Ok(())
}

/// The samples of a Prometheus text page as `(series, value)` pairs, in
/// page order (comment lines skipped): what `compare --json` reports.
#[cfg(any(feature = "compare", test))]
pub(crate) fn samples(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_read_series_and_values() {
        let text = "# TYPE x counter\nx{backend=\"sqlite\"} 3\ny 0.5\n\nbad line\n";
        assert_eq!(
            samples(text),
            vec![
                ("x{backend=\"sqlite\"}".to_owned(), 3.0),
                ("y".to_owned(), 0.5)
            ]
        );
    }
}
