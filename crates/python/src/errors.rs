//! The simulator's errors as Python exceptions: an input that cannot be
//! read is `OSError`, everything else (bad option, trace line, record,
//! policy, column) is `ValueError`; the message is the simulator's.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::PyErr;
use tiercache_sim::Error;

/// The Python exception for `e`.
pub fn to_py(e: Error) -> PyErr {
    match e {
        Error::Io { .. } => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A `ValueError` with `msg`.
pub fn value_error(msg: impl Into<String>) -> PyErr {
    PyValueError::new_err(msg.into())
}
