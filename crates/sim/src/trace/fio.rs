//! fio iolog versions 2 and 3.
//!
//! ```text
//! fio version 2 iolog              fio version 3 iolog
//! /dev/sdb add                     0 /dev/sdb add
//! /dev/sdb open                    12 /dev/sdb open
//! /dev/sdb read 4096 4096          873 /dev/sdb read 4096 4096
//! /dev/sdb close                   99100 /dev/sdb close
//! ```
//! v3 timestamps are microseconds since the start of the run.

use super::{parse_time_ns, parse_u64, Line, Record};
use tiercache_types::Access;

pub(crate) struct FioParser {
    /// 2 or 3 once the header was seen.
    version: u8,
    records: u64,
}

impl FioParser {
    pub fn new() -> Self {
        FioParser {
            version: 0,
            records: 0,
        }
    }

    pub fn parse<'a>(&mut self, line: &'a str, _line_no: u64) -> Result<Line<'a>, String> {
        let t = line.trim();
        if self.version == 0 {
            if t.is_empty() {
                return Ok(Line::Skip);
            }
            if t.starts_with("fio version 2 iolog") {
                self.version = 2;
                return Ok(Line::Skip);
            }
            if t.starts_with("fio version 3 iolog") {
                self.version = 3;
                return Ok(Line::Skip);
            }
            return Err(format!(
                "expected the header 'fio version 2 iolog' or 'fio version 3 iolog', found '{}'",
                shorten(t)
            ));
        }
        if t.is_empty() {
            return Ok(Line::Skip);
        }
        let mut it = t.split_ascii_whitespace();
        let time_ns = if self.version == 3 {
            let ts = it.next().unwrap_or_default();
            Some(parse_time_ns(ts, 1_000, "timestamp")?)
        } else {
            None
        };
        let file = it.next().ok_or_else(|| "missing file name".to_string())?;
        let action = it
            .next()
            .ok_or_else(|| format!("missing action after file name '{file}'"))?;
        let access = match action {
            "read" => Access::Read,
            "write" => Access::Write,
            "add" | "open" | "close" | "sync" | "datasync" | "trim" | "wait" => {
                return Ok(Line::Skip)
            }
            other => {
                return Err(format!(
                    "unknown action '{other}' (expected read, write, trim, sync, datasync, wait, add, open or close)"
                ))
            }
        };
        let offset = parse_u64(
            it.next()
                .ok_or_else(|| format!("{action} without an offset"))?,
            "offset",
        )?;
        let len = parse_u64(
            it.next()
                .ok_or_else(|| format!("{action} without a length"))?,
            "length",
        )?;
        if let Some(extra) = it.next() {
            return Err(format!("unexpected field '{extra}' after the length"));
        }
        self.records += 1;
        Ok(Line::Record(Record {
            time_ns,
            volume: Some(file),
            offset,
            len,
            access,
        }))
    }

    pub fn finish(&self) -> Result<(), String> {
        if self.version == 0 {
            return Err("empty input: no 'fio version N iolog' header".into());
        }
        Ok(())
    }
}

pub(crate) fn shorten(s: &str) -> String {
    if s.len() <= 60 {
        s.to_string()
    } else {
        let mut end = 57;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}...", &s[..end])
    }
}
