//! A proxyless gRPC server's listeners, as Istio 1.30's grpcgen builds them
//! (`pilot/pkg/networking/grpcgen/lds.go`, gRFC A36): a gRPC server started with
//! `xds=True` asks LDS for `xds.istio.io/grpc/lds/inbound/<ip>:<port>` (its bootstrap's
//! `server_listener_resource_name_template`, `<ip>:<port>` being the address it binds).
//!
//! - The workload is the proxy itself (its namespace and labels, as for a sidecar's
//!   inbound side); the name's port must be one of its inbound ports (a target port of a
//!   Service selecting it), else the listener does not exist — Istio leaves it out of the
//!   response, and gRPC then serves nothing on that port. The name's IP is only the
//!   listener's address.
//! - One filter chain, no listener filters (gRPC rejects them) and no chain match:
//!   STRICT terminates mutual TLS (`DownstreamTlsContext`, client certificate required,
//!   workload certificate and root from the bootstrap's certificate-provider instance
//!   `default`); DISABLE is plaintext. PERMISSIVE is already mapped by the scope
//!   ([`super::scope::proxyless_server_mtls`]).
//! - The chain's HTTP connection manager carries its route configuration inline (one
//!   virtual host `*`, one route `/` with `non_forwarding_action`, which is what gRPC
//!   servers accept), and the HTTP filters it is given — the AuthorizationPolicies' RBAC
//!   filters (`super::rbac::proxyless_http_filters`) — before the router, last.

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use envoy_types::pb::envoy::config::route::v3::{
    NonForwardingAction, Route, RouteConfiguration, RouteMatch, VirtualHost, route,
    route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter,
    http_connection_manager::{CodecType, RouteSpecifier},
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use pilotfish_mesh::api::MtlsMode;
use pilotfish_mesh::push_context::EffectiveMtls;

use super::eds::socket_address;
use super::names;
use super::route::{ROUTER_FILTER, http_filter};
use super::tls::{TLS_TRANSPORT_SOCKET, proxyless_common_tls};
use super::util::{any, bool_value};

/// The network filter gRPC requires as a server chain's only filter.
const HCM_FILTER: &str = "envoy.filters.network.http_connection_manager";
/// The inline route configuration's name (Istio's).
const ROUTE_CONFIG: &str = "inbound";

/// The listeners among `names` that exist for a workload serving `ports` (its inbound
/// ports) with `mtls` (already mapped for gRPC); each chain's HTTP filters are
/// `http_filters` followed by the router. Names that are not server listener names, or
/// whose port the workload does not serve, yield nothing.
pub fn server_listeners<'a>(
    names: impl IntoIterator<Item = &'a str>,
    ports: &[u32],
    mtls: &EffectiveMtls,
    http_filters: &[HttpFilter],
) -> Vec<Listener> {
    names
        .into_iter()
        .filter_map(|name| {
            let (host, port) = names::parse_server_listener(name)?;
            ports.contains(&port).then(|| Listener {
                name: name.to_string(),
                address: Some(socket_address(host, port)),
                filter_chains: vec![filter_chain(port, mtls.for_port(port), http_filters)],
                ..Default::default()
            })
        })
        .collect()
}

