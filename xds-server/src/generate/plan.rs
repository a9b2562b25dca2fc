//! The outbound plan of a scope: every outbound cluster a proxy gets — one per visible
//! service port and per DestinationRule subset — with the service, port, subset labels,
//! merged traffic policy and how the proxy discovers its endpoints. CDS, EDS, LDS and RDS
//! are all derived from one plan, so a route can only name a cluster that CDS sends and
//! every EDS cluster gets its ClusterLoadAssignment.
//!
//! [`outbound_ports`] then decides, once for LDS and RDS, how a sidecar reaches each
//! whole-service cluster of a port: by its own listener per virtual IP (`<ip>_<port>`,
//! Kubernetes ClusterIP services), or through the port's shared `0.0.0.0_<port>`
//! listener (everything else: routed by Host for HTTP, by address or as the port's
//! default for TCP).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock};

use pilotfish_mesh::api::{Labels, SimpleLb};
use pilotfish_mesh::model::{Protocol, Proxy, Resolution, Service, ServiceOrigin, ServicePort};
use pilotfish_mesh::push_context::sidecar::{EgressScope, SidecarScope};
use pilotfish_mesh::push_context::{EffectiveDestinationRule, PushContext};

use crate::ads::WeakTable;

use super::findings::{Downgrade, Finding};
use super::names;
use super::policy::{ClusterPolicy, cluster_policy};
use super::scope::Flavor;

/// How a cluster's endpoints are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// Endpoints come by EDS (a ClusterLoadAssignment named like the cluster).
    Eds,
    /// The proxy resolves host names by DNS, using every address (`STRICT_DNS`).
    StrictDns,
    /// The proxy resolves one host name and connects to one address at a time (`LOGICAL_DNS`).
    LogicalDns,
    /// Traffic goes to the address the client dialled (`ORIGINAL_DST`).
    OriginalDst,
}

/// One outbound cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterPlan {
    pub name: String,
    pub service: Arc<Service>,
    pub port: ServicePort,
    /// Subset name; empty for the whole service.
    pub subset: String,
    /// Labels the subset selects endpoints by (empty for the whole service).
    pub subset_labels: Labels,
    /// Shared: most clusters (every one without a DestinationRule) have the default, and a
    /// plan of a thousand services is sorted and scanned per scope on every change.
    pub policy: Arc<ClusterPolicy>,
    pub discovery: Discovery,
}

/// Every outbound cluster of one scope, sorted by name, and the sidecar scope (Sidecar
/// imports and outbound policy) every planned part reads.
#[derive(Debug, Default)]
pub struct OutboundPlan {
    /// Per namespace (VirtualServices are looked up through it).
    pub sidecar: Arc<SidecarScope>,
    /// What the sidecar scope decided, shared by every plan that came out the same
    /// ([`PLANNED_CLUSTERS`]): without Sidecars and `exportTo` restrictions, the plans of all
    /// namespaces (a snapshot keeps one plan per scope, about 1 MB each at 1,000 services).
    planned: Arc<PlannedClusters>,
}

/// The clusters of a plan and what is derived from them alone.
#[derive(Debug, Default, PartialEq)]
struct PlannedClusters {
    clusters: Vec<ClusterPlan>,
    by_name: HashMap<String, usize>,
    /// Whole-service clusters as the listeners see them where a Sidecar egress listener
    /// with a port names a protocol other than the service port's (Istio builds that
    /// port's listeners for the listener's protocol; the cluster keeps the service's).
    listener_views: HashMap<String, ClusterPlan>,
    /// [`outbound_ports`], decided once per plan (LDS, RDS and the reuse of a previous
    /// snapshot's resources all read it) as indexes into `clusters`.
    ports: Vec<(u32, PortIndexes)>,
}

/// Every live [`PlannedClusters`], by content.
static PLANNED_CLUSTERS: LazyLock<WeakTable<PlannedClusters>> = LazyLock::new(WeakTable::default);

/// An [`OutboundPort`] as indexes into the plan's clusters.
#[derive(Debug, Default, PartialEq)]
struct PortIndexes {
    own_listeners: Vec<(usize, Vec<String>)>,
    shared: Vec<usize>,
}

impl OutboundPlan {
    /// Every outbound cluster, sorted by name.
    pub fn clusters(&self) -> &[ClusterPlan] {
        &self.planned.clusters
    }

    pub fn get(&self, name: &str) -> Option<&ClusterPlan> {
        self.planned
            .by_name
            .get(name)
            .map(|&i| &self.planned.clusters[i])
    }

