//! LDS: listeners.
//!
//! Sidecars get `virtualOutbound` (0.0.0.0:15001, original-destination hand-off, unknown
//! traffic to `PassthroughCluster` or `BlackHoleCluster` per `outboundTrafficPolicy`),
//! outbound listeners that are not bound (traffic arrives through `virtualOutbound`, which
//! hands a connection to the listener of its exact address, else to `0.0.0.0_<port>`), and
//! `virtualInbound` (0.0.0.0:15006) with the filter chains of each port of the workload
//! itself and of the passthrough, per the workload's PeerAuthentication mode. A Sidecar's
//! ingress listeners with `captureMode: NONE` get listeners of their own bound to their
//! address ([`bound_inbound_listeners`]), and its egress listeners with an address of
//! their own (`bind`, `captureMode: NONE`, a Unix socket) get `<bind>_<port>` listeners
//! ([`bound_listeners`]) instead of the shape below.
//!
//! Outbound, as [`outbound_ports`] decides per port (under a Sidecar: for the services of
//! the egress listener claiming the port):
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
use envoy_types::pb::envoy::extensions::filters::http::grpc_web::v3::GrpcWeb;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds,
    http_connection_manager::{
        CodecType, ForwardClientCertDetails, PathWithEscapedSlashesAction, RouteSpecifier,
        SetCurrentClientCertDetails, UpgradeConfig,
    },
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy;
use pilotfish_mesh::api::MtlsMode;
use pilotfish_mesh::mesh_config::OutboundTrafficPolicy;
use pilotfish_mesh::model::{Protocol, Proxy};
use pilotfish_mesh::push_context::sidecar::EgressScope;
use pilotfish_mesh::push_context::{EffectiveMtls, PushContext};

use super::eds::socket_address;
use super::findings::Finding;
use super::inbound_mtls::{self, ChainProtocol};
use super::inbound_tls;
use super::jwt_authn::{self, ResolvedJwtRule};
use super::l4::{cidr, cidr_key, l4_chains, tcp_proxy_filter};
use super::names;
use super::plan::{ClusterPlan, OutboundPlan, OutboundPort, bound_listeners, outbound_ports};
use super::rbac::InboundRbac;
use super::route::{CORS_FILTER, FAULT_FILTER, ROUTER_FILTER, RouteEnv, http_filter};
use super::scope::InboundPort;
use super::util::{ads_config_source, any, bool_value, u32_value, zero_duration};

pub const HCM_FILTER: &str = "envoy.filters.network.http_connection_manager";
pub use super::l4::TCP_PROXY_FILTER;
/// Envoy's gRPC-Web to gRPC translation, which Istio puts on `grpc-web` ports.
pub const GRPC_WEB_FILTER: &str = "envoy.filters.http.grpc_web";

/// The cluster unknown outbound traffic goes to, per the scope's `outboundTrafficPolicy`
/// (the Sidecar's, else the mesh's): `PassthroughCluster`, the Sidecar's `egressProxy`
/// (named as Istio's `GetDestinationCluster` names it: its port, or 0), or
/// `BlackHoleCluster`.
pub fn unknown_destination_cluster(plan: &OutboundPlan) -> String {
    let policy = &plan.sidecar.outbound;
    match policy.mode {
        OutboundTrafficPolicy::AllowAny => match &policy.egress_proxy {
            Some(d) => names::outbound_cluster(
                d.port.as_ref().map_or(0, |p| p.number),
                d.subset.as_deref().unwrap_or(""),
                &d.host,
            ),
            None => names::PASSTHROUGH_CLUSTER.to_string(),
        },
        OutboundTrafficPolicy::RegistryOnly => names::BLACKHOLE_CLUSTER.to_string(),
    }
}

