//! The tiercache variants a run compares: policy, admission, mode, and a
//! cache on a file or in RAM.

use crate::settings::{BenchArgs, Settings};
use serde::Serialize;
use std::path::Path;

/// One tiercache variant: replacement+admission policy and cache mode.
#[derive(Clone, Debug, Serialize)]
pub struct Variant {
    pub policy: String,
    pub admission: Option<String>,
    pub mode: String,
    /// Cache device in RAM (`mem:SIZE`) instead of a file.
    pub ram: bool,
}

impl Variant {
    /// "tiercache" for the defaults, else "tiercache lru+always writeback".
    pub fn label(&self, only_default: bool) -> String {
        let ram = if self.ram { " (RAM cache)" } else { "" };
        if only_default {
            return format!("tiercache{ram}");
        }
        let mut s = format!("tiercache {}", self.policy);
        if let Some(a) = &self.admission {
            s.push('+');
            s.push_str(a);
        }
        if self.mode != "writethrough" {
            s.push(' ');
            s.push_str(&self.mode);
        }
        s.push_str(ram);
        s
    }

    pub(crate) fn serve_args(&self, st: &Settings, backing: &Path, cache: &Path) -> Vec<String> {
        let mut a = vec![
            "--backing".into(),
            format!("hdd:{}", backing.display()),
            "--cache".into(),
            if self.ram {
                format!("mem:{}", st.cache_size)
            } else {
                cache.display().to_string()
            },
            "--block-size".into(),
            st.block_size.to_string(),
            "--policy".into(),
            self.policy.clone(),
            "--mode".into(),
            self.mode.clone(),
        ];
        if let Some(adm) = &self.admission {
            a.push("--admission".into());
            a.push(adm.clone());
        }
        a
    }
}

/// The file-cache variants (policies x modes), then, unless
/// --no-ram-cache, the first of them again with its cache in RAM.
pub(crate) fn variants(a: &BenchArgs) -> Vec<Variant> {
    let mut v = Vec::new();
    for p in &a.policies {
        let (policy, admission) = match p.split_once('+') {
            Some((p, adm)) => (p.to_string(), Some(adm.to_string())),
            None => (p.to_string(), None),
        };
        for m in &a.modes {
            v.push(Variant {
                policy: policy.clone(),
                admission: admission.clone(),
                mode: m.clone(),
                ram: false,
            });
        }
    }
    if !a.no_ram_cache {
        if let Some(first) = v.first().cloned() {
            v.push(Variant { ram: true, ..first });
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::slug;
    use crate::settings::parse_args;

    #[test]
    fn variants_and_labels() {
        let a = parse_args(["x", "--policies", "smq,lru+always", "--modes", "writeback"]);
        let v = variants(&a);
        assert_eq!(v.len(), 3);
        assert_eq!(v[1].label(false), "tiercache lru+always writeback");
        assert_eq!(v[2].label(false), "tiercache smq writeback (RAM cache)");
        assert!(v[2].ram && !v[0].ram);
        let a = parse_args(["x", "--no-ram-cache"]);
        assert_eq!(variants(&a).len(), 1);
        assert_eq!(
            slug("tiercache lru, empty cache"),
            "tiercache-lru-empty-cache"
        );
    }
}
