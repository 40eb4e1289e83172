//! S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
//! SOSP 2023), following libCacheSim's `cache/eviction/S3FIFO.c` (the
//! version bundled by the `libcachesim` Python package, 0.3.x) step by step
//! so that miss counts on read-only traces match it exactly.
//!
//! - A small FIFO (`floor(0.1 * capacity)` blocks), a main FIFO (the rest)
//!   and a ghost FIFO of `floor(0.9 * capacity)` origin blocks that were
//!   evicted from the small FIFO.
//! - Each resident block has a 2-bit access frequency (saturating at 3;
//!   libCacheSim counts without bound but only ever compares with 1, 2 and
//!   `min(freq, 3)`, so the result is the same). A hit only increments it
//!   (lazy promotion: no list is touched on a hit).
//! - A miss that hits the ghost enters the main FIFO. Otherwise it enters
//!   the small FIFO, except that before the first eviction a new block goes
//!   to main once the small FIFO is full (libCacheSim's `has_evicted`).
//! - Eviction (one block per insertion into a full cache): from main if main
//!   holds more than its share or small is empty, else from small.
//!   Small: the oldest block moves to main (frequency reset to 0) if it was
//!   hit at least twice (`move-to-main-threshold=2`), else it is evicted
//!   and remembered in the ghost; repeat until one is evicted. Main: the
//!   oldest block is reinserted at the tail with `min(freq, 3) - 1` if it
//!   was hit, else evicted; repeat until one is evicted.
//!
//! Deliberate differences from libCacheSim (none shows on read-only traces
//! with capacity >= 20 blocks and the `always` admission):
//! - **Dirty blocks** leave their FIFO for a separate dirty list, so the
//!   eviction loops above never meet them (no skipping, no risk of looping
//!   forever in a queue that is all dirty). They still count towards the
//!   main FIFO's share. Cost: a block loses its FIFO position while dirty;
//!   when cleaned it re-enters at the tail of the main FIFO with the
//!   frequency it had, i.e. it gets one more full trip through main.
//! - libCacheSim refuses to insert (outside the ghost path) when the small
//!   FIFO holds fewer than 2 objects (capacity < 20); here the small FIFO is
//!   at least 1 block and every insertion succeeds, as the
//!   [`Replacement`] contract requires.
//! - libCacheSim removes a block from the ghost as soon as it misses; here
//!   that happens in [`Replacement::insert`], so a miss that admission
//!   rejects leaves the ghost entry in place.
//! - `remove` (invalidation) of a resident block does not touch the ghost;
//!   a block cannot be both resident and in the ghost.
//!
//! Memory per cache block: the [`SlotTable`] (~21.0 B: three lists), 2
//! frequency bits, and the ghost of `0.9 * capacity` entries.
//! [`S3Fifo::new`] keeps it exactly (origin block ids, for exact ghost hits
//! and exact agreement with libCacheSim) in a second [`SlotTable`]: ~18.9 B,
//! ~40.1 B in all. [`S3Fifo::compact`] keeps it in a [`CompactGhost`]
//! (11-bit fingerprints with 5-bit generations, ~2.7 B per entry): ~2.4 B,
//! ~23.6 B in all, at the price of false ghost hits on ~1.2% of misses and
//! a lifetime of 0.96 to 1.04 times `0.9 * capacity` ghost insertions, a
//! ghost hit lengthening no other entry's ([`GhostLifetime::Insertions`]);
//! [`S3Fifo::compact_sparse`] (the adaptive policy's minis) holds about
//! `0.9 * capacity` entries instead, a ghost hit keeping the older entries
//! one insertion longer as in the exact FIFO ([`GhostLifetime::Entries`];
//! see [`crate::ghost`]).

use crate::demotion::Demotion;
use crate::ghost::{CompactGhost, GhostLifetime};
use crate::slots::SlotTable;
use crate::{Insertion, Replacement};
use tiercache_types::{Access, CacheBlock, OriginBlock, ReplacementKind, Time};

const SMALL: u8 = 0;
const MAIN: u8 = 1;
/// Dirty blocks, whichever FIFO they came from.
const DIRTY: u8 = 2;
/// The single list of the ghost table.
const GHOST: u8 = 0;

/// Share of the cache for the small FIFO (libCacheSim `small-size-ratio`).
pub const SMALL_RATIO: f64 = 0.10;
/// Ghost entries per cache block (libCacheSim `ghost-size-ratio`).
pub const GHOST_RATIO: f64 = 0.90;
/// Hits in the small FIFO needed to move to main
/// (libCacheSim `move-to-main-threshold`).
pub const MOVE_TO_MAIN_THRESHOLD: u8 = 2;
/// How far `peek_victim` looks into a FIFO before settling for the best
/// candidate seen (it must stay cheap: it runs on every miss).
const PEEK_SCAN: usize = 32;

