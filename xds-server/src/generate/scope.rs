//! What a generated part depends on besides the snapshot: the [`Scope`] of a proxy. Two
//! proxies with equal scopes get byte-identical resources, so the snapshot caches each
//! part once per scope and a thousand identical sidecars cost one generation.
//!
//! A scope holds the client flavour and namespace (visibility), and the proxy's labels only
//! through what they select: the workload-selector DestinationRules and the distinct
//! `sourceLabels` selectors that match them, the proxy's own inbound ports and their
//! mutual TLS mode (PeerAuthentication) and, where locality-aware load balancing is
//! configured, its locality; and the Sidecar that applies to it (an index into the
//! snapshot's Sidecars: with the namespace it determines the whole sidecar scope, so
//! proxies under one Sidecar share its parts). [`ScopeIndex`] precomputes
//! those selectors once per snapshot so a scope costs a few label comparisons.
//!
//! **Client input is classed, not kept.** A proxy claims its namespace, locality and
//! labels; distinct claims must not each cost a cached copy of a scope's parts. The
//! generators read the namespace only by comparing it with namespaces the snapshot
//! names (objects' namespaces, `exportTo` lists, `sourceNamespace` matches, the root
//! namespace), so every namespace the snapshot does not name yields the same output:
//! they share one scope, [`UNNAMED_NAMESPACE`]. Likewise a locality part (region, zone,
//! subzone) is compared only with that part of endpoints' localities and of
//! `failover`/`distribute` rules, so an unknown value becomes [`UNKNOWN_LOCALITY`], and a
//! `failoverPriority` label value no endpoint carries counts as absent (it matches none).
//! The scope's other inputs are selected by configuration (selectors, services,
//! PeerAuthentications), so the number of distinct scopes is bounded by the snapshot,
//! not by clients; the snapshot's cache is capped besides (`generate/snapshot.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use pilotfish_mesh::api::{
    CaptureMode, ConnectionPoolSettings, IstioIngressListener, Labels, LoadBalancerSettings,
    MtlsMode, ServerTlsSettings, SidecarSpec, TrafficPolicy,
};
use pilotfish_mesh::model::{
    Locality, Protocol, Proxy, ProxyGenerator, Service, TargetPort, labels_match,
};
use pilotfish_mesh::push_context::{
    AuthorizationPolicyConfig, EffectiveMtls, JwksOutcome, JwksSource, PeerAuthenticationConfig,
    PushContext, RequestAuthenticationConfig, SidecarConfig, WorkloadAuthorization, authz,
    peer_authn, request_authn,
    sidecar::{inbound_connection_pool, select_sidecar},
};

use super::jwt_authn::{self, ResolvedJwtRule};
use super::names::{TLS_MODE_ISTIO, TLS_MODE_LABEL};

/// The two families of output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Flavor {
    /// Envoy sidecar.
    Sidecar,
    /// Proxyless gRPC: only what gRPC's xDS client accepts.
    Proxyless,
}

impl Flavor {
    pub fn of(proxy: &Proxy) -> Flavor {
        match proxy.generator {
            ProxyGenerator::Envoy => Flavor::Sidecar,
            ProxyGenerator::Grpc => Flavor::Proxyless,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Flavor::Sidecar => "sidecar",
            Flavor::Proxyless => "proxyless",
        }
    }
}

/// A port the proxy's own workload serves (a target port of a service selecting it, or a
/// port of its Sidecar's ingress listeners).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InboundPort {
    pub port: u32,
    pub protocol: Protocol,
    /// Where the inbound cluster sends the traffic (a Sidecar ingress listener's
    /// `defaultEndpoint`); `None`: to the original destination.
    pub endpoint: Option<InboundEndpoint>,
    /// A Sidecar ingress listener's `bind`: the address its chain (or its own listener)
    /// is named by and, when `bound`, listens on; `None`: `0.0.0.0`.
    pub bind: Option<String>,
    /// A Sidecar ingress listener with `captureMode: NONE`: a listener of its own bound to
    /// `bind:port` instead of a chain in `virtualInbound` (Istio's `bindToPort`).
    pub bound: bool,
    /// The inbound cluster's connection pool from the Sidecar
    /// ([`inbound_connection_pool`]); `None`: Istio's default pool.
    pub pool: Option<Canonical<ConnectionPoolSettings>>,
    /// A Sidecar ingress listener's `tls` (kept in the snapshot only with
    /// `--enable-tls-on-sidecar-ingress`): the port's chain terminates it when the
    /// workload's mutual TLS mode for the port is DISABLE.
    pub tls: Option<Canonical<ServerTlsSettings>>,
}

/// A value of the Istio API that a scope carries, compared, ordered and hashed by its
/// canonical JSON (the API types are not `Hash`), so equal settings share parts.
#[derive(Clone, Debug)]
pub struct Canonical<T> {
    pub value: Arc<T>,
    key: String,
}

