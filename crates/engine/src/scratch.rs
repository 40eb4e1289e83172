//! A thread's reusable aligned buffer, for the blocks an IO reads whole
//! (a promotion's backing read, a writeback run): a fresh zeroed buffer
//! per IO would cost its allocation, zeroing and page faults every time.

use tiercache_device::AlignedBuf;

/// A buffer this large or smaller is kept for the thread's next use (a
/// writeback run's largest); a larger one is freed.
const MAX_KEPT: usize = 4 << 20;

thread_local! {
    /// The thread's buffer between two uses.
    static RUN_BUF: std::cell::Cell<Option<AlignedBuf>> = const { std::cell::Cell::new(None) };
}

/// The thread's buffer while one IO uses it; back for the thread's next
/// use when dropped (early returns included). Its bytes are whatever the
/// last use left there: read into it before reading from it. A use nested
/// in another on the same thread gets a fresh buffer.
pub(crate) struct RunBuf(Option<AlignedBuf>);

impl RunBuf {
    /// The thread's buffer, grown to at least `len` bytes (deref gives all
    /// of it: slice `..len`).
    pub(crate) fn take(len: usize) -> RunBuf {
        let buf = RUN_BUF
            .with(|b| b.take())
            .filter(|b| b.len() >= len)
            .unwrap_or_else(|| AlignedBuf::new(len));
        RunBuf(Some(buf))
    }
}

impl std::ops::Deref for RunBuf {
    type Target = AlignedBuf;
    fn deref(&self) -> &AlignedBuf {
        self.0.as_ref().expect("present until dropped")
    }
}

impl std::ops::DerefMut for RunBuf {
    fn deref_mut(&mut self) -> &mut AlignedBuf {
        self.0.as_mut().expect("present until dropped")
    }
}

impl Drop for RunBuf {
    fn drop(&mut self) {
        let buf = self.0.take().filter(|b| b.len() <= MAX_KEPT);
        if buf.is_some() {
            RUN_BUF.with(|b| b.set(buf));
        }
    }
}
