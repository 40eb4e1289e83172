//! A regular file or a block device, with O_DIRECT where the filesystem
//! allows it.
//!
//! IO is plain `pread`/`pwrite` (through [`FileExt`]) on one shared file
//! descriptor, so any number of threads may have IOs in flight at once.

use crate::aligned::{is_aligned, AlignedBuf};
use crate::exclusive::{busy_kind, lock_exclusive, ExclusiveLock};
use crate::{check_range, BlockDevice};
use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// `_IOR(0x12, 114, size_t)`: size of a block device in bytes.
const BLKGETSIZE64: u64 = (2 << 30) | (8 << 16) | (0x12 << 8) | 114;
/// `_IO(0x12, 119)`: discard a byte range of a block device.
const BLKDISCARD: u64 = (0x12 << 8) | 119;

/// Bounce buffers up to this size (the largest cache block) are kept per
/// thread; larger ones are allocated per call.
const MAX_CACHED_BOUNCE: usize = 1 << 20;

/// Chunk size of the zero-writing fallback of `discard`.
const ZERO_CHUNK: usize = 1 << 20;

/// Whether a [`FileDevice`] bypasses the page cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DirectIo {
    /// O_DIRECT when the filesystem supports it, buffered IO otherwise;
    /// [`FileDevice::warning`] then says so.
    #[default]
    Auto,
    /// O_DIRECT, or fail to open.
    Require,
    /// Buffered IO through the page cache.
    Off,
}

/// A [`BlockDevice`] over a regular file or a block device node.
pub struct FileDevice {
    file: File,
    /// Dropped after `file` (fields drop in order), whose closing releases
    /// the kernel lock.
    _lock: ExclusiveLock,
    path: PathBuf,
    size: u64,
    alignment: u64,
    direct: bool,
    block_device: bool,
    warning: Option<String>,
}

impl std::fmt::Debug for FileDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDevice")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("direct", &self.direct)
            .field("block_device", &self.block_device)
            .finish()
    }
}

/// An error that names the path, keeping the original error's kind.
fn path_error(path: &Path, what: &str, e: io::Error) -> io::Error {
    let detail = match e.kind() {
        io::ErrorKind::NotFound => "no such file or device".to_string(),
        io::ErrorKind::PermissionDenied => {
            "permission denied (read and write access is needed)".to_string()
        }
        _ => e.to_string(),
    };
    io::Error::new(e.kind(), format!("{}: {what}: {detail}", path.display()))
}

/// An OS error with what was being done, keeping the original (and so its
/// errno, which NBD sends to clients: ENOSPC stays ENOSPC) as the source.
#[derive(Debug)]
struct WithContext {
    message: String,
    source: io::Error,
}

impl std::fmt::Display for WithContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.message, self.source)
    }
}

impl std::error::Error for WithContext {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

fn invalid(path: &Path, msg: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{}: {msg}", path.display()),
    )
}

impl FileDevice {
    /// Opens an existing regular file or block device for reading and
    /// writing, with O_DIRECT when the filesystem supports it.
    ///
    /// Fails, with a message naming the path, when the path does not exist,
    /// cannot be opened read-write, is neither a regular file nor a block
    /// device, or its size is not a multiple of 512 bytes.
    pub fn open(path: impl AsRef<Path>) -> io::Result<FileDevice> {
        FileDevice::open_with(path, DirectIo::Auto)
    }

    /// As [`FileDevice::open`], choosing how O_DIRECT is used.
    pub fn open_with(path: impl AsRef<Path>, mode: DirectIo) -> io::Result<FileDevice> {
        FileDevice::open_using(path.as_ref(), mode, open_rw)
    }

