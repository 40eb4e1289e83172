//! tiercache's own trace format: the requests a running server received,
//! as `tiercache trace` records them (docs/TRACE-FORMAT.md is the
//! specification; this file writes and reads it, the one place that knows
//! its layout).
//!
//! A zstd stream (the reader also takes it uncompressed) of 24-byte
//! little-endian records. A header of `header_bytes` (a multiple of 24, at
//! most 64 KiB) comes first:
//! ```text
//! 0   [u8; 8] magic "TCTRACE\0"      24  u32 block_bytes (sampling unit)
//! 8   u32 version (1)                28  u32 sample_threshold (of 2^24)
//! 12  u32 header_bytes               32  u16 volume count, 14 bytes zero
//! 16  u64 start, Unix time in ns     48  volume table: per volume u16 id,
//!                                        u8 name length, the name; zero
//!                                        padding to header_bytes
//! ```
//! then one record per request: `u64 time_ns` (since the start), `u64
//! offset` (bytes, in the volume), `u64 packed`: length in bytes in bits
//! 0-39, volume id in bits 40-55, operation in bits 56-63 (1 read, 2
//! write, 3 write-zeroes, 4 trim, 255 the end record). The end record,
//! last, carries the recording's length in `time_ns`, the requests dropped
//! in `offset` and the requests recorded in the length bits.
//!
//! Read back: reads and writes are requests (write-zeroes as writes);
//! trims and the end record carry none. The volume is the table's name for
//! the id (`volume-ID` for an id not in the table).

use super::{le_u16, le_u32, le_u64, Line, Record};
use std::collections::HashMap;
use std::io::{self, Write};
use tiercache_types::Access;

/// First bytes of a recorded trace (after decompression).
pub const MAGIC: [u8; 8] = *b"TCTRACE\0";
/// The version this file writes and reads.
pub const VERSION: u32 = 1;
/// Bytes per record (header records included).
pub(crate) const RECORD_SIZE: usize = 24;
/// The largest header the reader accepts (what it sniffs at first).
pub const MAX_HEADER_BYTES: usize = super::SNIFF_BYTES;
/// SHARDS' hash modulus: `sample_threshold` is out of it.
pub const SAMPLE_MODULUS: u32 = 1 << 24;
/// The longest length a record holds (40 bits).
pub const MAX_LEN: u64 = (1 << 40) - 1;
const END_OP: u8 = 255;
/// Mixed into the block key before hashing (any constant; fixed so that
/// two recordings at one rate sample the same blocks).
const SAMPLE_SEED: u64 = 0x7463_7472_6163_6531;

/// What a recorded request asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordedOp {
    Read = 1,
    Write = 2,
    WriteZeroes = 3,
    Trim = 4,
}

/// One request of a recorded trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    /// Nanoseconds since the start of the recording.
    pub time_ns: u64,
    /// The volume's id in the server's pool (named in the header).
    pub volume: u16,
    pub op: RecordedOp,
    /// Byte offset in the volume.
    pub offset: u64,
    /// Bytes (at most [`MAX_LEN`]).
    pub len: u64,
}

/// The header's contents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedHeader {
    /// When the recording started: Unix time in nanoseconds.
    pub start_unix_ns: u64,
    /// The sampling unit: the server's cache block size.
    pub block_bytes: u32,
    /// A block is in the trace when its hash (mod 2^24) is below this;
    /// [`SAMPLE_MODULUS`]: every block (no sampling).
    pub sample_threshold: u32,
    /// The pool's volumes: id and name (at most 255 bytes).
    pub volumes: Vec<(u16, String)>,
}

impl RecordedHeader {
    /// The share of blocks kept (1: no sampling).
    pub fn sample_rate(&self) -> f64 {
        f64::from(self.sample_threshold) / f64::from(SAMPLE_MODULUS)
    }

    /// The threshold of a sampling rate in (0, 1].
    pub fn threshold_of_rate(rate: f64) -> u32 {
        ((rate.clamp(0.0, 1.0) * f64::from(SAMPLE_MODULUS)).round() as u32).max(1)
    }

