//! The tags' buffers of one device queue: one anonymous mapping of
//! `depth` buffers of `max_io_buf_bytes` each (rounded up to pages), cut
//! into one [`TagBuf`] per tag. The kernel copies a request's data into
//! and out of its tag's buffer, so every tag needs a buffer as large as
//! the largest request, but pages nobody touched cost no RAM. A buffer
//! per tag from the allocator did cost: each 512 KiB allocation touched a
//! page for the allocator's header, about 4 KiB per tag, and 1024 idle
//! volumes over ublk kept 563 MiB resident (measured in the VM lab).
//!
//! Contract: the mapping lives as long as any of its [`TagBuf`]s (each
//! holds it); a [`TagBuf`]'s bytes are only touched by its tag's request
//! (see `server.rs`: the tag's task, the worker running its request, or
//! the kernel, one at a time).

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

/// One queue's mapping.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this struct; who may touch
// which bytes is the `TagBuf` contract above, not thread affinity.
unsafe impl Send for Mapping {}
// SAFETY: as above; `Mapping` itself is never written through `&self`.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are the mapping made in `tag_buffers`,
        // and no `TagBuf` (which holds this) is left to use it.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// One tag's buffer: `len` bytes of its queue's mapping, page-aligned.
pub(crate) struct TagBuf {
    mapping: Arc<Mapping>,
    offset: usize,
    len: usize,
}

impl TagBuf {
    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        // SAFETY: `offset + len <= mapping.len` (`tag_buffers`).
        unsafe { self.mapping.base.as_ptr().add(self.offset) }
    }

    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.as_mut_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

/// `depth` buffers of `each` bytes (at least one page), each page-aligned,
/// in one mapping that touches no page and takes no huge pages (a 2 MiB
/// page faulted in for one tag's 4 KiB read would hold four tags' worth of
/// memory).
pub(crate) fn tag_buffers(depth: u16, each: usize) -> io::Result<Vec<TagBuf>> {
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
        .unwrap_or(4096)
        .max(1);
    let stride = each.max(1).div_ceil(page) * page;
    let len = stride
        .checked_mul(usize::from(depth).max(1))
        .ok_or_else(|| io::Error::other("tag buffers too large"))?;
    // SAFETY: a new private anonymous mapping; no existing memory is named.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mapping = Arc::new(Mapping {
        base: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave address 0"))?,
        len,
    });
    // SAFETY: advice on the mapping just made; failure only leaves huge
    // pages allowed.
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    Ok((0..usize::from(depth))
        .map(|t| TagBuf {
            mapping: mapping.clone(),
            offset: t * stride,
            len: each,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `len` bytes from `p` that are in RAM (`mincore`).
    fn resident_pages(p: *const u8, len: usize) -> usize {
        let pages = len.div_ceil(4096);
        let mut v = vec![0u8; pages];
        // SAFETY: `p..p + len` is mapped (a test's tag buffers), and `v`
        // has a byte per page.
        let r = unsafe { libc::mincore(p as *mut libc::c_void, len, v.as_mut_ptr()) };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        v.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn buffers_are_aligned_apart_and_cost_nothing_until_touched() {
        let bufs = tag_buffers(64, 512 << 10).unwrap();
        let all = 64 * (512 << 10);
        assert_eq!(
            resident_pages(bufs[0].as_ptr(), all),
            0,
            "untouched buffers in RAM"
        );
        for (t, b) in bufs.iter().enumerate() {
            assert_eq!(b.len(), 512 << 10);
            assert_eq!(b.as_ptr() as usize % 4096, 0);
            if t > 0 {
                assert_eq!(
                    b.as_ptr() as usize - bufs[t - 1].as_ptr() as usize,
                    512 << 10
                );
            }
        }
        // A 4 KiB read into tag 5's buffer brings in that page alone (no
        // huge page around it).
        // SAFETY: the buffer is ours and at least 4096 bytes long.
        unsafe { std::ptr::write_bytes(bufs[5].as_mut_ptr(), 5, 4096) };
        assert_eq!(resident_pages(bufs[0].as_ptr(), all), 1);
        // Each buffer is writable over its whole length, and its own.
        for (t, b) in bufs.iter().enumerate() {
            // SAFETY: the buffer is ours and `len` bytes long.
            unsafe { std::ptr::write_bytes(b.as_mut_ptr(), t as u8, b.len()) };
        }
        for (t, b) in bufs.iter().enumerate() {
            // SAFETY: as above.
            let s = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len()) };
            assert!(s.iter().all(|&x| x == t as u8), "tag {t}");
        }
    }

    #[test]
    fn odd_sizes_round_up_to_pages() {
        let bufs = tag_buffers(3, 5000).unwrap();
        assert_eq!(bufs[1].as_ptr() as usize - bufs[0].as_ptr() as usize, 8192);
        assert_eq!(bufs[2].len(), 5000);
    }
}
