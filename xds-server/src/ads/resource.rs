//! The seam between the ADS engine and the resource generators: [`Resource`] (one encoded
//! xDS resource), [`XdsSnapshot`] (what the engine asks of a mesh snapshot) and
//! [`ChangeKind`]. The engine never looks inside a resource; it only compares versions.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use pilotfish_mesh::model::Proxy;
use sha2::{Digest, Sha256};

/// One encoded xDS resource ready to send. Shared (`Arc`) by every stream that sends it.
#[derive(Clone, Debug, PartialEq)]
pub struct Resource {
    pub name: String,
    /// Content hash of `body` (hex of the first 16 bytes of SHA-256 over the Any's type
    /// URL and bytes). Identical on every replica, so a delta client that reconnects
    /// elsewhere with `initial_resource_versions` is sent nothing it already has.
    pub version: String,
    pub body: prost_types::Any,
}

impl Resource {
    /// A resource whose version is the content hash of `body`.
    pub fn new(name: impl Into<String>, body: prost_types::Any) -> Self {
        let version = content_version(&body);
        Resource {
            name: name.into(),
            version,
            body,
        }
    }
}

/// The version of an encoded resource: hex of the first 16 bytes of SHA-256 over its
/// type URL and encoded bytes.
pub fn content_version(body: &prost_types::Any) -> String {
    let mut hasher = Sha256::new();
    hasher.update(body.type_url.as_bytes());
    // A separator byte that cannot occur in a type URL keeps (url, bytes) pairs distinct.
    hasher.update([0u8]);
    hasher.update(&body.value);
    hex::encode(&hasher.finalize()[..16])
}

/// How a snapshot differs from an earlier one, as far as the publisher knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// Only endpoints changed: a stream that saw exactly the earlier snapshot recomputes
    /// EDS only (the cheap path, which never waits behind full pushes).
    EndpointsOnly,
    /// Anything else, or unknown: recompute every type.
    Full,
}

/// One immutable snapshot of the mesh as the ADS engine sees it. The generators implement
/// it; tests implement it with plain maps.
pub trait XdsSnapshot: Send + Sync + 'static {
    /// Version stamped by the publisher (monotonic), for logs and debug pages only —
    /// never used as `version_info`.
    fn version(&self) -> u64;

    /// Resources of `type_url` for `proxy`: every one when `names` is `None` (wildcard),
    /// else those of `names` that exist.
    fn resources(
        &self,
        proxy: &Proxy,
        type_url: &str,
        names: Option<&BTreeSet<String>>,
    ) -> Vec<Arc<Resource>>;

    /// How this snapshot differs from the one with version `previous`, when known: lets a
    /// stream that saw exactly `previous` recompute only EDS.
    fn change_since(&self, previous: u64) -> ChangeKind;
}

/// Copies a resource body into the Any type of the Envoy messages (`envoy-types` carries
/// its own `google.protobuf.Any`).
pub(crate) fn to_envoy_any(body: &prost_types::Any) -> envoy_types::pb::google::protobuf::Any {
    envoy_types::pb::google::protobuf::Any {
        type_url: body.type_url.clone(),
        value: body.value.clone(),
    }
}

/// A snapshot as the feed hands it to the streams, with the moment this replica received
/// it: the start of the convergence time each stream observes.
#[derive(Clone)]
pub struct StampedSnapshot {
    pub snapshot: Arc<dyn XdsSnapshot>,
    pub arrived: Instant,
}

impl StampedSnapshot {
    /// `snapshot`, received now.
    pub fn now(snapshot: Arc<dyn XdsSnapshot>) -> Self {
        StampedSnapshot {
            snapshot,
            arrived: Instant::now(),
        }
    }
}

/// The one hand-off from the feed to the streams: `None` until the first snapshot.
pub type SnapshotSender = tokio::sync::watch::Sender<Option<StampedSnapshot>>;
/// What the engine receives: `None` until the first snapshot is loaded.
pub type SnapshotReceiver = tokio::sync::watch::Receiver<Option<StampedSnapshot>>;

#[cfg(test)]
mod tests {
    use super::*;

    fn any(url: &str, bytes: &[u8]) -> prost_types::Any {
        prost_types::Any {
            type_url: url.to_string(),
            value: bytes.to_vec(),
        }
    }

    #[test]
    fn version_is_a_stable_content_hash() {
        let a = Resource::new("a", any("t", b"xyz"));
        let b = Resource::new("b", any("t", b"xyz"));
        assert_eq!(a.version, b.version, "the name is not part of the content");
        assert_eq!(a.version.len(), 32);
        assert_ne!(a.version, Resource::new("a", any("t", b"xy")).version);
        assert_ne!(a.version, Resource::new("a", any("u", b"xyz")).version);
        // Pinned so that a change of the hash (which would make every replica and every
        // reconnecting client disagree with older replicas) is a deliberate one.
        assert_eq!(
            content_version(&any("", b"")),
            "6e340b9cffb37a989ca544e6bb780a2c"
        );
    }
}
