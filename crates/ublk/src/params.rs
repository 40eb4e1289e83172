//! The device parameters the kernel gets for an [`Export`]: block sizes,
//! size, cache attributes, discard and write-zeroes limits. Pure, so it is
//! tested without the kernel.

use libublk::sys;
use tiercache_frontend::Export;

/// Largest discard / write-zeroes request the kernel may send at once, in
/// bytes. Bounded so that one `mkfs` discard of a whole device becomes
/// many requests spread over the queues instead of one very long call.
pub const MAX_DISCARD_BYTES: u32 = 256 << 20;

/// What [`device_params`] decided, besides the raw kernel struct.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Logical block size: 512 or 4096.
    pub logical_block: u32,
    /// Largest READ/WRITE in bytes (also each tag's buffer size).
    pub max_io_bytes: u32,
    /// Device size in bytes as the kernel sees it (a multiple of the
    /// logical block; any tail of the export beyond is not reachable).
    pub size: u64,
}

/// Computes the ublk parameters for `export`, with READ/WRITE requests of
/// at most `max_io_bytes` (further limited by the export's own maximum).
///
/// * logical block size: 512 if the export's minimum block is at most
///   512, else 4096 if it is at most 4096; larger minimums cannot be
///   served (the kernel allows at most a page) and give an error;
/// * physical block / minimal IO: the export's preferred block, capped at
///   4096; optimal IO: the preferred block;
/// * `VOLATILE_CACHE` when the export can flush (so the kernel sends
///   FLUSH), `FUA` when it honours FUA too, `READ_ONLY`, `ROTATIONAL`;
/// * discard and write-zeroes limits ([`MAX_DISCARD_BYTES`]) when the
///   export trims / writes zeroes (the kernel only sends WRITE_ZEROES when
///   the discard parameters are present).
pub fn device_params(
    export: &dyn Export,
    max_io_bytes: u32,
) -> Result<(sys::ublk_params, Geometry), String> {
    let bs = export.block_size_constraints();
    bs.validate(export.size())?;
    let logical_block: u32 = match bs.min {
        0..=512 => 512,
        513..=4096 => 4096,
        m => {
            return Err(format!(
                "the export's minimum block size {m} is larger than ublk allows (4096)"
            ))
        }
    };
    let physical_block = bs.preferred.clamp(logical_block, 4096);
    let max_io_bytes = max_io_bytes.min(bs.max);
    let max_io_bytes = max_io_bytes - max_io_bytes % logical_block;
    if max_io_bytes < 4096 {
        return Err(format!(
            "maximum IO size {max_io_bytes} is below 4096 bytes (one page)"
        ));
    }
    let size = export.size() - export.size() % u64::from(logical_block);
    if size == 0 {
        return Err("the export is smaller than one logical block".into());
    }
    let shift = |v: u32| v.trailing_zeros() as u8;
    let mut attrs = 0;
    if export.can_flush() {
        attrs |= sys::UBLK_ATTR_VOLATILE_CACHE;
        if export.can_fua() && !export.read_only() {
            attrs |= sys::UBLK_ATTR_FUA;
        }
    }
    if export.read_only() {
        attrs |= sys::UBLK_ATTR_READ_ONLY;
    }
    if export.is_rotational() {
        attrs |= sys::UBLK_ATTR_ROTATIONAL;
    }
    let mut params = sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC,
        basic: sys::ublk_param_basic {
            attrs,
            logical_bs_shift: shift(logical_block),
            physical_bs_shift: shift(physical_block),
            io_min_shift: shift(physical_block),
            io_opt_shift: shift(bs.preferred.max(physical_block)),
            max_sectors: max_io_bytes >> crate::request::SECTOR_SHIFT,
            dev_sectors: size >> crate::request::SECTOR_SHIFT,
            ..Default::default()
        },
        ..Default::default()
    };
    let trims = export.can_trim() && !export.read_only();
    let zeroes = export.can_write_zeroes() && !export.read_only();
    if trims || zeroes {
        let sectors = MAX_DISCARD_BYTES >> crate::request::SECTOR_SHIFT;
        params.types |= sys::UBLK_PARAM_TYPE_DISCARD;
        params.discard = sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: logical_block,
            max_discard_sectors: if trims { sectors } else { 0 },
            max_write_zeroes_sectors: if zeroes { sectors } else { 0 },
            max_discard_segments: 1,
            ..Default::default()
        };
    }
    Ok((
        params,
        Geometry {
            logical_block,
            max_io_bytes,
            size,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tiercache_frontend::{BlockSizes, MemExport};

    #[test]
    fn engine_like_export_gets_512_byte_sectors_flush_fua_and_discard() {
        let e = MemExport::new(1 << 30).with_block_sizes(BlockSizes {
            min: 512,
            preferred: 65536,
            max: 32 << 20,
        });
        let (p, g) = device_params(&e, 512 << 10).unwrap();
        assert_eq!(g.logical_block, 512);
        assert_eq!(g.max_io_bytes, 512 << 10);
        assert_eq!(p.basic.logical_bs_shift, 9);
        assert_eq!(p.basic.physical_bs_shift, 12);
        assert_eq!(p.basic.io_opt_shift, 16);
        assert_eq!(p.basic.max_sectors, 1024);
        assert_eq!(p.basic.dev_sectors, 2 << 20);
        assert_eq!(
            p.basic.attrs,
            sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA
        );
        assert_ne!(p.types & sys::UBLK_PARAM_TYPE_DISCARD, 0);
        assert_eq!(p.discard.max_discard_sectors, MAX_DISCARD_BYTES >> 9);
        assert_eq!(p.discard.max_write_zeroes_sectors, MAX_DISCARD_BYTES >> 9);
        assert_eq!(p.discard.max_discard_segments, 1);
        assert_eq!(p.discard.discard_granularity, 512);
    }

    #[test]
    fn a_4k_export_gets_4k_logical_blocks_and_its_own_max_io() {
        let e = MemExport::new((1 << 30) + 1000).with_block_sizes(BlockSizes {
            min: 4096,
            preferred: 4096,
            max: 128 << 10,
        });
        let (p, g) = device_params(&e, 1 << 20).unwrap();
        assert_eq!(g.logical_block, 4096);
        assert_eq!(p.basic.logical_bs_shift, 12);
        assert_eq!(g.max_io_bytes, 128 << 10, "export max wins");
        // The unaligned tail is cut off.
        assert_eq!(g.size, 1 << 30);
        assert_eq!(p.basic.dev_sectors, (1 << 30) >> 9);
    }

    #[test]
    fn read_only_export_gets_no_fua_and_no_discard() {
        let e = MemExport::new(1 << 20).with_read_only(true);
        let (p, _) = device_params(&e, 1 << 20).unwrap();
        assert_eq!(
            p.basic.attrs,
            sys::UBLK_ATTR_READ_ONLY | sys::UBLK_ATTR_VOLATILE_CACHE
        );
        assert_eq!(p.types, sys::UBLK_PARAM_TYPE_BASIC);
    }

    #[test]
    fn impossible_geometries_are_refused() {
        let big_min = MemExport::new(1 << 20).with_block_sizes(BlockSizes {
            min: 65536,
            preferred: 65536,
            max: 1 << 20,
        });
        assert!(device_params(&big_min, 1 << 20)
            .unwrap_err()
            .contains("minimum block size 65536"));
        let e = MemExport::new(1 << 20);
        assert!(device_params(&e, 2048).is_err());
        let tiny = MemExport::new(100);
        assert!(device_params(&tiny, 1 << 20).is_err());
    }
}
