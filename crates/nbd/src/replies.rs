//! [`ReadReplies`]: the successful read replies a connection's reader
//! thread has ready, sent together with one `writev` (one socket buffer
//! and one wake-up of the client for the batch instead of one per reply),
//! or on a Unix socket, when every reply's data is in a registered buffer,
//! spliced ([`crate::splice_out`]: the client reads the buffers' own
//! pages, which stay lent until it has).

use crate::fixed_bufs::{self, FixedBufs};
use crate::proto;
use crate::splice_out::SpliceOut;
use std::ops::Range;
use std::os::fd::RawFd;

/// Replies per batch: two slices each, within a `writev`'s limit.
pub(crate) const MAX_REPLIES: usize = 32;
/// Data per batch (a few large reads go out at once).
const MAX_BYTES: usize = 1 << 20;
/// A read reply's header: simple (16 bytes), or structured with the
/// `NBD_REPLY_TYPE_OFFSET_DATA` chunk's offset (20 + 8).
const HEAD_LEN: usize = 28;

/// See the module documentation. The caller sends [`ReadReplies::parts`]
/// and then takes the buffers back with [`ReadReplies::drain_buffers`].
#[derive(Default)]
pub(crate) struct ReadReplies {
    heads: Vec<([u8; HEAD_LEN], usize)>,
    /// Each reply's buffer, where its data lies in it, and its index if it
    /// is a registered buffer.
    bufs: Vec<(Vec<u8>, Range<usize>, Option<u16>)>,
    bytes: usize,
    /// Where registered buffers go back once sent.
    fixed: Option<FixedBufs>,
    /// The headers of replies sent by splice, by their registered buffer's
    /// index: such a header, like its buffer, must stay as it is until the
    /// client has read it, and the buffer's index is not used again until
    /// then ([`FixedBufs::lend`]).
    spliced_heads: Box<[[u8; HEAD_LEN]]>,
    /// Where batches in registered buffers are spliced from, and the Unix
    /// socket they go to (None: every batch is copied by `writev`).
    splice: Option<(SpliceOut, RawFd)>,
}

impl ReadReplies {
    /// Replies whose registered buffers (if any) go back to `fixed`,
    /// spliced into the socket through `splice` when it is given and every
    /// reply of a batch is in a registered buffer.
    pub(crate) fn with_fixed(fixed: Option<FixedBufs>, splice: Option<(SpliceOut, RawFd)>) -> Self {
        ReadReplies {
            fixed,
            splice,
            spliced_heads: vec![[0u8; HEAD_LEN]; fixed_bufs::COUNT].into_boxed_slice(),
            ..ReadReplies::default()
        }
    }

    /// Returns registered buffer `index` unsent (its read failed).
    pub(crate) fn give_back(&self, index: u16, buf: Vec<u8>) {
        if let Some(f) = &self.fixed {
            f.give_back(index, buf);
        }
    }

    /// Adds the reply to read `handle` at `offset`, whose data is
    /// `buf[data]` (structured: one `OFFSET_DATA` chunk, or `NONE` for no
    /// data; else a simple reply); `fixed`: `buf`'s index if it is a
    /// registered buffer.
    pub(crate) fn push(
        &mut self,
        structured: bool,
        handle: u64,
        offset: u64,
        buf: Vec<u8>,
        data: Range<usize>,
        fixed: Option<u16>,
    ) {
        let mut head = [0u8; HEAD_LEN];
        let n = if !structured {
            head[..16].copy_from_slice(&proto::encode_simple_reply(0, handle));
            16
        } else if data.is_empty() {
            head[..20].copy_from_slice(&proto::encode_structured_header(
                proto::REPLY_FLAG_DONE,
                proto::REPLY_TYPE_NONE,
                handle,
                0,
            ));
            20
        } else {
            head[..20].copy_from_slice(&proto::encode_structured_header(
                proto::REPLY_FLAG_DONE,
                proto::REPLY_TYPE_OFFSET_DATA,
                handle,
                8 + data.len() as u32,
            ));
            head[20..].copy_from_slice(&offset.to_be_bytes());
            28
        };
        self.bytes += data.len();
        self.heads.push((head, n));
        self.bufs.push((buf, data, fixed));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }

    /// Whether the batch should be sent before another reply is added.
    pub(crate) fn is_full(&self) -> bool {
        self.heads.len() >= MAX_REPLIES || self.bytes >= MAX_BYTES
    }

    /// The bytes to send, in order: (head, data) per reply.
    pub(crate) fn parts(&self) -> impl Iterator<Item = &[u8]> {
        self.heads
            .iter()
            .zip(&self.bufs)
            .flat_map(|((h, n), (b, r, _))| [&h[..*n], &b[r.clone()]])
    }

