//! Requests held in memory as columns (time, volume, offset, length, op),
//! for callers that have a trace as arrays rather than a file (the Python
//! package, crates/python), and the way back from a trace file to columns.
//!
//! The columns mean what a [`TraceReader`] makes of a file, so that
//! simulating a file and simulating the columns read from it give the same
//! report:
//! - time: nanoseconds; made relative to the first request (a request that
//!   goes back in time gets 0), as the readers do. Without a time column
//!   the clock is the IO counter, as for a trace without timestamps.
//! - volume: a dense index, 0 for the first volume seen, 1 for the next,
//!   and so on (what the readers number volumes by). With more than one
//!   volume, volume `i` is laid at `i << VOLUME_SHIFT` (1 PiB apart) and
//!   an offset at or past 1 PiB is an error, as in
//!   [`VolumeMode::Separate`](crate::trace::VolumeMode::Separate); with one
//!   volume (or no volume column) offsets are used as they are.
//! - offset and length in bytes; op: read or write.

use crate::error::{Error, Result};
use crate::simulate::RequestSource;
use crate::trace::{Request, TraceReader, VOLUME_SHIFT};
use tiercache_types::{Access, Time};

/// Requests as columns. All given columns have the same length.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Columns {
    /// Nanoseconds; `None`: the IO counter is the clock.
    pub time: Option<Vec<u64>>,
    /// Dense volume index per request; `None`: one volume.
    pub volume: Option<Vec<u64>>,
    pub offset: Vec<u64>,
    pub len: Vec<u64>,
    /// `true` for a write.
    pub write: Vec<bool>,
}

/// A trace file read whole into [`Columns`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadColumns {
    pub columns: Columns,
    /// Volume names by index, as the format names them (empty for a
    /// trace without volumes: then `columns.volume` is `None` and offsets
    /// are as the reader gave them).
    pub volume_names: Vec<String>,
    /// The format read (detected or named).
    pub format: String,
    /// Whether the records carried timestamps (else `time` is `None`).
    pub timestamps: bool,
}

impl Columns {
    /// Number of requests; an error names the first column whose length
    /// differs from `offset`'s.
    pub fn len(&self) -> Result<usize> {
        let n = self.offset.len();
        let lens = [
            ("time", self.time.as_ref().map(Vec::len)),
            ("volume", self.volume.as_ref().map(Vec::len)),
            ("length", Some(self.len.len())),
            ("op", Some(self.write.len())),
        ];
        for (name, l) in lens {
            if let Some(l) = l.filter(|&l| l != n) {
                return Err(Error::Config(format!(
                    "column '{name}' has {l} values but 'offset' has {n}"
                )));
            }
        }
        Ok(n)
    }

    /// Whether there are no requests.
    pub fn is_empty(&self) -> bool {
        self.offset.is_empty()
    }

    /// The requests, resolved as a reader would (see the module
    /// documentation). Errors: columns of different lengths, a volume
    /// index past the number of volumes seen so far (indexes must be
    /// dense, in order of first appearance), an offset past 1 PiB when
    /// volumes are kept apart.
    pub fn requests(&self) -> Result<Vec<Request>> {
        let n = self.len()?;
        let several = self
            .volume
            .as_ref()
            .is_some_and(|v| v.iter().any(|&x| x != v[0]));
        let first_time = self.time.as_ref().and_then(|t| t.first().copied());
        let mut seen = 0u64;
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let mut offset = self.offset[i];
            if let Some(v) = self.volume.as_ref() {
                let idx = v[i];
                if idx > seen {
                    return Err(Error::Config(format!(
                        "request {i}: volume index {idx} before volume {seen} appeared \
                         (volume indexes are dense, in order of first appearance)"
                    )));
                }
                if idx == seen {
                    seen += 1;
                }
                if several {
                    if seen > 1 << (64 - VOLUME_SHIFT) {
                        return Err(Error::Config("more than 16384 volumes".into()));
                    }
                    if offset >= 1 << VOLUME_SHIFT {
                        return Err(Error::Config(format!(
                            "request {i}: offset {offset} is past 1 PiB; volumes cannot be \
                             kept apart (give no volume column to use one address space)"
                        )));
                    }
                    offset |= idx << VOLUME_SHIFT;
                }
            }
            let time = match (self.time.as_ref(), first_time) {
                (Some(t), Some(first)) => Time(t[i].saturating_sub(first)),
                _ => Time(i as u64),
            };
            out.push(Request {
                time,
                offset,
                len: self.len[i],
                access: if self.write[i] {
                    Access::Write
                } else {
                    Access::Read
                },
            });
        }
        Ok(out)
    }
}

