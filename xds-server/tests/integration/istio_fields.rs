//! Istio fields translated since issue 15, each asserted on the Envoy field it becomes,
//! over the `istio-fields` golden case (whose files show the whole output).

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener, filter};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    TcpProxy, tcp_proxy::ClusterSpecifier,
};
use envoy_types::pb::envoy::extensions::transport_sockets::proxy_protocol::v3::ProxyProtocolUpstreamTransport;
use pilotfish_mesh::model::Proxy;
use pilotfish_xds::ads::XdsType;
use pilotfish_xds::generate::GeneratedSnapshot;
use prost::Message;

use super::golden::case_snapshot;

fn snapshot() -> (GeneratedSnapshot, Proxy, Proxy) {
    case_snapshot("istio-fields", None, "client")
}

fn listener(snapshot: &GeneratedSnapshot, proxy: &Proxy, name: &str) -> Listener {
    let all = snapshot.all(proxy, XdsType::Listener);
    let r = all.get(name).unwrap_or_else(|| panic!("listener {name}"));
    Listener::decode(r.body.value.as_slice()).expect("decodes")
}

fn cluster(snapshot: &GeneratedSnapshot, proxy: &Proxy, name: &str) -> Cluster {
    let all = snapshot.all(proxy, XdsType::Cluster);
    let r = all.get(name).unwrap_or_else(|| panic!("cluster {name}"));
    Cluster::decode(r.body.value.as_slice()).expect("decodes")
}

fn tcp_proxy(chain: &FilterChain) -> TcpProxy {
    let f = chain.filters.last().expect("a filter");
    let Some(filter::ConfigType::TypedConfig(a)) = &f.config_type else {
        panic!("typed config expected")
    };
    TcpProxy::decode(a.value.as_slice()).expect("tcp_proxy")
}

fn destination(chain: &FilterChain) -> Vec<(String, u32)> {
    match tcp_proxy(chain).cluster_specifier {
        Some(ClusterSpecifier::Cluster(c)) => vec![(c, 1)],
        Some(ClusterSpecifier::WeightedClusters(w)) => {
            w.clusters.into_iter().map(|c| (c.name, c.weight)).collect()
        }
        None => Vec::new(),
    }
}

/// (prefix ranges as `ip/len`, server names) of a chain.
fn chain_match(chain: &FilterChain) -> (Vec<String>, Vec<String>) {
    chain
        .filter_chain_match
        .as_ref()
        .map_or_else(Default::default, |m| {
            (
                m.prefix_ranges
                    .iter()
                    .map(|r| {
                        format!(
                            "{}/{}",
                            r.address_prefix,
                            r.prefix_len.as_ref().map_or(0, |l| l.value)
                        )
                    })
                    .collect(),
                m.server_names.clone(),
            )
        })
}

#[test]
fn tcp_destination_subnets_become_prefix_ranges() {
    let (snapshot, sidecar, _) = snapshot();
    let l = listener(&snapshot, &sidecar, "10.96.20.1_9000");
    let chains: Vec<_> = l
        .filter_chains
        .iter()
        .map(|c| (chain_match(c), destination(c)))
        .collect();
    assert_eq!(
        chains,
        [
            (
                (vec!["10.96.20.0/24".to_string()], vec![]),
                vec![(
                    "outbound|9000|v2|echo.default.svc.cluster.local".to_string(),
                    1
                )]
            ),
            (
                (vec![], vec![]),
                vec![(
                    "outbound|9000|v1|echo.default.svc.cluster.local".to_string(),
                    1
                )]
            ),
        ],
        "the subnet route first, then the route without a subnet as the default"
    );
    assert!(l.listener_filters.is_empty(), "no SNI, no TLS inspector");
}

#[test]
fn tls_routes_match_sni_with_the_tls_inspector() {
    let (snapshot, sidecar, _) = snapshot();
    // A service with a virtual IP: its own listener, one chain per SNI, no default.
    let l = listener(&snapshot, &sidecar, "10.96.20.2_8443");
    let chains: Vec<_> = l
        .filter_chains
        .iter()
        .map(|c| (chain_match(c).1, destination(c)))
        .collect();
    assert_eq!(
        chains,
        [
            (
                vec!["v1.secure.example".to_string()],
                vec![(
                    "outbound|8443|v1|secure.default.svc.cluster.local".to_string(),
                    1
                )]
            ),
            (
                vec!["secure.example".to_string()],
                vec![(
                    "outbound|8443||secure.default.svc.cluster.local".to_string(),
                    1
                )]
            ),
        ]
    );
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.tls_inspector"
    );
    // ServiceEntry hosts without addresses: the shared listener, each SNI once although
    // the VirtualService comes with both hosts, the weighted split as weighted_clusters.
    let l = listener(&snapshot, &sidecar, "0.0.0.0_443");
    let sni: Vec<_> = l
        .filter_chains
        .iter()
        .map(|c| (chain_match(c).1, destination(c)))
        .collect();
    assert_eq!(
        sni,
        [
            (
                vec!["pay-eu.example.com".to_string()],
                vec![("outbound|443||pay-eu.example.com".to_string(), 1)]
            ),
            (
                vec!["pay.example.com".to_string()],
                vec![
                    ("outbound|443||pay.example.com".to_string(), 80),
                    ("outbound|443||pay-eu.example.com".to_string(), 20)
                ]
            ),
            (vec![], vec![("PassthroughCluster".to_string(), 1)]),
        ]
    );
    assert_eq!(
        l.listener_filters[0].name,
        "envoy.filters.listener.tls_inspector"
    );
}

