//! Read-write locks and semaphores, waiting: a waiter's re-check of its
//! turn and the watches it sleeps on .

use super::*;

impl Shared {
    /// Waits for our turn: `Ok(Ok((token, sent)))` when granted,
    /// `Ok(Err(reason))` when our entry or session was lost, `Contended`
    /// at the deadline.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn wait_shared(
        &self,
        session: &Arc<Session>,
        kind: LeaseKind,
        prefix: &str,
        entry: &str,
        epoch: &str,
        value: &str,
        my_revision: i64,
        deadline: Instant,
        op: Operation,
    ) -> Result<Result<(u64, Instant), String>, LockError> {
        let contended = || held_at_deadline(op);
        let mut state = session.subscribe();
        let mut backoff = lock_core::RetryPolicy::default().backoff();
        loop {
            if let SessionState::Lost(reason) = session.state() {
                return Ok(Err(reason));
            }
            if Instant::now() >= deadline {
                return Err(contended());
            }
            let sent_at = Instant::now();
            let turn = tokio::select! {
                biased;
                () = sleep_until(deadline) => return Err(contended()),
                turn = self.check_turn(
                    kind, prefix, entry, epoch, value, session.lease_id(), my_revision, op,
                ) => turn,
            };
            let turn = match turn {
                Ok(turn) => turn,
                Err(err) if err.is_temporary() => {
                    tracing::debug!(%err, "re-check failed; retrying");
                    let delay = backoff.next_delay().unwrap_or(Duration::from_millis(500));
                    tokio::select! {
                        () = sleep_until(deadline) => return Err(contended()),
                        () = sleep(delay) => continue,
                    }
                }
                Err(err) => return Err(err),
            };
            match turn {
                Turn::Granted(token) => return Ok(Ok((token, sent_at))),
                Turn::Lost(reason) => return Ok(Err(reason)),
                Turn::WaitFor {
                    key,
                    create_revision,
                    from,
                    with_puts,
                } => {
                    tokio::select! {
                        biased;
                        () = sleep_until(deadline) => return Err(contended()),
                        reason = session_lost(&mut state) => return Ok(Err(reason)),
                        () = self.waiting.wait_deleted(key, create_revision, from, with_puts) => {}
                    }
                }
                Turn::WaitAny { before, from } => {
                    tokio::select! {
                        biased;
                        () = sleep_until(deadline) => return Err(contended()),
                        reason = session_lost(&mut state) => return Ok(Err(reason)),
                        () = self.wait_any_deleted(prefix, my_revision, before, from) => {}
                    }
                }
            }
        }
    }

    /// One re-check of a waiting shared entry.
    ///
    /// - A writer: a transaction that, if our entry exists and no entry
    ///   under the prefix is older (every create revision >= ours), puts
    ///   the epoch key and our entry again in one revision, which is the
    ///   writer's token; otherwise reads the newest entry before ours.
    /// - A reader: reads the entries before ours and the epoch key in one
    ///   revision: granted when none is a writer, with the epoch's mod
    ///   revision as its token.
    /// - Permits: reads the entries before ours; when ours fit, puts our
    ///   entry again (if it still exists): that put's revision is the
    ///   token.
    #[allow(clippy::too_many_arguments)]
    async fn check_turn(
        &self,
        kind: LeaseKind,
        prefix: &str,
        entry: &str,
        epoch: &str,
        value: &str,
        lease_id: i64,
        my_revision: i64,
        op: Operation,
    ) -> Result<Turn, LockError> {
        let ours = Compare::create_revision(entry, CompareOp::Equal, my_revision);
        let gone = || Turn::Lost("our waiting entry disappeared (lease expired or revoked)".into());
        let put_again = || TxnOp::put(entry, value, Some(PutOptions::new().with_lease(lease_id)));
        match kind {
            LeaseKind::Write => {
                let txn = Txn::new()
                    .when([
                        ours,
                        Compare::create_revision(prefix, CompareOp::Greater, my_revision - 1)
                            .with_prefix(),
                    ])
                    .and_then([TxnOp::put(epoch, entry, None), put_again()])
                    .or_else([
                        TxnOp::get(entry, Some(GetOptions::new().with_keys_only())),
                        TxnOp::get(
                            prefix,
                            Some(entries_before(my_revision).with_limit(1).with_keys_only()),
                        ),
                    ]);
                let response = self.conn.txn(op, txn).await?;
                let revision = response.header().map_or(0, |h| h.revision());
                if response.succeeded() {
                    return Ok(Turn::Granted(u64::try_from(revision).unwrap_or(0)));
                }
                let responses = response.op_responses();
                let mine = shares(responses.first());
                if !mine.iter().any(|s| s.create_revision == my_revision) {
                    return Ok(gone());
                }
                match shares(responses.get(1)).into_iter().next() {
                    Some(before) => Ok(Turn::WaitFor {
                        key: before.key,
                        create_revision: before.create_revision,
                        from: revision + 1,
                        with_puts: false,
                    }),
                    // Nothing before us, yet the compare failed: a race
                    // with a deletion; check again at once.
                    None => Ok(Turn::WaitAny {
                        before: 0,
                        from: revision + 1,
                    }),
                }
            }
            LeaseKind::Read => {
                let txn = Txn::new().when([ours]).and_then([
                    TxnOp::get(prefix, Some(entries_before(my_revision))),
                    TxnOp::get(epoch, None),
                ]);
                let response = self.conn.txn(op, txn).await?;
                if !response.succeeded() {
                    return Ok(gone());
                }
                let revision = response.header().map_or(0, |h| h.revision());
                let responses = response.op_responses();
                match shares(responses.first())
                    .into_iter()
                    .find(Share::blocks_readers)
                {
                    None => Ok(Turn::Granted(
                        u64::try_from(mod_revision_of(responses.get(1))).unwrap_or(0),
                    )),
                    // A writer before us may also downgrade in place: watch
                    // its puts too.
                    Some(writer) => Ok(Turn::WaitFor {
                        key: writer.key,
                        create_revision: writer.create_revision,
                        from: revision + 1,
                        with_puts: true,
                    }),
                }
            }
            LeaseKind::Permits { count, limit } => {
                let txn = Txn::new()
                    .when([ours.clone()])
                    .and_then([TxnOp::get(prefix, Some(entries_before(my_revision)))]);
                let response = self.conn.txn(op, txn).await?;
                if !response.succeeded() {
                    return Ok(gone());
                }
                let revision = response.header().map_or(0, |h| h.revision());
                let before = shares(response.op_responses().first());
                let taken: u64 = before.iter().map(|s| s.permits(limit)).sum();
                if taken + u64::from(count) > u64::from(limit) {
                    return Ok(Turn::WaitAny {
                        before: before.len(),
                        from: revision + 1,
                    });
                }
                // Ours fit, and keeps fitting (entries before ours only
                // go). The token is a fresh revision, above every grant
                // handed out before this one.
                let txn = Txn::new()
                    .when([ours, Compare::value(entry, CompareOp::Equal, value)])
                    .and_then([put_again()]);
                let response = self.conn.txn(op, txn).await?;
                if !response.succeeded() {
                    return Ok(gone());
                }
                let revision = response.header().map_or(0, |h| h.revision());
                Ok(Turn::Granted(u64::try_from(revision).unwrap_or(0)))
            }
            _ => Ok(Turn::Lost("not a shared kind".to_owned())),
        }
    }

    /// Returns when an entry under `prefix` older than ours was deleted at or
    /// after `from` (later waiters leaving wake nobody),
    /// when fewer than `before` entries older than `my_revision` remain, or
    /// when the watch ended for any reason: the caller re-reads either way.
    /// The watch's possible lag after its creation is covered as in
    /// `wait_deleted` (probing the number of older entries).
    async fn wait_any_deleted(&self, prefix: &str, my_revision: i64, before: usize, from: i64) {
        if before == 0 {
            return;
        }
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from)
            .with_prev_key()
            .with_filters([WatchFilterType::NoPut]);
        let older = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_max_create_revision(my_revision - 1);
        let count = move || {
            let older = older.clone();
            async move {
                let response = self.conn.read_quietly(prefix, older).await?;
                Some(if response.kvs().len() < before {
                    Seen::Changed
                } else {
                    Seen::Unchanged(response.header().map_or(0, |h| h.revision()))
                })
            }
        };
        // Only the deletion of an entry older than ours can make room (one
        // without its previous value counts).
        let makes_room = |response: &WatchResponse| {
            response.events().iter().any(|event| {
                event
                    .prev_kv()
                    .is_none_or(|kv| kv.create_revision() < my_revision)
            })
        };
        self.waiting
            .watch_until(prefix, options, from, makes_room, count)
            .await;
    }
}
