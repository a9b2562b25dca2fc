//! Reference checks over generated resources, go-control-plane's `Consistent()` for our
//! snapshots: every cluster a route or listener names is in CDS, every route
//! configuration a listener asks RDS for exists, every EDS cluster gets a
//! ClusterLoadAssignment, and no name appears twice.
//!
//! Two uses: [`sanitize_routes`] and [`sanitize_listeners`] run on every generated part
//! and replace a broken reference before it can be sent (a route answers 503, a TCP
//! chain goes to `BlackHoleCluster`); [`check_snapshot`] generates a representative view
//! of a whole snapshot (a sidecar per namespace, with and without a workload, and a
//! proxyless client) and reports every broken reference. Either finding is a bug: it is
//! logged at error level and counted in `pilotfish_xds_inconsistent_references_total`.

use std::collections::{BTreeSet, HashSet};
use std::fmt;

use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster, cluster::ClusterDiscoveryType, cluster::DiscoveryType,
};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, RouteConfiguration, route::Action, route_action::ClusterSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use pilotfish_mesh::model::{Proxy, ProxyGenerator};
use prost::Message;

use super::lds::{HCM_FILTER, TCP_PROXY_FILTER};
use super::metrics::INCONSISTENT_REFERENCES;
use super::names;
use super::snapshot::GeneratedSnapshot;
use super::util::any;
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

/// Clusters a route configuration names (routes, weighted clusters, mirrors).
pub fn route_clusters(rc: &RouteConfiguration) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for vh in &rc.virtual_hosts {
        for r in &vh.routes {
            if let Some(Action::Route(a)) = &r.action {
                let from = format!("{}/{}/{}", rc.name, vh.name, r.name);
                match &a.cluster_specifier {
                    Some(ClusterSpecifier::Cluster(c)) => out.push((from.clone(), c.clone())),
                    Some(ClusterSpecifier::WeightedClusters(w)) => {
                        out.extend(w.clusters.iter().map(|c| (from.clone(), c.name.clone())))
                    }
                    _ => {}
                }
                out.extend(
                    a.request_mirror_policies
                        .iter()
                        .map(|m| (from.clone(), m.cluster.clone())),
                );
            }
        }
    }
    out
}

fn decode_filter<M: Message + Default>(f: &Filter) -> Option<M> {
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(a)) => M::decode(a.value.as_slice()).ok(),
        _ => None,
    }
}

