//! Session signals of session-based backends: one slot and one watcher
//! per session channel, idle sessions kept for the next guard.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;

use super::{NO_SESSION, SESSION_SEARCH, SESSION_SUSPECT, Scheduler, SessionSlot, State};
use crate::hold::LockState;
use crate::types::SessionState;

impl Scheduler {
    /// A session's state moved (or its sender is gone: `open` false).
    pub(super) fn session_changed(
        &self,
        index: usize,
        generation: u32,
        rx: watch::Receiver<SessionState>,
        open: bool,
    ) -> Watcher {
        let value = if open {
            rx.borrow().clone()
        } else {
            SessionState::Lost("session closed".to_owned())
        };
        let mut st = self.lock();
        let (Ok(session), Some(slot)) = (u32::try_from(index), st.sessions.get(index)) else {
            return None;
        };
        if slot.generation != generation {
            // The slot was freed (or reused for another channel) meanwhile.
            return None;
        }
        if slot.users == 0 {
            // An idle session moved: let it go (the next guard on it
            // registers a new slot, and the task arms a new watcher).
            #[allow(clippy::cast_possible_truncation)] // sessions are indexed by u32
            st.free_session(index as u32);
            return None;
        }
        let first = slot.first_user;
        let single = slot.users == 1
            && st
                .slots
                .get(first as usize)
                .is_some_and(|e| e.session == session && e.shared.is_some());
        let affected: Vec<u32> = if single {
            vec![first]
        } else {
            (0..st.slots.len())
                .filter(|&i| st.slots[i].session == session && st.slots[i].shared.is_some())
                .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
                .collect()
        };
        for slot in affected {
            let entry = &mut st.slots[slot as usize];
            let Some(shared) = entry.shared.clone() else {
                continue;
            };
            match &value {
                SessionState::Lost(reason) => {
                    shared.set_state(LockState::Lost(format!("backend session lost: {reason}")));
                    st.free_slot(slot);
                }
                SessionState::Suspect => {
                    entry.set_flag(SESSION_SUSPECT, true);
                    shared.set_state(LockState::Suspect);
                }
                SessionState::Alive => {
                    entry.set_flag(SESSION_SUSPECT, false);
                    shared.set_state(LockState::Held);
                }
            }
        }
        if open && st.sessions.get(index).is_some_and(|s| s.users > 0) {
            Some((generation, watch_session(rx)))
        } else {
            if let Some(slot) = st.sessions.get_mut(index) {
                slot.watched = false;
                if !open {
                    slot.rx = None;
                }
            }
            None
        }
    }
}

impl State {
    /// A session's last guard is gone: keep its slot and watcher for the
    /// next guard on the same channel (see `IDLE_SESSIONS`), freeing the
    /// oldest idle ones beyond the limit.
    pub(super) fn idle_session(&mut self, session: u32) {
        if self.sessions[session as usize].rx.is_none() {
            // Its channel closed: nothing to reuse.
            self.free_session(session);
            return;
        }
        self.idle_sessions.push(session);
        while self.idle_sessions.len() > self.idle_limit {
            let oldest = self.idle_sessions[0];
            self.free_session(oldest);
        }
    }

    /// Gives a session slot back (its watcher, if any, is dropped by the
    /// task at its next pass: the generation no longer matches).
    pub(super) fn free_session(&mut self, session: u32) {
        let Some(s) = self.sessions.get_mut(session as usize) else {
            return;
        };
        s.rx = None;
        s.users = 0;
        s.watched = false;
        s.generation = s.generation.wrapping_add(1);
        self.free_sessions.push(session);
        self.recent_sessions.retain(|&r| r != session);
        self.idle_sessions.retain(|&r| r != session);
    }

    pub(super) fn session_index(&mut self, rx: &watch::Receiver<SessionState>, user: u32) -> u32 {
        let found = self
            .recent_sessions
            .iter()
            .rev()
            .take(SESSION_SEARCH)
            .copied()
            .find(|&i| {
                self.sessions[i as usize]
                    .rx
                    .as_ref()
                    .is_some_and(|r| r.same_channel(rx))
            });
        if let Some(index) = found {
            let slot = &mut self.sessions[index as usize];
            if slot.users == 0 {
                // An idle session, watched still: back in use.
                slot.first_user = user;
                self.idle_sessions.retain(|&r| r != index);
            }
            self.sessions[index as usize].users += 1;
            return index;
        }
        let index = match self.free_sessions.pop() {
            Some(index) => {
                let slot = &mut self.sessions[index as usize];
                slot.rx = Some(rx.clone());
                slot.users = 1;
                slot.first_user = user;
                slot.watched = false;
                index
            }
            None => {
                self.sessions.push(SessionSlot {
                    rx: Some(rx.clone()),
                    users: 1,
                    first_user: user,
                    generation: 0,
                    watched: false,
                });
                u32::try_from(self.sessions.len() - 1).unwrap_or(NO_SESSION)
            }
        };
        self.recent_sessions.push(index);
        if self.recent_sessions.len() > SESSION_SEARCH * 4 {
            let excess = self.recent_sessions.len() - SESSION_SEARCH;
            self.recent_sessions.drain(..excess);
        }
        index
    }
}

pub(super) type WatchFuture =
    Pin<Box<dyn Future<Output = (watch::Receiver<SessionState>, bool)> + Send + 'static>>;
/// A session watcher and the generation of the slot it watches.
pub(super) type Watcher = Option<(u32, WatchFuture)>;

pub(super) fn watch_session(rx: watch::Receiver<SessionState>) -> WatchFuture {
    Box::pin(async move {
        let mut rx = rx;
        let open = rx.changed().await.is_ok();
        (rx, open)
    })
}
