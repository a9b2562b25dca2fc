//! [`GeneratedSnapshot`]: the [`XdsSnapshot`] the ADS engine serves, generating resources
//! from one immutable [`PushContext`] on demand and caching every generated part per
//! [`Scope`]. Parts are keyed by (part, projected scope), so proxies that only differ in
//! what a part does not read share it: a thousand identical sidecars cost one
//! generation, and sidecars of one namespace share their outbound clusters even when
//! their own inbound ports differ. The cache lives and dies with the snapshot.
//!
//! Each cache slot is a `OnceLock`: concurrent requests for the same part wait for one
//! generation instead of repeating it. A generated part is the process's one shared copy
//! of its content ([`shared_part`]), so scopes (and snapshots) that generate the same
//! resources hold one map, and the engine's responses cut from it are shared too.
//!
//! The outbound plan every planned part derives from is large (a merged traffic policy per
//! cluster) and cheap to compute, so it is not kept for the snapshot's lifetime: it is
//! cached weakly, and the first part of a scope that needs it generates its planned
//! siblings while the plan is at hand.
//!
//! The generators do no telemetry: each part's generation returns its [`Finding`]s, and
//! `report` logs and counts them here — once per generated part, since parts are
//! cached.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use pilotfish_mesh::model::{Proxy, ProxyType, Resolution, TargetPort};
use pilotfish_mesh::push_context::{PushContext, diff};

pub use crate::ads::ResourceMap;
use crate::ads::{ChangeKind, Resource, XdsSnapshot, XdsType, shared_part};

use super::canonical::canonicalize;
use super::findings::{Finding, RouteKind};
use super::identities::endpoint_identities;
use super::metrics::{
    GENERATIONS, INCONSISTENT_REFERENCES, PROXYLESS_DOWNGRADES, UNRESOLVED_DESTINATIONS,
    UNSUPPORTED_PROXIES,
};
use super::plan::{OutboundPlan, outbound_plan};
use super::sanitize::{sanitize_listeners, sanitize_routes};
use super::scope::{Flavor, Part, Scope, ScopeIndex};
use super::util::resource_any;
use super::{cds, eds, lds, rds};

/// A concurrent map of lazily computed values; one computation per key.
#[derive(Debug)]
struct Cache<K, V> {
    slots: Mutex<HashMap<K, Arc<OnceLock<V>>>>,
}

impl<K: Eq + Hash, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Cache {
            slots: Mutex::new(HashMap::new()),
        }
    }

    fn get_or_init(&self, key: K, init: impl FnOnce() -> V) -> V {
        let slot = {
            // A panic while holding the lock cannot leave the map inconsistent (insertions
            // are single operations), so a poisoned lock is still usable.
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.entry(key).or_default().clone()
        };
        slot.get_or_init(init).clone()
    }

    fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether `key` has a value (or one is being computed).
    fn contains(&self, key: &K) -> bool {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .is_some_and(|slot| slot.get().is_some())
    }
}

/// The parts derived from a scope's outbound plan.
const PLANNED: [Part; 4] = [
    Part::OutboundClusters,
    Part::Endpoints,
    Part::OutboundListeners,
    Part::Routes,
];

/// One mesh snapshot, as served over xDS.
#[derive(Debug)]
pub struct GeneratedSnapshot {
    push: Arc<PushContext>,
    version: u64,
    /// How this snapshot differs from the one published before it (`previous_version`).
    change: ChangeKind,
    previous_version: Option<u64>,
    index: ScopeIndex,
    /// Held weakly: alive while parts of the scope are being generated.
    plans: Mutex<HashMap<Scope, Weak<OutboundPlan>>>,
    parts: Cache<(Part, Scope), Arc<ResourceMap>>,
    generations: AtomicU64,
}