/// The ghost FIFO of blocks evicted from the small FIFO.
#[derive(Clone)]
enum Ghost {
    /// Origin ids in a slot table of one list (libCacheSim's ghost).
    Exact(SlotTable),
    /// Fingerprints, approximately FIFO.
    Compact(CompactGhost),
}

impl Ghost {
    fn contains(&self, o: OriginBlock) -> bool {
        match self {
            Ghost::Exact(t) => t.lookup(o).is_some(),
            Ghost::Compact(g) => g.contains(o),
        }
    }

    /// Forgets `o`; returns whether it was there.
    fn remove(&mut self, o: OriginBlock) -> bool {
        match self {
            Ghost::Exact(t) => t.remove(o).is_some(),
            Ghost::Compact(g) => g.remove(o),
        }
    }

    /// Remembers `o`, forgetting the oldest entry if full
    /// (libCacheSim `ghost_fifo->get`: a block already there keeps its place).
    fn add(&mut self, o: OriginBlock) {
        match self {
            Ghost::Exact(t) => {
                if t.capacity() == 0 || t.lookup(o).is_some() {
                    return;
                }
                if t.is_full() {
                    let oldest = t.front(GHOST).expect("full ghost");
                    let old = t.oblock_of(oldest).expect("mapped");
                    t.remove(old);
                }
                t.insert(o, GHOST);
            }
            Ghost::Compact(g) => g.insert(o),
        }
    }

    fn memory_bytes(&self) -> usize {
        match self {
            Ghost::Exact(t) => t.memory_bytes(),
            Ghost::Compact(g) => g.memory_bytes(),
        }
    }
}

/// The S3-FIFO replacement policy. See the module documentation.
#[derive(Clone)]
pub struct S3Fifo {
    slots: SlotTable,
    /// 2 bits per slot.
    freq: Vec<u64>,
    ghost: Ghost,
    small_size: u32,
    main_size: u32,
    /// The small FIFO's share, as last set.
    small_ratio: f64,
    /// Blocks the cache holds at most (its capacity unless
    /// [`S3Fifo::set_limit`] said fewer).
    limit: u32,
    /// Hits in the small FIFO needed to move to main
    /// ([`MOVE_TO_MAIN_THRESHOLD`] unless set otherwise).
    move_threshold: u8,
    has_evicted: bool,
    /// Whether a small FIFO that stood still through a whole turn of main
    /// is emptied first ([`S3Fifo::set_stale_small_eviction`]).
    stale_small_eviction: bool,
    /// Blocks evicted from main since a block last left the small FIFO's
    /// front.
    main_evictions_since_small_moved: u32,
    /// Blocks inserted into the small FIFO since then and still in it
    /// (approximate: a block leaving small's middle, made dirty or
    /// removed, is taken to be one of these).
    small_newcomers: u32,
    /// Blocks at the small FIFO's front found stale, evicted before any
    /// other.
    stale_small: u32,
    /// Main's recently hit blocks demoted to small when main shrinks (off
    /// unless [`S3Fifo::set_demote_on_shrink`]).
    demotion: Demotion,
    /// Hits on blocks in main, dirty ones included, since the cache was
    /// made ([`S3Fifo::main_hits`]).
    main_hits: u64,
}

impl S3Fifo {
    pub fn new(capacity: u32) -> Self {
        S3Fifo::with_small_ratio(capacity, SMALL_RATIO)
    }

    /// S3-FIFO whose small FIFO takes `ratio` (0..1) of the cache.
    pub fn with_small_ratio(capacity: u32, ratio: f64) -> Self {
        let ghost_size = (capacity as f64 * GHOST_RATIO) as u32;
        S3Fifo::with_ghost(
            SlotTable::new(capacity, 3),
            ratio,
            Ghost::Exact(SlotTable::new(ghost_size, 1)),
        )
    }

    /// S3-FIFO whose small FIFO takes `ratio` (0..1) of the cache, with the
    /// compact ghost ([`CompactGhost`], ~2 B instead of ~20 B per entry),
    /// each entry remembered for the ghost's length in insertions
    /// ([`GhostLifetime::Insertions`]): no longer exactly libCacheSim's
    /// S3-FIFO (see the module documentation). [`crate::Adaptive`]'s live
    /// cache runs this one.
    pub fn compact(capacity: u32, ratio: f64) -> Self {
        S3Fifo::with_compact_ghost(
            SlotTable::new(capacity, 3),
            ratio,
            GhostLifetime::Insertions,
        )
    }

    /// [`S3Fifo::compact`] with a [`SlotTable::sparse`] index (faster
    /// lookups, 3.4 bytes more per block) and a ghost that holds its length
    /// in entries, as S3-FIFO's own FIFO does ([`GhostLifetime::Entries`]).
    /// For [`crate::Adaptive`]'s mini-caches, whose size is bounded (why
    /// their ghosts count entries: `adaptive.rs`).
    pub fn compact_sparse(capacity: u32, ratio: f64) -> Self {
        S3Fifo::with_compact_ghost(
            SlotTable::sparse(capacity, 3),
            ratio,
            GhostLifetime::Entries,
        )
    }