/// A sidecar's `virtualOutbound` and per-port outbound listeners; TCP route destinations
/// without a cluster are noted in `findings`. A service's own listener whose name `reused`
/// accepts is not generated: the caller holds it, and gets in its place a stub with only
/// the name and address (so the sanitizer still sees every address in order; the caller
/// replaces the stub).
pub fn sidecar_outbound_listeners(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    reused: &dyn Fn(&str) -> bool,
    findings: &mut Vec<Finding>,
) -> Vec<Listener> {
    let unknown = unknown_destination_cluster(plan);
    let unknown = unknown.as_str();
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
            for ip in *ips {
                let name = names::vip_listener(ip, port);
                out.push(if reused(&name) {
                    Listener {
                        name,
                        address: Some(socket_address(ip, port)),
                        ..Default::default()
                    }
                } else {
                    own_listener(push, proxy, plan, c, ip, port, findings)
                });
            }
        }
        if services.has_http() || !services.shared.is_empty() {
            out.push(shared_port_listener(
                push,
                proxy,
                plan,
                port,
                &services,
                plan.sidecar.listener_for_port(port),
                names::sidecar_route(port),
                unknown,
                findings,
            ));
        }
    }
    for bound in bound_listeners(plan) {
        let mut listener = shared_port_listener(
            push,
            proxy,
            plan,
            bound.port,
            &bound.services(),
            Some(bound.listener),
            bound.route_name.clone(),
            unknown,
            findings,
        );
        listener.name = bound.name;
        listener.address = Some(listener_address(&bound.address, bound.port));
        if bound.binds {
            // Istio's MAX_CONNECTIONS_PER_SOCKET_EVENT_LOOP default, on listeners that bind.
            listener.bind_to_port = None;
            listener.max_connections_to_accept_per_socket_event = u32_value(1);
        }
        out.push(listener);
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
    let mut filter_chains = Vec::new();
    let default = if c.port.protocol.is_http() {
        Some(hcm_filter(
            format!("outbound_{name}"),
            RouteSpecifier::Rds(Rds {
                config_source: Some(ads_config_source(true)),
                route_config_name: names::host_port(&c.service.hostname, port),
            }),
            sidecar_http_filters(c.port.protocol == Protocol::GrpcWeb),
        ))
    } else {
        let env = RouteEnv {
            push,
            proxy,
            plan,
            port,
            egress: plan.sidecar.listener_for_service(&c.service.hostname, port),
        };
        let chains = l4_chains(&env, c, &[], findings);
        let mut claimed = HashSet::new();
        for m in chains.matched {
            if let Some(chain_match) = claim(&mut claimed, m.destination_cidrs, m.server_names) {
                filter_chains.push(FilterChain {
                    filter_chain_match: Some(chain_match),
                    filters: vec![m.filter],
                    ..Default::default()
                });
            }
        }
        chains.default
    };
    // The default chain is unnamed, as the listener's name says what it is (1,000
    // services make 1,000 of these, so every byte counts in a SotW listener response).
    filter_chains.extend(default.map(|filter| FilterChain {
        filters: vec![filter],
        ..Default::default()
    }));
    Listener {
        name: name.clone(),
        address: Some(socket_address(ip, port)),
        // Traffic reaches it through virtualOutbound's original-destination hand-off.
        bind_to_port: bool_value(false),
        traffic_direction: TrafficDirection::Outbound as i32,
        listener_filters: tls_inspector_for(&filter_chains),
        filter_chains,
        ..Default::default()
    }
}

/// Claims a chain's run-time match on a listener: each (range, SNI) pair once, as Envoy
/// refuses two chains with the same match. Ranges (or, with SNI names, names) already
/// claimed are dropped; `None` when nothing is left.
fn claim(
    claimed: &mut HashSet<(String, String)>,
    ranges: Vec<CidrRange>,
    server_names: Vec<String>,
) -> Option<FilterChainMatch> {
    if server_names.is_empty() {
        let ranges: Vec<CidrRange> = ranges
            .into_iter()
            .filter(|r| claimed.insert((cidr_key(r), String::new())))
            .collect();
        return (!ranges.is_empty()).then(|| FilterChainMatch {
            prefix_ranges: ranges,
            ..Default::default()
        });
    }
    let keys: Vec<String> = if ranges.is_empty() {
        vec![String::new()]
    } else {
        ranges.iter().map(cidr_key).collect()
    };
    let server_names: Vec<String> = server_names
        .into_iter()
        .filter(|sni| {
            keys.iter()
                .all(|k| !claimed.contains(&(k.clone(), sni.clone())))
        })
        .collect();
    for sni in &server_names {
        for k in &keys {
            claimed.insert((k.clone(), sni.clone()));
        }
    }
    (!server_names.is_empty()).then(|| FilterChainMatch {
        prefix_ranges: ranges,
        server_names,
        transport_protocol: "tls".to_string(),
        ..Default::default()
    })
}