impl GeneratedSnapshot {
    /// A snapshot of `push` published as `version`; `change` says how it differs from the
    /// snapshot published just before it, assumed to be `version - 1` (use
    /// [`GeneratedSnapshot::new_since`] when versions are not consecutive).
    pub fn new(push: Arc<PushContext>, version: u64, change: ChangeKind) -> Self {
        Self::new_since(push, version, version.checked_sub(1), change)
    }

    /// A snapshot of `push` published as `version`, differing from the snapshot
    /// `previous_version` as `change` says.
    pub fn new_since(
        push: Arc<PushContext>,
        version: u64,
        previous_version: Option<u64>,
        change: ChangeKind,
    ) -> Self {
        let index = ScopeIndex::new(&push);
        if change == ChangeKind::Full {
            warn_istio_mutual(&push);
        }
        GeneratedSnapshot {
            push,
            version,
            change,
            previous_version,
            index,
            plans: Mutex::new(HashMap::new()),
            parts: Cache::new(),
            generations: AtomicU64::new(0),
        }
    }

    pub fn push_context(&self) -> &Arc<PushContext> {
        &self.push
    }

    /// Parts generated so far (cache misses), for tests and debug pages.
    pub fn generations(&self) -> u64 {
        self.generations.load(Ordering::Relaxed)
    }

    /// Distinct cached parts.
    pub fn cached_parts(&self) -> usize {
        self.parts.len()
    }

    /// The scope of `proxy` in this snapshot.
    pub fn scope(&self, proxy: &Proxy) -> Scope {
        self.index.scope(proxy)
    }

