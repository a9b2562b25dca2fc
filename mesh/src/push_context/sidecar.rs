//! The sidecar scope of a proxy (Istio's `SidecarScope`, pilot/pkg/model/sidecar.go at
//! 1.30.3): which Sidecar applies to it ([`PushContext::sidecar_for`]) and what that
//! Sidecar lets it see ([`PushContext::sidecar_scope`]) — the services and VirtualServices
//! its egress listeners import, trimmed to the listeners' ports, and its outbound traffic
//! policy. The generators ask the scope instead of the whole snapshot; without a Sidecar
//! the scope is the namespace's whole visible mesh, exactly what they saw before.
//!
//! Precedence (Istio's `getSidecarScope`): in the proxy's namespace, a Sidecar whose
//! `workloadSelector` matches the proxy's labels (oldest first), else the namespace's
//! Sidecar without a selector (oldest), else the root namespace's Sidecar without a
//! selector (the mesh default, read with the proxy's namespace as `.`), else none.
//!
//! Imports (Istio's `convertIstioListenerToWrapper`, `selectServices`,
//! `SelectVirtualServices`, `collectImportedServices`): `ns/host` imports the host from
//! `ns` (`.` the config namespace, `*` any, `~` none: a namespace no service lives in),
//! with a wildcard `host` matching hosts it covers. Of the services visible to the
//! namespace, each listener takes those its hosts match (a listener with a port keeps only
//! that port of each, and a service without it is not imported), one per host name (the
//! config namespace's, else a Kubernetes service, else the first); the VirtualServices it
//! takes are those one of whose hosts matches an import either way (Istio's legacy
//! bidirectional match for VirtualServices not generated from Gateway API), and the
//! destinations of those VirtualServices are imported too (the config namespace's service
//! of that host, else a visible Kubernetes one, else the oldest), on the destination
//! ports (or the listener's port). Services imported by several listeners are merged as
//! Istio merges them (same namespace and origin: ports added; a Kubernetes service beats
//! a ServiceEntry of the same host).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::{PushContext, SidecarConfig, VirtualServiceConfig, config_age_order};
use crate::api::{
    CaptureMode, ConnectionPoolSettings, Destination, IstioEgressListener,
    OutboundTrafficPolicyMode, SidecarSpec, VirtualServiceSpec,
};
use crate::mesh_config::OutboundTrafficPolicy;
use crate::model::{Service, ServiceOrigin, labels_match};

/// What a proxy's outbound traffic to hosts the registry does not know does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OutboundPolicy {
    pub mode: OutboundTrafficPolicy,
    /// `ALLOW_ANY` traffic to unknown hosts goes to this destination instead of the
    /// original destination (Sidecar `egressProxy`).
    pub egress_proxy: Option<Destination>,
}

/// The imports of a Sidecar, for one config namespace.
#[derive(Debug)]
struct Imports {
    /// One per host name, sorted by host name (ports trimmed to what is imported): the
    /// union over the egress listeners, VirtualService destinations included (what CDS
    /// and EDS serve).
    services: Vec<Arc<Service>>,
    by_host: HashMap<String, usize>,
    /// (namespace, name) of the VirtualServices any listener imports.
    virtual_services: HashSet<(String, String)>,
    /// The egress listeners, in the Sidecar's order (a default `*/*` one without egress).
    listeners: Vec<EgressScope>,
}

/// One egress listener of a scope (Istio's `IstioEgressListenerWrapper`): where it
/// listens, the services its hosts import (not the destinations of its VirtualServices:
/// those only get clusters) and the VirtualServices it imports, which route the ports it
/// claims ([`SidecarScope::listener_for_port`]).
#[derive(Debug, Default)]
pub struct EgressScope {
    /// The listener's port number; `None` for the catch-all listener, `Some(0)` for a Unix
    /// domain socket one.
    pub port: Option<u32>,
    /// The port's protocol as written (`HTTP`, `TCP`, ...), when set.
    pub protocol: Option<String>,
    /// `bind`: an IP, or `unix://path`.
    pub bind: Option<String>,
    /// `captureMode: NONE`.
    pub capture_none: bool,
    /// One per host name, sorted by host name; a listener with a port keeps only that
    /// port of each.
    pub services: Vec<Arc<Service>>,
    virtual_services: HashSet<(String, String)>,
}

impl EgressScope {
    /// Whether the listener imports the service `hostname` (explicitly, by its hosts).
    pub fn imports_service(&self, hostname: &str) -> bool {
        self.services
            .binary_search_by(|s| s.hostname.as_str().cmp(hostname))
            .is_ok()
    }

    /// Whether the listener imports `vs`.
    pub fn imports_virtual_service(&self, vs: &VirtualServiceConfig) -> bool {
        self.virtual_services
            .contains(&(vs.meta.namespace.clone(), vs.meta.name.clone()))
    }

    /// Whether the listener's traffic does not come through `virtualOutbound`'s
    /// redirection (Istio's `bindToPort` with an address of the listener's own, or an
    /// explicit `bind` address): `captureMode: NONE`, a Unix socket, or any `bind`.
    pub fn has_own_address(&self) -> bool {
        self.capture_none || self.bind.is_some()
    }

    /// Whether the listener binds its address (Istio's `bindToPort`, for a proxy that
    /// redirects: `captureMode: NONE` or a Unix domain socket).
    pub fn binds(&self) -> bool {
        self.capture_none || self.bind.as_deref().is_some_and(is_unix)
    }

