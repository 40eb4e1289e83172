//! Shared by tiercache's tests and benchmarks (a dev-dependency only): the
//! fixtures more than one crate's tests need, so each is written once.
//!
//! - [`tools`]: whether a tool is installed, and skipping. A test that
//!   needs a real tool (fio, nbdsh, nbdfuse, a loop device, FUSE) and
//!   cannot have it may skip outside `make test`: it prints one
//!   `SKIPPED <test>: <why>` line, which `.ci/run` counts next to passed
//!   and failed. Under `make test` (and so CI) the project installs every
//!   tool itself, so there a skip is a failure: `make test` sets
//!   [`REQUIRE_ENV`], and [`skip`] then panics with the reason.
//! - [`command`]: running a tool and judging its exit status.
//! - [`served`]: `tiercache serve` as a child process ([`Served`]): started,
//!   waited for, inspected, stopped or killed.
//! - [`pki`]: TLS material ([`Pki`]): a CA, the certificates it signs, and
//!   the file layouts the server's flags and libnbd's clients read.
#![warn(missing_docs)]

pub mod command;
pub mod pki;
pub mod served;
pub mod tools;

pub use command::{output, run, sparse_file, succeeds, which};
pub use pki::Pki;
pub use served::Served;
pub use tools::{have, skip, skips_fail, tool_exists, REQUIRE_ENV};
