//! Read-write locks and semaphores: parsing, releasing and downgrading a
//! shared lease, and the holders of a shape .

use super::*;

impl Shared {
    /// Releases a read, write or permit lease: deletes its entry if it still
    /// has the lease's create revision and value (a downgraded write lease's
    /// entry now holds the read lease's value, so it is left alone).
    pub(crate) async fn release_shared(&self, lease: &Lease) -> Result<bool, LockError> {
        let op = Operation::Release;
        let (entry, revision, lease_id) = self.grants.parse_shared_lease(lease, op)?;
        let session = self.conn.session_by_lease(lease_id);
        let was_held = session
            .as_ref()
            .is_some_and(|s| s.unmark_held(&entry, revision, lease.owner()));
        let delete = shared_delete(&entry, revision, lease.kind(), lease.owner());
        self.grants
            .delete_released(op, delete, lease, (entry, revision), session, was_held)
            .await
    }

    /// Write to read in place: one transaction rewrites our entry's value
    /// (same key, same create revision, so the same place before every
    /// waiter) if it still is this write lease's. The read lease gets a new
    /// owner id, so the write lease is no longer held.
    pub(crate) async fn downgrade_shared(&self, lease: &Lease) -> Result<Lease, LockError> {
        let op = Operation::Downgrade;
        let not_held = |why: &str| {
            LockError::new(ErrorKind::NotHeld, op, why.to_owned())
                .with_key(lease.key())
                .with_backend(NAME)
        };
        if lease.kind() != LeaseKind::Write {
            return Err(not_held("only a write lease can be downgraded"));
        }
        let (entry, revision, lease_id) = self.grants.parse_shared_lease(lease, op)?;
        let now = Instant::now();
        if lease.validity_deadline() <= now && lease.session().is_some() {
            return Err(not_held("the write lease's deadline passed"));
        }
        let session = self.conn.session_by_lease(lease_id);
        if let Some(session) = &session {
            if !session.holds(&entry, revision, lease.owner()) {
                return Err(not_held("the write lease was released or lost"));
            }
            if let SessionState::Lost(reason) = session.state() {
                return Err(LockError::new(ErrorKind::LeaseLost, op, reason)
                    .with_key(lease.key())
                    .with_backend(NAME));
            }
        }
        let new_owner = session
            .as_ref()
            .map_or_else(OwnerId::random, |s| s.new_owner());
        let mut compares = vec![Compare::create_revision(
            entry.as_str(),
            CompareOp::Equal,
            revision,
        )];
        compares.extend(shared_owner_compares(
            &entry,
            LeaseKind::Write,
            lease.owner(),
        ));
        // The read lease's value carries fresh details: it is granted now.
        let read_value = entry_value(LeaseKind::Read, new_owner);
        let txn = Txn::new().when(compares).and_then([TxnOp::put(
            entry.as_str(),
            read_value,
            Some(PutOptions::new().with_lease(lease_id)),
        )]);
        match self.conn.txn(op, txn).await {
            Ok(response) if response.succeeded() => {}
            Ok(_) => {
                if let Some(session) = &session {
                    session.unmark_held(&entry, revision, lease.owner());
                }
                return Err(not_held("the write lease's entry is gone or changed"));
            }
            Err(err) => {
                // Unknown outcome: neither lease may be trusted; the entry
                // is deleted (or expires with its TTL).
                if let Some(session) = session
                    && session.unmark_held(&entry, revision, lease.owner())
                {
                    clean_up_later(&self.conn.client, session, entry, lease.owner(), revision);
                }
                return Err(err.with_key(lease.key()));
            }
        }
        let mut read = Lease::from_parts(
            lease.key().clone(),
            new_owner,
            lease.token(),
            lease.ttl(),
            lease.validity_deadline(),
            lease.backend_data().to_owned(),
        )
        .with_kind(LeaseKind::Read);
        if let Some(session) = &session {
            let due = session
                .due(&entry)
                .unwrap_or_else(|| now.checked_add(lease.ttl()).unwrap_or(now));
            read.set_validity_deadline(read.validity_deadline().min(session.deadline()));
            read = read.with_session(session.mark_held(&entry, revision, new_owner, due));
        }
        Ok(read)
    }