impl<T: serde::Serialize> Canonical<T> {
    pub fn new(value: &T) -> Self
    where
        T: Clone,
    {
        Canonical {
            key: serde_json::to_string(value).unwrap_or_default(),
            value: Arc::new(value.clone()),
        }
    }
}

impl<T> PartialEq for Canonical<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl<T> Eq for Canonical<T> {}
impl<T> std::hash::Hash for Canonical<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}
impl<T> PartialOrd for Canonical<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Canonical<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

/// A Sidecar ingress listener's `defaultEndpoint`, resolved for one proxy (Istio's
/// `buildInboundClustersFromSidecar`): `127.0.0.1`/`[::1]` are the loopback, `0.0.0.0`/`[::]`
/// the proxy's own IPv4/IPv6 address (the loopback when it has none), `unix://` a socket.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InboundEndpoint {
    Socket { address: String, port: u32 },
    Pipe(String),
}

/// Everything besides the snapshot that a part's content depends on. Parts keep only the
/// fields they read (see [`Scope::for_part`]), so unrelated differences do not split caches.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Scope {
    pub flavor: Option<Flavor>,
    pub namespace: String,
    /// The Sidecar that applies to the proxy (an index into the snapshot's Sidecars,
    /// `PushContext::sidecar_for`), `None` without one.
    pub sidecar: Option<usize>,
    /// Indexes (into [`ScopeIndex`]) of the workload-selector DestinationRules that select
    /// the proxy.
    pub dr_selectors: Vec<usize>,
    /// Indexes of the distinct VirtualService `sourceLabels` selectors matching the proxy.
    pub source_selectors: Vec<usize>,
    /// The proxy's locality, when locality-aware load balancing is configured anywhere.
    pub locality: Option<Locality>,
    /// The proxy's values of the labels named by `failoverPriority` settings.
    pub failover_labels: Vec<(String, Option<String>)>,
    pub inbound: Vec<InboundPort>,
    /// The mutual TLS mode of the proxy's workload (PeerAuthentication; for a proxyless
    /// server mapped by [`proxyless_server_mtls`]).
    pub inbound_mtls: Option<EffectiveMtls>,
    /// The JWT rules (RequestAuthentication) a sidecar's workload verifies, with their
    /// key sets; empty for proxyless clients.
    pub inbound_jwt: Arc<[ResolvedJwtRule]>,
    /// The AuthorizationPolicies that apply to the workload (indexes into the snapshot's,
    /// in Istio's order: root namespace first, each namespace oldest first), for sidecars
    /// and proxyless servers alike.
    pub authz: Vec<usize>,
}

/// The cached parts of a proxy's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// Outbound clusters (and, for sidecars, Passthrough/BlackHole).
    OutboundClusters,
    /// Inbound clusters of a sidecar's own workload ports.
    InboundClusters,
    Endpoints,
    /// Sidecar `virtualOutbound` and per-port listeners, or proxyless api listeners.
    OutboundListeners,
    /// A sidecar's `virtualInbound`.
    InboundListener,
    Routes,
}

impl Scope {
    /// The projection of this scope that `part` depends on.
    pub fn for_part(&self, part: Part) -> Scope {
        let mut s = Scope {
            flavor: self.flavor,
            ..Scope::default()
        };
        match part {
            Part::InboundClusters => {
                // Clusters read a port's protocol, endpoint and pool, not where its chain
                // listens nor its TLS.
                s.inbound = self
                    .inbound
                    .iter()
                    .map(|p| InboundPort {
                        bind: None,
                        bound: false,
                        tls: None,
                        ..p.clone()
                    })
                    .collect();
            }
            Part::InboundListener => {
                s.inbound = self.inbound.clone();
                s.inbound_mtls = self.inbound_mtls.clone();
                s.inbound_jwt = self.inbound_jwt.clone();
                s.authz = self.authz.clone();
            }
            Part::OutboundClusters => {
                s.namespace = self.namespace.clone();
                s.sidecar = self.sidecar;
                s.dr_selectors = self.dr_selectors.clone();
            }
            Part::Endpoints => {
                s.namespace = self.namespace.clone();
                s.sidecar = self.sidecar;
                s.dr_selectors = self.dr_selectors.clone();
                s.locality = self.locality.clone();
                s.failover_labels = self.failover_labels.clone();
            }
            Part::OutboundListeners | Part::Routes => {
                s.namespace = self.namespace.clone();
                s.sidecar = self.sidecar;
                s.dr_selectors = self.dr_selectors.clone();
                s.source_selectors = self.source_selectors.clone();
            }
        }
        s
    }
}

/// The scope namespace of every proxy whose namespace the snapshot does not name (not a
/// valid Kubernetes namespace name, so no real one collides with it).
pub const UNNAMED_NAMESPACE: &str = "\u{0}unnamed";

