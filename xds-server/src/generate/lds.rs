//! LDS: listeners.
//!
//! Sidecars get `virtualOutbound` (0.0.0.0:15001, original-destination hand-off, unknown
//! traffic to `PassthroughCluster` or `BlackHoleCluster` per `outboundTrafficPolicy`),
//! outbound listeners that are not bound (traffic arrives through `virtualOutbound`, which
//! hands a connection to the listener of its exact address, else to `0.0.0.0_<port>`), and
//! `virtualInbound` (0.0.0.0:15006) with one filter chain per port of the workload itself.
//!
//! Outbound, as [`outbound_ports`] decides per port:
//! - each Kubernetes service with a virtual IP gets `<ip>_<port>`: an HTTP connection
//!   manager asking RDS for the service's own route configuration `<fqdn>:<port>`, or the
//!   service's tcp_proxy. Adding or removing a service adds or removes its listeners and
//!   touches no other;
//! - `0.0.0.0_<port>` carries everything else on a port that has an HTTP service or a
//!   shared one: TCP services with addresses (CIDRs, ServiceEntry IPs) get a chain matching
//!   them, TLS services without one a chain matching their SNI, and the default chain is
//!   the HTTP connection manager with the port's catch-all route configuration (named by
//!   the port, routing by Host) when an HTTP service uses the port, else the port's single
//!   TCP service without an address, else passthrough/blackhole.
//!
//! Proxyless gRPC gets one `api_listener` per `<fqdn>:<port>`: an HTTP connection manager
//! fetching the route configuration of the same name from ADS, with the fault filter and
//! the router (last, as gRPC requires).

use std::collections::HashSet;

use envoy_types::pb::envoy::config::core::v3::{CidrRange, TrafficDirection};
use envoy_types::pb::envoy::config::listener::v3::{
    ApiListener, Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter,
    listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds,
    http_connection_manager::{
        CodecType, PathWithEscapedSlashesAction, RouteSpecifier, UpgradeConfig,
    },
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy,
    tcp_proxy::{self, WeightedCluster},
};
use envoy_types::pb::envoy::r#type::v3::{HashPolicy as TypeHashPolicy, hash_policy};
use pilotfish_mesh::api::TcpRoute;
use pilotfish_mesh::mesh_config::OutboundTrafficPolicy;
use pilotfish_mesh::model::{Protocol, Proxy, labels_match};
use pilotfish_mesh::push_context::PushContext;

use super::eds::socket_address;
use super::findings::{Finding, RouteKind};
use super::names;
use super::plan::{ClusterPlan, OutboundPlan, OutboundPort, outbound_ports};
use super::route::{
    CORS_FILTER, FAULT_FILTER, ROUTER_FILTER, RouteEnv, destination_cluster, http_filter,
    normalized_weights,
};
use super::scope::InboundPort;
use super::util::{ads_config_source, any, bool_value, u32_value, zero_duration};

pub const HCM_FILTER: &str = "envoy.filters.network.http_connection_manager";
pub const TCP_PROXY_FILTER: &str = "envoy.filters.network.tcp_proxy";

/// The cluster unknown outbound traffic goes to.
pub fn unknown_destination_cluster(push: &PushContext) -> &'static str {
    match push.mesh().outbound_traffic_policy {
        OutboundTrafficPolicy::AllowAny => names::PASSTHROUGH_CLUSTER,
        OutboundTrafficPolicy::RegistryOnly => names::BLACKHOLE_CLUSTER,
    }
}

/// A sidecar's `virtualOutbound` and per-port outbound listeners; TCP route destinations
/// without a cluster are noted in `findings`.
pub fn sidecar_outbound_listeners(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    findings: &mut Vec<Finding>,
) -> Vec<Listener> {
    let unknown = unknown_destination_cluster(push);
    let mut out = vec![Listener {
        name: names::VIRTUAL_OUTBOUND.to_string(),
        address: Some(socket_address("0.0.0.0", names::VIRTUAL_OUTBOUND_PORT)),
        use_original_dst: bool_value(true),
        traffic_direction: TrafficDirection::Outbound as i32,
        filter_chains: vec![FilterChain {
            name: "virtualOutbound-catchall-tcp".to_string(),
            filters: vec![tcp_proxy_filter(
                unknown,
                tcp_proxy::ClusterSpecifier::Cluster(unknown.to_string()),
                Vec::new(),
            )],
            ..Default::default()
        }],
        ..Default::default()
    }];

    for (port, services) in outbound_ports(plan) {
        for (c, ips) in &services.own_listeners {
            for ip in ips {
                out.push(own_listener(push, proxy, plan, c, ip, port, findings));
            }
        }
        if services.has_http() || !services.shared.is_empty() {
            out.push(shared_port_listener(
                push, proxy, plan, port, &services, unknown, findings,
            ));
        }
    }
    out
}

