//! Hits read from a file by the server itself ([`Export::begin_direct_read`])
//! run concurrently on one connection: as many reads on the device as the
//! client has requests in flight, with the right data, and a failed direct
//! read is read again the normal way.

mod common;

use common::RawClient;
use parking_lot::{Condvar, Mutex};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_frontend::DirectRead;
use tiercache_nbd::{proto, Export, ServerConfig};

const BLOCK: usize = 4096;

/// io_uring is what keeps hits concurrent; a kernel that refuses it fails
/// these tests under `make test` (a skip elsewhere).
fn have_io_uring(test: &str) -> bool {
    match io_uring::IoUring::new(4) {
        Ok(_) => true,
        Err(e) => {
            tiercache_testkit::skip(test, &format!("io_uring is refused here ({e})"));
            false
        }
    }
}

/// Reads in flight on a device double, and the most seen at once.
#[derive(Default)]
struct InFlight {
    now: Mutex<(usize, usize)>,
    changed: Condvar,
}

impl InFlight {
    fn begin(&self) {
        let mut n = self.now.lock();
        n.0 += 1;
        n.1 = n.1.max(n.0);
        self.changed.notify_all();
    }
    fn end(&self) {
        self.now.lock().0 -= 1;
    }
    /// Waits until `n` reads are in flight at once, at most `bound`; the
    /// most seen.
    fn wait_for(&self, n: usize, bound: Duration) -> usize {
        let deadline = Instant::now() + bound;
        let mut g = self.now.lock();
        while g.1 < n && !self.changed.wait_until(&mut g, deadline).timed_out() {}
        g.1
    }
}

/// A cache device whose reads block until data is written into a pipe: a
/// hit is a read of the pipe, through the ring (`begin_direct_read`) or,
/// as a server reading hits in turn would, with a blocking read on the
/// serving thread (`read_if_quick`).
struct PipeExport {
    rx: OwnedFd,
    reads: Arc<InFlight>,
}

