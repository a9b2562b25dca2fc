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
//! The outbound plan every planned part derives from is kept per projected scope in a
//! small cache ([`PLAN_CACHE_CAPACITY`]), and the first part of a scope that needs it
//! generates its planned siblings. A stream asks a snapshot for each of its types: its
//! scope is computed once per snapshot, and each scope's parts per type are looked up
//! once for all its streams (`ServedScope`).
//!
//! The generators do no telemetry: each part's generation returns its [`Finding`]s, and
//! `report` logs and counts them here — once per generated part, since parts are
//! cached.
//!
//! **Incremental generation.** A snapshot made with [`GeneratedSnapshot::following`]
//! takes from the snapshot it replaces (while that one is still alive: it is held weakly)
//! every part, or every resource of a part, whose inputs did not change — judged by the
//! mesh diff ([`ChangeSummary`]) and, per resource, by comparing the very values the
//! resource reads. [`reuse_rule`] states, per part, which changes leave it as it was: a
//! part is reused whole only when nothing it reads changed and the proxy's projected
//! scope is equal in both; when only VirtualServices changed, a sidecar's own route
//! configurations and own listeners (and a proxyless client's route configurations) are
//! taken one by one where the VirtualService that applies to their host is equal in both
//! snapshots. Everything else is generated, so a VirtualService edit on one service
//! regenerates that service's route configuration, its listener and each port's catch-all
//! per scope, and nothing of clusters or endpoints. Such an edit also keeps the outbound
//! plans (without a Sidecar a plan does not read VirtualServices) and, unless it changes
//! what scopes read of VirtualServices, every stream's scope. The previous snapshot's
//! parts are only looked at, never generated on its behalf.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use pilotfish_mesh::config::ConfigKind;
use pilotfish_mesh::model::{Proxy, ProxyType, Resolution, TargetPort};
use pilotfish_mesh::push_context::{
    ChangeSummary, PushContext, diff, virtual_service_hosts_changed,
};

pub use crate::ads::ResourceMap;
use crate::ads::{ChangeKind, Resource, XdsSnapshot, XdsType, shared_part};

use super::auto_mtls::all_run_sidecars;
use super::canonical::canonicalize;
use super::findings::{Finding, LogWindow, RouteKind};
use super::identities::endpoint_identities;
use super::metrics::{
    GENERATIONS, INCONSISTENT_REFERENCES, PROXYLESS_DOWNGRADES, UNRESOLVED_DESTINATIONS,
    UNSUPPORTED_PROXIES,
};
use super::plan::{OutboundPlan, outbound_plan, outbound_ports};
use super::rbac;
use super::sanitize::{sanitize_listeners, sanitize_routes};
use super::scope::{Flavor, Part, Scope, ScopeIndex};
use super::util::resource_any;
use super::{cds, eds, lds, names, proxyless_inbound, rds};

/// A concurrent map of lazily computed values; one computation per key. It holds at most
/// `capacity` values: past that, the least recently used computed value is forgotten
/// (whoever holds it keeps it; asking again computes it again).
#[derive(Debug)]
struct Cache<K, V> {
    slots: Mutex<Slots<K, V>>,
    capacity: usize,
}

#[derive(Debug)]
struct Slots<K, V> {
    /// Each value's slot and when it was last asked for.
    map: HashMap<K, (Arc<OnceLock<V>>, u64)>,
    clock: u64,
}

impl<K: Eq + Hash + Clone, V: Clone> Cache<K, V> {
    fn new(capacity: usize) -> Self {
        Cache {
            slots: Mutex::new(Slots {
                map: HashMap::new(),
                clock: 0,
            }),
            capacity: capacity.max(1),
        }
    }

    fn get_or_init(&self, key: K, init: impl FnOnce() -> V) -> V {
        let slot = {
            // A panic while holding the lock cannot leave the map inconsistent (insertions
            // are single operations), so a poisoned lock is still usable.
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.clock += 1;
            let now = slots.clock;
            let fresh = !slots.map.contains_key(&key);
            let slot = {
                let entry = slots.map.entry(key.clone()).or_default();
                entry.1 = now;
                entry.0.clone()
            };
            if fresh && slots.map.len() > self.capacity {
                // Scans only when a new value is added (that is a generation anyway);
                // a value still being computed is not evicted.
                let oldest = slots
                    .map
                    .iter()
                    .filter(|(k, (slot, _))| **k != key && slot.get().is_some())
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(k, _)| k.clone());
                if let Some(oldest) = oldest {
                    slots.map.remove(&oldest);
                }
            }
            slot
        };
        slot.get_or_init(init).clone()
    }

    fn len(&self) -> usize {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .len()
    }

    /// Whether `key` has a value (or one is being computed).
    fn contains(&self, key: &K) -> bool {
        self.peek(key).is_some()
    }

    /// The value of `key`, if computed; never computes it (nor counts as a use).
    fn peek(&self, key: &K) -> Option<V> {
        self.slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .get(key)
            .and_then(|(slot, _)| slot.get().cloned())
    }
}

