//! The scheduler's timer queue and the growth rule of its per-guard tables.
//!
//! An indexed binary min-heap of `(instant, slot)`: 16 bytes a timer plus
//! 4 bytes of position per slot. The ordered set it replaces filled its
//! nodes about half when timers arrive in time order (as they do: renewals
//! are pushed to the end), about 35 bytes a timer.

use super::NEVER;

/// A slot without a timer.
const NOT_QUEUED: u32 = u32::MAX;

/// Reserves room for one more element, growing by an eighth (at least 64)
/// instead of doubling: per-guard tables of a client holding 10,000 locks
/// would otherwise keep up to as much spare capacity as they use.
pub(super) fn reserve_one<T>(vec: &mut Vec<T>) {
    if vec.len() == vec.capacity() {
        vec.reserve_exact((vec.len() / 8).max(64));
    }
}

/// Timers of slots, earliest first (ties by slot).
#[derive(Default)]
pub(super) struct Timers {
    heap: Vec<(u64, u32)>,
    /// Per slot: its index in `heap`, or `NOT_QUEUED`.
    position: Vec<u32>,
}

impl Timers {
    /// The earliest timer.
    pub(super) fn first(&self) -> Option<(u64, u32)> {
        self.heap.first().copied()
    }

    /// Sets (or, with `NEVER`, removes) the timer of `slot`.
    pub(super) fn set(&mut self, slot: u32, at: u64) {
        let index = slot as usize;
        let queued = self
            .position
            .get(index)
            .copied()
            .filter(|&p| p != NOT_QUEUED);
        match (queued, at == NEVER) {
            (None, true) => {}
            (None, false) => {
                while self.position.len() <= index {
                    reserve_one(&mut self.position);
                    self.position.push(NOT_QUEUED);
                }
                reserve_one(&mut self.heap);
                let at_index = self.heap.len();
                self.heap.push((at, slot));
                self.place(at_index);
                self.sift_up(at_index);
            }
            (Some(pos), true) => self.remove_at(pos as usize),
            (Some(pos), false) => {
                let pos = pos as usize;
                let old = self.heap[pos];
                self.heap[pos] = (at, slot);
                if (at, slot) < old {
                    self.sift_up(pos);
                } else {
                    self.sift_down(pos);
                }
            }
        }
    }

    /// Every timer at or before `upper`, earliest first.
    pub(super) fn until(&self, upper: u64) -> Vec<(u64, u32)> {
        let mut found = Vec::new();
        let mut stack = Vec::new();
        if self.heap.first().is_some_and(|&(at, _)| at <= upper) {
            stack.push(0);
        }
        // A heap's children are never earlier than their parent: a subtree
        // whose root is too late is skipped whole.
        while let Some(index) = stack.pop() {
            found.push(self.heap[index]);
            for child in [2 * index + 1, 2 * index + 2] {
                if self.heap.get(child).is_some_and(|&(at, _)| at <= upper) {
                    stack.push(child);
                }
            }
        }
        found.sort_unstable();
        found
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }

    fn remove_at(&mut self, pos: usize) {
        let (_, slot) = self.heap[pos];
        self.position[slot as usize] = NOT_QUEUED;
        let last = self.heap.len() - 1;
        if pos == last {
            self.heap.pop();
            return;
        }
        self.heap.swap_remove(pos);
        self.place(pos);
        let moved = self.heap[pos];
        if pos > 0 && moved < self.heap[(pos - 1) / 2] {
            self.sift_up(pos);
        } else {
            self.sift_down(pos);
        }
    }

    /// Records where the timer at `index` now sits.
    fn place(&mut self, index: usize) {
        let (_, slot) = self.heap[index];
        // Heap indices fit in u32: there is at most one timer per slot.
        #[allow(clippy::cast_possible_truncation)]
        let index = index as u32;
        self.position[slot as usize] = index;
    }

    fn sift_up(&mut self, mut index: usize) {
        while index > 0 {
            let parent = (index - 1) / 2;
            if self.heap[index] >= self.heap[parent] {
                break;
            }
            self.heap.swap(index, parent);
            self.place(index);
            index = parent;
        }
        self.place(index);
    }

    fn sift_down(&mut self, mut index: usize) {
        let len = self.heap.len();
        loop {
            let left = 2 * index + 1;
            if left >= len {
                break;
            }
            let right = left + 1;
            let child = if right < len && self.heap[right] < self.heap[left] {
                right
            } else {
                left
            };
            if self.heap[child] >= self.heap[index] {
                break;
            }
            self.heap.swap(index, child);
            self.place(index);
            index = child;
        }
        self.place(index);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Random operations on the heap and on an ordered set give the same
    /// first timers and ranges throughout.
    #[test]
    fn the_heap_orders_timers_like_an_ordered_set() {
        let mut timers = Timers::default();
        let mut reference: BTreeSet<(u64, u32)> = BTreeSet::new();
        let mut at: Vec<u64> = vec![NEVER; 300];
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for step in 0..20_000 {
            #[allow(clippy::cast_possible_truncation)]
            let slot = (next() % 300) as u32;
            let when = if next() % 4 == 0 {
                NEVER
            } else {
                next() % 1000
            };
            if at[slot as usize] != NEVER {
                reference.remove(&(at[slot as usize], slot));
            }
            if when != NEVER {
                reference.insert((when, slot));
            }
            at[slot as usize] = when;
            timers.set(slot, when);
            assert_eq!(timers.first(), reference.first().copied(), "step {step}");
            assert_eq!(timers.len(), reference.len());
            if step % 97 == 0 {
                let upper = next() % 1000;
                let expected: Vec<_> = reference.range(..=(upper, u32::MAX)).copied().collect();
                assert_eq!(timers.until(upper), expected, "step {step}");
            }
        }
    }

    #[test]
    fn tables_grow_by_an_eighth() {
        let mut vec: Vec<u64> = Vec::new();
        for i in 0..10_000 {
            reserve_one(&mut vec);
            vec.push(i);
        }
        assert!(
            vec.capacity() <= 10_000 + 10_000 / 8 + 64,
            "{}",
            vec.capacity()
        );
    }
}
