//! The controller's view of the cluster: one [`KindStore`] per watched kind, gathered in
//! [`Stores`], owned by the Kubernetes mode's loop (one owner, no locks). Watch tasks
//! trim and convert objects at ingest ([`Watched::ingest`]) and hand the loop
//! [`Update`]s; applying one reports what changed for the mesh ([`Summary`]), so no-op
//! and status-only updates are dropped before the debounce.
//!
//! Public surface: [`Watched`] (per-kind ingest rules; implemented for VirtualService,
//! DestinationRule, ServiceEntry, Service, EndpointSlice, Pod → [`PodInfo`] and
//! Namespace → [`NamespaceInfo`]), [`Change`], [`Update`], [`KindStore`], [`Stores`],
//! [`ConfigObject`] (what the status writer reads of an Istio object).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use pilotfish_mesh::api::{
    AuthorizationPolicy, DestinationRule, IstioStatus, PeerAuthentication, RequestAuthentication,
    ServiceEntry, Sidecar, VirtualService,
};
use pilotfish_mesh::config::{ConfigKey, ConfigKind};
use pilotfish_mesh::model::{NodeInfo, PodInfo};
use pilotfish_mesh::push_context::BuildInputs;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::decode::{DecodeFailure, Decoded};
use pilotfish_shared::pipeline::debounce::ChangeClass;

/// `(namespace, name)`; the namespace is empty for cluster-scoped kinds.
pub type ObjectKey = (String, String);

/// The annotation `kubectl apply` (client-side) writes: a full copy of the object.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Per-kind ingest rules.
pub trait Watched:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
    /// What the store keeps of an object (a trimmed object, or a smaller summary).
    type Stored: Clone + Debug + Send + Sync + 'static;
    /// Kind name for logs and metric labels.
    const KIND: &'static str;
    /// The rebuild a change needs.
    const CLASS: ChangeClass;
    /// Trims or converts an object as it arrives.
    fn ingest(self) -> Self::Stored;
    /// Equal as far as the snapshot is concerned: an update between two such values is
    /// dropped before the debounce.
    fn same_for_mesh(a: &Self::Stored, b: &Self::Stored) -> bool;
    /// Equal as far as the status writer is concerned (Istio kinds compare `status`).
    fn same_status(_a: &Self::Stored, _b: &Self::Stored) -> bool {
        true
    }
    /// The status writer reports on objects of this kind, so an object that does not
    /// decode keeps its `status` (for the comparison). Other kinds keep none of it.
    const WRITES_STATUS: bool = false;
    /// This kind's store.
    fn store(stores: &mut Stores) -> &mut KindStore<Self::Stored>;
}

