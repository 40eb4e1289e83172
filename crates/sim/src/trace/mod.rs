//! Trace readers: streaming iterators of [`Request`]s read from block IO
//! traces in the common public formats.
//!
//! Every reader works in constant memory (one line at a time, at most
//! [`MAX_LINE_BYTES`] long, so input without newlines fails instead of
//! filling memory, or one fixed-size record at a time for the binary
//! formats; the only state that grows is the table of volume names, one
//! entry of at most [`MAX_VOLUME_NAME_BYTES`] per volume), reads gzip- or
//! zstd-compressed input directly (detected by magic bytes, not by file
//! name), and reports a malformed line as [`Error::Parse`] with the 1-based
//! line number, a malformed or cut-short binary record as [`Error::Record`]
//! with the 1-based record number and its byte offset.
//!
//! Formats ([`TraceFormat`]):
//! - `fio` iolog version 2 and 3 ("Trace file format" in fio's HOWTO). v2 has
//!   no timestamps; v3 lines start with a timestamp in microseconds since the
//!   start of the run (what fio's `write_iolog` writes and its replay
//!   expects). File actions (`add`, `open`, `close`) and `sync`, `datasync`,
//!   `trim`, `wait` are skipped; every file is a volume.
//! - `blkparse` default text output. Only Q (queue) events are used by
//!   default: they are the requests as submitted to the device, which is what
//!   a cache stacked on that device would see. C (complete) events can be
//!   chosen instead with [`TraceOptions::blkparse_event`]. RWBS with `D`
//!   (discard) or without `R`/`W` (flush only) is skipped, so are the summary
//!   lines blkparse prints at the end. Each `major,minor` is a volume.
//! - `msr`: MSR Cambridge CSV `Timestamp,Hostname,DiskNumber,Type,Offset,Size,
//!   ResponseTime`; Timestamp is a Windows filetime (100 ns units); offset and
//!   size in bytes. Volume = `Hostname,DiskNumber` as written (`hm,0`).
//! - `tencent`: Tencent CBS CSV `timestamp(s),offset(sectors),size(sectors),
//!   ioType(0=read,1=write),volumeId`.
//! - `alibaba`: Alibaba block trace CSV `device_id,opcode(R/W),offset(bytes),
//!   length(bytes),timestamp(us)`.
//! - `spc`: SPC CSV (UMass Financial and WebSearch traces) `ASU,LBA(sectors),
//!   Size(bytes),Opcode(r/w),Timestamp(s)`; each ASU is a volume.
//! - `vscsi`: libCacheSim's binary CloudPhysics format, VSCSI1 (32-byte
//!   records) or VSCSI2 (40-byte records), detected from the data; timestamp
//!   in us, LBA in sectors, length in bytes, SCSI command (read or write;
//!   other commands skipped). Found by format detection too.
//! - `oracleGeneral[:UNIT]`: libCacheSim's binary 24-byte records (`u32
//!   clock_time(s), u64 obj_id, u32 obj_size(bytes), i64 next_access_vtime`);
//!   all reads; `obj_id` is the offset in UNIT (`byte` by default, `sector`
//!   for libCacheSim's CloudPhysics conversions, `block:BYTES`). Not
//!   detected: name it.
//! - `tiercache`: what `tiercache trace` records from a running server
//!   (`recorded.rs`, docs/TRACE-FORMAT.md): a header naming the volumes,
//!   then 24-byte records (time in ns, volume, read/write/write-zeroes/trim,
//!   offset, length); write-zeroes read as writes, trims skipped. Found by
//!   format detection (its magic number).
//! - `csv:MAPPING`: any delimited text with a column mapping such as
//!   `time=0,offset=2,len=3,op=1,op_read=R,unit=sector,time_unit=us` or with
//!   separate units, `offset_unit=sector,len_unit=byte`; see [`CsvMapping`].
//!
//! Time: [`Request::time`] is in nanoseconds relative to the first record
//! with a timestamp (records that go back in time get 0 rather than wrap).
//! A format without timestamps (fio v2, a CSV mapping without `time`) gets
//! the IO counter instead: the n-th request (0-based) has `Time(n)`.
//!
//! Volumes: a trace can interleave several disks. By default
//! ([`VolumeMode::Separate`]) each volume gets its own address range, the
//! i-th volume seen starting at `i << 50` (1 PiB apart); offsets at or past
//! 1 PiB are an error then. [`VolumeMode::Merge`] ignores volume names and
//! [`VolumeMode::Only`] keeps one volume and drops the rest.