    /// `open_with`, opening the file through `open_rw(path, direct)` (tests
    /// pass one that refuses O_DIRECT, as some filesystems do).
    fn open_using(
        path: &Path,
        mode: DirectIo,
        open_rw: impl Fn(&Path, bool) -> io::Result<File>,
    ) -> io::Result<FileDevice> {
        let meta = std::fs::metadata(path).map_err(|e| path_error(path, "cannot open", e))?;
        let block_device = meta.file_type().is_block_device();
        if !block_device && !meta.file_type().is_file() {
            return Err(invalid(path, "not a regular file or a block device"));
        }

        let mut warning = None;
        let (file, mut direct) = match mode {
            DirectIo::Off => (open_rw(path, false)?, false),
            DirectIo::Require => match open_rw(path, true) {
                Ok(f) => (f, true),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    return Err(invalid(
                        path,
                        "O_DIRECT is required but the filesystem does not support it",
                    ))
                }
                Err(e) => return Err(e),
            },
            DirectIo::Auto => match open_rw(path, true) {
                Ok(f) => (f, true),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    warning = Some(format!(
                        "{}: the filesystem does not support O_DIRECT; using buffered IO \
                         (reads may be served from the page cache)",
                        path.display()
                    ));
                    (open_rw(path, false)?, false)
                }
                Err(e) => return Err(e),
            },
        };

        let (size, alignment) = if block_device {
            (blk_size(&file, path)?, blk_sector_size(&file).max(512))
        } else {
            (meta.len(), 512)
        };
        if size % alignment != 0 {
            return Err(invalid(
                path,
                format!("size {size} bytes is not a multiple of {alignment} bytes"),
            ));
        }

        let mut file = file;
        // Some filesystems accept O_DIRECT at open but reject 512-byte IO
        // (4K-sector disks): probe once with a one-sector read.
        if direct && size >= alignment {
            let mut probe = AlignedBuf::new(alignment as usize);
            if let Err(e) = file.read_exact_at(&mut probe, 0) {
                if e.raw_os_error() == Some(libc::EINVAL) && mode == DirectIo::Auto {
                    warning = Some(format!(
                        "{}: O_DIRECT rejects {alignment}-byte IO here; using buffered IO",
                        path.display()
                    ));
                    file = open_rw(path, false)?;
                    direct = false;
                } else {
                    return Err(path_error(path, "first read failed", e));
                }
            }
        }

        let lock = lock_exclusive(&file, path)?;
        Ok(FileDevice {
            file,
            _lock: lock,
            path: path.to_path_buf(),
            size,
            alignment,
            direct,
            block_device,
            warning,
        })
    }

    /// Creates a sparse regular file of `size` bytes at `path` (replacing
    /// the contents of any regular file already there) and opens it as
    /// [`FileDevice::open`] does.
    ///
    /// Fails when `size` is not a multiple of 512 or `path` exists and is
    /// not a regular file.
    pub fn create(path: impl AsRef<Path>, size: u64) -> io::Result<FileDevice> {
        let path = path.as_ref();
        if size % 512 != 0 {
            return Err(invalid(
                path,
                format!("size {size} bytes is not a multiple of 512 bytes"),
            ));
        }
        if let Ok(meta) = std::fs::metadata(path) {
            if !meta.file_type().is_file() {
                return Err(invalid(path, "exists and is not a regular file"));
            }
        }
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| path_error(path, "cannot create", e))?;
        f.set_len(size)
            .map_err(|e| path_error(path, "cannot set size", e))?;
        drop(f);
        FileDevice::open(path)
    }

    /// The path this device was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether IO bypasses the page cache (O_DIRECT).
    pub fn direct_io(&self) -> bool {
        self.direct
    }

    /// Why O_DIRECT is not in use, when it was asked for (`DirectIo::Auto`)
    /// but the filesystem does not support it. The caller decides whether
    /// and how to log it.
    pub fn warning(&self) -> Option<&str> {
        self.warning.as_deref()
    }

    /// Whether the path is a block device node (rather than a regular file).
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    fn io_error(&self, what: &str, offset: u64, len: usize, e: io::Error) -> io::Error {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: {what} of {len} bytes at offset {offset} ran past the end of the \
                     file (was it truncated after opening?)",
                    self.path.display()
                ),
            );
        }
        let message = format!(
            "{}: {what} of {len} bytes at offset {offset} failed",
            self.path.display()
        );
        io::Error::new(e.kind(), WithContext { message, source: e })
    }

    fn pread(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .map_err(|e| self.io_error("read", offset, buf.len(), e))
    }

    fn pwrite(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.io_error("write", offset, buf.len(), e))
    }

    fn write_zeros(&self, offset: u64, len: u64) -> io::Result<()> {
        let zeros = AlignedBuf::new(ZERO_CHUNK.min(len as usize));
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.pwrite(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

fn open_rw(path: &Path, direct: bool) -> io::Result<File> {
    let mut opts = OpenOptions::new();
    opts.read(true).write(true);
    let mut flags = if direct { libc::O_DIRECT } else { 0 };
    // A block device is claimed as the kernel's exclusive open does for
    // bcache, dm-cache and md: refused while mounted or held by another.
    let block_device = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    if block_device {
        flags |= libc::O_EXCL;
    }
    opts.custom_flags(flags);
    match opts.open(path) {
        // EINVAL is how the kernel says "no O_DIRECT here"; the caller
        // decides, so keep the raw error.
        Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => Err(e),
        Err(e) if block_device && e.raw_os_error() == Some(libc::EBUSY) => Err(io::Error::new(
            busy_kind(),
            format!(
                "{}: the block device is in use (mounted, or held by another program such as \
                 another tiercache, bcache, dm-cache or an md array); refusing to open it",
                path.display()
            ),
        )),
        Err(e) => Err(path_error(path, "cannot open", e)),
        Ok(f) => Ok(f),
    }
}

/// The kind of error for a device in use (EBUSY's).
fn blk_size(file: &File, path: &Path) -> io::Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: the fd is open for the life of `file`; BLKGETSIZE64 writes one
    // u64 through the pointer, which points at a live, writable u64.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
    if r != 0 {
        return Err(path_error(
            path,
            "cannot get block device size",
            io::Error::last_os_error(),
        ));
    }
    Ok(size)
}

/// The logical sector size of a block device, or 512 if it cannot be read.
fn blk_sector_size(file: &File) -> u64 {
    let mut sz: libc::c_int = 0;
    // SAFETY: the fd is open for the life of `file`; BLKSSZGET writes one int
    // through the pointer, which points at a live, writable c_int.
    let r = unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET as _, &mut sz as *mut _) };
    if r == 0 && sz > 0 {
        sz as u64
    } else {
        512
    }
}

