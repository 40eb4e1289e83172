//! The device's life: create `/dev/ublkbN` (or take over the one a dead
//! server left, see [`crate::recovery`]), run its queues, then delete it
//! or hand it over to the next server.

pub use crate::added::AddedDevice;
use crate::device_queue::{next_request, DeviceQueue};
use crate::direct::{direct_miss, direct_read, TagBuffer};
use crate::fixed_buffers::{self, FixedTable, TagPinned, TagScratch};
use crate::params::Geometry;
use crate::pool::{Completion, Submitter, WorkerPool};
use crate::queue_thread::{queue_thread, ThreadCtx};
use crate::request::{decode, execute, execute_if_quick, Request};
use crate::ring::Op;
use crate::start_error::describe;
pub use crate::start_error::{StartError, CONTROL_PATH};
use crate::tag_buffers::{tag_buffers, TagBuf};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::UblkDev;
use libublk::{UblkError, UblkFlags};
use parking_lot::{Condvar, Mutex};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use tiercache_frontend::Export;

/// How to serve an export as a ublk device.
#[derive(Debug, Clone)]
pub struct UblkConfig {
    /// Hardware queues, 1..=32. Queue `q` of every device of the process
    /// is served by queue thread `q` (`queue_thread.rs`), so this is
    /// also the number of queue threads. Default 1, as ublksrv's and
    /// rublk's: one queue thread takes every CPU's requests in larger
    /// batches and contends with no other queue thread for the engine (in
    /// the VM lab, 2 vCPUs: 28-35% less of tiercache's CPU per IO than one
    /// queue per CPU, docs/BENCHMARKS.md). More for a fast cache device
    /// that one thread cannot keep busy.
    pub queues: u16,
    /// Requests in flight per queue, 1..=4096.
    pub depth: u16,
    /// Largest READ/WRITE in bytes; also the size of each tag's buffer.
    /// Lowered to the export's maximum block size.
    pub max_io_bytes: u32,
    /// Device number N of `/dev/ublkbN`; None: the kernel picks one.
    pub dev_id: Option<u32>,
    /// The most threads running the export's (blocking) calls at once
    /// (started when a call finds none idle, ended after 30 s idle, so an
    /// idle device has none); 0: `queues * depth`, capped at 32.
    pub workers: usize,
    /// Create the device with user recovery (`UBLK_F_USER_RECOVERY` with
    /// re-issue): when this process dies the device stays, the kernel holds
    /// its requests, and the next server started with the same `dev_id`
    /// takes it over. Without it the kernel fails IO once the server dies.
    pub recovery: bool,
    /// Serve reads without copying through the tags' buffers where the
    /// kernel can (`UBLK_F_AUTO_BUF_REG`, Linux 6.16; `zero_copy.rs`):
    /// hits and bypassed reads land in the client's pages. Ignored (with a
    /// log line) on a kernel without it; a device taken over keeps the
    /// mode it was made with.
    pub zero_copy: bool,
}

impl Default for UblkConfig {
    fn default() -> Self {
        UblkConfig {
            queues: 1,
            depth: 64,
            max_io_bytes: 512 << 10,
            dev_id: None,
            workers: 0,
            recovery: true,
            zero_copy: false,
        }
    }
}

impl UblkConfig {
    fn worker_count(&self) -> usize {
        if self.workers > 0 {
            self.workers
        } else {
            (usize::from(self.queues) * usize::from(self.depth)).min(32)
        }
    }
}

/// Checks that the kernel has ublk and that this process may use it,
/// without creating anything.
pub fn check_kernel_support() -> Result<(), StartError> {
    check_control_path(Path::new(CONTROL_PATH))
}

fn check_control_path(path: &Path) -> Result<(), StartError> {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(StartError::NoKernelSupport),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            Err(StartError::PermissionDenied)
        }
        Err(e) => Err(StartError::Driver(format!(
            "opening {}: {e}",
            path.display()
        ))),
    }
}

