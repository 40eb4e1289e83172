//! The per-volume part of the director: in a pool (one cache for many
//! backing volumes) each volume has its own mode, its own sequential
//! detector (one volume's scan says nothing of another's IO) and its own
//! counters, while the replacement policy and admission are shared by all.

use crate::sharing::VolumeShare;
use crate::{Counters, SequentialDetector};
use tiercache_types::{CacheMode, VolumeId};

/// One attached volume's decision state.
#[derive(Clone, Debug)]
pub(crate) struct VolumeState {
    pub(crate) mode: CacheMode,
    pub(crate) sequential: SequentialDetector,
    /// Event counters, and `resident`/`dirty` kept as gauges of this
    /// volume's blocks by every insertion, eviction, removal and dirty
    /// change the director makes.
    pub(crate) counters: Counters,
    /// Its limits, hit curve and target in the shared cache.
    pub(crate) share: VolumeShare,
    /// The byte where its last request ended (`u64::MAX` before the
    /// first): a request that starts there continues it, which its fill
    /// class tells the policy (`RequestClass`).
    pub(crate) last_end: u64,
}

/// The attached volumes, indexed by [`VolumeId`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Volumes {
    slots: Vec<Option<VolumeState>>,
}

impl Volumes {
    pub(crate) fn attach(&mut self, id: VolumeId, state: VolumeState) -> bool {
        if self.slots.len() <= id.index() {
            self.slots.resize(id.index() + 1, None);
        }
        let slot = &mut self.slots[id.index()];
        if slot.is_some() {
            return false;
        }
        *slot = Some(state);
        true
    }

    pub(crate) fn detach(&mut self, id: VolumeId) -> Option<VolumeState> {
        self.slots.get_mut(id.index())?.take()
    }

    pub(crate) fn get(&self, id: VolumeId) -> Option<&VolumeState> {
        self.slots.get(id.index())?.as_ref()
    }

    pub(crate) fn get_mut(&mut self, id: VolumeId) -> Option<&mut VolumeState> {
        self.slots.get_mut(id.index())?.as_mut()
    }

    /// The state of a volume that must be attached (an IO or a block of it
    /// is being planned): a detached one is the caller's bug.
    pub(crate) fn of_mut(&mut self, id: VolumeId) -> &mut VolumeState {
        self.get_mut(id)
            .unwrap_or_else(|| panic!("volume {id} is not attached to the director"))
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (VolumeId, &VolumeState)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((VolumeId(i as u16), s.as_ref()?)))
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut VolumeState> {
        self.slots.iter_mut().flatten()
    }

    pub(crate) fn ids(&self) -> impl Iterator<Item = VolumeId> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.is_some())
            .map(|(i, _)| VolumeId(i as u16))
    }
}