    /// Every resource of `kind` for `proxy`, by name.
    pub fn all(&self, proxy: &Proxy, kind: XdsType) -> ResourceMap {
        let mut out = ResourceMap::new();
        for part in self.parts_of(proxy, kind) {
            out.extend(part.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        out
    }

    /// The generated parts that make up `kind` for `proxy` (their names are disjoint).
    /// Gateways (`router~` nodes) get none: Pilotfish does not configure them yet, and an
    /// empty LDS/CDS answer is a valid configuration, where sidecar output would open
    /// sidecar listeners on a gateway ([`note_unsupported_proxy`] tells the operator).
    fn parts_of(&self, proxy: &Proxy, kind: XdsType) -> Vec<Arc<ResourceMap>> {
        if proxy.proxy_type == ProxyType::Router {
            return Vec::new();
        }
        let scope = self.index.scope(proxy);
        let flavor = Flavor::of(proxy);
        let parts: &[Part] = match (kind, flavor) {
            (XdsType::Cluster, Flavor::Sidecar) => &[Part::OutboundClusters, Part::InboundClusters],
            (XdsType::Cluster, Flavor::Proxyless) => &[Part::OutboundClusters],
            (XdsType::Endpoint, _) => &[Part::Endpoints],
            (XdsType::Listener, Flavor::Sidecar) => {
                &[Part::OutboundListeners, Part::InboundListener]
            }
            (XdsType::Listener, Flavor::Proxyless) => &[Part::OutboundListeners],
            (XdsType::Route, _) => &[Part::Routes],
        };
        parts
            .iter()
            .map(|part| self.part(proxy, &scope, *part))
            .collect()
    }

    fn plan(&self, proxy: &Proxy, scope: &Scope) -> Arc<OutboundPlan> {
        let key = scope.for_part(Part::OutboundClusters);
        let lock = || self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(plan) = lock().get(&key).and_then(Weak::upgrade) {
            return plan;
        }
        let mut findings = Vec::new();
        let sidecar = Arc::new(self.push.sidecar_scope(scope.sidecar, &scope.namespace));
        let plan = Arc::new(outbound_plan(
            &self.push,
            proxy,
            sidecar,
            Flavor::of(proxy),
            &mut findings,
        ));
        report(&findings);
        lock().insert(key, Arc::downgrade(&plan));
        plan
    }

    fn part(&self, proxy: &Proxy, scope: &Scope, part: Part) -> Arc<ResourceMap> {
        let key = (part, scope.for_part(part));
        if PLANNED.contains(&part) && !self.parts.contains(&key) {
            // One plan serves every planned part of the scope: generate them while it is
            // held here, rather than computing it again for each.
            let _plan = self.plan(proxy, scope);
            for sibling in PLANNED {
                self.generated(proxy, scope, sibling);
            }
        }
        self.generated(proxy, scope, part)
    }

    fn generated(&self, proxy: &Proxy, scope: &Scope, part: Part) -> Arc<ResourceMap> {
        let key = (part, scope.for_part(part));
        self.parts.get_or_init(key, || {
            self.generations.fetch_add(1, Ordering::Relaxed);
            GENERATIONS.with_label_values(&[part_label(part)]).inc();
            let mut findings = Vec::new();
            let resources = self.generate(proxy, scope, part, &mut findings);
            report(&findings);
            shared_part(resources)
        })
    }

    /// Generates one part; what the generators noticed goes to `findings`. `proxy` stands
    /// for every proxy of its scope: the generators read nothing of it that the scope does
    /// not capture.
    fn generate(
        &self,
        proxy: &Proxy,
        scope: &Scope,
        part: Part,
        findings: &mut Vec<Finding>,
    ) -> ResourceMap {
        let push = &*self.push;
        let flavor = Flavor::of(proxy);
        match part {
            Part::OutboundClusters => {
                let plan = self.plan(proxy, scope);
                encode(cds::outbound_clusters(push, &plan, flavor, findings), |c| {
                    &c.name
                })
            }
            Part::InboundClusters => encode(
                cds::inbound_clusters(&scope.inbound, push.mesh().connect_timeout),
                |c| &c.name,
            ),
            Part::Endpoints => {
                let plan = self.plan(proxy, scope);
                encode(eds::load_assignments(push, &plan, scope, findings), |c| {
                    &c.cluster_name
                })
            }
            Part::OutboundListeners => {
                let plan = self.plan(proxy, scope);
                let mut listeners = match flavor {
                    Flavor::Sidecar => {
                        lds::sidecar_outbound_listeners(push, proxy, &plan, findings)
                    }
                    Flavor::Proxyless => lds::proxyless_listeners(&plan),
                };
                findings.extend(sanitize_listeners(&mut listeners, &|c| {
                    known_cluster(&plan, flavor, c)
                }));
                encode(listeners, |l| &l.name)
            }
            Part::InboundListener => {
                let mtls = scope.inbound_mtls.clone().unwrap_or_default();
                let listener =
                    lds::sidecar_inbound_listener(&scope.inbound, &mtls, &push.mesh().trust_domain);
                encode(vec![listener], |l| &l.name)
            }
            Part::Routes => {
                let plan = self.plan(proxy, scope);
                let mut routes = match flavor {
                    Flavor::Sidecar => rds::sidecar_route_configs(push, proxy, &plan, findings),
                    Flavor::Proxyless => rds::proxyless_route_configs(push, proxy, &plan, findings),
                };
                findings.extend(sanitize_routes(&mut routes, &|c| {
                    known_cluster(&plan, flavor, c)
                }));
                encode(routes, |r| &r.name)
            }
        }
    }
}

/// Logs and counts a proxy Pilotfish does not configure (a gateway: `router~` node id), once
/// per ADS stream (the node parser calls it for the stream's first request); such a proxy
/// gets an empty configuration from every snapshot.
pub fn note_unsupported_proxy(proxy: &Proxy) {
    if proxy.proxy_type == ProxyType::Router {
        tracing::warn!(
            node = %proxy.id,
            "gateway proxies (`router~` node ids) are not supported by Pilotfish yet: this proxy gets an empty configuration (no listeners, no clusters)"
        );
        UNSUPPORTED_PROXIES.with_label_values(&["router"]).inc();
    }
}

/// Logs and counts what generating one part (or plan, or the audit) noticed; the
/// generators only return it.
pub(crate) fn report(findings: &[Finding]) {
    for finding in findings {
        match finding {
            Finding::Downgrade(d) => {
                tracing::warn!(
                    feature = d.feature,
                    resource = d.resource.as_str(),
                    "proxyless gRPC clients do not support {}; left out for them",
                    d.what
                );
                PROXYLESS_DOWNGRADES.with_label_values(&[d.feature]).inc();
            }
            Finding::UnresolvedDestination {
                kind: RouteKind::Http,
                cluster,
                namespace,
            } => {
                tracing::warn!(
                    cluster = %cluster,
                    namespace = %namespace,
                    "route destination has no cluster for this proxy (unknown or invisible host or port); it answers 503"
                );
                UNRESOLVED_DESTINATIONS
                    .with_label_values(&[RouteKind::Http.label()])
                    .inc();
            }
            Finding::UnresolvedDestination {
                kind: RouteKind::Tcp,
                cluster,
                ..
            } => {
                tracing::warn!(cluster = %cluster, "TCP route destination has no cluster for this proxy; connections are refused");
                UNRESOLVED_DESTINATIONS
                    .with_label_values(&[RouteKind::Tcp.label()])
                    .inc();
            }
            Finding::PseudoHeader { header } => {
                tracing::warn!(
                    header = header.as_str(),
                    "pseudo-headers cannot be set; skipped"
                );
            }
            Finding::NonIpEndpoint { cluster, address } => {
                tracing::warn!(
                    cluster = %cluster,
                    address = %address,
                    "endpoint address is not an IP; left out of EDS"
                );
            }
            Finding::InconsistentReference { reference, kind } => {
                tracing::error!(
                    reference = reference.as_str(),
                    "inconsistent generated reference (a Pilotfish bug); replaced before sending"
                );
                INCONSISTENT_REFERENCES.with_label_values(&[kind]).inc();
            }
            Finding::IstioMutualWithoutCertificates { cluster } => {
                tracing::debug!(
                    cluster = cluster.as_str(),
                    "ISTIO_MUTUAL: Pilotfish does not issue certificates yet; the sidecar's own SDS provider must serve `default` and `ROOTCA`"
                );
            }
            Finding::VirtualHostSkipped { vhost, reason } => {
                tracing::debug!(vhost = %vhost, "{reason}");
            }
        }
    }
}

/// Pilotfish issues no certificates yet: `ISTIO_MUTUAL` works only where the sidecar's own
/// agent serves the SDS secrets `default` and `ROOTCA`. The DestinationRule's status says
/// so (builder warning); operators reading the xDS tier's log see it here, once per
/// configuration change.
fn warn_istio_mutual(push: &PushContext) {
    use pilotfish_mesh::api::{TlsMode, TrafficPolicy};
    let uses = |p: &TrafficPolicy| {
        p.tls.as_ref().and_then(|t| t.mode) == Some(TlsMode::IstioMutual)
            || p.port_level_settings
                .iter()
                .any(|l| l.tls.as_ref().and_then(|t| t.mode) == Some(TlsMode::IstioMutual))
    };
    let rules: Vec<String> = push
        .destination_rules()
        .iter()
        .filter(|dr| {
            dr.spec.traffic_policy.as_ref().is_some_and(uses)
                || dr
                    .spec
                    .subsets
                    .iter()
                    .any(|s| s.traffic_policy.as_ref().is_some_and(uses))
        })
        .map(|dr| format!("{}/{}", dr.meta.namespace, dr.meta.name))
        .collect();
    if !rules.is_empty() {
        tracing::warn!(
            destination_rules = %rules.join(","),
            "ISTIO_MUTUAL is rendered with the SDS secrets `default` and `ROOTCA`, but Pilotfish does not issue certificates yet: these connections work only where the sidecar's own agent provides them"
        );
    }
}

/// Whether a cluster a listener or route of this scope names is in the scope's CDS.
fn known_cluster(plan: &OutboundPlan, flavor: Flavor, name: &str) -> bool {
    plan.contains(name)
        || (flavor == Flavor::Sidecar
            && (name == super::names::PASSTHROUGH_CLUSTER
                || name == super::names::BLACKHOLE_CLUSTER
                || name == super::names::INBOUND_PASSTHROUGH_CLUSTER
                || name.starts_with("inbound|")))
}

fn part_label(part: Part) -> &'static str {
    match part {
        Part::OutboundClusters => "outbound_clusters",
        Part::InboundClusters => "inbound_clusters",
        Part::Endpoints => "endpoints",
        Part::OutboundListeners => "outbound_listeners",
        Part::InboundListener => "inbound_listener",
        Part::Routes => "routes",
    }
}

/// Encodes resources once, by name (a name already present keeps its first resource:
/// one response never carries a name twice), each as the process's one shared copy of
/// its content ([`Resource::shared`]): scopes that generate equal resources keep one.
fn encode<M: prost::Message + prost::Name>(
    items: Vec<M>,
    name: impl Fn(&M) -> &String,
) -> ResourceMap {
    let mut out = ResourceMap::new();
    for item in items {
        let n = name(&item).clone();
        if out.contains_key(&n) {
            tracing::error!(resource = %n, "generated twice; keeping the first (a bug)");
            continue;
        }
        let mut body = resource_any(&item);
        let type_name = M::full_name();
        body.value = match canonicalize(&type_name, body.value) {
            Ok(canonical) => canonical,
            Err(e) => {
                tracing::error!(
                    type_name = type_name.as_str(),
                    why = e.why,
                    "cannot canonicalize an encoded message (a bug); sent as encoded"
                );
                e.bytes
            }
        };
        out.insert(n.clone(), Resource::new(n, body).shared());
    }
    out
}

impl XdsSnapshot for GeneratedSnapshot {
    fn version(&self) -> u64 {
        self.version
    }

