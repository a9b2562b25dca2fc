//! What changed between two snapshots, from their per-item content hashes. Lets callers
//! recognise an endpoint-only change (the cheap path) and lets the xDS tier skip work for
//! unchanged services.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

use super::{ItemHash, PushContext};
use crate::config::ConfigKey;

/// Differences between two snapshots. Keys are `(hostname, namespace)` for services and
/// endpoints.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChangeSummary {
    pub mesh_changed: bool,
    pub services: BTreeSet<(String, String)>,
    pub endpoints: BTreeSet<(String, String)>,
    pub configs: BTreeSet<ConfigKey>,
}

impl ChangeSummary {
    pub fn is_empty(&self) -> bool {
        !self.mesh_changed
            && self.services.is_empty()
            && self.endpoints.is_empty()
            && self.configs.is_empty()
    }

    /// Only endpoints changed: clusters, listeners and routes stay as they are.
    pub fn is_endpoints_only(&self) -> bool {
        !self.mesh_changed
            && self.services.is_empty()
            && self.configs.is_empty()
            && !self.endpoints.is_empty()
    }
}

/// Compares two snapshots item by item.
pub fn diff(old: &PushContext, new: &PushContext) -> ChangeSummary {
    ChangeSummary {
        mesh_changed: old.mesh() != new.mesh() || old.cluster_domain() != new.cluster_domain(),
        services: changed_keys(&old.hashes().services, &new.hashes().services),
        endpoints: changed_keys(&old.hashes().endpoints, &new.hashes().endpoints),
        configs: changed_keys(&old.hashes().configs, &new.hashes().configs),
    }
}

fn changed_keys<K: Clone + Ord + Hash + Eq>(
    old: &HashMap<K, ItemHash>,
    new: &HashMap<K, ItemHash>,
) -> BTreeSet<K> {
    let mut out: BTreeSet<K> = old
        .iter()
        .filter(|(k, h)| new.get(*k) != Some(*h))
        .map(|(k, _)| k.clone())
        .collect();
    out.extend(new.keys().filter(|k| !old.contains_key(*k)).cloned());
    out
}