fn typed<M: Message + Default>(socket: &TransportSocket) -> M {
    let Some(transport_socket::ConfigType::TypedConfig(a)) = &socket.config_type else {
        panic!("typed config expected")
    };
    M::decode(a.value.as_slice()).expect("decodes")
}

#[test]
fn proxy_protocol_wraps_the_transport_socket() {
    let (snapshot, sidecar, proxyless) = snapshot();
    let plain = cluster(
        &snapshot,
        &sidecar,
        "outbound|9000||echo.default.svc.cluster.local",
    );
    // No DestinationRule TLS: auto mTLS's two matches, each behind the PROXY header (as
    // Istio wraps them).
    assert!(plain.transport_socket.is_none());
    let inner: Vec<String> = plain
        .transport_socket_matches
        .iter()
        .map(|m| {
            let socket = m.transport_socket.as_ref().expect("a transport socket");
            assert_eq!(
                socket.name,
                "envoy.transport_sockets.upstream_proxy_protocol"
            );
            let pp: ProxyProtocolUpstreamTransport = typed(socket);
            assert_eq!(pp.config.unwrap().version, 1, "V2");
            pp.transport_socket.unwrap().name
        })
        .collect();
    assert_eq!(
        inner,
        [
            "envoy.transport_sockets.tls",
            "envoy.transport_sockets.raw_buffer"
        ],
        "mTLS to sidecars, plaintext (raw_buffer) to the rest"
    );
    let tls = cluster(
        &snapshot,
        &sidecar,
        "outbound|8443|v1|secure.default.svc.cluster.local",
    );
    let pp: ProxyProtocolUpstreamTransport = typed(&tls.transport_socket.unwrap());
    assert_eq!(pp.config.unwrap().version, 0, "V1 when unset");
    assert_eq!(
        pp.transport_socket.unwrap().name,
        "envoy.transport_sockets.tls",
        "the TLS socket is wrapped"
    );
    let grpc = cluster(
        &snapshot,
        &proxyless,
        "outbound|9000||echo.default.svc.cluster.local",
    );
    assert!(
        grpc.transport_socket.is_none(),
        "gRPC has no PROXY protocol"
    );
}

#[test]
fn retry_budget_is_the_circuit_breakers_budget() {
    let (snapshot, sidecar, proxyless) = snapshot();
    let budget = |c: Cluster| {
        c.circuit_breakers.unwrap().thresholds[0]
            .retry_budget
            .map(|b| {
                (
                    b.budget_percent.unwrap().value,
                    b.min_retry_concurrency.unwrap().value,
                )
            })
    };
    assert_eq!(
        budget(cluster(
            &snapshot,
            &sidecar,
            "outbound|9000|v2|echo.default.svc.cluster.local"
        )),
        Some((25.0, 5))
    );
    assert_eq!(
        budget(cluster(
            &snapshot,
            &sidecar,
            "outbound|8443||secure.default.svc.cluster.local"
        )),
        Some((20.0, 3)),
        "Istio's defaults"
    );
    assert_eq!(
        budget(cluster(
            &snapshot,
            &proxyless,
            "outbound|9000||echo.default.svc.cluster.local"
        )),
        None
    );
}