/// The TLS inspector, when some chain matches by SNI.
fn tls_inspector_for(chains: &[FilterChain]) -> Vec<ListenerFilter> {
    if !chains.iter().any(|c| {
        c.filter_chain_match
            .as_ref()
            .is_some_and(|m| !m.server_names.is_empty())
    }) {
        return Vec::new();
    }
    vec![ListenerFilter {
        name: "envoy.filters.listener.tls_inspector".to_string(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any(
            &TlsInspector::default(),
        ))),
        ..Default::default()
    }]
}

/// `0.0.0.0_<port>`: every service of the port without a listener of its own, and the
/// port's HTTP catch-all.
#[allow(clippy::too_many_arguments)]
fn shared_port_listener(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    port: u32,
    services: &OutboundPort<'_>,
    egress: Option<&EgressScope>,
    route_name: String,
    unknown: &str,
    findings: &mut Vec<Finding>,
) -> Listener {
    let mut chains = Vec::new();
    let mut claimed: HashSet<(String, String)> = HashSet::new();
    let mut default_tcp: Vec<Filter> = Vec::new();
    for c in services
        .shared
        .iter()
        .copied()
        .filter(|c| !c.port.protocol.is_http())
    {
        let service_cidrs: Vec<CidrRange> =
            c.service.addresses.iter().filter_map(|a| cidr(a)).collect();
        let env = RouteEnv {
            push,
            proxy,
            plan,
            port,
            egress,
        };
        let l4 = l4_chains(&env, c, &service_cidrs, findings);
        for m in l4.matched {
            if let Some(chain_match) = claim(&mut claimed, m.destination_cidrs, m.server_names) {
                // Unnamed: chains from one VirtualService can come with several services.
                chains.push(FilterChain {
                    filter_chain_match: Some(chain_match),
                    filters: vec![m.filter],
                    ..Default::default()
                });
            }
        }
        let Some(tcp) = l4.default else {
            continue;
        };
        if !service_cidrs.is_empty() {
            if let Some(chain_match) = claim(&mut claimed, service_cidrs, Vec::new()) {
                chains.push(FilterChain {
                    name: c.name.clone(),
                    filter_chain_match: Some(chain_match),
                    filters: vec![tcp],
                    ..Default::default()
                });
            }
        } else if c.service.addresses.is_empty()
            && matches!(c.port.protocol, Protocol::Tls | Protocol::Https)
        {
            if let Some(chain_match) =
                claim(&mut claimed, Vec::new(), vec![c.service.hostname.clone()])
            {
                chains.push(FilterChain {
                    name: c.name.clone(),
                    filter_chain_match: Some(chain_match),
                    filters: vec![tcp],
                    ..Default::default()
                });
            }
        } else if c.service.addresses.is_empty() {
            default_tcp.push(tcp);
        }
    }
    let default_filter = if services.has_http() {
        hcm_filter(
            format!("outbound_0.0.0.0_{port}"),
            RouteSpecifier::Rds(Rds {
                config_source: Some(ads_config_source(true)),
                route_config_name: route_name,
            }),
            // Istio takes the port's protocol from one of its services; any grpc-web
            // service the catch-all routes gets the filter here (it acts only on
            // `application/grpc-web` requests).
            sidecar_http_filters(
                services
                    .shared
                    .iter()
                    .any(|c| c.port.protocol == Protocol::GrpcWeb),
            ),
        )
    } else if default_tcp.len() == 1 {
        default_tcp.remove(0)
    } else {
        tcp_proxy_filter(
            unknown,
            tcp_proxy::ClusterSpecifier::Cluster(unknown.to_string()),
            Vec::new(),
        )
    };
    let listener_filters = tls_inspector_for(&chains);
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

/// fault, CORS, router: the sidecar's outbound HTTP filters (router last), after
/// gRPC-Web on a `grpc-web` port, in Istio's order.
fn sidecar_http_filters(grpc_web: bool) -> Vec<HttpFilter> {
    grpc_web
        .then(grpc_web_filter)
        .into_iter()
        .chain([
            http_filter(FAULT_FILTER, any(&HttpFault::default())),
            http_filter(CORS_FILTER, any(&Cors::default())),
            http_filter(ROUTER_FILTER, any(&Router::default())),
        ])
        .collect()
}

fn grpc_web_filter() -> HttpFilter {
    http_filter(GRPC_WEB_FILTER, any(&GrpcWeb::default()))
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

/// A sidecar's `virtualInbound`, as Istio builds it: 15006 itself blackholed (no loops);
/// traffic to other ports the workload does not serve passed through to
/// `InboundPassthroughCluster`; and each workload port (HTTP ports through an HTTP
/// connection manager with an inline route to `inbound|<port>||`, others through
/// tcp_proxy). The passthrough and every port get the filter chains of their mutual TLS
/// mode (`mtls`, from PeerAuthentication; [`inbound_mtls`]), the ports of the workload
/// policy's `portLevelMtls` that no Service names get a passthrough of their own, and the
/// TLS inspector runs where a chain matches on TLS. There is no default chain: under
/// STRICT a plaintext connection matches nothing and is closed. The workload's
/// AuthorizationPolicies (`rbac`) put RBAC filters in every chain but the blackhole: HTTP
/// ones before the router, network ones before `tcp_proxy`.
pub fn sidecar_inbound_listener(
    inbound: &[InboundPort],
    mtls: &EffectiveMtls,
    jwt_rules: &[ResolvedJwtRule],
    trust_domain: &str,
    rbac: &InboundRbac,
) -> Listener {
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
    let passthrough = || {
        tcp_proxy_filter(
            names::INBOUND_PASSTHROUGH_CLUSTER,
            tcp_proxy::ClusterSpecifier::Cluster(names::INBOUND_PASSTHROUGH_CLUSTER.to_string()),
            Vec::new(),
        )
    };
    // The passthrough: no port (the workload's mode), then the port-level ports no
    // Service declares (Istio's ForPassthrough).
    let served: HashSet<u32> = inbound.iter().map(|p| p.port).collect();
    // Ports with a listener of their own (`bound_inbound_listeners`) have no chain here.
    let inbound = inbound.iter().filter(|p| !p.bound);
    let passthrough_ports = std::iter::once((None, mtls.mode)).chain(
        mtls.per_port
            .iter()
            .filter(|(port, _)| !served.contains(port) && **port != names::VIRTUAL_INBOUND_PORT)
            .map(|(port, mode)| (Some(*port), *mode)),
    );
    for (port, mode) in passthrough_ports {
        chains.extend(mtls_chains(
            names::VIRTUAL_INBOUND,
            port,
            mode,
            ChainProtocol::Tcp,
            trust_domain,
            || with_rbac(&rbac.network, passthrough()),
        ));
    }
    for p in inbound.filter(|p| p.port != names::VIRTUAL_INBOUND_PORT) {
        let chain_name = inbound_chain_name(p);
        let cluster = names::inbound_cluster(p.port);
        // A Sidecar ingress `tls` applies only where the port's mTLS mode is DISABLE
        // (Istio's buildInboundListeners); its chain sees the protocol after TLS.
        let user_tls = p
            .tls
            .as_ref()
            .filter(|_| mtls.for_port(p.port) == MtlsMode::Disable);
        let p = &match user_tls {
            Some(_) => InboundPort {
                protocol: inbound_tls::after_termination(p.protocol),
                ..p.clone()
            },
            None => p.clone(),
        };
        let protocol = if p.protocol.is_http() {
            ChainProtocol::Http
        } else {
            ChainProtocol::Tcp
        };
        let filter = || match protocol {
            ChainProtocol::Http => {
                let env_route = default_inbound_route(&cluster, p.port, p.protocol);
                let mut hcm = sidecar_hcm(
                    format!("inbound_{chain_name}"),
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
                    // Istio's order: RequestAuthentication (jwt_authn), then authorization
                    // (RBAC), then gRPC-Web and the router.
                    jwt_authn::jwt_authn_filter(jwt_rules)
                        .into_iter()
                        .chain(rbac.http.iter().cloned())
                        .chain((p.protocol == Protocol::GrpcWeb).then(grpc_web_filter))
                        .chain([http_filter(ROUTER_FILTER, any(&Router::default()))])
                        .collect(),
                );
                // Istio's sidecar default: the workload learns its mTLS peer from the
                // x-forwarded-client-cert header (subject, URI SAN = SPIFFE id, DNS SANs).
                hcm.forward_client_cert_details = ForwardClientCertDetails::AppendForward as i32;
                hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
                    subject: bool_value(true),
                    uri: true,
                    dns: true,
                    ..Default::default()
                });
                Filter {
                    name: HCM_FILTER.to_string(),
                    config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
                }
            }
            ChainProtocol::Tcp => tcp_proxy_filter(
                &cluster,
                tcp_proxy::ClusterSpecifier::Cluster(cluster.clone()),
                Vec::new(),
            ),
        };
        let filters = || match protocol {
            ChainProtocol::Http => vec![filter()],
            ChainProtocol::Tcp => with_rbac(&rbac.network, filter()),
        };
        if let Some(tls) = user_tls {
            chains.push(inbound_tls::chain(
                &chain_name,
                p.port,
                &tls.value,
                filters(),
            ));
            continue;
        }
        chains.extend(mtls_chains(
            &chain_name,
            Some(p.port),
            mtls.for_port(p.port),
            protocol,
            trust_domain,
            filters,
        ));
    }
    let mut listener_filters = vec![ListenerFilter {
        name: "envoy.filters.listener.original_dst".to_string(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any(
            &OriginalDst::default(),
        ))),
        ..Default::default()
    }];
    listener_filters.extend(inbound_mtls::tls_inspector(&chains));
    Listener {
        name: names::VIRTUAL_INBOUND.to_string(),
        address: Some(socket_address("0.0.0.0", names::VIRTUAL_INBOUND_PORT)),
        traffic_direction: TrafficDirection::Inbound as i32,
        listener_filters,
        // Istio: no listener-filter timeout (meshConfig.protocolDetectionTimeout 0s), and a
        // connection whose detection times out still gets a chain.
        listener_filters_timeout: zero_duration(),
        continue_on_listener_filters_timeout: true,
        filter_chains: chains,
        ..Default::default()
    }
}