/// A running `/dev/ublkbN` serving an export. Stop it with
/// [`UblkServer::stop`]; dropping it without stopping also stops it.
pub struct UblkServer {
    ctrl: Arc<UblkCtrl>,
    dev_id: u32,
    geometry: Geometry,
    /// The device's queues still served; None once stopped or handed over.
    queues: Option<Arc<QueuesLeft>>,
    pool: Option<WorkerPool>,
    /// Not the whole [`Shared`]: its [`Submitter`] would keep the worker
    /// pool from shutting down.
    gate: Arc<Gate>,
    recovered: bool,
}

/// What the device's queues share.
struct Shared {
    export: Arc<dyn Export>,
    jobs: Submitter,
    gate: Arc<Gate>,
}

/// How many of a device's queues are still served, and why the last
/// failed ones did.
struct QueuesLeft {
    left: Mutex<(usize, Option<String>)>,
    changed: Condvar,
}

impl QueuesLeft {
    fn new(n: usize) -> Arc<QueuesLeft> {
        Arc::new(QueuesLeft {
            left: Mutex::new((n, None)),
            changed: Condvar::new(),
        })
    }

    /// A queue has stopped (with an error if `why`).
    fn done(&self, why: Option<String>) {
        let mut l = self.left.lock();
        l.0 -= 1;
        if why.is_some() {
            l.1 = why;
        }
        self.changed.notify_all();
    }

    fn all_done(&self) -> bool {
        self.left.lock().0 == 0
    }

    /// Waits until every queue has stopped; the last error, if any.
    fn wait(&self) -> Result<(), String> {
        let mut l = self.left.lock();
        while l.0 > 0 {
            self.changed.wait(&mut l);
        }
        l.1.clone().map_or(Ok(()), Err)
    }
}

/// Whether requests may still reach the export (see
/// [`UblkServer::hand_over`]).
#[derive(Default)]
struct Gate {
    /// Set by [`UblkServer::hand_over`]: requests that arrive from now on
    /// are left to the next server (never run, never completed).
    handing_over: AtomicBool,
    /// Requests taken from the kernel and not yet run to their result.
    /// Raised before `handing_over` is read, so that once the flag is set
    /// and this is zero, the export gets no more calls.
    busy: AtomicUsize,
}

impl UblkServer {
    /// Creates and starts the device; returns once `/dev/ublkbN` exists
    /// and serves IO. With a `dev_id` whose device a dead server left
    /// quiesced, takes that device over instead (its queues, depth and IO
    /// size win over `cfg`; its size and block size must match the
    /// export's); a device served by a live process is refused
    /// ([`StartError::Busy`]). The same as [`AddedDevice::add`] followed
    /// by [`UblkServer::start_added`].
    pub fn start(export: Arc<dyn Export>, cfg: &UblkConfig) -> Result<UblkServer, StartError> {
        UblkServer::start_added(AddedDevice::add(export, cfg)?)
    }