    /// A Unix domain socket listener.
    pub fn is_unix(&self) -> bool {
        self.bind.as_deref().is_some_and(is_unix)
    }
}

fn is_unix(bind: &str) -> bool {
    bind.starts_with(UNIX_PREFIX)
}

/// The prefix of a Unix domain socket `bind`.
pub const UNIX_PREFIX: &str = "unix://";

/// What a proxy sees of the mesh (see the module documentation).
#[derive(Debug, Default)]
pub struct SidecarScope {
    /// The proxy's (config) namespace.
    pub namespace: String,
    /// The Sidecar that applies, `None` without one.
    pub sidecar: Option<Arc<SidecarConfig>>,
    /// `None`: no Sidecar, everything visible to the namespace.
    imports: Option<Imports>,
    pub outbound: OutboundPolicy,
}

/// Imported host names by namespace (Istio's `hostClassification`).
#[derive(Debug, Default)]
struct HostImports {
    exact: HashSet<String>,
    all: Vec<String>,
}

impl HostImports {
    /// Whether a service host is imported: exactly, or covered by an imported wildcard
    /// (Istio's `hostClassification.Matches`: `SubsetOf`).
    fn matches_service(&self, host: &str) -> bool {
        self.exact.contains(host)
            || self
                .all
                .iter()
                .filter(|imported| is_wildcard(imported) || is_wildcard(host))
                .any(|imported| subset_of(host, imported))
    }

    /// Whether a VirtualService host is imported (Istio's `VSMatches` for VirtualServices
    /// of the networking API: a match in either direction).
    fn matches_virtual_service(&self, host: &str) -> bool {
        self.exact.contains(host)
            || self
                .all
                .iter()
                .filter(|imported| is_wildcard(imported) || is_wildcard(host))
                .any(|imported| subset_of(host, imported) || subset_of(imported, host))
    }
}

fn is_wildcard(host: &str) -> bool {
    host.starts_with('*')
}

/// Istio's `host.Name.SubsetOf`: every host `a` matches is matched by `b`.
fn subset_of(a: &str, b: &str) -> bool {
    if b == "*" {
        return true;
    }
    if a == b {
        return true;
    }
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        // `*.x.com` ⊂ `*.com`; `a.com` ⊂ `*.com`.
        (Some(a_suffix), Some(b_suffix)) => a_suffix.ends_with(b_suffix),
        (None, Some(b_suffix)) => a.len() > b_suffix.len() && a.ends_with(b_suffix),
        _ => false,
    }
}

/// One egress listener's parsed imports.
struct Listener<'a> {
    spec: &'a IstioEgressListener,
    hosts: HashMap<String, HostImports>,
}

impl Listener<'_> {
    /// Istio's `needsPortMatch`: a listener with a port (other than an `HTTP_PROXY` one)
    /// imports only that port of each service.
    fn port(&self) -> Option<u32> {
        let port = self.spec.port.as_ref()?;
        let http_proxy = port
            .protocol
            .as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case("http_proxy"));
        (port.number != 0 && !http_proxy).then_some(port.number)
    }
}

/// The connection pool of the inbound cluster of `port` under a Sidecar (Istio's
/// `InboundConnectionPoolForPort`): the first ingress listener on that port that sets
/// `connectionPool`, else the Sidecar's `inboundConnectionPool`, else `None` (the
/// default pool). It applies to every inbound port, those of ingress listeners and those
/// taken from the workload's Services alike; it replaces whatever a DestinationRule's
/// inbound traffic policy would give.
pub fn inbound_connection_pool(spec: &SidecarSpec, port: u32) -> Option<&ConnectionPoolSettings> {
    spec.ingress
        .iter()
        .filter(|l| l.port.number == port)
        .find_map(|l| l.connection_pool.as_ref())
        .or(spec.inbound_connection_pool.as_ref())
}

impl PushContext {
    /// The Sidecar (index into [`PushContext::sidecars`]) that applies to a proxy in
    /// `namespace` with `labels`, by Istio's precedence (module documentation).
    pub fn sidecar_for(&self, namespace: &str, labels: &BTreeMap<String, String>) -> Option<usize> {
        select_sidecar(
            &self.data.sidecars,
            &self.data.mesh.root_namespace,
            namespace,
            labels,
        )
    }
}

/// [`PushContext::sidecar_for`] over a list of Sidecars (sorted or not) and the root
/// namespace, for callers that index Sidecars themselves.
pub fn select_sidecar(
    sidecars: &[Arc<SidecarConfig>],
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Option<usize> {
    let oldest = |candidates: &mut Vec<usize>| {
        candidates.sort_by(|&a, &b| config_age_order(&sidecars[a].meta, &sidecars[b].meta));
        candidates.first().copied()
    };
    fn in_namespace<'s>(
        sidecars: &'s [Arc<SidecarConfig>],
        ns: &'s str,
    ) -> impl Iterator<Item = (usize, &'s Arc<SidecarConfig>)> {
        sidecars
            .iter()
            .enumerate()
            .filter(move |(_, sc)| sc.meta.namespace == ns)
    }
    let mut selecting: Vec<usize> = in_namespace(sidecars, namespace)
        .filter(|(_, sc)| {
            sc.spec
                .workload_selector
                .as_ref()
                .is_some_and(|sel| labels_match(&sel.labels, labels))
        })
        .map(|(i, _)| i)
        .collect();
    if let Some(i) = oldest(&mut selecting) {
        return Some(i);
    }
    let default_of = |ns: &str| {
        let mut defaults: Vec<usize> = in_namespace(sidecars, ns)
            .filter(|(_, sc)| !sc.spec.has_workload_selector())
            .map(|(i, _)| i)
            .collect();
        oldest(&mut defaults)
    };
    default_of(namespace).or_else(|| default_of(root_namespace))
}

