//! The persistent metadata of a tiercache cache device.
//!
//! A cache device starts with two superblock copies, two snapshot areas (A
//! and B) each holding the whole mapping table, and a circular journal; the
//! cache slots follow at [`Layout::data_offset`]. See
//! `docs/on-disk-format.md` for the byte-level format and the protocol.
//!
//! - [`MetadataStore::format`] writes an empty cache;
//!   [`MetadataStore::open`] recovers the mapping after a clean or unclean
//!   shutdown.
//! - [`MetadataStore::record`] buffers slot updates;
//!   [`MetadataStore::commit`] makes them durable atomically (journal
//!   blocks plus one flush), writing a snapshot when the journal is half
//!   full.
//! - [`MetadataStore::mark_clean_shutdown`] writes a final snapshot and the
//!   clean flag.
//! - [`check`] and [`repair`] inspect and salvage damaged metadata.
//!
//! The crate knows nothing of the engine's locking: a store is used by one
//! thread at a time (`&mut self`).

mod check;
pub mod codec;
mod error;
mod layout;
mod read;
mod store;

pub use check::{check, repair, Problem, Report, Severity};
pub use codec::{Area, BackingIdentity, DecodeError, Entry, Superblock, MAX_HINT, MAX_OBLOCK};
pub use error::{ErrorKind, MetadataError, Result};
pub use layout::{default_journal_bytes, Layout, SNAPSHOT_ENTRIES_PER_BLOCK};
pub use store::{
    fingerprint, CommitStats, FormatParams, Mapping, MetadataStats, MetadataStore, Recovered,
};
