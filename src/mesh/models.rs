//! The models a peer may name: those this gateway serves. A frame naming another model is
//! refused before any state is kept for it, so fake model hashes cannot grow the repairs, the
//! repair marks or the known paths.
//!
//! Served means listed by a worker's `/v1/models` (the catalog), plus the model-less namespace
//! (a request without a `model` field). When some worker's list is unknown (discovery failed,
//! or the workers list nothing), that worker serves every model, so any model may be named,
//! up to `MESH_MODELS_MAX` distinct ones; this gateway's own dispatches' models count too.

use std::collections::HashSet;

use crate::limits::MESH_MODELS_MAX;
use crate::policy::model_hash;
use crate::workers::catalog::ModelCatalog;

/// Which model hashes the mesh takes from peers.
#[derive(Debug, Default)]
pub struct ServedModels {
    /// The catalog's models, and the model-less namespace.
    listed: HashSet<u64>,
    /// Some worker serves every model (its list is unknown, or no worker lists any).
    open: bool,
    /// Models admitted while open, and this gateway's own dispatches' models; at most
    /// `MESH_MODELS_MAX`.
    admitted: HashSet<u64>,
}

impl ServedModels {
    /// The models `catalog` says this gateway serves.
    pub fn of_catalog(catalog: &ModelCatalog) -> ServedModels {
        let mut listed: HashSet<u64> = catalog.serving().map(|(m, _)| model_hash(m)).collect();
        let open = listed.is_empty() || !catalog.wildcard().is_empty();
        listed.insert(model_hash(""));
        ServedModels {
            listed,
            open,
            admitted: HashSet::new(),
        }
    }

    /// Keeps what was admitted under the previous catalog (bounded all the same).
    pub fn carry_admitted(&mut self, previous: ServedModels) {
        self.admitted = previous.admitted;
    }

    /// This gateway dispatched a request of `model`: it serves it.
    pub fn note_local(&mut self, model: u64) {
        if !self.listed.contains(&model) && self.admitted.len() < MESH_MODELS_MAX {
            self.admitted.insert(model);
        }
    }

    /// Whether a peer may name `model`.
    pub fn admits(&mut self, model: u64) -> bool {
        if self.listed.contains(&model) || self.admitted.contains(&model) {
            return true;
        }
        if self.open && self.admitted.len() < MESH_MODELS_MAX {
            self.admitted.insert(model);
            return true;
        }
        false
    }
}