impl PushContext {
    /// The scope of a proxy in `namespace` under the Sidecar `sidecar` (an index from
    /// [`PushContext::sidecar_for`]; `None`: no Sidecar).
    pub fn sidecar_scope(&self, sidecar: Option<usize>, namespace: &str) -> SidecarScope {
        let mesh_policy = OutboundPolicy {
            mode: self.data.mesh.outbound_traffic_policy,
            egress_proxy: None,
        };
        let Some(config) = sidecar.and_then(|i| self.data.sidecars.get(i)) else {
            return SidecarScope {
                namespace: namespace.to_string(),
                sidecar: None,
                imports: None,
                outbound: mesh_policy,
            };
        };
        let outbound = match &config.spec.outbound_traffic_policy {
            None => mesh_policy,
            Some(p) => OutboundPolicy {
                mode: match p.effective_mode() {
                    OutboundTrafficPolicyMode::AllowAny => OutboundTrafficPolicy::AllowAny,
                    OutboundTrafficPolicyMode::RegistryOnly => OutboundTrafficPolicy::RegistryOnly,
                },
                egress_proxy: p.egress_proxy.clone(),
            },
        };
        SidecarScope {
            namespace: namespace.to_string(),
            sidecar: Some(config.clone()),
            imports: Some(self.imports(&config.spec.egress, namespace)),
            outbound,
        }
    }

    fn imports(&self, egress: &[IstioEgressListener], namespace: &str) -> Imports {
        let catch_all = IstioEgressListener {
            hosts: vec!["*/*".to_string()],
            ..IstioEgressListener::default()
        };
        let specs: Vec<&IstioEgressListener> = if egress.is_empty() {
            vec![&catch_all]
        } else {
            egress.iter().collect()
        };
        let listeners: Vec<Listener> = specs
            .into_iter()
            .map(|spec| Listener {
                spec,
                hosts: parse_hosts(&spec.hosts, namespace),
            })
            .collect();
        // Services visible to the namespace, oldest first (Istio's service order).
        let mut visible: Vec<&Arc<Service>> = self
            .data
            .services
            .iter()
            .filter(|s| self.service_visible(s, namespace))
            .collect();
        visible.sort_by(|a, b| {
            (a.creation_ms, &a.namespace, &a.hostname).cmp(&(
                b.creation_ms,
                &b.namespace,
                &b.hostname,
            ))
        });
        let mesh_vs = self.virtual_services_for(namespace);

        let mut merged = Merged::default();
        let mut virtual_services = HashSet::new();
        let mut scopes = Vec::new();
        for listener in &listeners {
            let mut own = select_services(&visible, listener, namespace);
            own.sort_by(|a, b| a.hostname.cmp(&b.hostname));
            for s in &own {
                merged.append(s.clone());
            }
            let selected: Vec<&Arc<VirtualServiceConfig>> = mesh_vs
                .iter()
                .copied()
                .filter(|vs| imports_virtual_service(listener, vs))
                .collect();
            scopes.push(EgressScope {
                port: listener.spec.port.as_ref().map(|p| p.number),
                protocol: listener.spec.port.as_ref().and_then(|p| p.protocol.clone()),
                bind: listener.spec.bind.clone().filter(|b| !b.is_empty()),
                capture_none: listener.spec.capture_mode == Some(CaptureMode::None),
                services: own,
                virtual_services: selected
                    .iter()
                    .map(|vs| (vs.meta.namespace.clone(), vs.meta.name.clone()))
                    .collect(),
            });
            for vs in selected {
                virtual_services.insert((vs.meta.namespace.clone(), vs.meta.name.clone()));
                for (host, ports) in destinations_for_namespace(&vs.spec, namespace) {
                    let Some(service) = self.destination_service(&host, namespace) else {
                        continue;
                    };
                    let trimmed = match listener.port() {
                        Some(port) => only_port(service, port),
                        None => only_ports(service, &ports),
                    };
                    if let Some(s) = trimmed {
                        merged.append(s);
                    }
                }
            }
        }
        let mut services = merged.services;
        services.sort_by(|a, b| a.hostname.cmp(&b.hostname));
        let by_host = services
            .iter()
            .enumerate()
            .map(|(i, s)| (s.hostname.clone(), i))
            .collect();
        Imports {
            services,
            by_host,
            virtual_services,
            listeners: scopes,
        }
    }

    /// The service a VirtualService destination names, for a proxy in `namespace`: its
    /// own namespace's, else a visible Kubernetes service, else the oldest visible one
    /// (Istio's `pickBestVisibleNamespace`).
    fn destination_service(&self, host: &str, namespace: &str) -> Option<&Arc<Service>> {
        let candidates = self.services_by_host.get(host)?;
        let visible: Vec<&Arc<Service>> = candidates
            .iter()
            .map(|&i| &self.data.services[i])
            .filter(|s| self.service_visible(s, namespace))
            .collect();
        visible
            .iter()
            .find(|s| s.namespace == namespace)
            .or_else(|| {
                visible
                    .iter()
                    .find(|s| s.origin == ServiceOrigin::Kubernetes)
            })
            .or_else(|| visible.first())
            .copied()
    }
}