    /// Straight from the cached parts: every proxy of a scope gets the same `Arc`s.
    fn parts(&self, proxy: &Proxy, kind: XdsType) -> Vec<Arc<ResourceMap>> {
        self.parts_of(proxy, kind)
    }

    fn change_since(&self, previous: u64) -> ChangeKind {
        if self.previous_version == Some(previous) {
            self.change
        } else {
            ChangeKind::Full
        }
    }
}

/// How `new` differs from `old` as far as the generated resources go: endpoints-only
/// when only endpoints changed and none of those endpoints shape anything but EDS
/// (named target ports decide a sidecar's inbound ports; endpoints' service accounts are
/// the identities TLS verifies; headless services' endpoints are reached through
/// ORIGINAL_DST clusters, so their changes are EDS-free but harmless).
pub fn change_kind(old: &PushContext, new: &PushContext) -> ChangeKind {
    let summary = diff(old, new);
    if !summary.is_endpoints_only() {
        return ChangeKind::Full;
    }
    let shapes_more_than_eds = summary.endpoints.iter().any(|(host, ns)| {
        [old, new].iter().any(|ctx| {
            ctx.services().iter().any(|s| {
                s.hostname == *host
                    && s.namespace == *ns
                    && (s
                        .ports
                        .iter()
                        .any(|p| matches!(p.target_port, Some(TargetPort::Name(_))))
                        || matches!(s.resolution, Resolution::Dns | Resolution::DnsRoundRobin))
            })
        })
    });
    let identities_changed = summary.endpoints.iter().any(|(host, ns)| {
        let of = |ctx: &PushContext| {
            ctx.services()
                .iter()
                .find(|s| s.hostname == *host && s.namespace == *ns)
                .and_then(|s| ctx.endpoints(s))
                .map(|eps| endpoint_identities(eps, ns, &ctx.mesh().trust_domain))
                .unwrap_or_default()
        };
        of(old) != of(new)
    });
    if shapes_more_than_eds || identities_changed {
        ChangeKind::Full
    } else {
        ChangeKind::EndpointsOnly
    }
}