/// Drops what no consumer reads and what would make every write look like a change.
fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// The key of an object from its metadata.
pub fn object_key(meta: &ObjectMeta) -> ObjectKey {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

macro_rules! istio_kind {
    ($ty:ty, $kind:literal, $field:ident) => {
        impl Watched for $ty {
            type Stored = $ty;
            const KIND: &'static str = $kind;
            const CLASS: ChangeClass = ChangeClass::Config;
            fn ingest(mut self) -> Self {
                trim_meta(&mut self.metadata);
                self
            }
            fn same_for_mesh(a: &Self, b: &Self) -> bool {
                // What the builder reads: identity, age (Istio's tie-break), generation
                // (reported in status) and the spec. Status, labels and
                // resourceVersion are not.
                a.metadata.uid == b.metadata.uid
                    && a.metadata.creation_timestamp == b.metadata.creation_timestamp
                    && a.metadata.generation == b.metadata.generation
                    && a.spec == b.spec
            }
            fn same_status(a: &Self, b: &Self) -> bool {
                a.status == b.status
            }
            const WRITES_STATUS: bool = true;
            fn store(stores: &mut Stores) -> &mut KindStore<Self> {
                &mut stores.$field
            }
        }
    };
}

istio_kind!(VirtualService, "VirtualService", virtual_services);
istio_kind!(DestinationRule, "DestinationRule", destination_rules);
istio_kind!(ServiceEntry, "ServiceEntry", service_entries);
istio_kind!(
    PeerAuthentication,
    "PeerAuthentication",
    peer_authentications
);
istio_kind!(Sidecar, "Sidecar", sidecars);
istio_kind!(
    RequestAuthentication,
    "RequestAuthentication",
    request_authentications
);
istio_kind!(
    AuthorizationPolicy,
    "AuthorizationPolicy",
    authorization_policies
);

impl Watched for KubeService {
    type Stored = KubeService;
    const KIND: &'static str = "Service";
    const CLASS: ChangeClass = ChangeClass::Config;
    fn ingest(mut self) -> Self {
        trim_meta(&mut self.metadata);
        // Load-balancer status is not part of the mesh model.
        self.status = None;
        self.metadata.resource_version = None;
        self
    }
    fn same_for_mesh(a: &Self, b: &Self) -> bool {
        a == b
    }
    fn store(stores: &mut Stores) -> &mut KindStore<Self> {
        &mut stores.services
    }
}

impl Watched for EndpointSlice {
    type Stored = EndpointSlice;
    const KIND: &'static str = "EndpointSlice";
    const CLASS: ChangeClass = ChangeClass::Endpoints;
    fn ingest(mut self) -> Self {
        trim_meta(&mut self.metadata);
        self.metadata.resource_version = None;
        self
    }
    fn same_for_mesh(a: &Self, b: &Self) -> bool {
        a == b
    }
    fn store(stores: &mut Stores) -> &mut KindStore<Self> {
        &mut stores.endpoint_slices
    }
}

impl Watched for Pod {
    type Stored = PodInfo;
    const KIND: &'static str = "Pod";
    const CLASS: ChangeClass = ChangeClass::Endpoints;
    /// Only labels, IPs, service account, locality and readiness are kept: Pods are the
    /// most numerous and largest objects the controller sees.
    fn ingest(self) -> PodInfo {
        PodInfo::from_k8s(&self)
    }
    fn same_for_mesh(a: &PodInfo, b: &PodInfo) -> bool {
        a == b
    }
    fn store(stores: &mut Stores) -> &mut KindStore<PodInfo> {
        &mut stores.pods
    }
}

/// Only the name and the locality labels are kept (Istio strips Nodes the same way):
/// they are what a Pod's endpoints take their locality from. A label change rebuilds
/// endpoints only.
impl Watched for Node {
    type Stored = NodeInfo;
    const KIND: &'static str = "Node";
    const CLASS: ChangeClass = ChangeClass::Endpoints;
    fn ingest(self) -> NodeInfo {
        NodeInfo::from_k8s(&self)
    }
    fn same_for_mesh(a: &NodeInfo, b: &NodeInfo) -> bool {
        a == b
    }
    fn store(stores: &mut Stores) -> &mut KindStore<NodeInfo> {
        &mut stores.nodes
    }
}

/// What is kept of a Namespace: whether its content is visible to the mesh.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamespaceInfo {
    pub name: String,
    /// Being deleted: its objects are going away and are no longer served, so a
    /// namespace deletion drops its routes at once rather than object by object.
    pub terminating: bool,
    /// What MeshConfig's `discoverySelectors` select namespaces by.
    pub labels: BTreeMap<String, String>,
}

impl Watched for Namespace {
    type Stored = NamespaceInfo;
    const KIND: &'static str = "Namespace";
    const CLASS: ChangeClass = ChangeClass::Config;
    fn ingest(self) -> NamespaceInfo {
        let phase = self.status.as_ref().and_then(|s| s.phase.as_deref());
        NamespaceInfo {
            name: self.metadata.name.unwrap_or_default(),
            terminating: self.metadata.deletion_timestamp.is_some() || phase == Some("Terminating"),
            labels: self.metadata.labels.unwrap_or_default(),
        }
    }
    fn same_for_mesh(a: &NamespaceInfo, b: &NamespaceInfo) -> bool {
        a == b
    }
    fn store(stores: &mut Stores) -> &mut KindStore<NamespaceInfo> {
        &mut stores.namespaces
    }
}

/// An object that did not decode: what the status writer needs to report it (its
/// identity, and its `status` only for the kinds the writer reports on — a Pod's status
/// can be many kilobytes and is never read).
#[derive(Clone, Debug, PartialEq)]
pub struct FailedObject {
    pub uid: Option<String>,
    pub generation: Option<i64>,
    pub resource_version: Option<String>,
    pub status: Option<Value>,
    pub failure: DecodeFailure,
}

/// One object after ingest.
#[derive(Clone, Debug)]
pub enum Ingested<T> {
    /// The stored form, and the paths of fields Pilotfish does not know (Istio kinds).
    Ok(T, Vec<String>),
    Failed(FailedObject),
}

impl<T> Ingested<T> {
    /// Ingests a decoded object of kind `K`.
    pub fn from_decoded<K: Watched<Stored = T>>(decoded: Decoded<K>) -> (ObjectKey, Self) {
        match decoded {
            Decoded::Ok(object, unknown) => {
                let key = object_key(object.meta());
                (key, Ingested::Ok(object.ingest(), unknown))
            }
            Decoded::Invalid(u) => (
                object_key(&u.metadata),
                Ingested::Failed(FailedObject {
                    uid: u.metadata.uid,
                    generation: u.metadata.generation,
                    resource_version: u.metadata.resource_version,
                    status: u.status.filter(|_| K::WRITES_STATUS),
                    failure: u.failure,
                }),
            ),
        }
    }
}