#[test]
fn tunnel_becomes_the_tcp_proxy_tunneling_config() {
    let (snapshot, sidecar, _) = snapshot();
    let tunnel = |chain: &FilterChain| {
        tcp_proxy(chain)
            .tunneling_config
            .map(|t| (t.hostname, t.use_post))
    };
    let echo = listener(&snapshot, &sidecar, "10.96.20.1_9000");
    assert_eq!(
        tunnel(&echo.filter_chains[0]),
        None,
        "subset v2 has no tunnel"
    );
    assert_eq!(
        tunnel(&echo.filter_chains[1]),
        Some(("echo-v1.internal:9000".to_string(), false)),
        "subset v1's own tunnel"
    );
    let secure = listener(&snapshot, &sidecar, "10.96.20.2_8443");
    assert_eq!(
        tunnel(&secure.filter_chains[0]),
        None,
        "a route naming a subset reads only the subset's tunnel (Istio)"
    );
    assert_eq!(
        tunnel(&secure.filter_chains[1]),
        Some(("secure.internal:8443".to_string(), false))
    );
    let shared = listener(&snapshot, &sidecar, "0.0.0.0_443");
    assert_eq!(
        tunnel(&shared.filter_chains[1]),
        Some(("pay.example.com:8443".to_string(), true)),
        "a split uses the rule of its first destination, POST"
    );
}

#[test]
fn tcp_idle_timeout_reaches_tcp_proxy_and_cluster() {
    let (snapshot, sidecar, _) = snapshot();
    let echo = listener(&snapshot, &sidecar, "10.96.20.1_9000");
    for chain in &echo.filter_chains {
        assert_eq!(tcp_proxy(chain).idle_timeout.unwrap().seconds, 3600);
    }
    let c = cluster(
        &snapshot,
        &sidecar,
        "outbound|9000||echo.default.svc.cluster.local",
    );
    let options = c
        .typed_extension_protocol_options
        .get("envoy.extensions.upstreams.http.v3.HttpProtocolOptions")
        .expect("HTTP protocol options, as Istio attaches them to TCP clusters too");
    let options =
        envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions::decode(
            options.value.as_slice(),
        )
        .unwrap();
    assert_eq!(
        options
            .common_http_protocol_options
            .unwrap()
            .idle_timeout
            .unwrap()
            .seconds,
        3600
    );
}

#[test]
fn warmup_becomes_slow_start_of_round_robin_and_least_request() {
    use envoy_types::pb::envoy::config::cluster::v3::cluster::LbConfig;
    let (snapshot, sidecar, proxyless) = snapshot();
    let c = cluster(
        &snapshot,
        &sidecar,
        "outbound|8080||web.default.svc.cluster.local",
    );
    let Some(LbConfig::RoundRobinLbConfig(rr)) = c.lb_config else {
        panic!("round robin config expected")
    };
    let s = rr.slow_start_config.unwrap();
    assert_eq!(s.slow_start_window.unwrap().seconds, 60);
    assert_eq!(s.aggression.unwrap().default_value, 2.0);
    assert_eq!(s.min_weight_percent.unwrap().value, 20.0);
    let c = cluster(
        &snapshot,
        &sidecar,
        "outbound|8080|v1|web.default.svc.cluster.local",
    );
    let Some(LbConfig::LeastRequestLbConfig(lr)) = c.lb_config else {
        panic!("least request config expected")
    };
    let s = lr.slow_start_config.unwrap();
    assert_eq!(
        (
            s.slow_start_window.unwrap().seconds,
            s.aggression,
            s.min_weight_percent
        ),
        (30, None, None),
        "warmupDurationSecs sets the window only"
    );
    let c = cluster(
        &snapshot,
        &proxyless,
        "outbound|8080||web.default.svc.cluster.local",
    );
    assert!(c.lb_config.is_none(), "gRPC has no slow start");
}

#[test]
fn cookie_attributes_reach_the_hash_policy() {
    use envoy_types::pb::envoy::config::route::v3::{
        RouteConfiguration, route::Action, route_action::hash_policy::PolicySpecifier,
    };
    let (snapshot, sidecar, _) = snapshot();
    let all = snapshot.all(&sidecar, XdsType::Route);
    let rc = RouteConfiguration::decode(
        all["web.default.svc.cluster.local:8080"]
            .body
            .value
            .as_slice(),
    )
    .unwrap();
    let Some(Action::Route(action)) = &rc.virtual_hosts[0].routes[0].action else {
        panic!("route action expected")
    };
    let Some(PolicySpecifier::Cookie(cookie)) = &action.hash_policy[0].policy_specifier else {
        panic!("cookie hash policy expected")
    };
    let attributes: Vec<(&str, &str)> = cookie
        .attributes
        .iter()
        .map(|a| (a.name.as_str(), a.value.as_str()))
        .collect();
    assert_eq!(attributes, [("SameSite", "Strict"), ("Secure", "")]);
}

#[test]
fn ca_crl_is_the_validation_context_crl_file() {
    use envoy_types::pb::envoy::config::core::v3::data_source::Specifier;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        UpstreamTlsContext, common_tls_context::ValidationContextType,
    };
    let (snapshot, sidecar, _) = snapshot();
    let c = cluster(&snapshot, &sidecar, "outbound|9443||bank.example.com");
    let tls: UpstreamTlsContext = typed(&c.transport_socket.unwrap());
    let Some(ValidationContextType::CombinedValidationContext(v)) =
        tls.common_tls_context.unwrap().validation_context_type
    else {
        panic!("combined validation context expected")
    };
    assert_eq!(
        v.default_validation_context.unwrap().crl.unwrap().specifier,
        Some(Specifier::Filename("/etc/certs/bank.crl".into()))
    );
}

