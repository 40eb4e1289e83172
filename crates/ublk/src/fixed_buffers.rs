//! A queue thread's registered buffer table: the buffers its io_uring
//! reads and writes by index (`READ_FIXED`, `WRITE_FIXED`), their pages
//! pinned once when registered instead of on every IO (in the VM lab's
//! profile the per-IO pinning, `gup_fast_fallback` and the bio's page
//! walk, was a tenth of the queue thread's time).
//!
//! The thread's ring has one sparse table ([`BufferTable`]), shared out
//! among the device queues it serves: each queue gets `2 * depth`
//! consecutive indices from `base`. Index `base + t` is tag `t`'s buffer
//! (the request's data: hits and bypassed reads are read into it), or
//! with zero copy (`zero_copy.rs`) the slot where the kernel registers the
//! tag's current request, left empty here; index
//! `base + depth + t` is tag `t`'s scratch buffer (a miss's whole block,
//! read from the backing file and written from there into the cache
//! file), registered when the tag first needs one ([`TagScratch`]).
//!
//! Contract: a registered buffer is only ever read into for a request of
//! its own tag, whose task owns it and waits for each IO's completion;
//! every buffer outlives the IOs on it (the tag buffers live until the
//! queue's indices are cleared, after its tasks have finished; a scratch
//! buffer is replaced in the table before it is freed).

use crate::queue_thread::ThreadCtx;
use crate::ring::QueueRing;
use libublk::helpers::IoBuf;
use std::sync::Arc;

use crate::server::TagSlot;

/// The most indices a ring's table may have (the kernel's limit).
const MOST_INDICES: u32 = 1 << 14;

/// Which indices of a ring's sparse table are free.
pub(crate) struct BufferTable {
    /// Free ranges (start, length), sorted by start, never adjacent.
    free: Vec<(u32, u32)>,
}

impl BufferTable {
    /// Registers a sparse table with `ring`, as large as the kernel takes
    /// (none at all: every queue uses plain reads and writes).
    pub(crate) fn register(ring: &QueueRing) -> BufferTable {
        for size in [MOST_INDICES, 4096, 1024] {
            if ring
                .with_submitter(|s| s.register_buffers_sparse(size))
                .is_ok()
            {
                return BufferTable {
                    free: vec![(0, size)],
                };
            }
        }
        log::info!("ublk queue thread: no registered buffer table; IO uses plain reads");
        BufferTable { free: Vec::new() }
    }

    /// `n` consecutive indices, if free.
    fn take(&mut self, n: u32) -> Option<u32> {
        let k = self.free.iter().position(|&(_, len)| len >= n)?;
        let (start, len) = self.free[k];
        if len == n {
            self.free.remove(k);
        } else {
            self.free[k] = (start + n, len - n);
        }
        Some(start)
    }

    /// Gives back `n` indices from `start`.
    fn give_back(&mut self, start: u32, n: u32) {
        let k = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(k, (start, n));
        if k + 1 < self.free.len() && start + n == self.free[k + 1].0 {
            self.free[k].1 += self.free[k + 1].1;
            self.free.remove(k + 1);
        }
        if k > 0 && self.free[k - 1].0 + self.free[k - 1].1 == start {
            self.free[k - 1].1 += self.free[k].1;
            self.free.remove(k);
        }
    }
}

/// One queue's part of the table.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FixedTable {
    /// Tag 0's index.
    base: u16,
    /// The queue's depth (the scratch buffers' offset from `base`).
    depth: u16,
    /// The tags' indices are the kernel's (zero copy), not their buffers'.
    zero_copy: bool,
}

impl FixedTable {
    /// Tag `tag`'s buffer's index, if the tags' buffers are registered.
    pub(crate) fn tag_index(self, tag: u16) -> Option<u16> {
        (!self.zero_copy).then_some(self.base + tag)
    }

    /// Tag 0's index: with zero copy, where the kernel registers the
    /// queue's requests (tag `t` at this plus `t`).
    pub(crate) fn base(self) -> u16 {
        self.base
    }
}

