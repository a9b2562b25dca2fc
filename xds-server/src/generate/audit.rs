//! The consistency audit of a snapshot, go-control-plane's `Consistent()` for ours: it
//! checks whole views of proxies and reports every broken reference — every cluster a
//! route or listener names is in CDS, every route configuration a listener asks RDS for
//! exists and every one exists because a listener asks for it (a sidecar has one per
//! service with listeners of its own), every EDS cluster gets a ClusterLoadAssignment, no
//! name appears twice in a response, no two listeners claim one address (Envoy hands a
//! connection to the listener of its exact address), no route configuration lists a
//! domain or a virtual host name twice (Envoy rejects it), and no cluster's TLS matches
//! subject alt names without a CA to verify the chain with (Envoy rejects that too).
//! The generators never emit one (the sanitizers replace it before sending), so a finding
//! is a bug: logged at error level and counted in
//! `pilotfish_xds_inconsistent_references_total`.
//!
//! Two ways in:
//! - [`check_snapshot`] (tests, tools) generates and checks representative views: per
//!   namespace a sidecar with and without a workload and a proxyless client;
//! - an [`Auditor`] (the replica's audit thread, after each hand-off) checks what the
//!   engine served: one proxy of every scope its streams asked parts for, from the parts
//!   the snapshot cached for them, generating nothing. Generating views no client uses
//!   (a proxyless client in every namespace, say) was most of the audit's cost at 1,000
//!   services. It also reads a few facts of each resource (names, references, addresses,
//!   duplicate domains), which are a function of its content, so it decodes a resource
//!   only when its content (version) was not in the snapshot it checked before — after a
//!   VirtualService edit, the few new route configurations — and runs the
//!   cross-reference checks on every view from those facts.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster, cluster::ClusterDiscoveryType, cluster::DiscoveryType,
};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use pilotfish_mesh::model::{Proxy, ProxyGenerator};
use prost::Message;

use super::findings::Finding;
use super::sanitize::{listener_address, listener_references, route_clusters};
use super::scope::Scope;
use super::snapshot::{GeneratedSnapshot, ResourceMap};
use super::tls::matches_sans_without_a_ca;
use crate::ads::{Resource, XdsSnapshot, XdsType};

/// One reference that does not resolve.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BrokenReference {
    /// The view it was found in (`sidecar default`, `proxyless`…).
    pub view: String,
    /// The referring resource.
    pub from: String,
    /// What it names that does not exist (or exists twice).
    pub to: String,
    pub problem: &'static str,
}

impl fmt::Display for BrokenReference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "[{}] {} -> {}: {}",
            self.view, self.from, self.to, self.problem
        )
    }
}

/// Decoded resources of one proxy's view.
#[derive(Debug, Default)]
pub struct View {
    pub clusters: Vec<Cluster>,
    pub endpoints: Vec<ClusterLoadAssignment>,
    pub listeners: Vec<Listener>,
    pub routes: Vec<RouteConfiguration>,
}

/// What the audit reads of one resource: extracted from its decoded content once per
/// distinct content (an [`Auditor`] keeps them by content version), so checking a view
/// decodes only what is new.
#[derive(Debug, Default)]
struct Facts {
    /// A cluster's ClusterLoadAssignment name, when it is an EDS cluster.
    eds_service: Option<String>,
    /// A listener's address.
    address: Option<String>,
    /// Clusters named: (by what, cluster).
    clusters: Vec<(String, String)>,
    /// Route configurations a listener asks RDS for.
    rds: Vec<String>,
    /// Problems within the resource alone: (from, to, problem).
    own: Vec<(String, String, &'static str)>,
}

fn cluster_facts(c: &Cluster) -> Facts {
    let mut facts = Facts::default();
    if c.cluster_discovery_type == Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)) {
        let service = c
            .eds_cluster_config
            .as_ref()
            .map(|e| e.service_name.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or(&c.name);
        facts.eds_service = Some(service.to_string());
    }
    if c.transport_socket
        .as_ref()
        .is_some_and(matches_sans_without_a_ca)
    {
        facts.own.push((
            c.name.clone(),
            "transport_socket".to_string(),
            "TLS matches subject alt names without a trusted CA",
        ));
    }
    facts
}

