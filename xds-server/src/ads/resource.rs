//! The seam between the ADS engine and the resource generators: [`Resource`] (one encoded
//! xDS resource), [`XdsSnapshot`] (what the engine asks of a mesh snapshot) and
//! [`ChangeKind`]. The engine never looks inside a resource; it only compares versions
//! and copies bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, LazyLock, OnceLock};

use bytes::{Bytes, BytesMut};
use pilotfish_mesh::model::Proxy;
use sha2::{Digest, Sha256};

use super::intern::WeakTable;
use super::proto;
use super::types::XdsType;

/// Every live resource of the process, by content: the scopes of one snapshot and
/// successive snapshots generate equal resources again and again, and keep one copy.
static RESOURCES: LazyLock<WeakTable<Resource>> = LazyLock::new(WeakTable::default);

/// One encoded xDS resource ready to send. Shared (`Arc`) by every stream that sends it.
#[derive(Clone, Debug)]
pub struct Resource {
    pub name: String,
    /// Content hash of `body` (hex of the first 16 bytes of SHA-256 over the Any's type
    /// URL and bytes). Identical on every replica, so a delta client that reconnects
    /// elsewhere with `initial_resource_versions` is sent nothing it already has.
    pub version: String,
    pub body: prost_types::Any,
    /// This resource as one entry of a `DeltaDiscoveryResponse` (field `resources`: name,
    /// version and the Any), encoded on first use and then shared by every delta stream
    /// that sends it.
    delta_entry: OnceLock<Bytes>,
}

impl PartialEq for Resource {
    /// Equal names and content. The version is a hash of the content, so it decides
    /// before the bytes are compared.
    fn eq(&self, other: &Self) -> bool {
        self.version == other.version && self.name == other.name && self.body == other.body
    }
}

impl Resource {
    /// A resource whose version is the content hash of `body`.
    pub fn new(name: impl Into<String>, body: prost_types::Any) -> Self {
        let version = content_version(&body);
        Resource {
            name: name.into(),
            version,
            body,
            delta_entry: OnceLock::new(),
        }
    }

    /// The one shared copy of this resource: an equal resource (same type, name and
    /// content) that is alive anywhere in the process, or this one. Snapshots hand out
    /// interned resources, so equal content is one allocation and one encoding however
    /// many scopes and snapshots generate it.
    pub fn shared(self) -> Arc<Resource> {
        let mut hasher = DefaultHasher::new();
        (&self.body.type_url, &self.name, &self.version).hash(&mut hasher);
        RESOURCES.intern(hasher.finish(), self, |a, b| a == b)
    }

    /// Live interned resources in the process.
    pub fn interned() -> usize {
        RESOURCES.len()
    }

    /// The encoded `DeltaDiscoveryResponse.resources` entry (tag, length, message).
    pub(crate) fn delta_entry(&self) -> &Bytes {
        self.delta_entry.get_or_init(|| {
            // envoy.service.discovery.v3.Resource { version = 1; resource = 2; name = 3 }
            let inner = proto::delimited_len(1, self.version.len())
                + proto::delimited_len(2, proto::any_len(&self.body))
                + proto::delimited_len(3, self.name.len());
            let mut buf = BytesMut::with_capacity(proto::delimited_len(2, inner));
            proto::put_delimited_header(2, inner, &mut buf);
            proto::put_delimited(1, self.version.as_bytes(), &mut buf);
            proto::put_delimited_header(2, proto::any_len(&self.body), &mut buf);
            proto::put_any(&self.body, &mut buf);
            proto::put_delimited(3, self.name.as_bytes(), &mut buf);
            buf.freeze()
        })
    }

