//! Delimited-text traces: MSR Cambridge, Tencent CBS, Alibaba, and a generic
//! CSV with a column mapping.
//!
//! For every CSV format a first line without any digit is taken as a header
//! and skipped (unless a generic mapping says `skip=N`).

use super::fio::shorten;
use super::{parse_time_ns, parse_u64, parse_unit, unit_name, Line, Record};
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use tiercache_types::{Access, SECTOR_SIZE};

/// Column mapping of a generic CSV trace, written as comma-separated
/// `key=value` pairs, e.g.
/// `time=0,offset=2,len=3,op=1,op_read=R,unit=sector,time_unit=us`, or
/// with an offset in sectors and a length in bytes,
/// `offset=1,len=2,offset_unit=sector,len_unit=byte`.
///
/// Keys (columns are 0-based):
/// - `offset=N` (required), `len=N` (or `fixed_len=BYTES` for traces without
///   a length column, e.g. block-id lists);
/// - `time=N` (optional; without it time is the IO counter) and
///   `time_unit=s|ms|us|ns` (default `us`; fractional values are accepted);
/// - `op=N` with `op_read=TEXT` (the value that means read; case-insensitive)
///   and optionally `op_write=TEXT` (then any other value is an error; without
///   it every non-read value is a write). Without `op` all requests are reads;
/// - `unit=byte|sector|block:BYTES|BYTES` for offset and length (default
///   `byte`); `offset_unit=` and `len_unit=` (same values) set one of the
///   two, for traces that mix sector offsets with byte lengths. Later keys
///   override earlier ones (`unit=sector,len_unit=byte`). `fixed_len` is
///   always bytes;
/// - `volume=N` (optional column naming the volume);
/// - `sep=comma|tab|space|semicolon|pipe` (default `comma`; `space` splits on
///   runs of blanks);
/// - `skip=N` header lines to skip (default: skip the first line if it has
///   no digit).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CsvMapping {
    pub time: Option<usize>,
    pub offset: usize,
    pub len: Option<usize>,
    pub fixed_len: Option<u64>,
    pub op: Option<usize>,
    pub op_read: Option<String>,
    pub op_write: Option<String>,
    pub volume: Option<usize>,
    /// Bytes per unit of the offset column.
    pub offset_unit: u64,
    /// Bytes per unit of the length column.
    pub len_unit: u64,
    /// Nanoseconds per unit of time.
    pub time_unit_ns: u64,
    pub sep: Sep,
    pub skip: Option<u64>,
}

/// Field separator of a generic CSV.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Sep {
    Char(char),
    /// Runs of spaces and tabs.
    Blanks,
}

impl FromStr for CsvMapping {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = |m: String| Error::Config(format!("csv mapping '{s}': {m}"));
        let mut m = CsvMapping {
            time: None,
            offset: usize::MAX,
            len: None,
            fixed_len: None,
            op: None,
            op_read: None,
            op_write: None,
            volume: None,
            offset_unit: 1,
            len_unit: 1,
            time_unit_ns: 1_000,
            sep: Sep::Char(','),
            skip: None,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("'{part}' is not key=value")))?;
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
            let col = || -> Result<usize> {
                v.parse::<usize>()
                    .map_err(|_| bad(format!("{k}={v}: expected a 0-based column number")))
            };
            match k.as_str() {
                "time" => m.time = Some(col()?),
                "offset" => m.offset = col()?,
                "len" | "length" | "size" => m.len = Some(col()?),
                "fixed_len" => m.fixed_len = Some(tiercache_types::parse_size(v).map_err(&bad)?),
                "op" | "type" => m.op = Some(col()?),
                "op_read" => m.op_read = Some(v.to_string()),
                "op_write" => m.op_write = Some(v.to_string()),
                "volume" | "device" => m.volume = Some(col()?),
                "unit" | "offset_unit" | "len_unit" | "length_unit" | "size_unit" => {
                    let unit = parse_unit(v).map_err(|e| bad(format!("{k}={v}: {e}")))?;
                    if k != "len_unit" && k != "length_unit" && k != "size_unit" {
                        m.offset_unit = unit;
                    }
                    if k != "offset_unit" {
                        m.len_unit = unit;
                    }
                }
                "time_unit" => {
                    m.time_unit_ns = match v.to_ascii_lowercase().as_str() {
                        "s" | "sec" | "secs" => 1_000_000_000,
                        "ms" => 1_000_000,
                        "us" => 1_000,
                        "ns" => 1,
                        "100ns" | "filetime" => 100,
                        _ => {
                            return Err(bad(format!(
                                "time_unit={v}: expected s, ms, us, ns or 100ns"
                            )))
                        }
                    }
                }
                "sep" => {
                    m.sep = match v.to_ascii_lowercase().as_str() {
                        "comma" | "," => Sep::Char(','),
                        "tab" | "\\t" => Sep::Char('\t'),
                        "semicolon" | ";" => Sep::Char(';'),
                        "pipe" | "|" => Sep::Char('|'),
                        "space" | "blank" | "whitespace" => Sep::Blanks,
                        _ => {
                            return Err(bad(format!(
                                "sep={v}: expected comma, tab, space, semicolon or pipe"
                            )))
                        }
                    }
                }
                "skip" | "header" => {
                    m.skip = Some(
                        v.parse()
                            .map_err(|_| bad(format!("skip={v}: expected a count")))?,
                    )
                }
                other => {
                    return Err(bad(format!(
                    "unknown key '{other}' (expected time, offset, len, fixed_len, op, op_read, \
                         op_write, volume, unit, offset_unit, len_unit, time_unit, sep, skip)"
                )))
                }
            }
        }
        if m.offset == usize::MAX {
            return Err(bad("offset=N is required".into()));
        }
        if m.len.is_none() && m.fixed_len.is_none() {
            return Err(bad("give len=N (a column) or fixed_len=BYTES".into()));
        }
        if m.op.is_some() && m.op_read.is_none() {
            return Err(bad(
                "op=N needs op_read=TEXT (the value meaning read)".into()
            ));
        }
        Ok(m)
    }
}