/// `ns/host` entries by namespace (`.` is `namespace`); malformed entries (validation
/// rejects them) are skipped.
fn parse_hosts(hosts: &[String], namespace: &str) -> HashMap<String, HostImports> {
    let mut out: HashMap<String, HostImports> = HashMap::new();
    for h in hosts {
        let Some((ns, name)) = h.split_once('/') else {
            continue;
        };
        if name.contains('/') {
            continue;
        }
        let ns = if ns == "." { namespace } else { ns };
        let entry = out.entry(ns.to_string()).or_default();
        let name = name.to_ascii_lowercase();
        if !is_wildcard(&name) {
            entry.exact.insert(name.clone());
        }
        entry.all.push(name);
    }
    out
}

/// The services one listener imports, one per host name.
fn select_services(
    visible: &[&Arc<Service>],
    listener: &Listener,
    namespace: &str,
) -> Vec<Arc<Service>> {
    let wildcard = listener.hosts.get("*");
    let mut imported: Vec<Arc<Service>> = Vec::new();
    for s in visible {
        let own = listener.hosts.get(&s.namespace);
        let matched = own.is_some_and(|h| h.matches_service(&s.hostname))
            || wildcard.is_some_and(|h| h.matches_service(&s.hostname));
        if !matched {
            continue;
        }
        let trimmed = match listener.port() {
            Some(port) => only_port(s, port),
            None => Some((*s).clone()),
        };
        imported.extend(trimmed);
    }
    // One namespace per host name: the config namespace's, else a Kubernetes service
    // over a ServiceEntry, else the first (Istio's unified sidecar scoping).
    let mut chosen: HashMap<String, (String, bool)> = HashMap::new();
    for s in &imported {
        let kube = s.origin == ServiceOrigin::Kubernetes;
        match chosen.get(&s.hostname) {
            None => {
                chosen.insert(s.hostname.clone(), (s.namespace.clone(), kube));
            }
            Some((ns, ex_kube)) => {
                // (Istio's third rule also lets a Kubernetes service of the config
                // namespace win, which the first rule already does.)
                if s.namespace == namespace || (!ex_kube && kube && ns != namespace) {
                    chosen.insert(s.hostname.clone(), (s.namespace.clone(), kube));
                }
            }
        }
    }
    imported.retain(|s| {
        chosen
            .get(&s.hostname)
            .is_some_and(|(ns, _)| *ns == s.namespace)
    });
    imported
}

/// Whether a listener imports a VirtualService: one of its hosts matches an import of the
/// VirtualService's namespace or of `*`.
fn imports_virtual_service(listener: &Listener, vs: &VirtualServiceConfig) -> bool {
    let own = listener.hosts.get(&vs.meta.namespace);
    let wildcard = listener.hosts.get("*");
    vs.spec.hosts.iter().any(|h| {
        own.is_some_and(|i| i.matches_virtual_service(h))
            || wildcard.is_some_and(|i| i.matches_virtual_service(h))
    })
}

/// The destination hosts of a VirtualService and the ports they name (0: a destination
/// without a port), leaving out HTTP routes whose matches all name another
/// `sourceNamespace` (Istio's `virtualServiceDestinationsFilteredBySourceNamespace`).
fn destinations_for_namespace(
    vs: &VirtualServiceSpec,
    namespace: &str,
) -> BTreeMap<String, BTreeSet<u32>> {
    let mut out: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    let mut add = |d: &Destination| {
        out.entry(d.host.clone())
            .or_default()
            .insert(d.port.as_ref().map_or(0, |p| p.number));
    };
    for route in &vs.http {
        let mut matched = true;
        for m in &route.r#match {
            if let Some(source) = m.source_namespace.as_deref().filter(|s| !s.is_empty()) {
                if source == namespace {
                    matched = true;
                    break;
                }
                matched = false;
            }
        }
        if !matched {
            continue;
        }
        for d in &route.route {
            add(&d.destination);
        }
        if let Some(m) = &route.mirror {
            add(m);
        }
        for m in &route.mirrors {
            add(&m.destination);
        }
    }
    for route in &vs.tcp {
        for d in &route.route {
            add(&d.destination);
        }
    }
    for route in &vs.tls {
        for d in &route.route {
            add(&d.destination);
        }
    }
    out
}

/// The service with only `port` (Istio's `serviceMatchingListenerPort`); `None` when it
/// does not have it.
fn only_port(s: &Arc<Service>, port: u32) -> Option<Arc<Service>> {
    let p = s.port(port)?;
    if s.ports.len() == 1 {
        return Some(s.clone());
    }
    Some(Arc::new(Service {
        ports: vec![p.clone()],
        ..(**s).clone()
    }))
}

/// The service with only the ports a VirtualService's destinations name (Istio's
/// `serviceMatchingVirtualServicePorts`; 0 stands for "every port"); `None` when it has
/// none of them.
fn only_ports(s: &Arc<Service>, ports: &BTreeSet<u32>) -> Option<Arc<Service>> {
    if ports.is_empty() || ports.contains(&0) {
        return Some(s.clone());
    }
    let found: Vec<_> = s
        .ports
        .iter()
        .filter(|p| ports.contains(&p.port))
        .cloned()
        .collect();
    if found.len() == s.ports.len() {
        return Some(s.clone());
    }
    if found.is_empty() {
        return None;
    }
    Some(Arc::new(Service {
        ports: found,
        ..(**s).clone()
    }))
}