fn filter_chain(port: u32, mode: MtlsMode, http_filters: &[HttpFilter]) -> FilterChain {
    let mtls = mode == MtlsMode::Strict;
    let mut filters = http_filters.to_vec();
    filters.push(http_filter(ROUTER_FILTER, any(&Router::default())));
    let hcm = HttpConnectionManager {
        stat_prefix: format!("inbound_{port}"),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(RouteSpecifier::RouteConfig(RouteConfiguration {
            name: ROUTE_CONFIG.to_string(),
            virtual_hosts: vec![VirtualHost {
                name: ROUTE_CONFIG.to_string(),
                domains: vec!["*".to_string()],
                routes: vec![Route {
                    r#match: Some(RouteMatch {
                        path_specifier: Some(PathSpecifier::Prefix("/".to_string())),
                        ..Default::default()
                    }),
                    action: Some(route::Action::NonForwardingAction(NonForwardingAction {})),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        })),
        http_filters: filters,
        ..Default::default()
    };
    FilterChain {
        name: if mtls {
            "inbound-mtls"
        } else {
            "inbound-plaintext"
        }
        .to_string(),
        filters: vec![Filter {
            name: HCM_FILTER.to_string(),
            config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))),
        }],
        transport_socket: mtls.then(|| TransportSocket {
            name: TLS_TRANSPORT_SOCKET.to_string(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(any(
                &DownstreamTlsContext {
                    // No SANs: gRPC refuses SAN matching on servers; any identity the mesh
                    // root signed is accepted (AuthorizationPolicy decides who may call).
                    common_tls_context: Some(proxyless_common_tls(&[])),
                    require_client_certificate: bool_value(true),
                    ..Default::default()
                },
            ))),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
    use prost::Message;
    use std::collections::BTreeMap;

    fn mtls(mode: MtlsMode, per_port: &[(u32, MtlsMode)]) -> EffectiveMtls {
        EffectiveMtls {
            mode,
            per_port: per_port.iter().copied().collect::<BTreeMap<_, _>>(),
        }
    }

    fn tls_of(chain: &FilterChain) -> Option<DownstreamTlsContext> {
        let socket = chain.transport_socket.as_ref()?;
        let Some(transport_socket::ConfigType::TypedConfig(config)) = &socket.config_type else {
            panic!("typed config expected");
        };
        Some(DownstreamTlsContext::decode(config.value.as_slice()).unwrap())
    }

    fn hcm_of(chain: &FilterChain) -> HttpConnectionManager {
        let Some(filter::ConfigType::TypedConfig(config)) = &chain.filters[0].config_type else {
            panic!("typed config expected");
        };
        HttpConnectionManager::decode(config.value.as_slice()).unwrap()
    }

    #[test]
    fn only_served_ports_get_a_listener_named_as_asked() {
        let names = [
            "xds.istio.io/grpc/lds/inbound/0.0.0.0:8080",
            "xds.istio.io/grpc/lds/inbound/[::]:8080",
            "xds.istio.io/grpc/lds/inbound/10.0.0.7:9090",
            "xds.istio.io/grpc/lds/inbound/10.0.0.7:",
            "xds.istio.io/grpc/lds/inbound/::1:8080",
            "reviews.default.svc.cluster.local:8080",
        ];
        let listeners = server_listeners(names, &[8080], &mtls(MtlsMode::Strict, &[]), &[]);
        let got: Vec<(&str, String)> = listeners
            .iter()
            .map(|l| (l.name.as_str(), format!("{:?}", l.address)))
            .collect();
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0].0, names[0]);
        assert!(got[0].1.contains("0.0.0.0"));
        assert_eq!(got[1].0, names[1]);
        assert!(got[1].1.contains("\"::\""), "{}", got[1].1);
        assert!(listeners.iter().all(|l| l.listener_filters.is_empty()));
    }

    #[test]
    fn strict_terminates_mtls_with_the_certificate_providers_and_disable_is_plaintext() {
        let name = ["xds.istio.io/grpc/lds/inbound/127.0.0.1:8080"];
        let strict = &server_listeners(name, &[8080], &mtls(MtlsMode::Strict, &[]), &[])[0];
        let chain = &strict.filter_chains[0];
        assert_eq!(chain.name, "inbound-mtls");
        assert!(chain.filter_chain_match.is_none());
        let tls = tls_of(chain).expect("mTLS");
        assert_eq!(tls.require_client_certificate, bool_value(true));
        let common = tls.common_tls_context.unwrap();
        let cert = common.tls_certificate_provider_instance.unwrap();
        assert_eq!(
            (cert.instance_name.as_str(), cert.certificate_name.as_str()),
            ("default", "default")
        );
        let Some(ValidationContextType::ValidationContext(v)) = common.validation_context_type
        else {
            panic!("a plain validation context");
        };
        let root = v.ca_certificate_provider_instance.unwrap();
        assert_eq!(
            (root.instance_name.as_str(), root.certificate_name.as_str()),
            ("default", "ROOTCA")
        );
        #[allow(deprecated)]
        let sans = v.match_subject_alt_names;
        assert!(sans.is_empty(), "gRPC servers refuse SAN matching");

        // Port-level DISABLE over a STRICT workload.
        let disabled = &server_listeners(
            name,
            &[8080],
            &mtls(MtlsMode::Strict, &[(8080, MtlsMode::Disable)]),
            &[],
        )[0];
        assert_eq!(disabled.filter_chains[0].name, "inbound-plaintext");
        assert!(tls_of(&disabled.filter_chains[0]).is_none());
    }

    #[test]
    fn the_router_comes_last_after_the_given_filters_and_routes_do_not_forward() {
        let rbac = http_filter("envoy.filters.http.rbac", any(&Router::default()));
        let l = &server_listeners(
            ["xds.istio.io/grpc/lds/inbound/127.0.0.1:8080"],
            &[8080],
            &mtls(MtlsMode::Disable, &[]),
            std::slice::from_ref(&rbac),
        )[0];
        let hcm = hcm_of(&l.filter_chains[0]);
        let names: Vec<&str> = hcm.http_filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["envoy.filters.http.rbac", ROUTER_FILTER]);
        let Some(RouteSpecifier::RouteConfig(rc)) = hcm.route_specifier else {
            panic!("inline route configuration");
        };
        let route = &rc.virtual_hosts[0].routes[0];
        assert!(matches!(
            route.action,
            Some(route::Action::NonForwardingAction(_))
        ));
    }
}