/// What a listener refers to: clusters (tcp_proxy, inline routes) and RDS names.
fn listener_references(l: &Listener) -> (Vec<String>, Vec<String>) {
    let mut clusters = Vec::new();
    let mut rds = Vec::new();
    let mut hcms: Vec<HttpConnectionManager> = Vec::new();
    for chain in l.filter_chains.iter().chain(l.default_filter_chain.iter()) {
        for f in &chain.filters {
            if f.name == TCP_PROXY_FILTER
                && let Some(t) = decode_filter::<TcpProxy>(f)
            {
                match t.cluster_specifier {
                    Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => clusters.push(c),
                    Some(tcp_proxy::ClusterSpecifier::WeightedClusters(w)) => {
                        clusters.extend(w.clusters.into_iter().map(|c| c.name))
                    }
                    None => {}
                }
            } else if f.name == HCM_FILTER
                && let Some(h) = decode_filter::<HttpConnectionManager>(f)
            {
                hcms.push(h);
            }
        }
    }
    if let Some(api) = l
        .api_listener
        .as_ref()
        .and_then(|a| a.api_listener.as_ref())
        && let Ok(h) = HttpConnectionManager::decode(api.value.as_slice())
    {
        hcms.push(h);
    }
    for h in hcms {
        match h.route_specifier {
            Some(RouteSpecifier::Rds(r)) => rds.push(r.route_config_name),
            Some(RouteSpecifier::RouteConfig(rc)) => {
                clusters.extend(route_clusters(&rc).into_iter().map(|(_, c)| c))
            }
            _ => {}
        }
    }
    (clusters, rds)
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
    for l in &view.listeners {
        let (cs, rds) = listener_references(l);
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
    out
}

fn report(what: &str, kind: &'static str) {
    tracing::error!(
        reference = what,
        "inconsistent generated reference (a Pilotfish bug); replaced before sending"
    );
    INCONSISTENT_REFERENCES.with_label_values(&[kind]).inc();
}

/// Replaces every route that names an unknown cluster with a 503 direct response, and
/// drops mirrors of unknown clusters. Returns how many references were broken.
pub fn sanitize_routes(configs: &mut [RouteConfiguration], known: &dyn Fn(&str) -> bool) -> usize {
    let mut broken = 0;
    for rc in configs.iter_mut() {
        for vh in rc.virtual_hosts.iter_mut() {
            for r in vh.routes.iter_mut() {
                let Some(Action::Route(a)) = &mut r.action else {
                    continue;
                };
                a.request_mirror_policies.retain(|m| {
                    let ok = known(&m.cluster);
                    if !ok {
                        broken += 1;
                        report(&format!("{} mirror -> {}", rc.name, m.cluster), "rds");
                    }
                    ok
                });
                let bad = match &a.cluster_specifier {
                    Some(ClusterSpecifier::Cluster(c)) => (!known(c)).then(|| c.clone()),
                    Some(ClusterSpecifier::WeightedClusters(w)) => w
                        .clusters
                        .iter()
                        .find(|c| !known(&c.name))
                        .map(|c| c.name.clone()),
                    _ => None,
                };
                if let Some(bad) = bad {
                    broken += 1;
                    report(&format!("{}/{} -> {bad}", rc.name, vh.name), "rds");
                    r.action = Some(Action::DirectResponse(DirectResponseAction {
                        status: 503,
                        ..Default::default()
                    }));
                    r.typed_per_filter_config.clear();
                }
            }
        }
    }
    broken
}

/// Points every tcp_proxy naming an unknown cluster at `BlackHoleCluster` (sidecars
/// always have it). Returns how many references were broken.
pub fn sanitize_listeners(listeners: &mut [Listener], known: &dyn Fn(&str) -> bool) -> usize {
    let mut broken = 0;
    for l in listeners.iter_mut() {
        let name = l.name.clone();
        for chain in l
            .filter_chains
            .iter_mut()
            .chain(l.default_filter_chain.iter_mut())
        {
            for f in chain.filters.iter_mut() {
                if f.name != TCP_PROXY_FILTER {
                    continue;
                }
                let Some(mut t) = decode_filter::<TcpProxy>(f) else {
                    continue;
                };
                let bad = match &t.cluster_specifier {
                    Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => !known(c),
                    Some(tcp_proxy::ClusterSpecifier::WeightedClusters(w)) => {
                        w.clusters.iter().any(|c| !known(&c.name))
                    }
                    None => false,
                };
                if bad {
                    broken += 1;
                    report(&format!("{name} tcp_proxy {}", t.stat_prefix), "lds");
                    t.cluster_specifier = Some(tcp_proxy::ClusterSpecifier::Cluster(
                        names::BLACKHOLE_CLUSTER.to_string(),
                    ));
                    f.config_type = Some(filter::ConfigType::TypedConfig(any(&t)));
                }
            }
        }
    }
    broken
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
    for b in &out {
        report(&b.to_string(), "snapshot");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::route::v3::{Route, RouteAction, VirtualHost};

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
    fn sanitize_replaces_broken_routes_with_503() {
        let mut configs = vec![rc("outbound|80||missing"), rc("ok")];
        let broken = sanitize_routes(&mut configs, &|c| c == "ok");
        assert_eq!(broken, 1);
        assert!(matches!(
            configs[0].virtual_hosts[0].routes[0].action,
            Some(Action::DirectResponse(DirectResponseAction {
                status: 503,
                ..
            }))
        ));
        assert!(matches!(
            configs[1].virtual_hosts[0].routes[0].action,
            Some(Action::Route(_))
        ));
    }
}
