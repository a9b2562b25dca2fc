//! The immutable snapshot of the mesh ([`PushContext`]) and the queries the xDS generators
//! ask of it. Built by the pure [`build`] function (or decoded from a blob by the codec),
//! shared as `Arc<PushContext>`, never mutated.
//!
//! Queries follow Istio's precedence rules: which service wins when a host is declared in
//! several namespaces, which VirtualService routes a host, and which DestinationRule
//! applies to a proxy (proxy namespace, then the service's namespace, then the root
//! namespace; workload-selector rules before general ones; most specific host first;
//! same-host rules merged oldest first), each subject to `exportTo` (`visibility`), and which mutual TLS mode a workload's inbound
//! ports take from PeerAuthentications (mesh, namespace, workload; `peer_authn`), and which
//! JWT rules (RequestAuthentication) and key sets a sidecar verifies tokens with
//! (`request_authn`).

pub mod authz;
mod build;
mod delegate;
mod diff;
pub mod hosts;
pub mod notices;
pub mod peer_authn;
mod references;
pub mod request_authn;
mod service_entry;
pub mod sidecar;
mod validate;
pub mod visibility;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use std::sync::Arc;
use xxhash_rust::xxh3::Xxh3Default;

use crate::api::{
    DestinationRuleSpec, JwtRule, PeerAuthenticationSpec, RequestAuthenticationSpec, SidecarSpec,
    VirtualServiceSpec,
};
use crate::config::{ConfigKey, ConfigKind};
use crate::mesh_config::MeshConfig;
use crate::model::{Proxy, Service, ServiceEndpoints};

pub use authz::{AuthorizationPolicyConfig, AuthorizationPolicyEntry, WorkloadAuthorization};
pub use build::{BuildInputs, BuildOutput, build, build_endpoints_only};
pub use diff::{ChangeSummary, diff, virtual_service_hosts_changed};
pub use peer_authn::EffectiveMtls;
pub use request_authn::{JwksOutcome, JwksSource};
pub use validate::{
    is_valid_cipher_suite, validate_authorization_policy, validate_destination_rule,
    validate_peer_authentication, validate_request_authentication, validate_service_entry,
    validate_sidecar, validate_virtual_service,
};
use visibility::DestinationRuleIndex;

/// Metadata kept for an accepted config object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigMeta {
    pub name: String,
    pub namespace: String,
    /// Creation time (ms since the epoch): Istio's "oldest wins" tie-break.
    pub creation_ms: i64,
    pub generation: i64,
}

/// An accepted (validated, resolved) config: hosts are FQDNs, delegates are expanded.
#[derive(Clone, Debug, PartialEq)]
pub struct Config<T> {
    pub meta: ConfigMeta,
    pub spec: T,
}

pub type VirtualServiceConfig = Config<VirtualServiceSpec>;
pub type DestinationRuleConfig = Config<DestinationRuleSpec>;
pub type PeerAuthenticationConfig = Config<PeerAuthenticationSpec>;
pub type SidecarConfig = Config<SidecarSpec>;
pub type RequestAuthenticationConfig = Config<RequestAuthenticationSpec>;

/// Everything a snapshot holds; [`PushContext`] adds indexes over it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MeshData {
    pub mesh: MeshConfig,
    pub cluster_domain: String,
    /// Sorted by (hostname, namespace).
    pub services: Vec<Arc<Service>>,
    /// Sorted by (hostname, namespace).
    pub endpoints: Vec<Arc<ServiceEndpoints>>,
    /// Sorted by (namespace, name).
    pub virtual_services: Vec<Arc<VirtualServiceConfig>>,
    /// Sorted by (namespace, name).
    pub destination_rules: Vec<Arc<DestinationRuleConfig>>,
    /// Sorted by (namespace, name).
    pub peer_authentications: Vec<Arc<PeerAuthenticationConfig>>,
    /// Sorted by (namespace, name).
    pub sidecars: Vec<Arc<SidecarConfig>>,
    /// Sorted by (namespace, name).
    pub request_authentications: Vec<Arc<RequestAuthenticationConfig>>,
    /// The fetched key set (or why there is none) of every source the accepted
    /// RequestAuthentications need: resolved by the controller, served as is.
    pub jwks: std::collections::BTreeMap<JwksSource, JwksOutcome>,
    pub authorization_policies: Vec<Arc<AuthorizationPolicyConfig>>,
}

/// A 64-bit content hash of one item.
pub type ItemHash = u64;