    /// Every holder of a read-write lock or a semaphore: the entries whose
    /// turn has come (readers with no writer before them, the oldest entry
    /// if it is a granted writer; permit entries that fit with every entry
    /// before them).
    pub(crate) async fn shared_holders(
        &self,
        key: &LockKey,
        shape: LockShape,
    ) -> Result<Vec<HolderInfo>, LockError> {
        let op = Operation::Inspect;
        let prefix = self.conn.shape_prefix(key, shape);
        let epoch = epoch_key(&self.conn.prefix, key);
        let txn = Txn::new().and_then([
            TxnOp::get(prefix.as_str(), Some(all_entries())),
            TxnOp::get(epoch.as_str(), None),
        ]);
        let response = self.conn.txn(op, txn).await.map_err(|e| e.with_key(key))?;
        let responses = response.op_responses();
        let entries = shares(responses.first());
        let epoch_revision = mod_revision_of(responses.get(1));
        let mut ttls: HashMap<i64, Option<Duration>> = HashMap::new();
        let mut out = Vec::new();
        for (i, kind, token) in granted_shares(shape, &entries, epoch_revision) {
            let share = &entries[i];
            let name = String::from_utf8_lossy(&share.key).into_owned();
            let own_due = self
                .conn
                .session_by_lease(share.lease)
                .and_then(|s| s.due(&name));
            let remaining_ttl = match own_due {
                Some(due) => Some(due.saturating_duration_since(Instant::now())),
                None => match ttls.get(&share.lease) {
                    Some(ttl) => *ttl,
                    None => {
                        let ttl = self.conn.lease_ttl(share.lease, op).await;
                        ttls.insert(share.lease, ttl);
                        ttl
                    }
                },
            };
            out.push(share.holder_info(kind, token, remaining_ttl));
        }
        Ok(out)
    }
}

/// The entries of a read-write lock or a semaphore whose turn has come,
/// from `entries` oldest first (by create revision), each with its kind
/// and token: readers with no writer before them (the epoch's token), the
/// oldest entry if it is a granted writer (its epoch put), permit entries
/// that fit with every entry before them (their grant's revision), by
/// index in `entries`. A value this crate did not write blocks every entry
/// after it.
pub(crate) fn granted_shares(
    shape: LockShape,
    entries: &[Share],
    epoch_revision: i64,
) -> Vec<(usize, LeaseKind, i64)> {
    let mut held = Vec::new();
    let mut writer_before = false;
    let mut taken: u64 = 0;
    for (i, share) in entries.iter().enumerate() {
        let token = match (shape, share.kind) {
            (LockShape::ReadWrite, Some(LeaseKind::Read)) => {
                (!writer_before).then_some(epoch_revision)
            }
            (LockShape::ReadWrite, Some(LeaseKind::Write)) => {
                writer_before = true;
                (i == 0 && share.mod_revision == epoch_revision).then_some(share.mod_revision)
            }
            (LockShape::Semaphore, Some(LeaseKind::Permits { count, limit })) => {
                let fits = taken + u64::from(count) <= u64::from(limit);
                taken += u64::from(count);
                fits.then_some(share.mod_revision)
            }
            _ => {
                writer_before = true;
                taken = u64::MAX / 2;
                None
            }
        };
        if let (Some(token), Some(kind)) = (token, share.kind) {
            held.push((i, kind, token));
        }
    }
    held
}

impl Share {
    /// This granted entry as `holders` reports it.
    pub(crate) fn holder_info(
        &self,
        kind: LeaseKind,
        token: i64,
        remaining_ttl: Option<Duration>,
    ) -> HolderInfo {
        HolderInfo {
            kind,
            holder: self.owner.clone(),
            token: u64::try_from(token).ok().map(FencingToken::new),
            remaining_ttl,
            details: self.details.clone(),
        }
    }
}