    fn with_compact_ghost(slots: SlotTable, ratio: f64, lifetime: GhostLifetime) -> Self {
        let ghost_size = (slots.capacity() as f64 * GHOST_RATIO) as u32;
        S3Fifo::with_ghost(
            slots,
            ratio,
            Ghost::Compact(CompactGhost::new(ghost_size, lifetime)),
        )
    }

    fn with_ghost(slots: SlotTable, ratio: f64, ghost: Ghost) -> Self {
        let capacity = slots.capacity();
        let mut p = S3Fifo {
            slots,
            freq: vec![0; (capacity as usize).div_ceil(32)],
            ghost,
            small_size: 0,
            main_size: 0,
            small_ratio: ratio,
            limit: capacity,
            move_threshold: MOVE_TO_MAIN_THRESHOLD,
            has_evicted: false,
            stale_small_eviction: false,
            main_evictions_since_small_moved: 0,
            small_newcomers: 0,
            stale_small: 0,
            demotion: Demotion::default(),
            main_hits: 0,
        };
        p.set_small_ratio(ratio);
        p
    }

    /// A miss of `oblock` that is not filled, taken as a pass through the
    /// small FIFO unhit: `oblock` enters the ghost (so its next miss while
    /// remembered enters main), and true. False, changing nothing, when
    /// the ghost holds it already: the miss should be filled (into main).
    pub fn remember_unfilled(&mut self, oblock: OriginBlock) -> bool {
        if self.ghost.contains(oblock) {
            return false;
        }
        self.ghost.add(oblock);
        true
    }

    /// Gives the small FIFO `ratio` (0..1) of the cache from now on. Nothing
    /// moves at once: evictions come from whichever FIFO is over its share
    /// until both fit (the knob [`crate::Adaptive`] turns).
    pub fn set_small_ratio(&mut self, ratio: f64) {
        let changed = ratio != self.small_ratio;
        self.small_ratio = ratio;
        let capacity = self.limit;
        self.small_size = ((capacity as f64 * ratio.clamp(0.0, 1.0)) as u32).max(1);
        self.main_size = capacity - self.small_size.min(capacity);
        if changed {
            let excess = self.main_len().saturating_sub(self.main_size);
            self.demotion.main_shrank(excess);
        }
    }

    /// When a new small share shrinks main, main's victims hit in the
    /// hand's lap before their last go to the small FIFO's back instead of
    /// leaving, and leave from there without entering the ghost if not hit
    /// enough ([`crate::demotion`]). Off by default (the plain policy
    /// matches libCacheSim exactly); [`crate::Adaptive`] turns it on. Two
    /// bits per slot.
    pub fn set_demote_on_shrink(&mut self, on: bool) {
        if on {
            self.demotion.enable(self.slots.capacity());
        } else {
            self.demotion = Demotion::default();
        }
    }

    /// While `paused`, a smaller main share evicts as without demotion.
    pub fn pause_demotion(&mut self, paused: bool) {
        self.demotion.pause(paused);
    }

    /// A hit on resident `c`: its frequency, and its demotion mark if in
    /// main.
    fn hit(&mut self, c: CacheBlock) {
        let f = self.freq(c);
        self.set_freq(c, f.saturating_add(1));
        let list = self.slots.list_of(c);
        if list != SMALL {
            self.main_hits += 1;
        }
        if self.demotion.enabled() && list == MAIN {
            self.demotion.hit_in_main(c);
        }
    }

    /// Hits on blocks in main (dirty ones included) since the cache was
    /// made: with [`S3Fifo::main_len`], what main's blocks earn (the
    /// adaptive policy's step trial reads it).
    pub fn main_hits(&self) -> u64 {
        self.main_hits
    }

    /// Holds at most `blocks` (1 to the capacity) from now on, the FIFOs'
    /// shares scaled to it; a cache above it evicts down to it at its next
    /// insertion. [`crate::Adaptive`]'s mini-caches follow the live cache's
    /// own share of sampled blocks this way.
    pub fn set_limit(&mut self, blocks: u32) {
        self.limit = blocks.clamp(1, self.slots.capacity().max(1));
        self.set_small_ratio(self.small_ratio);
    }

    /// Whether an insertion must evict first.
    fn full(&self) -> bool {
        self.slots.len() >= self.limit
    }

    /// Moves a block from the small FIFO to main when it was hit at least
    /// `hits` times there (1..=3) instead of [`MOVE_TO_MAIN_THRESHOLD`],
    /// from the next eviction on (the second knob [`crate::Adaptive`] turns).
    pub fn set_move_threshold(&mut self, hits: u8) {
        self.move_threshold = hits.clamp(1, 3);
    }