/// Services imported so far, merged per host name as Istio's `appendSidecarServices`.
#[derive(Default)]
struct Merged {
    services: Vec<Arc<Service>>,
    by_host: HashMap<String, usize>,
}

impl Merged {
    fn append(&mut self, s: Arc<Service>) {
        let Some(&i) = self.by_host.get(&s.hostname) else {
            self.by_host.insert(s.hostname.clone(), self.services.len());
            self.services.push(s);
            return;
        };
        let existing = &self.services[i];
        if Arc::ptr_eq(existing, &s) {
            return;
        }
        let existing_kube = existing.origin == ServiceOrigin::Kubernetes;
        let new_kube = s.origin == ServiceOrigin::Kubernetes;
        if existing_kube && !new_kube {
            return;
        }
        if !existing_kube && new_kube {
            self.services[i] = s;
            return;
        }
        if existing.ports == s.ports {
            return;
        }
        let mergeable = existing.namespace == s.namespace
            && existing.resolution == s.resolution
            && existing.origin == s.origin
            && existing.labels == s.labels
            && existing.selector == s.selector
            && existing.export_to == s.export_to;
        if !mergeable {
            return;
        }
        let mut ports = existing.ports.clone();
        for p in &s.ports {
            if !ports.iter().any(|q| q.port == p.port) {
                ports.push(p.clone());
            }
        }
        self.services[i] = Arc::new(Service {
            ports,
            ..(**existing).clone()
        });
    }
}

impl SidecarScope {
    /// Whether a Sidecar restricts what the proxy sees.
    pub fn is_scoped(&self) -> bool {
        self.imports.is_some()
    }

    /// The services the proxy sees, one per host name, sorted by host name.
    pub fn services<'a>(&'a self, push: &'a PushContext) -> Vec<&'a Arc<Service>> {
        match &self.imports {
            None => push.services_visible_to(&self.namespace),
            Some(i) => i.services.iter().collect(),
        }
    }

    /// The service the proxy reaches under `hostname` (ports trimmed to the imported ones).
    pub fn service_for<'a>(
        &'a self,
        push: &'a PushContext,
        hostname: &str,
    ) -> Option<&'a Arc<Service>> {
        match &self.imports {
            None => push.service_for(hostname, &self.namespace),
            Some(i) => i.by_host.get(hostname).map(|&n| &i.services[n]),
        }
    }

    /// Whether the proxy sees `vs`.
    pub fn imports_virtual_service(&self, vs: &VirtualServiceConfig) -> bool {
        match &self.imports {
            None => true,
            Some(i) => i
                .virtual_services
                .contains(&(vs.meta.namespace.clone(), vs.meta.name.clone())),
        }
    }

    /// The VirtualServices the proxy sees, oldest first.
    pub fn virtual_services<'a>(
        &self,
        push: &'a PushContext,
    ) -> Vec<&'a Arc<VirtualServiceConfig>> {
        let mut all = push.virtual_services_for(&self.namespace);
        all.retain(|vs| self.imports_virtual_service(vs));
        all
    }

    /// The egress listeners of the Sidecar, in its order (a single `*/*` one when it has
    /// no egress); empty without a Sidecar (everything visible, one catch-all).
    pub fn egress_listeners(&self) -> &[EgressScope] {
        self.imports.as_ref().map_or(&[], |i| &i.listeners)
    }

    /// The egress listener that claims `port` (Istio's `GetEgressListenerForRDS` for a
    /// port): the first listener on that port number, else the catch-all; `None` without
    /// a Sidecar (everything claims it) or when no listener does. A listener on a Unix
    /// domain socket (port 0) claims no IP port.
    pub fn listener_for_port(&self, port: u32) -> Option<&EgressScope> {
        self.egress_listeners()
            .iter()
            .find(|l| l.port.is_none() || (port != 0 && l.port == Some(port)))
    }

    /// The catch-all egress listener (the one without a port), if any.
    pub fn catch_all(&self) -> Option<&EgressScope> {
        self.egress_listeners().iter().find(|l| l.port.is_none())
    }

    /// The egress listener whose VirtualServices route service `hostname` on `port`: the
    /// one claiming the port when it imports the service, else the catch-all when it does
    /// (Istio still builds the catch-all's TCP services their virtual-IP listeners on a
    /// port another listener claims, with the catch-all's VirtualServices).
    pub fn listener_for_service(&self, hostname: &str, port: u32) -> Option<&EgressScope> {
        match self.listener_for_port(port) {
            Some(l) if l.imports_service(hostname) => Some(l),
            _ => self.catch_all().filter(|l| l.imports_service(hostname)),
        }
    }

    /// The Unix domain socket listener bound to `bind`.
    pub fn listener_for_unix(&self, bind: &str) -> Option<&EgressScope> {
        self.egress_listeners()
            .iter()
            .find(|l| l.port == Some(0) && l.bind.as_deref() == Some(bind))
    }

    /// Whether the routes of `listener` (`None`: without a Sidecar) may use `vs`.
    pub fn listener_imports_virtual_service(
        &self,
        listener: Option<&EgressScope>,
        vs: &VirtualServiceConfig,
    ) -> bool {
        match (&self.imports, listener) {
            (None, _) => true,
            (Some(_), Some(l)) => l.imports_virtual_service(vs),
            (Some(_), None) => false,
        }
    }

    /// The VirtualServices the routes of `listener` use, oldest first (all the proxy
    /// sees without a Sidecar).
    pub fn virtual_services_of<'a>(
        &self,
        push: &'a PushContext,
        listener: Option<&EgressScope>,
    ) -> Vec<&'a Arc<VirtualServiceConfig>> {
        let mut all = push.virtual_services_for(&self.namespace);
        all.retain(|vs| self.listener_imports_virtual_service(listener, vs));
        all
    }

    /// The VirtualService routing `hostname` in the routes of `listener` (Istio routes a
    /// port with the VirtualServices of the listener that claims it): the most specific,
    /// then oldest, of those it imports.
    pub fn virtual_service_of<'a>(
        &self,
        push: &'a PushContext,
        listener: Option<&EgressScope>,
        hostname: &str,
    ) -> Option<&'a Arc<VirtualServiceConfig>> {
        match &self.imports {
            None => push.virtual_service_for_host(hostname, &self.namespace),
            Some(_) => push.virtual_service_for_host_where(hostname, &self.namespace, |vs| {
                self.listener_imports_virtual_service(listener, vs)
            }),
        }
    }

    /// The VirtualService routing `hostname` for the proxy: the most specific, then
    /// oldest, among those it sees.
    pub fn virtual_service_for_host<'a>(
        &self,
        push: &'a PushContext,
        hostname: &str,
    ) -> Option<&'a Arc<VirtualServiceConfig>> {
        match &self.imports {
            None => push.virtual_service_for_host(hostname, &self.namespace),
            Some(_) => push.virtual_service_for_host_where(hostname, &self.namespace, |vs| {
                self.imports_virtual_service(vs)
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::{parse_text, to_inputs};
    use crate::push_context::{BuildInputs, build};

    const MESH: &str = "\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: a}
spec:
  clusterIP: 10.0.0.1
  ports: [{name: http, port: 8080}, {name: grpc, port: 9090}]
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: b}
spec:
  clusterIP: 10.0.0.2
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: b}
spec:
  clusterIP: 10.0.0.3
  ports: [{name: tcp, port: 5432}, {name: admin, port: 8081}]
---
apiVersion: v1
kind: Service
metadata: {name: telemetry, namespace: istio-system}
spec:
  clusterIP: 10.0.0.4
  ports: [{name: http, port: 80}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ext, namespace: b}
spec:
  hosts: [api.example.com]
  ports: [{number: 443, name: tls, protocol: TLS}]
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: api, namespace: b}
spec:
  hosts: [api]
  http: [{route: [{destination: {host: db, port: {number: 5432}}}]}]