/// Content hashes of every item, so two snapshots can be compared cheaply and caches can
/// be keyed by content. The hashes are process-local (XXH3 over the in-memory value, fed
/// through `Hash`): they compare snapshots within one process and are never sent anywhere;
/// what crosses processes is versioned by the blob's SHA-256.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ItemHashes {
    pub services: HashMap<(String, String), ItemHash>,
    pub endpoints: HashMap<(String, String), ItemHash>,
    pub configs: HashMap<ConfigKey, ItemHash>,
}

/// The DestinationRule that applies to one (proxy, host): possibly several same-host
/// rules merged (oldest first: its traffic policy wins, later subsets are appended).
#[derive(Clone, Debug, PartialEq)]
pub struct EffectiveDestinationRule {
    pub spec: DestinationRuleSpec,
    /// The rules merged into `spec`, oldest first.
    pub sources: Vec<ConfigMeta>,
}

/// The immutable mesh snapshot.
#[derive(Debug, Default)]
pub struct PushContext {
    data: MeshData,
    hashes: ItemHashes,
    /// hostname → indexes into `data.services`, oldest first.
    services_by_host: HashMap<String, Vec<usize>>,
    endpoints_by_service: HashMap<(String, String), usize>,
    /// Exact VirtualService host → indexes into `data.virtual_services`; wildcard hosts
    /// are kept apart because they need a scan.
    vs_by_host: HashMap<String, Vec<usize>>,
    vs_wildcards: Vec<(String, usize)>,
    /// DestinationRules as Istio indexes them for `exportTo` (`visibility`).
    dr_index: DestinationRuleIndex,
    /// namespace → indexes into `data.peer_authentications`.
    pa_by_namespace: HashMap<String, Vec<usize>>,
    /// namespace → indexes into `data.authorization_policies`, oldest first.
    ap_by_namespace: HashMap<String, Vec<usize>>,
}

fn item_hash<T: Hash + ?Sized>(item: &T) -> ItemHash {
    let mut hasher = Xxh3Default::new();
    item.hash(&mut hasher);
    hasher.finish()
}