fn listener_facts(l: &Listener) -> Facts {
    let (clusters, rds) = listener_references(l);
    Facts {
        address: listener_address(l),
        clusters: clusters.into_iter().map(|c| (l.name.clone(), c)).collect(),
        rds,
        ..Facts::default()
    }
}

fn route_facts(rc: &RouteConfiguration) -> Facts {
    let mut own = Vec::new();
    let mut domains = HashSet::new();
    let mut vhosts = HashSet::new();
    for vh in &rc.virtual_hosts {
        if !vhosts.insert(&vh.name) {
            own.push((
                rc.name.clone(),
                vh.name.clone(),
                "virtual host name appears twice in one route configuration",
            ));
        }
        for d in &vh.domains {
            if !domains.insert(d) {
                own.push((
                    format!("{}/{}", rc.name, vh.name),
                    d.clone(),
                    "domain appears twice in one route configuration",
                ));
            }
        }
    }
    Facts {
        clusters: route_clusters(rc),
        own,
        ..Facts::default()
    }
}

/// One view as the checks see it: per type, each resource's name and facts (`None`: the
/// body does not decode, which the old decoding audit skipped too).
#[derive(Default)]
struct ViewFacts {
    clusters: Vec<(String, Option<Arc<Facts>>)>,
    endpoints: Vec<String>,
    listeners: Vec<(String, Option<Arc<Facts>>)>,
    routes: Vec<(String, Option<Arc<Facts>>)>,
}

/// Every broken reference of one view. `external_clusters` are clusters the proxy has
/// from elsewhere (none today: the sidecar bootstrap's `sds-grpc` is only named by SDS
/// configs, which are not checked here).
pub fn check_view(view_name: &str, view: &View) -> Vec<BrokenReference> {
    let named = |name: &String, facts: Facts| (name.clone(), Some(Arc::new(facts)));
    let facts = ViewFacts {
        clusters: view
            .clusters
            .iter()
            .map(|c| named(&c.name, cluster_facts(c)))
            .collect(),
        endpoints: view
            .endpoints
            .iter()
            .map(|c| c.cluster_name.clone())
            .collect(),
        listeners: view
            .listeners
            .iter()
            .map(|l| named(&l.name, listener_facts(l)))
            .collect(),
        routes: view
            .routes
            .iter()
            .map(|r| named(&r.name, route_facts(r)))
            .collect(),
    };
    check_facts(view_name, &facts)
}