impl fmt::Display for CsvMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(t) = self.time {
            parts.push(format!("time={t}"));
        }
        parts.push(format!("offset={}", self.offset));
        if let Some(l) = self.len {
            parts.push(format!("len={l}"));
        }
        if let Some(l) = self.fixed_len {
            parts.push(format!("fixed_len={l}"));
        }
        if let Some(o) = self.op {
            parts.push(format!("op={o}"));
        }
        if let Some(r) = &self.op_read {
            parts.push(format!("op_read={r}"));
        }
        if let Some(w) = &self.op_write {
            parts.push(format!("op_write={w}"));
        }
        if let Some(v) = self.volume {
            parts.push(format!("volume={v}"));
        }
        if self.offset_unit == self.len_unit {
            parts.push(format!("unit={}", unit_name(self.offset_unit)));
        } else {
            parts.push(format!("offset_unit={}", unit_name(self.offset_unit)));
            parts.push(format!("len_unit={}", unit_name(self.len_unit)));
        }
        parts.push(format!(
            "time_unit={}",
            match self.time_unit_ns {
                1_000_000_000 => "s",
                1_000_000 => "ms",
                1_000 => "us",
                100 => "100ns",
                _ => "ns",
            }
        ));
        match self.sep {
            Sep::Char(',') => {}
            Sep::Char('\t') => parts.push("sep=tab".into()),
            Sep::Char(';') => parts.push("sep=semicolon".into()),
            Sep::Char('|') => parts.push("sep=pipe".into()),
            Sep::Char(_) | Sep::Blanks => parts.push("sep=space".into()),
        }
        if let Some(s) = self.skip {
            parts.push(format!("skip={s}"));
        }
        f.write_str(&parts.join(","))
    }
}

enum Kind {
    Msr,
    Tencent,
    Alibaba,
    Generic(CsvMapping),
}

pub(crate) struct CsvParser {
    kind: Kind,
    /// Reused buffer of field slices (as offsets, to stay lifetime-free).
    fields: Vec<(usize, usize)>,
}

const MSR_COLUMNS: &str = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime";
const TENCENT_COLUMNS: &str = "timestamp,offset,size,ioType,volumeId";
const ALIBABA_COLUMNS: &str = "device_id,opcode,offset,length,timestamp";

impl CsvParser {
    pub fn msr() -> Self {
        Self::with(Kind::Msr)
    }
    pub fn tencent() -> Self {
        Self::with(Kind::Tencent)
    }
    pub fn alibaba() -> Self {
        Self::with(Kind::Alibaba)
    }
    pub fn generic(m: CsvMapping) -> Self {
        Self::with(Kind::Generic(m))
    }
    fn with(kind: Kind) -> Self {
        CsvParser {
            kind,
            fields: Vec::with_capacity(16),
        }
    }

    fn split(&mut self, line: &str) {
        self.fields.clear();
        let sep = match &self.kind {
            Kind::Generic(m) => m.sep,
            _ => Sep::Char(','),
        };
        match sep {
            Sep::Char(c) => {
                let mut start = 0;
                for (i, ch) in line.char_indices() {
                    if ch == c {
                        self.fields.push((start, i));
                        start = i + ch.len_utf8();
                    }
                }
                self.fields.push((start, line.len()));
            }
            Sep::Blanks => {
                let mut start = None;
                for (i, ch) in line.char_indices() {
                    let blank = ch == ' ' || ch == '\t';
                    match (blank, start) {
                        (true, Some(s)) => {
                            self.fields.push((s, i));
                            start = None;
                        }
                        (false, None) => start = Some(i),
                        _ => {}
                    }
                }
                if let Some(s) = start {
                    self.fields.push((s, line.len()));
                }
            }
        }
    }

