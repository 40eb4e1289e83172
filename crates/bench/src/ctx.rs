//! [`Ctx`]: how each configuration is served and measured (fio's study job
//! against a `tiercache serve` or an nbdkit, with the CPU others used).

use crate::files::{blank_device_file, slug};
use crate::fio::{self, Measured};
use crate::procs::{self, CpuMeter, MemCgroup, Server, Stats};
use crate::report;
use crate::run_result::{self, SweepPoint};
use crate::settings::Settings;
use crate::variant::Variant;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// What every configuration needs.
pub(crate) struct Ctx {
    pub(crate) exe: PathBuf,
    pub(crate) work: PathBuf,
    pub(crate) runs: PathBuf,
    pub(crate) st: Settings,
}

impl Ctx {
    fn study(&self, uri: &str, offset: u64, total: u64, runtime: u64, name: &str) -> fio::Job {
        let prefix = self.runs.join(name);
        fio::remove_outputs(&prefix);
        let mut j = fio::Job::study(uri, offset, total, runtime, prefix);
        j.log_msec = self.st.log_msec;
        j
    }

    /// The study's job over `data_size` bytes at `offset`, with the CPU
    /// used by other processes meanwhile (`servers`: pids of ours).
    fn measure(
        &self,
        uri: &str,
        offset: u64,
        name: &str,
        servers: &[u32],
    ) -> Result<(Measured, Option<f64>)> {
        let meter = CpuMeter::start(servers);
        let m = self
            .study(uri, offset, self.st.data_size, self.st.runtime, name)
            .run()?;
        Ok((m, meter.others_share(servers)))
    }

    /// A device served alone by `tiercache serve` (no cache).
    pub(crate) fn baseline(
        &self,
        spec: &str,
        name: &str,
        round: usize,
    ) -> Result<run_result::Sample> {
        let s = Server::tiercache(
            &self.exe,
            &self.work,
            name,
            &["--backing".to_string(), spec.to_string()],
        )?;
        let pids: Vec<u32> = s.pid().into_iter().collect();
        let (m, others) = self.measure(&s.uri(), 0, &format!("{name}-r{round}"), &pids)?;
        s.stop()?;
        let mut x = run_result::Sample::new(round, m);
        x.others_cpu = others;
        Ok(x)
    }

    /// Reads every block of region A once (fio's random map, blocks of
    /// the cache block size): after an "empty cache" run over A's first
    /// `data_size` bytes, this fills the cache with A.
    fn fill_region_a(&self, uri: &str, name: &str) -> Result<()> {
        let st = &self.st;
        let fill = fio::Job {
            uri: uri.to_string(),
            rw: "randread".into(),
            distribution: None,
            bs: st.block_size,
            iodepth: 8,
            numjobs: 2,
            offset: 0,
            size_per_job: st.junk_size / 2,
            runtime: None,
            prefix: self.runs.join(format!("{name}-fill")),
            log_msec: 0,
        };
        fill.run()
            .context("filling the cache with region A")
            .map(|_| ())
    }

    /// The cache device file, blank (see [`blank_device_file`]).
    fn cache_file(&self) -> Result<PathBuf> {
        let p = self.work.join("cache.img");
        blank_device_file(&p, self.st.cache_size)?;
        Ok(p)
    }

    /// One tiercache server, measured with an empty cache (region A) and
    /// then, after filling the cache with region A, full of stale data
    /// (region B). Returns both samples and the server's peak RSS.
    pub(crate) fn tiercache_pair(
        &self,
        v: &Variant,
        backing: &Path,
        round: usize,
        label: &str,
    ) -> Result<(run_result::Sample, run_result::Sample, Option<u64>)> {
        let name = format!("{}-r{round}", slug(label));
        let cache = self.cache_file()?;
        let s = Server::tiercache(
            &self.exe,
            &self.work,
            &name,
            &v.serve_args(&self.st, backing, &cache),
        )?;
        let pids: Vec<u32> = s.pid().into_iter().collect();
        let sample = |m: Measured, others: Option<f64>, d: Stats| {
            let mut x = run_result::Sample::new(round, m);
            x.others_cpu = others;
            x.hit_ratio = d.hit_ratio();
            x.promotions = Some(d.promotions);
            x.demotions = Some(d.demotions);
            x
        };
        let before = s.stats()?;
        let (m, others) = self.measure(&s.uri(), 0, &format!("{name}-empty"), &pids)?;
        let empty = sample(m, others, s.stats()?.since(&before));
        self.fill_region_a(&s.uri(), &name)?;
        let before = s.stats()?;
        let (m, others) =
            self.measure(&s.uri(), self.st.junk_size, &format!("{name}-stale"), &pids)?;
        let mut stale = sample(m, others, s.stats()?.since(&before));
        stale.note = format!(
            "before the run: {} of {} cache blocks held stale data (region A)",
            before.resident, before.capacity
        );
        let rss = s.peak_rss();
        s.stop()?;
        Ok((empty, stale, rss))
    }