mod blkparse;
mod csv;
mod fio;
mod oracle;
pub mod recorded;
mod spc;
mod vscsi;

pub use csv::CsvMapping;

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tiercache_types::{Access, Time, SECTOR_SIZE};

/// One IO as the cache would see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Virtual time: nanoseconds since the first request, or the IO counter
    /// for traces without timestamps.
    pub time: Time,
    /// Byte offset on the (possibly volume-prefixed) origin device.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    pub access: Access,
}

/// Distance between volumes in [`VolumeMode::Separate`]: 1 PiB.
pub const VOLUME_SHIFT: u32 = 50;

/// Which blkparse events to turn into requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlkEvent {
    /// Q: queued, as submitted by the layer above (the default).
    #[default]
    Queue,
    /// C: completed (after merging and splitting in the IO scheduler).
    Complete,
}

/// How to treat traces that interleave several volumes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum VolumeMode {
    /// Each volume in its own 1 PiB address range (the default).
    #[default]
    Separate,
    /// One address space; volume names are ignored.
    Merge,
    /// Keep only the named volume (as the format names it: `hm,0` for MSR,
    /// `8,0` for blkparse, the file name for fio, the id for Tencent and
    /// Alibaba).
    Only(String),
}

/// A trace format, named on the command line as shown by `Display`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TraceFormat {
    /// fio iolog, version 2 or 3 (the header line says which).
    Fio,
    Blkparse,
    Msr,
    Tencent,
    Alibaba,
    /// SPC (UMass Financial, WebSearch): one volume per ASU.
    Spc,
    /// libCacheSim vscsi, VSCSI1 or VSCSI2 (detected from the data).
    Vscsi,
    /// libCacheSim oracleGeneral; the value is the bytes per `obj_id`.
    OracleGeneral(oracle::ObjUnit),
    Csv(CsvMapping),
    /// tiercache's own, recorded by `tiercache trace`.
    Recorded,
}

impl TraceFormat {
    /// The names accepted by `FromStr`.
    pub const NAMES: &'static str =
        "fio, blkparse, msr, tencent, alibaba, spc, vscsi, oracleGeneral[:byte|sector|block:BYTES], \
         tiercache, csv:MAPPING";

    /// Whether the format is binary (fixed-size records, not lines).
    pub fn is_binary(&self) -> bool {
        matches!(
            self,
            TraceFormat::Vscsi | TraceFormat::OracleGeneral(_) | TraceFormat::Recorded
        )
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceFormat::Fio => f.write_str("fio"),
            TraceFormat::Blkparse => f.write_str("blkparse"),
            TraceFormat::Msr => f.write_str("msr"),
            TraceFormat::Tencent => f.write_str("tencent"),
            TraceFormat::Alibaba => f.write_str("alibaba"),
            TraceFormat::Spc => f.write_str("spc"),
            TraceFormat::Vscsi => f.write_str("vscsi"),
            TraceFormat::OracleGeneral(1) => f.write_str("oracleGeneral"),
            TraceFormat::OracleGeneral(u) => write!(f, "oracleGeneral:{}", unit_name(*u)),
            TraceFormat::Csv(m) => write!(f, "csv:{m}"),
            TraceFormat::Recorded => f.write_str("tiercache"),
        }
    }
}

