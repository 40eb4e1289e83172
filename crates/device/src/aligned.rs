//! Heap buffers aligned for O_DIRECT.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`AlignedBuf`]: enough for O_DIRECT on any device.
pub const BUF_ALIGN: usize = 4096;

/// A zero-initialised byte buffer whose start is aligned to 4096 bytes.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only allow reading the bytes, like &Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (`len` may be 0).
    pub fn new(len: usize) -> Self {
        if len == 0 {
            return AlignedBuf {
                ptr: NonNull::<u8>::dangling(),
                len: 0,
            };
        }
        let layout = Layout::from_size_align(len, BUF_ALIGN).expect("buffer size overflow");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }

    /// An aligned copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut b = AlignedBuf::new(data.len());
        b.copy_from_slice(data);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes (or dangling with len 0) and initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len != 0 {
            let layout = Layout::from_size_align(self.len, BUF_ALIGN).expect("layout");
            // SAFETY: allocated in `new` with this exact layout.
            unsafe { dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        AlignedBuf::from_slice(self)
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

/// Whether a slice is aligned well enough for O_DIRECT.
pub fn is_aligned(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize) % BUF_ALIGN == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [0usize, 1, 512, 4096, 12345] {
            let b = AlignedBuf::new(len);
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            if len > 0 {
                assert!(is_aligned(&b));
            }
        }
    }
}
