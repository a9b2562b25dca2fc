//! What the streams of one snapshot share: [`View`] (the content of one response — the
//! resources of a type that a scope and a subscription select — with its encodings) and
//! [`ServedSnapshot`] (a snapshot together with the views computed from it).
//!
//! A view is computed once per (snapshot, type, parts, subscribed names) and shared by
//! every stream that asks the same: the streams of one scope send the same SotW body
//! (encoded once), keep the same view as their record of what was sent and what the
//! client holds, and build delta responses from the same pre-encoded resources. Views are
//! held weakly by the snapshot, so one lives exactly as long as some stream refers to it.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use pilotfish_mesh::model::Proxy;
use sha2::{Digest, Sha256};

use super::intern::WeakTable;
use super::names::NameSet;
use super::proto;
use super::resource::{ChangeKind, Resource, ResourceMap, XdsSnapshot};
use super::types::XdsType;

/// Every live view of the process, by content. Resources are interned, so two views with
/// the same content hold the same resources; keeping one of them makes scopes that see
/// the same resources, and snapshots that did not change them, share one view, one
/// record and one encoding.
static VIEWS: LazyLock<WeakTable<View>> = LazyLock::new(WeakTable::default);

/// The resources of one type selected for a scope and a subscription, in name order.
#[derive(Debug)]
pub struct View {
    xds_type: XdsType,
    resources: Box<[Arc<Resource>]>,
    /// Hash of the (name, version) pairs: a SotW `version_info`, a delta
    /// `system_version_info`.
    version: Arc<str>,
    /// `DiscoveryResponse` fields `version_info`, `resources` and `type_url`, encoded on
    /// first use.
    sotw_body: OnceLock<Bytes>,
    /// `DeltaDiscoveryResponse.resources` entries of every resource, encoded on first use
    /// (a delta stream that holds nothing yet is sent all of them).
    delta_body: OnceLock<Bytes>,
}

impl View {
    /// A view of `resources`, which must be in name order without repeated names.
    pub fn new(xds_type: XdsType, resources: Vec<Arc<Resource>>) -> View {
        debug_assert!(resources.windows(2).all(|w| w[0].name < w[1].name));
        let version = view_version(resources.iter().map(|r| (&r.name, &r.version)));
        View {
            xds_type,
            resources: resources.into_boxed_slice(),
            version: version.into(),
            sotw_body: OnceLock::new(),
            delta_body: OnceLock::new(),
        }
    }

    /// No resources.
    pub fn empty(xds_type: XdsType) -> View {
        View::new(xds_type, Vec::new())
    }

    /// The one shared view with this content: an equal view alive anywhere in the
    /// process, or this one.
    pub fn shared(self) -> Arc<View> {
        let mut hasher = DefaultHasher::new();
        (self.xds_type, &self.version).hash(&mut hasher);
        VIEWS.intern(hasher.finish(), self, |a, b| {
            a.xds_type == b.xds_type
                && a.version == b.version
                && a.resources.len() == b.resources.len()
                && a.resources
                    .iter()
                    .zip(b.resources.iter())
                    .all(|(x, y)| Arc::ptr_eq(x, y) || x == y)
        })
    }

    /// Live views in the process.
    pub fn interned() -> usize {
        VIEWS.len()
    }

    pub fn xds_type(&self) -> XdsType {
        self.xds_type
    }

    pub fn version(&self) -> &Arc<str> {
        &self.version
    }

    /// The resources, in name order.
    pub fn resources(&self) -> &[Arc<Resource>] {
        &self.resources
    }