    /// Evicts the small FIFO's blocks first once it has stood still while
    /// main turned over completely (`main_size` evictions from main and no
    /// block leaving small's front), as many as were in small before that
    /// turn began. Such blocks have outlived every block of main without
    /// earning their move; plain S3-FIFO keeps them as long as main stays
    /// over its share, which it does when the new blocks reach main
    /// without passing through small (ghost hits, or written blocks that
    /// rejoin main once cleaned): a cache full of stale blocks then keeps
    /// its small FIFO's share of them indefinitely. Off by default (the
    /// plain policy matches libCacheSim exactly); [`crate::Adaptive`] turns
    /// it on.
    pub fn set_stale_small_eviction(&mut self, on: bool) {
        self.stale_small_eviction = on;
    }

    /// A block left the small FIFO's front (moved to main or evicted).
    fn small_front_left(&mut self) {
        self.stale_small = self.stale_small.saturating_sub(1);
        self.main_evictions_since_small_moved = 0;
        self.small_newcomers = 0;
    }

    /// A block left the small FIFO elsewhere than at its front.
    fn small_middle_left(&mut self) {
        self.small_newcomers = self.small_newcomers.saturating_sub(1);
    }

    /// Counts one eviction from main, and marks the small FIFO's older
    /// blocks stale when main has turned over with small standing still.
    fn main_evicted(&mut self) {
        if !self.stale_small_eviction {
            return;
        }
        self.main_evictions_since_small_moved += 1;
        if self.stale_small == 0 && self.main_evictions_since_small_moved >= self.main_size.max(1) {
            self.stale_small = self
                .slots
                .list_len(SMALL)
                .saturating_sub(self.small_newcomers);
            self.main_evictions_since_small_moved = 0;
            self.small_newcomers = 0;
        }
    }

    /// Whether the next eviction takes the small FIFO's stale blocks.
    fn evict_stale_small(&self) -> bool {
        self.stale_small > 0 && self.slots.list_len(SMALL) > 0
    }

    fn freq(&self, c: CacheBlock) -> u8 {
        ((self.freq[c.index() / 32] >> (2 * (c.0 % 32))) & 3) as u8
    }

    fn set_freq(&mut self, c: CacheBlock, f: u8) {
        let shift = 2 * (c.0 % 32);
        let w = &mut self.freq[c.index() / 32];
        *w = (*w & !(3 << shift)) | ((f.min(3) as u64) << shift);
    }

    /// Blocks counted against the main FIFO's share (dirty ones included).
    pub fn main_len(&self) -> u32 {
        self.slots.list_len(MAIN) + self.slots.list_len(DIRTY)
    }

    /// Whether the next eviction starts in main (libCacheSim `S3FIFO_evict`).
    fn evict_from_main(&self) -> bool {
        self.main_len() > self.main_size || self.slots.list_len(SMALL) == 0
    }

    /// Evicts one block from the small FIFO, moving hot ones to main.
    /// Returns None if the small FIFO ran empty first.
    fn evict_small(&mut self) -> Option<OriginBlock> {
        while let Some(c) = self.slots.front(SMALL) {
            let o = self.slots.oblock_of(c).expect("listed slot is mapped");
            self.small_front_left();
            // A block moving to main or leaving is no longer a demoted one.
            let demoted = self.demotion.clear(c);
            if self.freq(c) >= self.move_threshold {
                self.set_freq(c, 0);
                self.slots.move_to_back(c, MAIN);
            } else {
                self.slots.remove(o);
                if !demoted {
                    self.ghost.add(o);
                }
                return Some(o);
            }
        }
        None
    }

    /// Evicts one block from the main FIFO (2-bit CLOCK), or, while main
    /// gives up a shrunk share's excess, demotes a victim hit in the lap
    /// before its last to the small FIFO and evicts from there instead. Returns None only if
    /// main holds no clean block (or, after a demotion, small none).
    fn evict_main(&mut self) -> Option<OriginBlock> {
        while let Some(c) = self.slots.front(MAIN) {
            let f = self.freq(c);
            if f >= 1 {
                self.set_freq(c, f.min(3) - 1);
                self.demotion.lap(c);
                self.slots.move_to_back(c, MAIN);
            } else if self.demotion.demote(c) {
                // The mark now says "demoted": the block is small's newest.
                self.slots.move_to_back(c, SMALL);
                self.small_newcomers += 1;
                return self.evict_small();
            } else {
                self.demotion.clear(c);
                let o = self.slots.oblock_of(c).expect("listed slot is mapped");
                self.slots.remove(o);
                self.main_evicted();
                return Some(o);
            }
        }
        None
    }

    /// One eviction, as libCacheSim's `S3FIFO_evict` (called when full).
    /// Returns None only if no clean block is resident.
    fn evict(&mut self) -> Option<OriginBlock> {
        self.has_evicted = true;
        let first = if self.evict_stale_small() {
            self.evict_small()
        } else if self.evict_from_main() {
            self.evict_main()
        } else {
            self.evict_small()
        };
        // Main may hold no clean block (its share all dirty), and small may
        // empty itself into main without evicting (all its blocks hot; then
        // libCacheSim calls evict again, which finds small empty and evicts
        // from main). One more round of each always finds a clean block if
        // there is one: whatever small held is in main by then.
        first
            .or_else(|| self.evict_small())
            .or_else(|| self.evict_main())
    }