/// The name of an inbound port's chains (and of its own listener when bound): Istio's
/// `<bind>_<port>`, `0.0.0.0` without a Sidecar ingress `bind`.
fn inbound_chain_name(p: &InboundPort) -> String {
    format!("{}_{}", p.bind.as_deref().unwrap_or("0.0.0.0"), p.port)
}

/// The listeners of a Sidecar's ingress listeners with `captureMode: NONE` (Istio's
/// `inboundCustomListener`): each bound to `<bind>:<port>`, named `<bind>_<port>`, with the
/// port's chains exactly as `virtualInbound` would carry them (PeerAuthentication mode
/// included), no original-destination filter (nothing is redirected to it) and the TLS
/// inspector where a chain matches on TLS.
pub fn bound_inbound_listeners(
    inbound: &[InboundPort],
    mtls: &EffectiveMtls,
    jwt_rules: &[ResolvedJwtRule],
    trust_domain: &str,
    rbac: &InboundRbac,
) -> Vec<Listener> {
    inbound
        .iter()
        .filter(|p| p.bound)
        .map(|p| {
            let name = inbound_chain_name(p);
            let unbound = InboundPort {
                bound: false,
                ..p.clone()
            };
            let chains: Vec<FilterChain> = sidecar_inbound_listener(
                std::slice::from_ref(&unbound),
                mtls,
                jwt_rules,
                trust_domain,
                rbac,
            )
            .filter_chains
            .into_iter()
            .filter(|c| c.name == name)
            .collect();
            Listener {
                name,
                address: Some(listener_address(
                    p.bind.as_deref().unwrap_or("0.0.0.0"),
                    p.port,
                )),
                traffic_direction: TrafficDirection::Inbound as i32,
                listener_filters: inbound_mtls::tls_inspector(&chains).into_iter().collect(),
                listener_filters_timeout: zero_duration(),
                continue_on_listener_filters_timeout: true,
                // Istio's MAX_CONNECTIONS_PER_SOCKET_EVENT_LOOP default, on listeners that
                // bind.
                max_connections_to_accept_per_socket_event: u32_value(1),
                filter_chains: chains,
                ..Default::default()
            }
        })
        .collect()
}