    pub fn contains(&self, name: &str) -> bool {
        self.planned.by_name.contains_key(name)
    }

    fn from_clusters(mut clusters: Vec<ClusterPlan>, sidecar: Arc<SidecarScope>) -> OutboundPlan {
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        // A name can only repeat when two subsets share a name, which the builder rejects;
        // keep the first rather than ever sending one name twice.
        clusters.dedup_by(|b, a| a.name == b.name);
        let by_name = clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        let mut listener_views = HashMap::new();
        for c in clusters.iter().filter(|c| c.subset.is_empty()) {
            let protocol = sidecar
                .listener_for_port(c.port.port)
                .filter(|l| {
                    l.port.is_some_and(|p| p != 0)
                        && !l.has_own_address()
                        && l.imports_service(&c.service.hostname)
                })
                .and_then(|l| l.protocol.as_deref())
                .and_then(Protocol::from_istio_name);
            if let Some(protocol) = protocol.filter(|p| *p != c.port.protocol) {
                let mut view = c.clone();
                view.port.protocol = protocol;
                listener_views.insert(c.name.clone(), view);
            }
        }
        let mut planned = PlannedClusters {
            clusters,
            by_name,
            listener_views,
            ports: Vec::new(),
        };
        planned.ports = port_indexes(&planned, &sidecar);
        let mut hasher = DefaultHasher::new();
        for c in &planned.clusters {
            c.name.hash(&mut hasher);
        }
        planned.ports.len().hash(&mut hasher);
        OutboundPlan {
            sidecar,
            planned: PLANNED_CLUSTERS.intern(hasher.finish(), planned, |a, b| a == b),
        }
    }

    /// A whole-service cluster as the outbound listeners and routes see it (see
    /// `listener_views`).
    pub fn listener_view<'a>(&'a self, c: &'a ClusterPlan) -> &'a ClusterPlan {
        self.planned.listener_view(c)
    }
}

impl PlannedClusters {
    fn listener_view<'a>(&'a self, c: &'a ClusterPlan) -> &'a ClusterPlan {
        self.listener_views.get(&c.name).unwrap_or(c)
    }
}

/// The plan for `proxy` (whose scope the result is shared by) under its sidecar scope
/// `sidecar`: the services that scope imports; services a proxyless client cannot use
/// are noted in `findings`.
pub fn outbound_plan(
    push: &PushContext,
    proxy: &Proxy,
    sidecar: Arc<SidecarScope>,
    flavor: Flavor,
    findings: &mut Vec<Finding>,
) -> OutboundPlan {
    let mut clusters = Vec::new();
    let default_policy = Arc::new(ClusterPolicy::default());
    let shared = |policy: ClusterPolicy| {
        if policy == *default_policy {
            default_policy.clone()
        } else {
            Arc::new(policy)
        }
    };
    for service in sidecar.services(push) {
        let rule = push.destination_rule(proxy, &service.hostname, Some(&service.namespace));
        for port in &service.ports {
            // UDP is not proxied by sidecars (Istio skips it too).
            if port.protocol == Protocol::Udp {
                continue;
            }
            let base = cluster_policy(rule.as_ref(), port.port, None);
            let Some(kind) = discovery(service, &base, flavor, findings) else {
                continue;
            };
            clusters.push(ClusterPlan {
                name: names::outbound_cluster(port.port, "", &service.hostname),
                service: service.clone(),
                port: port.clone(),
                subset: String::new(),
                subset_labels: Labels::new(),
                policy: shared(base),
                discovery: kind,
            });
            for subset in rule
                .iter()
                .flat_map(|r: &EffectiveDestinationRule| &r.spec.subsets)
            {
                let policy = cluster_policy(rule.as_ref(), port.port, Some(subset));
                let Some(kind) = discovery(service, &policy, flavor, findings) else {
                    continue;
                };
                clusters.push(ClusterPlan {
                    name: names::outbound_cluster(port.port, &subset.name, &service.hostname),
                    service: service.clone(),
                    port: port.clone(),
                    subset: subset.name.clone(),
                    subset_labels: subset.labels.clone(),
                    policy: shared(policy),
                    discovery: kind,
                });
            }
        }
    }
    OutboundPlan::from_clusters(clusters, sidecar)
}

