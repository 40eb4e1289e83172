//! The block-level analysis beside the configurations: trace summary,
//! dense block ids (first touches, OPT's input) and the MRC.

use super::results::TraceSummary;
use crate::idmap::IdMap;
use crate::mrc::MrcBuilder;
use crate::trace::Request;
use tiercache_types::Access;

/// The block-level analysis: trace summary, dense ids (the seen-set that
/// counts first touches, and OPT's input), the MRC.
pub(super) struct BlockTask {
    pub(super) shift: u32,
    pub(super) summary: TraceSummary,
    pub(super) ids: IdMap,
    pub(super) refs: Option<Vec<u32>>,
    pub(super) mrc: Option<MrcBuilder>,
    pub(super) exact: bool,
    /// Distinct blocks seen after each request of the current chunk.
    pub(super) distinct_after: Vec<u64>,
}

impl BlockTask {
    pub(super) fn process(&mut self, r: &Request) {
        self.process_blocks(r);
        self.distinct_after.push(self.ids.len() as u64);
    }

    pub(super) fn process_blocks(&mut self, r: &Request) {
        let s = &mut self.summary;
        s.requests += 1;
        s.duration_s = r.time.as_secs_f64().max(s.duration_s);
        if r.len == 0 {
            s.empty_requests += 1;
            return;
        }
        match r.access {
            Access::Read => {
                s.reads += 1;
                s.read_bytes += r.len;
            }
            Access::Write => {
                s.writes += 1;
                s.write_bytes += r.len;
            }
        }
        let first = r.offset >> self.shift;
        let last = (r.offset.saturating_add(r.len) - 1) >> self.shift;
        s.block_refs += last - first + 1;
        for b in first..=last {
            let id = self.ids.get_or_insert(b).0;
            if let Some(v) = self.refs.as_mut() {
                v.push(id);
            }
            if let Some(m) = self.mrc.as_mut() {
                if self.exact {
                    m.access_dense(id)
                } else {
                    m.access(b)
                }
            }
        }
    }
}
