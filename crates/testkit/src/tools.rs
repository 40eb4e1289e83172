//! Whether a tool is there, and what a test does when it is not: skip
//! (printed) outside `make test`, fail under it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Set (to anything) by `make test`: every tool a test needs must be there.
pub const REQUIRE_ENV: &str = "TIERCACHE_REQUIRE_TOOLS";

/// Whether a test that cannot run must fail instead of skipping.
pub fn skips_fail() -> bool {
    std::env::var_os(REQUIRE_ENV).is_some()
}

/// Says that `test` cannot run, and why: a printed `SKIPPED` line, or,
/// under `make test`, a panic (the test fails). The caller returns after
/// it.
pub fn skip(test: &str, why: &str) {
    if skips_fail() {
        panic!(
            "{test} cannot run: {why}. `make test` installs every tool a test \
             needs (scripts/install-deps.sh), so this is a failure, not a skip"
        );
    }
    eprintln!("SKIPPED {test}: {why}");
}

/// Whether `tool` is an executable on PATH (or in /usr/sbin, /sbin).
pub fn tool_exists(tool: &str) -> bool {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(tool))
        .any(|p| {
            std::fs::metadata(&p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        });
    found
}

/// Whether `tool` is installed; when not, [`skip`]s `test`.
pub fn have(tool: &str, test: &str) -> bool {
    let ok = tool_exists(tool);
    if !ok {
        skip(
            test,
            &format!("`{tool}` is not installed (scripts/install-deps.sh)"),
        );
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_tools_on_the_path() {
        assert!(tool_exists("sh"));
        assert!(!tool_exists("no-such-tool-tiercache"));
    }

    #[test]
    fn a_skip_fails_only_when_tools_are_required() {
        // The variable is process-wide: both cases in one test.
        std::env::remove_var(REQUIRE_ENV);
        skip("t", "nothing");
        assert!(!have("no-such-tool-tiercache", "t"));
        std::env::set_var(REQUIRE_ENV, "1");
        let r = std::panic::catch_unwind(|| skip("t", "nothing"));
        std::env::remove_var(REQUIRE_ENV);
        let msg = *r.unwrap_err().downcast::<String>().unwrap();
        assert!(msg.contains("t cannot run: nothing"), "{msg}");
    }
}