impl FromStr for TraceFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let lower = s.trim().to_ascii_lowercase();
        Ok(match lower.as_str() {
            "fio" | "iolog" | "fio-iolog" => TraceFormat::Fio,
            "blkparse" | "blktrace" => TraceFormat::Blkparse,
            "msr" | "msr-cambridge" => TraceFormat::Msr,
            "tencent" | "tencent-cbs" | "cbs" => TraceFormat::Tencent,
            "alibaba" | "ali" => TraceFormat::Alibaba,
            "spc" | "umass" => TraceFormat::Spc,
            "vscsi" | "cloudphysics" => TraceFormat::Vscsi,
            "oraclegeneral" | "oracle-general" | "oracle" => TraceFormat::OracleGeneral(1),
            "tiercache" | "recorded" | "tctrace" => TraceFormat::Recorded,
            _ => {
                let oracle = ["oraclegeneral:", "oracle-general:", "oracle:"]
                    .iter()
                    .find_map(|p| lower.strip_prefix(p));
                if let Some(m) = s.trim().strip_prefix("csv:") {
                    TraceFormat::Csv(m.parse()?)
                } else if let Some(unit) = oracle {
                    TraceFormat::OracleGeneral(
                        parse_unit(unit)
                            .map_err(|m| Error::Config(format!("trace format '{s}': {m}")))?,
                    )
                } else {
                    return Err(Error::Config(format!(
                        "unknown trace format '{s}' (expected one of: {})",
                        TraceFormat::NAMES
                    )));
                }
            }
        })
    }
}

/// How to open a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceOptions {
    /// `None`: detect from the first lines.
    pub format: Option<TraceFormat>,
    pub blkparse_event: BlkEvent,
    pub volumes: VolumeMode,
}

/// One parsed line before time and volume are resolved.
pub(crate) struct Record<'a> {
    /// Absolute time in ns, if the format has one.
    pub time_ns: Option<u64>,
    pub volume: Option<&'a str>,
    pub offset: u64,
    pub len: u64,
    pub access: Access,
}

/// What a line parser makes of a line.
pub(crate) enum Line<'a> {
    Record(Record<'a>),
    /// A line that carries no IO (comment, header, file action, flush...).
    Skip,
}

pub(crate) enum Parser {
    Fio(fio::FioParser),
    Blkparse(blkparse::BlkparseParser),
    Csv(csv::CsvParser),
    Spc(spc::SpcParser),
    /// `None`: the input is empty.
    Vscsi(Option<vscsi::VscsiParser>),
    Oracle(oracle::OracleParser),
    Recorded(recorded::RecordedParser),
}

impl Parser {
    /// `head`: the first bytes of the decompressed input, for the binary
    /// formats that tell their layout from the data. Errors are messages
    /// about the first record.
    fn new(format: &TraceFormat, opts: &TraceOptions, head: &[u8]) -> Result<Parser, String> {
        Ok(match format {
            TraceFormat::Fio => Parser::Fio(fio::FioParser::new()),
            TraceFormat::Blkparse => {
                Parser::Blkparse(blkparse::BlkparseParser::new(opts.blkparse_event))
            }
            TraceFormat::Msr => Parser::Csv(csv::CsvParser::msr()),
            TraceFormat::Tencent => Parser::Csv(csv::CsvParser::tencent()),
            TraceFormat::Alibaba => Parser::Csv(csv::CsvParser::alibaba()),
            TraceFormat::Spc => Parser::Spc(spc::SpcParser::new()),
            TraceFormat::Vscsi => Parser::Vscsi(vscsi::VscsiParser::detect(head)?),
            TraceFormat::OracleGeneral(unit) => Parser::Oracle(oracle::OracleParser::new(*unit)),
            TraceFormat::Csv(m) => Parser::Csv(csv::CsvParser::generic(m.clone())),
            TraceFormat::Recorded => Parser::Recorded(recorded::RecordedParser::new(head)?),
        })
    }

    /// Bytes per record of a binary format; `None` for text (lines).
    fn record_size(&self) -> Option<usize> {
        match self {
            // No parser: the input is empty, any size reads nothing.
            Parser::Vscsi(p) => Some(p.as_ref().map_or(1, |p| p.record_size())),
            Parser::Oracle(_) => Some(oracle::RECORD_SIZE),
            Parser::Recorded(_) => Some(recorded::RECORD_SIZE),
            _ => None,
        }
    }

