//! `--metrics-addr`: the library's metrics in Prometheus text, served over
//! plain HTTP while the command runs (a `run` holding its lock, an `elect`
//! leading).

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