    fn encode(&self) -> io::Result<Vec<u8>> {
        let mut h = Vec::with_capacity(2 * RECORD_SIZE);
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&VERSION.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes()); // header_bytes, set below
        h.extend_from_slice(&self.start_unix_ns.to_le_bytes());
        h.extend_from_slice(&self.block_bytes.to_le_bytes());
        h.extend_from_slice(&self.sample_threshold.to_le_bytes());
        h.extend_from_slice(&(self.volumes.len() as u16).to_le_bytes());
        h.resize(2 * RECORD_SIZE, 0);
        for (id, name) in &self.volumes {
            let n = u8::try_from(name.len()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "volume name over 255 bytes")
            })?;
            h.extend_from_slice(&id.to_le_bytes());
            h.push(n);
            h.extend_from_slice(name.as_bytes());
        }
        h.resize(h.len().div_ceil(RECORD_SIZE) * RECORD_SIZE, 0);
        if h.len() > MAX_HEADER_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the volume table makes a header of {} bytes, over {MAX_HEADER_BYTES}: \
                     record fewer volumes",
                    h.len()
                ),
            ));
        }
        let len = h.len() as u32;
        h[12..16].copy_from_slice(&len.to_le_bytes());
        Ok(h)
    }

    /// Parses a header from the first bytes of a (decompressed) trace;
    /// returns it and its length in bytes.
    pub fn decode(head: &[u8]) -> Result<(RecordedHeader, usize), String> {
        if head.len() < 2 * RECORD_SIZE || head[..8] != MAGIC {
            return Err("not a tiercache recorded trace (no TCTRACE header)".into());
        }
        let version = le_u32(head, 8);
        if version != VERSION {
            return Err(format!(
                "recorded trace version {version}; this reader knows {VERSION}"
            ));
        }
        let len = le_u32(head, 12) as usize;
        if len < 2 * RECORD_SIZE || len / RECORD_SIZE * RECORD_SIZE != len || len > head.len() {
            return Err(format!(
                "header length {len} is not a multiple of {RECORD_SIZE} within the first \
                 {} bytes",
                head.len()
            ));
        }
        let count = le_u16(head, 32) as usize;
        let mut volumes = Vec::with_capacity(count);
        let mut at = 2 * RECORD_SIZE;
        for i in 0..count {
            if at + 3 > len || at + 3 + head[at + 2] as usize > len {
                return Err(format!("volume table entry {i} runs past the header"));
            }
            let n = head[at + 2] as usize;
            let name = std::str::from_utf8(&head[at + 3..at + 3 + n])
                .map_err(|_| format!("volume table entry {i}: name not UTF-8"))?;
            volumes.push((le_u16(head, at), name.to_string()));
            at += 3 + n;
        }
        Ok((
            RecordedHeader {
                start_unix_ns: le_u64(head, 16),
                block_bytes: le_u32(head, 24),
                sample_threshold: le_u32(head, 28),
                volumes,
            },
            len,
        ))
    }
}

/// Whether block `block` of volume `volume` is in a trace sampled at
/// `threshold` (SHARDS' spatial sampling: a hash of the block, so a block
/// is always in or always out and the sampled trace keeps the reuse
/// distances of the blocks it keeps).
pub fn block_sampled(volume: u16, block: u64, threshold: u32) -> bool {
    if threshold >= SAMPLE_MODULUS {
        return true;
    }
    let key = (u64::from(volume) << 48) | (block & ((1 << 48) - 1));
    (crate::rng::mix64(key ^ SAMPLE_SEED) & u64::from(SAMPLE_MODULUS - 1)) < u64::from(threshold)
}

