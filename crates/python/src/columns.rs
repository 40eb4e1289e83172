//! Request columns across the boundary: each column is a byte string of
//! little-endian `u64` values (`op`: one byte per request, 0 read, 1
//! write), as NumPy's `tobytes()` makes them and `frombuffer` reads them.

use crate::errors::value_error;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tiercache_sim::{Columns, ReadColumns};

/// The `u64` values of `bytes` (column `name`).
fn u64s(name: &str, bytes: &[u8]) -> PyResult<Vec<u64>> {
    if bytes.len() % 8 != 0 {
        return Err(value_error(format!(
            "column '{name}': {} bytes is not a whole number of 64-bit values",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// Columns from byte strings; `op` bytes other than 0 and 1 are an error.
pub fn from_bytes(
    time: Option<&[u8]>,
    volume: Option<&[u8]>,
    offset: &[u8],
    length: &[u8],
    op: &[u8],
) -> PyResult<Columns> {
    if let Some(i) = op.iter().position(|&b| b > 1) {
        return Err(value_error(format!(
            "column 'op': request {i} is {} (0 read, 1 write)",
            op[i]
        )));
    }
    Ok(Columns {
        time: time.map(|t| u64s("time", t)).transpose()?,
        volume: volume.map(|v| u64s("volume", v)).transpose()?,
        offset: u64s("offset", offset)?,
        len: u64s("length", length)?,
        write: op.iter().map(|&b| b == 1).collect(),
    })
}

fn le_bytes<'py>(py: Python<'py>, v: &[u64]) -> Bound<'py, PyBytes> {
    let mut out = Vec::with_capacity(v.len() * 8);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
    PyBytes::new(py, &out)
}

/// A trace read into columns, as a dict: `time`, `volume` (None when
/// absent), `offset`, `length`, `op` as byte strings, plus
/// `volume_names`, `format` and `timestamps`.
pub fn to_dict<'py>(py: Python<'py>, r: &ReadColumns) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let c = &r.columns;
    d.set_item("time", c.time.as_ref().map(|t| le_bytes(py, t)))?;
    d.set_item("volume", c.volume.as_ref().map(|v| le_bytes(py, v)))?;
    d.set_item("offset", le_bytes(py, &c.offset))?;
    d.set_item("length", le_bytes(py, &c.len))?;
    let op: Vec<u8> = c.write.iter().map(|&w| u8::from(w)).collect();
    d.set_item("op", PyBytes::new(py, &op))?;
    d.set_item("volume_names", r.volume_names.clone())?;
    d.set_item("format", r.format.clone())?;
    d.set_item("timestamps", r.timestamps)?;
    Ok(d)
}