";

    fn context(extra: &str) -> PushContext {
        let parsed = parse_text(
            std::path::Path::new("t.yaml"),
            &format!("{MESH}---\n{extra}"),
        );
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let inputs = to_inputs(
            &parsed.objects,
            BuildInputs {
                cluster_domain: "cluster.local".into(),
                ..Default::default()
            },
        );
        let built = build(&inputs, None);
        assert!(built.errors().next().is_none(), "{:?}", built.findings);
        built.context
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn sidecar(ns: &str, name: &str, created: &str, spec: &str) -> String {
        format!(
            "---\napiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{created}\"}}\nspec: {spec}\n"
        )
    }

    /// The imported services as `host:port,port`, sorted.
    fn seen(ctx: &PushContext, ns: &str, proxy_labels: &[(&str, &str)]) -> Vec<String> {
        let chosen = ctx.sidecar_for(ns, &labels(proxy_labels));
        let scope = ctx.sidecar_scope(chosen, ns);
        scope
            .services(ctx)
            .iter()
            .map(|s| {
                let ports: Vec<String> = s.ports.iter().map(|p| p.port.to_string()).collect();
                format!("{}:{}", s.hostname, ports.join(","))
            })
            .collect()
    }

    #[test]
    fn the_workload_selector_beats_the_namespace_default_which_beats_the_root_default() {
        let ctx = context(&[
            sidecar("istio-system", "mesh", "2024-01-01T00:00:00Z", "{egress: [{hosts: [\"./*\"]}]}"),
            sidecar("a", "default", "2024-01-01T00:00:00Z", "{egress: [{hosts: [\"istio-system/*\"]}]}"),
            sidecar("a", "web-new", "2024-03-01T00:00:00Z", "{workloadSelector: {labels: {app: web}}, egress: [{hosts: [\"b/*\"]}]}"),
            sidecar("a", "web-old", "2024-02-01T00:00:00Z", "{workloadSelector: {labels: {app: web}}, egress: [{hosts: [\"b/api.b.svc.cluster.local\"]}]}"),
        ].concat());
        let name = |ns: &str, l: &[(&str, &str)]| {
            ctx.sidecar_for(ns, &labels(l))
                .map(|i| ctx.sidecars()[i].meta.name.clone())
        };
        assert_eq!(
            name("a", &[("app", "web")]).as_deref(),
            Some("web-old"),
            "oldest selecting Sidecar"
        );
        assert_eq!(name("a", &[("app", "other")]).as_deref(), Some("default"));
        assert_eq!(
            name("b", &[("app", "web")]).as_deref(),
            Some("mesh"),
            "selectors apply in their own namespace only"
        );
        assert_eq!(
            seen(&ctx, "b", &[]),
            [
                "api.b.svc.cluster.local:80",
                "api.example.com:443",
                "db.b.svc.cluster.local:5432,8081"
            ],
            "the root default's `./*` is the proxy's namespace"
        );
        assert_eq!(
            seen(&ctx, "a", &[]),
            ["telemetry.istio-system.svc.cluster.local:80"]
        );
        assert_eq!(
            seen(&ctx, "a", &[("app", "web")]),
            ["api.b.svc.cluster.local:80", "db.b.svc.cluster.local:5432"],
            "an imported VirtualService brings its destination, on the destination's port"
        );
    }

    #[test]
    fn without_a_sidecar_everything_visible_is_seen() {
        let ctx = context("");
        assert_eq!(seen(&ctx, "a", &[]).len(), 5);
        let scope = ctx.sidecar_scope(None, "a");
        assert!(!scope.is_scoped());
        assert_eq!(scope.outbound.mode, OutboundTrafficPolicy::AllowAny);
    }

    #[test]
    fn tilde_imports_nothing_and_wildcard_namespace_imports_a_host_anywhere() {
        let ctx = context(&sidecar(
            "a",
            "default",
            "2024-01-01T00:00:00Z",
            "{egress: [{hosts: [\"~/*\"]}]}",
        ));
        assert!(seen(&ctx, "a", &[]).is_empty());
        let ctx = context(&sidecar(
            "a",
            "default",
            "2024-01-01T00:00:00Z",
            "{egress: [{hosts: [\"*/db.b.svc.cluster.local\", \"*/*.example.com\"]}]}",
        ));
        assert_eq!(
            seen(&ctx, "a", &[]),
            ["api.example.com:443", "db.b.svc.cluster.local:5432,8081"]
        );
        let scope = ctx.sidecar_scope(ctx.sidecar_for("a", &BTreeMap::new()), "a");
        assert!(
            scope.virtual_services(&ctx).is_empty(),
            "the VirtualService of api is not imported"
        );
    }

    #[test]
    fn a_listener_port_trims_services_to_that_port_and_listeners_merge() {
        let ctx = context(&sidecar(
            "a",
            "default",
            "2024-01-01T00:00:00Z",
            "{egress: [{port: {number: 9090, protocol: GRPC, name: grpc}, hosts: [\"./*\"]}, {port: {number: 8081, protocol: HTTP, name: admin}, hosts: [\"b/*\"]}, {hosts: [\"istio-system/*\"]}]}",
        ));
        assert_eq!(
            seen(&ctx, "a", &[]),
            [
                "db.b.svc.cluster.local:8081",
                "telemetry.istio-system.svc.cluster.local:80",
                "web.a.svc.cluster.local:9090",
            ],
            "api (no 8081) is left out; the VirtualService's destination comes on the listener's port"
        );
    }

    #[test]
    fn the_sidecar_outbound_traffic_policy_replaces_the_mesh_one() {
        let ctx = context(&sidecar(
            "a",
            "default",
            "2024-01-01T00:00:00Z",
            "{outboundTrafficPolicy: {mode: REGISTRY_ONLY}}",
        ));
        let scope = ctx.sidecar_scope(ctx.sidecar_for("a", &BTreeMap::new()), "a");
        assert_eq!(scope.outbound.mode, OutboundTrafficPolicy::RegistryOnly);
        assert_eq!(seen(&ctx, "a", &[]).len(), 5, "no egress: `*/*`");
        let ctx = context(&sidecar(
            "a",
            "default",
            "2024-01-01T00:00:00Z",
            "{outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: api.example.com, port: {number: 443}}}}",
        ));
        let scope = ctx.sidecar_scope(ctx.sidecar_for("a", &BTreeMap::new()), "a");
        assert_eq!(scope.outbound.mode, OutboundTrafficPolicy::AllowAny);
        assert_eq!(
            scope
                .outbound
                .egress_proxy
                .as_ref()
                .map(|d| d.host.as_str()),
            Some("api.example.com")
        );
    }

    #[test]
    fn an_ingress_listener_pool_beats_the_sidecar_inbound_pool() {
        let spec: SidecarSpec = serde_json::from_value(serde_json::json!({
            "inboundConnectionPool": {"tcp": {"maxConnections": 10}},
            "ingress": [
                {"port": {"number": 8080, "protocol": "HTTP", "name": "a"}},
                {"port": {"number": 8080, "protocol": "HTTP", "name": "b"},
                 "connectionPool": {"tcp": {"maxConnections": 20}}},
                {"port": {"number": 9090, "protocol": "HTTP", "name": "c"},
                 "connectionPool": {"tcp": {"maxConnections": 30}}}
            ]
        }))
        .unwrap();
        let max = |port| {
            inbound_connection_pool(&spec, port)
                .and_then(|p| p.tcp.as_ref())
                .and_then(|t| t.max_connections)
        };
        assert_eq!(
            max(8080),
            Some(20),
            "the first listener of the port that sets a pool, even after one that does not"
        );
        assert_eq!(max(9090), Some(30));
        assert_eq!(
            max(7070),
            Some(10),
            "a port no listener sets (or a Service port) takes inboundConnectionPool"
        );
        let bare = SidecarSpec::default();
        assert!(
            inbound_connection_pool(&bare, 8080).is_none(),
            "default pool"
        );
    }

    #[test]
    fn a_port_is_routed_by_the_virtual_services_of_the_listener_that_claims_it() {
        let extra = [
            "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: api-a, namespace: team-a}\nspec: {hosts: [telemetry.istio-system.svc.cluster.local], http: [{route: [{destination: {host: telemetry.istio-system.svc.cluster.local}}]}]}\n",
            "---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: api-b, namespace: team-b}\nspec: {hosts: [telemetry.istio-system.svc.cluster.local], http: [{route: [{destination: {host: telemetry.istio-system.svc.cluster.local}}]}]}\n",
            &sidecar(
                "a",
                "default",
                "2024-01-01T00:00:00Z",
                "{egress: [{port: {number: 80, protocol: HTTP, name: http}, hosts: [\"istio-system/*\", \"team-a/*\"]}, {port: {number: 0, protocol: HTTP, name: uds}, bind: \"unix:///var/run/a.sock\", hosts: [\"b/*\"]}, {captureMode: NONE, hosts: [\"istio-system/*\", \"team-b/*\", \"./*\"]}]}",
            ),
        ]
        .concat();
        let ctx = context(&extra);
        let scope = ctx.sidecar_scope(ctx.sidecar_for("a", &BTreeMap::new()), "a");
        let routing = |port: u32| {
            let listener = scope.listener_for_port(port);
            scope
                .virtual_service_of(&ctx, listener, "telemetry.istio-system.svc.cluster.local")
                .map(|vs| vs.meta.name.clone())
        };
        assert_eq!(
            routing(80).as_deref(),
            Some("api-a"),
            "the listener on port 80 beats the catch-all"
        );
        assert_eq!(
            routing(8080).as_deref(),
            Some("api-b"),
            "any other port: the catch-all's"
        );
        let all: Vec<String> = scope
            .virtual_services(&ctx)
            .iter()
            .map(|vs| vs.meta.name.clone())
            .collect();
        assert!(
            all.contains(&"api-a".to_string()) && all.contains(&"api-b".to_string()),
            "the scope as a whole imports both: {all:?}"
        );
        let port_80 = scope.listener_for_port(80).unwrap();
        assert!(port_80.imports_service("telemetry.istio-system.svc.cluster.local"));
        assert!(
            !port_80.imports_service("web.a.svc.cluster.local"),
            "a listener's services are its own hosts' only"
        );
        let catch_all = scope.listener_for_port(8080).unwrap();
        assert!(catch_all.port.is_none() && catch_all.capture_none && catch_all.binds());
        assert!(catch_all.imports_service("web.a.svc.cluster.local"));
        let socket = scope.listener_for_unix("unix:///var/run/a.sock").unwrap();
        assert!(socket.is_unix() && socket.binds() && socket.has_own_address());
        assert!(
            scope.listener_for_port(0).is_some_and(|l| l.port.is_none()),
            "a Unix socket listener claims no IP port"
        );
        let names = |l: Option<&EgressScope>| -> Vec<String> {
            scope
                .virtual_services_of(&ctx, l)
                .iter()
                .map(|vs| format!("{}/{}", vs.meta.namespace, vs.meta.name))
                .collect()
        };
        assert_eq!(names(Some(socket)), ["b/api"], "b's only");
        assert_eq!(names(scope.listener_for_port(80)), ["team-a/api-a"]);
        assert!(
            std::ptr::eq(
                scope
                    .listener_for_service("web.a.svc.cluster.local", 80)
                    .unwrap(),
                catch_all
            ),
            "a service the port's listener does not import is the catch-all's there"
        );
        assert!(
            scope
                .listener_for_service("telemetry.istio-system.svc.cluster.local", 80)
                .is_some_and(|l| l.port == Some(80))
        );
        let unscoped = ctx.sidecar_scope(None, "a");
        assert!(unscoped.listener_for_port(80).is_none());
        assert!(
            unscoped
                .virtual_service_of(&ctx, None, "telemetry.istio-system.svc.cluster.local")
                .is_some(),
            "without a Sidecar every visible VirtualService routes"
        );
    }

    #[test]
    fn virtual_service_destinations_are_clusters_not_listener_services() {
        let ctx = context(&sidecar(
            "a",
            "default",
            "2024-01-01T00:00:00Z",
            "{egress: [{hosts: [\"b/api.b.svc.cluster.local\"]}]}",
        ));
        let scope = ctx.sidecar_scope(ctx.sidecar_for("a", &BTreeMap::new()), "a");
        assert_eq!(
            seen(&ctx, "a", &[]),
            ["api.b.svc.cluster.local:80", "db.b.svc.cluster.local:5432"],
            "the scope's services (CDS) include api's VirtualService destination"
        );
        let listener = &scope.egress_listeners()[0];
        assert!(listener.imports_service("api.b.svc.cluster.local"));
        assert!(
            !listener.imports_service("db.b.svc.cluster.local"),
            "Istio's IstioEgressListenerWrapper.services are the hosts' services only"
        );
    }

    #[test]
    fn subset_of_follows_istio() {
        assert!(subset_of("a.example.com", "*.example.com"));
        assert!(subset_of("*.a.example.com", "*.example.com"));
        assert!(!subset_of("*.example.com", "a.example.com"));
        assert!(!subset_of("example.com", "*.example.com"));
        assert!(subset_of("anything", "*"));
        assert!(subset_of("*.example.com", "*.example.com"));
    }

    #[test]
    fn virtual_service_hosts_match_either_way() {
        let hosts = parse_hosts(&["ns/a.example.com".to_string()], "ns");
        let ns = &hosts["ns"];
        assert!(ns.matches_virtual_service("*.example.com"));
        assert!(!ns.matches_service("*.example.com"));
        assert!(ns.matches_service("a.example.com"));
    }
}
