//! Per-slot state that keeps readers and fillers of a cache slot apart.
//!
//! Protocol (all "under the director" steps happen with the director's mutex
//! held, so they are atomic with the mapping change that motivates them):
//! - A reader or in-place writer of a mapped slot *pins* it under the
//!   director, only if the slot is ready, and unpins after its one device IO.
//!   A pin holder never waits for anything but its own IO.
//! - Whoever is given a slot for a new block (promotion or allocation) marks
//!   it *not ready* under the director, which also bumps the slot's fill
//!   generation and hands it to the filler. The filler then takes the slot's
//!   fill lock; if the generation moved on meanwhile (its block was evicted
//!   and the slot handed to someone else) it writes nothing. Otherwise it
//!   waits for the pins to drain (readers of the block evicted from the
//!   slot), writes the data, and marks the slot ready under the director only
//!   if the generation is still its own and the slot still holds its block.
//!   A filler holds at most one fill lock at a time. A filler that must not
//!   wait (a front end's thread that serves many requests,
//!   `uncached_read.rs`) only tries the lock and the pins, and gives the
//!   promotion up if either is taken.
//!
//! Readers that find a slot not ready read the backing device instead.
//!
//! Cost: 4 bytes of RAM per cache block (fill locks are striped: fillers of
//! two slots in the same stripe take turns, which costs little because a
//! filler holds its lock only for one cache write).

use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU32, Ordering};
use tiercache_types::CacheBlock;

const NOT_READY: u32 = 1 << 15;
const PIN_MASK: u32 = NOT_READY - 1;
const GEN_SHIFT: u32 = 16;

/// Identifies one hand-over of a slot to a filler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FillTicket(u32);

pub struct SlotStates {
    state: Vec<AtomicU32>,
    fill: Vec<Mutex<()>>,
}

/// Fill lock stripes.
const FILL_STRIPES: usize = 1024;

impl SlotStates {
    pub fn new(capacity: u32) -> Self {
        SlotStates {
            state: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            fill: (0..FILL_STRIPES).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Whether `c` holds its block's data (not being filled).
    pub fn is_ready(&self, c: CacheBlock) -> bool {
        self.state[c.index()].load(Ordering::Acquire) & NOT_READY == 0
    }

    /// Pins `c` if it is ready. Call under the director.
    pub fn try_pin(&self, c: CacheBlock) -> bool {
        let s = &self.state[c.index()];
        let cur = s.load(Ordering::Acquire);
        if cur & NOT_READY != 0 {
            return false;
        }
        assert!(cur & PIN_MASK < PIN_MASK, "pin count overflow");
        s.fetch_add(1, Ordering::AcqRel);
        true
    }

    pub fn unpin(&self, c: CacheBlock) {
        let prev = self.state[c.index()].fetch_sub(1, Ordering::AcqRel);
        debug_assert!(prev & PIN_MASK > 0, "unpin of an unpinned slot");
    }

    /// Marks `c` not ready for a new block and returns the filler's ticket.
    /// Call under the director, in the same critical section that mapped
    /// the block to `c`.
    pub fn mark_filling(&self, c: CacheBlock) -> FillTicket {
        let s = &self.state[c.index()];
        let mut cur = s.load(Ordering::Acquire);
        loop {
            let gen = (cur >> GEN_SHIFT).wrapping_add(1) & 0xFFFF;
            let new = (gen << GEN_SHIFT) | NOT_READY | (cur & PIN_MASK);
            match s.compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return FillTicket(gen),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Whether `ticket` is still the latest hand-over of `c`.
    pub fn is_current(&self, c: CacheBlock, ticket: FillTicket) -> bool {
        self.state[c.index()].load(Ordering::Acquire) >> GEN_SHIFT == ticket.0
    }

    /// Marks `c` ready. Call under the director, only if `ticket` is current
    /// and `c` still holds the block that was filled.
    pub fn mark_ready(&self, c: CacheBlock, ticket: FillTicket) {
        debug_assert!(self.is_current(c, ticket));
        self.state[c.index()].fetch_and(!NOT_READY, Ordering::AcqRel);
    }

    /// Takes `c`'s fill lock and waits until no reader has it pinned.
    /// Returns None, holding nothing, when the ticket is stale: the slot
    /// was handed to another block and this fill must write nothing.
    pub fn begin_fill(&self, c: CacheBlock, ticket: FillTicket) -> Option<MutexGuard<'_, ()>> {
        let guard = self.fill[c.index() % FILL_STRIPES].lock();
        if !self.is_current(c, ticket) {
            return None;
        }
        let s = &self.state[c.index()];
        let mut spins = 0u32;
        while s.load(Ordering::Acquire) & PIN_MASK != 0 {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 1024 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        Some(guard)
    }

    /// [`SlotStates::begin_fill`] for a caller that must not wait (a
    /// front end's request thread): None, holding nothing, when the
    /// ticket is stale, another fill holds the lock, or a reader still
    /// has `c` pinned.
    pub fn try_begin_fill(&self, c: CacheBlock, ticket: FillTicket) -> Option<MutexGuard<'_, ()>> {
        let guard = self.fill[c.index() % FILL_STRIPES].try_lock()?;
        let unpinned = self.state[c.index()].load(Ordering::Acquire) & PIN_MASK == 0;
        (self.is_current(c, ticket) && unpinned).then_some(guard)
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.state.len()
    }

    pub fn memory_bytes(&self) -> usize {
        self.state.len() * 4 + FILL_STRIPES
    }
}
