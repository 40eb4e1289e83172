//! `tiercache._tiercache`: the simulator (crates/sim) as a Python extension
//! module. The Python package `tiercache` (crates/python/python) wraps it
//! and turns its results into pandas DataFrames; nothing of the simulator
//! is written again in Python.
//!
//! What crosses the boundary is deliberately plain, so that the numbers
//! are the CLI's own:
//! - a report is the JSON `tiercache sim --json` writes
//!   ([`tiercache_sim::to_json`] of the same [`tiercache_sim::SimReport`]);
//! - request columns are little-endian `u64` (and `u8` for op) byte
//!   strings, which the Python side makes with NumPy (`tobytes`,
//!   `frombuffer`): no NumPy C API, so the module works with any NumPy
//!   and is abi3 (one wheel for CPython 3.9 and later).
//!
//! Building: maturin builds the wheel (`scripts/python-test.sh`) and sets
//! `PYO3_BUILD_EXTENSION_MODULE`, which keeps libpython unlinked, the way
//! an extension module must be (PyO3 0.28 replaced the `extension-module`
//! feature by that variable). The crate stays a workspace member so that
//! `cargo fmt`, clippy and rustdoc cover it; it is a cdylib with no Rust
//! test harness (`test = false`: its tests are pytest, crates/python/tests),
//! so `cargo test --workspace` only builds the library, and a shared
//! library may leave Python's symbols to the interpreter that loads it.
//!
//! Errors: a bad option, trace line or column is `ValueError`, an input
//! that cannot be read is `OSError`, each with the simulator's message.

mod columns;
mod errors;
mod functions;
mod options;

use pyo3::prelude::*;

/// The module Python imports as `tiercache._tiercache`.
#[pymodule]
fn _tiercache(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(functions::simulate_file, m)?)?;
    m.add_function(wrap_pyfunction!(functions::simulate_columns, m)?)?;
    m.add_function(wrap_pyfunction!(functions::read_trace, m)?)?;
    m.add_function(wrap_pyfunction!(functions::default_policies, m)?)?;
    m.add_function(wrap_pyfunction!(functions::parse_cache_sizes, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