impl Export for PipeExport {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read(&self, _offset: u64, _buf: &mut [u8]) -> std::io::Result<()> {
        Err(std::io::Error::other("every read of this export is a hit"))
    }
    fn read_if_quick(&self, _offset: u64, buf: &mut [u8]) -> Option<std::io::Result<()>> {
        self.reads.begin();
        let mut f = std::fs::File::from(self.rx.try_clone().unwrap());
        let r = std::io::Read::read_exact(&mut f, buf);
        self.reads.end();
        Some(r)
    }
    fn begin_direct_read(&self, _offset: u64, len: u32) -> Option<DirectRead<'_>> {
        self.reads.begin();
        let reads = self.reads.clone();
        // A pipe has no offsets: u64::MAX reads at its current position.
        Some(DirectRead::new(
            self.rx.as_raw_fd(),
            vec![(u64::MAX, 0, len as usize)],
            move |r| {
                reads.end();
                r
            },
        ))
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// N hits sent at once on one connection are N reads on the device at
/// once: the device double answers none until N are in flight. Read one at
/// a time, only one is ever in flight (and the double gives up waiting
/// after a generous bound, so the test fails instead of hanging).
#[test]
fn hits_on_one_connection_are_read_concurrently() {
    if !have_io_uring("hits_on_one_connection_are_read_concurrently") {
        return;
    }
    const N: usize = 8;
    let (rx, tx) = pipe();
    let reads = Arc::new(InFlight::default());
    let export = Arc::new(PipeExport {
        rx,
        reads: reads.clone(),
    });
    let srv = common::start(export, ServerConfig::default());
    let mut c = RawClient::connect(&srv.sock, true);
    for h in 0..N as u64 {
        c.send(proto::CMD_READ, 0, h, h * BLOCK as u64, BLOCK as u32);
    }
    let feeder = std::thread::spawn(move || {
        let most = reads.wait_for(N, Duration::from_secs(10));
        let mut tx = std::fs::File::from(tx);
        for _ in 0..N {
            tx.write_all(&[0xab; BLOCK]).unwrap(); // atomic: <= PIPE_BUF
        }
        most
    });
    let mut handles: Vec<u64> = (0..N)
        .map(|_| {
            let r = c.reply();
            assert_eq!(r.errno, 0, "{}", r.message);
            assert_eq!(r.data, vec![0xab; BLOCK]);
            r.handle
        })
        .collect();
    handles.sort_unstable();
    assert_eq!(handles, (0..N as u64).collect::<Vec<_>>());
    let most = feeder.join().unwrap();
    assert_eq!(
        most, N,
        "only {most} of {N} hits sent at once were read at once on one connection"
    );
    c.disc();
}

fn pipe() -> (OwnedFd, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe(2) returns.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    use std::os::fd::FromRawFd;
    // SAFETY: pipe(2) succeeded, so both are open descriptors nobody else owns.
    unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// A cache file: every read is a hit read from the file by the server, in
/// two pieces (as the engine gives a range over two cache blocks, the
/// second piece first), or, with `broken`, from a descriptor that fails
/// (then the server must read it again with `read`).
struct FileExport {
    file: std::fs::File,
    broken: bool,
    direct: AtomicUsize,
    failed: AtomicUsize,
    reads: AtomicUsize,
}

impl Export for FileExport {
    fn size(&self) -> u64 {
        self.file.metadata().unwrap().len()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.file.read_exact_at(buf, offset)
    }
    fn begin_direct_read(&self, offset: u64, len: u32) -> Option<DirectRead<'_>> {
        self.direct.fetch_add(1, Ordering::SeqCst);
        let half = len as usize / 2;
        let pieces = vec![
            (offset + half as u64, half, len as usize - half),
            (offset, 0, half),
        ];
        let fd = if self.broken {
            -1
        } else {
            self.file.as_raw_fd()
        };
        Some(DirectRead::new(fd, pieces, |r| {
            if r.is_err() {
                self.failed.fetch_add(1, Ordering::SeqCst);
            }
            r
        }))
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> std::io::Result<()> {
        Ok(())
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
}

fn file_export(broken: bool) -> (Arc<FileExport>, Vec<u8>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cache");
    let data = common::pattern(7, 1 << 20);
    std::fs::write(&path, &data).unwrap();
    let export = Arc::new(FileExport {
        file: std::fs::File::open(&path).unwrap(),
        broken,
        direct: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        reads: AtomicUsize::new(0),
    });
    (export, data, dir)
}

/// Many hits of several sizes in flight on one connection: each reply
/// carries its own range's data.
fn pipelined_reads_return_their_data(c: &mut RawClient, data: &[u8]) {
    let reqs: Vec<(u64, u32)> = (0..200u64)
        .map(|i| {
            (
                (i * 7919 % 240) * 4096,
                [512, 4096, 8192, 65536][i as usize % 4],
            )
        })
        .collect();
    for (h, &(off, len)) in reqs.iter().enumerate() {
        c.send(proto::CMD_READ, 0, h as u64, off, len);
    }
    for _ in 0..reqs.len() {
        let r = c.reply();
        assert_eq!(r.errno, 0, "{}", r.message);
        let (off, len) = reqs[r.handle as usize];
        assert!(
            r.data == data[off as usize..off as usize + len as usize],
            "wrong data for the read of {len} bytes at {off}"
        );
    }
}

#[test]
fn hits_read_from_a_file_return_their_data() {
    if !have_io_uring("hits_read_from_a_file_return_their_data") {
        return;
    }
    let (export, data, _dir) = file_export(false);
    let srv = common::start(export.clone(), ServerConfig::default());
    for structured in [true, false] {
        let mut c = RawClient::connect(&srv.sock, structured);
        pipelined_reads_return_their_data(&mut c, &data);
        c.disc();
    }
    assert_eq!(export.direct.load(Ordering::SeqCst), 400);
    assert_eq!(export.failed.load(Ordering::SeqCst), 0);
    assert_eq!(
        export.reads.load(Ordering::SeqCst),
        0,
        "a hit went the slow way"
    );
}

#[test]
fn a_failed_direct_read_is_read_again() {
    if !have_io_uring("a_failed_direct_read_is_read_again") {
        return;
    }
    let (export, data, _dir) = file_export(true);
    let srv = common::start(export.clone(), ServerConfig::default());
    let mut c = RawClient::connect(&srv.sock, true);
    pipelined_reads_return_their_data(&mut c, &data);
    c.disc();
    assert_eq!(export.direct.load(Ordering::SeqCst), 200);
    assert_eq!(export.failed.load(Ordering::SeqCst), 200);
    assert_eq!(export.reads.load(Ordering::SeqCst), 200);
}

/// Replies are spliced into a Unix socket from the buffers the hits were
/// read into, so a buffer is not read into again until the client has read
/// its reply: a client that leaves a first round of replies unread while
/// the server serves a second round gets each read's own data.
#[test]
fn a_client_that_reads_late_gets_each_reply_as_it_was_read() {
    if !have_io_uring("a_client_that_reads_late_gets_each_reply_as_it_was_read") {
        return;
    }
    let (export, data, _dir) = file_export(false);
    let srv = common::start(export.clone(), ServerConfig::default());
    let blocks = (data.len() / BLOCK) as u64;
    for structured in [true, false] {
        let mut c = RawClient::connect(&srv.sock, structured);
        // Two rounds of 32 reads (as many as the server's registered
        // buffers), each of other blocks; the replies are read after both.
        let reqs: Vec<u64> = (0..64u64)
            .map(|i| (i * 37 % blocks) * BLOCK as u64)
            .collect();
        for round in reqs.chunks(32).enumerate() {
            for (k, off) in round.1.iter().enumerate() {
                c.send(
                    proto::CMD_READ,
                    0,
                    (round.0 * 32 + k) as u64,
                    *off,
                    BLOCK as u32,
                );
            }
            std::thread::sleep(Duration::from_millis(150));
        }
        for _ in 0..reqs.len() {
            let r = c.reply();
            assert_eq!(r.errno, 0, "{}", r.message);
            let off = reqs[r.handle as usize] as usize;
            assert!(
                r.data == data[off..off + BLOCK],
                "reply {} has another read's data",
                r.handle
            );
        }
        c.disc();
    }
    assert_eq!(
        export.reads.load(Ordering::SeqCst),
        0,
        "a hit went the slow way"
    );
}