    /// The encoded `DiscoveryResponse.resources` entry (tag 2, length, the Any): a slice of
    /// the delta entry, whose `Resource.resource` field is the same tag and the same Any,
    /// so a SotW response that carries this resource alone shares its one encoding.
    pub(crate) fn sotw_entry(&self) -> Bytes {
        let entry = self.delta_entry();
        let any = proto::any_len(&self.body);
        let inner = proto::delimited_len(1, self.version.len())
            + proto::delimited_len(2, any)
            + proto::delimited_len(3, self.name.len());
        let start =
            proto::delimited_len(2, inner) - inner + proto::delimited_len(1, self.version.len());
        entry.slice(start..start + proto::delimited_len(2, any))
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

/// Generated resources of one part of a proxy's configuration, by name.
pub type ResourceMap = BTreeMap<String, Arc<Resource>>;

/// Every live part of the process, by content.
static PARTS: LazyLock<WeakTable<ResourceMap>> = LazyLock::new(WeakTable::default);

/// The one shared copy of a part's content: an equal part (the same names and the same
/// interned resources) alive anywhere in the process, or `part` itself. Scopes whose
/// parts come out the same then share one map, and the engine — which keys its shared
/// responses on the parts' identity — one response.
pub fn shared_part(part: ResourceMap) -> Arc<ResourceMap> {
    let mut hasher = DefaultHasher::new();
    for (name, resource) in &part {
        (name, &resource.version).hash(&mut hasher);
    }
    PARTS.intern(hasher.finish(), part, |a, b| {
        a.len() == b.len()
            && a.iter()
                .zip(b.iter())
                .all(|((n, x), (m, y))| n == m && (Arc::ptr_eq(x, y) || x == y))
    })
}

/// How a snapshot differs from an earlier one, as far as the publisher knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    /// Only endpoints changed: a stream that saw exactly the earlier snapshot recomputes
    /// EDS only (the cheap path).
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

    /// Every resource of `xds_type` that `proxy` may see, as the parts the snapshot
    /// caches. Two proxies given the same parts (the same `Arc`s) see the same resources:
    /// the engine keys its shared responses on the parts' identity, so a snapshot must
    /// hand out the same `Arc` for the same content for as long as it lives. Names are
    /// unique across the parts; if one repeats, the first part's resource wins.
    fn parts(&self, proxy: &Proxy, xds_type: XdsType) -> Vec<Arc<ResourceMap>>;

    /// [`parts`](Self::parts) for the proxy of an ADS stream, which asks for each of its
    /// types from every snapshot: the snapshot may remember what it derived from this
    /// proxy (the one behind this `Arc`) for as long as the proxy lives.
    fn stream_parts(&self, proxy: &Arc<Proxy>, xds_type: XdsType) -> Vec<Arc<ResourceMap>> {
        self.parts(proxy, xds_type)
    }

    /// Resources that exist only when asked for by name, for those of `names` that are
    /// such: a proxyless gRPC server's listener is named by the address the server binds
    /// (`xds.istio.io/grpc/lds/inbound/<ip>:<port>`), which the snapshot cannot list, and
    /// which a wildcard subscription does not get (as in Istio). As for
    /// [`parts`](Self::parts), the same content must come as the same `Arc`. None by default.
    fn named_parts(
        &self,
        _proxy: &Proxy,
        _xds_type: XdsType,
        _names: &mut dyn Iterator<Item = &str>,
    ) -> Vec<Arc<ResourceMap>> {
        Vec::new()
    }

    /// How this snapshot differs from the one with version `previous`, when known: lets a
    /// stream that saw exactly `previous` recompute only EDS.
    fn change_since(&self, previous: u64) -> ChangeKind;

    /// Resources of `type_url` for `proxy`: every one when `names` is `None` (wildcard),
    /// else those of `names` that exist (in name order, each name once).
    fn resources(
        &self,
        proxy: &Proxy,
        type_url: &str,
        names: Option<&BTreeSet<String>>,
    ) -> Vec<Arc<Resource>> {
        let Some(xds_type) = XdsType::from_type_url(type_url) else {
            return Vec::new();
        };
        let mut parts = self.parts(proxy, xds_type);
        if let Some(names) = names {
            parts.extend(self.named_parts(proxy, xds_type, &mut names.iter().map(String::as_str)));
        }
        match names {
            None => {
                let mut all = ResourceMap::new();
                for part in &parts {
                    for (name, resource) in part.iter() {
                        all.entry(name.clone()).or_insert_with(|| resource.clone());
                    }
                }
                all.into_values().collect()
            }
            Some(names) => names
                .iter()
                .filter_map(|n| parts.iter().find_map(|p| p.get(n).cloned()))
                .collect(),
        }
    }
}

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

    #[test]
    fn the_sotw_entry_is_the_any_field_of_the_delta_entry() {
        use prost::Message;
        // Sizes around the varint boundaries of the lengths.
        for size in [1, 100, 127, 128, 16_383, 16_384, 70_000] {
            let r = Resource::new("name", any("type.googleapis.com/x", &vec![7u8; size]));
            let mut expected = Vec::new();
            proto::put_delimited(2, &r.body.encode_to_vec(), &mut expected);
            assert_eq!(&r.sotw_entry()[..], &expected[..], "size {size}");
            let range = r.delta_entry().as_ptr_range();
            assert!(
                range.contains(&r.sotw_entry().as_ptr()),
                "a slice, not a copy"
            );
        }
    }
}
