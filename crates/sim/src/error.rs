//! The crate's one error type.

use tiercache_policy::PolicyError;

/// Everything that can go wrong in the simulator. Messages name the input
/// (file and line) so they can be shown to a user as they are.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading an input failed.
    #[error("{source_name}: {error}")]
    Io {
        source_name: String,
        error: std::io::Error,
    },
    /// A trace or job file line that does not parse. `line` is 1-based.
    #[error("{source_name}:{line}: {msg}")]
    Parse {
        source_name: String,
        line: u64,
        msg: String,
    },
    /// A record of a binary trace that does not parse (or is cut short).
    /// `record` is 1-based; `byte` is where the record starts in the
    /// (decompressed) stream.
    #[error("{source_name}: record {record} (byte {byte}): {msg}")]
    Record {
        source_name: String,
        record: u64,
        byte: u64,
        msg: String,
    },
    /// A bad option: unknown format, bad mapping string, impossible sizes.
    #[error("{0}")]
    Config(String),
    /// A policy that cannot be built.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// Writing the PNG plot failed.
    #[error("plot: {0}")]
    Plot(String),
}

impl Error {
    pub(crate) fn io(source_name: &str, error: std::io::Error) -> Self {
        Error::Io {
            source_name: source_name.to_string(),
            error,
        }
    }
    pub(crate) fn parse(source_name: &str, line: u64, msg: impl Into<String>) -> Self {
        Error::Parse {
            source_name: source_name.to_string(),
            line,
            msg: msg.into(),
        }
    }
}

impl Error {
    pub(crate) fn record(
        source_name: &str,
        record: u64,
        byte: u64,
        msg: impl Into<String>,
    ) -> Self {
        Error::Record {
            source_name: source_name.to_string(),
            record,
            byte,
            msg: msg.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
