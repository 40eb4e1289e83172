//! Claiming again the clean blocks that lost their clean claim (written in
//! writethrough since, or restored without a crc; see `claims.rs`), so that
//! they too come back warm after a crash. The cleaner asks for it when the
//! devices idle (`cleaner.rs`).
//!
//! Cost contract: a walk looks at a chunk of slots per hold of the
//! director's lock, not one, and a walk that left nothing unclaimed is not
//! repeated until some slot's claim generation moves
//! ([`Claims::bumps`](crate::claims::Claims::bumps)): an idle server does
//! not keep walking its slots, and a walk takes the lock from the clients
//! a few hundred times per million slots, not a million.

use crate::{claims, Engine, Result};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use tiercache_device::AlignedBuf;
use tiercache_types::{CacheBlock, OriginBlock};

/// Slots looked at under one hold of the director's lock.
const CHUNK: u32 = 256;

/// Where [`Engine::reclaim`] goes on, and whether it has anything to do.
#[derive(Default)]
pub(crate) struct ReclaimWalk {
    /// The slot the next walk starts at.
    cursor: AtomicU32,
    /// 1 + the claims' bump count when a whole walk left no clean block
    /// unclaimed; 0 if none has since the engine started.
    settled_at: AtomicU64,
    /// Walks begun (each looks at up to every slot once).
    walks: AtomicU64,
}

/// What became of one candidate.
enum Outcome {
    Claimed,
    /// Its slot changed meanwhile (a bump, which starts another walk).
    Gone,
    /// Not claimable now (in use, dirty again, unreadable): look again later.
    Later,
}

