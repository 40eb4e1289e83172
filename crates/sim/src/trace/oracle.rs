//! libCacheSim's `oracleGeneral` binary format
//! (`traceReader/customizedReader/oracle/oracleGeneralBin.h`), the form in
//! which the libCacheSim cache dataset publishes its block traces
//! (CloudPhysics, MSR Cambridge, Tencent CBS, Alibaba, ...), usually zstd
//! compressed (read directly, as every trace here).
//!
//! No header; 24-byte little-endian records:
//! ```text
//! u32 clock_time, u64 obj_id, u32 obj_size, i64 next_access_vtime
//! ```
//! `clock_time` is in seconds; `obj_size` is the request length in bytes;
//! `next_access_vtime` (the index of the object's next request, -1 for none,
//! for Belady's OPT) is not used: the simulator computes its own. The format
//! has no operation: every request is a read.
//!
//! `obj_id` is the address of the request, in a unit the format does not
//! record: [`ObjUnit`] bytes per `obj_id` (1 by default). The dataset's
//! description says Tencent CBS offsets were "converted to bytes"; MSR and
//! Alibaba publish byte offsets in the first place. libCacheSim's own
//! CloudPhysics sample (`data/cloudPhysicsIO.oracleGeneral.bin`) keeps the
//! vscsi `lbn`, 512-byte sectors: read such traces as
//! `oracleGeneral:sector`. A wrong unit does not fail, it gives other miss
//! ratios: check that offsets times the unit look like the device sizes.
//!
//! The format keeps one size per object: libCacheSim's conversion of its
//! CloudPhysics sample gives a record the size of the object's other
//! requests in 13671 of 113872 records (the vscsi `len` differs), and has no
//! writes, so a block trace in this form does not give the miss ratios of
//! its original exactly.
//!
//! A request of size 0 is yielded with length 0 (the simulator ignores it;
//! libCacheSim skips such records by default). A last record cut short is an
//! error.

use super::{le_u32, le_u64, Line, Record};
use tiercache_types::Access;

/// Bytes per `obj_id` of an oracleGeneral trace (1: byte offsets).
pub type ObjUnit = u64;

/// Bytes per record.
pub(crate) const RECORD_SIZE: usize = 24;

pub(crate) struct OracleParser {
    unit: ObjUnit,
}

impl OracleParser {
    pub fn new(unit: ObjUnit) -> Self {
        OracleParser { unit: unit.max(1) }
    }

    /// Parses one whole record ([`RECORD_SIZE`] bytes).
    pub fn parse(&self, rec: &[u8]) -> Result<Line<'static>, String> {
        let clock_time = le_u32(rec, 0);
        let obj_id = le_u64(rec, 4);
        let obj_size = le_u32(rec, 12);
        let offset = obj_id.checked_mul(self.unit).ok_or_else(|| {
            format!(
                "obj_id {obj_id} times the unit {} bytes is out of range",
                self.unit
            )
        })?;
        Ok(Line::Record(Record {
            time_ns: Some(clock_time as u64 * 1_000_000_000),
            volume: None,
            offset,
            len: obj_size as u64,
            access: Access::Read,
        }))
    }
}