/// A proxy's locality part that no endpoint or locality rule names.
pub const UNKNOWN_LOCALITY: &str = "\u{0}unknown";

/// Per-snapshot indexes that make [`ScopeIndex::scope`] cheap.
#[derive(Debug, Default)]
pub struct ScopeIndex {
    /// Every namespace the snapshot names (see the module doc).
    named_namespaces: HashSet<String>,
    /// Per locality part (region, zone, subzone): the values endpoints and locality rules
    /// name.
    locality_values: [HashSet<String>; 3],
    /// Per `failoverPriority` label: the values endpoints carry.
    failover_values: HashMap<String, HashSet<String>>,
    /// Workload-selector DestinationRules: (namespace, selector).
    dr_selectors: Vec<(String, Labels)>,
    /// Distinct `sourceLabels` selectors of VirtualService matches.
    source_selectors: Vec<Labels>,
    /// Whether any DestinationRule configures locality-aware load balancing (outlier
    /// detection enables Istio's default locality failover).
    locality_sensitive: bool,
    failover_priority_labels: BTreeSet<String>,
    /// Locality of each endpoint address: a proxy's locality is its own endpoint's.
    locality_by_ip: HashMap<String, Locality>,
    /// Services with a selector, by namespace: candidates for a proxy's inbound ports.
    selecting_services: HashMap<String, Vec<Arc<Service>>>,
    /// Target port per (service host, namespace, service port, endpoint IP), for named
    /// target ports.
    target_ports: HashMap<(String, String, u32, String), u32>,
    root_namespace: String,
    /// PeerAuthentications by namespace.
    peer_authentications: HashMap<String, Vec<Arc<PeerAuthenticationConfig>>>,
    /// The snapshot's Sidecars, in its order (scopes hold indexes into it).
    sidecars: Vec<Arc<SidecarConfig>>,
    /// The snapshot's RequestAuthentications and the key sets their rules use.
    request_authentications: Vec<Arc<RequestAuthenticationConfig>>,
    jwks: BTreeMap<JwksSource, JwksOutcome>,
    /// The snapshot's AuthorizationPolicies (scopes hold indexes into them), and per
    /// namespace their indexes, oldest first.
    authorization_policies: Vec<Arc<AuthorizationPolicyConfig>>,
    authz_by_namespace: HashMap<String, Vec<usize>>,
}

impl ScopeIndex {
    pub fn new(push: &PushContext) -> ScopeIndex {
        let mut index = ScopeIndex {
            root_namespace: push.mesh().root_namespace.clone(),
            named_namespaces: named_namespaces(push),
            sidecars: push.sidecars().to_vec(),
            request_authentications: push.request_authentications().to_vec(),
            jwks: push.jwks().clone(),
            authorization_policies: push.authorization_policies().to_vec(),
            ..ScopeIndex::default()
        };
        for (i, ap) in index.authorization_policies.iter().enumerate() {
            index
                .authz_by_namespace
                .entry(ap.meta.namespace.clone())
                .or_default()
                .push(i);
        }
        let policies = &index.authorization_policies;
        for list in index.authz_by_namespace.values_mut() {
            list.sort_by(|&a, &b| {
                (policies[a].meta.creation_ms, &policies[a].meta.name)
                    .cmp(&(policies[b].meta.creation_ms, &policies[b].meta.name))
            });
        }
        for dr in push.destination_rules() {
            if let Some(sel) = &dr.spec.workload_selector {
                index
                    .dr_selectors
                    .push((dr.meta.namespace.clone(), sel.match_labels.clone()));
            }
            let policies = dr.spec.traffic_policy.iter().chain(
                dr.spec
                    .subsets
                    .iter()
                    .filter_map(|s| s.traffic_policy.as_ref()),
            );
            for policy in policies {
                index.note_locality_policy(policy);
            }
        }
        let mut sources = BTreeSet::new();
        for vs in push.virtual_services() {
            for m in vs.spec.http.iter().flat_map(|r| &r.r#match) {
                if !m.source_labels.is_empty() {
                    sources.insert(m.source_labels.clone());
                }
            }
            for m in vs.spec.tcp.iter().flat_map(|r| &r.r#match) {
                if !m.source_labels.is_empty() {
                    sources.insert(m.source_labels.clone());
                }
            }
        }
        index.source_selectors = sources.into_iter().collect();
        for eps in &push.data().endpoints {
            for port in &eps.ports {
                for e in &port.endpoints {
                    let parts = [&e.locality.region, &e.locality.zone, &e.locality.subzone];
                    for (values, part) in index.locality_values.iter_mut().zip(parts) {
                        if !values.contains(part) {
                            values.insert(part.clone());
                        }
                    }
                    for key in &index.failover_priority_labels {
                        if let Some(v) = e.labels.get(key) {
                            index
                                .failover_values
                                .entry(key.clone())
                                .or_default()
                                .insert(v.clone());
                        }
                    }
                    if !e.locality.is_empty() {
                        index
                            .locality_by_ip
                            .entry(e.address.clone())
                            .or_insert_with(|| e.locality.clone());
                    }
                    index.target_ports.insert(
                        (
                            eps.hostname.clone(),
                            eps.namespace.clone(),
                            port.service_port,
                            e.address.clone(),
                        ),
                        e.port,
                    );
                }
            }
        }
        for pa in push.peer_authentications() {
            index
                .peer_authentications
                .entry(pa.meta.namespace.clone())
                .or_default()
                .push(pa.clone());
        }
        for s in push.services() {
            if !s.selector.is_empty() {
                index
                    .selecting_services
                    .entry(s.namespace.clone())
                    .or_default()
                    .push(s.clone());
            }
        }
        index
    }

