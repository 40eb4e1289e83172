//! [`InBuf`]: a connection's read buffer in transmission. A `BufReader`
//! (its reads wait as the stream's do) that can also be topped up without
//! waiting ([`InBuf::fill_with`]): the reader with hits in flight reads
//! the socket so when its poll fires, and goes back to waiting if the
//! socket has nothing after all, instead of looking first (a peek) and
//! then reading.

use std::io::{self, BufReader, Read};

/// See the module documentation.
pub(crate) struct InBuf<R> {
    inner: R,
    buf: Box<[u8]>,
    /// `buf[pos..filled]` is buffered, not yet read.
    pos: usize,
    filled: usize,
    /// The error a top-up met, returned by the read that reaches it (after
    /// the bytes buffered before it).
    error: Option<io::Error>,
}

impl<R: Read> InBuf<R> {
    /// Takes over `reader`'s stream, its buffer's size and the bytes it
    /// holds.
    pub(crate) fn new(reader: BufReader<R>) -> InBuf<R> {
        let held = reader.buffer().len();
        let mut buf = vec![0u8; reader.capacity().max(held)].into_boxed_slice();
        buf[..held].copy_from_slice(reader.buffer());
        InBuf {
            inner: reader.into_inner(),
            buf,
            pos: 0,
            filled: held,
            error: None,
        }
    }

    /// The bytes buffered, not yet read.
    pub(crate) fn buffer(&self) -> &[u8] {
        &self.buf[self.pos..self.filled]
    }

    /// Tops up the buffer with `read`, which must not wait (e.g.
    /// [`crate::sockets::recv_now`] on the stream's socket: the stream
    /// must then be that socket, read as it is), given the room after the
    /// bytes buffered (moved to the front first: call it with little
    /// buffered, e.g. less than a request header; it panics if nothing is
    /// read yet of a full buffer). Returns what `read` did: `Ok(n)`, `n`
    /// bytes more buffered, `Ok(0)` at the stream's end; `Err(WouldBlock)`
    /// when there was nothing to read; another error is also kept for the
    /// read that reaches it.
    pub(crate) fn fill_with(
        &mut self,
        read: impl FnOnce(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        if self.error.is_some() {
            // The stream failed already: nothing after that counts.
            return Err(io::Error::other("the stream failed"));
        }
        if self.pos > 0 {
            self.buf.copy_within(self.pos..self.filled, 0);
            self.filled -= self.pos;
            self.pos = 0;
        }
        assert!(self.filled < self.buf.len(), "a full buffer topped up");
        match read(&mut self.buf[self.filled..]) {
            Ok(n) => {
                self.filled += n;
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(e),
            Err(e) => {
                let kind = e.kind();
                self.error = Some(e);
                Err(kind.into())
            }
        }
    }
}

impl<R: Read> Read for InBuf<R> {
    /// What is buffered first; with nothing buffered, one read of the
    /// stream (waiting as it does) into the buffer, or straight into
    /// `out` when it is as large as the buffer.
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.filled {
            if let Some(e) = self.error.take() {
                return Err(e);
            }
            if out.len() >= self.buf.len() {
                return self.inner.read(out);
            }
            self.pos = 0;
            self.filled = 0;
            self.filled = self.inner.read(&mut self.buf)?;
        }
        let n = out.len().min(self.filled - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream that hands out its chunks one per read, then `end`.
    struct Chunks(Vec<io::Result<Vec<u8>>>);
    impl Read for Chunks {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return Ok(0);
            }
            let c = self.0.remove(0)?;
            assert!(c.len() <= out.len());
            out[..c.len()].copy_from_slice(&c);
            Ok(c.len())
        }
    }

    fn inbuf(chunks: Vec<io::Result<Vec<u8>>>) -> InBuf<Chunks> {
        InBuf::new(BufReader::with_capacity(16, Chunks(chunks)))
    }

    #[test]
    fn takes_over_what_the_bufreader_holds() {
        let mut r = BufReader::with_capacity(16, Chunks(vec![Ok(b"abcdef".to_vec())]));
        let mut two = [0u8; 2];
        r.read_exact(&mut two).unwrap();
        let mut b = InBuf::new(r);
        assert_eq!(b.buffer(), b"cdef");
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"cdef");
    }

    /// The case the reader relies on: a partial request buffered, a
    /// top-up finding nothing (the poll fired for bytes gone) leaves it as
    /// it is, and a later one appends to it.
    #[test]
    fn a_top_up_with_nothing_to_read_keeps_what_is_buffered() {
        let mut b = inbuf(vec![Ok(b"0123456789".to_vec())]);
        let mut head = [0u8; 6];
        b.read_exact(&mut head).unwrap();
        assert_eq!(b.buffer(), b"6789");
        let e = b
            .fill_with(|_| Err(io::ErrorKind::WouldBlock.into()))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(b.buffer(), b"6789");
        let n = b
            .fill_with(|room| {
                // Moved to the front: the room is all the rest.
                assert_eq!(room.len(), 12);
                room[..3].copy_from_slice(b"abc");
                Ok(3)
            })
            .unwrap();
        assert_eq!(n, 3);
        let mut all = Vec::new();
        b.read_to_end(&mut all).unwrap();
        assert_eq!(all, b"6789abc");
    }

    /// A top-up's failure reaches the reader after the bytes buffered
    /// before it, once.
    #[test]
    fn a_top_up_error_comes_after_the_bytes_before_it() {
        let mut b = inbuf(vec![Ok(b"xy".to_vec())]);
        b.read_exact(&mut [0u8; 1]).unwrap();
        let e = b
            .fill_with(|_| Err(io::ErrorKind::ConnectionReset.into()))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
        let mut one = [0u8; 4];
        assert_eq!(b.read(&mut one).unwrap(), 1);
        assert_eq!(&one[..1], b"y");
        assert_eq!(
            b.read(&mut one).unwrap_err().kind(),
            io::ErrorKind::ConnectionReset
        );
        assert_eq!(b.read(&mut one).unwrap(), 0, "then the stream itself");
    }

    #[test]
    fn large_reads_bypass_the_buffer() {
        let mut b = inbuf(vec![Ok(vec![7u8; 20])]);
        let mut big = [0u8; 32];
        assert_eq!(b.read(&mut big).unwrap(), 20);
        assert_eq!(b.buffer(), b"");
    }
}