    /// One read of `o` as a cache simulation sees it, with a single index
    /// probe: a hit bumps the frequency, a miss inserts. Returns whether it
    /// hit. The same as `lookup` then `touch` or `insert` (the
    /// mini-caches of [`crate::Adaptive`] run this).
    pub fn access(&mut self, o: OriginBlock, now: Time) -> bool {
        self.reference(o, true, now)
    }

    /// [`S3Fifo::access`] of a reference whose miss may fill nothing (a
    /// write of part of a block, a bypassed read): then a miss changes
    /// nothing.
    pub fn reference(&mut self, o: OriginBlock, fills_on_miss: bool, now: Time) -> bool {
        if let Some(c) = self.slots.lookup(o) {
            self.hit(c);
            true
        } else {
            if fills_on_miss {
                self.insert(o, now);
            }
            false
        }
    }

    /// The first block in `list` order, among the first `PEEK_SCAN`, with
    /// the lowest `key`; stops at the first with key 0.
    fn scan_min(&self, list: u8, key: impl Fn(u8) -> u8) -> Option<CacheBlock> {
        let mut best: Option<(u8, CacheBlock)> = None;
        let mut cur = self.slots.front(list);
        for _ in 0..PEEK_SCAN {
            let Some(c) = cur else { break };
            let k = key(self.freq(c));
            if !matches!(best, Some((bk, _)) if bk <= k) {
                best = Some((k, c));
                if k == 0 {
                    break;
                }
            }
            cur = self.slots.next_of(c);
        }
        best.map(|(_, c)| c)
    }
}

impl Replacement for S3Fifo {
    fn kind(&self) -> ReplacementKind {
        ReplacementKind::S3Fifo
    }
    fn slots(&self) -> &SlotTable {
        &self.slots
    }

    fn touch(&mut self, oblock: OriginBlock, _access: Access, _now: Time) {
        if let Some(c) = self.slots.lookup(oblock) {
            self.hit(c);
        }
    }

    fn touch_at(&mut self, oblock: OriginBlock, cblock: CacheBlock, _access: Access, _now: Time) {
        debug_assert_eq!(
            self.slots.lookup(oblock),
            Some(cblock),
            "{oblock} is not in {cblock}"
        );
        self.hit(cblock);
    }

    fn insert(&mut self, oblock: OriginBlock, _now: Time) -> Option<Insertion> {
        if self.full() && self.slots.dirty_count() == self.slots.len() {
            return None;
        }
        // libCacheSim looks the block up (and drops it from the ghost)
        // before evicting.
        let hit_on_ghost = self.ghost.remove(oblock);
        let mut evicted = None;
        // Once at most, unless the limit has just dropped.
        while self.full() {
            match self.evict() {
                Some(o) => evicted = Some(o),
                None if evicted.is_some() => break,
                None => panic!("a clean block exists"),
            }
        }
        let list = if hit_on_ghost
            || (!self.has_evicted && self.slots.list_len(SMALL) >= self.small_size)
        {
            MAIN
        } else {
            SMALL
        };
        let cblock = self.slots.insert(oblock, list).expect("a slot is free");
        if list == SMALL {
            self.small_newcomers += 1;
        }
        self.set_freq(cblock, 0);
        self.demotion.clear(cblock);
        Some(Insertion { cblock, evicted })
    }

    fn restore(&mut self, oblock: OriginBlock, cblock: CacheBlock, dirty: bool, hint: u8) -> bool {
        let list = if dirty {
            DIRTY
        } else if hint & 4 != 0 {
            MAIN
        } else {
            SMALL
        };
        if !self.slots.insert_into(oblock, cblock, list) {
            return false;
        }
        self.slots.set_dirty(cblock, dirty);
        self.set_freq(cblock, hint & 3);
        self.demotion.clear(cblock);
        self.ghost.remove(oblock);
        true
    }

    fn remove(&mut self, oblock: OriginBlock) -> Option<CacheBlock> {
        if self
            .slots
            .lookup(oblock)
            .is_some_and(|c| self.slots.list_of(c) == SMALL)
        {
            self.small_middle_left();
        }
        if let Some(c) = self.slots.lookup(oblock) {
            self.demotion.clear(c);
        }
        self.slots.remove(oblock)
    }

    fn set_dirty(&mut self, oblock: OriginBlock, dirty: bool) {
        if let Some(c) = self.slots.lookup(oblock) {
            if self.slots.is_dirty(c) != dirty {
                if self.slots.list_of(c) == SMALL {
                    self.small_middle_left();
                }
                self.slots.set_dirty(c, dirty);
                self.slots.move_to_back(c, if dirty { DIRTY } else { MAIN });
            }
        }
    }

