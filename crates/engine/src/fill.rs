//! Filling a cache slot (a promotion or a write's allocation) and ending
//! the fill: the slot becomes ready and its claim is recorded, or the
//! promotion is undone.

use crate::claims;
use crate::slot_state::FillTicket;
use crate::volume::Volume;
use crate::Engine;
use tiercache_types::CacheBlock;

impl Engine {
    /// Finishes the fill of slot `c` for block `b`: ready if the ticket is
    /// current, the slot still holds `b` and the fill worked; the promotion
    /// is undone if it failed. A stale ticket changes nothing.
    /// `crc` is the crc32c of the data written (`None`: the fill failed).
    pub(crate) fn end_fill(
        &self,
        vol: &Volume,
        b: u64,
        c: CacheBlock,
        ticket: FillTicket,
        crc: Option<u32>,
    ) {
        let mut d = self.director.lock();
        if self.slots.is_current(c, ticket) && d.lookup(vol.key(b)) == Some(c) {
            if let Some(crc) = crc {
                self.slots.mark_ready(c, ticket);
                if d.is_dirty(vol.key(b)) {
                    let e = self.dirty_entry(&d, vol.key(b));
                    self.record(c, Some(e));
                } else {
                    // Nothing wrote the slot since it was handed over (the
                    // fill's generation bump): its generation is the fill's.
                    let gen = claims::generation(self.claims.load(c));
                    self.record_clean_claim(&d, vol.key(b), c, gen, crc);
                }
            } else {
                d.abort_promotion(vol.key(b));
            }
        }
    }

    /// Fills slot `c` with `data` for block `b`, then ends the fill.
    /// Returns the cache device's error, if any (already counted).
    pub(crate) fn fill(
        &self,
        vol: &Volume,
        b: u64,
        c: CacheBlock,
        ticket: FillTicket,
        data: &[u8],
    ) -> std::io::Result<()> {
        let Some(_guard) = self.slots.begin_fill(c, ticket) else {
            // The block was evicted before its fill began: nothing to do.
            return Ok(());
        };
        let r = self.cache.write_at(data, self.slot_offset(c));
        if let Err(e) = &r {
            self.cache_error(e, true);
        }
        let crc = match (&r, self.persist.is_some()) {
            (Ok(()), true) => Some(crc32c::crc32c(data)),
            (Ok(()), false) => Some(0),
            (Err(_), _) => None,
        };
        self.end_fill(vol, b, c, ticket, crc);
        r
    }
}
