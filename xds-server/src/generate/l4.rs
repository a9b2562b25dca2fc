//! The outbound TCP and TLS filter chains of one service on a sidecar, as Istio builds them
//! (`buildSidecarOutboundTCPFilterChainOpts` / `buildSidecarOutboundTLSFilterChainOpts`):
//!
//! - TCP ports: the VirtualService's `tcp` routes in order; a route whose applicable
//!   matches all name `destinationSubnets` becomes a chain matching those subnets
//!   (`prefix_ranges`), the first route matching any destination ends the list as the
//!   default chain; without one, the service's own cluster is the default.
//! - TLS and HTTPS ports: only `tls` routes (SNI), each applicable match a chain matching
//!   its `sniHosts` (`server_names`) and `destinationSubnets`; repeated run-time
//!   predicates are generated once. When any match applies there is no default chain
//!   (another SNI finds no chain, as in Istio); otherwise the service's own cluster is the
//!   default.
//!
//! Every chain ends in a tcp_proxy to the route's destination, or `weighted_clusters` for
//! several. `sourceSubnet` is read by neither (Istio 1.30 does not translate it either).
//! The listeners decide where the chains go ([`super::lds`]).
//!
//! The tcp_proxy takes two settings from the DestinationRule of its (first) destination's
//! host, as Istio's `buildOutboundNetworkFilters*` does: `trafficPolicy.tunnel` becomes
//! `tunneling_config` (HTTP CONNECT, or POST, to `targetHost:targetPort`; a single
//! destination with a subset reads the subset's `tunnel` only, a split reads the
//! rule's), and `trafficPolicy.connectionPool.tcp.idleTimeout` becomes `idle_timeout`
//! (the rule's top level only, as in Istio).

use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy,
    tcp_proxy::{self, WeightedCluster},
};
use envoy_types::pb::envoy::r#type::v3::{HashPolicy as TypeHashPolicy, hash_policy};
use pilotfish_mesh::api::{
    Destination, L4MatchAttributes, RouteDestination, TlsMatchAttributes, TunnelSettings,
};
use pilotfish_mesh::model::{Protocol, Proxy, labels_match};
use pilotfish_mesh::push_context::PushContext;

use super::findings::{Finding, RouteKind};
use super::names;
use super::plan::ClusterPlan;
use super::route::{RouteEnv, destination_cluster, normalized_weights};
use super::util::{any, api_duration, u32_value};

pub const TCP_PROXY_FILTER: &str = "envoy.filters.network.tcp_proxy";

/// A chain matched at run time, by destination address and/or SNI.
#[derive(Clone, Debug, PartialEq)]
pub struct L4Chain {
    /// Destination ranges matched (empty: any address).
    pub destination_cidrs: Vec<CidrRange>,
    /// SNI names matched, sorted (empty: any name).
    pub server_names: Vec<String>,
    pub filter: Filter,
}

/// The chains of one TCP or TLS service on one listener port.
#[derive(Clone, Debug, PartialEq)]
pub struct L4Chains {
    /// Chains with run-time matches, in the VirtualService's order.
    pub matched: Vec<L4Chain>,
    /// The chain that matches anything else; `None` when TLS routes took the service's
    /// traffic.
    pub default: Option<Filter>,
}