/// Hashes a config spec through its JSON form (specs hold floats, so no `Hash`), streaming
/// into the hasher without building the JSON text.
fn spec_hash<T: serde::Serialize>(meta: &ConfigMeta, spec: &T) -> ItemHash {
    struct HashWriter(Xxh3Default);
    impl std::io::Write for HashWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.update(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = HashWriter(Xxh3Default::new());
    (meta.creation_ms, meta.generation).hash(&mut w.0);
    // Writing into a hasher cannot fail, and serializing plain structs cannot either.
    let _ = serde_json::to_writer(&mut w, spec);
    w.0.finish()
}

impl PushContext {
    /// Indexes `data`. `data` must already be sorted as [`MeshData`] documents.
    pub fn from_data(data: MeshData) -> PushContext {
        let mut hashes = ItemHashes::default();
        let mut services_by_host: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, s) in data.services.iter().enumerate() {
            hashes
                .services
                .insert((s.hostname.clone(), s.namespace.clone()), item_hash(&**s));
            services_by_host
                .entry(s.hostname.clone())
                .or_default()
                .push(i);
        }
        for list in services_by_host.values_mut() {
            list.sort_by_key(|&i| {
                (
                    data.services[i].creation_ms,
                    data.services[i].namespace.clone(),
                )
            });
        }
        let mut endpoints_by_service = HashMap::new();
        for (i, e) in data.endpoints.iter().enumerate() {
            let key = (e.hostname.clone(), e.namespace.clone());
            hashes.endpoints.insert(key.clone(), item_hash(&**e));
            endpoints_by_service.insert(key, i);
        }
        let mut vs_by_host: HashMap<String, Vec<usize>> = HashMap::new();
        let mut vs_wildcards = Vec::new();
        for (i, vs) in data.virtual_services.iter().enumerate() {
            hashes.configs.insert(
                ConfigKey::new(
                    ConfigKind::VirtualService,
                    &vs.meta.namespace,
                    &vs.meta.name,
                ),
                spec_hash(&vs.meta, &vs.spec),
            );
            for host in &vs.spec.hosts {
                if host.starts_with('*') {
                    vs_wildcards.push((host.clone(), i));
                } else {
                    vs_by_host.entry(host.clone()).or_default().push(i);
                }
            }
        }
        for dr in &data.destination_rules {
            hashes.configs.insert(
                ConfigKey::new(
                    ConfigKind::DestinationRule,
                    &dr.meta.namespace,
                    &dr.meta.name,
                ),
                spec_hash(&dr.meta, &dr.spec),
            );
        }
        let dr_index = DestinationRuleIndex::build(&data.mesh, &data.destination_rules);
        let mut pa_by_namespace: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, pa) in data.peer_authentications.iter().enumerate() {
            hashes.configs.insert(
                ConfigKey::new(
                    ConfigKind::PeerAuthentication,
                    &pa.meta.namespace,
                    &pa.meta.name,
                ),
                spec_hash(&pa.meta, &pa.spec),
            );
            pa_by_namespace
                .entry(pa.meta.namespace.clone())
                .or_default()
                .push(i);
        }
        for sc in &data.sidecars {
            hashes.configs.insert(
                ConfigKey::new(ConfigKind::Sidecar, &sc.meta.namespace, &sc.meta.name),
                spec_hash(&sc.meta, &sc.spec),
            );
        }
        for ra in &data.request_authentications {
            // The key sets its rules use are part of what it means to a sidecar: a
            // refreshed set changes the policy's hash, so the listeners it shapes follow.
            let mut hash = spec_hash(&ra.meta, &ra.spec);
            for rule in &ra.spec.jwt_rules {
                hash = item_hash(&(hash, request_authn::local_jwks(rule, &data.jwks)));
            }
            hashes.configs.insert(
                ConfigKey::new(
                    ConfigKind::RequestAuthentication,
                    &ra.meta.namespace,
                    &ra.meta.name,
                ),
                hash,
            );
        }
        let mut ap_by_namespace: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, ap) in data.authorization_policies.iter().enumerate() {
            hashes.configs.insert(
                ConfigKey::new(
                    ConfigKind::AuthorizationPolicy,
                    &ap.meta.namespace,
                    &ap.meta.name,
                ),
                spec_hash(&ap.meta, &ap.spec),
            );
            ap_by_namespace
                .entry(ap.meta.namespace.clone())
                .or_default()
                .push(i);
        }
        // Istio lists each namespace's policies oldest first.
        for list in ap_by_namespace.values_mut() {
            list.sort_by(|&a, &b| {
                config_age_order(
                    &data.authorization_policies[a].meta,
                    &data.authorization_policies[b].meta,
                )
            });
        }
        PushContext {
            data,
            hashes,
            services_by_host,
            endpoints_by_service,
            vs_by_host,
            vs_wildcards,
            dr_index,
            pa_by_namespace,
            ap_by_namespace,
        }
    }

    pub fn data(&self) -> &MeshData {
        &self.data
    }

    pub fn mesh(&self) -> &MeshConfig {
        &self.data.mesh
    }

    pub fn cluster_domain(&self) -> &str {
        &self.data.cluster_domain
    }

    pub fn hashes(&self) -> &ItemHashes {
        &self.hashes
    }

    /// Every service, sorted by (hostname, namespace).
    pub fn services(&self) -> &[Arc<Service>] {
        &self.data.services
    }

    /// The service `hostname` of `namespace` itself (no visibility rules applied).
    pub fn service(&self, hostname: &str, namespace: &str) -> Option<&Arc<Service>> {
        self.services_by_host
            .get(hostname)?
            .iter()
            .map(|&i| &self.data.services[i])
            .find(|s| s.namespace == namespace)
    }

    /// The service a proxy in `namespace` reaches under `hostname`: the one in its own
    /// namespace if visible, otherwise the oldest visible one (Istio's rule).
    pub fn service_for(&self, hostname: &str, namespace: &str) -> Option<&Arc<Service>> {
        let candidates = self.services_by_host.get(hostname)?;
        let visible = || {
            candidates
                .iter()
                .map(|&i| &self.data.services[i])
                .filter(|s| self.service_visible(s, namespace))
        };
        visible()
            .find(|s| s.namespace == namespace)
            .or_else(|| visible().next())
    }

    /// Services visible to a proxy in `namespace`, one per hostname, sorted by hostname.
    pub fn services_visible_to(&self, namespace: &str) -> Vec<&Arc<Service>> {
        let mut out: Vec<&Arc<Service>> = Vec::new();
        for s in &self.data.services {
            if out.last().is_some_and(|last| last.hostname == s.hostname) {
                continue;
            }
            if let Some(chosen) = self.service_for(&s.hostname, namespace) {
                out.push(chosen);
            }
        }
        out
    }

    /// Whether a proxy in `namespace` sees `s` (its `exportTo`, else the mesh default).
    pub fn service_visible(&self, s: &Service, namespace: &str) -> bool {
        visibility::service_visible(&self.data.mesh, s, namespace)
    }

    /// Endpoints of `service` (all ports).
    pub fn endpoints(&self, service: &Service) -> Option<&Arc<ServiceEndpoints>> {
        let i = *self
            .endpoints_by_service
            .get(&(service.hostname.clone(), service.namespace.clone()))?;
        Some(&self.data.endpoints[i])
    }

    /// Every accepted VirtualService, sorted by (namespace, name).
    pub fn virtual_services(&self) -> &[Arc<VirtualServiceConfig>] {
        &self.data.virtual_services
    }

    /// Every accepted DestinationRule, sorted by (namespace, name).
    pub fn destination_rules(&self) -> &[Arc<DestinationRuleConfig>] {
        &self.data.destination_rules
    }

    /// Every accepted Sidecar, sorted by (namespace, name).
    pub fn sidecars(&self) -> &[Arc<SidecarConfig>] {
        &self.data.sidecars
    }

    /// Every accepted RequestAuthentication, sorted by (namespace, name).
    pub fn request_authentications(&self) -> &[Arc<RequestAuthenticationConfig>] {
        &self.data.request_authentications
    }

    /// The fetched key sets (or failures) of the RequestAuthentications' sources.
    pub fn jwks(&self) -> &std::collections::BTreeMap<JwksSource, JwksOutcome> {
        &self.data.jwks
    }

    /// The JWT rules that apply to a sidecar workload, ordered by issuer
    /// ([`request_authn::rules_for_workload`]).
    pub fn jwt_rules_for_workload(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Vec<&JwtRule> {
        request_authn::rules_for_workload(
            &self.data.mesh.root_namespace,
            namespace,
            labels,
            &self.data.request_authentications,
        )
    }

    /// Every key-set source the accepted RequestAuthentications need fetched, with the
    /// longest fetch timeout of the rules naming it.
    pub fn jwks_sources(&self) -> std::collections::BTreeMap<JwksSource, std::time::Duration> {
        let mut out = std::collections::BTreeMap::new();
        for rule in self
            .data
            .request_authentications
            .iter()
            .flat_map(|ra| ra.spec.jwt_rules.iter())
        {
            if let Some(source) = JwksSource::of_rule(rule) {
                let timeout = out.entry(source).or_insert(rule.fetch_timeout());
                *timeout = (*timeout).max(rule.fetch_timeout());
            }
        }
        out
    }

    /// Every accepted AuthorizationPolicy, sorted by (namespace, name).
    pub fn authorization_policies(&self) -> &[Arc<AuthorizationPolicyConfig>] {
        &self.data.authorization_policies
    }

    /// The AuthorizationPolicies that apply to a workload in `namespace` with `labels`,
    /// grouped by action, as Istio selects them (root namespace first, then the
    /// workload's; each oldest first; `authz`).
    pub fn authorization_for_workload(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> WorkloadAuthorization {
        let root = self.data.mesh.root_namespace.as_str();
        let mut lookup = vec![root];
        if root != namespace {
            lookup.push(namespace);
        }
        let candidates = lookup
            .into_iter()
            .filter_map(|ns| self.ap_by_namespace.get(ns))
            .flatten()
            .map(|&i| &self.data.authorization_policies[i]);
        authz::select(candidates, labels)
    }

    /// Every accepted PeerAuthentication, sorted by (namespace, name).
    pub fn peer_authentications(&self) -> &[Arc<PeerAuthenticationConfig>] {
        &self.data.peer_authentications
    }

    /// The mutual TLS mode (and per-port overrides) of a workload in `namespace` with
    /// `labels`, composed from the mesh, namespace and workload PeerAuthentications with
    /// Istio's precedence; PERMISSIVE when none applies.
    pub fn mtls_for_workload(
        &self,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> EffectiveMtls {
        let root = self.data.mesh.root_namespace.as_str();
        let mut lookup = vec![namespace];
        if root != namespace {
            lookup.push(root);
        }
        let candidates = lookup
            .into_iter()
            .filter_map(|ns| self.pa_by_namespace.get(ns))
            .flatten()
            .map(|&i| &self.data.peer_authentications[i]);
        peer_authn::compose(root, namespace, labels, candidates)
    }

    /// The mutual TLS mode the mesh and namespace PeerAuthentications (those without a
    /// selector) give `namespace` — Istio's `GetNamespaceMutualTLSMode`, with its fallback
    /// to PERMISSIVE when neither sets one. Auto mTLS is off towards a `DISABLE` namespace.
    pub fn namespace_mtls_mode(&self, namespace: &str) -> crate::api::MtlsMode {
        // No workload labels: a selector policy selects nothing.
        self.mtls_for_workload(namespace, &std::collections::BTreeMap::new())
            .mode
    }

    /// Whether a VirtualService applies to sidecars and proxyless clients in `namespace`:
    /// visible there, and bound to the `mesh` gateway (empty `gateways` means `mesh`).
    pub fn virtual_service_applies(&self, vs: &VirtualServiceConfig, namespace: &str) -> bool {
        self.virtual_service_reach(vs, namespace).is_some()
    }

    /// How a proxy in `namespace` sees a `mesh`-bound VirtualService (`None`: not at all).
    fn virtual_service_reach(
        &self,
        vs: &VirtualServiceConfig,
        namespace: &str,
    ) -> Option<visibility::Reach> {
        let mesh_bound =
            vs.spec.gateways.is_empty() || vs.spec.gateways.iter().any(|g| g == "mesh");
        if !mesh_bound {
            return None;
        }
        visibility::virtual_service_reach(
            &self.data.mesh,
            &vs.meta.namespace,
            &vs.spec.export_to,
            namespace,
        )
    }

    /// VirtualServices that apply to a proxy in `namespace`, oldest first.
    pub fn virtual_services_for(&self, namespace: &str) -> Vec<&Arc<VirtualServiceConfig>> {
        let mut out: Vec<_> = self
            .data
            .virtual_services
            .iter()
            .filter(|vs| self.virtual_service_applies(vs, namespace))
            .collect();
        out.sort_by(|a, b| config_age_order(&a.meta, &b.meta));
        out
    }

    /// The VirtualService that routes `hostname` for a proxy in `namespace`: the most
    /// specific matching host wins; for equal hosts, Istio's list order decides — exported
    /// privately to the proxy's namespace, then exported to it by name, then public, the
    /// oldest first within each (one VirtualService per host; later ones are ignored for
    /// that host).
    pub fn virtual_service_for_host(
        &self,
        hostname: &str,
        namespace: &str,
    ) -> Option<&Arc<VirtualServiceConfig>> {
        self.virtual_service_for_host_where(hostname, namespace, |_| true)
    }

    /// [`PushContext::virtual_service_for_host`] among the VirtualServices `keep` accepts
    /// (a Sidecar's imports).
    pub fn virtual_service_for_host_where(
        &self,
        hostname: &str,
        namespace: &str,
        keep: impl Fn(&VirtualServiceConfig) -> bool,
    ) -> Option<&Arc<VirtualServiceConfig>> {
        let exact = self
            .vs_by_host
            .get(hostname)
            .into_iter()
            .flatten()
            .map(|&i| (hostname, i));
        let wild = self
            .vs_wildcards
            .iter()
            .filter(|(pattern, _)| hosts::host_matches(pattern, hostname))
            .map(|(p, i)| (p.as_str(), *i));
        exact
            .chain(wild)
            .map(|(pattern, i)| (pattern, &self.data.virtual_services[i]))
            .filter(|(_, vs)| keep(vs))
            .filter_map(|(pattern, vs)| {
                self.virtual_service_reach(vs, namespace)
                    .map(|reach| (pattern, reach, vs))
            })
            .min_by(|(pa, ra, a), (pb, rb, b)| {
                hosts::specificity(pb)
                    .cmp(&hosts::specificity(pa))
                    .then_with(|| ra.cmp(rb))
                    .then_with(|| config_age_order(&a.meta, &b.meta))
            })
            .map(|(_, _, vs)| vs)
    }

    /// The DestinationRule for traffic from `proxy` to `hostname` (a service in
    /// `service_namespace`, when known), with Istio 1.30's lookup: the proxy's namespace,
    /// then the service's namespace, then the root namespace, each subject to `exportTo`;
    /// the most specific host in the first namespace that has one; workload-selector rules
    /// of the proxy's own namespace first; same-host rules with equal `exportTo` merged
    /// oldest first ([`visibility::DestinationRuleIndex`]).
    pub fn destination_rule(
        &self,
        proxy: &Proxy,
        hostname: &str,
        service_namespace: Option<&str>,
    ) -> Option<EffectiveDestinationRule> {
        self.dr_index.lookup(proxy, hostname, service_namespace)
    }
}

/// Oldest first; ties broken by namespace then name so the order is total and stable.
pub(crate) fn config_age_order(a: &ConfigMeta, b: &ConfigMeta) -> std::cmp::Ordering {
    (a.creation_ms, &a.namespace, &a.name).cmp(&(b.creation_ms, &b.namespace, &b.name))
}

#[cfg(test)]
mod tests;