/// At most this many outbound plans are kept per snapshot (a plan holds a cluster's name,
/// service, port and shared policy per cluster the scope sees: about 1 MB at 1,000
/// services, unless its clusters are shared with another plan's, `plan.rs`). Past it a
/// scope's plan is computed again when one of its parts is.
pub const PLAN_CACHE_CAPACITY: usize = 64;

/// At most this many parts are cached per snapshot. Scopes are bounded by the snapshot
/// already (client input is classed, `generate/scope.rs`); this bounds the rest, e.g. a
/// mesh whose selectors split proxies into very many scopes. 1,000 services in 20
/// namespaces with a few workload shapes need about a hundred.
pub const PART_CACHE_CAPACITY: usize = 2048;

/// How much of a part a snapshot may take from the snapshot it replaces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// Generate it.
    No,
    /// Take the whole part, when the proxy's projected scope is equal in both snapshots.
    Whole,
    /// Only VirtualServices changed: take each of a service's own resources (route
    /// configuration, listeners) whose host has an equal VirtualService in both snapshots.
    PerResource,
}

/// What a part of `flavor` may take from the previous snapshot, given what changed
/// (`summary`, and `change`: whether the change is endpoints-only by [`change_kind`]'s
/// rules). Each rule lists what the part's generator reads; a kind not named here is
/// read by every part, so new kinds are safe by default.
/// - inbound clusters and listener: only the projected scope (values: the workload's
///   ports and mutual TLS mode) and the mesh config; of config kinds, those the scope
///   captures;
/// - outbound clusters: the plan (services, DestinationRules), the mesh config and the
///   endpoints' identities (which an endpoints-only change keeps);
/// - endpoints: the plan, the endpoints, the mesh config;
/// - outbound listeners and routes: the plan, the mesh config, VirtualServices (by host
///   for a service's own resources, all of them for the ports' shared ones) and nothing
///   of endpoints an endpoints-only change can alter. A proxyless client's listeners
///   read only the plan.
pub fn reuse_rule(
    part: Part,
    flavor: Flavor,
    change: ChangeKind,
    summary: &ChangeSummary,
) -> Reuse {
    if summary.mesh_changed {
        return Reuse::No;
    }
    let plan_kept = plan_kept(summary);
    let eds_only = summary.endpoints.is_empty() || change == ChangeKind::EndpointsOnly;
    let whole_if = |kept: bool| if kept { Reuse::Whole } else { Reuse::No };
    // The kinds whose effect on the inbound parts the projected scope captures (the
    // workload's ports from services and endpoints, its mode from PeerAuthentications),
    // or which they do not read at all.
    let inbound_kept = summary.configs.iter().all(|k| {
        matches!(
            k.kind,
            ConfigKind::VirtualService
                | ConfigKind::DestinationRule
                | ConfigKind::ServiceEntry
                | ConfigKind::PeerAuthentication
                | ConfigKind::Service
                | ConfigKind::EndpointSlice
                | ConfigKind::Pod
        )
    });
    match part {
        Part::InboundClusters | Part::InboundListener => whole_if(inbound_kept),
        Part::OutboundClusters => whole_if(plan_kept && eds_only),
        Part::Endpoints => whole_if(plan_kept && summary.endpoints.is_empty()),
        Part::OutboundListeners if flavor == Flavor::Proxyless => whole_if(plan_kept),
        Part::OutboundListeners | Part::Routes => {
            if !(plan_kept && eds_only) {
                Reuse::No
            } else if summary.configs.is_empty() {
                Reuse::Whole
            } else {
                Reuse::PerResource
            }
        }
    }
}

/// Whether no config changed but VirtualServices (nothing at all, too).
fn only_virtual_services(summary: &ChangeSummary) -> bool {
    summary
        .configs
        .iter()
        .all(|k| k.kind == ConfigKind::VirtualService)
}

/// Whether an outbound plan made before `summary`'s change is still right after it: a
/// plan reads services, DestinationRules, the mesh config and — only through a Sidecar's
/// imports — VirtualServices (which a scope with a Sidecar must still check).
fn plan_kept(summary: &ChangeSummary) -> bool {
    !summary.mesh_changed && summary.services.is_empty() && only_virtual_services(summary)
}

