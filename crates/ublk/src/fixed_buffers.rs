//! A queue's registered buffer table: the buffers its io_uring reads and
//! writes by index (`READ_FIXED`, `WRITE_FIXED`), their pages pinned once
//! when registered instead of on every IO (in the VM lab's profile the
//! per-IO pinning, `gup_fast_fallback` and the bio's page walk, was a
//! tenth of the queue thread's time).
//!
//! Layout: index `t` is tag `t`'s buffer (the request's data: hits and
//! bypassed reads are read into it); index `depth + t` is tag `t`'s scratch
//! buffer (a miss's whole block, read from the backing file and written
//! from there into the cache file), registered when the tag first needs
//! one ([`TagScratch`]).
//!
//! Contract: a registered buffer is only ever read into for a request of
//! its own tag, whose task owns it and waits for each IO's completion;
//! every buffer outlives the IOs on it (the tag buffers live until the
//! queue's thread unregisters the table, after its tasks have finished; a
//! scratch buffer is replaced in the table before it is freed).

use libublk::helpers::IoBuf;
use libublk::io::UblkQueue;
use std::sync::Arc;

use crate::server::TagSlot;

/// What the queue's table holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FixedTable {
    /// The number of tags (the scratch buffers' first index); None if the
    /// scratch half could not be reserved.
    scratch_base: Option<u16>,
}

/// Registers the tags' buffers with this thread's io_uring (index = tag),
/// with room for the tags' scratch buffers after them. Some if the tags'
/// buffers are registered; None (plain reads and writes) if the kernel
/// refuses, e.g. over the locked-memory limit of an unprivileged server.
pub(crate) fn register(queue: &UblkQueue<'_>, slots: &[Arc<TagSlot>]) -> Option<FixedTable> {
    let iovecs: Vec<libc::iovec> = slots.iter().map(|s| iovec_of(&s.buf)).collect();
    let depth = u16::try_from(slots.len()).ok()?;
    // (The queue is made: the thread's ring is its ring.)
    // SAFETY (both calls): each iovec is a tag's whole buffer, which lives
    // in `slots` until `serve_queue` returns, after it unregisters them;
    // the kernel writes into a buffer only for a READ_FIXED that this
    // queue submits for that tag's request, within the request's length.
    let sparse = libublk::io::with_task_io_ring(|r| {
        let s = r.submitter();
        s.register_buffers_sparse(2 * u32::from(depth))?;
        unsafe { s.register_buffers_update(0, &iovecs, None) }
    });
    if sparse.is_ok() {
        return Some(FixedTable {
            scratch_base: Some(depth),
        });
    }
    let _ = libublk::io::with_task_io_ring(|r| r.submitter().unregister_buffers());
    let registered =
        libublk::io::with_task_io_ring(|r| unsafe { r.submitter().register_buffers(&iovecs) });
    match registered {
        Ok(()) => Some(FixedTable { scratch_base: None }),
        Err(e) => {
            log::info!(
                "ublk queue {}: tag buffers not registered ({e}); IO uses plain reads",
                queue.get_qid()
            );
            None
        }
    }
}

/// What a queue's table holds, for its log line.
pub(crate) fn describe(table: Option<FixedTable>) -> &'static str {
    match table {
        Some(FixedTable {
            scratch_base: Some(_),
        }) => "the tags' and their scratch buffers",
        Some(_) => "the tags'",
        None => "none",
    }
}

/// Unregisters the table (every tag task has finished: no IO into its
/// buffers is in flight).
pub(crate) fn unregister(qid: u16) {
    if let Err(e) = libublk::io::with_task_io_ring(|r| r.submitter().unregister_buffers()) {
        log::debug!("ublk queue {qid}: unregistering the buffers: {e}");
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
            slot: table.and_then(|t| t.scratch_base).map(|base| base + tag),
        }
    }

    /// A buffer of at least `need` bytes, aligned to 4096, and its index in
    /// the table (None: use plain reads and writes). Only while no IO on
    /// the previous buffer is in flight (the tag's task waits for each).
    pub(crate) fn get(&mut self, need: usize) -> (&IoBuf<u8>, Option<u16>) {
        if !self.buf.as_ref().is_some_and(|b| b.len() >= need) {
            let buf = IoBuf::new(need);
            // Registered before the old buffer is freed: the update
            // replaces (and unpins) the old one.
            self.index = self.slot.filter(|&i| {
                // SAFETY: `buf` is kept in `self` until it is replaced here
                // (after this update) or the tag's task ends (no IO in
                // flight); see the module's contract.
                let r = libublk::io::with_task_io_ring(|r| unsafe {
                    r.submitter()
                        .register_buffers_update(u32::from(i), &[iovec_of(&buf)], None)
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