    pub fn parse<'a>(&mut self, line: &'a str, line_no: u64) -> Result<Line<'a>, String> {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            return Ok(Line::Skip);
        }
        if let Kind::Generic(CsvMapping { skip: Some(n), .. }) = &self.kind {
            if line_no <= *n {
                return Ok(Line::Skip);
            }
        } else if line_no == 1 && !t.bytes().any(|b| b.is_ascii_digit()) {
            return Ok(Line::Skip); // header
        }
        self.split(line);
        let field = |i: usize| -> &'a str {
            let (a, b) = self.fields[i];
            line[a..b].trim()
        };
        let n = self.fields.len();
        let need = |want: usize, columns: &str| -> Result<(), String> {
            if n < want {
                Err(format!(
                    "expected {want} comma-separated fields ({columns}), found {n} in '{}'",
                    shorten(line)
                ))
            } else {
                Ok(())
            }
        };
        match &self.kind {
            Kind::Msr => {
                need(7, MSR_COLUMNS)?;
                let access = parse_rw_word(field(3))?;
                Ok(Line::Record(Record {
                    time_ns: Some(parse_u64(field(0), "Timestamp")?.saturating_mul(100)),
                    volume: Some(&line[self.fields[1].0..self.fields[2].1]),
                    offset: parse_u64(field(4), "Offset")?,
                    len: parse_u64(field(5), "Size")?,
                    access,
                }))
            }
            Kind::Tencent => {
                need(5, TENCENT_COLUMNS)?;
                let access = match field(3) {
                    "0" => Access::Read,
                    "1" => Access::Write,
                    other => {
                        return Err(format!(
                            "ioType '{other}' is neither 0 (read) nor 1 (write)"
                        ))
                    }
                };
                Ok(Line::Record(Record {
                    time_ns: Some(parse_time_ns(field(0), 1_000_000_000, "timestamp")?),
                    volume: Some(field(4)),
                    offset: sectors(parse_u64(field(1), "offset")?)?,
                    len: sectors(parse_u64(field(2), "size")?)?,
                    access,
                }))
            }
            Kind::Alibaba => {
                need(5, ALIBABA_COLUMNS)?;
                let access = match field(1) {
                    "R" | "r" => Access::Read,
                    "W" | "w" => Access::Write,
                    other => return Err(format!("opcode '{other}' is neither R nor W")),
                };
                Ok(Line::Record(Record {
                    time_ns: Some(parse_time_ns(field(4), 1_000, "timestamp")?),
                    volume: Some(field(0)),
                    offset: parse_u64(field(2), "offset")?,
                    len: parse_u64(field(3), "length")?,
                    access,
                }))
            }
            Kind::Generic(m) => {
                let max_col = [Some(m.offset), m.len, m.time, m.op, m.volume]
                    .into_iter()
                    .flatten()
                    .max()
                    .unwrap_or(0);
                if n <= max_col {
                    return Err(format!(
                        "mapping uses column {max_col} but the line has {n} fields: '{}'",
                        shorten(line)
                    ));
                }
                let scale = |v: u64, unit: u64, what: &str| {
                    v.checked_mul(unit)
                        .ok_or_else(|| format!("{what} {v} is out of range"))
                };
                let offset = scale(
                    parse_u64(field(m.offset), "offset")?,
                    m.offset_unit,
                    "offset",
                )?;
                let len = match m.len {
                    Some(c) => scale(parse_u64(field(c), "length")?, m.len_unit, "length")?,
                    None => m.fixed_len.unwrap_or(0),
                };
                let access = match m.op {
                    None => Access::Read,
                    Some(c) => {
                        let v = field(c);
                        let read = m.op_read.as_deref().unwrap_or("");
                        if v.eq_ignore_ascii_case(read) {
                            Access::Read
                        } else {
                            match &m.op_write {
                                Some(w) if v.eq_ignore_ascii_case(w) => Access::Write,
                                Some(w) => {
                                    return Err(format!(
                                        "op '{v}' is neither '{read}' (read) nor '{w}' (write)"
                                    ))
                                }
                                None => Access::Write,
                            }
                        }
                    }
                };
                let time_ns = match m.time {
                    Some(c) => Some(parse_time_ns(field(c), m.time_unit_ns, "time")?),
                    None => None,
                };
                Ok(Line::Record(Record {
                    time_ns,
                    volume: m.volume.map(field),
                    offset,
                    len,
                    access,
                }))
            }
        }
    }
}

fn sectors(v: u64) -> Result<u64, String> {
    v.checked_mul(SECTOR_SIZE)
        .ok_or_else(|| format!("{v} sectors is out of range"))
}

fn parse_rw_word(s: &str) -> Result<Access, String> {
    if s.eq_ignore_ascii_case("read") {
        Ok(Access::Read)
    } else if s.eq_ignore_ascii_case("write") {
        Ok(Access::Write)
    } else {
        Err(format!("Type '{s}' is neither Read nor Write"))
    }
}