fn check_facts(view_name: &str, view: &ViewFacts) -> Vec<BrokenReference> {
    let mut out = Vec::new();
    let broken = |from: &str, to: &str, problem: &'static str| BrokenReference {
        view: view_name.to_string(),
        from: from.to_string(),
        to: to.to_string(),
        problem,
    };
    let duplicates = |kind: &'static str, names: Vec<&String>, out: &mut Vec<BrokenReference>| {
        let mut seen = HashSet::new();
        for n in names {
            if !seen.insert(n) {
                out.push(broken(kind, n, "name appears twice in one response"));
            }
        }
    };
    duplicates(
        "cds",
        view.clusters.iter().map(|c| &c.0).collect(),
        &mut out,
    );
    duplicates("eds", view.endpoints.iter().collect(), &mut out);
    duplicates(
        "lds",
        view.listeners.iter().map(|l| &l.0).collect(),
        &mut out,
    );
    duplicates("rds", view.routes.iter().map(|r| &r.0).collect(), &mut out);

    let decoded = |list: &[(String, Option<Arc<Facts>>)]| -> Vec<(String, Arc<Facts>)> {
        list.iter()
            .filter_map(|(n, f)| f.clone().map(|f| (n.clone(), f)))
            .collect()
    };
    let (clusters_f, listeners_f, routes_f) = (
        decoded(&view.clusters),
        decoded(&view.listeners),
        decoded(&view.routes),
    );
    let clusters: BTreeSet<&str> = clusters_f.iter().map(|c| c.0.as_str()).collect();
    let assignments: BTreeSet<&str> = view.endpoints.iter().map(String::as_str).collect();
    let routes: BTreeSet<&str> = routes_f.iter().map(|r| r.0.as_str()).collect();
    let own = |facts: &Facts, out: &mut Vec<BrokenReference>| {
        for (from, to, problem) in &facts.own {
            out.push(broken(from, to, problem));
        }
    };
    for (name, facts) in &clusters_f {
        if let Some(service) = &facts.eds_service
            && !assignments.contains(service.as_str())
        {
            out.push(broken(
                name,
                service,
                "EDS cluster without a ClusterLoadAssignment",
            ));
        }
        own(facts, &mut out);
    }
    for (_, facts) in &routes_f {
        for (from, cluster) in &facts.clusters {
            if !clusters.contains(cluster.as_str()) {
                out.push(broken(
                    from,
                    cluster,
                    "route names a cluster CDS does not send",
                ));
            }
        }
    }
    let mut addresses = HashSet::new();
    let mut asked_for = HashSet::new();
    for (name, facts) in &listeners_f {
        if let Some(at) = &facts.address
            && !addresses.insert(at.clone())
        {
            out.push(broken(name, at, "another listener has the same address"));
        }
        asked_for.extend(facts.rds.iter().cloned());
        for (_, c) in &facts.clusters {
            if !clusters.contains(c.as_str()) {
                out.push(broken(
                    name,
                    c,
                    "listener names a cluster CDS does not send",
                ));
            }
        }
        for r in &facts.rds {
            if !routes.contains(r.as_str()) {
                out.push(broken(
                    name,
                    r,
                    "listener asks RDS for a route configuration that does not exist",
                ));
            }
        }
    }
    for (name, facts) in &routes_f {
        if !asked_for.contains(name) {
            out.push(broken(
                "rds",
                name,
                "route configuration no listener asks for",
            ));
        }
        own(facts, &mut out);
    }
    out
}

/// Decodes a proxy's whole view from the snapshot.
pub fn view_of(snapshot: &GeneratedSnapshot, proxy: &Proxy) -> View {
    fn decode_all<M: Message + Default>(
        snapshot: &GeneratedSnapshot,
        proxy: &Proxy,
        kind: XdsType,
    ) -> Vec<M> {
        snapshot
            .all(proxy, kind)
            .values()
            .filter_map(|r| M::decode(r.body.value.as_slice()).ok())
            .collect()
    }
    View {
        clusters: decode_all(snapshot, proxy, XdsType::Cluster),
        endpoints: decode_all(snapshot, proxy, XdsType::Endpoint),
        listeners: decode_all(snapshot, proxy, XdsType::Listener),
        routes: decode_all(snapshot, proxy, XdsType::Route),
    }
}

/// Representative proxies of a snapshot: per namespace that has services (and the root
/// namespace), a sidecar without a workload and one shaped like the first service's
/// workload, plus a proxyless client.
pub fn representative_proxies(snapshot: &GeneratedSnapshot) -> Vec<(String, Proxy)> {
    let push = snapshot.push_context();
    let mut namespaces: BTreeSet<String> = push
        .services()
        .iter()
        .map(|s| s.namespace.clone())
        .collect();
    namespaces.insert(push.mesh().root_namespace.clone());
    let mut out = Vec::new();
    for ns in namespaces {
        let base = Proxy {
            namespace: ns.clone(),
            ..Proxy::with_defaults(format!("sidecar~0.0.0.0~check.{ns}~{ns}.svc.cluster.local"))
        };
        if let Some(workload) = push
            .services()
            .iter()
            .find(|s| s.namespace == ns && !s.selector.is_empty())
        {
            out.push((
                format!("sidecar {ns} {}", workload.name),
                Proxy {
                    labels: workload.selector.clone(),
                    ..base.clone()
                },
            ));
        }
        out.push((
            format!("proxyless {ns}"),
            Proxy {
                generator: ProxyGenerator::Grpc,
                ..base.clone()
            },
        ));
        out.push((format!("sidecar {ns}"), base));
    }
    out
}