    /// Starts a device whose number [`AddedDevice::add`] fixed: takes it
    /// over (START_USER_RECOVERY) if a dead server left it, opens
    /// `/dev/ublkcN`, posts its queues' tags and starts it; returns once
    /// `/dev/ublkbN` exists and serves IO. Any thread may call it, for
    /// several devices at once. On an error nothing is left served: a
    /// device added is deleted, one being taken over is left to the next
    /// server.
    pub fn start_added(mut added: AddedDevice) -> Result<UblkServer, StartError> {
        let t0 = std::time::Instant::now();
        // Control commands go through the calling thread's own ring.
        ensure_ctrl_ring()
            .map_err(|e| StartError::Driver(format!("control ring: {}", describe(&e))))?;
        let recovered = added.recovered();
        let (cfg, params, geometry) = (added.cfg.clone(), added.params, added.geometry);
        let (export, add_took) = (added.export.clone(), added.took);
        let ctrl = match added.ctrl.take() {
            Some(ctrl) => ctrl,
            None => {
                let id = added.dev_id;
                crate::recovery::start(id)?;
                UblkCtrlBuilder::default()
                    .name("tiercache")
                    .id(id as i32)
                    .nr_queues(cfg.queues)
                    .depth(cfg.depth)
                    .io_buf_bytes(cfg.max_io_bytes)
                    .ctrl_flags(crate::recovery::RECOVERY_FLAGS)
                    .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
                    .build()
                    .map_err(|e| {
                        StartError::Driver(format!("recovering the device: {}", describe(&e)))
                    })?
            }
        };
        drop(added);
        let ctrl = Arc::new(ctrl);
        let dev_id = ctrl.dev_info().dev_id;
        let recovering = t0.elapsed();
        let pool = WorkerPool::new(cfg.worker_count(), "ublk-io")
            .map_err(|e| StartError::Driver(format!("starting worker threads: {e}")))?;
        let dev_size = params.basic.dev_sectors << crate::request::SECTOR_SHIFT;
        // Opens /dev/ublkcN; START_DEV sends these parameters.
        let dev = UblkDev::new(
            "tiercache".to_string(),
            move |dev: &mut UblkDev| {
                dev.tgt.dev_size = dev_size;
                dev.tgt.params = params;
                Ok(())
            },
            &ctrl,
        )
        .map_err(|e| StartError::Driver(format!("opening the device: {}", describe(&e))))?;
        let dev = Arc::new(dev);
        let opened = t0.elapsed();
        let nr_queues = dev.dev_info.nr_hw_queues;
        let shared = Arc::new(Shared {
            export,
            jobs: pool.submitter(),
            gate: Arc::new(Gate::default()),
        });
        let gate = shared.gate.clone();
        let queues = QueuesLeft::new(usize::from(nr_queues));
        let mut server = UblkServer {
            ctrl,
            dev_id,
            geometry,
            queues: Some(queues.clone()),
            pool: Some(pool),
            gate,
            recovered,
        };
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        for qid in 0..nr_queues {
            let thread = match queue_thread(qid) {
                Ok(t) => t,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("starting queue thread {qid}: {e}")));
                    queues.done(None);
                    continue;
                }
            };
            let (dev, shared, ready, queues) = (
                dev.clone(),
                shared.clone(),
                ready_tx.clone(),
                queues.clone(),
            );
            thread.run(move |ctx| start_queue(ctx, dev, qid, shared, ready, queues));
        }
        drop(ready_tx);
        drop(shared);
        let mut failed = None;
        for _ in 0..nr_queues {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(m)) => failed = Some(m),
                Err(mpsc::RecvError) => failed = Some("a queue never started".to_string()),
            }
        }
        if let Some(m) = failed {
            // Without START_DEV, stopping it aborts the tags that did post.
            let _ = ensure_ctrl_ring();
            let _ = server.ctrl.kill_dev();
            let _ = server.ctrl.del_dev_async();
            server.queues = None;
            return Err(StartError::Driver(m));
        }
        // Every queue has posted its tags (START_DEV waits for that in the
        // kernel too); libublk's start waits for this count first.
        for _ in 0..nr_queues {
            dev.notify_buffer_registration_complete(false);
        }
        let posted = t0.elapsed();
        let started = ensure_ctrl_ring().and_then(|()| server.ctrl.start_dev(&dev));
        drop(dev);
        match started {
            Ok(_) => {
                let start_dev = t0.elapsed();
                tiercache_frontend::prefer_no_scheduler(&format!("ublkb{dev_id}"));
                let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                log::debug!(
                    "ublk{dev_id}: started in {:.1} ms: {} {:.1} ms; then {}opening \
                     /dev/ublkc{dev_id} {:.1} ms, posting the tags {:.1} ms, START_DEV {:.1} ms, \
                     IO scheduler {:.1} ms",
                    ms(add_took + t0.elapsed()),
                    if recovered {
                        "probe"
                    } else {
                        "checks and ADD_DEV"
                    },
                    ms(add_took),
                    if recovered {
                        format!("START_USER_RECOVERY {:.1} ms, ", ms(recovering))
                    } else {
                        String::new()
                    },
                    ms(opened - recovering),
                    ms(posted - opened),
                    ms(start_dev - posted),
                    ms(t0.elapsed() - start_dev)
                );
                if crate::zero_copy::is_zero_copy(server.ctrl.dev_info().flags) {
                    let (release, safe) = crate::zero_copy::running_kernel();
                    if *safe {
                        log::info!(
                            "ublk{dev_id}: zero copy: reads land in the requests' own pages"
                        );
                    } else {
                        log::warn!(
                            "ublk{dev_id}: zero copy: Linux {release} can misplace a read into a \
                             request's pages (its block layer miscounts their segments); every \
                             read is copied into its request instead (Linux 6.18 and later are \
                             not affected)"
                        );
                    }
                }
                Ok(server)
            }
            Err(e) => {
                let m = format!("starting the device: {}", describe(&e));
                let _ = server.shutdown();
                Err(StartError::Driver(m))
            }
        }
    }

    /// `/dev/ublkbN`.
    pub fn device_path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/ublkb{}", self.dev_id))
    }

    /// N of `/dev/ublkbN`.
    pub fn dev_id(&self) -> u32 {
        self.dev_id
    }

    /// True if the device was made with user recovery, so that
    /// [`UblkServer::hand_over`] can leave it to the next server.
    pub fn can_hand_over(&self) -> bool {
        self.ctrl.dev_info().flags & u64::from(libublk::sys::UBLK_F_USER_RECOVERY) != 0
    }

    /// True if this server took over a device a previous server left
    /// (user recovery) instead of adding one.
    pub fn recovered(&self) -> bool {
        self.recovered
    }

    /// Block sizes and size as given to the kernel.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// True once the queues have stopped by themselves (the device was
    /// deleted from outside, e.g. `ublk del`, or a queue failed).
    pub fn has_exited(&self) -> bool {
        self.queues.as_ref().map_or(true, |q| q.all_done())
    }

    /// Stops and deletes the device: the kernel fails new IO, requests in
    /// flight finish (their export calls complete), the queue threads exit,
    /// then the worker threads. When it returns the export gets no more
    /// calls. `/dev/ublkbN` disappears at once unless something still has
    /// it open (then when that closes it; on kernels before 6.9 this waits
    /// for that).
    pub fn stop(mut self) -> Result<(), String> {
        self.shutdown()
    }

    /// Leaves the device to the next server instead of deleting it: from
    /// now on requests are not run (the kernel keeps them), and this
    /// returns once the requests already running have their results, so
    /// the export gets no more calls. The device stays LIVE until this
    /// process exits; the kernel then quiesces it and re-issues the
    /// requests left here to the next server ([`crate::recovery`]). The
    /// caller shuts the export down and exits the process soon after: IO
    /// waits until a new server takes the device over.
    ///
    /// Fails (and leaves everything running) if the device was made
    /// without user recovery: the kernel would fail its IO.
    pub fn hand_over(mut self) -> Result<(), String> {
        if !self.can_hand_over() {
            return Err(format!(
                "/dev/ublkb{} was made without user recovery; it cannot be handed over",
                self.dev_id
            ));
        }
        self.gate.handing_over.store(true, Ordering::SeqCst);
        while self.gate.busy.load(Ordering::SeqCst) != 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // The device's tags stay posted until the process exits: neither
        // stop nor delete the device, nor let our control delete it when
        // dropped.
        self.ctrl.disown();
        self.queues.take();
        if let Some(pool) = self.pool.take() {
            std::mem::forget(pool);
        }
        log::info!(
            "ublk{}: handed over; the device waits for the next server",
            self.dev_id
        );
        Ok(())
    }

    fn shutdown(&mut self) -> Result<(), String> {
        let Some(queues) = self.queues.take() else {
            return Ok(());
        };
        // The device may be stopped from another thread than the one that
        // made it (a pool's volume detached through the control socket):
        // control commands need that thread's own ring.
        if let Err(e) = ensure_ctrl_ring() {
            log::warn!("ublk{}: control ring: {}", self.dev_id, describe(&e));
        }
        // -ENOENT / -ENODEV when it was already stopped: nothing to do.
        if let Err(e) = self.ctrl.kill_dev() {
            log::debug!("ublk{}: stop: {}", self.dev_id, describe(&e));
        }
        // Stopped, the driver aborts every posted tag: the queues end.
        let result = queues.wait();
        // Removes libublk's record of the device (and stops it, if the
        // kill above failed).
        if let Err(e) = self.ctrl.stop_dev() {
            log::debug!("ublk{}: stop: {}", self.dev_id, describe(&e));
        }
        // DEL_DEV waits until nobody has /dev/ublkbN open any more (a
        // mounted file system, a process holding it): that must not keep
        // the caller from shutting the export down. DEL_DEV_ASYNC (Linux
        // 6.9) returns at once and the kernel frees the device with its
        // last user; older kernels get the waiting kind.
        if let Err(e) = self.ctrl.del_dev_async() {
            log::debug!(
                "ublk{}: asynchronous delete: {}; deleting synchronously",
                self.dev_id,
                describe(&e)
            );
            if let Err(e) = self.ctrl.del_dev() {
                log::debug!("ublk{}: delete: {}", self.dev_id, describe(&e));
            }
        }
        log::info!("ublk{}: deleted", self.dev_id);
        if let Some(pool) = self.pool.take() {
            pool.shutdown();
        }
        result
    }
}