/// `<ip>_<port>`: the listener of one service's virtual IP.
fn own_listener(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    c: &ClusterPlan,
    ip: &str,
    port: u32,
    findings: &mut Vec<Finding>,
) -> Listener {
    let name = names::vip_listener(ip, port);
    let filter = if c.port.protocol.is_http() {
        hcm_filter(
            format!("outbound_{name}"),
            RouteSpecifier::Rds(Rds {
                config_source: Some(ads_config_source(true)),
                route_config_name: names::host_port(&c.service.hostname, port),
            }),
            sidecar_http_filters(),
        )
    } else {
        tcp_destination(push, proxy, plan, c, port, findings)
    };
    Listener {
        name: name.clone(),
        address: Some(socket_address(ip, port)),
        // Traffic reaches it through virtualOutbound's original-destination hand-off.
        bind_to_port: bool_value(false),
        traffic_direction: TrafficDirection::Outbound as i32,
        // One chain; unnamed, as the listener's name says what it is (1,000 services make
        // 1,000 of these, so every byte counts in a SotW listener response).
        filter_chains: vec![FilterChain {
            filters: vec![filter],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// `0.0.0.0_<port>`: every service of the port without a listener of its own, and the
/// port's HTTP catch-all.
fn shared_port_listener(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    port: u32,
    services: &OutboundPort<'_>,
    unknown: &str,
    findings: &mut Vec<Finding>,
) -> Listener {
    let mut chains = Vec::new();
    let mut claimed_ips: HashSet<String> = HashSet::new();
    let mut claimed_snis: HashSet<String> = HashSet::new();
    let mut default_tcp: Vec<&ClusterPlan> = Vec::new();
    for c in services
        .shared
        .iter()
        .copied()
        .filter(|c| !c.port.protocol.is_http())
    {
        let tcp = tcp_destination(push, proxy, plan, c, port, findings);
        let ranges: Vec<CidrRange> = c
            .service
            .addresses
            .iter()
            .filter(|a| claimed_ips.insert((*a).clone()))
            .filter_map(|a| cidr(a))
            .collect();
        if !ranges.is_empty() {
            chains.push(FilterChain {
                name: c.name.clone(),
                filter_chain_match: Some(FilterChainMatch {
                    prefix_ranges: ranges,
                    ..Default::default()
                }),
                filters: vec![tcp],
                ..Default::default()
            });
        } else if c.service.addresses.is_empty()
            && matches!(c.port.protocol, Protocol::Tls | Protocol::Https)
        {
            if claimed_snis.insert(c.service.hostname.clone()) {
                chains.push(FilterChain {
                    name: c.name.clone(),
                    filter_chain_match: Some(FilterChainMatch {
                        server_names: vec![c.service.hostname.clone()],
                        transport_protocol: "tls".to_string(),
                        ..Default::default()
                    }),
                    filters: vec![tcp],
                    ..Default::default()
                });
            }
        } else if c.service.addresses.is_empty() {
            default_tcp.push(c);
        }
    }
    let default_filter = if services.has_http() {
        hcm_filter(
            format!("outbound_0.0.0.0_{port}"),
            RouteSpecifier::Rds(Rds {
                config_source: Some(ads_config_source(true)),
                route_config_name: names::sidecar_route(port),
            }),
            sidecar_http_filters(),
        )
    } else if let [only] = default_tcp.as_slice() {
        tcp_destination(push, proxy, plan, only, port, findings)
    } else {
        tcp_proxy_filter(
            unknown,
            tcp_proxy::ClusterSpecifier::Cluster(unknown.to_string()),
            Vec::new(),
        )
    };
    let listener_filters = if claimed_snis.is_empty() {
        Vec::new()
    } else {
        vec![ListenerFilter {
            name: "envoy.filters.listener.tls_inspector".to_string(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(any(
                &TlsInspector::default(),
            ))),
            ..Default::default()
        }]
    };
    chains.push(FilterChain {
        name: format!("outbound_0.0.0.0_{port}"),
        filters: vec![default_filter],
        ..Default::default()
    });
    Listener {
        name: names::outbound_listener(port),
        address: Some(socket_address("0.0.0.0", port)),
        // Traffic reaches these through virtualOutbound's original-destination hand-off.
        bind_to_port: bool_value(false),
        traffic_direction: TrafficDirection::Outbound as i32,
        listener_filters,
        filter_chains: chains,
        ..Default::default()
    }
}

/// A CIDR range from an IP or `ip/len`; `None` for anything else.
fn cidr(address: &str) -> Option<CidrRange> {
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

/// The tcp_proxy for a TCP service: its VirtualService's first applicable `tcp` route
/// (weighted destinations), or the service's own cluster.
fn tcp_destination(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    c: &ClusterPlan,
    port: u32,
    findings: &mut Vec<Finding>,
) -> Filter {
    let route = push
        .virtual_service_for_host(&c.service.hostname, &proxy.namespace)
        .and_then(|vs| {
            vs.spec
                .tcp
                .iter()
                .find(|r| tcp_route_applies(r, proxy, port))
        });
    let hash = c
        .policy
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
        .unwrap_or_default();
    let Some(route) = route.filter(|r| !r.route.is_empty()) else {
        return tcp_proxy_filter(
            &c.name,
            tcp_proxy::ClusterSpecifier::Cluster(c.name.clone()),
            hash,
        );
    };
    let env = RouteEnv {
        push,
        proxy,
        plan,
        port,
    };
    let weights = normalized_weights(&route.route.iter().map(|d| d.weight).collect::<Vec<_>>());
    let mut clusters: Vec<(String, u32)> = route
        .route
        .iter()
        .zip(weights)
        .filter(|(_, w)| *w > 0)
        .map(|(d, w)| (resolve_tcp(&env, &d.destination, findings), w))
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
    tcp_proxy_filter(&c.name, specifier, hash)
}

fn tcp_route_applies(r: &TcpRoute, proxy: &Proxy, port: u32) -> bool {
    r.r#match.is_empty()
        || r.r#match.iter().any(|m| {
            m.port.is_none_or(|p| p == port)
                && (m.gateways.is_empty() || m.gateways.iter().any(|g| g == "mesh"))
                && (m.source_labels.is_empty() || labels_match(&m.source_labels, &proxy.labels))
                && m.source_namespace
                    .as_ref()
                    .is_none_or(|ns| *ns == proxy.namespace)
        })
}

/// A TCP destination's cluster; one the proxy does not have becomes `BlackHoleCluster`
/// (and is noted in `findings`).
fn resolve_tcp(
    env: &RouteEnv<'_>,
    dest: &pilotfish_mesh::api::Destination,
    findings: &mut Vec<Finding>,
) -> String {
    destination_cluster(env, dest).unwrap_or_else(|cluster| {
        findings.push(Finding::UnresolvedDestination {
            kind: RouteKind::Tcp,
            cluster,
            namespace: env.proxy.namespace.clone(),
        });
        names::BLACKHOLE_CLUSTER.to_string()
    })
}

fn tcp_proxy_filter(
    stat_prefix: &str,
    cluster: tcp_proxy::ClusterSpecifier,
    hash_policy: Vec<TypeHashPolicy>,
) -> Filter {
    Filter {
        name: TCP_PROXY_FILTER.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(any(&TcpProxy {
            stat_prefix: stat_prefix.to_string(),
            cluster_specifier: Some(cluster),
            hash_policy,
            ..Default::default()
        }))),
    }
}

/// fault, CORS, router: the sidecar's outbound HTTP filters (router last).
fn sidecar_http_filters() -> Vec<HttpFilter> {
    vec![
        http_filter(FAULT_FILTER, any(&HttpFault::default())),
        http_filter(CORS_FILTER, any(&Cors::default())),
        http_filter(ROUTER_FILTER, any(&Router::default())),
    ]
}

fn hcm_filter(
    stat_prefix: String,
    routes: RouteSpecifier,
    http_filters: Vec<HttpFilter>,
) -> Filter {
    Filter {
        name: HCM_FILTER.to_string(),
        config_type: Some(filter::ConfigType::TypedConfig(any(&sidecar_hcm(
            stat_prefix,
            routes,
            http_filters,
        )))),
    }
}

fn sidecar_hcm(
    stat_prefix: String,
    routes: RouteSpecifier,
    http_filters: Vec<HttpFilter>,
) -> HttpConnectionManager {
    HttpConnectionManager {
        stat_prefix,
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(routes),
        http_filters,
        use_remote_address: bool_value(false),
        normalize_path: bool_value(true),
        path_with_escaped_slashes_action: PathWithEscapedSlashesAction::KeepUnchanged as i32,
        // Long-lived streams (gRPC, websockets) are not cut by an idle timer.
        stream_idle_timeout: zero_duration(),
        upgrade_configs: vec![UpgradeConfig {
            upgrade_type: "websocket".to_string(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A sidecar's `virtualInbound`: one chain per workload port (HTTP ports through an HTTP
/// connection manager with an inline route to `inbound|<port>||`), 15006 itself
/// blackholed (no loops), and anything else passed through.
pub fn sidecar_inbound_listener(inbound: &[InboundPort]) -> Listener {
    let mut chains = vec![FilterChain {
        name: "virtualInbound-blackhole".to_string(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: u32_value(names::VIRTUAL_INBOUND_PORT),
            ..Default::default()
        }),
        filters: vec![tcp_proxy_filter(
            names::BLACKHOLE_CLUSTER,
            tcp_proxy::ClusterSpecifier::Cluster(names::BLACKHOLE_CLUSTER.to_string()),
            Vec::new(),
        )],
        ..Default::default()
    }];
    for p in inbound
        .iter()
        .filter(|p| p.port != names::VIRTUAL_INBOUND_PORT)
    {
        let cluster = names::inbound_cluster(p.port);
        let filter = if p.protocol.is_http() {
            let env_route = default_inbound_route(&cluster, p.port);
            hcm_filter(
                format!("inbound_0.0.0.0_{}", p.port),
                RouteSpecifier::RouteConfig(RouteConfiguration {
                    name: cluster.clone(),
                    virtual_hosts: vec![VirtualHost {
                        name: format!("inbound|http|{}", p.port),
                        domains: vec!["*".to_string()],
                        routes: vec![env_route],
                        ..Default::default()
                    }],
                    validate_clusters: bool_value(false),
                    ..Default::default()
                }),
                vec![http_filter(ROUTER_FILTER, any(&Router::default()))],
            )
        } else {
            tcp_proxy_filter(
                &cluster,
                tcp_proxy::ClusterSpecifier::Cluster(cluster.clone()),
                Vec::new(),
            )
        };
        chains.push(FilterChain {
            name: cluster,
            filter_chain_match: Some(FilterChainMatch {
                destination_port: u32_value(p.port),
                ..Default::default()
            }),
            filters: vec![filter],
            ..Default::default()
        });
    }
    Listener {
        name: names::VIRTUAL_INBOUND.to_string(),
        address: Some(socket_address("0.0.0.0", names::VIRTUAL_INBOUND_PORT)),
        traffic_direction: TrafficDirection::Inbound as i32,
        listener_filters: vec![ListenerFilter {
            name: "envoy.filters.listener.original_dst".to_string(),
            config_type: Some(listener_filter::ConfigType::TypedConfig(any(
                &OriginalDst::default(),
            ))),
            ..Default::default()
        }],
        filter_chains: chains,
        default_filter_chain: Some(FilterChain {
            name: "virtualInbound-passthrough".to_string(),
            filters: vec![tcp_proxy_filter(
                names::INBOUND_PASSTHROUGH_CLUSTER,
                tcp_proxy::ClusterSpecifier::Cluster(
                    names::INBOUND_PASSTHROUGH_CLUSTER.to_string(),
                ),
                Vec::new(),
            )],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn default_inbound_route(
    cluster: &str,
    port: u32,
) -> envoy_types::pb::envoy::config::route::v3::Route {
    use super::route::route_match;
    use envoy_types::pb::envoy::config::route::v3::{
        Decorator, Route, RouteAction,
        route::Action,
        route_action::{ClusterSpecifier, MaxStreamDuration},
    };
    Route {
        name: "default".to_string(),
        r#match: Some(route_match(None)),
        decorator: Some(Decorator {
            operation: format!(":{port}/*"),
            ..Default::default()
        }),
        action: Some(Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.to_string())),
            timeout: zero_duration(),
            max_stream_duration: Some(MaxStreamDuration {
                max_stream_duration: zero_duration(),
                grpc_timeout_header_max: zero_duration(),
                ..Default::default()
            }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Proxyless clients' listeners: one `api_listener` per whole-service cluster.
pub fn proxyless_listeners(plan: &OutboundPlan) -> Vec<Listener> {
    plan.clusters
        .iter()
        .filter(|c| c.subset.is_empty())
        .map(|c| {
            let name = names::host_port(&c.service.hostname, c.port.port);
            let hcm = HttpConnectionManager {
                stat_prefix: name.clone(),
                codec_type: CodecType::Auto as i32,
                route_specifier: Some(RouteSpecifier::Rds(Rds {
                    config_source: Some(ads_config_source(false)),
                    route_config_name: name.clone(),
                })),
                // gRPC needs the router, last; it implements fault injection too.
                http_filters: vec![
                    http_filter(FAULT_FILTER, any(&HttpFault::default())),
                    http_filter(ROUTER_FILTER, any(&Router::default())),
                ],
                ..Default::default()
            };
            Listener {
                name,
                api_listener: Some(ApiListener {
                    api_listener: Some(any(&hcm)),
                }),
                ..Default::default()
            }
        })
        .collect()
}
