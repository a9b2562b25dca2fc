//! What changed between two snapshots, from their per-item content hashes. Lets callers
//! recognise an endpoint-only change (the cheap path) and lets the xDS tier skip work for
//! unchanged services.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::Hash;

use super::{ItemHash, PushContext, VirtualServiceConfig};
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

/// The hosts whose VirtualService may differ between `old` and `new` for a proxy of some
/// namespace: those whose candidate VirtualServices (the ones naming the host exactly)
/// are not equal, in order and by value, in both. Which candidate applies depends only on
/// the candidates, the namespace and the mesh config, so for any other host, with the mesh
/// config unchanged, `virtual_service_for_host` gives equal VirtualServices in both.
/// `None` when the wildcard hosts' VirtualServices differ: any host may be affected.
pub fn virtual_service_hosts_changed(
    old: &PushContext,
    new: &PushContext,
) -> Option<HashSet<String>> {
    if wildcard_candidates(old) != wildcard_candidates(new) {
        return None;
    }
    Some(
        old.vs_by_host
            .keys()
            .chain(new.vs_by_host.keys())
            .filter(|host| candidates(old, host) != candidates(new, host))
            .cloned()
            .collect(),
    )
}

/// The VirtualServices naming `host` exactly, in the push context's order.
fn candidates<'a>(push: &'a PushContext, host: &str) -> Vec<&'a VirtualServiceConfig> {
    push.vs_by_host
        .get(host)
        .into_iter()
        .flatten()
        .map(|i| &*push.data.virtual_services[*i])
        .collect()
}

/// The wildcard hosts and their VirtualServices, in the push context's order.
fn wildcard_candidates(push: &PushContext) -> Vec<(&str, &VirtualServiceConfig)> {
    push.vs_wildcards
        .iter()
        .map(|(host, i)| (host.as_str(), &*push.data.virtual_services[*i]))
        .collect()
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