impl Drop for UblkServer {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            log::error!("ublk{}: {e}", self.dev_id);
        }
    }
}

/// libublk sends control commands through a ring of the calling thread,
/// made by its constructors; this makes one on a thread that has none.
pub(crate) fn ensure_ctrl_ring() -> Result<(), UblkError> {
    libublk::ublk_init_ctrl_task_ring(|ring| {
        if ring.is_none() {
            *ring = Some(io_uring::IoUring::builder().build(16)?);
        }
        Ok(())
    })
}

/// One tag's buffer and result slot. Shared (`Arc`) between the tag's task
/// and the worker running its request, so that the memory outlives both.
pub(crate) struct TagSlot {
    /// Registered with the kernel for this tag: the kernel copies WRITE
    /// data into it before handing over a request and copies READ data
    /// out of it when the request is committed.
    pub(crate) buf: TagBuf,
    done: Completion,
}

/// What a queue thread served, for its log line at exit.
#[derive(Default)]
struct Served {
    requests: std::cell::Cell<u64>,
    /// Hits and bypassed reads read through the queue's io_uring
    /// (`direct_read`).
    ring_reads: std::cell::Cell<u64>,
    /// Misses read and promoted through it (`direct_miss`).
    ring_misses: std::cell::Cell<u64>,
}

