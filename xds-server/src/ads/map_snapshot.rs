//! [`MapSnapshot`]: an [`XdsSnapshot`] backed by plain maps, the same for every proxy.
//! Used by the protocol tests and the load tool; the real snapshot comes from the
//! generators.

use std::collections::BTreeMap;
use std::sync::Arc;

use pilotfish_mesh::model::Proxy;

use super::resource::{ChangeKind, Resource, ResourceMap, XdsSnapshot};
use super::types::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE, XdsType};
use super::view::StampedSnapshot;

/// Resources by type URL and name, plus what the publisher knows about the change from
/// the previous snapshot.
#[derive(Clone, Debug, Default)]
pub struct MapSnapshot {
    version: u64,
    /// One part per type URL: every proxy gets the same.
    resources: BTreeMap<String, Arc<ResourceMap>>,
    /// `Some(v)`: this snapshot differs from version `v` in endpoints only.
    endpoints_only_since: Option<u64>,
}

impl MapSnapshot {
    pub fn new(version: u64) -> Self {
        MapSnapshot {
            version,
            ..Default::default()
        }
    }

    /// The small mesh the protocol tests share: clusters `c1`, `c2` with endpoints, listener
    /// `l1`, routes `r1`, `r2`. Each payload is the resource's short name (`e1` for the
    /// endpoints of `c1`), so tests read payloads as names.
    pub fn sample(version: u64) -> Self {
        MapSnapshot::new(version)
            .with(CLUSTER_TYPE, "c1", b"c1")
            .with(CLUSTER_TYPE, "c2", b"c2")
            .with(ENDPOINT_TYPE, "c1", b"e1")
            .with(ENDPOINT_TYPE, "c2", b"e2")
            .with(LISTENER_TYPE, "l1", b"l1")
            .with(ROUTE_TYPE, "r1", b"r1")
            .with(ROUTE_TYPE, "r2", b"r2")
    }

    /// Adds (or replaces) a resource whose body is `payload` under `type_url`.
    pub fn with(mut self, type_url: &str, name: &str, payload: &[u8]) -> Self {
        self.insert(type_url, name, payload);
        self
    }

    /// Adds (or replaces) a resource whose body is `payload` under `type_url`.
    pub fn insert(&mut self, type_url: &str, name: &str, payload: &[u8]) {
        let body = prost_types::Any {
            type_url: type_url.to_string(),
            value: payload.to_vec(),
        };
        Arc::make_mut(self.resources.entry(type_url.to_string()).or_default())
            .insert(name.to_string(), Resource::new(name, body).shared());
    }

    /// Removes a resource.
    pub fn without(mut self, type_url: &str, name: &str) -> Self {
        if let Some(by_name) = self.resources.get_mut(type_url) {
            Arc::make_mut(by_name).remove(name);
        }
        self
    }

    /// The same resources under a new version, with no change hint.
    pub fn next(&self, version: u64) -> Self {
        MapSnapshot {
            version,
            resources: self.resources.clone(),
            endpoints_only_since: None,
        }
    }

    /// Declares that this snapshot differs from `previous` in endpoints only.
    pub fn endpoints_only_since(mut self, previous: u64) -> Self {
        self.endpoints_only_since = Some(previous);
        self
    }

    /// As the trait object the state machines read.
    pub fn shared(self) -> Arc<dyn XdsSnapshot> {
        Arc::new(self)
    }

    /// As the feed hands it to the streams, arriving now.
    pub fn stamped(self) -> StampedSnapshot {
        StampedSnapshot::now(self.shared())
    }
}

impl XdsSnapshot for MapSnapshot {
    fn version(&self) -> u64 {
        self.version
    }

    fn parts(&self, _proxy: &Proxy, xds_type: XdsType) -> Vec<Arc<ResourceMap>> {
        self.resources
            .get(xds_type.type_url())
            .cloned()
            .into_iter()
            .collect()
    }

    fn change_since(&self, previous: u64) -> ChangeKind {
        if self.endpoints_only_since == Some(previous) {
            ChangeKind::EndpointsOnly
        } else {
            ChangeKind::Full
        }
    }
}
