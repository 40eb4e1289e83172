//! blkparse's default text output.
//!
//! ```text
//!   8,0    3        1     0.000000000   697  Q  WS 3417048 + 8 [kjournald]
//!   8,0    3        2     0.000001829   697  G  WS 3417048 + 8 [kjournald]
//!   8,0    1       11     0.009507758     0  C   R 1984 + 8 [0]
//! ```
//! Fields: device, cpu, sequence, seconds.nanoseconds, pid, action, RWBS,
//! then `sector + count` for events that carry a range. Lines that are not
//! events (the per-CPU and total summaries at the end) are skipped; an event
//! of the chosen kind with a read or write RWBS but no valid range is an
//! error.

use super::{parse_u64, BlkEvent, Line, Record};
use tiercache_types::{Access, SECTOR_SIZE};

pub(crate) struct BlkparseParser {
    event: BlkEvent,
    events: u64,
}

/// Whether `line` has the shape of a blkparse event line.
pub(crate) fn looks_like_event(line: &str) -> bool {
    let f: Vec<&str> = line.split_ascii_whitespace().take(7).collect();
    f.len() == 7
        && is_dev(f[0])
        && f[1].bytes().all(|b| b.is_ascii_digit())
        && f[2].bytes().all(|b| b.is_ascii_digit())
        && is_time(f[3])
        && f[4].bytes().all(|b| b.is_ascii_digit())
        && f[5].bytes().all(|b| b.is_ascii_uppercase())
}

fn is_dev(s: &str) -> bool {
    match s.split_once(',') {
        Some((a, b)) => {
            !a.is_empty()
                && !b.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

fn is_time(s: &str) -> bool {
    match s.split_once('.') {
        Some((a, b)) => {
            !a.is_empty()
                && a.bytes().all(|c| c.is_ascii_digit())
                && b.bytes().all(|c| c.is_ascii_digit())
        }
        None => false,
    }
}

/// `secs.fraction` to nanoseconds, exactly.
fn parse_secs_ns(s: &str) -> Result<u64, String> {
    let (secs, frac) = s
        .split_once('.')
        .ok_or_else(|| format!("time '{s}' is not seconds.nanoseconds"))?;
    let secs = parse_u64(secs, "time")?;
    let mut ns: u64 = 0;
    let digits = frac.as_bytes();
    for i in 0..9 {
        ns = ns * 10
            + match digits.get(i) {
                Some(d) if d.is_ascii_digit() => (d - b'0') as u64,
                Some(_) => return Err(format!("time '{s}' is not seconds.nanoseconds")),
                None => 0,
            };
    }
    secs.checked_mul(1_000_000_000)
        .and_then(|x| x.checked_add(ns))
        .ok_or_else(|| format!("time '{s}' is too large"))
}

impl BlkparseParser {
    pub fn new(event: BlkEvent) -> Self {
        BlkparseParser { event, events: 0 }
    }

    pub fn parse<'a>(&mut self, line: &'a str) -> Result<Line<'a>, String> {
        if !looks_like_event(line) {
            return Ok(Line::Skip);
        }
        let f: Vec<&'a str> = line.split_ascii_whitespace().collect();
        let want = match self.event {
            BlkEvent::Queue => "Q",
            BlkEvent::Complete => "C",
        };
        if f[5] != want {
            return Ok(Line::Skip);
        }
        let rwbs = f[6];
        if rwbs.contains('D') {
            return Ok(Line::Skip);
        }
        let access = if rwbs.contains('W') {
            Access::Write
        } else if rwbs.contains('R') {
            Access::Read
        } else {
            return Ok(Line::Skip); // flush or other payload-less request
        };
        if f.len() < 10 || f[8] != "+" {
            if rwbs.contains('F') {
                return Ok(Line::Skip); // an empty flush (preflush) request
            }
            return Err(format!(
                "{want} event with RWBS '{rwbs}' lacks 'sector + count' (found '{}')",
                f[7..].join(" ")
            ));
        }
        let sector = parse_u64(f[7], "sector")?;
        let count = parse_u64(f[9], "sector count")?;
        if count == 0 {
            return Ok(Line::Skip);
        }
        let time_ns = parse_secs_ns(f[3])?;
        self.events += 1;
        Ok(Line::Record(Record {
            time_ns: Some(time_ns),
            volume: Some(f[0]),
            offset: sector
                .checked_mul(SECTOR_SIZE)
                .ok_or_else(|| format!("sector {sector} is out of range"))?,
            len: count
                .checked_mul(SECTOR_SIZE)
                .ok_or_else(|| format!("sector count {count} is out of range"))?,
            access,
        }))
    }

    pub fn finish(&self) -> Result<(), String> {
        let _ = self.events;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_times_exactly() {
        assert_eq!(parse_secs_ns("0.000001829").unwrap(), 1829);
        assert_eq!(parse_secs_ns("12.5").unwrap(), 12_500_000_000);
        assert!(parse_secs_ns("1.x").is_err());
    }
}
