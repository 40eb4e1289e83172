//! `make test` builds the tests with overflow checks on (the Makefile
//! exports `CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true`), so that an
//! arithmetic overflow anywhere fails the test that reaches it instead of
//! wrapping silently as a plain release build does. This checks that the
//! setting reached the code: under `make test` (`TIERCACHE_REQUIRE_TOOLS`
//! set) an overflow must panic. Its own test binary, so no other test
//! changes the environment it reads.

use std::hint::black_box;

#[test]
fn overflow_checks_are_on_under_make_test() {
    let overflow_panics = std::panic::catch_unwind(|| black_box(u64::MAX) + black_box(1)).is_err();
    if std::env::var_os(tiercache_testkit::tools::REQUIRE_ENV).is_some() {
        assert!(
            overflow_panics,
            "under `make test` the tests must be built with overflow checks on \
             (CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true, see the Makefile)"
        );
    } else {
        eprintln!(
            "overflow checks are {}",
            if overflow_panics { "on" } else { "off" }
        );
    }
}