/// Whether an errno from discard means "not supported here".
fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::ENOSYS) | Some(libc::EINVAL)
    )
}

thread_local! {
    static BOUNCE: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::new(0));
}

/// Runs `f` on an aligned scratch buffer of exactly `len` bytes (contents
/// unspecified), reusing a per-thread buffer when it can.
fn with_bounce<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    if len > MAX_CACHED_BOUNCE {
        let mut b = AlignedBuf::new(len);
        return f(&mut b);
    }
    BOUNCE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut b) => {
            if b.len() < len {
                *b = AlignedBuf::new(len.next_power_of_two().min(MAX_CACHED_BOUNCE));
            }
            f(&mut b[..len])
        }
        Err(_) => {
            let mut b = AlignedBuf::new(len);
            f(&mut b)
        }
    })
}

impl BlockDevice for FileDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn raw_read_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        Some(self.file.as_raw_fd())
    }

    /// The same fd: the file is always open for reading and writing.
    fn raw_write_fd(&self) -> Option<std::os::fd::RawFd> {
        self.raw_read_fd()
    }

    fn alignment(&self) -> u64 {
        self.alignment
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct && !is_aligned(buf) {
            with_bounce(buf.len(), |b| {
                self.pread(b, offset)?;
                buf.copy_from_slice(b);
                Ok(())
            })
        } else {
            self.pread(buf, offset)
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(());
        }
        if self.direct && !is_aligned(buf) {
            with_bounce(buf.len(), |b| {
                b.copy_from_slice(buf);
                self.pwrite(b, offset)
            })
        } else {
            self.pwrite(buf, offset)
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.file
            .sync_data()
            .map_err(|e| path_error(&self.path, "fdatasync failed", e))
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        let r = if self.block_device {
            let range: [u64; 2] = [offset, len];
            // SAFETY: the fd is open for the life of self.file; BLKDISCARD
            // reads two u64 (start, length) through the pointer, which points
            // at a live [u64; 2].
            unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) }
        } else {
            // SAFETY: the fd is open for the life of self.file; fallocate takes
            // only integers. offset + len <= size < i64::MAX was checked above.
            unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset as libc::off_t,
                    len as libc::off_t,
                )
            }
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if unsupported(&e) {
            self.write_zeros(offset, len)
        } else {
            Err(self.io_error("discard", offset, len as usize, e))
        }
    }

    fn describe(&self) -> String {
        format!("file:{}", self.path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    #[test]
    fn a_device_is_opened_by_one_owner_at_a_time() {
        let dir = tmpdir();
        let p = dir.path().join("dev.img");
        let first = FileDevice::create(&p, 1 << 20).unwrap();
        let e = FileDevice::open(&p).unwrap_err();
        assert_eq!(e.kind(), busy_kind(), "{e}");
        assert!(
            e.to_string().contains("opened twice by this command"),
            "{e}"
        );
        // Another process holding it is named by pid.
        let mut holder = std::process::Command::new("flock")
            .arg("-x")
            .arg("-o") // the lock stays with flock(1) itself, not with sleep
            .arg(&p)
            .arg("sleep")
            .arg("30")
            .spawn()
            .expect("flock(1) from util-linux");
        drop(first);
        // Until flock(1) has taken the lock, our opens succeed; once it has,
        // the refusal names it. Any other refusal is kept as the last word.
        let named = format!("in use by process {}", holder.id());
        let start = std::time::Instant::now();
        let mut last = String::new();
        while !last.contains(&named) {
            assert!(
                start.elapsed().as_secs() < 10,
                "flock(1) never named as the holder; last: {last:?}"
            );
            match FileDevice::open(&p) {
                Err(e) => {
                    assert_eq!(e.kind(), busy_kind(), "{e}");
                    last = e.to_string();
                }
                Ok(d) => drop(d),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(last.contains("(flock)"), "{last}");
        assert!(!last.contains("opened twice"), "{last}");
        let _ = holder.kill();
        let _ = holder.wait();
        // The lock goes with its holder.
        FileDevice::open(&p).unwrap();
    }

    #[test]
    fn a_lock_copied_into_a_forked_child_does_not_refuse_the_next_open() {
        // Other threads spawn commands all along: each fork copies the
        // descriptors open at that instant, and with them the lock, until
        // its exec. Closing and reopening the device must still succeed,
        // however many spawns overlap the reopens.
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::Arc;
        let dir = tmpdir();
        let p = dir.path().join("dev.img");
        drop(FileDevice::create(&p, 1 << 20).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let spawned = Arc::new(AtomicU64::new(0));
        let spawners: Vec<_> = (0..2)
            .map(|_| {
                let (stop, spawned) = (stop.clone(), spawned.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::process::Command::new("true").status().unwrap();
                        spawned.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        while spawned.load(Ordering::Relaxed) < 2 {
            std::thread::yield_now();
        }
        let (mut opens, mut refused) = (0, Vec::new());
        while opens < 300 || spawned.load(Ordering::Relaxed) < 300 {
            if let Err(e) = FileDevice::open(&p) {
                refused.push(e.to_string());
            }
            opens += 1;
        }
        stop.store(true, Ordering::Relaxed);
        spawners.into_iter().for_each(|t| t.join().unwrap());
        assert!(
            refused.is_empty(),
            "{} of {opens} opens refused: {:?}",
            refused.len(),
            refused.first()
        );
    }

    #[test]
    fn create_write_read_discard() {
        let dir = tmpdir();
        let p = dir.path().join("dev.img");
        let d = FileDevice::create(&p, 1 << 20).unwrap();
        assert_eq!(d.size(), 1 << 20);
        assert_eq!(d.alignment(), 512);
        let data: Vec<u8> = (0..8192).map(|i| (i % 253) as u8 + 1).collect();
        d.write_at(&data, 4096).unwrap();
        let mut back = vec![0u8; 8192];
        d.read_at(&mut back, 4096).unwrap();
        assert_eq!(back, data);
        d.flush().unwrap();
        d.discard(4096, 4096).unwrap();
        d.read_at(&mut back, 4096).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert_eq!(&back[4096..], &data[4096..]);
    }

    #[test]
    fn discard_fallback_writes_zeros() {
        let dir = tmpdir();
        let d = FileDevice::create(dir.path().join("z"), 3 << 20).unwrap();
        let ones = AlignedBuf::from_slice(&vec![1u8; 3 << 20]);
        d.write_at(&ones, 0).unwrap();
        // Larger than one zero chunk, not a multiple of it.
        d.write_zeros(512, (2 << 20) + 1024).unwrap();
        let mut back = AlignedBuf::new(3 << 20);
        d.read_at(&mut back, 0).unwrap();
        let end = 512 + (2 << 20) + 1024;
        assert!(back[..512].iter().all(|&b| b == 1));
        assert!(back[512..end].iter().all(|&b| b == 0));
        assert!(back[end..].iter().all(|&b| b == 1));
        assert!(unsupported(&io::Error::from_raw_os_error(libc::EOPNOTSUPP)));
        assert!(!unsupported(&io::Error::from_raw_os_error(libc::EIO)));
    }

    #[test]
    fn unaligned_buffers_bounce() {
        let dir = tmpdir();
        let d = FileDevice::create(dir.path().join("x"), 64 << 10).unwrap();
        // A slice starting one byte into a Vec is never 4096-aligned.
        let mut v = vec![0u8; 4097];
        for (i, b) in v.iter_mut().enumerate() {
            *b = (i * 7 % 256) as u8;
        }
        d.write_at(&v[1..], 512).unwrap();
        let mut back = vec![0u8; 4097];
        d.read_at(&mut back[1..], 512).unwrap();
        assert_eq!(&back[1..], &v[1..]);
        // And a large, unaligned buffer beyond the cached bounce size.
        let big = vec![0x5au8; MAX_CACHED_BOUNCE + 4096 + 1];
        let d2 = FileDevice::create(dir.path().join("y"), 8 << 20).unwrap();
        d2.write_at(&big[1..], 0).unwrap();
        let mut back = vec![0u8; MAX_CACHED_BOUNCE + 4096 + 1];
        d2.read_at(&mut back[1..], 0).unwrap();
        assert!(back[1..].iter().all(|&b| b == 0x5a));
    }

    #[test]
    fn errors_name_the_path() {
        let dir = tmpdir();
        let missing = dir.path().join("missing.img");
        let e = FileDevice::open(&missing).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(e.to_string().contains("missing.img"), "{e}");

        let odd = dir.path().join("odd.img");
        std::fs::write(&odd, vec![0u8; 1000]).unwrap();
        let e = FileDevice::open(&odd).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("odd.img"), "{e}");
        assert!(e.to_string().contains("multiple of 512"), "{e}");

        let e = FileDevice::open(dir.path()).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");

        let e = FileDevice::create(dir.path().join("c"), 1000).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn permission_denied_names_the_path() {
        let e = path_error(
            Path::new("/x/ro.img"),
            "cannot open",
            io::Error::from_raw_os_error(libc::EACCES),
        );
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(
            e.to_string(),
            "/x/ro.img: cannot open: permission denied (read and write access is needed)"
        );
        // Root ignores file modes, so try a real file only as another user.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return;
        }
        let dir = tmpdir();
        let p = dir.path().join("ro.img");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        let mut perm = std::fs::metadata(&p).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o400);
        std::fs::set_permissions(&p, perm).unwrap();
        let e = FileDevice::open(&p).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("ro.img"), "{e}");
    }

    #[test]
    fn truncated_file_is_an_error_not_zeros() {
        let dir = tmpdir();
        let p = dir.path().join("t.img");
        let d = FileDevice::create(&p, 64 << 10).unwrap();
        // Shrink the file behind the device's back.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(8192)
            .unwrap();
        let mut buf = AlignedBuf::new(4096);
        let e = d.read_at(&mut buf, 32 << 10).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("t.img"), "{e}");
        d.read_at(&mut buf, 4096).unwrap();
    }

    #[test]
    fn rejects_out_of_range() {
        let dir = tmpdir();
        let d = FileDevice::create(dir.path().join("r"), 8192).unwrap();
        let mut b = AlignedBuf::new(512);
        assert_eq!(
            d.read_at(&mut b, 8192).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            d.write_at(&b, 100).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            d.discard(0, 16384).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn buffered_mode_and_tmpfs() {
        let dir = tmpdir();
        let p = dir.path().join("b");
        FileDevice::create(&p, 8192).unwrap();
        let d = FileDevice::open_with(&p, DirectIo::Off).unwrap();
        assert!(!d.direct_io());
        assert!(d.warning().is_none());
        d.write_at(&[1u8; 512], 512).unwrap();
        let mut b = [0u8; 512];
        d.read_at(&mut b, 512).unwrap();
        assert_eq!(b, [1u8; 512]);

        // On tmpfs, Auto either gets O_DIRECT (newer kernels) or falls back
        // with a warning; it must open either way and say which.
        if let Ok(shm) = tempfile::tempdir_in("/dev/shm") {
            let p = shm.path().join("s");
            let d = FileDevice::create(&p, 8192).unwrap();
            assert_eq!(d.direct_io(), d.warning().is_none());
            d.write_at(&[2u8; 512], 0).unwrap();
            let mut b = [0u8; 512];
            d.read_at(&mut b, 0).unwrap();
            assert_eq!(b, [2u8; 512]);
        }
    }

    #[test]
    fn falls_back_to_buffered_io_without_o_direct() {
        let dir = tmpdir();
        let p = dir.path().join("nodirect");
        FileDevice::create(&p, 8192).unwrap();
        let refuse_direct = |path: &Path, direct: bool| {
            if direct {
                Err(io::Error::from_raw_os_error(libc::EINVAL))
            } else {
                open_rw(path, false)
            }
        };
        let d = FileDevice::open_using(&p, DirectIo::Auto, refuse_direct).unwrap();
        assert!(!d.direct_io());
        let w = d.warning().unwrap();
        assert!(w.contains("nodirect") && w.contains("O_DIRECT"), "{w}");
        d.write_at(&[3u8; 1024], 1024).unwrap();
        let mut b = [0u8; 1024];
        d.read_at(&mut b, 1024).unwrap();
        assert_eq!(b, [3u8; 1024]);
        let e = FileDevice::open_using(&p, DirectIo::Require, refuse_direct).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("nodirect"), "{e}");
        // One owner at a time.
        drop(d);
        // Where O_DIRECT works, Auto uses it and says nothing.
        let d = FileDevice::open(&p).unwrap();
        assert_eq!(d.direct_io(), d.warning().is_none());
    }

    #[test]
    fn many_threads_at_once() {
        let dir = tmpdir();
        let d = std::sync::Arc::new(FileDevice::create(dir.path().join("m"), 1 << 20).unwrap());
        let handles: Vec<_> = (0..8u8)
            .map(|t| {
                let d = d.clone();
                std::thread::spawn(move || {
                    let off = t as u64 * (128 << 10);
                    for i in 0..32u64 {
                        let v = vec![t.wrapping_add(i as u8); 4096];
                        d.write_at(&v, off + i * 4096).unwrap();
                    }
                    for i in 0..32u64 {
                        let mut v = vec![0u8; 4096];
                        d.read_at(&mut v, off + i * 4096).unwrap();
                        assert!(v.iter().all(|&b| b == t.wrapping_add(i as u8)));
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
