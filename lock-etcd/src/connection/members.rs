//! Leaving a member that cannot serve, on `etcd-client`'s own channel.
//!
//! The client's channel (tonic's) balances calls over every endpoint and
//! leaves one only when its connection breaks. A member cut off from its
//! peers keeps its connections: every call routed to it waits and fails
//! ("no leader", or no answer) for as long as the cut lasts. So with more
//! than one endpoint, each member is asked, on a client of its own, for a
//! linearizable read (which needs the cluster's leader) every
//! [`PROBE_EVERY`]; a member that does not answer within [`PROBE_TIMEOUT`]
//! is taken out of the client's balancer (`Client::remove_endpoint`), and
//! put back (`Client::add_endpoint`) once it answers again. The last
//! member in the balancer always stays: with none answering, calls fail on
//! their own timeouts as before. Checked by `tests/partition.rs`'s
//! `a_client_leaves_a_member_cut_from_its_peers` (in the kernel's
//! partition lab) and `tests/channel.rs`.

use std::sync::Weak;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use tokio::time::{sleep, timeout};

use super::Connection;

/// How often each member is asked.
const PROBE_EVERY: Duration = Duration::from_millis(500);

/// How long a member may take to answer its probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(800);

/// Starts the watch of `urls` (the endpoints as the client was given
/// them, with their scheme) for `connection`'s client; it ends when the
/// connection is dropped. Nothing to watch with one endpoint.
pub(super) fn watch_members(
    connection: Weak<Connection>,
    urls: Vec<String>,
    options: ConnectOptions,
) {
    if urls.len() < 2 {
        return;
    }
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(watch_loop(connection, urls, options));
}

async fn watch_loop(connection: Weak<Connection>, urls: Vec<String>, options: ConnectOptions) {
    // A client of its own per member (connected lazily by its channel).
    let mut probes: Vec<Option<Client>> = vec![None; urls.len()];
    let mut left = vec![false; urls.len()];
    loop {
        sleep(PROBE_EVERY).await;
        if connection.strong_count() == 0 {
            return;
        }
        let mut answers = Vec::with_capacity(urls.len());
        for (url, probe) in urls.iter().zip(probes.iter_mut()) {
            answers.push(answers_in_time(url, probe, &options).await);
        }
        let Some(connection) = connection.upgrade() else {
            return;
        };
        for (i, answered) in answers.into_iter().enumerate() {
            let staying = left.iter().filter(|gone| !**gone).count();
            if !answered && !left[i] && staying > 1 {
                tracing::debug!(target: "lock_etcd", member = %urls[i], "leaving a member that does not answer");
                if connection.client.remove_endpoint(&urls[i]).await.is_ok() {
                    left[i] = true;
                }
            } else if answered && left[i] {
                tracing::debug!(target: "lock_etcd", member = %urls[i], "back to a member that answers");
                if connection.client.add_endpoint(&urls[i]).await.is_ok() {
                    left[i] = false;
                }
            }
        }
    }
}

/// Whether the member at `url` answers a linearizable read in time (its
/// probe client is made on first use).
async fn answers_in_time(url: &str, probe: &mut Option<Client>, options: &ConnectOptions) -> bool {
    let asked = timeout(PROBE_TIMEOUT, async {
        if probe.is_none() {
            *probe = Client::connect([url], Some(options.clone())).await.ok();
        }
        let client = probe.as_mut()?;
        let read = GetOptions::new().with_count_only();
        client.get("\0", Some(read)).await.ok()
    })
    .await;
    matches!(asked, Ok(Some(_)))
}
