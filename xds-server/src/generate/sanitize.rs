//! The last step of generating a part: every reference a generated route or listener makes
//! is checked against the clusters the same scope sends, and a broken one is replaced
//! before it can be sent (a route answers 503, a TCP chain goes to `BlackHoleCluster`).
//! A broken reference is a bug: each replacement is returned as a [`Finding`], which the
//! snapshot logs at error level and counts in `pilotfish_xds_inconsistent_references_total`.
//! Also what the references of a route configuration or listener are, and a listener's
//! address, which the audit reads too.

use std::collections::HashSet;

use envoy_types::pb::envoy::config::core::v3::{address, socket_address::PortSpecifier};
use envoy_types::pb::envoy::config::listener::v3::{Filter, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, RouteConfiguration, route::Action, route_action::ClusterSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager::RouteSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use prost::Message;

use super::findings::Finding;
use super::lds::{HCM_FILTER, TCP_PROXY_FILTER};
use super::names;
use super::util::any;

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
pub(crate) fn listener_references(l: &Listener) -> (Vec<String>, Vec<String>) {
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

/// `ip:port` of a listener bound to a socket address (api listeners have none).
pub(crate) fn listener_address(l: &Listener) -> Option<String> {
    match l.address.as_ref()?.address.as_ref()? {
        address::Address::SocketAddress(a) => {
            let port = match a.port_specifier {
                Some(PortSpecifier::PortValue(p)) => p.to_string(),
                Some(PortSpecifier::NamedPort(ref n)) => n.clone(),
                None => String::new(),
            };
            Some(format!("{}:{port}", a.address))
        }
        _ => None,
    }
}

fn broken(reference: String, kind: &'static str) -> Finding {
    Finding::InconsistentReference { reference, kind }
}

/// Replaces every route that names an unknown cluster with a 503 direct response, and
/// drops mirrors of unknown clusters. Returns each broken reference.
pub fn sanitize_routes(
    configs: &mut [RouteConfiguration],
    known: &dyn Fn(&str) -> bool,
) -> Vec<Finding> {
    let mut found = Vec::new();
    for rc in configs.iter_mut() {
        for vh in rc.virtual_hosts.iter_mut() {
            for r in vh.routes.iter_mut() {
                let Some(Action::Route(a)) = &mut r.action else {
                    continue;
                };
                a.request_mirror_policies.retain(|m| {
                    let ok = known(&m.cluster);
                    if !ok {
                        found.push(broken(
                            format!("{} mirror -> {}", rc.name, m.cluster),
                            "rds",
                        ));
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
                    found.push(broken(format!("{}/{} -> {bad}", rc.name, vh.name), "rds"));
                    r.action = Some(Action::DirectResponse(DirectResponseAction {
                        status: 503,
                        ..Default::default()
                    }));
                    r.typed_per_filter_config.clear();
                }
            }
        }
    }
    found
}

/// Points every tcp_proxy naming an unknown cluster at `BlackHoleCluster` (sidecars
/// always have it) and drops a listener whose address an earlier one has (Envoy would
/// reject the response). Returns each broken reference.
pub fn sanitize_listeners(
    listeners: &mut Vec<Listener>,
    known: &dyn Fn(&str) -> bool,
) -> Vec<Finding> {
    let mut found = Vec::new();
    let mut addresses = HashSet::new();
    listeners.retain(|l| {
        let unique = listener_address(l).is_none_or(|a| addresses.insert(a));
        if !unique {
            found.push(broken(format!("{} address taken", l.name), "lds"));
        }
        unique
    });
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
                    found.push(broken(format!("{name} tcp_proxy {}", t.stat_prefix), "lds"));
                    t.cluster_specifier = Some(tcp_proxy::ClusterSpecifier::Cluster(
                        names::BLACKHOLE_CLUSTER.to_string(),
                    ));
                    f.config_type = Some(filter::ConfigType::TypedConfig(any(&t)));
                }
            }
        }
    }
    found
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
    fn sanitize_replaces_broken_routes_with_503() {
        let mut configs = vec![rc("outbound|80||missing"), rc("ok")];
        let found = sanitize_routes(&mut configs, &|c| c == "ok");
        assert_eq!(
            found,
            [Finding::InconsistentReference {
                reference: "80/a:80 -> outbound|80||missing".into(),
                kind: "rds"
            }]
        );
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

    #[test]
    fn sanitize_drops_a_listener_on_a_taken_address() {
        let listener = |name: &str, ip: &str| Listener {
            name: name.into(),
            address: Some(crate::generate::eds::socket_address(ip, 80)),
            ..Default::default()
        };
        let mut listeners = vec![
            listener("10.0.0.1_80", "10.0.0.1"),
            listener("again", "10.0.0.1"),
            listener("10.0.0.2_80", "10.0.0.2"),
            Listener {
                name: "api".into(),
                ..Default::default()
            },
        ];
        let found = sanitize_listeners(&mut listeners, &|_| true);
        assert_eq!(
            found,
            [Finding::InconsistentReference {
                reference: "again address taken".into(),
                kind: "lds"
            }]
        );
        let kept: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(kept, ["10.0.0.1_80", "10.0.0.2_80", "api"]);
    }
}