    /// Parses one line (without its newline). Errors are messages without
    /// location; the caller adds file and line.
    fn parse<'a>(&mut self, line: &'a str, line_no: u64) -> Result<Line<'a>, String> {
        match self {
            Parser::Fio(p) => p.parse(line, line_no),
            Parser::Blkparse(p) => p.parse(line),
            Parser::Csv(p) => p.parse(line, line_no),
            Parser::Spc(p) => p.parse(line, line_no),
            Parser::Vscsi(_) | Parser::Oracle(_) | Parser::Recorded(_) => {
                Err("binary format read as text".into())
            }
        }
    }

    /// Parses one whole binary record of `record_size()` bytes.
    fn parse_record(&mut self, rec: &[u8]) -> Result<Line<'_>, String> {
        match self {
            Parser::Vscsi(Some(p)) => p.parse(rec),
            Parser::Oracle(p) => p.parse(rec),
            Parser::Recorded(p) => p.parse(rec),
            _ => Err("not a binary format".into()),
        }
    }

    fn finish(&self) -> Result<(), String> {
        match self {
            Parser::Fio(p) => p.finish(),
            Parser::Blkparse(p) => p.finish(),
            _ => Ok(()),
        }
    }
}

/// Counts bytes read from the underlying (possibly compressed) file.
struct CountingReader<R> {
    inner: R,
    count: Arc<AtomicU64>,
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// "BZh" and the block size, '1' to '9' (the Tencent CBS traces ship as
/// bzip2).
const BZIP2_MAGIC: [u8; 3] = *b"BZh";
/// How much decompressed text format detection looks at.
const SNIFF_BYTES: usize = 64 * 1024;
/// The longest line a reader accepts, without its newline. Real trace lines
/// are under 200 bytes; a longer one means binary or garbled input (or a
/// decompression bomb without newlines) and is an [`Error::Parse`].
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// The longest volume name kept in [`VolumeMode::Separate`] (Linux's
/// PATH_MAX, for fio file names). With at most 16384 volumes this bounds the
/// volume table at 64 MiB.
pub const MAX_VOLUME_NAME_BYTES: usize = 4096;

/// Wraps `raw` in a decompressor if its first bytes are a gzip, zstd or
/// bzip2 magic number (concatenated streams are read through, as `zcat`,
/// `zstdcat` and `bzcat` do).
pub fn decompress<'r>(raw: impl Read + Send + 'r) -> std::io::Result<Box<dyn BufRead + Send + 'r>> {
    let mut raw = BufReader::with_capacity(256 * 1024, raw);
    // One fill is enough for files and pipes; a reader that hands out fewer
    // than 4 bytes at first is read as plain text.
    let buf = raw.fill_buf()?;
    let magic = buf[..buf.len().min(4)].to_vec();
    if magic.starts_with(&GZIP_MAGIC) {
        Ok(Box::new(BufReader::with_capacity(
            256 * 1024,
            flate2::bufread::MultiGzDecoder::new(raw),
        )))
    } else if magic.starts_with(&ZSTD_MAGIC) {
        Ok(Box::new(BufReader::with_capacity(
            256 * 1024,
            zstd::stream::read::Decoder::with_buffer(raw)?,
        )))
    } else if magic.starts_with(&BZIP2_MAGIC) && matches!(magic.get(3), Some(b'1'..=b'9')) {
        Ok(Box::new(BufReader::with_capacity(
            256 * 1024,
            bzip2::bufread::MultiBzDecoder::new(raw),
        )))
    } else {
        Ok(Box::new(raw))
    }
}

/// Guesses the format of binary input from its first bytes: a NUL byte
/// (never in a text trace) and vscsi version fields that fit. Returns `None`
/// when nothing fits (oracleGeneral records cannot be told from other data).
pub fn detect_binary_format(head: &[u8]) -> Option<TraceFormat> {
    if head.starts_with(&recorded::MAGIC) {
        return Some(TraceFormat::Recorded);
    }
    if !head.contains(&0) {
        return None;
    }
    match vscsi::VscsiParser::detect(head) {
        Ok(Some(_)) => Some(TraceFormat::Vscsi),
        _ => None,
    }
}