/// Checks a snapshot's representative views, every resource decoded (generating what they
/// need); every finding is logged and counted.
pub fn check_snapshot(snapshot: &GeneratedSnapshot) -> Vec<BrokenReference> {
    Auditor::default().check_views(snapshot, representative_proxies(snapshot), |p, kind| {
        Some(snapshot.parts(p, kind))
    })
}

/// The audit of a sequence of snapshots as the engine serves them: checks, in each, one
/// proxy of every scope the streams asked parts for (the snapshot's served proxies), from
/// the parts cached for them — never generating one; a scope whose parts were not all
/// generated (a stream that has not asked for every type yet) or were dropped from the
/// cache is left out. It decodes only the resources whose content it has not seen in the
/// previous snapshot it checked (the facts a check reads of a resource are a function of
/// its content, which its version hashes), and keeps the facts of the last snapshot only,
/// so it holds at most one snapshot's distinct content's facts.
#[derive(Debug, Default)]
pub struct Auditor {
    facts: HashMap<String, Option<Arc<Facts>>>,
    decoded: u64,
}

impl Auditor {
    /// Resources decoded so far (new content).
    pub fn decoded(&self) -> u64 {
        self.decoded
    }

    /// Distinct contents whose facts are kept (those of the last snapshot checked).
    pub fn remembered(&self) -> usize {
        self.facts.len()
    }

    /// Checks the views `snapshot` served; every finding is logged and counted.
    pub fn check(&mut self, snapshot: &GeneratedSnapshot) -> Vec<BrokenReference> {
        // Each scope as its streams had it, with the proxy that asked first.
        let mut served: Vec<(String, (Proxy, Arc<Scope>))> = snapshot
            .served()
            .into_iter()
            .map(|(scope, p)| (served_view_name(&p), (p, scope)))
            .collect();
        served.sort_by(|a, b| a.0.cmp(&b.0));
        self.check_views(snapshot, served, |(p, scope), kind| {
            snapshot.parts_if_cached(p, scope, kind)
        })
    }

    /// Checks the views of `clients` (a proxy, or a proxy with its scope) made of the parts
    /// `parts_of` gives (a client whose parts it does not give is skipped).
    fn check_views<C>(
        &mut self,
        snapshot: &GeneratedSnapshot,
        clients: Vec<(String, C)>,
        parts_of: impl Fn(&C, XdsType) -> Option<Vec<Arc<ResourceMap>>>,
    ) -> Vec<BrokenReference> {
        let mut seen: HashMap<String, Option<Arc<Facts>>> = HashMap::new();
        let mut out = Vec::new();
        for (name, client) in clients {
            let Some(parts) = XdsType::ALL
                .iter()
                .map(|kind| parts_of(&client, *kind))
                .collect::<Option<Vec<_>>>()
            else {
                continue;
            };
            // Every resource of a type, part by part (a name in two parts is listed
            // twice: the duplicate check reports it).
            let resources = |kind: XdsType| {
                parts[kind.index()]
                    .iter()
                    .flat_map(|part| part.values().cloned())
                    .collect::<Vec<Arc<Resource>>>()
            };
            let mut facts = |r: &Resource, of: fn(&[u8]) -> Option<Facts>| {
                if let Some(f) = seen.get(&r.version) {
                    return f.clone();
                }
                let f = match self.facts.remove(&r.version) {
                    Some(f) => f,
                    None => {
                        self.decoded += 1;
                        of(r.body.value.as_slice()).map(Arc::new)
                    }
                };
                seen.insert(r.version.clone(), f.clone());
                f
            };
            let mut view = ViewFacts::default();
            for r in resources(XdsType::Cluster) {
                let f = facts(&r, |b| Cluster::decode(b).ok().map(|c| cluster_facts(&c)));
                view.clusters.push((r.name.clone(), f));
            }
            for r in resources(XdsType::Endpoint) {
                // Only the name is read: nothing to decode, as before (an undecodable
                // assignment did not count, and generated ones always decode).
                view.endpoints.push(r.name.clone());
            }
            for r in resources(XdsType::Listener) {
                let f = facts(&r, |b| Listener::decode(b).ok().map(|l| listener_facts(&l)));
                view.listeners.push((r.name.clone(), f));
            }
            for r in resources(XdsType::Route) {
                let f = facts(&r, |b| {
                    RouteConfiguration::decode(b)
                        .ok()
                        .map(|rc| route_facts(&rc))
                });
                view.routes.push((r.name.clone(), f));
            }
            out.extend(check_facts(&name, &view));
        }
        self.facts = seen;
        let findings: Vec<Finding> = out
            .iter()
            .map(|b| Finding::InconsistentReference {
                reference: b.to_string(),
                kind: "snapshot",
            })
            .collect();
        snapshot.report(&findings);
        out
    }
}