fn bump(c: &std::cell::Cell<u64>) {
    c.set(c.get() + 1);
}

/// A raw pointer to a tag's buffer, sent to the worker with its request.
struct BufPtr(*mut u8, usize);
// SAFETY: the pointer is only dereferenced by the one worker that runs the
// tag's current request (see `serve_tag`), while the tag's task waits.
unsafe impl Send for BufPtr {}

/// Joins queue `qid` of `dev` to the calling queue thread: maps its IO
/// descriptors, registers its tags' buffers, and spawns one task per tag
/// (each posts its tag at once) and one that cleans up after them. Says
/// on `ready` whether the queue is served; counts itself out of `queues`
/// when it ends.
fn start_queue(
    ctx: &Rc<ThreadCtx>,
    dev: Arc<UblkDev>,
    qid: u16,
    shared: Arc<Shared>,
    ready: mpsc::Sender<Result<(), String>>,
    queues: Arc<QueuesLeft>,
) {
    let buf_bytes = dev.dev_info.max_io_buf_bytes as usize;
    let zero_copy = crate::zero_copy::is_zero_copy(dev.dev_info.flags);
    let failed = |m: String| {
        let _ = ready.send(Err(m.clone()));
        queues.done(Some(m));
    };
    let bufs = match tag_buffers(dev.dev_info.queue_depth, buf_bytes) {
        Ok(bufs) => bufs,
        Err(e) => return failed(format!("queue {qid}: mapping its tags' buffers: {e}")),
    };
    let slots: Vec<Arc<TagSlot>> = bufs
        .into_iter()
        .map(|buf| {
            Arc::new(TagSlot {
                buf,
                done: Completion::default(),
            })
        })
        .collect();
    // Reads into a tag's buffer, and a miss's IO on its scratch buffer,
    // are READ_FIXED / WRITE_FIXED when registered (None: plain IO); with
    // zero copy the tags' indices are where the kernel registers requests.
    let table = fixed_buffers::register(ctx, dev.dev_info.queue_depth, zero_copy);
    if zero_copy && table.is_none() {
        return failed(format!(
            "queue {qid}: the device is zero-copy and its thread's ring has no room in its buffer table"
        ));
    }
    let dq = match DeviceQueue::map(dev, qid, table.filter(|_| zero_copy).map(|t| t.base())) {
        Ok(q) => Rc::new(q),
        Err(e) => {
            if let Some(t) = table {
                fixed_buffers::unregister(ctx, t);
            }
            return failed(format!("mapping queue {qid}'s descriptors: {e}"));
        }
    };
    let served = Rc::new(Served::default());
    let tags: Vec<smol::Task<()>> = (0..dq.depth())
        .map(|tag| {
            let (ctx2, dq, slot, shared, served) = (
                ctx.clone(),
                dq.clone(),
                slots[usize::from(tag)].clone(),
                shared.clone(),
                served.clone(),
            );
            ctx.exe.spawn(async move {
                if let Err(e) = serve_tag(&ctx2, &dq, tag, slot, table, &shared, &served).await {
                    log::error!("ublk{} queue {qid} tag {tag}: {e}", dq.dev_id());
                }
            })
        })
        .collect();
    let ctx2 = ctx.clone();
    ctx.exe
        .spawn(async move {
            for t in tags {
                t.await;
            }
            log::info!(
                "ublk{} queue {qid}: {} requests served; on the queue's io_uring {} hits or bypassed reads and {} promoted misses; registered buffers: {}; its thread so far: {}",
                dq.dev_id(),
                served.requests.get(),
                served.ring_reads.get(),
                served.ring_misses.get(),
                fixed_buffers::describe(table),
                ctx2.time.get()
            );
            // Every tag task has finished: no IO on the buffers is in
            // flight, and no command names them.
            if let Some(t) = table {
                fixed_buffers::unregister(&ctx2, t);
            }
            drop(slots);
            drop(dq);
            queues.done(None);
        })
        .detach();
    let _ = ready.send(Ok(()));
}