    /// Simulates the eviction loops without moving anything: in small, the
    /// first block hit fewer than twice; in main, the first block with the
    /// lowest frequency. Looks at most 32 blocks deep per FIFO, so the answer
    /// is approximate when the front of a FIFO is all hot, and while main
    /// demotes ([`S3Fifo::set_demote_on_shrink`]) it names main's victim
    /// where small's oldest may leave instead.
    fn peek_victim(&self) -> Option<OriginBlock> {
        if !self.full() || self.slots.dirty_count() == self.slots.len() {
            return None;
        }
        let main = || self.scan_min(MAIN, |f| f);
        let small = || {
            let t = self.move_threshold;
            let cold = self.scan_min(SMALL, |f| u8::from(f >= t));
            match cold {
                Some(c) if self.freq(c) < t => Some(c),
                // Every small block moves to main with frequency 0, behind
                // main's own blocks: main's first unhit block goes, else the
                // first block that came from small.
                _ => main()
                    .filter(|&c| self.freq(c) == 0)
                    .or_else(|| self.slots.front(SMALL)),
            }
        };
        let c = if self.evict_stale_small() {
            small()
        } else if self.evict_from_main() {
            main().or_else(small)
        } else {
            small()
        };
        c.and_then(|c| self.slots.oblock_of(c))
    }

    /// Bit 2: in the main FIFO; bits 0-1: frequency.
    fn hint(&self, oblock: OriginBlock) -> u8 {
        self.slots.lookup(oblock).map_or(0, |c| {
            let main = self.slots.list_of(c) != SMALL;
            (u8::from(main) << 2) | self.freq(c)
        })
    }