    fn note_locality_policy(&mut self, policy: &TrafficPolicy) {
        let lbs = policy.load_balancer.iter().chain(
            policy
                .port_level_settings
                .iter()
                .filter_map(|p| p.load_balancer.as_ref()),
        );
        let outlier = policy.outlier_detection.is_some()
            || policy
                .port_level_settings
                .iter()
                .any(|p| p.outlier_detection.is_some());
        if outlier {
            self.locality_sensitive = true;
        }
        for lb in lbs {
            self.note_lb(lb);
        }
    }

    fn note_lb(&mut self, lb: &LoadBalancerSettings) {
        if let Some(l) = &lb.locality_lb_setting {
            self.locality_sensitive = true;
            self.failover_priority_labels
                .extend(l.failover_priority.iter().cloned());
            // Rules compare a proxy's region with `failover.from`, and its parts with
            // `distribute.from` patterns.
            for f in &l.failover {
                for region in f.from.iter().chain(&f.to) {
                    self.locality_values[0].insert(region.clone());
                }
            }
            for d in &l.distribute {
                for (values, part) in self
                    .locality_values
                    .iter_mut()
                    .zip(d.from.iter().flat_map(|f| f.split('/')))
                {
                    values.insert(part.to_string());
                }
            }
        }
    }

    /// Whether every proxy's scope is the same under `self` as under `other`, given that
    /// the two snapshots differ only in VirtualServices: of those, a scope reads the
    /// namespaces they name (the namespace class) and their `sourceLabels` selectors.
    pub fn same_scopes_as(&self, other: &ScopeIndex) -> bool {
        self.named_namespaces == other.named_namespaces
            && self.source_selectors == other.source_selectors
    }

    /// The scope namespace of a proxy in `namespace`: itself when the snapshot names it,
    /// else [`UNNAMED_NAMESPACE`].
    pub fn namespace_class(&self, namespace: &str) -> String {
        if self.named_namespaces.contains(namespace) {
            namespace.to_string()
        } else {
            UNNAMED_NAMESPACE.to_string()
        }
    }

    /// `locality` with every part no endpoint or rule names replaced by
    /// [`UNKNOWN_LOCALITY`]: compared only for equality, it behaves the same.
    fn locality_class(&self, locality: Locality) -> Locality {
        let class = |values: &HashSet<String>, part: String| {
            if values.contains(&part) {
                part
            } else {
                UNKNOWN_LOCALITY.to_string()
            }
        };
        Locality {
            region: class(&self.locality_values[0], locality.region),
            zone: class(&self.locality_values[1], locality.zone),
            subzone: class(&self.locality_values[2], locality.subzone),
        }
    }