/// One tag: post it, run each request it gets (on this thread when it
/// can, else on a worker), commit the result and wait for the next,
/// until the queue goes down.
async fn serve_tag(
    ctx: &Rc<ThreadCtx>,
    q: &DeviceQueue,
    tag: u16,
    slot: Arc<TagSlot>,
    table: Option<FixedTable>,
    shared: &Shared,
    served: &Served,
) -> Result<(), String> {
    let ring = &ctx.ring;
    let notifier = &ctx.notifier;
    let buf_ptr = slot.buf.as_mut_ptr();
    // SAFETY: the tag's buffer lives in `slot`, which `start_queue`'s
    // clean-up task keeps until every tag task has ended, i.e. the queue
    // is down.
    if let Err(down) = unsafe { q.fetch(ring, tag, buf_ptr) }.await {
        return queue_down(down.0);
    }
    // This tag's buffer in the ring's table, registered as its reads need.
    let mut pinned = TagPinned::new(tag, table);
    // Where this tag's misses are read to and filled from (`direct_miss`),
    // made at the first one.
    let mut scratch = TagScratch::new(tag, table);
    loop {
        let iod = q.iod(tag);
        shared.gate.busy.fetch_add(1, Ordering::SeqCst);
        if shared.gate.handing_over.load(Ordering::SeqCst) {
            // Left to the next server: the kernel re-issues it when this
            // process has exited.
            shared.gate.busy.fetch_sub(1, Ordering::SeqCst);
            return std::future::pending().await;
        }
        let outcome = match decode(iod.op_flags, iod.start_sector, iod.nr_sectors) {
            Err(errno) => Outcome::Commit(errno),
            Ok(req) => 'result: {
                let fixed = match req {
                    Request::Read { len, .. } => pinned.index_for(ring, &slot.buf, len as usize),
                    _ => None,
                };
                let tag_buffer = TagBuffer {
                    queue: q,
                    tag,
                    buf: &slot.buf,
                    fixed,
                    request_index: q.request_index(tag, iod.op_flags),
                };
                // With zero copy, a write's data is taken from its request
                // into the tag's buffer first: the engine checksums and
                // journals it there.
                if let Request::Write { len, .. } = req {
                    if q.zero_copy() {
                        let len = (len as usize).min(slot.buf.len());
                        // SAFETY: the tag's buffer is ours until the commit
                        // (see the worker's comment); no job holds it now.
                        let bytes =
                            unsafe { std::slice::from_raw_parts_mut(slot.buf.as_mut_ptr(), len) };
                        if let Err(e) = q.copy_from_request(tag, bytes) {
                            log::error!("ublk{}: taking a write's data: {e}", q.dev_id());
                            break 'result Outcome::Commit(-libc::EIO);
                        }
                    }
                }
                // A cache hit on a cache file, or a read that surely
                // bypasses the cache: read through this thread's io_uring,
                // no thread hand-off and no blocking.
                if let Request::Read { offset, len } = req {
                    if let Some(result) =
                        direct_read(ring, &tag_buffer, &*shared.export, offset, len).await
                    {
                        bump(&served.ring_reads);
                        break 'result Outcome::Commit(result);
                    }
                }
                // A cache hit is answered on this thread: no hand-off to a
                // worker and back (two thread switches per request).
                // SAFETY: the tag's buffer is ours until the commit below
                // (see the worker's comment); no job holds it now.
                let bytes = unsafe {
                    std::slice::from_raw_parts_mut(slot.buf.as_mut_ptr(), slot.buf.len())
                };
                let quick = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    execute_if_quick(&*shared.export, req, bytes)
                }))
                .unwrap_or_else(|_| {
                    log::error!("ublk: the export panicked on {req:?}");
                    Some(-libc::EIO)
                });
                if let Some(result) = quick {
                    break 'result Outcome::Commit(to_request(q, tag, req, &slot.buf, result));
                }
                // A miss on files: read and promote through this thread's
                // io_uring too, no worker round trip.
                if let Request::Read { offset, len } = req {
                    if let Some(commit) = direct_miss(
                        ring,
                        &tag_buffer,
                        &*shared.export,
                        offset,
                        len,
                        &mut scratch,
                    )
                    .await
                    {
                        bump(&served.ring_misses);
                        break 'result Outcome::Committing(commit);
                    }
                }
                let (job_slot, export, notifier) =
                    (slot.clone(), shared.export.clone(), notifier.clone());
                let buf = BufPtr(slot.buf.as_mut_ptr(), slot.buf.len());
                let queued = shared.jobs.submit(move || {
                    let buf = buf;
                    // SAFETY: `buf` points to `job_slot.buf`, kept alive by
                    // `job_slot`. Nothing else touches those bytes until
                    // `complete` below: the tag's task is waiting for it,
                    // and the kernel hands the buffer over only with the
                    // next request, after the commit that follows.
                    let bytes = unsafe { std::slice::from_raw_parts_mut(buf.0, buf.1) };
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        execute(&*export, req, bytes)
                    }))
                    .unwrap_or_else(|_| {
                        log::error!("ublk: the export panicked on {req:?}");
                        -libc::EIO
                    });
                    job_slot.done.complete(result);
                    notifier.notify();
                });
                Outcome::Commit(if queued {
                    let result = slot.done.wait().await;
                    to_request(q, tag, req, &slot.buf, result)
                } else {
                    -libc::EIO
                })
            }
        };
        shared.gate.busy.fetch_sub(1, Ordering::SeqCst);
        bump(&served.requests);
        let result = match outcome {
            Outcome::Committing(commit) => {
                if let Err(down) = next_request(commit.await) {
                    return queue_down(down.0);
                }
                continue;
            }
            Outcome::Commit(result) => result,
        };
        if result < 0 {
            log::debug!(
                "ublk{} queue {} tag {tag}: op_flags {:#x} sector {} sectors {} failed: {}",
                q.dev_id(),
                q.qid(),
                iod.op_flags,
                iod.start_sector,
                iod.nr_sectors,
                std::io::Error::from_raw_os_error(-result)
            );
        } else {
            log::trace!(
                "ublk{} queue {} tag {tag}: op_flags {:#x} sector {} sectors {} -> {result}",
                q.dev_id(),
                q.qid(),
                iod.op_flags,
                iod.start_sector,
                iod.nr_sectors,
            );
        }
        // SAFETY: as for the fetch above.
        if let Err(down) = unsafe { q.commit_and_fetch(ring, tag, buf_ptr, result) }.await {
            return queue_down(down.0);
        }
    }
}