    /// nbdkit's cache filter in front of the slow device alone, measured
    /// as [`Ctx::tiercache_pair`] does; in a memory cgroup of `limit`
    /// bytes if given. The hit ratio is estimated as 1 - (reads reaching
    /// the backend) / (client reads).
    pub(crate) fn nbdkit_pair(
        &self,
        backing: &Path,
        round: usize,
        limit: Option<u64>,
    ) -> Result<(run_result::Sample, run_result::Sample)> {
        let name = format!(
            "nbdkit-{}-r{round}",
            if limit.is_some() {
                "capped"
            } else {
                "pagecache"
            }
        );
        let cg = limit
            .map(|l| MemCgroup::create(&format!("nbdkit-r{round}"), l))
            .transpose()?;
        let hdd = Server::tiercache(
            &self.exe,
            &self.work,
            &format!("{name}-hdd"),
            &["--backing".into(), format!("hdd:{}", backing.display())],
        )?;
        let nk = Server::nbdkit_cache(
            &self.work,
            &name,
            &hdd.socket,
            self.st.cache_size,
            self.st.block_size,
            cg.as_ref(),
        )?;
        let pids: Vec<u32> = hdd.pid().into_iter().chain(nk.pid()).collect();
        let log = Server::nbdkit_backend_log(&self.work, &name);
        let reads = || procs::nbdkit_backend_reads(&log).unwrap_or(0);
        let sample = |m: Measured, others: Option<f64>, misses: u64| {
            let mut x = run_result::Sample::new(round, m);
            x.others_cpu = others;
            x.hit_ratio = (x.measured.total_ios > 0)
                .then(|| 1.0 - (misses as f64 / x.measured.total_ios as f64).min(1.0));
            x
        };
        let r0 = reads();
        let (m, others) = self.measure(&nk.uri(), 0, &format!("{name}-empty"), &pids)?;
        let mut empty = sample(m, others, reads() - r0);
        self.fill_region_a(&nk.uri(), &name)?;
        let r1 = reads();
        let (m, others) = self.measure(
            &nk.uri(),
            self.st.junk_size,
            &format!("{name}-stale"),
            &pids,
        )?;
        let mut stale = sample(m, others, reads() - r1);
        let mem = match &cg {
            Some(cg) => cg.peak(),
            None => nk.peak_rss(),
        };
        let memo = match (limit, mem) {
            (Some(l), Some(p)) => format!(
                "memory cgroup limit {}, peak charged {} (RSS + page cache)",
                report::fmt_bytes(l),
                report::fmt_bytes(p)
            ),
            (None, Some(p)) => format!(
                "peak RSS {} plus its cache file in the page cache (uncapped)",
                report::fmt_bytes(p)
            ),
            _ => String::new(),
        };
        empty.note = format!("hit ratio estimated: 1 - backend reads / client reads; {memo}");
        stale.note = empty.note.clone();
        nk.stop()?;
        hdd.stop()?;
        drop(cg);
        let _ = std::fs::remove_dir_all(self.work.join(format!("{name}.tmp")));
        Ok((empty, stale))
    }

    /// One point of the data-size sweep: cache filled by the study's job
    /// over the same data (half the runtime), then measured.
    pub(crate) fn sweep_point(
        &self,
        v: &Variant,
        backing: &Path,
        factor: f64,
        data: u64,
    ) -> Result<SweepPoint> {
        let name = format!("sweep-{factor}");
        let cache = self.cache_file()?;
        let s = Server::tiercache(
            &self.exe,
            &self.work,
            &name,
            &v.serve_args(&self.st, backing, &cache),
        )?;
        let mut warm = self.study(
            &s.uri(),
            0,
            data,
            self.st.sweep_runtime.div_ceil(2),
            &format!("{name}-warm"),
        );
        warm.log_msec = 0;
        warm.run().context("filling the cache")?;
        let pids: Vec<u32> = s.pid().into_iter().collect();
        let before = s.stats()?;
        let meter = CpuMeter::start(&pids);
        let m = self
            .study(&s.uri(), 0, data, self.st.sweep_runtime, &name)
            .run()?;
        let others = meter.others_share(&pids);
        let d = s.stats()?.since(&before);
        s.stop()?;
        Ok(SweepPoint {
            factor,
            data_size: data,
            measured: m,
            hit_ratio: d.hit_ratio(),
            others_cpu: others,
        })
    }
}