/// The snapshot a [`GeneratedSnapshot::following`] one may take parts from.
#[derive(Debug)]
struct Base {
    /// Weak: a snapshot never keeps its predecessor (nor a chain of them) alive; once
    /// every stream has moved on, nothing is left to take.
    previous: Weak<GeneratedSnapshot>,
    summary: ChangeSummary,
    /// When only VirtualServices changed: the hosts whose VirtualService may differ for
    /// some namespace ([`virtual_service_hosts_changed`]); any other host's own resources
    /// are lent without looking its VirtualService up in both snapshots, per scope.
    /// `None`: unknown (a wildcard host changed, or more than VirtualServices did).
    vs_hosts_changed: Option<HashSet<String>>,
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
    /// The outbound plans of the scopes generated lately, by projected scope (at most
    /// [`PLAN_CACHE_CAPACITY`]); a following snapshot takes them when the plan's inputs
    /// did not change ([`GeneratedSnapshot::previous_plan`]).
    plans: Cache<Scope, Arc<OutboundPlan>>,
    parts: Cache<(Part, Scope), Arc<ResourceMap>>,
    /// Proxyless servers' listeners by (projected scope, names asked for): they exist only
    /// when named ([`XdsSnapshot::named_parts`]).
    server_listeners: Cache<(Scope, Vec<String>), Arc<ResourceMap>>,
    generations: AtomicU64,
    /// Outbound plans computed, and streams' scopes computed (not taken from the previous
    /// snapshot), for tests and debug pages.
    plans_computed: AtomicU64,
    stream_scopes_computed: AtomicU64,
    base: Option<Base>,
    /// Resources generated (encoded) per part, and parts or resources taken from `base`.
    generated_resources: [AtomicU64; PARTS],
    reused_parts: AtomicU64,
    reused_resources: AtomicU64,
    /// Which findings were logged lately; shared along a chain of snapshots (`following`),
    /// so a finding every snapshot meets again is logged once per window, not per edit.
    log_window: Arc<Mutex<LogWindow>>,
    /// Every scope the engine asked parts for (at most [`PART_CACHE_CAPACITY`]), the one
    /// copy its streams share, with the first proxy that asked: what the replica's audit
    /// checks ([`super::Auditor`]).
    served: Mutex<ServedScopes>,
    /// The scope of each stream's proxy, computed once per snapshot
    /// ([`XdsSnapshot::stream_parts`]).
    stream_scopes: Mutex<StreamScopes>,
    /// Whether every proxy has the same scope as in the previous snapshot (only
    /// VirtualServices changed, and none of what scopes read of them): a stream's scope is
    /// then taken from the previous snapshot instead of computed again.
    scopes_kept: bool,
}

/// The served scopes, each with the first proxy that asked for it (the audit's sample).
type ServedScopes = HashMap<Arc<Scope>, (Proxy, Arc<ServedScope>)>;

/// A scope as its streams share it: with the parts of each type, looked up once for all
/// of them (per stream that was a projection, a hash and a comparison of the scope per
/// part, 2,000 times per push).
#[derive(Debug)]
struct ServedScope {
    scope: Arc<Scope>,
    parts: [OnceLock<Vec<Arc<ResourceMap>>>; XdsType::ALL.len()],
}

impl ServedScope {
    fn new(scope: Arc<Scope>) -> Arc<ServedScope> {
        Arc::new(ServedScope {
            scope,
            parts: Default::default(),
        })
    }
}

/// Scopes by the address of the stream's `Arc<Proxy>`. Each entry holds its proxy weakly:
/// a closed stream's proxy is not kept (dead entries are swept when the table has
/// doubled), yet its allocation is, so no other proxy can take its address while the
/// entry exists — an entry found at a live proxy's address is that proxy's.
#[derive(Debug, Default)]
struct StreamScopes {
    by_proxy: HashMap<usize, (Weak<Proxy>, Arc<ServedScope>)>,
    sweep_at: usize,
}

const PARTS: usize = 6;

