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
//!
//! A reply sent by splice ([`crate::splice_out`]) leaves its buffer's
//! pages in the socket until the client has read them, so its buffer is
//! lent ([`FixedBufs::lend`]), not given back: it is free again only once
//! the bytes spliced after it reach the socket's bound on what is unread
//! ([`FixedBufs::take`] asks the socket when none is free).
//! A buffer still lent when the connection ends is never freed: its
//! memory must not serve anything else while a client may still read it.

use crate::splice_out::unread_at_most;
use io_uring::IoUring;
use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
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
    /// Buffers whose replies were spliced into the socket, each with the
    /// bytes spliced up to the end of its batch.
    lent: Vec<(u16, Vec<u8>, u64)>,
    /// Bytes spliced into the socket so far.
    spliced: u64,
    /// The socket lent buffers are in (asked what is unread), while the
    /// connection is served.
    socket: Option<RawFd>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.lent.is_empty() {
            log::debug!(
                "{} spliced buffers may still be read by the client; kept",
                self.lent.len()
            );
        }
        for (_, buf, _) in self.lent.drain(..) {
            std::mem::forget(buf);
        }
    }
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
            inner: Rc::new(RefCell::new(Inner {
                free,
                registered,
                lent: Vec::new(),
                spliced: 0,
                socket: None,
            })),
        })
    }

    /// A free buffer for a read of `len` bytes (and its index), if one is
    /// free and large enough.
    pub(crate) fn take(&self, len: usize) -> Option<(u16, Vec<u8>)> {
        if len + crate::hit_ring::ALIGN > SIZE {
            return None;
        }
        let mut inner = self.inner.borrow_mut();
        if inner.free.is_empty() && !inner.lent.is_empty() {
            inner.reclaim();
        }
        inner.free.pop()
    }

    /// Lends the buffers of a batch of replies just spliced into `socket`
    /// (`bytes` in all, their headers included): see the module
    /// documentation.
    pub(crate) fn lend(
        &self,
        socket: RawFd,
        bytes: u64,
        bufs: impl Iterator<Item = (u16, Vec<u8>)>,
    ) {
        let mut inner = self.inner.borrow_mut();
        inner.socket = Some(socket);
        inner.spliced += bytes;
        let end = inner.spliced;
        inner.lent.extend(bufs.map(|(i, b)| (i, b, end)));
    }

    /// Frees the lent buffers the client has read (all of them once the
    /// socket holds nothing unread).
    #[cfg(test)]
    pub(crate) fn reclaim(&self) {
        self.inner.borrow_mut().reclaim();
    }

    /// The connection is ending: waits up to `patience` for the client to
    /// read what was spliced, and stops asking the socket (it is about to
    /// be closed). What is still lent then is never freed.
    pub(crate) fn settle(&self, patience: std::time::Duration) {
        let until = std::time::Instant::now() + patience;
        loop {
            let mut inner = self.inner.borrow_mut();
            inner.reclaim();
            if inner.lent.is_empty() || std::time::Instant::now() >= until {
                inner.socket = None;
                return;
            }
            drop(inner);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
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

    /// Buffers lent now.
    #[cfg(test)]
    pub(crate) fn lent(&self) -> usize {
        self.inner.borrow().lent.len()
    }

    /// Buffers free now.
    #[cfg(test)]
    pub(crate) fn free(&self) -> usize {
        self.inner.borrow().free.len()
    }
}

impl Inner {
    /// Frees the lent buffers the client has read: a buffer is read once
    /// the bytes spliced after it are at least the socket's bound on what
    /// is unread (so all of them once the socket holds nothing unread).
    fn reclaim(&mut self) {
        let Some(socket) = self.socket else { return };
        let unread = match unread_at_most(socket) {
            Ok(n) => n as u64,
            Err(e) => {
                log::debug!(
                    "cannot ask the socket what is unread ({e}); spliced buffers stay lent"
                );
                return;
            }
        };
        let spliced = self.spliced;
        let mut i = 0;
        while i < self.lent.len() {
            if spliced - self.lent[i].2 >= unread {
                let (index, buf, _) = self.lent.swap_remove(i);
                if self.registered.get(usize::from(index))
                    == Some(&(buf.as_ptr() as usize, buf.capacity()))
                {
                    self.free.push((index, buf));
                } else {
                    log::error!("registered buffer {index} came back moved; it is not used again");
                    std::mem::forget(buf);
                }
            } else {
                i += 1;
            }
        }
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

    #[test]
    fn lent_buffers_come_back_once_the_client_has_read_past_them() {
        use crate::splice_out::SpliceOut;
        use std::io::Read;
        use std::os::fd::AsRawFd;
        use std::os::unix::net::UnixStream;
        let ring = IoUring::new(8).unwrap();
        let bufs = FixedBufs::register(&ring).unwrap();
        let (a, mut b) = UnixStream::pair().unwrap();
        let out = SpliceOut::new().unwrap();
        let mut taken: Vec<(u16, Vec<u8>)> = (0..COUNT).map(|_| bufs.take(4096).unwrap()).collect();
        assert!(bufs.take(4096).is_none());
        // Two batches: the first 2 buffers, then the rest.
        for batch in [
            taken.drain(..2).collect::<Vec<_>>(),
            std::mem::take(&mut taken),
        ] {
            let parts: Vec<&[u8]> = batch.iter().map(|(_, b)| &b[..4096]).collect();
            out.send(a.as_raw_fd(), &parts).unwrap();
            bufs.lend(a.as_raw_fd(), 4096 * parts.len() as u64, batch.into_iter());
        }
        assert_eq!(bufs.lent(), COUNT);
        assert!(bufs.take(4096).is_none(), "nothing read yet");
        let mut sink = vec![0u8; 4096 * COUNT];
        b.read_exact(&mut sink[..4096 * 2]).unwrap();
        bufs.reclaim();
        assert_eq!(
            bufs.free(),
            0,
            "the unread bound counts overhead: the first batch is not past it"
        );
        b.read_exact(&mut sink[4096 * 2..4096 * (COUNT - 1)])
            .unwrap();
        bufs.reclaim();
        assert_eq!(bufs.free(), 2, "the first batch is read, the second not");
        b.read_exact(&mut sink[4096 * (COUNT - 1)..]).unwrap();
        assert!(bufs.take(4096).is_some() && bufs.take(4096).is_some());
        assert_eq!(bufs.lent(), COUNT - 2);
        assert!(bufs.take(4096).is_some(), "take reclaims when none is free");
        assert_eq!(bufs.lent(), 0);
        assert_eq!(bufs.free(), COUNT - 3);
    }
}