    pub fn len(&self) -> usize {
        self.resources.len()
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Resource>> {
        self.resources
            .binary_search_by(|r| r.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.resources[i])
    }

    /// The version of `name` in this view.
    pub fn version_of(&self, name: &str) -> Option<&str> {
        self.get(name).map(|r| r.version.as_str())
    }

    /// The shared part of every SotW response carrying this view: `version_info`, the
    /// resources and `type_url` (a stream adds its nonce and the control plane).
    pub fn sotw_body(&self) -> &Bytes {
        self.sotw_body.get_or_init(|| {
            let type_url = self.xds_type.type_url();
            let len = proto::delimited_len(1, self.version.len())
                + self
                    .resources
                    .iter()
                    .map(|r| proto::delimited_len(2, proto::any_len(&r.body)))
                    .sum::<usize>()
                + proto::delimited_len(4, type_url.len());
            let mut buf = BytesMut::with_capacity(len);
            proto::put_delimited(1, self.version.as_bytes(), &mut buf);
            for r in self.resources.iter() {
                proto::put_delimited_header(2, proto::any_len(&r.body), &mut buf);
                proto::put_any(&r.body, &mut buf);
            }
            proto::put_delimited(4, type_url.as_bytes(), &mut buf);
            debug_assert_eq!(buf.len(), len);
            buf.freeze()
        })
    }

    /// Every resource as `DeltaDiscoveryResponse.resources` entries, in one buffer.
    pub fn delta_body(&self) -> &Bytes {
        self.delta_body.get_or_init(|| {
            let len = self.resources.iter().map(|r| r.delta_entry().len()).sum();
            let mut buf = BytesMut::with_capacity(len);
            for r in self.resources.iter() {
                buf.extend_from_slice(r.delta_entry());
            }
            buf.freeze()
        })
    }

    /// Whether two views have the same content (the same names and versions).
    pub fn same_content(&self, other: &View) -> bool {
        self.xds_type == other.xds_type && self.version == other.version
    }
}

/// A snapshot as the engine serves it: the mesh ([`XdsSnapshot`]) and the views
/// computed from it so far.
pub struct ServedSnapshot {
    snapshot: Arc<dyn XdsSnapshot>,
    views: Mutex<ViewTable>,
}

impl std::fmt::Debug for ServedSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServedSnapshot")
            .field("version", &self.snapshot.version())
            .finish()
    }
}

#[derive(Default)]
struct ViewTable {
    views: HashMap<ViewKey, Weak<View>>,
    sweep_at: usize,
}

/// What a view depends on: the type, the parts it is cut from (by identity: the snapshot
/// hands out one `Arc` per distinct part) and the subscribed names (by identity: they are
/// interned), `None` for a wildcard. The key holds its `Arc`s, so an address is never
/// reused for another part or set while the entry exists.
struct ViewKey {
    xds_type: XdsType,
    parts: Vec<Arc<ResourceMap>>,
    names: Option<Arc<NameSet>>,
}

impl PartialEq for ViewKey {
    fn eq(&self, other: &Self) -> bool {
        self.xds_type == other.xds_type
            && self.parts.len() == other.parts.len()
            && self
                .parts
                .iter()
                .zip(&other.parts)
                .all(|(a, b)| Arc::ptr_eq(a, b))
            && match (&self.names, &other.names) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

impl Eq for ViewKey {}

impl Hash for ViewKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.xds_type.hash(state);
        for part in &self.parts {
            Arc::as_ptr(part).hash(state);
        }
        self.names.as_ref().map(Arc::as_ptr).hash(state);
    }
}

impl ServedSnapshot {
    pub fn new(snapshot: Arc<dyn XdsSnapshot>) -> Arc<ServedSnapshot> {
        Arc::new(ServedSnapshot {
            snapshot,
            views: Mutex::new(ViewTable::default()),
        })
    }

    /// The mesh snapshot.
    pub fn snapshot(&self) -> &Arc<dyn XdsSnapshot> {
        &self.snapshot
    }

    /// Publisher version (logs and debug pages).
    pub fn version(&self) -> u64 {
        self.snapshot.version()
    }

    pub fn change_since(&self, previous: u64) -> ChangeKind {
        self.snapshot.change_since(previous)
    }