/// The parts of the request `(offset, len)` that fall in sampled blocks of
/// `block_bytes`, as maximal runs `(offset, len)` clipped to the request.
pub fn sampled_runs(
    volume: u16,
    offset: u64,
    len: u64,
    block_bytes: u32,
    threshold: u32,
) -> Vec<(u64, u64)> {
    if threshold >= SAMPLE_MODULUS || len == 0 {
        return vec![(offset, len)];
    }
    let bs = u64::from(block_bytes.max(1));
    let end = offset.saturating_add(len);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for b in offset / bs..end.div_ceil(bs) {
        if !block_sampled(volume, b, threshold) {
            continue;
        }
        let (s, e) = ((b * bs).max(offset), ((b + 1) * bs).min(end));
        match runs.last_mut() {
            Some((o, l)) if *o + *l == s => *l += e - s,
            _ => runs.push((s, e - s)),
        }
    }
    runs
}

/// Writes a recorded trace, zstd compressed.
pub struct RecordedWriter<W: Write> {
    out: zstd::stream::write::Encoder<'static, W>,
    requests: u64,
}

impl<W: Write> RecordedWriter<W> {
    /// Starts a trace on `out` with `header`.
    pub fn new(out: W, header: &RecordedHeader) -> io::Result<Self> {
        let mut out = zstd::stream::write::Encoder::new(out, 3)?;
        out.write_all(&header.encode()?)?;
        Ok(RecordedWriter { out, requests: 0 })
    }

    pub fn write(&mut self, r: &RecordedRequest) -> io::Result<()> {
        self.requests += 1;
        self.record(
            r.time_ns,
            r.offset,
            r.len.min(MAX_LEN),
            r.volume,
            r.op as u8,
        )
    }

    fn record(
        &mut self,
        time_ns: u64,
        offset: u64,
        len: u64,
        volume: u16,
        op: u8,
    ) -> io::Result<()> {
        let mut rec = [0u8; RECORD_SIZE];
        rec[..8].copy_from_slice(&time_ns.to_le_bytes());
        rec[8..16].copy_from_slice(&offset.to_le_bytes());
        let packed = len | (u64::from(volume) << 40) | (u64::from(op) << 56);
        rec[16..].copy_from_slice(&packed.to_le_bytes());
        self.out.write_all(&rec)
    }

    /// Requests written so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Writes the end record (`duration_ns`, `dropped` requests) and ends
    /// the zstd stream; returns the output.
    pub fn finish(mut self, duration_ns: u64, dropped: u64) -> io::Result<W> {
        let requests = self.requests.min(MAX_LEN);
        self.record(duration_ns, dropped, requests, 0, END_OP)?;
        self.out.finish()
    }
}

/// Reads records after the header: the header's records are skipped.
pub(crate) struct RecordedParser {
    names: HashMap<u16, String>,
    header_records: u64,
    seen: u64,
}

impl RecordedParser {
    /// `head`: the first decompressed bytes (the whole header must be in
    /// them).
    pub fn new(head: &[u8]) -> Result<Self, String> {
        if head.is_empty() {
            // Empty input reads as no requests.
            return Ok(RecordedParser {
                names: HashMap::new(),
                header_records: 0,
                seen: 0,
            });
        }
        let (header, len) = RecordedHeader::decode(head)?;
        Ok(RecordedParser {
            names: header.volumes.into_iter().collect(),
            header_records: (len / RECORD_SIZE) as u64,
            seen: 0,
        })
    }

    pub fn parse(&mut self, rec: &[u8]) -> Result<Line<'_>, String> {
        self.seen += 1;
        if self.seen <= self.header_records {
            return Ok(Line::Skip);
        }
        let packed = le_u64(rec, 16);
        let volume = (packed >> 40) as u16;
        let access = match (packed >> 56) as u8 {
            1 => Access::Read,
            2 | 3 => Access::Write,
            4 | END_OP => return Ok(Line::Skip),
            op => return Err(format!("unknown operation {op}")),
        };
        let name = self
            .names
            .entry(volume)
            .or_insert_with(|| format!("volume-{volume}"));
        Ok(Line::Record(Record {
            time_ns: Some(le_u64(rec, 0)),
            volume: Some(name.as_str()),
            offset: le_u64(rec, 8),
            len: packed & MAX_LEN,
            access,
        }))
    }
}