/// A change to one kind's store, as a watch task reports it.
#[derive(Clone, Debug)]
pub enum Change<T> {
    Apply(ObjectKey, Ingested<T>),
    Delete(ObjectKey),
    /// A complete (re)list: replaces the store's content atomically and marks it synced.
    Relisted(Vec<(ObjectKey, Ingested<T>)>),
}

/// What applying changes did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub added: u64,
    pub updated: u64,
    pub deleted: u64,
    /// Updates that changed nothing the mesh or the status writer reads.
    pub unchanged: u64,
    /// Updates that changed only the status.
    pub status_only: u64,
    /// Objects that did not decode (each time one arrives).
    pub decode_failures: u64,
    /// A decode failure appeared, changed or went away: statuses need a look.
    pub failures_changed: bool,
    /// The list completed for the first time.
    pub first_sync: bool,
}

impl Summary {
    /// Something the snapshot depends on changed.
    pub fn mesh_changed(&self) -> bool {
        self.added + self.updated + self.deleted > 0
    }

    /// Something the status writer depends on changed without a rebuild.
    pub fn status_changed(&self) -> bool {
        self.status_only > 0 || self.failures_changed
    }
}

/// The objects of one kind.
#[derive(Debug)]
pub struct KindStore<T> {
    objects: BTreeMap<ObjectKey, Arc<T>>,
    /// Objects whose latest version did not decode. The last version that did (if any)
    /// stays in `objects`, so a bad edit never removes what was served.
    failures: BTreeMap<ObjectKey, FailedObject>,
    /// Fields Pilotfish does not know, of the objects that have some.
    unknown_fields: BTreeMap<ObjectKey, Vec<String>>,
    synced: bool,
}

impl<T> Default for KindStore<T> {
    fn default() -> Self {
        KindStore {
            objects: BTreeMap::new(),
            failures: BTreeMap::new(),
            unknown_fields: BTreeMap::new(),
            synced: false,
        }
    }
}