fn part_index(part: Part) -> usize {
    match part {
        Part::OutboundClusters => 0,
        Part::InboundClusters => 1,
        Part::Endpoints => 2,
        Part::OutboundListeners => 3,
        Part::InboundListener => 4,
        Part::Routes => 5,
    }
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
        GeneratedSnapshot {
            push,
            version,
            change,
            previous_version,
            index,
            plans: Cache::new(PLAN_CACHE_CAPACITY),
            parts: Cache::new(PART_CACHE_CAPACITY),
            server_listeners: Cache::new(PART_CACHE_CAPACITY),
            generations: AtomicU64::new(0),
            plans_computed: AtomicU64::new(0),
            stream_scopes_computed: AtomicU64::new(0),
            base: None,
            generated_resources: Default::default(),
            reused_parts: AtomicU64::new(0),
            reused_resources: AtomicU64::new(0),
            log_window: Arc::default(),
            served: Mutex::new(HashMap::new()),
            stream_scopes: Mutex::default(),
            scopes_kept: false,
        }
    }

    /// The scope of a stream's proxy, computed once per snapshot (a stream asks for four
    /// types, and a scope costs matching the proxy's labels against its namespace's
    /// services and every selector) or taken from the previous snapshot when no proxy's
    /// scope can have changed, and shared with the streams of the same scope; it counts
    /// as served.
    fn stream_scope(&self, proxy: &Arc<Proxy>) -> Arc<ServedScope> {
        let key = Arc::as_ptr(proxy) as usize;
        let lock = || self.stream_scopes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, served)) = lock().by_proxy.get(&key) {
            return served.clone();
        }
        let scope = self.previous_stream_scope(key).unwrap_or_else(|| {
            self.stream_scopes_computed.fetch_add(1, Ordering::Relaxed);
            Arc::new(self.index.scope(proxy))
        });
        let served = self.served_scope(proxy, scope);
        let mut scopes = lock();
        scopes
            .by_proxy
            .insert(key, (Arc::downgrade(proxy), served.clone()));
        if scopes.by_proxy.len() > scopes.sweep_at {
            scopes.by_proxy.retain(|_, (p, _)| p.strong_count() > 0);
            scopes.sweep_at = 2 * scopes.by_proxy.len() + 64;
        }
        served
    }

    /// The scope the previous snapshot computed for the stream proxy at `key`, when every
    /// proxy's scope is the same in both. An entry at a live proxy's address is that
    /// proxy's (see [`StreamScopes`]); the caller holds the proxy, so it is live.
    fn previous_stream_scope(&self, key: usize) -> Option<Arc<Scope>> {
        if !self.scopes_kept {
            return None;
        }
        let previous = self.base.as_ref()?.previous.upgrade()?;
        let scopes = previous
            .stream_scopes
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        scopes
            .by_proxy
            .get(&key)
            .map(|(_, served)| served.scope.clone())
    }

    /// The snapshot of `push` published as `version`, replacing `previous`: the change
    /// kind is computed against it, and parts and resources whose inputs did not change
    /// are taken from it while it is alive (see the module doc).
    pub fn following(
        previous: &Arc<GeneratedSnapshot>,
        push: Arc<PushContext>,
        version: u64,
    ) -> Self {
        let summary = diff(&previous.push, &push);
        let change = change_kind_of(&previous.push, &push, &summary);
        let vs_hosts_changed = (only_virtual_services(&summary) && !summary.configs.is_empty())
            .then(|| virtual_service_hosts_changed(&previous.push, &push))
            .flatten();
        let mut snapshot = Self::new_since(push, version, Some(previous.version), change);
        snapshot.scopes_kept = plan_kept(&summary)
            && summary.endpoints.is_empty()
            && snapshot.index.same_scopes_as(&previous.index);
        snapshot.base = Some(Base {
            previous: Arc::downgrade(previous),
            summary,
            vs_hosts_changed,
        });
        snapshot.log_window = previous.log_window.clone();
        snapshot
    }

    /// Logs and counts what generating a part of this snapshot noticed.
    pub(crate) fn report(&self, findings: &[Finding]) {
        report(findings, &self.log_window);
    }

    /// Resources of `part` generated (not taken from the previous snapshot) so far.
    pub fn generated_resources(&self, part: Part) -> u64 {
        self.generated_resources[part_index(part)].load(Ordering::Relaxed)
    }

    /// Parts, and single resources, taken from the previous snapshot so far.
    pub fn reused(&self) -> (u64, u64) {
        (
            self.reused_parts.load(Ordering::Relaxed),
            self.reused_resources.load(Ordering::Relaxed),
        )
    }

    /// The previous snapshot (if alive) and what `part` may take from it.
    fn base_for(&self, part: Part, flavor: Flavor) -> Option<(Arc<GeneratedSnapshot>, Reuse)> {
        let base = self.base.as_ref()?;
        let rule = reuse_rule(part, flavor, self.change, &base.summary);
        if rule == Reuse::No {
            return None;
        }
        Some((base.previous.upgrade()?, rule))
    }

    /// The part the previous snapshot generated for `proxy`, when `part` may be taken
    /// from it as `want` says and the proxy's projected scope is equal in both snapshots
    /// (for [`Reuse::PerResource`], but for the VirtualService `sourceLabels` selectors:
    /// their indexes move with VirtualServices, and a reused resource reads only its own
    /// VirtualService's selectors, which the old scope already fixed).
    fn previous_part(
        &self,
        proxy: &Proxy,
        scope: &Scope,
        part: Part,
        want: Reuse,
    ) -> Option<(Arc<GeneratedSnapshot>, Arc<ResourceMap>)> {
        let (previous, rule) = self.base_for(part, Flavor::of(proxy))?;
        if rule != want {
            return None;
        }
        let old = previous.index.scope(proxy).for_part(part);
        let new = scope.for_part(part);
        let equal = match rule {
            Reuse::PerResource => {
                Scope {
                    source_selectors: Vec::new(),
                    ..old.clone()
                } == Scope {
                    source_selectors: Vec::new(),
                    ..new
                }
            }
            _ => old == new,
        };
        if !equal {
            return None;
        }
        let found = previous.parts.peek(&(part, old))?;
        Some((previous, found))
    }

    /// A service's own resources of `part` (sidecar route configurations and listeners,
    /// proxyless route configurations) the previous snapshot generated and this one may
    /// keep: their host's VirtualService is equal in both (everything else they read is
    /// unchanged, or [`reuse_rule`] would not allow [`Reuse::PerResource`]).
    fn lent_resources(
        &self,
        proxy: &Proxy,
        scope: &Scope,
        part: Part,
        plan: &OutboundPlan,
    ) -> ResourceMap {
        // Collected, then built into a map in one go (a thousand inserts, per part and
        // scope, were a visible share of an edit's CPU).
        let mut lent = Vec::new();
        let Some((previous, old)) = self.previous_part(proxy, scope, part, Reuse::PerResource)
        else {
            return ResourceMap::new();
        };
        // Under a Sidecar the VirtualService a host gets depends on what the Sidecar
        // imports, which a VirtualService edit can change: regenerate them all.
        if plan.sidecar.sidecar.is_some() {
            return ResourceMap::new();
        }
        let namespace = &proxy.namespace;
        let changed_hosts = self.base.as_ref().and_then(|b| b.vs_hosts_changed.as_ref());
        let same_routing = |host: &str| match changed_hosts {
            Some(changed) => !changed.contains(host),
            None => {
                let old_vs = previous.push.virtual_service_for_host(host, namespace);
                let new_vs = self.push.virtual_service_for_host(host, namespace);
                old_vs.map(|v| &**v) == new_vs.map(|v| &**v)
            }
        };
        let mut lend = |name: String, host: &str| {
            if let Some(r) = old.get(&name)
                && same_routing(host)
            {
                lent.push((name, r.clone()));
            }
        };
        match (part, Flavor::of(proxy)) {
            (Part::Routes, Flavor::Sidecar) => {
                for (port, services) in outbound_ports(plan) {
                    for (c, _) in &services.own_listeners {
                        if c.port.protocol.is_http() {
                            lend(
                                names::host_port(&c.service.hostname, port),
                                &c.service.hostname,
                            );
                        }
                    }
                }
            }
            (Part::Routes, Flavor::Proxyless) => {
                for c in plan.clusters().iter().filter(|c| c.subset.is_empty()) {
                    lend(
                        names::host_port(&c.service.hostname, c.port.port),
                        &c.service.hostname,
                    );
                }
            }
            (Part::OutboundListeners, Flavor::Sidecar) => {
                for (port, services) in outbound_ports(plan) {
                    for (c, ips) in &services.own_listeners {
                        for ip in *ips {
                            lend(names::vip_listener(ip, port), &c.service.hostname);
                        }
                    }
                }
            }
            _ => {}
        }
        lent.into_iter().collect()
    }

    pub fn push_context(&self) -> &Arc<PushContext> {
        &self.push
    }

    /// How this snapshot differs from the one published before it.
    pub fn change(&self) -> ChangeKind {
        self.change
    }

    /// Parts generated so far (cache misses), for tests and debug pages.
    pub fn generations(&self) -> u64 {
        self.generations.load(Ordering::Relaxed)
    }

    /// Outbound plans this snapshot computed (not taken from the previous one).
    pub fn plans_computed(&self) -> u64 {
        self.plans_computed.load(Ordering::Relaxed)
    }

    /// Streams' scopes this snapshot computed (not taken from the previous one).
    pub fn stream_scopes_computed(&self) -> u64 {
        self.stream_scopes_computed.load(Ordering::Relaxed)
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
        self.parts_in(proxy, &scope, kind)
    }

    fn parts_in(&self, proxy: &Proxy, scope: &Scope, kind: XdsType) -> Vec<Arc<ResourceMap>> {
        parts_for(kind, Flavor::of(proxy))
            .iter()
            .map(|part| self.part(proxy, scope, *part))
            .collect()
    }

    /// The parts of `kind` for `proxy` in `scope` (one [`Self::served`] gave) that are
    /// cached already, or `None` when one of them is not: never generates anything.
    pub fn parts_if_cached(
        &self,
        proxy: &Proxy,
        scope: &Scope,
        kind: XdsType,
    ) -> Option<Vec<Arc<ResourceMap>>> {
        parts_for(kind, Flavor::of(proxy))
            .iter()
            .map(|part| self.parts.peek(&(*part, scope.for_part(*part))))
            .collect()
    }

    /// Each scope the engine asked parts for, with the first proxy that asked, in no
    /// particular order (gateways, which get nothing, are never among them).
    pub fn served(&self) -> Vec<(Arc<Scope>, Proxy)> {
        self.served
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(scope, (proxy, _))| (scope.clone(), proxy.clone()))
            .collect()
    }

    /// The shared copy of `scope`, which `proxy` asked for: recorded as served, with
    /// `proxy` as its sample when it is the first. Past [`PART_CACHE_CAPACITY`] scopes a
    /// new one is not recorded (its streams still share what the part cache shares).
    fn served_scope(&self, proxy: &Proxy, scope: Arc<Scope>) -> Arc<ServedScope> {
        let mut served = self.served.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, shared)) = served.get(&*scope) {
            return shared.clone();
        }
        let shared = ServedScope::new(scope.clone());
        if served.len() < PART_CACHE_CAPACITY {
            served.insert(scope, (proxy.clone(), shared.clone()));
        }
        shared
    }

    /// The outbound plan of `scope`: the previous snapshot's when nothing it reads
    /// changed, else computed (once per snapshot while cached).
    fn plan(&self, proxy: &Proxy, scope: &Scope) -> Arc<OutboundPlan> {
        let key = scope.for_part(Part::OutboundClusters);
        self.plans.get_or_init(key.clone(), || {
            if let Some(plan) = self.previous_plan(&key) {
                return plan;
            }
            self.plans_computed.fetch_add(1, Ordering::Relaxed);
            let mut findings = Vec::new();
            let sidecar = Arc::new(self.push.sidecar_scope(scope.sidecar, &scope.namespace));
            let plan = Arc::new(outbound_plan(
                &self.push,
                proxy,
                sidecar,
                Flavor::of(proxy),
                &mut findings,
            ));
            self.report(&findings);
            plan
        })
    }

    /// The previous snapshot's plan for the projected scope `key`, when only
    /// VirtualServices changed and no Sidecar applies: a plan reads services,
    /// DestinationRules, the mesh config and — only through a Sidecar's imports —
    /// VirtualServices. (The projected scope already fixes the namespace class and the
    /// workload-selector DestinationRules.)
    fn previous_plan(&self, key: &Scope) -> Option<Arc<OutboundPlan>> {
        let base = self.base.as_ref()?;
        if !plan_kept(&base.summary) || key.sidecar.is_some() {
            return None;
        }
        base.previous.upgrade()?.plans.peek(key)
    }

    fn part(&self, proxy: &Proxy, scope: &Scope, part: Part) -> Arc<ResourceMap> {
        let key = (part, scope.for_part(part));
        if PLANNED.contains(&part) && !self.parts.contains(&key) {
            // Generate every planned part of the scope together: they read one plan.
            for sibling in PLANNED {
                self.generated(proxy, scope, sibling);
            }
        }
        self.generated(proxy, scope, part)
    }

    fn generated(&self, proxy: &Proxy, scope: &Scope, part: Part) -> Arc<ResourceMap> {
        let key = (part, scope.for_part(part));
        self.parts.get_or_init(key, || {
            if let Some((_, whole)) = self.previous_part(proxy, scope, part, Reuse::Whole) {
                self.reused_parts.fetch_add(1, Ordering::Relaxed);
                return whole;
            }
            self.generations.fetch_add(1, Ordering::Relaxed);
            GENERATIONS.with_label_values(&[part_label(part)]).inc();
            let mut findings = Vec::new();
            let resources = self.generate(proxy, scope, part, &mut findings);
            self.report(&findings);
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
        let mut lent = ResourceMap::new();
        let resources = self.generate_lending(proxy, scope, part, &mut lent, findings);
        self.generated_resources[part_index(part)]
            .fetch_add(resources.len() as u64, Ordering::Relaxed);
        self.reused_resources
            .fetch_add(lent.len() as u64, Ordering::Relaxed);
        // Their names are disjoint; the few generated resources go into the many lent.
        for (name, resource) in resources {
            lent.entry(name).or_insert(resource);
        }
        lent
    }

    /// Generates one part but for the resources put in `lent` (taken from the previous
    /// snapshot; [`GeneratedSnapshot::generate`] adds them).
    fn generate_lending(
        &self,
        proxy: &Proxy,
        scope: &Scope,
        part: Part,
        lent: &mut ResourceMap,
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
                let offered = self.lent_resources(proxy, scope, part, &plan);
                let reused = |name: &str| offered.contains_key(name);
                let mut listeners = match flavor {
                    Flavor::Sidecar => {
                        lds::sidecar_outbound_listeners(push, proxy, &plan, &reused, findings)
                    }
                    Flavor::Proxyless => lds::proxyless_listeners(&plan),
                };
                findings.extend(sanitize_listeners(&mut listeners, &|c| {
                    known_cluster(&plan, flavor, c)
                }));
                // The stubs that stand for reused listeners (those the sanitizer kept)
                // are replaced by the previous snapshot's listeners.
                let mut kept = Vec::new();
                listeners.retain(|l| match offered.get(&l.name) {
                    Some(r) => {
                        kept.push((l.name.clone(), r.clone()));
                        false
                    }
                    None => true,
                });
                *lent = kept.into_iter().collect();
                encode(listeners, |l| &l.name)
            }
            Part::InboundListener => {
                let mtls = scope.inbound_mtls.clone().unwrap_or_default();
                let trust_domain = &push.mesh().trust_domain;
                let rbac = rbac::InboundRbac::new(
                    &self.index.workload_authorization(&scope.authz),
                    trust_domain,
                );
                let mut listeners = vec![lds::sidecar_inbound_listener(
                    &scope.inbound,
                    &mtls,
                    &scope.inbound_jwt,
                    trust_domain,
                    &rbac,
                )];
                listeners.extend(lds::bound_inbound_listeners(
                    &scope.inbound,
                    &mtls,
                    &scope.inbound_jwt,
                    trust_domain,
                    &rbac,
                ));
                encode(listeners, |l| &l.name)
            }
            Part::Routes => {
                let plan = self.plan(proxy, scope);
                *lent = self.lent_resources(proxy, scope, part, &plan);
                let reused = |name: &str| lent.contains_key(name);
                let mut routes = match flavor {
                    Flavor::Sidecar => {
                        rds::sidecar_route_configs(push, proxy, &plan, &reused, findings)
                    }
                    Flavor::Proxyless => {
                        rds::proxyless_route_configs(push, proxy, &plan, &reused, findings)
                    }
                };
                findings.extend(sanitize_routes(&mut routes, &|c| {
                    known_cluster(&plan, flavor, c)
                }));
                encode(routes, |r| &r.name)
            }
        }
    }
}

