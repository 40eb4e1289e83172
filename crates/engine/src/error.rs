//! The engine's one error type.

use std::io;

/// What went wrong with a request or with opening the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request is not aligned to 512 bytes.
    #[error("request at offset {offset} length {len} is not aligned to 512 bytes")]
    Misaligned { offset: u64, len: u64 },
    /// The request reaches past the end of the exported device.
    #[error(
        "request at offset {offset} length {len} is beyond the end of the device ({size} bytes)"
    )]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// The backing device failed; the request did not complete.
    #[error("backing device {device}: {source}")]
    Backing { device: String, source: io::Error },
    /// The cache device failed and the data exists nowhere else (dirty data
    /// in writeback), so the request cannot be served.
    #[error("cache device {device} failed holding dirty data: {source}")]
    CacheDirty { device: String, source: io::Error },
    /// The volume was detached from the pool while a handle on it was held.
    #[error("volume {volume} was detached from the cache")]
    Detached { volume: String },
    /// The configuration cannot work with these devices.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The cache metadata refused or failed (wrong backing device, corrupt
    /// metadata, unknown format, an IO error writing it).
    #[error(transparent)]
    Metadata(#[from] tiercache_metadata::MetadataError),
}

/// An engine error as the `io::Error` a front end gets from the export.
/// The kind is chosen so that the front ends' one errno mapping
/// (`tiercache_frontend::errno`) gives the right errno: a request out of
/// range or misaligned, or a bad configuration, is `InvalidInput`
/// (`EINVAL`); a device error keeps its source, whose errno is carried
/// through (`EIO`, `ENOSPC` for a full device, ...); metadata errors
/// without an errno are `EIO`.
impl From<EngineError> for io::Error {
    fn from(e: EngineError) -> io::Error {
        let kind = match &e {
            EngineError::Misaligned { .. }
            | EngineError::OutOfRange { .. }
            | EngineError::Config(_) => io::ErrorKind::InvalidInput,
            EngineError::Backing { source, .. } | EngineError::CacheDirty { source, .. } => {
                source.kind()
            }
            EngineError::Metadata(_) | EngineError::Detached { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

pub type Result<T> = std::result::Result<T, EngineError>;
