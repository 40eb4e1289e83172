//! The SPC trace format (Storage Performance Council, "SPC Trace File
//! Format Specification" 1.0.1), in which the UMass Trace Repository
//! publishes the OLTP traces Financial1/2 and the WebSearch1-3 traces:
//!
//! ```text
//! 0,20941264,8192,W,0.551706
//! 1,1315496,4096,r,0.554041
//! ```
//! One request per line, `ASU,LBA,Size,Opcode,Timestamp`, then optional
//! fields (ignored): ASU is the application specific storage unit (a volume
//! number), LBA its 512-byte sector, Size bytes, Opcode `r`/`R` (read) or
//! `w`/`W` (write), Timestamp seconds (with a fraction) since the start of
//! the trace.
//!
//! Every ASU is a volume named by its number as written, so ASUs never share
//! blocks: with [`super::VolumeMode::Separate`] (the default) the i-th ASU
//! seen gets the address range starting at `i << 50`, as the volumes of
//! every other format; `VolumeMode::Only("1")` keeps ASU 1 alone, `Merge`
//! lays them all on one range. Empty lines, `#` comments and a first line
//! without digits (a header) are skipped.

use super::fio::shorten;
use super::{parse_time_ns, parse_u64, Line, Record};
use tiercache_types::{Access, SECTOR_SIZE};

pub(crate) struct SpcParser;

const COLUMNS: &str = "ASU,LBA,Size,Opcode,Timestamp";

impl SpcParser {
    pub fn new() -> Self {
        SpcParser
    }

    pub fn parse<'a>(&mut self, line: &'a str, line_no: u64) -> Result<Line<'a>, String> {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            return Ok(Line::Skip);
        }
        if line_no == 1 && !t.bytes().any(|b| b.is_ascii_digit()) {
            return Ok(Line::Skip);
        }
        let mut f = t.splitn(6, ',').map(str::trim);
        let mut next = || f.next().filter(|s| !s.is_empty());
        let (Some(asu), Some(lba), Some(size), Some(op), Some(ts)) =
            (next(), next(), next(), next(), next())
        else {
            return Err(format!(
                "expected 5 comma-separated fields ({COLUMNS}), found fewer in '{}'",
                shorten(line)
            ));
        };
        parse_u64(asu, "ASU")?;
        let access = match op {
            "r" | "R" => Access::Read,
            "w" | "W" => Access::Write,
            other => return Err(format!("Opcode '{other}' is neither r nor w")),
        };
        let lba = parse_u64(lba, "LBA")?;
        Ok(Line::Record(Record {
            time_ns: Some(parse_time_ns(ts, 1_000_000_000, "Timestamp")?),
            volume: Some(asu),
            offset: lba
                .checked_mul(SECTOR_SIZE)
                .ok_or_else(|| format!("LBA {lba} is out of range"))?,
            len: parse_u64(size, "Size")?,
            access,
        }))
    }
}

/// Whether a line has the shape of an SPC record (for format detection).
pub(crate) fn looks_like_record(fields: &[&str]) -> bool {
    let is_num = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let is_time = |s: &str| {
        !s.is_empty()
            && s.bytes().any(|b| b.is_ascii_digit())
            && s.bytes().all(|b| b.is_ascii_digit() || b == b'.')
    };
    fields.len() >= 5
        && is_num(fields[0])
        && is_num(fields[1])
        && is_num(fields[2])
        && matches!(fields[3], "r" | "R" | "w" | "W")
        && is_time(fields[4])
}