/// Guesses the format from the first lines of (decompressed) text.
/// Returns `None` when nothing fits.
pub fn detect_format(head: &str) -> Option<TraceFormat> {
    let lines: Vec<&str> = head
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .take(16)
        .collect();
    let first = *lines.first()?;
    if first.starts_with("fio version 2 iolog") || first.starts_with("fio version 3 iolog") {
        return Some(TraceFormat::Fio);
    }
    if lines.iter().any(|l| blkparse::looks_like_event(l)) {
        return Some(TraceFormat::Blkparse);
    }
    // CSV formats: judge by the data lines (skip a header without digits).
    let data: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.bytes().any(|b| b.is_ascii_digit()))
        .take(8)
        .collect();
    if data.is_empty() {
        return None;
    }
    let all = |f: &dyn Fn(&[&str]) -> bool| {
        data.iter().all(|l| {
            let fields: Vec<&str> = l.split(',').map(str::trim).collect();
            f(&fields)
        })
    };
    let is_num = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if all(&|f| {
        f.len() == 7
            && is_num(f[0])
            && (f[3].eq_ignore_ascii_case("read") || f[3].eq_ignore_ascii_case("write"))
    }) {
        return Some(TraceFormat::Msr);
    }
    if all(&|f| {
        f.len() == 5
            && (f[1].eq_ignore_ascii_case("r") || f[1].eq_ignore_ascii_case("w"))
            && is_num(f[2])
            && is_num(f[3])
    }) {
        return Some(TraceFormat::Alibaba);
    }
    if all(&|f| f.len() == 5 && f[..4].iter().all(|x| is_num(x)) && (f[3] == "0" || f[3] == "1")) {
        return Some(TraceFormat::Tencent);
    }
    if all(&|f| spc::looks_like_record(f)) {
        return Some(TraceFormat::Spc);
    }
    None
}

/// A streaming trace reader. Yields requests until the end of input or the
/// first error (after which it yields nothing).
pub struct TraceReader {
    input: Box<dyn BufRead + Send>,
    parser: Parser,
    format: TraceFormat,
    /// Bytes per record of a binary format; `None`: lines of text.
    record_size: Option<usize>,
    /// Lines (or records) read so far.
    line_no: u64,
    buf: Vec<u8>,
    done: bool,
    resolver: Resolver,
    raw_bytes: Arc<AtomicU64>,
    raw_total: Option<u64>,
}

/// Turns parsed records into requests: volume prefixes and relative time.
struct Resolver {
    source_name: String,
    volumes_mode: VolumeMode,
    volumes: HashMap<String, u64>,
    index: u64,
    first_time: Option<u64>,
    saw_time: bool,
}

impl fmt::Debug for TraceReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceReader")
            .field("source", &self.resolver.source_name)
            .field("format", &self.format)
            .field("line", &self.line_no)
            .finish()
    }
}

/// Opens a trace file (or `-` for standard input).
pub fn open_trace(path: &Path, opts: &TraceOptions) -> Result<TraceReader> {
    let name = path.display().to_string();
    let count = Arc::new(AtomicU64::new(0));
    if name == "-" {
        let raw = CountingReader {
            inner: std::io::stdin(),
            count: count.clone(),
        };
        return TraceReader::from_reader(raw, &name, opts, count, None);
    }
    let file = std::fs::File::open(path).map_err(|e| Error::io(&name, e))?;
    let total = file.metadata().ok().map(|m| m.len());
    let raw = CountingReader {
        inner: file,
        count: count.clone(),
    };
    TraceReader::from_reader(raw, &name, opts, count, total)
}

impl TraceReader {
    /// A reader over any byte stream (compressed or not). `source_name` is
    /// used in error messages.
    pub fn new(
        raw: impl Read + Send + 'static,
        source_name: &str,
        opts: &TraceOptions,
    ) -> Result<Self> {
        let count = Arc::new(AtomicU64::new(0));
        let raw = CountingReader {
            inner: raw,
            count: count.clone(),
        };
        Self::from_reader(raw, source_name, opts, count, None)
    }