    /// Whether the batch can be spliced: every reply's data is in a
    /// registered buffer (whose reuse [`FixedBufs`] holds back until read).
    pub(crate) fn can_splice(&self) -> bool {
        self.splice.is_some()
            && self.fixed.is_some()
            && self
                .bufs
                .iter()
                .all(|(_, _, i)| i.is_some_and(|i| usize::from(i) < self.spliced_heads.len()))
    }

    /// Sends the batch by splice (call with the connection's writer held,
    /// and only when [`ReadReplies::can_splice`]): each header is copied to
    /// where it stays until read, then headers and data go out in order.
    /// Ok: the bytes sent. Err with 0 bytes: nothing went out (the batch
    /// must be sent the other way), and this connection splices no more.
    /// Either way, [`ReadReplies::drain_spliced`] with the bytes that went
    /// out next (with 0, [`ReadReplies::drain_buffers`]).
    pub(crate) fn splice(&mut self) -> Result<u64, (std::io::Error, u64)> {
        let Some((out, socket)) = &self.splice else {
            return Err((std::io::ErrorKind::Unsupported.into(), 0));
        };
        for ((h, _), (_, _, i)) in self.heads.iter().zip(&self.bufs) {
            let i = usize::from(i.expect("can_splice: every buffer is registered"));
            self.spliced_heads[i] = *h;
        }
        let mut parts: [&[u8]; 2 * MAX_REPLIES] = [&[]; 2 * MAX_REPLIES];
        let mut n = 0;
        let mut bytes = 0u64;
        for ((_, len), (b, r, i)) in self.heads.iter().zip(&self.bufs) {
            let i = usize::from(i.expect("can_splice: every buffer is registered"));
            parts[n] = &self.spliced_heads[i][..*len];
            parts[n + 1] = &b[r.clone()];
            bytes += (*len + r.len()) as u64;
            n += 2;
        }
        match out.send(*socket, &parts[..n]) {
            Ok(()) => Ok(bytes),
            Err((e, 0)) => {
                self.splice = None;
                Err((e, 0))
            }
            Err((e, sent)) => Err((e, sent as u64)),
        }
    }

    /// Empties a batch of which `bytes` were just spliced, lending its
    /// buffers ([`FixedBufs::lend`]). Returns the replies and the bytes
    /// their requests counted.
    pub(crate) fn drain_spliced(&mut self, bytes: u64) -> (usize, u64) {
        let replies = self.heads.len();
        let data = self.bytes as u64;
        self.heads.clear();
        self.bytes = 0;
        let bufs = self
            .bufs
            .drain(..)
            .filter_map(|(b, _, i)| i.map(|i| (i, b)));
        match (&self.fixed, &self.splice) {
            (Some(f), Some((_, socket))) => f.lend(*socket, bytes, bufs),
            // Never spliced (see `can_splice`); kept all the same.
            _ => bufs.for_each(|(_, b)| std::mem::forget(b)),
        }
        (replies, data)
    }

    /// Empties the batch, handing back each reply's buffer (None for a
    /// registered one: it goes back to its [`FixedBufs`]) and the bytes its
    /// request counted.
    pub(crate) fn drain_buffers(&mut self) -> impl Iterator<Item = (Option<Vec<u8>>, u64)> + '_ {
        self.heads.clear();
        self.bytes = 0;
        let fixed = &self.fixed;
        self.bufs.drain(..).map(move |(b, r, index)| {
            let bytes = r.len() as u64;
            match (index, fixed) {
                (Some(i), Some(f)) => {
                    f.give_back(i, b);
                    (None, bytes)
                }
                (Some(_), None) => (None, bytes),
                (None, _) => (Some(b), bytes),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_laid_out_as_the_wire_wants() {
        let mut r = ReadReplies::default();
        r.push(true, 7, 4096, vec![9; 10], 2..6, None);
        r.push(false, 8, 0, vec![1, 2, 3], 0..3, None);
        r.push(true, 9, 0, Vec::new(), 0..0, None);
        let parts: Vec<&[u8]> = r.parts().collect();
        assert_eq!(parts.len(), 6);
        let mut first = proto::encode_structured_header(
            proto::REPLY_FLAG_DONE,
            proto::REPLY_TYPE_OFFSET_DATA,
            7,
            12,
        )
        .to_vec();
        first.extend_from_slice(&4096u64.to_be_bytes());
        assert_eq!(parts[0], &first[..]);
        assert_eq!(parts[1], &[9; 4]);
        assert_eq!(parts[2], &proto::encode_simple_reply(0, 8)[..]);
        assert_eq!(parts[3], &[1, 2, 3]);
        assert_eq!(
            parts[4],
            &proto::encode_structured_header(proto::REPLY_FLAG_DONE, proto::REPLY_TYPE_NONE, 9, 0)
                [..]
        );
        assert!(parts[5].is_empty());
        let back: Vec<u64> = r.drain_buffers().map(|(_, n)| n).collect();
        assert_eq!(back, vec![4, 3, 0]);
        assert!(r.is_empty());
    }
}