/// The address of a listener at `bind` (an IP, or a Unix domain socket `unix://path`,
/// Istio's `BuildAddress`) and `port`.
pub fn listener_address(
    bind: &str,
    port: u32,
) -> envoy_types::pb::envoy::config::core::v3::Address {
    use envoy_types::pb::envoy::config::core::v3::{Address, Pipe, address};
    match bind.strip_prefix("unix://") {
        Some(path) => Address {
            address: Some(address::Address::Pipe(Pipe {
                path: path.to_string(),
                ..Default::default()
            })),
        },
        None => socket_address(bind, port),
    }
}

/// `terminal` behind the RBAC network filters.
fn with_rbac(rbac: &[Filter], terminal: Filter) -> Vec<Filter> {
    rbac.iter().cloned().chain([terminal]).collect()
}

/// The filter chains of one port (`None`: the passthrough, any port) in `mode`, named
/// `name`; `filters` builds each chain's filters.
fn mtls_chains(
    name: &str,
    port: Option<u32>,
    mode: MtlsMode,
    protocol: ChainProtocol,
    trust_domain: &str,
    filters: impl Fn() -> Vec<Filter>,
) -> Vec<FilterChain> {
    inbound_mtls::chain_options(mode, protocol)
        .iter()
        .map(|option| FilterChain {
            name: name.to_string(),
            filter_chain_match: Some(FilterChainMatch {
                destination_port: port.and_then(u32_value),
                transport_protocol: option.transport.to_string(),
                application_protocols: option.alpn.iter().map(|a| a.to_string()).collect(),
                ..Default::default()
            }),
            filters: filters(),
            transport_socket: option
                .terminate_tls
                .then(|| inbound_mtls::downstream_tls(protocol, trust_domain)),
            ..Default::default()
        })
        .collect()
}

fn default_inbound_route(
    cluster: &str,
    port: u32,
    protocol: Protocol,
) -> envoy_types::pb::envoy::config::route::v3::Route {
    use super::route::route_match;
    use envoy_types::pb::envoy::config::route::v3::{
        Decorator, RetryPolicy, Route, RouteAction,
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
            // Istio >= 1.24 (ENABLE_INBOUND_RETRY_POLICY): a request the application's
            // connection reset before it was sent is retried; not for gRPC, whose
            // streams this breaks.
            retry_policy: (!matches!(protocol, Protocol::Grpc | Protocol::GrpcWeb)).then(|| {
                RetryPolicy {
                    retry_on: "reset-before-request".to_string(),
                    num_retries: u32_value(2),
                    ..Default::default()
                }
            }),
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// Proxyless clients' listeners: one `api_listener` per whole-service cluster.
pub fn proxyless_listeners(plan: &OutboundPlan) -> Vec<Listener> {
    plan.clusters()
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
