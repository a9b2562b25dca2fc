//! The consistency audit of a whole snapshot, go-control-plane's `Consistent()` for ours:
//! [`check_snapshot`] generates a representative view (a sidecar per namespace, with and
//! without a workload, and a proxyless client) and reports every broken reference —
//! every cluster a route or listener names is in CDS, every route configuration a
//! listener asks RDS for exists and every one exists because a listener asks for it
//! (a sidecar has one per service with listeners of its own), every EDS cluster gets a
//! ClusterLoadAssignment, no name appears twice in a response, no two listeners claim
//! one address (Envoy hands a connection to the listener of its exact address), and no
//! route configuration lists a domain or a virtual host name twice (Envoy rejects it).
//! The generators never emit one (the sanitizers replace it before
//! sending), so a finding is a bug: logged at error level and counted in
//! `pilotfish_xds_inconsistent_references_total`. The feed runs it after each hand-off.

use std::collections::{BTreeSet, HashSet};
use std::fmt;

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
use super::snapshot::{GeneratedSnapshot, report};
use crate::ads::XdsType;

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

/// Every broken reference of one view. `external_clusters` are clusters the proxy has
/// from elsewhere (none today: the sidecar bootstrap's `sds-grpc` is only named by SDS
/// configs, which are not checked here).
pub fn check_view(view_name: &str, view: &View) -> Vec<BrokenReference> {
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
        view.clusters.iter().map(|c| &c.name).collect(),
        &mut out,
    );
    duplicates(
        "eds",
        view.endpoints.iter().map(|c| &c.cluster_name).collect(),
        &mut out,
    );
    duplicates(
        "lds",
        view.listeners.iter().map(|l| &l.name).collect(),
        &mut out,
    );
    duplicates(
        "rds",
        view.routes.iter().map(|r| &r.name).collect(),
        &mut out,
    );

    let clusters: BTreeSet<&str> = view.clusters.iter().map(|c| c.name.as_str()).collect();
    let assignments: BTreeSet<&str> = view
        .endpoints
        .iter()
        .map(|c| c.cluster_name.as_str())
        .collect();
    let routes: BTreeSet<&str> = view.routes.iter().map(|r| r.name.as_str()).collect();
    for c in &view.clusters {
        if c.cluster_discovery_type == Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)) {
            let service = c
                .eds_cluster_config
                .as_ref()
                .map(|e| e.service_name.as_str())
                .filter(|s| !s.is_empty())
                .unwrap_or(&c.name);
            if !assignments.contains(service) {
                out.push(broken(
                    &c.name,
                    service,
                    "EDS cluster without a ClusterLoadAssignment",
                ));
            }
        }
    }
    for rc in &view.routes {
        for (from, cluster) in route_clusters(rc) {
            if !clusters.contains(cluster.as_str()) {
                out.push(broken(
                    &from,
                    &cluster,
                    "route names a cluster CDS does not send",
                ));
            }
        }
    }
    let mut addresses = HashSet::new();
    let mut asked_for = HashSet::new();
    for l in &view.listeners {
        if let Some(at) = listener_address(l)
            && !addresses.insert(at.clone())
        {
            out.push(broken(
                &l.name,
                &at,
                "another listener has the same address",
            ));
        }
        let (cs, rds) = listener_references(l);
        asked_for.extend(rds.iter().cloned());
        for c in cs {
            if !clusters.contains(c.as_str()) {
                out.push(broken(
                    &l.name,
                    &c,
                    "listener names a cluster CDS does not send",
                ));
            }
        }
        for r in rds {
            if !routes.contains(r.as_str()) {
                out.push(broken(
                    &l.name,
                    &r,
                    "listener asks RDS for a route configuration that does not exist",
                ));
            }
        }
    }
    for rc in &view.routes {
        if !asked_for.contains(&rc.name) {
            out.push(broken(
                "rds",
                &rc.name,
                "route configuration no listener asks for",
            ));
        }
        let mut domains = HashSet::new();
        let mut vhosts = HashSet::new();
        for vh in &rc.virtual_hosts {
            if !vhosts.insert(&vh.name) {
                out.push(broken(
                    &rc.name,
                    &vh.name,
                    "virtual host name appears twice in one route configuration",
                ));
            }
            for d in &vh.domains {
                if !domains.insert(d) {
                    out.push(broken(
                        &format!("{}/{}", rc.name, vh.name),
                        d,
                        "domain appears twice in one route configuration",
                    ));
                }
            }
        }
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

/// Checks a snapshot's representative views; every finding is logged and counted.
pub fn check_snapshot(snapshot: &GeneratedSnapshot) -> Vec<BrokenReference> {
    let mut out = Vec::new();
    for (name, proxy) in representative_proxies(snapshot) {
        out.extend(check_view(&name, &view_of(snapshot, &proxy)));
    }
    let findings: Vec<Finding> = out
        .iter()
        .map(|b| Finding::InconsistentReference {
            reference: b.to_string(),
            kind: "snapshot",
        })
        .collect();
    report(&findings);
    out
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