/// The chains of service cluster `c` on the port of `env` for its proxy, routed by the
/// VirtualServices of its egress listener. `service_cidrs` are what a TLS match without
/// `destinationSubnets` matches by address: the service's own ranges on the port's
/// shared listener, nothing on a listener of its own. TCP route destinations without a
/// cluster are noted in `findings`.
pub fn l4_chains(
    env: &RouteEnv<'_>,
    c: &ClusterPlan,
    service_cidrs: &[CidrRange],
    findings: &mut Vec<Finding>,
) -> L4Chains {
    let RouteEnv {
        push,
        proxy,
        plan,
        port,
        egress,
    } = *env;
    let vs = plan
        .sidecar
        .virtual_service_of(push, egress, &c.service.hostname);
    let own = || {
        let mut tcp = tcp_proxy(
            &c.name,
            tcp_proxy::ClusterSpecifier::Cluster(c.name.clone()),
            source_ip_hash(c),
        );
        rule_options(push, proxy, &c.service.hostname, None, &mut tcp);
        tcp_filter(tcp)
    };
    let route_filter = |routes: &[RouteDestination], findings: &mut Vec<Finding>| {
        if routes.is_empty() {
            own()
        } else {
            routed_filter(env, c, routes, findings)
        }
    };
    let mut matched = Vec::new();
    if matches!(c.port.protocol, Protocol::Tls | Protocol::Https) {
        let mut handled = std::collections::HashSet::new();
        for route in vs.iter().flat_map(|v| &v.spec.tls) {
            for m in route
                .r#match
                .iter()
                .filter(|m| tls_match_applies(m, proxy, port))
            {
                // Istio's runtime predicates: SNI names and destination subnets.
                if !handled.insert((m.sni_hosts.join(","), m.destination_subnets.join(","))) {
                    continue;
                }
                let mut server_names: Vec<String> = if m.sni_hosts.iter().any(|h| h == "*") {
                    Vec::new()
                } else {
                    m.sni_hosts.clone()
                };
                server_names.sort();
                let destination_cidrs = if m.destination_subnets.is_empty() {
                    service_cidrs.to_vec()
                } else {
                    m.destination_subnets
                        .iter()
                        .filter_map(|s| cidr(s))
                        .collect()
                };
                matched.push(L4Chain {
                    destination_cidrs,
                    server_names,
                    filter: route_filter(&route.route, findings),
                });
            }
        }
        if matched.is_empty() {
            return L4Chains {
                matched,
                default: Some(own()),
            };
        }
        // A match on any SNI and any address is the listener's default.
        let default = matched
            .iter()
            .position(|m| m.destination_cidrs.is_empty() && m.server_names.is_empty())
            .map(|i| matched.remove(i).filter);
        matched.retain(|m| !(m.destination_cidrs.is_empty() && m.server_names.is_empty()));
        return L4Chains { matched, default };
    }
    for route in vs.iter().flat_map(|v| &v.spec.tcp) {
        if route.r#match.is_empty() {
            return L4Chains {
                matched,
                default: Some(route_filter(&route.route, findings)),
            };
        }
        let mut subnets: Vec<CidrRange> = Vec::new();
        for m in route
            .r#match
            .iter()
            .filter(|m| tcp_match_applies(m, proxy, port))
        {
            if m.destination_subnets.is_empty() {
                return L4Chains {
                    matched,
                    default: Some(route_filter(&route.route, findings)),
                };
            }
            subnets.extend(m.destination_subnets.iter().filter_map(|s| cidr(s)));
        }
        if !subnets.is_empty() {
            matched.push(L4Chain {
                destination_cidrs: subnets,
                server_names: Vec::new(),
                filter: route_filter(&route.route, findings),
            });
        }
    }
    L4Chains {
        matched,
        default: Some(own()),
    }
}

/// The hash policy of a TCP service balanced by consistent hashing on the source IP.
fn source_ip_hash(c: &ClusterPlan) -> Vec<TypeHashPolicy> {
    c.policy
        .load_balancer
        .as_ref()
        .and_then(|l| l.consistent_hash.as_ref())
        .filter(|h| h.use_source_ip == Some(true))
        .map(|_| {
            vec![TypeHashPolicy {
                policy_specifier: Some(hash_policy::PolicySpecifier::SourceIp(
                    hash_policy::SourceIp {},
                )),
            }]
        })
        .unwrap_or_default()
}

/// The tcp_proxy of a route's destinations (weighted when several).
fn routed_filter(
    env: &RouteEnv<'_>,
    c: &ClusterPlan,
    routes: &[RouteDestination],
    findings: &mut Vec<Finding>,
) -> Filter {
    let weights = normalized_weights(&routes.iter().map(|d| d.weight).collect::<Vec<_>>());
    let mut clusters: Vec<(String, u32)> = routes
        .iter()
        .zip(weights)
        .filter(|(_, w)| *w > 0)
        .map(|(d, w)| (resolve(env, &d.destination, findings), w))
        .collect();
    let specifier = if clusters.len() == 1 {
        tcp_proxy::ClusterSpecifier::Cluster(clusters.remove(0).0)
    } else {
        tcp_proxy::ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: clusters
                .into_iter()
                .map(
                    |(name, weight)| tcp_proxy::weighted_cluster::ClusterWeight {
                        name,
                        weight,
                        ..Default::default()
                    },
                )
                .collect(),
        })
    };
    let mut tcp = tcp_proxy(&c.name, specifier, source_ip_hash(c));
    // Istio reads the rule of the first destination's host; a split ignores subsets.
    let first = &routes[0].destination;
    let subset = (routes.len() == 1).then(|| first.subset.as_deref().unwrap_or(""));
    rule_options(env.push, env.proxy, &first.host, subset, &mut tcp);
    tcp_filter(tcp)
}

