//! [`FixedBufs`]: buffers registered with a connection's hit ring, so that
//! a hit's read of the cache file into one is a `READ_FIXED`: its pages
//! are pinned once, when the ring is made, not on every read (over ublk
//! the same change took a fifth of the queue thread's CPU per IO,
//! docs/BENCHMARKS.md).
//!
//! A registered buffer must keep its memory for as long as it may be read
//! into: the kernel writes into the pages it pinned at registration, so a
//! buffer freed or moved and another at the same address would not get
//! the data. So these buffers never join the connection's spare buffers
//! (which workers grow and drop): a hit takes one ([`FixedBufs::take`]),
//! its reply carries it, and the reply batch gives it back once sent
//! ([`FixedBufs::give_back`]), all on the reader thread. One that comes
//! back moved or resized is dropped, never read into again.

use io_uring::IoUring;
use std::cell::RefCell;
use std::io;
use std::rc::Rc;

/// Buffers registered per connection.
pub(crate) const COUNT: usize = 32;
/// Bytes a registered buffer holds: the largest hit it serves (one 64 KiB
/// cache block; larger hits use the spare buffers) and the room to align
/// the data's start for O_DIRECT ([`crate::hit_ring::ALIGN`]).
pub(crate) const SIZE: usize = (64 << 10) + crate::hit_ring::ALIGN;

/// A handle on a connection's registered buffers (cloned between the hit
/// ring, which takes them, and the reply batch, which gives them back).
#[derive(Clone)]
pub(crate) struct FixedBufs {
    inner: Rc<RefCell<Inner>>,
}

struct Inner {
    /// Buffers not in use, with their index in the ring's table.
    free: Vec<(u16, Vec<u8>)>,
    /// Each index's address and capacity as registered.
    registered: Vec<(usize, usize)>,
}

impl FixedBufs {
    /// Allocates [`COUNT`] buffers of [`SIZE`] bytes and registers them
    /// with `ring` (index = position). Err when the kernel refuses (e.g.
    /// over the locked-memory limit of an unprivileged server): hits then
    /// read into spare buffers.
    pub(crate) fn register(ring: &IoUring) -> io::Result<FixedBufs> {
        let bufs: Vec<Vec<u8>> = (0..COUNT).map(|_| vec![0u8; SIZE]).collect();
        let iovecs: Vec<libc::iovec> = bufs
            .iter()
            .map(|b| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: the buffers outlive the registration: they are only ever
        // dropped while out of the table's use (see the module
        // documentation: a buffer is read into only while taken, at the
        // address and capacity recorded here, and the ring, dropped after
        // every read in flight has completed, ends the registration).
        unsafe { ring.submitter().register_buffers(&iovecs)? };
        let registered = bufs
            .iter()
            .map(|b| (b.as_ptr() as usize, b.capacity()))
            .collect();
        let free = bufs
            .into_iter()
            .enumerate()
            .map(|(i, b)| (i as u16, b))
            .collect();
        Ok(FixedBufs {
            inner: Rc::new(RefCell::new(Inner { free, registered })),
        })
    }

    /// A free buffer for a read of `len` bytes (and its index), if one is
    /// free and large enough.
    pub(crate) fn take(&self, len: usize) -> Option<(u16, Vec<u8>)> {
        if len + crate::hit_ring::ALIGN > SIZE {
            return None;
        }
        self.inner.borrow_mut().free.pop()
    }

    /// Returns buffer `index`, whose reply has been sent (or whose read
    /// failed). Dropped instead if it is not the memory registered.
    pub(crate) fn give_back(&self, index: u16, buf: Vec<u8>) {
        let mut inner = self.inner.borrow_mut();
        let same = inner.registered.get(usize::from(index))
            == Some(&(buf.as_ptr() as usize, buf.capacity()));
        if same {
            inner.free.push((index, buf));
        } else {
            log::error!("registered buffer {index} came back moved; it is not used again");
        }
    }

    /// Buffers free now.
    #[cfg(test)]
    pub(crate) fn free(&self) -> usize {
        self.inner.borrow().free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_go_out_and_come_back_and_a_moved_one_stays_out() {
        let ring = IoUring::new(8).unwrap();
        let bufs = FixedBufs::register(&ring).unwrap();
        assert_eq!(bufs.free(), COUNT);
        assert!(bufs.take(SIZE).is_none(), "no room to align the data");
        let (i, b) = bufs.take(4096).unwrap();
        assert_eq!(b.len(), SIZE);
        assert_eq!(bufs.free(), COUNT - 1);
        bufs.give_back(i, b);
        assert_eq!(bufs.free(), COUNT);
        let (i, mut b) = bufs.take(4096).unwrap();
        b.reserve(2 * SIZE); // moves it
        bufs.give_back(i, b);
        assert_eq!(bufs.free(), COUNT - 1);
    }
}