    /// The scope of `proxy`.
    pub fn scope(&self, proxy: &Proxy) -> Scope {
        let flavor = Flavor::of(proxy);
        let dr_selectors = self
            .dr_selectors
            .iter()
            .enumerate()
            .filter(|(_, (ns, sel))| {
                (*ns == proxy.namespace || *ns == self.root_namespace)
                    && labels_match(sel, &proxy.labels)
            })
            .map(|(i, _)| i)
            .collect();
        let source_selectors = self
            .source_selectors
            .iter()
            .enumerate()
            .filter(|(_, sel)| labels_match(sel, &proxy.labels))
            .map(|(i, _)| i)
            .collect();
        let locality = if self.locality_sensitive {
            // The node's own locality first (as Istio), else its endpoint's.
            proxy
                .locality
                .clone()
                .or_else(|| {
                    proxy
                        .ips
                        .iter()
                        .find_map(|ip| self.locality_by_ip.get(&ip.to_string()).cloned())
                })
                .map(|l| self.locality_class(l))
        } else {
            None
        };
        // A value no endpoint carries matches no endpoint, as an absent label does.
        let failover_labels = self
            .failover_priority_labels
            .iter()
            .map(|k| {
                let value = proxy.labels.get(k).filter(|v| {
                    self.failover_values
                        .get(k)
                        .is_some_and(|values| values.contains(*v))
                });
                (k.clone(), value.cloned())
            })
            .collect();
        let sidecar = select_sidecar(
            &self.sidecars,
            &self.root_namespace,
            &proxy.namespace,
            &proxy.labels,
        );
        let (inbound, inbound_mtls) = match flavor {
            Flavor::Sidecar => {
                let spec = sidecar.map(|i| &self.sidecars[i].spec);
                let mut ports = match spec {
                    Some(spec) if !spec.ingress.is_empty() => ingress_ports(&spec.ingress, proxy),
                    _ => self.inbound_ports(proxy),
                };
                if let Some(spec) = spec {
                    with_sidecar_pools(&mut ports, spec);
                }
                (ports, Some(self.mtls(proxy)))
            }
            // A proxyless gRPC server: its ports and their modes as Istio's grpcgen maps
            // them (gRPC cannot do PERMISSIVE).
            Flavor::Proxyless => (
                self.inbound_ports(proxy),
                Some(proxyless_server_mtls(self.mtls(proxy), &proxy.labels)),
            ),
        };
        let inbound_jwt = match flavor {
            Flavor::Sidecar => {
                let rules = request_authn::rules_for_workload(
                    &self.root_namespace,
                    &proxy.namespace,
                    &proxy.labels,
                    &self.request_authentications,
                );
                jwt_authn::resolve(&rules, &self.jwks)
            }
            Flavor::Proxyless => Arc::from([]),
        };
        Scope {
            flavor: Some(flavor),
            namespace: self.namespace_class(&proxy.namespace),
            sidecar,
            dr_selectors,
            source_selectors,
            locality,
            failover_labels,
            inbound,
            inbound_mtls,
            inbound_jwt,
            authz: self.authz(proxy),
        }
    }

    /// The AuthorizationPolicies that apply to the proxy's workload (Istio's
    /// `ListAuthorizationPolicies`: the root namespace's, then its own namespace's).
    fn authz(&self, proxy: &Proxy) -> Vec<usize> {
        let mut lookup = vec![self.root_namespace.as_str()];
        if proxy.namespace != self.root_namespace {
            lookup.push(proxy.namespace.as_str());
        }
        lookup
            .into_iter()
            .filter_map(|ns| self.authz_by_namespace.get(ns))
            .flatten()
            .copied()
            .filter(|&i| {
                authz::selects_workload(&self.authorization_policies[i].spec.policy, &proxy.labels)
            })
            .collect()
    }

    /// The policies a scope's `authz` indexes name, grouped by action.
    pub fn workload_authorization(&self, indexes: &[usize]) -> WorkloadAuthorization {
        authz::group(indexes.iter().map(|&i| &self.authorization_policies[i]))
    }

    /// The workload's mode from the PeerAuthentications of its namespace and the root's.
    fn mtls(&self, proxy: &Proxy) -> EffectiveMtls {
        let own = self.peer_authentications.get(&proxy.namespace);
        let root = (self.root_namespace != proxy.namespace)
            .then(|| self.peer_authentications.get(&self.root_namespace))
            .flatten();
        let candidates = own.into_iter().chain(root).flatten();
        peer_authn::compose(
            &self.root_namespace,
            &proxy.namespace,
            &proxy.labels,
            candidates,
        )
    }

    /// The ports of the proxy's own workload: target ports of the services in its
    /// namespace whose selector matches its labels (Kubernetes' rule, so the answer does
    /// not depend on endpoints, which may change without a full push). A named target
    /// port is resolved from the proxy's own endpoint, else the service port is used.
    fn inbound_ports(&self, proxy: &Proxy) -> Vec<InboundPort> {
        if proxy.labels.is_empty() {
            return Vec::new();
        }
        let mut ports: BTreeMap<u32, Protocol> = BTreeMap::new();
        for s in self
            .selecting_services
            .get(&proxy.namespace)
            .into_iter()
            .flatten()
            .filter(|s| labels_match(&s.selector, &proxy.labels))
        {
            for p in &s.ports {
                if p.protocol == Protocol::Udp {
                    continue;
                }
                let target = match &p.target_port {
                    Some(TargetPort::Number(n)) => *n,
                    _ => proxy
                        .ips
                        .iter()
                        .find_map(|ip| {
                            self.target_ports
                                .get(&(
                                    s.hostname.clone(),
                                    s.namespace.clone(),
                                    p.port,
                                    ip.to_string(),
                                ))
                                .copied()
                        })
                        .unwrap_or(p.port),
                };
                // Two services targeting one port: the first (by host name) decides.
                ports.entry(target).or_insert(p.protocol);
            }
        }
        ports
            .into_iter()
            .map(|(port, protocol)| InboundPort {
                port,
                protocol,
                endpoint: None,
                bind: None,
                bound: false,
                pool: None,
                tls: None,
            })
            .collect()
    }
}