    /// The view of `xds_type` for `proxy` and a subscription: every resource when `names`
    /// is `None`, else those of `names` that exist (in the snapshot's parts, or among the
    /// resources that exist only when named, [`XdsSnapshot::named_parts`]). Computed once
    /// and shared while any stream holds it.
    pub fn view(
        &self,
        proxy: &Arc<Proxy>,
        xds_type: XdsType,
        names: Option<&Arc<NameSet>>,
    ) -> Arc<View> {
        if names.is_some_and(|n| n.is_empty()) {
            return Arc::new(View::empty(xds_type));
        }
        let mut parts = self.snapshot.stream_parts(proxy, xds_type);
        if let Some(names) = names {
            parts.extend(self.snapshot.named_parts(
                proxy,
                xds_type,
                &mut names.iter().map(String::as_str),
            ));
        }
        let key = ViewKey {
            xds_type,
            parts,
            names: names.cloned(),
        };
        if let Some(view) = self.lock().views.get(&key).and_then(Weak::upgrade) {
            return view;
        }
        // Computed outside the lock: a view costs a pass over its resources, and two
        // streams racing for the same one both get whichever was stored first.
        let view = cut(xds_type, &key.parts, key.names.as_deref()).shared();
        let mut table = self.lock();
        if let Some(existing) = table.views.get(&key).and_then(Weak::upgrade) {
            return existing;
        }
        table.views.insert(key, Arc::downgrade(&view));
        if table.views.len() > table.sweep_at {
            table.views.retain(|_, v| v.strong_count() > 0);
            table.sweep_at = 2 * table.views.len() + 64;
        }
        view
    }

    /// Views some stream still holds.
    pub fn live_views(&self) -> usize {
        self.lock()
            .views
            .values()
            .filter(|v| v.strong_count() > 0)
            .count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ViewTable> {
        // Every mutation is a single insert or retain: a poisoned table is still valid.
        self.views.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The resources of `parts` selected by `names` (all when `None`), in name order, the
/// first part winning a repeated name.
fn cut(xds_type: XdsType, parts: &[Arc<ResourceMap>], names: Option<&NameSet>) -> View {
    let resources = match names {
        Some(names) => names
            .iter()
            .filter_map(|n| parts.iter().find_map(|p| p.get(n)).cloned())
            .collect(),
        None if parts.len() == 1 => parts[0].values().cloned().collect(),
        None => {
            let mut merged: Vec<Arc<Resource>> =
                parts.iter().flat_map(|p| p.values().cloned()).collect();
            // Stable: among equal names the earlier part's resource stays first.
            merged.sort_by(|a, b| a.name.cmp(&b.name));
            merged.dedup_by(|later, earlier| later.name == earlier.name);
            merged
        }
    };
    View::new(xds_type, resources)
}

/// Hash of a set of (name, version) pairs: a SotW `version_info` or a delta
/// `system_version_info`. Derived from content only, so it is identical on every replica.
pub fn view_version<'a>(entries: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let mut hasher = Sha256::new();
    for (name, version) in entries {
        hasher.update(name.as_bytes());
        hasher.update([0u8]);
        hasher.update(version.as_bytes());
        hasher.update([0u8]);
    }
    hex::encode(&hasher.finalize()[..8])
}

/// A snapshot as the feed hands it to the streams, with the moment this replica received
/// it: the start of the convergence time each stream observes.
#[derive(Clone, Debug)]
pub struct StampedSnapshot {
    pub snapshot: Arc<ServedSnapshot>,
    pub arrived: Instant,
}

impl StampedSnapshot {
    /// `snapshot`, received at `arrived`.
    pub fn new(snapshot: Arc<dyn XdsSnapshot>, arrived: Instant) -> Self {
        StampedSnapshot {
            snapshot: ServedSnapshot::new(snapshot),
            arrived,
        }
    }

    /// `snapshot`, received now.
    pub fn now(snapshot: Arc<dyn XdsSnapshot>) -> Self {
        Self::new(snapshot, Instant::now())
    }
}

/// The one hand-off from the feed to the streams: `None` until the first snapshot.
pub type SnapshotSender = tokio::sync::watch::Sender<Option<StampedSnapshot>>;
/// What the engine receives: `None` until the first snapshot is loaded.
pub type SnapshotReceiver = tokio::sync::watch::Receiver<Option<StampedSnapshot>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::map_snapshot::MapSnapshot;
    use crate::ads::names::NameSets;
    use crate::ads::types::{CLUSTER_TYPE, ENDPOINT_TYPE};
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };
    use prost::Message;