impl<T> KindStore<T> {
    /// Whether the initial list has completed.
    pub fn synced(&self) -> bool {
        self.synced
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Arc<T>> {
        self.objects.get(key)
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<T>> {
        self.objects.values()
    }

    pub fn failures(&self) -> &BTreeMap<ObjectKey, FailedObject> {
        &self.failures
    }

    /// The fields Pilotfish does not know, of each stored object that has some.
    pub fn unknown_fields(&self) -> &BTreeMap<ObjectKey, Vec<String>> {
        &self.unknown_fields
    }

    /// Drops every object (and record of one) whose namespace `keep` refuses; returns how
    /// many objects went.
    pub fn retain_namespaces(&mut self, keep: &dyn Fn(&str) -> bool) -> usize {
        let before = self.objects.len();
        self.objects.retain(|(ns, _), _| keep(ns));
        self.failures.retain(|(ns, _), _| keep(ns));
        self.unknown_fields.retain(|(ns, _), _| keep(ns));
        before - self.objects.len()
    }

    /// Applies one change. `same_for_mesh` / `same_status` are the kind's rules.
    pub fn apply(
        &mut self,
        change: Change<T>,
        same_for_mesh: fn(&T, &T) -> bool,
        same_status: fn(&T, &T) -> bool,
    ) -> Summary {
        let mut summary = Summary::default();
        match change {
            Change::Apply(key, item) => {
                self.apply_one(key, item, same_for_mesh, same_status, &mut summary)
            }
            Change::Delete(key) => {
                if self.objects.remove(&key).is_some() {
                    summary.deleted += 1;
                }
                self.unknown_fields.remove(&key);
                if self.failures.remove(&key).is_some() {
                    summary.failures_changed = true;
                }
            }
            Change::Relisted(items) => {
                let mut listed: std::collections::BTreeSet<ObjectKey> = Default::default();
                for (key, item) in items {
                    listed.insert(key.clone());
                    self.apply_one(key, item, same_for_mesh, same_status, &mut summary);
                }
                // Whatever the list no longer holds was deleted while we were not watching.
                let before = self.objects.len();
                self.objects.retain(|k, _| listed.contains(k));
                self.unknown_fields.retain(|k, _| listed.contains(k));
                summary.deleted += (before - self.objects.len()) as u64;
                let failures_before = self.failures.len();
                self.failures.retain(|k, _| listed.contains(k));
                if self.failures.len() != failures_before {
                    summary.failures_changed = true;
                }
                summary.first_sync = !self.synced;
                self.synced = true;
            }
        }
        summary
    }

    fn apply_one(
        &mut self,
        key: ObjectKey,
        item: Ingested<T>,
        same_for_mesh: fn(&T, &T) -> bool,
        same_status: fn(&T, &T) -> bool,
        summary: &mut Summary,
    ) {
        match item {
            Ingested::Ok(value, unknown) => {
                if self.failures.remove(&key).is_some() {
                    summary.failures_changed = true;
                }
                // What the builder reports about the object changes with its unknown fields.
                let unknown_changed = self
                    .unknown_fields
                    .get(&key)
                    .map(Vec::as_slice)
                    .unwrap_or(&[])
                    != unknown.as_slice();
                if unknown.is_empty() {
                    self.unknown_fields.remove(&key);
                } else {
                    self.unknown_fields.insert(key.clone(), unknown);
                }
                match self.objects.get(&key) {
                    None => summary.added += 1,
                    Some(old) if unknown_changed || !same_for_mesh(old, &value) => {
                        summary.updated += 1
                    }
                    Some(old) if !same_status(old, &value) => summary.status_only += 1,
                    Some(_) => summary.unchanged += 1,
                }
                // Stored even when unchanged for the mesh: the status writer reads the
                // newest status and resourceVersion.
                self.objects.insert(key, Arc::new(value));
            }
            Ingested::Failed(failed) => {
                summary.decode_failures += 1;
                if self.failures.get(&key) != Some(&failed) {
                    summary.failures_changed = true;
                }
                self.failures.insert(key, failed);
            }
        }
    }
}

/// One watched change, type-erased so that every watch task can feed one channel.
pub struct Update {
    pub kind: &'static str,
    pub class: ChangeClass,
    apply: Box<dyn FnOnce(&mut Stores) -> Summary + Send>,
}

impl Update {
    pub fn new<K: Watched>(change: Change<K::Stored>) -> Self {
        Update {
            kind: K::KIND,
            class: K::CLASS,
            apply: Box::new(move |stores: &mut Stores| {
                K::store(stores).apply(change, K::same_for_mesh, K::same_status)
            }),
        }
    }

    pub fn apply(self, stores: &mut Stores) -> Summary {
        (self.apply)(stores)
    }
}

impl Debug for Update {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Update")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// What the status writer reads of one Istio object.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigObject {
    pub key: ConfigKey,
    pub uid: Option<String>,
    pub generation: i64,
    pub resource_version: Option<String>,
    pub status: Option<IstioStatus>,
    /// Set when the newest version did not decode.
    pub decode_failure: Option<DecodeFailure>,
    /// A decoded version (the newest, or the last good one) is in the store.
    pub has_typed: bool,
}

/// Every watched kind's store.
#[derive(Debug, Default)]
pub struct Stores {
    pub virtual_services: KindStore<VirtualService>,
    pub destination_rules: KindStore<DestinationRule>,
    pub service_entries: KindStore<ServiceEntry>,
    pub peer_authentications: KindStore<PeerAuthentication>,
    pub sidecars: KindStore<Sidecar>,
    pub request_authentications: KindStore<RequestAuthentication>,
    pub authorization_policies: KindStore<AuthorizationPolicy>,
    pub services: KindStore<KubeService>,
    pub endpoint_slices: KindStore<EndpointSlice>,
    pub pods: KindStore<PodInfo>,
    pub nodes: KindStore<NodeInfo>,
    pub namespaces: KindStore<NamespaceInfo>,
}

impl Stores {
    /// Kinds whose initial list has not completed (empty: a snapshot may be built).
    pub fn unsynced(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (synced, kind) in [
            (self.virtual_services.synced(), VirtualService::KIND),
            (self.destination_rules.synced(), DestinationRule::KIND),
            (self.service_entries.synced(), ServiceEntry::KIND),
            (self.peer_authentications.synced(), PeerAuthentication::KIND),
            (self.sidecars.synced(), Sidecar::KIND),
            (
                self.request_authentications.synced(),
                RequestAuthentication::KIND,
            ),
            (
                self.authorization_policies.synced(),
                AuthorizationPolicy::KIND,
            ),
            (self.services.synced(), KubeService::KIND),
            (self.endpoint_slices.synced(), EndpointSlice::KIND),
            (self.pods.synced(), Pod::KIND),
            (self.nodes.synced(), Node::KIND),
            (self.namespaces.synced(), Namespace::KIND),
        ] {
            if !synced {
                out.push(kind);
            }
        }
        out
    }

    pub fn all_synced(&self) -> bool {
        self.unsynced().is_empty()
    }

    /// Drops the namespaced objects of namespaces `selection` leaves out (a narrower
    /// `discoverySelectors` selection applies at once; the watches list afresh for a wider
    /// one). Returns how many objects went.
    pub fn retain_selected(&mut self, selection: &super::discovery::Selection) -> usize {
        let keep = |ns: &str| selection.allows(ns);
        self.virtual_services.retain_namespaces(&keep)
            + self.destination_rules.retain_namespaces(&keep)
            + self.service_entries.retain_namespaces(&keep)
            + self.peer_authentications.retain_namespaces(&keep)
            + self.sidecars.retain_namespaces(&keep)
            + self.request_authentications.retain_namespaces(&keep)
            + self.authorization_policies.retain_namespaces(&keep)
            + self.services.retain_namespaces(&keep)
            + self.endpoint_slices.retain_namespaces(&keep)
            + self.pods.retain_namespaces(&keep)
    }

    /// The current namespace selection of `selectors`.
    pub fn selection(
        &self,
        selectors: &[pilotfish_mesh::mesh_config::NamespaceSelector],
    ) -> super::discovery::Selection {
        super::discovery::select(
            selectors,
            self.namespaces.synced(),
            self.namespaces
                .values()
                .map(|n| (n.name.as_str(), &n.labels)),
        )
    }

    /// Object counts by kind, for `/debug/leader`.
    pub fn counts(&self) -> BTreeMap<&'static str, usize> {
        BTreeMap::from([
            (VirtualService::KIND, self.virtual_services.len()),
            (DestinationRule::KIND, self.destination_rules.len()),
            (ServiceEntry::KIND, self.service_entries.len()),
            (PeerAuthentication::KIND, self.peer_authentications.len()),
            (Sidecar::KIND, self.sidecars.len()),
            (
                RequestAuthentication::KIND,
                self.request_authentications.len(),
            ),
            (AuthorizationPolicy::KIND, self.authorization_policies.len()),
            (KubeService::KIND, self.services.len()),
            (EndpointSlice::KIND, self.endpoint_slices.len()),
            (Pod::KIND, self.pods.len()),
            (Node::KIND, self.nodes.len()),
            (Namespace::KIND, self.namespaces.len()),
        ])
    }

    /// The builder's inputs: `base` (mesh config, cluster domain) plus every stored
    /// object. Objects in a terminating namespace are left out: they are being deleted.
    pub fn inputs(&self, base: &BuildInputs) -> BuildInputs {
        let terminating: std::collections::BTreeSet<&str> = self
            .namespaces
            .values()
            .filter(|n| n.terminating)
            .map(|n| n.name.as_str())
            .collect();
        fn live<'a, T: 'a>(
            store: &'a KindStore<T>,
            terminating: &'a std::collections::BTreeSet<&str>,
        ) -> impl Iterator<Item = Arc<T>> + 'a {
            store
                .objects
                .iter()
                .filter(|((ns, _), _)| !terminating.contains(ns.as_str()))
                .map(|(_, v)| v.clone())
        }
        BuildInputs {
            mesh: base.mesh.clone(),
            cluster_domain: base.cluster_domain.clone(),
            services: live(&self.services, &terminating).collect(),
            endpoint_slices: live(&self.endpoint_slices, &terminating).collect(),
            pods: live(&self.pods, &terminating).collect(),
            // Cluster-scoped: no namespace to be terminating.
            nodes: self.nodes.objects.values().cloned().collect(),
            virtual_services: live(&self.virtual_services, &terminating).collect(),
            destination_rules: live(&self.destination_rules, &terminating).collect(),
            service_entries: live(&self.service_entries, &terminating).collect(),
            peer_authentications: live(&self.peer_authentications, &terminating).collect(),
            sidecars: live(&self.sidecars, &terminating).collect(),
            request_authentications: live(&self.request_authentications, &terminating).collect(),
            jwks: base.jwks.clone(),
            authorization_policies: live(&self.authorization_policies, &terminating).collect(),
            input_warnings: self.unknown_field_warnings(&terminating),
            send_unhealthy_endpoints: base.send_unhealthy_endpoints,
            enable_tls_on_sidecar_ingress: base.enable_tls_on_sidecar_ingress,
        }
    }

