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
//! - [`check`] and [`repair`] inspect and salvage damaged metadata;
//!   [`verify_clean_claims`] compares clean claims' crcs with the slots'
//!   content.
//!
//! The crate knows nothing of the engine's locking: a store is used by one
//! thread at a time (`&mut self`).
//!
//! ```
//! use std::sync::Arc;
//! use tiercache_device::MemDevice;
//! use tiercache_metadata::{BackingIdentity, Entry, FormatParams, MetadataStore};
//! use tiercache_types::CacheMode;
//!
//! let cache = Arc::new(MemDevice::new(16 << 20));
//! let backing = BackingIdentity { size: 1 << 30, path_hint: "/dev/sdb".into(), fingerprint: None };
//! let params = FormatParams {
//!     block_size: 4096,
//!     mode: CacheMode::WriteBack,
//!     policy: "smq".into(),
//!     journal_bytes: None,
//!     backing: backing.clone(),
//! };
//! let mut store = MetadataStore::format(cache.clone(), &params)?;
//! // The engine: cache slots start at store.layout().data_offset and there
//! // are store.layout().capacity of them.
//! // ... write block 77's data into slot 5, flush the cache device, then:
//! store.record(5, Some(Entry { oblock: 77, dirty: true, hint: 0, crc: None }))?;
//! store.commit()?; // durable from here on
//! drop(store); // a crash
//!
//! let (store, recovered) = MetadataStore::open(cache, &backing)?;
//! assert!(!recovered.was_clean_shutdown);
//! assert_eq!(recovered.mapping[5], Some(Entry { oblock: 77, dirty: true, hint: 0, crc: None }));
//! store.mark_clean_shutdown(&recovered.mapping, &backing)?;
//! # Ok::<(), tiercache_metadata::MetadataError>(())
//! ```

mod check;
pub mod codec;
mod error;
mod layout;
mod read;
mod store;

pub use check::{
    check, check_with, repair, repair_with, verify_clean_claims, CheckOptions, ClaimVerification,
    Problem, Report, Severity,
};
pub use codec::{
    claim_len, content_crc, Area, BackingIdentity, DecodeError, Entry, Superblock, MAX_HINT,
    MAX_OBLOCK,
};
pub use error::{ErrorKind, MetadataError, Result};
pub use layout::{default_journal_bytes, Layout, SNAPSHOT_ENTRIES_PER_BLOCK};
pub use store::{
    fingerprint, CommitStats, FormatParams, Mapping, MetadataStats, MetadataStore, Recovered,
};