/// The cached parts that make up `kind` for a client of `flavor`.
fn parts_for(kind: XdsType, flavor: Flavor) -> &'static [Part] {
    match (kind, flavor) {
        (XdsType::Cluster, Flavor::Sidecar) => &[Part::OutboundClusters, Part::InboundClusters],
        (XdsType::Cluster, Flavor::Proxyless) => &[Part::OutboundClusters],
        (XdsType::Endpoint, _) => &[Part::Endpoints],
        (XdsType::Listener, Flavor::Sidecar) => &[Part::OutboundListeners, Part::InboundListener],
        (XdsType::Listener, Flavor::Proxyless) => &[Part::OutboundListeners],
        (XdsType::Route, _) => &[Part::Routes],
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
fn report(findings: &[Finding], window: &Mutex<LogWindow>) {
    let now = std::time::Instant::now();
    for finding in findings {
        count(finding);
        if !window
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(finding, now)
        {
            continue;
        }
        match finding {
            Finding::Downgrade(d) => {
                tracing::warn!(
                    feature = d.feature,
                    resource = d.resource.as_str(),
                    "proxyless gRPC clients do not support {}; left out for them",
                    d.what
                );
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
            }
            Finding::UnresolvedDestination {
                kind: RouteKind::Tcp,
                cluster,
                ..
            } => {
                tracing::warn!(cluster = %cluster, "TCP route destination has no cluster for this proxy; connections are refused");
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
            Finding::InconsistentReference { reference, .. } => {
                tracing::error!(
                    reference = reference.as_str(),
                    "inconsistent generated reference (a Pilotfish bug); replaced before sending"
                );
            }
            Finding::VirtualHostSkipped { vhost, reason } => {
                tracing::debug!(vhost = %vhost, "{reason}");
            }
        }
    }
}

/// Counts one finding (every occurrence; the log line is rate-limited, the metric not).
fn count(finding: &Finding) {
    match finding {
        Finding::Downgrade(d) => PROXYLESS_DOWNGRADES.with_label_values(&[d.feature]).inc(),
        Finding::UnresolvedDestination { kind, .. } => UNRESOLVED_DESTINATIONS
            .with_label_values(&[kind.label()])
            .inc(),
        Finding::InconsistentReference { kind, .. } => {
            INCONSISTENT_REFERENCES.with_label_values(&[kind]).inc()
        }
        _ => {}
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

    /// As [`XdsSnapshot::parts`], with the proxy's scope computed once per snapshot; the
    /// scope counts as served (the audit checks it).
    fn stream_parts(&self, proxy: &Arc<Proxy>, kind: XdsType) -> Vec<Arc<ResourceMap>> {
        if proxy.proxy_type == ProxyType::Router {
            return Vec::new();
        }
        let served = self.stream_scope(proxy);
        served.parts[kind.index()]
            .get_or_init(|| self.parts_in(proxy, &served.scope, kind))
            .clone()
    }

    /// A proxyless gRPC server's listeners (`xds.istio.io/grpc/lds/inbound/<ip>:<port>`),
    /// generated per (scope, names asked for); nothing for anything else.
    fn named_parts(
        &self,
        proxy: &Proxy,
        xds_type: XdsType,
        requested: &mut dyn Iterator<Item = &str>,
    ) -> Vec<Arc<ResourceMap>> {
        if xds_type != XdsType::Listener
            || Flavor::of(proxy) != Flavor::Proxyless
            || proxy.proxy_type == ProxyType::Router
        {
            return Vec::new();
        }
        let asked: Vec<String> = requested
            .filter(|n| n.starts_with(names::SERVER_LISTENER_PREFIX))
            .map(str::to_string)
            .collect();
        if asked.is_empty() {
            return Vec::new();
        }
        // The projection holds the workload's ports, their modes and the indexes of the
        // AuthorizationPolicies that apply: all the listeners read.
        let scope = self.index.scope(proxy).for_part(Part::InboundListener);
        let part = self
            .server_listeners
            .get_or_init((scope.clone(), asked.clone()), || {
                self.generations.fetch_add(1, Ordering::Relaxed);
                GENERATIONS.with_label_values(&["server_listeners"]).inc();
                let ports: Vec<u32> = scope.inbound.iter().map(|p| p.port).collect();
                let mtls = scope.inbound_mtls.clone().unwrap_or_default();
                let rbac = rbac::proxyless_http_filters(
                    &self.index.workload_authorization(&scope.authz),
                    &self.push.mesh().trust_domain,
                );
                let listeners = proxyless_inbound::server_listeners(
                    asked.iter().map(String::as_str),
                    &ports,
                    &mtls,
                    &rbac,
                );
                shared_part(encode(listeners, |l| &l.name))
            });
        vec![part]
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
/// ORIGINAL_DST clusters, so their changes are EDS-free but harmless — except whether all
/// of a port's endpoints run a sidecar, which decides the cluster's auto mTLS).
pub fn change_kind(old: &PushContext, new: &PushContext) -> ChangeKind {
    change_kind_of(old, new, &diff(old, new))
}

/// [`change_kind`] from an already computed `summary` of `old` → `new`.
fn change_kind_of(old: &PushContext, new: &PushContext, summary: &ChangeSummary) -> ChangeKind {
    if !summary.is_endpoints_only() {
        return ChangeKind::Full;
    }
    let full = summary.endpoints.iter().any(|(host, ns)| {
        let (before, after) = (
            EndpointShaped::of(old, host, ns),
            EndpointShaped::of(new, host, ns),
        );
        before.beyond_eds || after.beyond_eds || before != after
    });
    if full {
        ChangeKind::Full
    } else {
        ChangeKind::EndpointsOnly
    }
}

/// What a service's endpoints decide besides EDS, in one snapshot (all empty for a host
/// without a service there).
#[derive(Debug, Default, PartialEq)]
struct EndpointShaped {
    /// Named target ports decide a sidecar's inbound ports; DNS services carry their
    /// endpoints in CDS: any endpoint change of such a service is a full change.
    beyond_eds: bool,
    /// The identities TLS verifies (the endpoints' service accounts).
    identities: std::collections::BTreeSet<String>,
    /// For a passthrough service, per port, whether every endpoint runs a sidecar (its
    /// cluster's auto mTLS).
    passthrough_mtls: Option<Vec<bool>>,
}

impl EndpointShaped {
    fn of(ctx: &PushContext, host: &str, ns: &str) -> Self {
        let Some(service) = ctx.service(host, ns) else {
            return Self::default();
        };
        EndpointShaped {
            beyond_eds: service
                .ports
                .iter()
                .any(|p| matches!(p.target_port, Some(TargetPort::Name(_))))
                || matches!(
                    service.resolution,
                    Resolution::Dns | Resolution::DnsRoundRobin
                ),
            identities: ctx
                .endpoints(service)
                .map(|eps| endpoint_identities(eps, ns, &ctx.mesh().trust_domain))
                .unwrap_or_default(),
            passthrough_mtls: (service.resolution == Resolution::Passthrough).then(|| {
                service
                    .ports
                    .iter()
                    .map(|p| all_run_sidecars(ctx, service, p.port))
                    .collect()
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_forgets_the_least_recently_used_value_past_its_capacity() {
        let cache: Cache<u32, u32> = Cache::new(3);
        let computed = AtomicU64::new(0);
        let get = |k: u32| {
            cache.get_or_init(k, || {
                computed.fetch_add(1, Ordering::Relaxed);
                k * 10
            })
        };
        for k in 0..3 {
            assert_eq!(get(k), k * 10);
        }
        get(0); // 1 is now the least recently used
        get(3);
        assert_eq!(cache.len(), 3);
        assert!(cache.contains(&0) && !cache.contains(&1));
        assert_eq!(computed.load(Ordering::Relaxed), 4);
        for k in 4..1000 {
            get(k);
        }
        assert_eq!(cache.len(), 3, "bounded whatever is asked");
        get(1);
        assert_eq!(
            computed.load(Ordering::Relaxed),
            1001,
            "1 was computed again"
        );
    }
}