    /// Warnings about the fields Pilotfish does not know, of the Istio objects the build reads.
    fn unknown_field_warnings(
        &self,
        terminating: &std::collections::BTreeSet<&str>,
    ) -> Vec<pilotfish_mesh::config::ConfigError> {
        let mut out = Vec::new();
        for (kind, fields) in [
            (
                ConfigKind::VirtualService,
                self.virtual_services.unknown_fields(),
            ),
            (
                ConfigKind::DestinationRule,
                self.destination_rules.unknown_fields(),
            ),
            (
                ConfigKind::ServiceEntry,
                self.service_entries.unknown_fields(),
            ),
            (
                ConfigKind::PeerAuthentication,
                self.peer_authentications.unknown_fields(),
            ),
            (ConfigKind::Sidecar, self.sidecars.unknown_fields()),
            (
                ConfigKind::RequestAuthentication,
                self.request_authentications.unknown_fields(),
            ),
            (
                ConfigKind::AuthorizationPolicy,
                self.authorization_policies.unknown_fields(),
            ),
        ] {
            for ((namespace, name), paths) in fields {
                if terminating.contains(namespace.as_str()) {
                    continue;
                }
                let key = ConfigKey::new(kind, namespace.clone(), name.clone());
                out.extend(
                    paths
                        .iter()
                        .map(|p| pilotfish_mesh::document::unknown_field_warning(&key, p)),
                );
            }
        }
        out
    }