/// How a sidecar reaches the whole-service clusters of one outbound port.
#[derive(Debug, Default)]
pub struct OutboundPort<'a> {
    /// Services with a listener of their own per virtual IP (`<ip>_<port>`, reached
    /// through `virtualOutbound`'s original-destination hand-off), with those IPs. An HTTP
    /// one gets a route configuration of its own (`<fqdn>:<port>`), so editing its routing
    /// changes nothing else.
    pub own_listeners: Vec<(&'a ClusterPlan, &'a [String])>,
    /// Everything else, reached through the port's `0.0.0.0_<port>` listener: headless
    /// services, ServiceEntries, ExternalName aliases, wildcard hosts. Their HTTP virtual
    /// hosts are in the port's catch-all route configuration (named by the port), which
    /// routes by Host.
    pub shared: Vec<&'a ClusterPlan>,
}

impl OutboundPort<'_> {
    /// Whether any service of the port speaks HTTP (the shared listener then runs an HTTP
    /// connection manager with the catch-all route configuration).
    pub fn has_http(&self) -> bool {
        self.own_listeners
            .iter()
            .map(|(c, _)| *c)
            .chain(self.shared.iter().copied())
            .any(|c| c.port.protocol.is_http())
    }
}

/// The outbound ports of a plan, each with its services sorted by host name. A Kubernetes
/// service with a virtual IP gets its own listener on each of its IPs (dual-stack: two),
/// as Istio gives TCP services; an IP already claimed on the port (two services cannot
/// share one, but a snapshot taken between a delete and a re-create could list both)
/// stays with the first service by host name, and a service left with no IP of its own is
/// shared. ServiceEntry addresses are not used for listeners: clients commonly reach those
/// hosts at addresses DNS gives them, so they are routed by Host, as Istio routes every
/// HTTP service.
///
/// Under a Sidecar, a port carries the services of the egress listener that claims it
/// (Istio's `GetEgressListenerForRDS`: the first listener on that port, else the
/// catch-all), those its hosts import (a VirtualService's destinations get clusters, not
/// listeners); a port whose listener has an address of its own (`bind`, `captureMode:
/// NONE`) is left to [`bound_listeners`].
pub fn outbound_ports(plan: &OutboundPlan) -> BTreeMap<u32, OutboundPort<'_>> {
    plan.planned
        .ports
        .iter()
        .map(|(port, indexes)| {
            let cluster = |i: usize| plan.listener_view(&plan.clusters()[i]);
            let out = OutboundPort {
                own_listeners: indexes
                    .own_listeners
                    .iter()
                    .map(|(i, ips)| (cluster(*i), ips.as_slice()))
                    .collect(),
                shared: indexes.shared.iter().map(|i| cluster(*i)).collect(),
            };
            (*port, out)
        })
        .collect()
}

/// [`outbound_ports`] of a plan being made (its clusters sorted, its listener views set).
fn port_indexes(plan: &PlannedClusters, sidecar: &SidecarScope) -> Vec<(u32, PortIndexes)> {
    // (cluster index, whether it may only have listeners of its own on its virtual IPs)
    let mut by_port: BTreeMap<u32, Vec<(usize, bool)>> = BTreeMap::new();
    for (i, c) in plan.clusters.iter().enumerate() {
        if !c.subset.is_empty() {
            continue;
        }
        let c = plan.listener_view(c);
        let mut vip_only = false;
        if sidecar.is_scoped() {
            let host = &c.service.hostname;
            let port = sidecar.listener_for_port(c.port.port);
            let claimed = port.is_some_and(|l| !l.has_own_address() && l.imports_service(host));
            // Istio's listener map locks the shared `0.0.0.0_<port>` a listener with a
            // port built, but not a virtual IP's: the catch-all's TCP services keep those.
            vip_only = !claimed
                && !c.port.protocol.is_http()
                && port.is_some_and(|l| l.port.is_some())
                && sidecar
                    .catch_all()
                    .is_some_and(|l| !l.has_own_address() && l.imports_service(host));
            if !claimed && !vip_only {
                continue;
            }
        }
        by_port.entry(c.port.port).or_default().push((i, vip_only));
    }
    let host = |i: usize| &plan.clusters[i].service.hostname;
    by_port
        .into_iter()
        .map(|(port, mut services)| {
            services.sort_by(|a, b| host(a.0).cmp(host(b.0)));
            let mut claimed: HashSet<&str> = HashSet::new();
            let mut out = PortIndexes::default();
            for (i, vip_only) in services {
                let ips: Vec<String> = own_listener_ips(&plan.clusters[i].service)
                    .filter(|ip| claimed.insert(ip))
                    .map(str::to_string)
                    .collect();
                if ips.is_empty() {
                    if !vip_only {
                        out.shared.push(i);
                    }
                } else {
                    out.own_listeners.push((i, ips));
                }
            }
            (port, out)
        })
        .collect()
}