/// Registers the tags' buffers (index = base + tag), with room for the
/// tags' scratch buffers after them; with `zero_copy`, takes the tags'
/// indices for the kernel's registrations and registers no buffer there.
/// None (plain reads and writes, and no zero copy) if the table is full or
/// the kernel refuses, e.g. over the locked-memory limit of an
/// unprivileged server.
pub(crate) fn register(
    ctx: &ThreadCtx,
    slots: &[Arc<TagSlot>],
    zero_copy: bool,
) -> Option<FixedTable> {
    let depth = u16::try_from(slots.len()).ok()?;
    let base = ctx.buffers.borrow_mut().take(2 * u32::from(depth))?;
    let Ok(base16) = u16::try_from(base) else {
        ctx.buffers
            .borrow_mut()
            .give_back(base, 2 * u32::from(depth));
        return None;
    };
    if zero_copy {
        return Some(FixedTable {
            base: base16,
            depth,
            zero_copy,
        });
    }
    let iovecs: Vec<libc::iovec> = slots.iter().map(|s| iovec_of(&s.buf)).collect();
    // SAFETY: each iovec is a tag's whole buffer, which lives in the
    // queue's slots until its tasks have finished and `unregister` has
    // cleared these indices; the kernel writes into a buffer only for a
    // READ_FIXED that this queue submits for that tag's request, within
    // the request's length.
    let r = ctx
        .ring
        .with_submitter(|s| unsafe { s.register_buffers_update(base, &iovecs, None) });
    match r {
        Ok(_) => Some(FixedTable {
            base: base16,
            depth,
            zero_copy,
        }),
        Err(e) => {
            log::info!("ublk: tag buffers not registered ({e}); IO uses plain reads");
            clear(&ctx.ring, base, 2 * u32::from(depth));
            ctx.buffers
                .borrow_mut()
                .give_back(base, 2 * u32::from(depth));
            None
        }
    }
}

/// What a queue's table holds, for its log line.
pub(crate) fn describe(table: Option<FixedTable>) -> &'static str {
    match table {
        Some(t) if t.zero_copy => {
            "the requests' own pages (zero copy) and the tags' scratch buffers"
        }
        Some(_) => "the tags' and their scratch buffers",
        None => "none",
    }
}

/// Clears the queue's indices and gives them back (every tag task has
/// finished: no IO into its buffers is in flight).
pub(crate) fn unregister(ctx: &ThreadCtx, table: FixedTable) {
    let n = 2 * u32::from(table.depth);
    clear(&ctx.ring, u32::from(table.base), n);
    ctx.buffers.borrow_mut().give_back(u32::from(table.base), n);
}

/// Empties `n` indices from `start` (an empty iovec is an empty slot).
fn clear(ring: &QueueRing, start: u32, n: u32) {
    let empty = vec![
        libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        n as usize
    ];
    // SAFETY: empty slots name no memory.
    if let Err(e) =
        ring.with_submitter(|s| unsafe { s.register_buffers_update(start, &empty, None) })
    {
        log::debug!("ublk: clearing registered buffers: {e}");
    }
}

fn iovec_of(buf: &IoBuf<u8>) -> libc::iovec {
    libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }
}

/// One tag's scratch buffer for misses, made at the first one and
/// registered in the queue's table when the table has room.
pub(crate) struct TagScratch {
    buf: Option<IoBuf<u8>>,
    /// The buffer's index in the table, if registered.
    index: Option<u16>,
    /// Where this tag's scratch buffer goes in the table, if anywhere.
    slot: Option<u16>,
}

impl TagScratch {
    /// For tag `tag` of a queue whose table is `table`.
    pub(crate) fn new(tag: u16, table: Option<FixedTable>) -> Self {
        TagScratch {
            buf: None,
            index: None,
            slot: table.map(|t| t.base + t.depth + tag),
        }
    }

    /// A buffer of at least `need` bytes, aligned to 4096, and its index in
    /// the table (None: use plain reads and writes). Only while no IO on
    /// the previous buffer is in flight (the tag's task waits for each).
    pub(crate) fn get(&mut self, ring: &QueueRing, need: usize) -> (&IoBuf<u8>, Option<u16>) {
        if !self.buf.as_ref().is_some_and(|b| b.len() >= need) {
            let buf = IoBuf::new(need);
            // Registered before the old buffer is freed: the update
            // replaces (and unpins) the old one.
            self.index = self.slot.filter(|&i| {
                // SAFETY: `buf` is kept in `self` until it is replaced here
                // (after this update) or the tag's task ends (no IO in
                // flight, and the queue's indices are cleared after); see
                // the module's contract.
                let r = ring.with_submitter(|s| unsafe {
                    s.register_buffers_update(u32::from(i), &[iovec_of(&buf)], None)
                });
                if let Err(e) = &r {
                    log::debug!("ublk: scratch buffer not registered ({e}); plain IO");
                }
                r.is_ok()
            });
            self.buf = Some(buf);
        }
        (self.buf.as_ref().expect("made above"), self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_ranges_are_taken_and_merged_back() {
        let mut t = BufferTable {
            free: vec![(0, 100)],
        };
        let a = t.take(30).unwrap();
        let b = t.take(30).unwrap();
        let c = t.take(30).unwrap();
        assert_eq!((a, b, c), (0, 30, 60));
        assert_eq!(t.take(20), None);
        t.give_back(b, 30);
        assert_eq!(t.free, vec![(30, 30), (90, 10)]);
        t.give_back(a, 30);
        assert_eq!(t.free, vec![(0, 60), (90, 10)]);
        t.give_back(c, 30);
        assert_eq!(t.free, vec![(0, 100)]);
        assert_eq!(t.take(100), Some(0));
        assert!(t.free.is_empty());
    }
}