    /// Every Istio object, as the status writer sees it.
    pub fn config_objects(&self) -> Vec<ConfigObject> {
        let mut out = Vec::new();
        collect_config(
            &self.virtual_services,
            ConfigKind::VirtualService,
            |o| (&o.metadata, o.status.as_ref()),
            &mut out,
        );
        collect_config(
            &self.destination_rules,
            ConfigKind::DestinationRule,
            |o| (&o.metadata, o.status.as_ref()),
            &mut out,
        );
        collect_config(
            &self.service_entries,
            ConfigKind::ServiceEntry,
            |o| (&o.metadata, o.status.as_ref()),
            &mut out,
        );
        collect_config(
            &self.peer_authentications,
            ConfigKind::PeerAuthentication,
            |o| (&o.metadata, o.status.as_ref()),
            &mut out,
        );
        collect_config(
            &self.sidecars,
            ConfigKind::Sidecar,
            |o| (&o.metadata, o.status.as_ref()),
            &mut out,
        );
        collect_config(
            &self.request_authentications,
            ConfigKind::RequestAuthentication,
            |o| (&o.metadata, o.status.as_ref()),
            &mut out,
        );
        collect_config(
            &self.authorization_policies,
            ConfigKind::AuthorizationPolicy,
            |o| (&o.metadata, o.status.as_ref()),
            &mut out,
        );
        out
    }
}

