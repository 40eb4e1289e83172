//! Block size limits of an export.

/// Block size constraints of an export: the NBD spec's "block size
/// constraints", which the ublk device maps to its logical and physical
/// block sizes and its maximum IO.
///
/// Contract (checked by [`BlockSizes::validate`], enforced by both front
/// ends before they serve an export): `min` is a power of two in
/// `1..=65536`; `preferred` is a power of two `>= max(min, 512)`; `max` is
/// a multiple of `min` and at least `min(preferred, export size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSizes {
    /// Every request's offset and length are multiples of this.
    pub min: u32,
    /// The size requests should use for best performance.
    pub preferred: u32,
    /// The longest read or write the export accepts.
    pub max: u32,
}

/// 32 MiB: the default maximum request length, also the largest length the
/// NBD spec says clients may always use.
pub const DEFAULT_MAX_BLOCK: u32 = 32 << 20;

impl Default for BlockSizes {
    /// The NBD spec's defaults (min 1, preferred 4096) with a 32 MiB
    /// maximum.
    fn default() -> Self {
        BlockSizes {
            min: 1,
            preferred: 4096,
            max: DEFAULT_MAX_BLOCK,
        }
    }
}

impl BlockSizes {
    /// Checks the constraints (see [`BlockSizes`]) for an export of `size`
    /// bytes; Err says which one fails.
    pub fn validate(&self, size: u64) -> Result<(), String> {
        let BlockSizes {
            min,
            preferred,
            max,
        } = *self;
        if !min.is_power_of_two() || min > 65536 {
            return Err(format!(
                "minimum block size {min} is not a power of two <= 65536"
            ));
        }
        if !preferred.is_power_of_two() || preferred < min.max(512) {
            return Err(format!(
                "preferred block size {preferred} is not a power of two >= max(min, 512)"
            ));
        }
        if max % min != 0 {
            return Err(format!(
                "maximum block size {max} is not a multiple of {min}"
            ));
        }
        if u64::from(max) < u64::from(preferred).min(size) {
            return Err(format!(
                "maximum block size {max} is smaller than min(preferred, size)"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_validation() {
        assert!(BlockSizes::default().validate(1 << 30).is_ok());
        let bad = BlockSizes {
            min: 3,
            ..BlockSizes::default()
        };
        assert!(bad.validate(1 << 30).is_err());
        let bad = BlockSizes {
            min: 4096,
            preferred: 4096,
            max: 4097,
        };
        assert!(bad.validate(1 << 30).is_err());
    }
}