/// An outbound listener of a Sidecar egress listener with an address of its own (Istio's
/// `buildSidecarOutboundListeners` with a `bind` or `captureMode: NONE`): one per port the
/// egress listener claims (a Unix domain socket: one for all), carrying every service
/// its hosts import on that port, routed by Host (HTTP) or by address/SNI (TCP).
#[derive(Debug)]
pub struct BoundListener<'a> {
    /// `<address>_<port>` (Istio's `getListenerName`).
    pub name: String,
    /// The `bind` (an IP or `unix://path`), else `127.0.0.1` (Istio's local host).
    pub address: String,
    /// The listener port; 0 on a Unix domain socket.
    pub port: u32,
    /// Whether the listener binds its address (`captureMode: NONE`, a Unix socket); a
    /// `bind` alone is reached through `virtualOutbound`'s hand-off, as Istio.
    pub binds: bool,
    /// The route configuration of its HTTP connection manager: the port (`"<port>"`, as
    /// Istio names it) or, on a Unix socket, the `bind`.
    pub route_name: String,
    /// Its services' whole-service clusters, as the listener sees them: with the egress
    /// listener's protocol when it names one (Istio builds the listener for that
    /// protocol), and TCP ones without their addresses (a listener with its own address
    /// takes every connection, Istio matches no destination range there).
    pub clusters: Vec<ClusterPlan>,
    pub listener: &'a EgressScope,
}

impl BoundListener<'_> {
    /// Its clusters as a port's services, all reached through this one listener.
    pub fn services(&self) -> OutboundPort<'_> {
        OutboundPort {
            own_listeners: Vec::new(),
            shared: self.clusters.iter().collect(),
        }
    }
}

/// The [`BoundListener`]s of a plan, in the Sidecar's listener order (an address and
/// port claimed twice stays with the first, as Istio's listener map keeps it).
pub fn bound_listeners(plan: &OutboundPlan) -> Vec<BoundListener<'_>> {
    let sidecar = &plan.sidecar;
    let mut out: Vec<BoundListener<'_>> = Vec::new();
    let mut seen: HashSet<String> = HashSet::new();
    for l in sidecar.egress_listeners() {
        if !l.has_own_address() {
            continue;
        }
        let address = l.bind.clone().unwrap_or_else(|| "127.0.0.1".to_string());
        let services = |port: Option<u32>| -> Vec<&ClusterPlan> {
            let mut found: Vec<&ClusterPlan> = plan
                .clusters()
                .iter()
                .filter(|c| c.subset.is_empty() && l.imports_service(&c.service.hostname))
                .filter(|c| port.is_none_or(|p| c.port.port == p))
                .collect();
            found.sort_by(|a, b| {
                (&a.service.hostname, a.port.port).cmp(&(&b.service.hostname, b.port.port))
            });
            found
        };
        let mut ports: Vec<(u32, Vec<&ClusterPlan>)> = match l.port {
            Some(0) => vec![(0, services(None))],
            Some(port) => vec![(port, services(Some(port)))],
            None => {
                let mut by_port: BTreeMap<u32, Vec<&ClusterPlan>> = BTreeMap::new();
                for c in services(None) {
                    by_port.entry(c.port.port).or_default().push(c);
                }
                by_port.into_iter().collect()
            }
        };
        ports.retain(|(port, _)| {
            *port == 0
                || sidecar
                    .listener_for_port(*port)
                    .is_some_and(|c| std::ptr::eq(c, l))
        });
        let protocol = l.protocol.as_deref().and_then(Protocol::from_istio_name);
        for (port, shared) in ports {
            let name = format!("{address}_{port}");
            if !seen.insert(name.clone()) {
                continue;
            }
            let clusters = shared
                .into_iter()
                .map(|c| {
                    let mut c = c.clone();
                    if let Some(p) = protocol {
                        c.port.protocol = p;
                    }
                    if !c.port.protocol.is_http() && !c.service.addresses.is_empty() {
                        c.service = Arc::new(Service {
                            addresses: Vec::new(),
                            ..(*c.service).clone()
                        });
                    }
                    c
                })
                .collect();
            out.push(BoundListener {
                name,
                address: address.clone(),
                port,
                binds: l.binds(),
                route_name: if port == 0 {
                    address.clone()
                } else {
                    port.to_string()
                },
                clusters,
                listener: l,
            });
        }
    }
    out
}