fn collect_config<T>(
    store: &KindStore<T>,
    kind: ConfigKind,
    parts: fn(&T) -> (&ObjectMeta, Option<&IstioStatus>),
    out: &mut Vec<ConfigObject>,
) {
    let keys: std::collections::BTreeSet<&ObjectKey> =
        store.objects.keys().chain(store.failures.keys()).collect();
    for key in keys {
        let config_key = ConfigKey::new(kind, key.0.clone(), key.1.clone());
        match (store.failures.get(key), store.objects.get(key)) {
            (Some(failed), typed) => out.push(ConfigObject {
                key: config_key,
                uid: failed.uid.clone(),
                generation: failed.generation.unwrap_or(0),
                resource_version: failed.resource_version.clone(),
                // A status that does not read as IstioStatus is replaced by ours.
                status: failed
                    .status
                    .clone()
                    .and_then(|s| serde_json::from_value(s).ok()),
                decode_failure: Some(failed.failure.clone()),
                has_typed: typed.is_some(),
            }),
            (None, Some(object)) => {
                let (meta, status) = parts(object);
                out.push(ConfigObject {
                    key: config_key,
                    uid: meta.uid.clone(),
                    generation: meta.generation.unwrap_or(0),
                    resource_version: meta.resource_version.clone(),
                    status: status.cloned(),
                    decode_failure: None,
                    has_typed: true,
                });
            }
            (None, None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::api::{IstioCondition, VirtualServiceSpec};

    fn mk_vs(name: &str, generation: i64, hosts: &[&str]) -> VirtualService {
        let mut vs = VirtualService::new(
            name,
            VirtualServiceSpec {
                hosts: hosts.iter().map(|h| h.to_string()).collect(),
                ..Default::default()
            },
        );
        vs.metadata.namespace = Some("default".into());
        vs.metadata.generation = Some(generation);
        vs.metadata.uid = Some(format!("uid-{name}"));
        vs
    }

    fn key(name: &str) -> ObjectKey {
        ("default".into(), name.into())
    }

    fn apply_vs(stores: &mut Stores, change: Change<VirtualService>) -> Summary {
        Update::new::<VirtualService>(change).apply(stores)
    }

    fn failed(generation: i64, message: &str) -> Ingested<VirtualService> {
        Ingested::Failed(FailedObject {
            uid: Some("uid-r".into()),
            generation: Some(generation),
            resource_version: Some("9".into()),
            status: None,
            failure: DecodeFailure {
                path: "spec.http[0].timeout".into(),
                message: message.into(),
            },
        })
    }

    #[test]
    fn ingest_trims_managed_fields_and_the_last_applied_annotation() {
        let mut vs = mk_vs("r", 1, &["a"]);
        vs.metadata.managed_fields = Some(vec![Default::default()]);
        vs.metadata.annotations = Some(BTreeMap::from([
            (LAST_APPLIED_ANNOTATION.to_string(), "{...}".to_string()),
            ("team".to_string(), "mesh".to_string()),
        ]));
        let vs = vs.ingest();
        assert_eq!(vs.metadata.managed_fields, None);
        assert_eq!(
            vs.metadata.annotations,
            Some(BTreeMap::from([("team".to_string(), "mesh".to_string())]))
        );
    }

    #[test]
    fn a_relist_marks_the_store_synced_and_deletes_what_is_gone() {
        let mut stores = Stores::default();
        assert!(stores.unsynced().contains(&"VirtualService"));
        let s = apply_vs(
            &mut stores,
            Change::Apply(
                key("old"),
                Ingested::Ok(mk_vs("old", 1, &["a"]), Vec::new()),
            ),
        );
        assert_eq!(s.added, 1);
        let s = apply_vs(
            &mut stores,
            Change::Relisted(vec![(
                key("new"),
                Ingested::Ok(mk_vs("new", 1, &["b"]), Vec::new()),
            )]),
        );
        assert_eq!((s.added, s.deleted), (1, 1));
        assert!(s.first_sync);
        assert!(stores.virtual_services.synced());
        assert!(stores.virtual_services.get(&key("old")).is_none());
        let s = apply_vs(
            &mut stores,
            Change::Relisted(vec![(
                key("new"),
                Ingested::Ok(mk_vs("new", 1, &["b"]), Vec::new()),
            )]),
        );
        assert_eq!(s.unchanged, 1);
        assert!(!s.first_sync && !s.mesh_changed());
    }

    #[test]
    fn status_only_and_no_op_updates_are_not_mesh_changes() {
        let mut stores = Stores::default();
        apply_vs(
            &mut stores,
            Change::Apply(key("r"), Ingested::Ok(mk_vs("r", 1, &["a"]), Vec::new())),
        );
        let mut with_status = mk_vs("r", 1, &["a"]);
        with_status.metadata.resource_version = Some("7".into());
        with_status.status = Some(IstioStatus {
            conditions: vec![IstioCondition {
                r#type: "Reconciled".into(),
                status: "True".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        let s = apply_vs(
            &mut stores,
            Change::Apply(key("r"), Ingested::Ok(with_status.clone(), Vec::new())),
        );
        assert_eq!(s.status_only, 1);
        assert!(!s.mesh_changed() && s.status_changed());
        // The store holds the newest status for the status writer.
        let objects = stores.config_objects();
        assert_eq!(objects[0].resource_version.as_deref(), Some("7"));
        assert!(objects[0].status.is_some());
        let mut relabelled = with_status.clone();
        relabelled.metadata.labels = Some(BTreeMap::from([("x".into(), "y".into())]));
        let s = apply_vs(
            &mut stores,
            Change::Apply(key("r"), Ingested::Ok(relabelled, Vec::new())),
        );
        assert_eq!(s.unchanged, 1);
        assert!(!s.mesh_changed() && !s.status_changed());
        let s = apply_vs(
            &mut stores,
            Change::Apply(key("r"), Ingested::Ok(mk_vs("r", 2, &["b"]), Vec::new())),
        );
        assert_eq!(s.updated, 1);
    }

    #[test]
    fn a_version_that_does_not_decode_keeps_the_last_good_one() {
        let mut stores = Stores::default();
        apply_vs(
            &mut stores,
            Change::Apply(key("r"), Ingested::Ok(mk_vs("r", 1, &["a"]), Vec::new())),
        );
        let s = apply_vs(
            &mut stores,
            Change::Apply(key("r"), failed(2, "invalid duration")),
        );
        assert_eq!(s.decode_failures, 1);
        assert!(s.failures_changed && !s.mesh_changed());
        assert_eq!(
            stores.virtual_services.get(&key("r")).unwrap().spec.hosts,
            ["a"],
            "the last decoded version stays in use"
        );
        let objects = stores.config_objects();
        assert_eq!(objects.len(), 1);
        assert_eq!(objects[0].generation, 2);
        assert!(objects[0].has_typed);
        assert_eq!(
            objects[0].decode_failure.as_ref().unwrap().path,
            "spec.http[0].timeout"
        );
        // The same failure again changes nothing.
        let s = apply_vs(
            &mut stores,
            Change::Apply(key("r"), failed(2, "invalid duration")),
        );
        assert!(!s.failures_changed);
        // A fixed version clears it.
        let s = apply_vs(
            &mut stores,
            Change::Apply(key("r"), Ingested::Ok(mk_vs("r", 3, &["c"]), Vec::new())),
        );
        assert!(s.failures_changed && s.mesh_changed());
        assert_eq!(stores.config_objects()[0].decode_failure, None);
        // Deleting removes both.
        let s = apply_vs(&mut stores, Change::Apply(key("r"), failed(4, "x")));
        assert!(s.failures_changed);
        let s = apply_vs(&mut stores, Change::Delete(key("r")));
        assert_eq!(s.deleted, 1);
        assert!(stores.config_objects().is_empty());
    }

    #[test]
    fn pods_are_kept_as_pod_info_and_status_churn_is_dropped() {
        use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
        let mut stores = Stores::default();
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.labels = Some(BTreeMap::from([("version".into(), "v1".into())]));
        let s = Update::new::<Pod>(Change::Apply(
            key("p"),
            Ingested::Ok(pod.clone().ingest(), Vec::new()),
        ))
        .apply(&mut stores);
        assert_eq!(s.added, 1);
        pod.status = Some(PodStatus {
            container_statuses: Some(vec![ContainerStatus {
                restart_count: 3,
                ..Default::default()
            }]),
            ..Default::default()
        });
        let s = Update::new::<Pod>(Change::Apply(
            key("p"),
            Ingested::Ok(pod.ingest(), Vec::new()),
        ))
        .apply(&mut stores);
        assert_eq!(s.unchanged, 1, "a restart count is nothing the mesh reads");
        assert_eq!(
            stores
                .pods
                .get(&key("p"))
                .unwrap()
                .labels
                .get("version")
                .map(String::as_str),
            Some("v1")
        );
    }

    #[test]
    fn a_pod_that_does_not_decode_keeps_nothing_of_its_status() {
        let value = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": "u1",
                         "annotations": {"big": "x".repeat(10_000)}},
            "spec": {"containers": "not a list"},
            "status": {"phase": "Running", "message": "y".repeat(10_000)},
        });
        let decoded = Decoded::<Pod>::from_value(value.clone()).unwrap();
        let (key, ingested) = Ingested::from_decoded(decoded);
        assert_eq!(key, ("default".to_string(), "p".to_string()));
        let Ingested::Failed(failed) = ingested else {
            panic!("the Pod should not decode")
        };
        assert_eq!(failed.status, None);
        assert!(
            format!("{failed:?}").len() < 1_000,
            "only the identity and the reason: {failed:?}"
        );
        // An Istio object keeps its status: the writer compares with it.
        let mut vs = value;
        vs["apiVersion"] = "networking.istio.io/v1".into();
        vs["kind"] = "VirtualService".into();
        vs["spec"] = serde_json::json!({"hosts": "not a list"});
        let decoded = Decoded::<VirtualService>::from_value(vs).unwrap();
        let (_, Ingested::Failed(failed)) = Ingested::from_decoded(decoded) else {
            panic!("the VirtualService should not decode")
        };
        assert!(failed.status.is_some());
    }

    #[test]
    fn inputs_leave_out_terminating_namespaces() {
        let mut stores = Stores::default();
        apply_vs(
            &mut stores,
            Change::Apply(key("r"), Ingested::Ok(mk_vs("r", 1, &["a"]), Vec::new())),
        );
        let mut gone = mk_vs("g", 1, &["b"]);
        gone.metadata.namespace = Some("old".into());
        apply_vs(
            &mut stores,
            Change::Apply(("old".into(), "g".into()), Ingested::Ok(gone, Vec::new())),
        );
        Update::new::<Namespace>(Change::Apply(
            (String::new(), "old".into()),
            Ingested::Ok(
                NamespaceInfo {
                    name: "old".into(),
                    terminating: true,
                    labels: BTreeMap::new(),
                },
                Vec::new(),
            ),
        ))
        .apply(&mut stores);
        let inputs = stores.inputs(&BuildInputs::default());
        assert_eq!(inputs.virtual_services.len(), 1);
        assert_eq!(
            inputs.virtual_services[0].metadata.name.as_deref(),
            Some("r")
        );
    }
}