/// How a served proxy's view is named in findings: its flavour, namespace and node id.
fn served_view_name(proxy: &Proxy) -> String {
    let flavor = match proxy.generator {
        ProxyGenerator::Envoy => "sidecar",
        ProxyGenerator::Grpc => "proxyless",
    };
    format!("{flavor} {} (as {})", proxy.namespace, proxy.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::route::v3::{
        Route, RouteAction, VirtualHost, route::Action, route_action::ClusterSpecifier,
    };

    fn rc(cluster: &str) -> RouteConfiguration {
        RouteConfiguration {
            name: "80".into(),
            virtual_hosts: vec![VirtualHost {
                name: "a:80".into(),
                domains: vec!["a".into()],
                routes: vec![Route {
                    name: "r".into(),
                    action: Some(Action::Route(RouteAction {
                        cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.into())),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn check_finds_dangling_routes_and_missing_assignments() {
        let view = View {
            clusters: vec![Cluster {
                name: "outbound|80||a".into(),
                cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
                ..Default::default()
            }],
            routes: vec![rc("outbound|80||missing"), rc("outbound|80||a")],
            ..Default::default()
        };
        let found = check_view("t", &view);
        let problems: Vec<&str> = found.iter().map(|b| b.problem).collect();
        assert!(
            problems.contains(&"EDS cluster without a ClusterLoadAssignment"),
            "{found:?}"
        );
        assert!(
            problems.contains(&"route names a cluster CDS does not send"),
            "{found:?}"
        );
        assert!(
            problems.contains(&"name appears twice in one response"),
            "{found:?}"
        );
    }

    #[test]
    fn check_finds_shared_addresses_unasked_routes_and_repeated_domains() {
        use crate::generate::eds::socket_address;
        let listener = |name: &str| Listener {
            name: name.into(),
            address: Some(socket_address("10.0.0.1", 80)),
            ..Default::default()
        };
        let mut repeated = rc("outbound|80||a");
        repeated.name = "a:80".into();
        let mut twice = repeated.virtual_hosts[0].clone();
        twice.name = "b:80".into();
        repeated.virtual_hosts.push(twice);
        let view = View {
            clusters: vec![Cluster {
                name: "outbound|80||a".into(),
                ..Default::default()
            }],
            listeners: vec![listener("10.0.0.1_80"), listener("other")],
            routes: vec![repeated],
            ..Default::default()
        };
        let found = check_view("t", &view);
        let problems: BTreeSet<&str> = found.iter().map(|b| b.problem).collect();
        assert_eq!(
            problems,
            [
                "another listener has the same address",
                "route configuration no listener asks for",
                "domain appears twice in one route configuration",
            ]
            .into(),
            "{found:?}"
        );
    }
}