/// The addresses a service may get its own listeners on: the IPs (not CIDRs) of a
/// Kubernetes service. Headless and ExternalName services have none.
fn own_listener_ips(service: &Service) -> impl Iterator<Item = &str> {
    let kubernetes = service.origin == ServiceOrigin::Kubernetes;
    service
        .addresses
        .iter()
        .filter(move |_| kubernetes)
        .filter(|a| a.parse::<std::net::IpAddr>().is_ok())
        .map(String::as_str)
}

/// How `service` is discovered; `None` when the flavour cannot use it at all.
fn discovery(
    service: &Service,
    policy: &ClusterPolicy,
    flavor: Flavor,
    findings: &mut Vec<Finding>,
) -> Option<Discovery> {
    let passthrough_lb = policy
        .load_balancer
        .as_ref()
        .and_then(|l| l.simple)
        .is_some_and(|s| s == SimpleLb::Passthrough);
    match flavor {
        Flavor::Sidecar => Some(match service.resolution {
            Resolution::ClientSideLb if passthrough_lb => Discovery::OriginalDst,
            Resolution::ClientSideLb => Discovery::Eds,
            Resolution::Passthrough => Discovery::OriginalDst,
            Resolution::Dns => Discovery::StrictDns,
            Resolution::DnsRoundRobin => Discovery::LogicalDns,
        }),
        // gRPC clients balance over EDS endpoints only; they cannot resolve DNS clusters
        // here nor connect to "the original destination".
        Flavor::Proxyless => match service.resolution {
            Resolution::ClientSideLb | Resolution::Passthrough if !service.is_wildcard() => {
                Some(Discovery::Eds)
            }
            _ => {
                findings.push(Finding::Downgrade(Downgrade::new(
                    "non_eds_cluster",
                    service.hostname.as_str(),
                    "DNS-resolved or wildcard services (no EDS cluster is sent)",
                )));
                None
            }
        },
    }
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
  clusterIPs: [10.96.0.1, 'fd00::1']
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec:
  clusterIP: 10.96.0.2
  ports: [{name: tcp, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: pods, namespace: shop}
spec:
  clusterIP: None
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Service
metadata: {name: alias, namespace: shop}
spec:
  type: ExternalName
  externalName: example.com
  ports: [{name: http, port: 80}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vm, namespace: shop}
spec:
  hosts: [vm.internal]
  addresses: [240.0.0.1]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.2.0.1}]
";

    fn plan(yaml: &str) -> OutboundPlan {
        let parsed = parse_text(std::path::Path::new("t.yaml"), yaml);
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
        let proxy = Proxy {
            namespace: "shop".into(),
            ..Proxy::with_defaults("p")
        };
        let sidecar = Arc::new(built.context.sidecar_scope(None, "shop"));
        outbound_plan(
            &built.context,
            &proxy,
            sidecar,
            Flavor::Sidecar,
            &mut Vec::new(),
        )
    }

    fn layout(plan: &OutboundPlan) -> (Vec<(String, Vec<String>)>, Vec<String>) {
        let ports = outbound_ports(plan);
        let port = &ports[&80];
        (
            port.own_listeners
                .iter()
                .map(|(c, ips)| (c.service.name.clone(), ips.to_vec()))
                .collect(),
            port.shared.iter().map(|c| c.service.name.clone()).collect(),
        )
    }

    #[test]
    fn kubernetes_virtual_ips_get_listeners_everything_else_is_shared() {
        let (own, shared) = layout(&plan(MESH));
        assert_eq!(
            own,
            [
                ("db".to_string(), vec!["10.96.0.2".to_string()]),
                (
                    "web".to_string(),
                    vec!["10.96.0.1".to_string(), "fd00::1".to_string()]
                ),
            ],
            "one listener per IP, dual-stack included; TCP too"
        );
        assert_eq!(shared, ["alias", "pods", "vm"]);
    }

    #[test]
    fn an_address_is_claimed_once() {
        let twin = format!(
            "{MESH}---
apiVersion: v1
kind: Service
metadata: {{name: aaa, namespace: shop}}
spec:
  clusterIP: 10.96.0.1
  ports: [{{name: http, port: 80}}]
"
        );
        let (own, shared) = layout(&plan(&twin));
        assert_eq!(own[0], ("aaa".to_string(), vec!["10.96.0.1".to_string()]));
        assert!(
            own.iter()
                .any(|(name, ips)| name == "web" && ips == &["fd00::1".to_string()]),
            "{own:?}"
        );
        assert!(!shared.contains(&"web".to_string()));
    }
}