    fn memory_bytes(&self) -> usize {
        self.slots.memory_bytes()
            + self.freq.len() * 8
            + self.ghost.memory_bytes()
            + self.demotion.memory_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reference whose miss fills nothing counts a hit on a resident
    /// block as `access` does, and leaves a missing one out.
    #[test]
    fn a_reference_that_fills_nothing_inserts_nothing() {
        let mut s = S3Fifo::compact(8, 0.25);
        assert!(!s.reference(OriginBlock(1), false, Time(0)));
        assert!(s.lookup(OriginBlock(1)).is_none());
        assert!(!s.reference(OriginBlock(1), true, Time(0)));
        assert!(s.reference(OriginBlock(1), false, Time(0)));
        assert_eq!(s.len(), 1);
    }

    use crate::test_access as get;

    #[test]
    fn one_hit_wonders_leave_through_the_small_fifo() {
        let mut p = S3Fifo::new(100); // small 10, main 90
        for o in 0..100 {
            get(&mut p, o);
        }
        // Before the first eviction, blocks past the small FIFO go to main.
        assert_eq!(p.slots.list_len(SMALL), 10);
        assert_eq!(p.slots.list_len(MAIN), 90);
        // A stream of new blocks churns through small only.
        for o in 1000..1100 {
            get(&mut p, o);
        }
        for o in 10..100 {
            assert!(p.lookup(OriginBlock(o)).is_some(), "main block {o} lost");
        }
        // And the evicted ones are in the ghost: a miss there enters main.
        assert!(p.ghost.contains(OriginBlock(1000)));
        get(&mut p, 1000);
        assert_eq!(p.hint(OriginBlock(1000)), 4);
    }

    #[test]
    fn a_limit_below_the_capacity_is_held_and_scales_the_shares() {
        let mut p = S3Fifo::compact(100, 0.1);
        p.set_limit(80);
        assert_eq!((p.small_size, p.main_size), (8, 72));
        for o in 0..200 {
            get(&mut p, o);
        }
        assert_eq!(p.len(), 80);
        // Lowered, the cache evicts down to the limit at its next insertion.
        p.set_limit(50);
        assert_eq!((p.small_size, p.main_size), (5, 45));
        get(&mut p, 1000);
        assert_eq!(p.len(), 50);
        assert!(p.lookup(OriginBlock(1000)).is_some());
        // Raised, it grows to it; never beyond its capacity.
        p.set_limit(1000);
        for o in 2000..2200 {
            get(&mut p, o);
        }
        assert_eq!(p.len(), 100);
    }

    #[test]
    fn twice_hit_small_blocks_move_to_main() {
        let mut p = S3Fifo::new(20); // small 2, main 18
        for o in 0..20 {
            get(&mut p, o);
        }
        get(&mut p, 100); // evicts small's 0 (never hit)
        get(&mut p, 1);
        get(&mut p, 1); // 1 hit twice
        get(&mut p, 101); // small front is 1: moves to main; 100 evicted
        assert!(p.lookup(OriginBlock(1)).is_some());
        assert!(p.lookup(OriginBlock(100)).is_none());
        assert_eq!(p.hint(OriginBlock(1)), 4);
        assert!(p.ghost.contains(OriginBlock(100)));
    }

    #[test]
    fn a_threshold_of_one_moves_blocks_hit_once() {
        let mut p = S3Fifo::new(20); // small 2, main 18
        p.set_move_threshold(1);
        for o in 0..20 {
            get(&mut p, o);
        }
        get(&mut p, 100); // evicts small's 0
        get(&mut p, 100); // 100 hit once
        get(&mut p, 101); // evicts small's 1
        get(&mut p, 102); // small's front is 100: moves to main; 101 evicted
        assert_eq!(p.hint(OriginBlock(100)), 4, "in main, frequency 0");
        assert!(p.lookup(OriginBlock(101)).is_none());
        // With S3-FIFO's two hits, 100 would have been evicted instead.
        let mut q = S3Fifo::new(20);
        for o in (0..20).chain([100, 100, 101, 102]) {
            get(&mut q, o);
        }
        assert!(q.lookup(OriginBlock(100)).is_none());
    }

    #[test]
    fn main_is_a_two_bit_clock() {
        let mut p = S3Fifo::new(20); // small 2, main 18
        for o in 0..20u64 {
            let freq = match o {
                0 => 3,
                1 => 0,
                _ => 1,
            };
            assert!(p.restore(OriginBlock(o), CacheBlock(o as u32), false, 4 | freq));
        }
        // Main is over its share: the first unhit main block goes.
        assert_eq!(p.peek_victim(), Some(OriginBlock(1)));
        let ins = p.insert(OriginBlock(100), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(1)));
        // Still over: one lap takes every frequency down by one, then 2 goes.
        assert_eq!(p.peek_victim(), Some(OriginBlock(2)));
        let ins = p.insert(OriginBlock(101), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(2)));
        assert_eq!(p.hint(OriginBlock(0)), 4 | 1);
        assert_eq!(p.hint(OriginBlock(3)), 4);
        // Main is at its share now: small (100, 101) is next.
        let ins = p.insert(OriginBlock(102), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(100)));
        assert!(p.ghost.contains(OriginBlock(100)));
        assert!(
            !p.ghost.contains(OriginBlock(1)),
            "main evictions leave no ghost"
        );
    }

    /// A smaller main share with demotion on (a step of the adaptive
    /// policy towards recency): main's victims that were hit in main move
    /// to the small FIFO's back, and small evicts its oldest in their
    /// place; there they can earn their way back to main, or leave without
    /// a ghost entry. Unhit victims leave main as before.
    #[test]
    fn a_shrinking_main_demotes_its_hit_blocks_to_the_small_fifo() {
        let mut p = S3Fifo::new(100); // small 10 (0..9), main 90 (10..99)
        p.set_demote_on_shrink(true);
        for o in (0..100).chain(10..100) {
            get(&mut p, o); // every main block hit once
        }
        p.set_small_ratio(0.5); // main must give up 40
        for o in 1000..1005 {
            get(&mut p, o);
        }
        for o in 10..15 {
            assert_eq!(p.hint(OriginBlock(o)), 0, "{o} demoted to small");
        }
        for o in 0..5 {
            assert!(p.lookup(OriginBlock(o)).is_none());
            assert!(
                p.ghost.contains(OriginBlock(o)),
                "small's own leave a ghost"
            );
        }
        assert_eq!(p.slots.list_len(MAIN), 85);
        get(&mut p, 11);
        get(&mut p, 11);
        for o in 1005..1013 {
            get(&mut p, o);
        }
        // 10 reached small's front unhit: gone, and not in the ghost; 11
        // was hit twice there: back in main.
        assert!(p.lookup(OriginBlock(10)).is_none());
        assert!(
            !p.ghost.contains(OriginBlock(10)),
            "no ghost for a demoted block"
        );
        assert_eq!(p.hint(OriginBlock(11)) & 4, 4);
        assert!(p.ghost.contains(OriginBlock(9)));

        // Main blocks never hit in main are evicted, not demoted.
        let mut p = S3Fifo::new(100);
        p.set_demote_on_shrink(true);
        for o in 0..100 {
            get(&mut p, o);
        }
        p.set_small_ratio(0.5);
        let ins = p.insert(OriginBlock(1000), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(10)));
        assert!(!p.ghost.contains(OriginBlock(10)));
        assert_eq!(p.slots.list_len(SMALL), 11);
    }

    /// Off (plain S3-FIFO, libCacheSim's), a smaller main share evicts
    /// main's blocks, hit or not.
    #[test]
    fn without_demotion_a_shrinking_main_evicts() {
        let mut p = S3Fifo::new(100);
        for o in (0..100).chain(10..100) {
            get(&mut p, o);
        }
        p.set_small_ratio(0.5);
        let ins = p.insert(OriginBlock(1000), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(10)));
        assert_eq!(p.slots.list_len(SMALL), 11);
    }

    #[test]
    fn dirty_blocks_are_skipped_and_rejoin_main_when_clean() {
        let mut p = S3Fifo::new(20);
        for o in 0..20 {
            get(&mut p, o);
            p.set_dirty(OriginBlock(o), true);
        }
        assert_eq!(p.insert(OriginBlock(99), Time(0)), None);
        assert_eq!(p.peek_victim(), None);
        p.set_dirty(OriginBlock(5), false);
        assert_eq!(p.peek_victim(), Some(OriginBlock(5)));
        let ins = p.insert(OriginBlock(99), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(5)));
        assert_eq!(p.dirty_len(), 19);
    }

    /// A cache full of blocks read once (stale), then new data written and
    /// cleaned block by block, as a file laid out in writeback mode: returns
    /// how many of the new blocks are resident afterwards.
    fn written_over_stale(p: &mut S3Fifo, new_blocks: u64) -> usize {
        for o in 0..200 {
            get(p, o); // 100 stale blocks resident, the cache has evicted
        }
        for o in 1000..1000 + new_blocks {
            let o = OriginBlock(o);
            p.insert(o, Time(0)).expect("a clean block to evict");
            p.set_dirty(o, true);
            p.set_dirty(o, false);
        }
        (1000..1000 + new_blocks)
            .filter(|&o| p.lookup(OriginBlock(o)).is_some())
            .count()
    }

    #[test]
    fn a_small_fifo_that_stood_still_through_a_turn_of_main_is_emptied_first() {
        // Plain S3-FIFO: the written blocks reach main through the dirty
        // list, main stays over its share and evicts them, and the small
        // FIFO's stale blocks stay (9 of the 100 slots).
        let mut plain = S3Fifo::new(100);
        assert_eq!(written_over_stale(&mut plain, 95), 91);
        // With stale-small eviction, once main has turned over the stale
        // blocks in small go, and all 95 new blocks fit.
        let mut p = S3Fifo::new(100);
        p.set_stale_small_eviction(true);
        assert_eq!(written_over_stale(&mut p, 95), 95);
    }

    #[test]
    fn a_moving_small_fifo_is_never_found_stale() {
        // New blocks churning through small keep its front moving: the
        // rule never fires, so the policy is plain S3-FIFO's.
        let mut plain = S3Fifo::new(100);
        let mut p = S3Fifo::new(100);
        p.set_stale_small_eviction(true);
        let mut x = 12345u64;
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let o = (x >> 33) % 300;
            assert_eq!(get(&mut plain, o), get(&mut p, o));
        }
        assert_eq!(p.stale_small, 0);
    }

    #[test]
    fn hot_small_blocks_behind_an_all_dirty_main_still_make_room() {
        let mut p = S3Fifo::new(20); // small 2, main 18
        for o in 0..19u64 {
            assert!(p.restore(OriginBlock(o), CacheBlock(o as u32), true, 4));
        }
        assert!(p.restore(OriginBlock(19), CacheBlock(19), false, 3));
        // Main is over its share, all dirty; the one small block is hot
        // (freq 3): it moves to main, and is then evicted from main.
        assert_eq!(p.peek_victim(), Some(OriginBlock(19)));
        let ins = p.insert(OriginBlock(99), Time(0)).unwrap();
        assert_eq!(ins.evicted, Some(OriginBlock(19)));
        assert_eq!(p.dirty_len(), 19);
    }

    #[test]
    fn the_compact_ghost_misses_about_as_often_as_the_exact_one() {
        // A skewed stream over 4x the cache: ghost hits matter.
        let run = |p: &mut S3Fifo| {
            let mut x = 11u64;
            let mut misses = 0u64;
            for _ in 0..400_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // Squared uniform: block o has weight ~ 1/sqrt(o).
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                let o = (u * u * 4000.0) as u64;
                misses += u64::from(!get(p, o));
            }
            misses
        };
        let exact = run(&mut S3Fifo::new(1000));
        let mut c = S3Fifo::compact(1000, SMALL_RATIO);
        let compact = run(&mut c);
        assert!(matches!(c.ghost, Ghost::Compact(_)));
        // Within 2%: the compact ghost forgets by age, not by position
        // (a ghost hit lets no other entry stay longer), and its
        // fingerprints are 12 bits.
        assert!(
            compact.abs_diff(exact) * 50 <= exact,
            "compact {compact} exact {exact}"
        );
    }

    #[test]
    fn peek_victim_predicts_insert() {
        let mut p = S3Fifo::new(50);
        let mut x = 7u64;
        let (mut agree, mut evictions) = (0, 0);
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let o = (x >> 33) % 120;
            if p.lookup(OriginBlock(o)).is_some() {
                p.touch(OriginBlock(o), Access::Read, Time(0));
            } else {
                let peek = p.peek_victim();
                let ins = p.insert(OriginBlock(o), Time(0)).unwrap();
                if ins.evicted.is_some() {
                    evictions += 1;
                    agree += usize::from(peek == ins.evicted);
                }
            }
        }
        assert!(agree * 100 >= evictions * 99, "{agree} of {evictions}");
    }
}