    fn from_reader(
        raw: impl Read + Send + 'static,
        source_name: &str,
        opts: &TraceOptions,
        raw_bytes: Arc<AtomicU64>,
        raw_total: Option<u64>,
    ) -> Result<Self> {
        let mut text = decompress(raw).map_err(|e| Error::io(source_name, e))?;
        // Read a prefix for detection, then put it back in front.
        let mut head = Vec::with_capacity(SNIFF_BYTES);
        (&mut text)
            .take(SNIFF_BYTES as u64)
            .read_to_end(&mut head)
            .map_err(|e| Error::io(source_name, e))?;
        let format = match &opts.format {
            Some(f) => f.clone(),
            None => detect_binary_format(&head)
                .or_else(|| detect_format(&String::from_utf8_lossy(&head)))
                .ok_or_else(|| {
                    Error::Config(format!(
                        "{source_name}: cannot tell the trace format from its first lines; \
                         name it explicitly (one of: {})",
                        TraceFormat::NAMES
                    ))
                })?,
        };
        let parser =
            Parser::new(&format, opts, &head).map_err(|m| Error::record(source_name, 1, 0, m))?;
        let input: Box<dyn BufRead + Send> = Box::new(BufReader::with_capacity(
            256 * 1024,
            std::io::Cursor::new(head).chain(text),
        ));
        Ok(TraceReader {
            input,
            record_size: parser.record_size(),
            parser,
            format,
            line_no: 0,
            buf: Vec::with_capacity(256),
            done: false,
            resolver: Resolver {
                source_name: source_name.to_string(),
                volumes_mode: opts.volumes.clone(),
                volumes: HashMap::new(),
                index: 0,
                first_time: None,
                saw_time: false,
            },
            raw_bytes,
            raw_total,
        })
    }

    pub fn format(&self) -> &TraceFormat {
        &self.format
    }

    /// (bytes of the file consumed so far, file size if known): for progress.
    pub fn progress_bytes(&self) -> (u64, Option<u64>) {
        (self.raw_bytes.load(Ordering::Relaxed), self.raw_total)
    }

    /// Whether the records read so far carried timestamps (else
    /// [`Request::time`] is the IO counter).
    pub fn has_timestamps(&self) -> bool {
        self.resolver.saw_time
    }

    /// The volumes seen so far and their index (offset prefix `i << 50`).
    pub fn volumes(&self) -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = self
            .resolver
            .volumes
            .iter()
            .map(|(k, &i)| (k.clone(), i))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }

    fn next_request(&mut self) -> Result<Option<Request>> {
        if let Some(size) = self.record_size {
            return self.next_binary(size);
        }
        loop {
            self.buf.clear();
            // One byte over the limit tells a line of exactly MAX_LINE_BYTES
            // plus its newline from a longer one.
            let n = (&mut self.input)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| Error::io(&self.resolver.source_name, e))?;
            if n == 0 {
                self.parser
                    .finish()
                    .map_err(|m| Error::parse(&self.resolver.source_name, self.line_no, m))?;
                return Ok(None);
            }
            self.line_no += 1;
            let line_no = self.line_no;
            if n > MAX_LINE_BYTES && self.buf.last() != Some(&b'\n') {
                return Err(Error::parse(
                    &self.resolver.source_name,
                    line_no,
                    format!("line longer than {MAX_LINE_BYTES} bytes; is this a text trace?"),
                ));
            }
            let line = std::str::from_utf8(&self.buf).map_err(|_| {
                Error::parse(
                    &self.resolver.source_name,
                    line_no,
                    "line is not valid UTF-8 text",
                )
            })?;
            let line = line.trim_end_matches(['\n', '\r']);
            let rec = match self.parser.parse(line, line_no) {
                Ok(Line::Skip) => continue,
                Ok(Line::Record(r)) => r,
                Err(m) => return Err(Error::parse(&self.resolver.source_name, line_no, m)),
            };
            match self.resolver.resolve(rec) {
                Ok(Some(r)) => return Ok(Some(r)),
                Ok(None) => continue,
                Err(m) => return Err(Error::parse(&self.resolver.source_name, line_no, m)),
            }
        }
    }

    /// The next request of a binary trace of `size`-byte records.
    fn next_binary(&mut self, size: usize) -> Result<Option<Request>> {
        loop {
            self.buf.resize(size, 0);
            let mut got = 0;
            while got < size {
                match self.input.read(&mut self.buf[got..size]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::io(&self.resolver.source_name, e)),
                }
            }
            if got == 0 {
                return Ok(None);
            }
            let record = self.line_no + 1;
            self.line_no = record;
            let byte = (record - 1).saturating_mul(size as u64);
            let bad = |r: &Resolver, m: String| Error::record(&r.source_name, record, byte, m);
            if got < size {
                return Err(bad(
                    &self.resolver,
                    format!("truncated: the last record has {got} of its {size} bytes"),
                ));
            }
            let rec = match self.parser.parse_record(&self.buf[..size]) {
                Ok(Line::Skip) => continue,
                Ok(Line::Record(r)) => r,
                Err(m) => return Err(bad(&self.resolver, m)),
            };
            match self.resolver.resolve(rec) {
                Ok(Some(r)) => return Ok(Some(r)),
                Ok(None) => continue,
                Err(m) => return Err(bad(&self.resolver, m)),
            }
        }
    }
}