/// A read answered in the tag's buffer (`result` bytes, or `-errno`),
/// its data put into the request with zero copy; the result to commit.
fn to_request(q: &DeviceQueue, tag: u16, req: Request, buf: &TagBuf, result: i32) -> i32 {
    if !q.zero_copy() || !matches!(req, Request::Read { .. }) || result <= 0 {
        return result;
    }
    let n = (result as usize).min(buf.len());
    // SAFETY: the read that filled the tag's buffer has finished (on this
    // thread, or its worker completed); nothing writes it until the commit.
    let data = unsafe { std::slice::from_raw_parts(buf.as_ptr(), n) };
    match q.copy_to_request(tag, data) {
        Ok(()) => result,
        Err(e) => {
            log::error!("ublk{}: copying a read to its request: {e}", q.dev_id());
            -libc::EIO
        }
    }
}

/// How a request ends.
enum Outcome {
    /// Its result, to commit.
    Commit(i32),
    /// Committed already (a miss, before its fill): the commit, which
    /// resolves with the tag's next request.
    Committing(Op),
}

/// A tag's command ended with `res` instead of a request: the queue was
/// stopped (`UBLK_IO_RES_ABORT`, the normal end), or the driver refused
/// the command.
fn queue_down(res: i32) -> Result<(), String> {
    if res == libublk::sys::UBLK_IO_RES_ABORT {
        Ok(())
    } else {
        Err(format!(
            "the driver ended the tag's command: {}",
            std::io::Error::from_raw_os_error(-res)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_control_device_says_the_kernel_lacks_ublk() {
        let dir = tempfile::tempdir().unwrap();
        let e = check_control_path(&dir.path().join("ublk-control")).unwrap_err();
        assert!(matches!(e, StartError::NoKernelSupport));
        let msg = e.to_string();
        assert!(msg.contains("this kernel has no ublk"), "{msg}");
        assert!(msg.contains("modprobe ublk_drv"), "{msg}");
        assert!(msg.contains("Linux >= 6.0"), "{msg}");
    }

    #[test]
    fn start_on_this_host_either_works_or_explains() {
        if Path::new(CONTROL_PATH).exists() {
            eprintln!("SKIPPED: this kernel has ublk; the VM lab covers it");
            return;
        }
        let export = Arc::new(tiercache_frontend::MemExport::new(1 << 20));
        let err = UblkServer::start(export, &UblkConfig::default())
            .err()
            .expect("no ublk here");
        assert!(matches!(err, StartError::NoKernelSupport), "{err}");
    }

    #[test]
    fn default_worker_count_is_bounded() {
        let cfg = UblkConfig {
            queues: 4,
            depth: 128,
            ..UblkConfig::default()
        };
        assert_eq!(cfg.worker_count(), 32);
        let cfg = UblkConfig {
            queues: 1,
            depth: 4,
            ..UblkConfig::default()
        };
        assert_eq!(cfg.worker_count(), 4);
    }
}