/// A proxyless gRPC server's modes, from its workload's PeerAuthentication modes as
/// Istio's grpcgen maps them: gRPC's filter chain match cannot tell TLS from plaintext (no
/// listener filters), so there is no PERMISSIVE. A PERMISSIVE port is STRICT when the
/// workload carries `security.istio.io/tlsMode: istio` (clients with auto-mTLS will use
/// mTLS to it), else DISABLE (plaintext).
pub fn proxyless_server_mtls(
    effective: EffectiveMtls,
    labels: &BTreeMap<String, String>,
) -> EffectiveMtls {
    let auto_mtls_label = labels.get(TLS_MODE_LABEL).map(String::as_str) == Some(TLS_MODE_ISTIO);
    let map = |mode: MtlsMode| match mode {
        MtlsMode::Strict => MtlsMode::Strict,
        MtlsMode::Permissive if auto_mtls_label => MtlsMode::Strict,
        MtlsMode::Permissive | MtlsMode::Disable | MtlsMode::Unset => MtlsMode::Disable,
    };
    EffectiveMtls {
        mode: map(effective.mode),
        per_port: effective
            .per_port
            .into_iter()
            .map(|(port, mode)| (port, map(mode)))
            .collect(),
    }
}

/// Every namespace `push` names: those of its objects (of every kind: taken from the
/// content hashes, which cover them all), the root namespace, and those named by
/// `exportTo` (objects' own and the mesh defaults) and by `sourceNamespace` matches.
/// An input that reads a proxy's namespace otherwise must add its namespaces here.
fn named_namespaces(push: &PushContext) -> HashSet<String> {
    let hashes = push.hashes();
    let mesh = push.mesh();
    let mut out: HashSet<String> = hashes
        .services
        .keys()
        .chain(hashes.endpoints.keys())
        .map(|(_, ns)| ns.clone())
        .chain(hashes.configs.keys().map(|k| k.namespace.clone()))
        .collect();
    out.insert(mesh.root_namespace.clone());
    let lists = [
        &mesh.default_service_export_to,
        &mesh.default_virtual_service_export_to,
        &mesh.default_destination_rule_export_to,
    ];
    out.extend(lists.into_iter().flatten().cloned());
    for s in push.services() {
        out.insert(s.namespace.clone());
        out.extend(s.export_to.0.iter().cloned());
    }
    for dr in push.destination_rules() {
        out.insert(dr.meta.namespace.clone());
        out.extend(dr.spec.export_to.iter().cloned());
    }
    for vs in push.virtual_services() {
        out.insert(vs.meta.namespace.clone());
        out.extend(vs.spec.export_to.iter().cloned());
        let http = vs.spec.http.iter().flat_map(|r| &r.r#match);
        out.extend(http.filter_map(|m| m.source_namespace.clone()));
        let tcp = vs.spec.tcp.iter().flat_map(|r| &r.r#match);
        out.extend(tcp.filter_map(|m| m.source_namespace.clone()));
        let tls = vs.spec.tls.iter().flat_map(|r| &r.r#match);
        out.extend(tls.filter_map(|m| m.source_namespace.clone()));
    }
    for pa in push.peer_authentications() {
        out.insert(pa.meta.namespace.clone());
    }
    out
}

/// The inbound ports of a workload whose Sidecar has ingress listeners: exactly those
/// listeners' ports (Istio does not merge them with the Services' ports by default), with
/// their protocols and default endpoints. A port listed twice keeps its first listener.
fn ingress_ports(ingress: &[IstioIngressListener], proxy: &Proxy) -> Vec<InboundPort> {
    let mut out: BTreeMap<u32, InboundPort> = BTreeMap::new();
    for listener in ingress {
        let port = listener.port.number;
        let protocol = listener
            .port
            .protocol
            .as_deref()
            .and_then(Protocol::from_istio_name)
            .unwrap_or(Protocol::Unsupported);
        let endpoint = listener
            .default_endpoint
            .as_deref()
            .filter(|e| !e.is_empty())
            .and_then(|e| default_endpoint(e, proxy));
        // Istio's `getBindToPort` for a proxy that redirects (Pilotfish does not read a
        // proxy-level `INTERCEPTION_MODE`): only an explicit NONE binds.
        let bound = listener.capture_mode == Some(CaptureMode::None);
        // A bound listener without `bind` listens on the proxy's own (global unicast) IP,
        // else the wildcard (Istio's `getSidecarInboundBindIPs`); an unbound one's chain
        // keeps the `0.0.0.0_<port>` name of every other inbound chain.
        let bind = listener
            .bind
            .clone()
            .filter(|b| !b.is_empty())
            .or_else(|| bound.then(|| own_inbound_ip(proxy)));
        out.entry(port).or_insert(InboundPort {
            port,
            protocol,
            endpoint,
            bind,
            bound,
            pool: None,
            tls: listener.tls.as_ref().map(Canonical::new),
        });
    }
    out.into_values().collect()
}

/// The proxy's first global unicast IP (not loopback, link-local, multicast or
/// unspecified), else `0.0.0.0`.
fn own_inbound_ip(proxy: &Proxy) -> String {
    proxy
        .ips
        .iter()
        .find(|ip| match ip {
            std::net::IpAddr::V4(v4) => {
                !(v4.is_loopback()
                    || v4.is_link_local()
                    || v4.is_multicast()
                    || v4.is_unspecified())
            }
            std::net::IpAddr::V6(v6) => {
                !(v6.is_loopback()
                    || v6.is_multicast()
                    || v6.is_unspecified()
                    || v6.is_unicast_link_local())
            }
        })
        .map_or_else(|| "0.0.0.0".to_string(), |ip| ip.to_string())
}

/// Sets each inbound port's connection pool from the Sidecar that applies.
fn with_sidecar_pools(ports: &mut [InboundPort], spec: &SidecarSpec) {
    for p in ports {
        p.pool = inbound_connection_pool(spec, p.port).map(Canonical::new);
    }
}

/// Resolves a validated `defaultEndpoint` for `proxy`.
fn default_endpoint(endpoint: &str, proxy: &Proxy) -> Option<InboundEndpoint> {
    if endpoint.starts_with("unix://") {
        return Some(InboundEndpoint::Pipe(
            endpoint.trim_start_matches("unix://").to_string(),
        ));
    }
    let (host, port) = endpoint.rsplit_once(':')?;
    let port: u32 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let own = |v4: bool| {
        proxy
            .ips
            .iter()
            .find(|ip| ip.is_ipv4() == v4)
            .map(|ip| ip.to_string())
    };
    let address = match host {
        "0.0.0.0" => own(true).unwrap_or_else(|| "127.0.0.1".to_string()),
        "::" => own(false).unwrap_or_else(|| "::1".to_string()),
        "::1" => "::1".to_string(),
        _ => "127.0.0.1".to_string(),
    };
    Some(InboundEndpoint::Socket { address, port })
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::document::{parse_text, to_inputs};
    use pilotfish_mesh::push_context::{BuildInputs, build};

    const MESH: &str = "\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.1
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}, {name: udp-dns, port: 53, protocol: UDP}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: web-for-api, namespace: shop}
spec:
  host: web
  workloadSelector: {matchLabels: {app: api}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: web, namespace: shop}
spec:
  hosts: [web]
  http:
  - match: [{sourceLabels: {tier: front}}]
    route: [{destination: {host: web}}]
";

    fn index() -> ScopeIndex {
        let parsed = parse_text(std::path::Path::new("t.yaml"), MESH);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let inputs = to_inputs(
            &parsed.objects,
            BuildInputs {
                cluster_domain: "cluster.local".into(),
                ..Default::default()
            },
        );
        ScopeIndex::new(&build(&inputs, None).context)
    }

    fn proxy(labels: &[(&str, &str)]) -> Proxy {
        Proxy {
            namespace: "shop".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Proxy::with_defaults("p")
        }
    }

    #[test]
    fn labels_matter_only_through_what_they_select() {
        let index = index();
        let a = index.scope(&proxy(&[("app", "worker"), ("pod", "1")]));
        let b = index.scope(&proxy(&[("app", "worker"), ("pod", "2")]));
        assert_eq!(a, b, "labels nothing selects do not split scopes");
        let api = index.scope(&proxy(&[("app", "api")]));
        assert_ne!(
            api.for_part(Part::OutboundClusters),
            a.for_part(Part::OutboundClusters),
            "a workload-selector DestinationRule splits the cluster scope"
        );
        let front = index.scope(&proxy(&[("app", "worker"), ("tier", "front")]));
        assert_eq!(
            front.for_part(Part::OutboundClusters),
            a.for_part(Part::OutboundClusters),
            "sourceLabels do not concern clusters"
        );
        assert_ne!(front.for_part(Part::Routes), a.for_part(Part::Routes));
    }

    #[test]
    fn the_node_locality_wins_over_the_endpoint_locality() {
        let mesh = format!(
            "{MESH}---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: web-outlier, namespace: shop}}
spec:
  host: web
  trafficPolicy: {{outlierDetection: {{consecutive5xxErrors: 5}}}}
"
        );
        let parsed = parse_text(std::path::Path::new("t.yaml"), &mesh);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let inputs = to_inputs(
            &parsed.objects,
            BuildInputs {
                cluster_domain: "cluster.local".into(),
                ..Default::default()
            },
        );
        let index = ScopeIndex::new(&build(&inputs, None).context);
        let mut p = proxy(&[]);
        assert_eq!(
            index.scope(&p).locality,
            None,
            "no node locality, no endpoint: unknown"
        );
        p.locality = Some(Locality::parse("eu/eu-1a/rack2"));
        let unknown = || UNKNOWN_LOCALITY.to_string();
        assert_eq!(
            index.scope(&p).locality,
            Some(Locality {
                region: unknown(),
                zone: unknown(),
                subzone: unknown(),
            }),
            "the node's locality, classed: no endpoint or rule names any of its parts"
        );
    }

    #[test]
    fn sidecar_ingress_settings_split_only_the_parts_that_read_them() {
        let mesh = format!(
            "{MESH}---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: web, namespace: shop}}
spec:
  workloadSelector: {{labels: {{app: web}}}}
  inboundConnectionPool: {{tcp: {{maxConnections: 5}}}}
  ingress:
  - port: {{number: 9080, protocol: HTTP, name: http}}
    captureMode: NONE
    defaultEndpoint: 127.0.0.1:8080
"
        );
        let parsed = parse_text(std::path::Path::new("t.yaml"), &mesh);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let inputs = to_inputs(
            &parsed.objects,
            BuildInputs {
                cluster_domain: "cluster.local".into(),
                ..Default::default()
            },
        );
        let index = ScopeIndex::new(&build(&inputs, None).context);
        let at = |ip: &str| {
            index.scope(&Proxy {
                ips: vec![ip.parse().unwrap()],
                ..proxy(&[("app", "web")])
            })
        };
        let (a, b) = (at("10.0.0.1"), at("10.0.0.2"));
        assert_eq!(a.inbound[0].bind.as_deref(), Some("10.0.0.1"));
        assert!(a.inbound[0].bound);
        assert!(
            a.inbound[0].pool.is_some(),
            "inboundConnectionPool for the port"
        );
        assert_ne!(
            a.for_part(Part::InboundListener),
            b.for_part(Part::InboundListener),
            "a bound listener without bind listens on the proxy's own IP"
        );
        assert_eq!(
            a.for_part(Part::InboundClusters),
            b.for_part(Part::InboundClusters),
            "the clusters do not read where the listener binds"
        );
        let other = index.scope(&proxy(&[("app", "worker")]));
        assert_ne!(
            a.for_part(Part::InboundClusters),
            other.for_part(Part::InboundClusters)
        );
    }

    #[test]
    fn a_proxyless_server_maps_permissive_as_istios_grpcgen() {
        let effective = EffectiveMtls {
            mode: MtlsMode::Permissive,
            per_port: [
                (1, MtlsMode::Strict),
                (2, MtlsMode::Disable),
                (3, MtlsMode::Permissive),
            ]
            .into(),
        };
        let plain = proxyless_server_mtls(effective.clone(), &BTreeMap::new());
        assert_eq!(plain.mode, MtlsMode::Disable, "PERMISSIVE: plaintext");
        assert_eq!(
            plain.per_port.values().copied().collect::<Vec<_>>(),
            [MtlsMode::Strict, MtlsMode::Disable, MtlsMode::Disable]
        );
        let labelled = proxyless_server_mtls(
            effective,
            &[(TLS_MODE_LABEL.to_string(), TLS_MODE_ISTIO.to_string())].into(),
        );
        assert_eq!(
            labelled.mode,
            MtlsMode::Strict,
            "PERMISSIVE with the auto-mTLS label: STRICT"
        );
        assert_eq!(
            labelled.per_port.values().copied().collect::<Vec<_>>(),
            [MtlsMode::Strict, MtlsMode::Disable, MtlsMode::Strict]
        );
    }

    #[test]
    fn inbound_ports_are_the_selecting_services_target_ports() {
        let index = index();
        let web = index.scope(&proxy(&[("app", "web")]));
        assert_eq!(
            web.inbound,
            [InboundPort {
                port: 8080,
                protocol: Protocol::Http,
                endpoint: None,
                bind: None,
                bound: false,
                pool: None,
                tls: None,
            }],
            "target port, and no UDP"
        );
        assert!(index.scope(&proxy(&[])).inbound.is_empty());
        let grpc = Proxy {
            generator: ProxyGenerator::Grpc,
            ..proxy(&[("app", "web")])
        };
        assert_eq!(
            index.scope(&grpc).inbound,
            web.inbound,
            "a proxyless server serves the same ports"
        );
        assert_eq!(
            index.scope(&grpc).inbound_mtls.unwrap().mode,
            MtlsMode::Disable,
            "no policy: PERMISSIVE, which a proxyless server serves as plaintext"
        );
    }
}