    fn proxy() -> Arc<Proxy> {
        Arc::new(Proxy::with_defaults("p"))
    }

    #[test]
    fn view_version_depends_on_every_pair() {
        use std::collections::{BTreeMap, BTreeSet};
        let a = BTreeMap::from([("x".to_string(), "1".to_string())]);
        let b = BTreeMap::from([("x".to_string(), "2".to_string())]);
        let c = BTreeMap::from([("y".to_string(), "1".to_string())]);
        let empty = BTreeMap::<String, String>::new();
        let versions = [&a, &b, &c, &empty].map(|m| view_version(m.iter()));
        let unique: BTreeSet<_> = versions.iter().collect();
        assert_eq!(unique.len(), 4);
        assert_eq!(view_version(a.iter()), view_version(a.clone().iter()));
    }

    #[test]
    fn equal_requests_share_one_view_and_one_encoding() {
        // Content no other test uses: views are shared process-wide.
        let served = ServedSnapshot::new(
            MapSnapshot::sample(1)
                .with(CLUSTER_TYPE, "only-in-this-test", b"x")
                .shared(),
        );
        let a = served.view(&proxy(), XdsType::Cluster, None);
        let b = served.view(&Arc::new(Proxy::with_defaults("q")), XdsType::Cluster, None);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.sotw_body().as_ptr(), b.sotw_body().as_ptr());
        let sets = NameSets::default();
        let names = sets.intern(vec!["c1".into()]);
        let same = sets.intern(vec!["c1".into()]);
        let e1 = served.view(&proxy(), XdsType::Endpoint, Some(&names));
        let e2 = served.view(&proxy(), XdsType::Endpoint, Some(&same));
        assert!(Arc::ptr_eq(&e1, &e2));
        assert_eq!(e1.len(), 1);
        assert_eq!(served.live_views(), 2);
        drop((a, b));
        assert_eq!(served.live_views(), 1, "a view nobody holds is not kept");
    }

    #[test]
    fn sotw_body_decodes_as_a_discovery_response() {
        let served = ServedSnapshot::new(MapSnapshot::sample(1).shared());
        let view = served.view(&proxy(), XdsType::Cluster, None);
        let decoded = DiscoveryResponse::decode(view.sotw_body().clone()).expect("decodes");
        assert_eq!(decoded.type_url, CLUSTER_TYPE);
        assert_eq!(decoded.version_info, &*view.version().clone());
        let payloads: Vec<&[u8]> = decoded.resources.iter().map(|a| &a.value[..]).collect();
        assert_eq!(payloads, [b"c1", b"c2"]);
        assert!(decoded.resources.iter().all(|a| a.type_url == CLUSTER_TYPE));
    }

    #[test]
    fn delta_body_decodes_as_resources_with_names_and_versions() {
        let served = ServedSnapshot::new(MapSnapshot::sample(1).shared());
        let view = served.view(&proxy(), XdsType::Endpoint, None);
        let decoded = DeltaDiscoveryResponse::decode(view.delta_body().clone()).expect("decodes");
        let got: Vec<(String, String, Vec<u8>)> = decoded
            .resources
            .into_iter()
            .map(|r| {
                let any = r.resource.unwrap_or_default();
                assert_eq!(any.type_url, ENDPOINT_TYPE);
                (r.name, r.version, any.value)
            })
            .collect();
        let want: Vec<(String, String, Vec<u8>)> = view
            .resources()
            .iter()
            .map(|r| (r.name.clone(), r.version.clone(), r.body.value.clone()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(got.len(), 2);
    }

    /// A snapshot whose listeners named `named/<x>` exist only when asked for by name.
    struct NamedOnly {
        base: MapSnapshot,
        named: Mutex<HashMap<Vec<String>, Arc<ResourceMap>>>,
    }

    impl XdsSnapshot for NamedOnly {
        fn version(&self) -> u64 {
            self.base.version()
        }
        fn parts(&self, proxy: &Proxy, xds_type: XdsType) -> Vec<Arc<ResourceMap>> {
            self.base.parts(proxy, xds_type)
        }
        fn change_since(&self, previous: u64) -> ChangeKind {
            self.base.change_since(previous)
        }
        fn named_parts(
            &self,
            _proxy: &Proxy,
            xds_type: XdsType,
            names: &mut dyn Iterator<Item = &str>,
        ) -> Vec<Arc<ResourceMap>> {
            let asked: Vec<String> = names
                .filter(|n| xds_type == XdsType::Listener && n.starts_with("named/"))
                .map(str::to_string)
                .collect();
            if asked.is_empty() {
                return Vec::new();
            }
            let mut cache = self.named.lock().unwrap();
            let part = cache.entry(asked.clone()).or_insert_with(|| {
                Arc::new(
                    asked
                        .iter()
                        .map(|n| {
                            let body = prost_types::Any {
                                type_url: crate::ads::types::LISTENER_TYPE.into(),
                                value: n.as_bytes().to_vec(),
                            };
                            (n.clone(), Arc::new(Resource::new(n.clone(), body)))
                        })
                        .collect(),
                )
            });
            vec![part.clone()]
        }
    }

    #[test]
    fn resources_that_exist_only_when_named_are_never_in_a_wildcard() {
        let served = ServedSnapshot::new(Arc::new(NamedOnly {
            base: MapSnapshot::new(1).with(
                crate::ads::types::LISTENER_TYPE,
                "listed-only-in-this-test",
                b"l",
            ),
            named: Mutex::default(),
        }));
        let all = served.view(&proxy(), XdsType::Listener, None);
        let names =
            |v: &View| -> Vec<String> { v.resources().iter().map(|r| r.name.clone()).collect() };
        assert_eq!(names(&all), ["listed-only-in-this-test"]);
        let sets = NameSets::default();
        let asked = sets.intern(vec![
            "named/a".into(),
            "listed-only-in-this-test".into(),
            "missing".into(),
        ]);
        let view = served.view(&proxy(), XdsType::Listener, Some(&asked));
        assert_eq!(names(&view), ["listed-only-in-this-test", "named/a"]);
        let again = served.view(
            &proxy(),
            XdsType::Listener,
            Some(&sets.intern(vec![
                "missing".into(),
                "listed-only-in-this-test".into(),
                "named/a".into(),
            ])),
        );
        assert!(Arc::ptr_eq(&view, &again), "shared like any view");
    }

    #[test]
    fn parts_merge_in_name_order_and_the_first_part_wins() {
        let resource = |name: &str, payload: &[u8]| {
            Arc::new(Resource::new(
                name,
                prost_types::Any {
                    type_url: CLUSTER_TYPE.into(),
                    value: payload.to_vec(),
                },
            ))
        };
        let first: ResourceMap = [("b", b"b1"), ("d", b"d1")]
            .into_iter()
            .map(|(n, p)| (n.to_string(), resource(n, p)))
            .collect();
        let second: ResourceMap = [("a", b"a2"), ("b", b"b2")]
            .into_iter()
            .map(|(n, p)| (n.to_string(), resource(n, p)))
            .collect();
        let view = cut(XdsType::Cluster, &[Arc::new(first), Arc::new(second)], None);
        let got: Vec<(&str, &[u8])> = view
            .resources()
            .iter()
            .map(|r| (r.name.as_str(), &r.body.value[..]))
            .collect();
        assert_eq!(got, [("a", &b"a2"[..]), ("b", b"b1"), ("d", b"d1")]);
    }
}