impl Engine {
    /// Claims, with a crc read from the cache device, up to `max_blocks`
    /// cached clean blocks that have no clean claim. Walks the slots
    /// round-robin from where the last call stopped, at most once around;
    /// returns at once when the last whole walk left nothing to claim and
    /// no slot has changed since. Returns how many blocks it claimed.
    pub fn reclaim(&self, max_blocks: usize) -> Result<usize> {
        if self.persist.is_none() || max_blocks == 0 || self.cache_failure.lock().is_some() {
            return Ok(0);
        }
        // Read before the walk: a bump after this moves the count, one
        // before it shows in the slot's word (see `Claims::bump`).
        let bumps = self.claims.bumps();
        if self.reclaim.settled_at.load(Ordering::SeqCst) == bumps + 1 {
            return Ok(0);
        }
        self.reclaim.walks.fetch_add(1, Ordering::Relaxed);
        let capacity = self.slots.len() as u32;
        let mut cursor = self.reclaim.cursor.load(Ordering::Relaxed) % capacity;
        let mut buf = AlignedBuf::new(self.block_size as usize);
        let mut claimed = 0;
        let mut left = false;
        let mut walked = 0;
        let mut candidates = Vec::with_capacity(CHUNK as usize);
        'walk: while walked < capacity {
            let n = CHUNK.min(capacity - walked);
            candidates.clear();
            {
                let d = self.director.lock();
                for k in 0..n {
                    let c = CacheBlock((cursor + k) % capacity);
                    if self.claims.load(c) & claims::CLAIMED != 0 {
                        continue;
                    }
                    match d.oblock_of(c) {
                        Some(o) if d.is_dirty(o) => left = true,
                        Some(o) => candidates.push((c, o)),
                        None => {}
                    }
                }
            }
            for &(c, o) in &candidates {
                if claimed >= max_blocks {
                    cursor = c.0;
                    left = true;
                    break 'walk;
                }
                match self.claim_again(c, o, &mut buf) {
                    Outcome::Claimed => claimed += 1,
                    Outcome::Gone => {}
                    Outcome::Later => left = true,
                }
            }
            walked += n;
            cursor = (cursor + n) % capacity;
        }
        self.reclaim.cursor.store(cursor, Ordering::Relaxed);
        if !left {
            self.reclaim.settled_at.store(bumps + 1, Ordering::SeqCst);
        }
        Ok(claimed)
    }

    /// Claims clean block `o` in slot `c` with the crc of the slot's
    /// content, if both still hold.
    fn claim_again(&self, c: CacheBlock, o: OriginBlock, buf: &mut AlignedBuf) -> Outcome {
        // Shared stripe lock: no in-place write of the block (those take it
        // exclusively) while its content is read and claimed.
        let _locked = self.locks.shared(o.0..o.0 + 1);
        let gen = {
            let d = self.director.lock();
            if d.lookup(o) != Some(c) {
                return Outcome::Gone;
            }
            if d.is_dirty(o) || !self.slots.try_pin(c) {
                return Outcome::Later;
            }
            claims::generation(self.claims.load(c))
        };
        let Ok(vol) = self.volume(o.volume()) else {
            return Outcome::Gone;
        };
        let (start, end) = vol.block_span(o.block());
        let n = (end - start) as usize;
        let read = self.cache.read_at(&mut buf[..n], self.slot_offset(c));
        self.slots.unpin(c);
        if let Err(e) = read {
            self.cache_error(&e, false);
            return Outcome::Later;
        }
        let crc = crc32c::crc32c(&buf[..n]);
        let d = self.director.lock();
        if d.lookup(o) == Some(c) && !d.is_dirty(o) && self.record_clean_claim(&d, o, c, gen, crc) {
            Outcome::Claimed
        } else {
            Outcome::Gone
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Engine, EngineConfig};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use tiercache_device::{BlockDevice, MemDevice};
    use tiercache_policy::PolicyConfig;
    use tiercache_types::{AdmissionKind, CacheMode, ManualClock, ReplacementKind, Time};

    const BLOCK: u64 = 4096;

    /// A persistent writethrough engine with 64 slots, blocks 0..8 read
    /// (promoted and claimed by their fills).
    fn warm_engine() -> Engine {
        let cfg = EngineConfig {
            mode: CacheMode::WriteThrough,
            block_size: BLOCK as u32,
            sequential_cutoff: 0,
            policy: PolicyConfig {
                replacement: ReplacementKind::Lru,
                admission: AdmissionKind::Always,
                ..PolicyConfig::default()
            },
            ..EngineConfig::default()
        };
        let e = Engine::create(
            Arc::new(MemDevice::new(256 * BLOCK)) as Arc<dyn BlockDevice>,
            Arc::new(MemDevice::new((1 << 20) + 70 * BLOCK)) as Arc<dyn BlockDevice>,
            &cfg,
            Arc::new(ManualClock::new(Time(1))),
            "backing",
            Some(1 << 20),
        )
        .unwrap();
        let mut buf = vec![0u8; BLOCK as usize];
        for b in 0..8 {
            e.read(b * BLOCK, &mut buf).unwrap();
        }
        e.flush().unwrap();
        e
    }

    fn walks(e: &Engine) -> u64 {
        e.reclaim.walks.load(Ordering::Relaxed)
    }

    #[test]
    fn a_walk_that_left_nothing_is_not_repeated_until_a_slot_changes() {
        let e = warm_engine();
        assert_eq!(e.reclaim(100).unwrap(), 0, "the fills claimed their blocks");
        assert_eq!(walks(&e), 1);
        for _ in 0..3 {
            assert_eq!(e.reclaim(100).unwrap(), 0);
        }
        assert_eq!(walks(&e), 1, "nothing changed: no walk");

        // A writethrough write in place takes the block's claim away.
        e.write(2 * BLOCK, &[7u8; BLOCK as usize], false).unwrap();
        assert_eq!(e.reclaim(100).unwrap(), 1, "the written block");
        assert_eq!(walks(&e), 2);
        assert_eq!(e.reclaim(100).unwrap(), 0);
        assert_eq!(walks(&e), 2, "the last walk left nothing");
    }

    #[test]
    fn a_walk_cut_short_by_its_budget_goes_on_next_time() {
        let e = warm_engine();
        for b in [1, 3, 5] {
            e.write(b * BLOCK, &[9u8; BLOCK as usize], false).unwrap();
        }
        assert_eq!(e.reclaim(2).unwrap(), 2);
        assert_eq!(e.reclaim(2).unwrap(), 1, "the third written block");
        assert_eq!(e.reclaim(2).unwrap(), 0);
        let settled = walks(&e);
        assert_eq!(e.reclaim(2).unwrap(), 0);
        assert_eq!(walks(&e), settled);
    }
}