/// Reads a whole trace into columns. Offsets of a trace with volumes are
/// split back into (volume index, offset within the volume).
pub fn read_columns(mut reader: TraceReader) -> Result<ReadColumns> {
    let mut time = Vec::new();
    let mut raw_offset = Vec::new();
    let mut len = Vec::new();
    let mut write = Vec::new();
    for r in reader.by_ref() {
        let r = r?;
        time.push(r.time.0);
        raw_offset.push(r.offset);
        len.push(r.len);
        write.push(r.access == Access::Write);
    }
    let volume_names: Vec<String> = reader.volumes().into_iter().map(|(n, _)| n).collect();
    let timestamps = reader.has_timestamps();
    let (volume, offset) = if volume_names.is_empty() {
        (None, raw_offset)
    } else {
        let mask = (1u64 << VOLUME_SHIFT) - 1;
        (
            Some(raw_offset.iter().map(|o| o >> VOLUME_SHIFT).collect()),
            raw_offset.iter().map(|o| o & mask).collect(),
        )
    };
    Ok(ReadColumns {
        columns: Columns {
            time: timestamps.then_some(time),
            volume,
            offset,
            len,
            write,
        },
        volume_names,
        format: reader.format().to_string(),
        timestamps,
    })
}

/// A [`RequestSource`] over requests in memory.
#[derive(Clone, Debug)]
pub struct MemorySource {
    requests: Vec<Request>,
    next: usize,
    timestamps: bool,
}

impl MemorySource {
    /// `timestamps`: whether request times are real times (else the IO
    /// counter), for the report.
    pub fn new(requests: Vec<Request>, timestamps: bool) -> Self {
        MemorySource {
            requests,
            next: 0,
            timestamps,
        }
    }

    /// The source of [`Columns::requests`].
    pub fn from_columns(c: &Columns) -> Result<Self> {
        Ok(MemorySource::new(c.requests()?, c.time.is_some()))
    }
}

impl RequestSource for MemorySource {
    fn next_request(&mut self) -> Option<Result<Request>> {
        let r = self.requests.get(self.next).copied()?;
        self.next += 1;
        Some(Ok(r))
    }
    fn fraction_done(&self) -> Option<f64> {
        Some(if self.requests.is_empty() {
            1.0
        } else {
            self.next as f64 / self.requests.len() as f64
        })
    }
    fn has_timestamps(&self) -> bool {
        self.timestamps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceOptions;

    const MSR: &str = "128166372000000000,hm,0,Read,4096,4096,100\n\
                       128166372010000000,hm,1,Write,8192,512,100\n\
                       128166372020000000,hm,0,Read,0,8192,100\n";

    fn reader(text: &'static str) -> TraceReader {
        TraceReader::new(text.as_bytes(), "t", &TraceOptions::default()).unwrap()
    }

    #[test]
    fn columns_read_from_a_file_give_the_readers_requests() {
        let direct: Vec<Request> = reader(MSR).map(|r| r.unwrap()).collect();
        let read = read_columns(reader(MSR)).unwrap();
        assert_eq!(read.volume_names, vec!["hm,0", "hm,1"]);
        assert!(read.timestamps);
        assert_eq!(read.columns.volume, Some(vec![0, 1, 0]));
        assert_eq!(read.columns.offset, vec![4096, 8192, 0]);
        assert_eq!(read.columns.requests().unwrap(), direct);
    }

    #[test]
    fn bad_columns_are_errors_naming_the_problem() {
        let mut c = Columns {
            offset: vec![0, 1],
            len: vec![1],
            write: vec![false, true],
            ..Columns::default()
        };
        let e = c.requests().unwrap_err().to_string();
        assert!(e.contains("'length' has 1 values"), "{e}");
        c.len = vec![1, 1];
        c.volume = Some(vec![1, 0]);
        let e = c.requests().unwrap_err().to_string();
        assert!(e.contains("volume index 1 before volume 0"), "{e}");
        c.volume = Some(vec![0, 1]);
        c.offset = vec![0, 1 << 50];
        let e = c.requests().unwrap_err().to_string();
        assert!(e.contains("past 1 PiB"), "{e}");
    }

    #[test]
    fn time_is_relative_to_the_first_request_or_the_io_counter() {
        let mut c = Columns {
            time: Some(vec![100, 150, 50]),
            offset: vec![0, 0, 0],
            len: vec![1, 1, 1],
            write: vec![false; 3],
            ..Columns::default()
        };
        let t: Vec<u64> = c.requests().unwrap().iter().map(|r| r.time.0).collect();
        assert_eq!(t, vec![0, 50, 0]);
        c.time = None;
        let t: Vec<u64> = c.requests().unwrap().iter().map(|r| r.time.0).collect();
        assert_eq!(t, vec![0, 1, 2]);
    }
}