/// `tunneling_config` and `idle_timeout` from the DestinationRule of `host`: `subset`
/// `None` reads the rule's `tunnel`, `Some(name)` (a single destination) the tunnel of
/// that subset only (`""`: the rule's).
fn rule_options(
    push: &PushContext,
    proxy: &Proxy,
    host: &str,
    subset: Option<&str>,
    tcp: &mut TcpProxy,
) {
    let Some(service) = push.service_for(host, &proxy.namespace) else {
        return;
    };
    let Some(rule) = push.destination_rule(proxy, &service.hostname, Some(&service.namespace))
    else {
        return;
    };
    let policy = rule.spec.traffic_policy.as_ref();
    let tunnel = match subset.filter(|s| !s.is_empty()) {
        Some(name) => rule
            .spec
            .subsets
            .iter()
            .find(|s| s.name == name)
            .and_then(|s| s.traffic_policy.as_ref())
            .and_then(|p| p.tunnel.as_ref()),
        None => policy.and_then(|p| p.tunnel.as_ref()),
    };
    tcp.tunneling_config = tunnel.map(tunneling_config);
    tcp.idle_timeout = policy
        .and_then(|p| p.connection_pool.as_ref())
        .and_then(|p| p.tcp.as_ref())
        .and_then(|t| t.idle_timeout.as_ref())
        .and_then(api_duration);
}

/// CONNECT (or POST) to `targetHost:targetPort` through the destination.
fn tunneling_config(tunnel: &TunnelSettings) -> tcp_proxy::TunnelingConfig {
    let host = if tunnel.target_host.contains(':') {
        format!("[{}]", tunnel.target_host)
    } else {
        tunnel.target_host.clone()
    };
    tcp_proxy::TunnelingConfig {
        hostname: format!("{host}:{}", tunnel.target_port),
        use_post: tunnel.protocol.as_deref() == Some("POST"),
        ..Default::default()
    }
}

/// Istio's static predicates of a `tcp` match: port, `mesh` gateway, source labels and
/// namespace (evaluated here, not by Envoy).
fn tcp_match_applies(m: &L4MatchAttributes, proxy: &Proxy, port: u32) -> bool {
    static_match(
        m.port,
        &m.gateways,
        &m.source_labels,
        m.source_namespace.as_deref(),
        proxy,
        port,
    )
}

fn tls_match_applies(m: &TlsMatchAttributes, proxy: &Proxy, port: u32) -> bool {
    static_match(
        m.port,
        &m.gateways,
        &m.source_labels,
        m.source_namespace.as_deref(),
        proxy,
        port,
    )
}

fn static_match(
    match_port: Option<u32>,
    gateways: &[String],
    source_labels: &pilotfish_mesh::api::Labels,
    source_namespace: Option<&str>,
    proxy: &Proxy,
    port: u32,
) -> bool {
    match_port.is_none_or(|p| p == port)
        && (gateways.is_empty() || gateways.iter().any(|g| g == "mesh"))
        && (source_labels.is_empty() || labels_match(source_labels, &proxy.labels))
        && source_namespace.is_none_or(|ns| ns == proxy.namespace)
}

/// A TCP destination's cluster; one the proxy does not have becomes `BlackHoleCluster`
/// (and is noted in `findings`).
fn resolve(env: &RouteEnv<'_>, dest: &Destination, findings: &mut Vec<Finding>) -> String {
    destination_cluster(env, dest).unwrap_or_else(|cluster| {
        findings.push(Finding::UnresolvedDestination {
            kind: RouteKind::Tcp,
            cluster,
            namespace: env.proxy.namespace.clone(),
        });
        names::BLACKHOLE_CLUSTER.to_string()
    })
}

/// A tcp_proxy network filter.
pub fn tcp_proxy_filter(
    stat_prefix: &str,
    cluster: tcp_proxy::ClusterSpecifier,
    hash_policy: Vec<TypeHashPolicy>,
) -> Filter {
    tcp_filter(tcp_proxy(stat_prefix, cluster, hash_policy))
}

fn tcp_proxy(
    stat_prefix: &str,
    cluster: tcp_proxy::ClusterSpecifier,
    hash_policy: Vec<TypeHashPolicy>,
) -> TcpProxy {
    TcpProxy {
        stat_prefix: stat_prefix.to_string(),
        cluster_specifier: Some(cluster),
        hash_policy,
        ..Default::default()
    }
}

fn tcp_filter(tcp: TcpProxy) -> Filter {
    Filter {
        name: TCP_PROXY_FILTER.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(any(&tcp))),
    }
}

/// A CIDR range from an IP or `ip/len`; `None` for anything else.
pub fn cidr(address: &str) -> Option<CidrRange> {
    let (ip, len) = match address.split_once('/') {
        Some((ip, len)) => (ip, len.parse::<u32>().ok()?),
        None => (address, if address.contains(':') { 128 } else { 32 }),
    };
    ip.parse::<std::net::IpAddr>().ok()?;
    Some(CidrRange {
        address_prefix: ip.to_string(),
        prefix_len: u32_value(len),
    })
}

/// The key a range is claimed under on a listener (`ip/len`).
pub fn cidr_key(range: &CidrRange) -> String {
    format!(
        "{}/{}",
        range.address_prefix,
        range.prefix_len.as_ref().map_or(0, |l| l.value)
    )
}
