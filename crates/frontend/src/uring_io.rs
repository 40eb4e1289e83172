//! The io_uring submissions both front ends build for the contract's
//! direct paths: a read of a [`ReadPiece`](crate::ReadPiece) or of a
//! miss's source, and a miss's fill, each into or from a registered buffer
//! when the front end has one (`READ_FIXED`, `WRITE_FIXED`: no page pinning
//! per IO) and from plain memory otherwise.
//!
//! Building an entry is safe; pushing it is not. The caller that pushes
//! one promises what io_uring needs: `len` bytes at the pointer stay valid
//! (and, for a read, untouched by anyone else) until the completion is
//! reaped, `fd` stays open until then, and a `fixed` index names a
//! registered buffer that holds the whole range.

use io_uring::{opcode, squeue, types};
use std::os::fd::RawFd;

/// A read of `len` bytes at `offset` of `fd` into `into`, through the
/// registered buffer `fixed` when given.
pub fn read_sqe(
    fd: RawFd,
    into: *mut u8,
    len: u32,
    offset: u64,
    fixed: Option<u16>,
) -> squeue::Entry {
    match fixed {
        Some(index) => opcode::ReadFixed::new(types::Fd(fd), into, len, index)
            .offset(offset)
            .build(),
        None => opcode::Read::new(types::Fd(fd), into, len)
            .offset(offset)
            .build(),
    }
}

/// A write of `len` bytes from `from` at `offset` of `fd`, through the
/// registered buffer `fixed` when given.
pub fn write_sqe(
    fd: RawFd,
    from: *const u8,
    len: u32,
    offset: u64,
    fixed: Option<u16>,
) -> squeue::Entry {
    match fixed {
        Some(index) => opcode::WriteFixed::new(types::Fd(fd), from, len, index)
            .offset(offset)
            .build(),
        None => opcode::Write::new(types::Fd(fd), from, len)
            .offset(offset)
            .build(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_index_selects_the_fixed_opcodes() {
        let mut buf = [0u8; 8];
        assert_eq!(
            read_sqe(3, buf.as_mut_ptr(), 8, 0, None).get_opcode(),
            u32::from(opcode::Read::CODE)
        );
        assert_eq!(
            read_sqe(3, buf.as_mut_ptr(), 8, 0, Some(1)).get_opcode(),
            u32::from(opcode::ReadFixed::CODE)
        );
        assert_eq!(
            write_sqe(3, buf.as_ptr(), 8, 0, None).get_opcode(),
            u32::from(opcode::Write::CODE)
        );
        assert_eq!(
            write_sqe(3, buf.as_ptr(), 8, 0, Some(1)).get_opcode(),
            u32::from(opcode::WriteFixed::CODE)
        );
    }
}
