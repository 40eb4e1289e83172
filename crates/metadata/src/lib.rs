//! The persistent metadata of a tiercache cache device.
//!
//! A cache device starts with two superblock copies, two copies of the
//! volume table (the backing volumes sharing the cache), two snapshot areas
//! (A and B) each holding the whole mapping table, and a circular journal;
//! the cache slots follow at [`Layout::data_offset`]. See
//! `docs/on-disk-format.md` for the byte-level format and the protocol.
//!
//! - [`MetadataStore::format`] writes an empty cache;
//!   [`MetadataStore::open`] recovers the mapping after a clean or unclean
//!   shutdown.
//! - [`MetadataStore::record`] buffers slot updates;
//!   [`MetadataStore::commit`] makes them durable atomically (journal
//!   blocks plus one flush), writing a snapshot when the journal is half
//!   full.
//! - [`MetadataStore::attach`], [`MetadataStore::detach`] and
//!   [`MetadataStore::set_volume_mode`] edit the volume table; every entry
//!   is stored with its volume's generation, and `open` drops entries of a
//!   volume that is not attached or of an earlier attachment of its index.
//! - [`MetadataStore::mark_clean_shutdown`] writes a final snapshot, the
//!   volumes' fingerprints and the clean flag.
//! - [`format2::read`] reads a cache of the previous format (version 2),
//!   read only, so that its dirty blocks can be written back before it is
//!   re-created (`tiercache upgrade`); [`MetadataStore::open`] refuses such
//!   a cache with [`ErrorKind::OldFormat`].
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
//! use tiercache_metadata::{BackingIdentity, Entry, FormatParams, MetadataStore, NewVolume, VolumeId};
//! use tiercache_types::CacheMode;
//!
//! let cache = Arc::new(MemDevice::new(16 << 20));
//! let backing = BackingIdentity { size: 1 << 30, path_hint: "/dev/sdb".into(), fingerprint: None };
//! let params = FormatParams {
//!     block_size: 4096,
//!     mode: CacheMode::WriteBack,
//!     policy: "smq".into(),
//!     journal_bytes: None,
//!     max_volumes: None,
//!     volumes: vec![NewVolume { name: "sdb".into(), identity: backing.clone(), mode: None, sequential_cutoff: None }],
//! };
//! let mut store = MetadataStore::format(cache.clone(), &params)?;
//! // The engine: cache slots start at store.layout().data_offset and there
//! // are store.layout().capacity of them.
//! // ... write block 77 of volume 0 into slot 5, flush the cache device, then:
//! let e = Entry { volume: VolumeId(0), oblock: 77, dirty: true, hint: 0, crc: None };
//! store.record(5, Some(e))?;
//! store.commit()?; // durable from here on
//! drop(store); // a crash
//!
//! let (store, recovered) = MetadataStore::open(cache)?;
//! recovered.check_backing(VolumeId(0), &backing)?;
//! assert!(!recovered.was_clean_shutdown);
//! assert_eq!(recovered.mapping[5], Some(e));
//! store.mark_clean_shutdown(&recovered.mapping, &[(VolumeId(0), backing)])?;
//! # Ok::<(), tiercache_metadata::MetadataError>(())
//! ```

mod check;
pub mod codec;
mod error;
pub mod format2;
mod geometry;
mod layout;
mod read;
mod store;
pub mod volume;

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
pub use tiercache_types::VolumeId;
pub use volume::{
    validate_name, NewVolume, VolumeRecord, VolumeSlot, VolumeState, DEFAULT_MAX_VOLUMES,
    MAX_MAX_VOLUMES,
};
