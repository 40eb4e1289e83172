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
//! Pinned memory follows use, not the number of devices: a tag's buffer
//! (`max_io_buf_bytes`, 512 KiB by default) is registered at the tag's
//! first read through it, and only its first `need` bytes rounded up to a
//! power of two, re-registered longer when a larger read comes
//! ([`TagPinned`]). Registering every tag's whole buffer when a queue
//! started pinned 32 MiB per queue of depth 64 (measured in the VM lab:
//! 512 MiB pinned with 16 idle volumes), so a pool of idle volumes would
//! have held gigabytes; now an idle device pins nothing, and a busy one
//! the tags its clients keep in flight, as large as their requests.
//!
//! Contract: a registered buffer is only ever read into for a request of
//! its own tag, whose task owns it and waits for each IO's completion;
//! every buffer outlives the IOs on it (the tag buffers live until the
//! queue's indices are cleared, after its tasks have finished; a scratch
//! buffer is replaced in the table before it is freed, and a tag buffer's
//! longer registration replaces its shorter one between two requests).

use crate::queue_thread::ThreadCtx;
use crate::ring::QueueRing;
use crate::tag_buffers::TagBuf;
use libublk::helpers::IoBuf;

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

/// Takes the queue's `2 * depth` indices: tag `t`'s buffer at `base + t`
/// (registered by [`TagPinned`] when the tag first reads through it) or,
/// with `zero_copy`, where the kernel registers the tag's requests; tag
/// `t`'s scratch buffer at `base + depth + t` ([`TagScratch`]). None
/// (plain reads and writes, and no zero copy) if the table is full.
pub(crate) fn register(ctx: &ThreadCtx, depth: u16, zero_copy: bool) -> Option<FixedTable> {
    let base = ctx.buffers.borrow_mut().take(2 * u32::from(depth))?;
    let Ok(base16) = u16::try_from(base) else {
        ctx.buffers
            .borrow_mut()
            .give_back(base, 2 * u32::from(depth));
        return None;
    };
    Some(FixedTable {
        base: base16,
        depth,
        zero_copy,
    })
}

/// What a queue's table holds, for its log line.
pub(crate) fn describe(table: Option<FixedTable>) -> &'static str {
    match table {
        Some(t) if t.zero_copy => {
            "the requests' own pages (zero copy) and the tags' scratch buffers"
        }
        Some(_) => "the tags' and their scratch buffers, each as used",
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

/// `len` bytes from `p`.
fn iovec_of(p: *mut u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: p.cast(),
        iov_len: len,
    }
}

/// The smallest part of a tag's buffer registered (a few pages: most
/// reads are 4-64 KiB, and each longer need re-registers once).
const LEAST_PINNED: usize = 16 << 10;

/// One tag's buffer in the table: registered at the tag's first read
/// through it, as far as that read needs (rounded up to a power of two,
/// at least [`LEAST_PINNED`]), and re-registered longer when a larger read
/// comes; a read never needs more than the buffer.
pub(crate) struct TagPinned {
    /// The tag's index in the table; None: plain reads (no table, zero
    /// copy, or the kernel refused a registration).
    slot: Option<u16>,
    /// How many bytes from the buffer's start are registered.
    len: usize,
}

impl TagPinned {
    /// For tag `tag` of a queue whose table is `table`.
    pub(crate) fn new(tag: u16, table: Option<FixedTable>) -> Self {
        TagPinned {
            slot: table.and_then(|t| t.tag_index(tag)),
            len: 0,
        }
    }

    /// The index under which `buf`'s first `need` bytes are registered,
    /// registering them first if they are not; None: read with plain reads.
    /// Only while no IO on the buffer is in flight (the tag's task waits
    /// for each).
    pub(crate) fn index_for(&mut self, ring: &QueueRing, buf: &TagBuf, need: usize) -> Option<u16> {
        let slot = self.slot?;
        if need > buf.len() {
            return None;
        }
        if let Some(len) = registration_len(need, self.len, buf.len()) {
            // SAFETY: `buf` is the tag's buffer, which lives in its slot
            // until the queue's indices are cleared (after every tag task
            // has ended); the update replaces this index's shorter
            // registration of the same buffer while no IO uses it.
            let r = ring.with_submitter(|s| unsafe {
                s.register_buffers_update(u32::from(slot), &[iovec_of(buf.as_mut_ptr(), len)], None)
            });
            if let Err(e) = r {
                log::debug!("ublk: tag buffer not registered ({e}); plain reads");
                self.slot = None;
                return None;
            }
            self.len = len;
        }
        Some(slot)
    }
}

/// How much of a `buf_len`-byte tag buffer to register for a read of
/// `need` bytes when `registered` bytes are: None if they cover it, else
/// `need` rounded up to a power of two, at least [`LEAST_PINNED`], at most
/// the buffer (`need <= buf_len`).
fn registration_len(need: usize, registered: usize, buf_len: usize) -> Option<usize> {
    (need > registered).then(|| need.next_power_of_two().max(LEAST_PINNED).min(buf_len))
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
                    s.register_buffers_update(
                        u32::from(i),
                        &[iovec_of(buf.as_mut_ptr(), buf.len())],
                        None,
                    )
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
    fn a_tag_buffer_is_registered_as_far_as_reads_need() {
        let whole = 512 << 10;
        assert_eq!(registration_len(4096, 0, whole), Some(LEAST_PINNED));
        assert_eq!(registration_len(4096, LEAST_PINNED, whole), None);
        assert_eq!(registration_len(LEAST_PINNED, LEAST_PINNED, whole), None);
        assert_eq!(
            registration_len(20 << 10, LEAST_PINNED, whole),
            Some(32 << 10)
        );
        assert_eq!(registration_len(64 << 10, 32 << 10, whole), Some(64 << 10));
        assert_eq!(registration_len(300 << 10, 64 << 10, whole), Some(whole));
        assert_eq!(registration_len(whole, whole, whole), None);
        // A buffer smaller than the least registration is registered whole.
        assert_eq!(registration_len(4096, 0, 8192), Some(8192));
    }

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
