//! libCacheSim's `vscsi` binary format: the CloudPhysics block traces
//! (VMware vscsiStats; Waldspurger et al., "Efficient MRC Construction with
//! SHARDS", FAST '15) as libCacheSim ships and reads them
//! (`traceReader/customizedReader/vscsi.h`).
//!
//! No header; fixed-size little-endian records of one of two versions:
//! ```text
//! VSCSI1, 32 bytes: u32 sn, u32 len, u32 nSG, u16 cmd, u16 ver, u64 lbn, u64 ts
//! VSCSI2, 40 bytes: u16 cmd, u16 ver, u32 sn, u32 len, u32 nSG, u64 lbn, u64 ts, u64 rt
//! ```
//! `ver >> 8` is the version. As in libCacheSim it is detected from the
//! first two records: if both, read as VSCSI2, say 2 the trace is VSCSI2;
//! else if both, read as VSCSI1, say 1 it is VSCSI1; else it is not a vscsi
//! trace. (libCacheSim refuses a file shorter than two VSCSI2 records, 80
//! bytes; here a shorter one is judged by the whole records it has, so a
//! one-record trace reads. An empty input is an empty trace.) Later records'
//! `ver` is not checked, as in libCacheSim.
//!
//! Fields used: `ts` in microseconds, `lbn` in 512-byte sectors, `len` in
//! bytes, and `cmd`, the SCSI operation code: READ(6/10/12/16) = 0x08, 0x28,
//! 0xa8, 0x88 are reads; WRITE(6/10/12/16) = 0x0a, 0x2a, 0xaa, 0x8a and WRITE
//! AND VERIFY(10/12/16) = 0x2e, 0xae, 0x8e are writes; any other command
//! (TEST UNIT READY, SYNCHRONIZE CACHE, ...) moves no data a cache holds and
//! is skipped. (libCacheSim does not look at `cmd` and counts every record as
//! a request; the CloudPhysics traces hold only 0x28 and 0x2a.) A last record
//! cut short is an error (libCacheSim drops it silently).

use super::{le_u16, le_u32, le_u64, Line, Record};
use tiercache_types::{Access, SECTOR_SIZE};

/// The two record layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

impl Version {
    /// Bytes per record.
    pub fn record_size(self) -> usize {
        match self {
            Version::V1 => 32,
            Version::V2 => 40,
        }
    }
    /// Where the u16 `ver` field is in a record.
    fn ver_at(self) -> usize {
        match self {
            Version::V1 => 14,
            Version::V2 => 2,
        }
    }
    fn number(self) -> u16 {
        match self {
            Version::V1 => 1,
            Version::V2 => 2,
        }
    }
    /// Whether the whole records of `head` (at most the first two, at least
    /// one) all say this version.
    fn fits(self, head: &[u8]) -> bool {
        let size = self.record_size();
        let n = (head.len() / size).min(2);
        n >= 1
            && (0..n).all(|i| {
                let at = i * size + self.ver_at();
                le_u16(head, at) >> 8 == self.number()
            })
    }
}

pub(crate) struct VscsiParser {
    version: Version,
}

impl VscsiParser {
    /// Detects the version from the first bytes of the (decompressed)
    /// trace. `Ok(None)`: the input is empty.
    pub fn detect(head: &[u8]) -> Result<Option<Self>, String> {
        if head.is_empty() {
            return Ok(None);
        }
        for version in [Version::V2, Version::V1] {
            if version.fits(head) {
                return Ok(Some(VscsiParser { version }));
            }
        }
        if head.len() < Version::V1.record_size() {
            return Err(format!(
                "not a vscsi trace: {} bytes, less than one record (32 bytes for VSCSI1, \
                 40 for VSCSI2)",
                head.len()
            ));
        }
        Err(
            "not a vscsi trace: the version field (ver >> 8) of the first records is neither \
             2 (VSCSI2, 40-byte records) nor 1 (VSCSI1, 32-byte records)"
                .into(),
        )
    }

    #[cfg(test)]
    pub fn version(&self) -> Version {
        self.version
    }

    pub fn record_size(&self) -> usize {
        self.version.record_size()
    }

    /// Parses one whole record (`record_size()` bytes).
    pub fn parse(&self, rec: &[u8]) -> Result<Line<'static>, String> {
        let (cmd, len, lbn, ts) = match self.version {
            Version::V1 => (
                le_u16(rec, 12),
                le_u32(rec, 4),
                le_u64(rec, 16),
                le_u64(rec, 24),
            ),
            Version::V2 => (
                le_u16(rec, 0),
                le_u32(rec, 8),
                le_u64(rec, 16),
                le_u64(rec, 24),
            ),
        };
        let access = match scsi_access(cmd) {
            Some(a) => a,
            None => return Ok(Line::Skip),
        };
        let offset = lbn
            .checked_mul(SECTOR_SIZE)
            .ok_or_else(|| format!("lbn {lbn} (sectors) is out of range"))?;
        let time_ns = ts
            .checked_mul(1_000)
            .ok_or_else(|| format!("timestamp {ts} us is out of range"))?;
        Ok(Line::Record(Record {
            time_ns: Some(time_ns),
            volume: None,
            offset,
            len: len as u64,
            access,
        }))
    }
}

/// Read or write for the SCSI operation codes that move data; `None` for
/// every other command.
pub(crate) fn scsi_access(cmd: u16) -> Option<Access> {
    match cmd {
        0x08 | 0x28 | 0xa8 | 0x88 => Some(Access::Read),
        0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e => Some(Access::Write),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v1(cmd: u16, len: u32, lbn: u64, ts: u64) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&7u32.to_le_bytes()); // sn
        r.extend_from_slice(&len.to_le_bytes());
        r.extend_from_slice(&1u32.to_le_bytes()); // nSG
        r.extend_from_slice(&cmd.to_le_bytes());
        r.extend_from_slice(&0x0100u16.to_le_bytes());
        r.extend_from_slice(&lbn.to_le_bytes());
        r.extend_from_slice(&ts.to_le_bytes());
        r
    }

    #[test]
    fn detects_by_the_version_of_the_first_two_records() {
        let mut t = v1(0x28, 512, 1, 2);
        t.extend(v1(0x2a, 512, 1, 2));
        assert_eq!(
            VscsiParser::detect(&t).unwrap().unwrap().version(),
            Version::V1
        );
        // One record only: still VSCSI1.
        assert_eq!(
            VscsiParser::detect(&t[..32]).unwrap().unwrap().version(),
            Version::V1
        );
        // The second record says otherwise.
        t[32 + 15] = 2;
        assert!(VscsiParser::detect(&t).is_err());
        assert!(VscsiParser::detect(&t[..20]).is_err());
        assert!(VscsiParser::detect(&[]).unwrap().is_none());
    }

    #[test]
    fn scsi_commands() {
        assert_eq!(scsi_access(0x28), Some(Access::Read));
        assert_eq!(scsi_access(0x8a), Some(Access::Write));
        assert_eq!(scsi_access(0x35), None); // SYNCHRONIZE CACHE(10)
        assert_eq!(scsi_access(0x0128), None);
    }
}
