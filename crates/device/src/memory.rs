//! A device held in RAM, for tests and for RAM as a cache tier.

use crate::{check_range, BlockDevice};
use parking_lot::RwLock;
use std::io;

/// Number of bytes per lock stripe; IOs touching different stripes run in parallel.
const STRIPE: u64 = 1 << 20;

/// A RAM-backed device. Writes are durable at once (flush does nothing).
pub struct MemDevice {
    size: u64,
    stripes: Vec<RwLock<Vec<u8>>>,
}

impl MemDevice {
    /// A zero-filled device of `size` bytes (a multiple of 512).
    pub fn new(size: u64) -> Self {
        assert!(size % 512 == 0, "MemDevice size must be a multiple of 512");
        let n = size.div_ceil(STRIPE);
        let stripes = (0..n)
            .map(|i| {
                let len = (size - i * STRIPE).min(STRIPE);
                RwLock::new(vec![0u8; len as usize])
            })
            .collect();
        MemDevice { size, stripes }
    }

    fn for_each_piece(&self, offset: u64, len: u64, mut f: impl FnMut(usize, usize, usize, usize)) {
        // f(stripe index, offset within stripe, offset within buffer, length)
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let stripe = (pos / STRIPE) as usize;
            let within = (pos % STRIPE) as usize;
            let n = ((STRIPE - pos % STRIPE).min(len - done)) as usize;
            f(stripe, within, done as usize, n);
            done += n as u64;
        }
    }
}

impl BlockDevice for MemDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.for_each_piece(offset, buf.len() as u64, |s, w, b, n| {
            let data = self.stripes[s].read();
            buf[b..b + n].copy_from_slice(&data[w..w + n]);
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self, offset, buf.len() as u64)?;
        self.for_each_piece(offset, buf.len() as u64, |s, w, b, n| {
            let mut data = self.stripes[s].write();
            data[w..w + n].copy_from_slice(&buf[b..b + n]);
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self, offset, len)?;
        self.for_each_piece(offset, len, |s, w, _, n| {
            let mut data = self.stripes[s].write();
            data[w..w + n].fill(0);
        });
        Ok(())
    }

    fn describe(&self) -> String {
        format!("memory:{}B", self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_back_across_stripes() {
        let d = MemDevice::new(3 * STRIPE);
        let data: Vec<u8> = (0..STRIPE as usize + 1024)
            .map(|i| (i % 251) as u8)
            .collect();
        d.write_at(&data, STRIPE - 512).unwrap();
        let mut back = vec![0u8; data.len()];
        d.read_at(&mut back, STRIPE - 512).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn rejects_out_of_range_and_misaligned() {
        let d = MemDevice::new(8192);
        let mut b = vec![0u8; 512];
        assert_eq!(
            d.read_at(&mut b, 8192).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            d.read_at(&mut b, 100).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            d.write_at(&b[..100], 0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
