//! The simulation options of a Python call, as a [`SimSpec`]: the same
//! knobs and defaults as `tiercache sim` (crates/cli/src/sim.rs), given as
//! a dict by the Python package.
//!
//! Keys (all optional but `cache_sizes`): `cache_sizes` (list of bytes),
//! `policies` (list of `REPLACEMENT+ADMISSION` or `default`; default: all,
//! as the CLI), `block_size`, `mode`, `sequential_cutoff` (bytes),
//! `devices` (`FAST/SLOW`), `queue_depth`, `opt` (`bypass`, `demand` or
//! None to skip), `mrc` (False to skip it, True or `auto` for the CLI's method, `exact`), `sampling` (a SHARDS rate in (0, 1], or
//! None for the CLI's default method), `threads` (0: all cores). An unknown
//! key or a value of the wrong kind is a `ValueError`.

use crate::errors::{to_py, value_error};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tiercache_sim::{DeviceModel, MrcMethod, OptVariant, SimSpec};

const KEYS: &[&str] = &[
    "cache_sizes",
    "policies",
    "block_size",
    "mode",
    "sequential_cutoff",
    "devices",
    "queue_depth",
    "opt",
    "mrc",
    "sampling",
    "threads",
];

fn get<'py, T: FromPyObjectOwned<'py>>(
    d: &Bound<'py, PyDict>,
    key: &str,
    kind: &str,
) -> PyResult<Option<T>> {
    match d.get_item(key)? {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) => v
            .extract::<T>()
            .map(Some)
            .map_err(|_| value_error(format!("{key}: expected {kind}, got {v}"))),
    }
}

/// The spec the options describe, checked as the CLI checks its flags.
pub fn spec(d: &Bound<'_, PyDict>) -> PyResult<SimSpec> {
    for k in d.keys() {
        let k: String = k.extract()?;
        if !KEYS.contains(&k.as_str()) {
            return Err(value_error(format!(
                "unknown option '{k}' (expected one of: {})",
                KEYS.join(", ")
            )));
        }
    }
    let mut spec = SimSpec::default();
    // Sizes come as Python ints: a negative one fails to convert to u64,
    // so it is caught here with the others.
    let sizes: Vec<i128> = get(d, "cache_sizes", "a list of sizes in bytes")?
        .ok_or_else(|| value_error("cache_sizes: give at least one cache size"))?;
    if sizes.is_empty() {
        return Err(value_error("cache_sizes: give at least one cache size"));
    }
    spec.cache_sizes = sizes
        .iter()
        .map(|&s| {
            u64::try_from(s)
                .ok()
                .filter(|&s| s > 0)
                .ok_or_else(|| value_error(format!("cache_sizes: {s} is not a positive size")))
        })
        .collect::<PyResult<_>>()?;
    if let Some(ps) = get::<Vec<String>>(d, "policies", "a list of policy names")? {
        spec.policies = ps
            .iter()
            .map(|p| tiercache_sim::parse_policy(p).map_err(to_py))
            .collect::<PyResult<_>>()?;
    }
    if let Some(bs) = get::<i128>(d, "block_size", "a size in bytes")? {
        spec.block_size = u32::try_from(bs)
            .map_err(|_| value_error(format!("block_size: {bs} is not a block size")))?;
    }
    if let Some(m) = get::<String>(d, "mode", "a cache mode name")? {
        spec.mode = m
            .parse()
            .map_err(|e| value_error(format!("mode '{m}': {e}")))?;
    }
    if let Some(c) = get::<i128>(d, "sequential_cutoff", "a size in bytes")? {
        spec.sequential_cutoff = u64::try_from(c)
            .map_err(|_| value_error(format!("sequential_cutoff: {c} is not a size")))?;
    }
    if let Some(dev) = get::<String>(d, "devices", "FAST/SLOW device presets")? {
        spec.device = DeviceModel::parse(&dev).map_err(to_py)?;
    }
    if let Some(q) = get::<u32>(d, "queue_depth", "a positive integer")? {
        spec.queue_depth = q;
    }
    match d.get_item("opt")? {
        None => {}
        Some(v) if v.is_none() => spec.opt = None,
        Some(v) => {
            let s: String = v.extract().map_err(|_| {
                value_error(format!("opt: expected 'bypass', 'demand' or None, got {v}"))
            })?;
            spec.opt = Some(match s.as_str() {
                "bypass" => OptVariant::Bypass,
                "demand" => OptVariant::Demand,
                _ => {
                    return Err(value_error(format!(
                        "opt '{s}': expected 'bypass', 'demand' or None"
                    )))
                }
            });
        }
    }
    match d.get_item("mrc")? {
        None => {}
        Some(v) if v.is_none() => {}
        Some(v) => match (
            v.extract::<bool>().ok(),
            v.extract::<String>().ok().as_deref(),
        ) {
            (Some(false), _) => spec.mrc = None,
            (Some(true), _) | (_, Some("auto")) => {}
            (_, Some("exact")) => {
                if let Some(m) = spec.mrc.as_mut() {
                    m.method = MrcMethod::Exact;
                }
            }
            _ => {
                return Err(value_error(format!(
                    "mrc: expected True, False, 'auto' or 'exact', got {v}"
                )))
            }
        },
    }
    if let Some(rate) = get::<f64>(d, "sampling", "a SHARDS rate in (0, 1]")? {
        if !(rate > 0.0 && rate <= 1.0) {
            return Err(value_error(format!(
                "sampling: {rate} is not a SHARDS rate in (0, 1]"
            )));
        }
        if let Some(m) = spec.mrc.as_mut() {
            m.method = MrcMethod::Shards { rate };
        }
    }
    if let Some(t) = get::<usize>(d, "threads", "a number of threads")? {
        spec.threads = t;
    }
    Ok(spec)
}