fn verified_sans(c: Cluster) -> Vec<(String, i32)> {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        UpstreamTlsContext, common_tls_context::ValidationContextType,
    };
    use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
    let tls: UpstreamTlsContext = typed(&c.transport_socket.unwrap());
    let Some(ValidationContextType::CombinedValidationContext(v)) =
        tls.common_tls_context.unwrap().validation_context_type
    else {
        panic!("combined validation context expected")
    };
    v.default_validation_context
        .unwrap()
        .match_typed_subject_alt_names
        .into_iter()
        .map(|m| {
            let Some(MatchPattern::Exact(s)) = m.matcher.unwrap().match_pattern else {
                panic!("exact match expected")
            };
            (s, m.san_type)
        })
        .collect()
}

#[test]
fn service_entry_identities_are_the_verified_sans() {
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        UpstreamTlsContext, common_tls_context::ValidationContextType,
        subject_alt_name_matcher::SanType,
    };
    let (snapshot, sidecar, proxyless) = snapshot();
    let uri = SanType::Uri as i32;
    // ISTIO_MUTUAL: subjectAltNames plus the endpoints' service accounts as SPIFFE ids,
    // for the whole service and its subsets alike.
    for name in [
        "outbound|7070||vms.mesh.internal",
        "outbound|7070|vpc-1|vms.mesh.internal",
    ] {
        assert_eq!(
            verified_sans(cluster(&snapshot, &sidecar, name)),
            [
                ("spiffe://cluster.local/ns/default/sa/vm".to_string(), uri),
                (
                    "spiffe://cluster.local/ns/default/sa/vm-legacy".to_string(),
                    uri
                )
            ],
            "{name}"
        );
    }
    // Kubernetes Pods' service accounts too.
    assert_eq!(
        verified_sans(cluster(
            &snapshot,
            &sidecar,
            "outbound|8443||secure.default.svc.cluster.local"
        )),
        [(
            "spiffe://cluster.local/ns/default/sa/secure".to_string(),
            uri
        )]
    );
    // SIMPLE origination to a ServiceEntry host whose rule names no SANs: the entry's.
    assert_eq!(
        verified_sans(cluster(
            &snapshot,
            &sidecar,
            "outbound|9443||bank.example.com"
        )),
        [("api.bank.example.com".to_string(), SanType::Dns as i32)]
    );
    // gRPC reads `match_subject_alt_names`.
    let c = cluster(&snapshot, &proxyless, "outbound|7070||vms.mesh.internal");
    let tls: UpstreamTlsContext = typed(&c.transport_socket.unwrap());
    let Some(ValidationContextType::ValidationContext(v)) =
        tls.common_tls_context.unwrap().validation_context_type
    else {
        panic!("validation context expected")
    };
    #[allow(deprecated)]
    let sans: Vec<String> = v
        .match_subject_alt_names
        .iter()
        .map(|m| format!("{:?}", m.match_pattern))
        .collect();
    assert_eq!(sans.len(), 2, "{sans:?}");
    assert!(sans[0].contains("sa/vm\""), "{sans:?}");
}

#[test]
fn endpoint_network_is_a_label_subsets_select() {
    use envoy_types::pb::envoy::config::core::v3::address;
    use envoy_types::pb::envoy::config::endpoint::v3::{
        ClusterLoadAssignment, lb_endpoint::HostIdentifier,
    };
    let (snapshot, sidecar, _) = snapshot();
    let all = snapshot.all(&sidecar, XdsType::Endpoint);
    let addresses = |name: &str| -> Vec<String> {
        let cla = ClusterLoadAssignment::decode(all[name].body.value.as_slice()).unwrap();
        cla.endpoints
            .iter()
            .flat_map(|l| &l.lb_endpoints)
            .filter_map(|e| {
                let Some(HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                    return None;
                };
                let Some(address::Address::SocketAddress(sa)) =
                    ep.address.as_ref()?.address.as_ref()
                else {
                    return None;
                };
                Some(sa.address.clone())
            })
            .collect()
    };
    assert_eq!(
        addresses("outbound|7070|vpc-1|vms.mesh.internal"),
        ["10.3.0.1", "10.3.0.3"],
        "network vpc-1, and the endpoint whose own label says vpc-1"
    );
    assert_eq!(addresses("outbound|7070||vms.mesh.internal").len(), 3);
}