impl Resolver {
    /// The request of a parsed record, `None` for one of a volume left out
    /// ([`VolumeMode::Only`]). Errors are messages without location.
    fn resolve(&mut self, rec: Record<'_>) -> Result<Option<Request>, String> {
        let mut offset = rec.offset;
        match (&self.volumes_mode, rec.volume) {
            (VolumeMode::Merge, _) | (_, None) => {}
            (VolumeMode::Only(want), Some(v)) => {
                if v != want {
                    return Ok(None);
                }
            }
            (VolumeMode::Separate, Some(v)) => {
                let next = self.volumes.len() as u64;
                let idx = match self.volumes.get(v) {
                    Some(&i) => i,
                    None => {
                        if v.len() > MAX_VOLUME_NAME_BYTES {
                            return Err(format!(
                                "volume name longer than {MAX_VOLUME_NAME_BYTES} bytes"
                            ));
                        }
                        if next >= 1 << (64 - VOLUME_SHIFT) {
                            return Err(
                                "more than 16384 volumes; use VolumeMode::Merge or Only".into()
                            );
                        }
                        self.volumes.insert(v.to_string(), next);
                        next
                    }
                };
                if offset >= 1 << VOLUME_SHIFT {
                    return Err(format!(
                        "offset {offset} is past 1 PiB; volumes cannot be kept apart \
                         (use VolumeMode::Merge)"
                    ));
                }
                offset |= idx << VOLUME_SHIFT;
            }
        }
        let time = match rec.time_ns {
            Some(t) => {
                self.saw_time = true;
                let first = *self.first_time.get_or_insert(t);
                Time(t.saturating_sub(first))
            }
            None => Time(self.index),
        };
        self.index += 1;
        Ok(Some(Request {
            time,
            offset,
            len: rec.len,
            access: rec.access,
        }))
    }
}

impl Iterator for TraceReader {
    type Item = Result<Request>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_request() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Bytes per unit for `byte`, `sector`, `block:SIZE` or a plain size
/// (`512`, `4k`); never 0.
pub(crate) fn parse_unit(v: &str) -> Result<u64, String> {
    let unit = match v.trim().to_ascii_lowercase().as_str() {
        "byte" | "bytes" | "b" => 1,
        "sector" | "sectors" => SECTOR_SIZE,
        other => tiercache_types::parse_size(other.strip_prefix("block:").unwrap_or(other))
            .map_err(|_| format!("unit '{v}': expected byte, sector, block:BYTES or BYTES"))?,
    };
    if unit == 0 {
        return Err(format!("unit '{v}' must not be 0"));
    }
    Ok(unit)
}

/// The name `parse_unit` reads back as `unit`.
pub(crate) fn unit_name(unit: u64) -> String {
    match unit {
        1 => "byte".into(),
        SECTOR_SIZE => "sector".into(),
        b => format!("block:{b}"),
    }
}

/// Little-endian integers at a byte offset of a binary record (which the
/// caller has checked is long enough).
pub(crate) fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Parses an unsigned decimal integer, with a message naming the field.
pub(crate) fn parse_u64(s: &str, what: &str) -> Result<u64, String> {
    let t = s.trim();
    t.parse::<u64>()
        .map_err(|_| format!("{what} '{t}' is not an unsigned integer"))
}

/// Parses a non-negative decimal number (integer or with a fraction) and
/// multiplies it by `scale_ns`, giving nanoseconds. Integers are exact.
pub(crate) fn parse_time_ns(s: &str, scale_ns: u64, what: &str) -> Result<u64, String> {
    let t = s.trim();
    if let Ok(v) = t.parse::<u64>() {
        return v
            .checked_mul(scale_ns)
            .ok_or_else(|| format!("{what} '{t}' is too large"));
    }
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok((v * scale_ns as f64).round() as u64),
        _ => Err(format!("{what} '{t}' is not a non-negative number")),
    }
}

#[cfg(test)]
mod tests;
