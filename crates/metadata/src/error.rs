//! The one error type of this crate. Every message says what is wrong in
//! terms a user can act on.

use std::io;

pub type Result<T, E = MetadataError> = std::result::Result<T, E>;

/// Why a metadata operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// Neither superblock copy has the tiercache magic: the device was never
    /// formatted as a tiercache cache (or was overwritten).
    #[error("{device} is not a tiercache cache device (no superblock found); format it first")]
    NotFormatted { device: String },

    /// A superblock of a format version this build does not know. The
    /// message says how to proceed: upgrade for a newer version; for an
    /// older one, detach with the old tiercache and re-create the cache.
    #[error("{device} uses on-disk format version {found}; this build supports version {supported} only ({})", version_advice(*found, *supported))]
    UnsupportedVersion {
        device: String,
        found: u32,
        supported: u32,
    },

    /// A cache of format version 2 (one backing device per cache, 12-byte
    /// entries). Version 3 stores a volume number and generation with every
    /// entry, so more bytes per slot: the metadata regions have other sizes
    /// and the cache cannot be converted in place. Its data is safe.
    #[error("{device} uses on-disk format version 2; this build uses version 3 (a cache shared by several volumes, which stores more per block), so it cannot be converted in place. The cached data is safe: run `tiercache upgrade --cache {device} --backing <its backing device>`, which writes the cache's dirty blocks back to the backing device and then re-creates the cache as format 3 with one volume (the clean cached contents are dropped)")]
    OldFormat { device: String },

    /// The superblock sets feature bits this build does not know.
    /// `read_only_ok` is true when only `ro_compat` bits are unknown (a
    /// read-only user such as `check` may go on; a writer may not).
    #[error("{device} uses features this build does not know (incompat bits {incompat:#x}, ro_compat bits {ro_compat:#x}); upgrade tiercache")]
    IncompatibleFeatures {
        device: String,
        incompat: u64,
        ro_compat: u64,
        read_only_ok: bool,
    },

    /// The backing device given is not the one this cache belongs to.
    #[error(
        "this cache belongs to backing device {expected}, but {found} was given; \
             using the cache with another device would return wrong data"
    )]
    WrongBackingDevice { expected: String, found: String },

    /// A metadata block is damaged (or inconsistent with the rest).
    /// `block` is the 4 KiB metadata block number on the cache device.
    #[error("cache metadata is corrupt: {what} (metadata block {block}); run `check` / `repair`")]
    Corrupt { what: String, block: u64 },

    /// A volume is not attached (or has no record) at that index.
    #[error("volume {volume} is not attached to this cache")]
    NotAttached { volume: u16 },

    /// A caller passed a value the format cannot hold.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// An earlier write failed, so the on-disk state is unknown; reopen the
    /// store to recover the last durable state.
    #[error("metadata store is unusable after an earlier write error; reopen it to recover")]
    Failed,

    /// The device failed an IO.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

/// How to proceed with a cache of format version `found`.
fn version_advice(found: u32, supported: u32) -> &'static str {
    if found > supported {
        "upgrade tiercache"
    } else {
        "this cache was made by an older tiercache: run `tiercache detach` with that \
         version to write its dirty blocks back, then re-create the cache with \
         `tiercache create` (its cached contents are dropped)"
    }
}

/// The kind of a [`MetadataError`], for callers that branch on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    NotFormatted,
    UnsupportedVersion,
    OldFormat,
    IncompatibleFeatures,
    WrongBackingDevice,
    Corrupt,
    NotAttached,
    InvalidArgument,
    Failed,
    Io,
}

impl MetadataError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            MetadataError::NotFormatted { .. } => ErrorKind::NotFormatted,
            MetadataError::UnsupportedVersion { .. } => ErrorKind::UnsupportedVersion,
            MetadataError::OldFormat { .. } => ErrorKind::OldFormat,
            MetadataError::IncompatibleFeatures { .. } => ErrorKind::IncompatibleFeatures,
            MetadataError::WrongBackingDevice { .. } => ErrorKind::WrongBackingDevice,
            MetadataError::Corrupt { .. } => ErrorKind::Corrupt,
            MetadataError::NotAttached { .. } => ErrorKind::NotAttached,
            MetadataError::InvalidArgument(_) => ErrorKind::InvalidArgument,
            MetadataError::Failed => ErrorKind::Failed,
            MetadataError::Io { .. } => ErrorKind::Io,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        MetadataError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn corrupt(what: impl Into<String>, block: u64) -> Self {
        MetadataError::Corrupt {
            what: what.into(),
            block,
        }
    }
}
