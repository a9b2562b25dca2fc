//! CDS: clusters from the outbound plan, with the DestinationRule traffic policy mapped as
//! Istio maps it — load balancer (ring hash / maglev for consistent hashing), locality
//! weighting, circuit breakers from the connection pool, outlier detection, HTTP protocol
//! options, client TLS — plus, for sidecars, the inbound clusters of the workload's own
//! ports and `PassthroughCluster`, `BlackHoleCluster` and `InboundPassthroughCluster`.
//!
//! Proxyless gRPC clusters carry only what gRPC's xDS client accepts: EDS discovery from
//! ADS, round robin or ring hash, `max_requests`, outlier detection and certificate-provider
//! TLS; everything else is left out with a log line and a metric.

use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlier, UpstreamConnectionOptions,
    circuit_breakers::Thresholds,
    cluster::{
        ClusterDiscoveryType, CommonLbConfig, DiscoveryType, DnsLookupFamily, EdsClusterConfig,
        LbConfig, LbPolicy, MaglevLbConfig, OriginalDstLbConfig, RingHashLbConfig,
        common_lb_config::{LocalityConfigSpecifier, LocalityWeightedLbConfig},
    },
};
use envoy_types::pb::envoy::config::core::v3::{
    BindConfig, Http1ProtocolOptions, Http2ProtocolOptions, HttpProtocolOptions as CoreHttpOptions,
    RoutingPriority, SocketAddress, TcpKeepalive, UpstreamHttpProtocolOptions,
    socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions,
    http_protocol_options::{
        ExplicitHttpConfig, UpstreamProtocolOptions, UseDownstreamHttpConfig,
        explicit_http_config::ProtocolConfig,
    },
};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::UInt64Value;
use pilotfish_mesh::api::{
    ClientTlsSettings, ConnectionPoolSettings, H2UpgradePolicy, LoadBalancerSettings,
    OutlierDetection, SimpleLb, TlsMode,
};
use pilotfish_mesh::model::{Protocol, Resolution, ServiceOrigin, TargetPort};
use pilotfish_mesh::push_context::PushContext;

use super::auto_mtls::{self, AutoMtls, socket_matches};
use super::eds::socket_address;
use super::eds::{cluster_endpoints, dns_load_assignment};
use super::findings::{Downgrade, Finding};
use super::identities::{service_accounts, with_default_sans};
use super::names;
use super::plan::{ClusterPlan, Discovery, OutboundPlan};
use super::scope::{Flavor, InboundEndpoint, InboundPort};
use super::tls::{auto_sni_and_san, transport_socket};
use super::upstream::{apply_connection_options, slow_start_lb_config};
use super::util::{ads_config_source, any, api_duration, duration, u32_value};
use envoy_types::pb::envoy::config::core::v3::{Address, Pipe, address};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as EnvoyEndpoint, LbEndpoint, LocalityLbEndpoints,
    lb_endpoint::HostIdentifier,
};

/// The key Envoy reads upstream HTTP options under.
pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// Istio's default ring size for consistent hashing.
const DEFAULT_RING_SIZE: u64 = 1024;

/// Outbound clusters of `plan`; for sidecars also Passthrough, BlackHole and
/// InboundPassthrough. What a proxyless client cannot use is noted in `findings`.
pub fn outbound_clusters(
    push: &PushContext,
    plan: &OutboundPlan,
    flavor: Flavor,
    findings: &mut Vec<Finding>,
) -> Vec<Cluster> {
    let connect_timeout = push.mesh().connect_timeout;
    let mut out: Vec<Cluster> = plan
        .clusters()
        .iter()
        .map(|c| outbound_cluster(push, c, flavor, connect_timeout, findings))
        .collect();
    if flavor == Flavor::Sidecar {
        out.push(passthrough_cluster(
            names::PASSTHROUGH_CLUSTER,
            connect_timeout,
            false,
        ));
        out.push(passthrough_cluster(
            names::INBOUND_PASSTHROUGH_CLUSTER,
            connect_timeout,
            true,
        ));
        out.push(Cluster {
            name: names::BLACKHOLE_CLUSTER.to_string(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
            connect_timeout: duration(connect_timeout),
            ..Default::default()
        });
    }
    out
}

fn outbound_cluster(
    push: &PushContext,
    plan: &ClusterPlan,
    flavor: Flavor,
    mesh_connect_timeout: std::time::Duration,
    findings: &mut Vec<Finding>,
) -> Cluster {
    let policy = &plan.policy;
    // The rule's TLS with the host's identities as SANs where Istio adds them.
    let tls = with_default_sans(policy.tls.as_ref(), push, &plan.service);
    let pool = policy.connection_pool.as_ref();
    let connect_timeout = pool
        .and_then(|p| p.tcp.as_ref())
        .and_then(|t| t.connect_timeout.as_ref())
        .map(|d| d.as_std())
        .filter(|d| !d.is_zero())
        .unwrap_or(mesh_connect_timeout);
    let mut cluster = Cluster {
        name: plan.name.clone(),
        connect_timeout: duration(connect_timeout),
        ..Default::default()
    };
    match plan.discovery {
        Discovery::Eds => {
            cluster.cluster_discovery_type =
                Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32));
            cluster.eds_cluster_config = Some(EdsClusterConfig {
                eds_config: Some(ads_config_source(flavor == Flavor::Sidecar)),
                service_name: plan.name.clone(),
            });
        }
        Discovery::StrictDns | Discovery::LogicalDns => {
            let kind = if plan.discovery == Discovery::StrictDns {
                DiscoveryType::StrictDns
            } else {
                DiscoveryType::LogicalDns
            };
            cluster.cluster_discovery_type = Some(ClusterDiscoveryType::Type(kind as i32));
            cluster.dns_lookup_family = DnsLookupFamily::V4Only as i32;
            let mut endpoints = cluster_endpoints(push, plan);
            let external;
            if endpoints.is_empty()
                && let Some(name) = &plan.service.external_name
            {
                external = pilotfish_mesh::model::Endpoint {
                    address: name.clone(),
                    port: plan.port.port,
                    labels: Default::default(),
                    locality: Default::default(),
                    health: Default::default(),
                    service_account: None,
                    weight: None,
                    network: String::new(),
                    workload: None,
                };
                endpoints.push(&external);
            }
            // LOGICAL_DNS resolves exactly one name.
            if kind == DiscoveryType::LogicalDns {
                endpoints.truncate(1);
            }
            cluster.load_assignment = Some(dns_load_assignment(plan, &endpoints, flavor));
        }
        Discovery::OriginalDst => {
            cluster.cluster_discovery_type = Some(ClusterDiscoveryType::Type(
                DiscoveryType::OriginalDst as i32,
            ));
            // Istio >= 1.22 (ENABLE_RESOLUTION_NONE_TARGET_PORT): a `resolution: NONE`
            // ServiceEntry port's `targetPort` replaces the port the client dialled.
            if let Some(target) = passthrough_target_port(plan) {
                cluster.lb_config = Some(LbConfig::OriginalDstLbConfig(OriginalDstLbConfig {
                    upstream_port_override: u32_value(target),
                    ..Default::default()
                }));
            }
        }
    }

    let lb = lb_setup(policy.load_balancer.as_ref(), flavor, &plan.name, findings);
    cluster.lb_policy = if plan.discovery == Discovery::OriginalDst {
        LbPolicy::ClusterProvided as i32
    } else {
        lb.policy as i32
    };
    if plan.discovery != Discovery::OriginalDst {
        cluster.lb_config = lb.config;
    }
    let locality_weighted = flavor == Flavor::Sidecar
        && policy
            .load_balancer
            .as_ref()
            .and_then(|l| l.locality_lb_setting.as_ref())
            .is_some_and(|l| !l.distribute.is_empty() && l.enabled != Some(false));
    // Istio turns the panic threshold off (0) with outlier detection unless
    // `minHealthPercent` says otherwise, and always when unready endpoints are sent (in
    // panic Envoy would route to them).
    let panic_threshold = if plan.service.send_unhealthy_endpoints {
        Some(0)
    } else {
        policy
            .outlier_detection
            .as_ref()
            .map(|o| o.min_health_percent.unwrap_or(0))
            .filter(|p| *p >= 0)
    };
    if flavor == Flavor::Sidecar && (locality_weighted || panic_threshold.is_some()) {
        cluster.common_lb_config = Some(CommonLbConfig {
            healthy_panic_threshold: panic_threshold.map(|p| Percent {
                value: f64::from(p.min(100)),
            }),
            locality_config_specifier: locality_weighted.then_some(
                LocalityConfigSpecifier::LocalityWeightedLbConfig(LocalityWeightedLbConfig {}),
            ),
            ..Default::default()
        });
    }

    cluster.circuit_breakers = Some(circuit_breakers(pool, flavor));
    if let Some(od) = &policy.outlier_detection {
        cluster.outlier_detection = Some(outlier_detection(od));
    }
    let mut http2 = false;
    if flavor == Flavor::Sidecar {
        if let Some(options) = tcp_keepalive(pool) {
            cluster.upstream_connection_options = Some(options);
        }
        let mut options = http_protocol_options(plan.port.protocol, pool);
        if let Some((auto_sni, auto_san_validation)) = auto_sni_and_san(tls.as_deref(), flavor) {
            // Istio sets these on every SIMPLE/MUTUAL cluster, HTTP/1.1 when nothing else
            // chose the upstream protocol.
            options
                .get_or_insert_with(|| HttpProtocolOptions {
                    upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                        ExplicitHttpConfig {
                            protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                                Http1ProtocolOptions::default(),
                            )),
                        },
                    )),
                    ..Default::default()
                })
                .upstream_http_protocol_options = Some(UpstreamHttpProtocolOptions {
                auto_sni,
                auto_san_validation,
                ..Default::default()
            });
        }
        // Istio's `isHttp2Cluster`: the upstream protocol is explicitly HTTP/2.
        http2 = options.as_ref().is_some_and(|o| {
            matches!(
                &o.upstream_protocol_options,
                Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                    ExplicitHttpConfig {
                        protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_)),
                    }
                ))
            )
        });
        if let Some(options) = options {
            cluster
                .typed_extension_protocol_options
                .insert(HTTP_PROTOCOL_OPTIONS.to_string(), any(&options));
        }
    } else if pool
        .and_then(|p| p.http.as_ref())
        .is_some_and(|h| h.idle_timeout.is_some() || h.max_requests_per_connection.is_some())
    {
        findings.push(Finding::Downgrade(Downgrade::new(
            "http_protocol_options",
            plan.name.as_str(),
            "connection pool idle timeout / max requests per connection",
        )));
    }

    let sni_parts = (
        plan.port.port,
        plan.subset.as_str(),
        plan.service.hostname.as_str(),
    );
    cluster.transport_socket = transport_socket(
        tls.as_deref(),
        flavor,
        &plan.name,
        sni_parts,
        http2,
        findings,
    );
    // Gated on the rule's TLS being absent, not on the socket: `tls: {mode: DISABLE}` is
    // the user's word and turns auto mTLS off.
    if policy.tls.is_none() && flavor == Flavor::Sidecar {
        let auto = auto_mtls::decide(push, plan);
        if auto != AutoMtls::Off {
            let istio_mutual = ClientTlsSettings {
                mode: Some(TlsMode::IstioMutual),
                subject_alt_names: service_accounts(push, &plan.service),
                ..Default::default()
            };
            let socket = transport_socket(
                Some(&istio_mutual),
                flavor,
                &plan.name,
                sni_parts,
                http2,
                findings,
            );
            match (auto, socket) {
                (AutoMtls::Always, socket) => cluster.transport_socket = socket,
                (_, Some(socket)) => cluster.transport_socket_matches = socket_matches(socket),
                (_, None) => {}
            }
        }
    }
    apply_connection_options(&mut cluster, policy, flavor, findings);
    cluster
}

/// The pool's TCP keepalive as upstream connection options.
fn tcp_keepalive(pool: Option<&ConnectionPoolSettings>) -> Option<UpstreamConnectionOptions> {
    let keepalive = pool?.tcp.as_ref()?.tcp_keepalive.as_ref()?;
    Some(UpstreamConnectionOptions {
        tcp_keepalive: Some(TcpKeepalive {
            keepalive_probes: keepalive.probes.and_then(u32_value),
            keepalive_time: keepalive
                .time
                .as_ref()
                .and_then(|d| u32_value(d.as_std().as_secs() as u32)),
            keepalive_interval: keepalive
                .interval
                .as_ref()
                .and_then(|d| u32_value(d.as_std().as_secs() as u32)),
        }),
        ..Default::default()
    })
}

/// The `targetPort` of a `resolution: NONE` ServiceEntry's port, when it is set.
fn passthrough_target_port(plan: &ClusterPlan) -> Option<u32> {
    let entry = matches!(plan.service.origin, ServiceOrigin::ServiceEntry { .. })
        && plan.service.resolution == Resolution::Passthrough;
    match &plan.port.target_port {
        Some(TargetPort::Number(n)) if entry => Some(*n),
        _ => None,
    }
}

/// The load balancer of a cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct LbSetup {
    pub policy: LbPolicy,
    pub config: Option<LbConfig>,
}

/// Maps Istio's `loadBalancer` to Envoy's policy. Sidecars default to `LEAST_REQUEST`
/// (Istio's default); consistent hashing is ring hash unless `maglev` is asked for.
/// Proxyless clients get round robin or ring hash only: gRPC rejects a cluster whose
/// policy it lacks, so other choices fall back with a log line and a metric.
pub fn lb_setup(
    lb: Option<&LoadBalancerSettings>,
    flavor: Flavor,
    cluster: &str,
    findings: &mut Vec<Finding>,
) -> LbSetup {
    if let Some(hash) = lb.and_then(|l| l.consistent_hash.as_ref()) {
        let ring = |minimum: Option<u64>| LbSetup {
            policy: LbPolicy::RingHash,
            config: Some(LbConfig::RingHashLbConfig(RingHashLbConfig {
                minimum_ring_size: Some(UInt64Value {
                    value: minimum.unwrap_or(DEFAULT_RING_SIZE),
                }),
                ..Default::default()
            })),
        };
        let minimum = hash
            .ring_hash
            .as_ref()
            .and_then(|r| r.minimum_ring_size)
            .or(hash.minimum_ring_size);
        if let Some(maglev) = &hash.maglev {
            if flavor == Flavor::Proxyless {
                findings.push(Finding::Downgrade(Downgrade::new(
                    "maglev",
                    cluster,
                    "MAGLEV load balancing (ring hash is used)",
                )));
                return ring(None);
            }
            return LbSetup {
                policy: LbPolicy::Maglev,
                config: Some(LbConfig::MaglevLbConfig(MaglevLbConfig {
                    table_size: maglev.table_size.map(|value| UInt64Value { value }),
                })),
            };
        }
        return ring(minimum);
    }
    let simple = lb.and_then(|l| l.simple);
    match flavor {
        Flavor::Sidecar => {
            let policy = match simple {
                Some(SimpleLb::RoundRobin) => LbPolicy::RoundRobin,
                Some(SimpleLb::Random) => LbPolicy::Random,
                // PASSTHROUGH turns the cluster into ORIGINAL_DST (see the plan).
                Some(SimpleLb::Passthrough) => LbPolicy::ClusterProvided,
                None
                | Some(SimpleLb::Unspecified | SimpleLb::LeastConn | SimpleLb::LeastRequest) => {
                    LbPolicy::LeastRequest
                }
            };
            LbSetup {
                policy,
                config: lb.and_then(|l| slow_start_lb_config(policy, l)),
            }
        }
        Flavor::Proxyless => {
            if lb.is_some_and(|l| l.warmup.is_some() || l.warmup_duration_secs.is_some()) {
                findings.push(Finding::Downgrade(Downgrade::new(
                    "slow_start",
                    cluster,
                    "slow start (warmup)",
                )));
            }
            if let Some(
                s @ (SimpleLb::Random
                | SimpleLb::LeastConn
                | SimpleLb::LeastRequest
                | SimpleLb::Passthrough),
            ) = simple
            {
                findings.push(Finding::Downgrade(Downgrade::new(
                    "simple_lb",
                    cluster,
                    format!("load balancer {s:?} (round robin is used)"),
                )));
            }
            LbSetup {
                policy: LbPolicy::RoundRobin,
                config: None,
            }
        }
    }
}

/// Circuit breakers from the connection pool. Sidecars get Istio's defaults (every limit
/// at its maximum, so Envoy's small built-in limits never bite) with the configured ones
/// applied; proxyless clients only understand `max_requests`.
pub fn circuit_breakers(pool: Option<&ConnectionPoolSettings>, flavor: Flavor) -> CircuitBreakers {
    let http = pool.and_then(|p| p.http.as_ref());
    let tcp = pool.and_then(|p| p.tcp.as_ref());
    let limit = |v: Option<i32>| v.filter(|n| *n > 0).map(|n| n as u32);
    let thresholds = match flavor {
        Flavor::Sidecar => Thresholds {
            priority: RoutingPriority::Default as i32,
            max_connections: u32_value(
                limit(tcp.and_then(|t| t.max_connections)).unwrap_or(u32::MAX),
            ),
            max_pending_requests: u32_value(
                limit(http.and_then(|h| h.http1_max_pending_requests)).unwrap_or(u32::MAX),
            ),
            max_requests: u32_value(
                limit(http.and_then(|h| h.http2_max_requests)).unwrap_or(u32::MAX),
            ),
            max_retries: u32_value(limit(http.and_then(|h| h.max_retries)).unwrap_or(u32::MAX)),
            // Istio >= 1.29 (DISABLE_TRACK_REMAINING_CB_METRICS) no longer asks Envoy for
            // the `remaining_*` gauges.
            ..Default::default()
        },
        Flavor::Proxyless => Thresholds {
            max_requests: limit(http.and_then(|h| h.http2_max_requests)).and_then(u32_value),
            ..Default::default()
        },
    };
    CircuitBreakers {
        thresholds: vec![thresholds],
        ..Default::default()
    }
}

/// Outlier detection as Istio maps it: consecutive 5xx and gateway errors are enforced
/// (100%) only when configured above zero; success-rate ejection stays off.
pub fn outlier_detection(od: &OutlierDetection) -> EnvoyOutlier {
    let mut out = EnvoyOutlier {
        interval: od.interval.as_ref().and_then(api_duration),
        base_ejection_time: od.base_ejection_time.as_ref().and_then(api_duration),
        max_ejection_percent: od
            .max_ejection_percent
            .filter(|p| *p >= 0)
            .and_then(|p| u32_value(p.min(100) as u32)),
        enforcing_success_rate: u32_value(0),
        split_external_local_origin_errors: od.split_external_local_origin_errors.unwrap_or(false),
        ..Default::default()
    };
    let enforce = |n: u32| u32_value(if n > 0 { 100 } else { 0 });
    // The deprecated `consecutiveErrors` counted gateway errors.
    if let Some(n) = od.consecutive_errors.filter(|n| *n > 0) {
        out.consecutive_gateway_failure = u32_value(n as u32);
        out.enforcing_consecutive_gateway_failure = enforce(n as u32);
    }
    if let Some(n) = od.consecutive_gateway_errors {
        out.consecutive_gateway_failure = u32_value(n);
        out.enforcing_consecutive_gateway_failure = enforce(n);
    }
    if let Some(n) = od.consecutive_5xx_errors {
        out.consecutive_5xx = u32_value(n);
        out.enforcing_consecutive_5xx = enforce(n);
    }
    if let Some(n) = od.consecutive_local_origin_failures {
        out.consecutive_local_origin_failure = u32_value(n);
        out.enforcing_consecutive_local_origin_failure = enforce(n);
    }
    out
}

/// Upstream HTTP options of a sidecar cluster: HTTP/2 for h2 and gRPC ports (or when
/// `h2UpgradePolicy: UPGRADE`), the client's protocol with `useClientProtocol`, and the
/// pool's idle timeout (`http.idleTimeout`, else `tcp.idleTimeout`, as Istio), request cap
/// per connection and connection lifetime. Non-HTTP clusters carry only the common
/// options, as Istio attaches them to every cluster (they shape CONNECT tunnels).
pub fn http_protocol_options(
    protocol: Protocol,
    pool: Option<&ConnectionPoolSettings>,
) -> Option<HttpProtocolOptions> {
    let http = pool.and_then(|p| p.http.as_ref());
    let tcp = pool.and_then(|p| p.tcp.as_ref());
    let common = CoreHttpOptions {
        idle_timeout: http
            .and_then(|h| h.idle_timeout.as_ref())
            .or_else(|| tcp.and_then(|t| t.idle_timeout.as_ref()))
            .and_then(api_duration),
        max_requests_per_connection: http
            .and_then(|h| h.max_requests_per_connection)
            .filter(|n| *n > 0)
            .and_then(|n| u32_value(n as u32)),
        max_connection_duration: tcp
            .and_then(|t| t.max_connection_duration.as_ref())
            .and_then(api_duration),
        ..Default::default()
    };
    let has_common = common != CoreHttpOptions::default();
    if !protocol.is_http() {
        return has_common.then(|| HttpProtocolOptions {
            common_http_protocol_options: Some(common),
            upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                        Http1ProtocolOptions::default(),
                    )),
                },
            )),
            ..Default::default()
        });
    }
    let h2_options = || Http2ProtocolOptions {
        max_concurrent_streams: http
            .and_then(|h| h.max_concurrent_streams)
            .filter(|n| *n > 0)
            .and_then(|n| u32_value(n as u32)),
        ..Default::default()
    };
    let upgrade = http.and_then(|h| h.h2_upgrade_policy) == Some(H2UpgradePolicy::Upgrade);
    let upstream = if http.and_then(|h| h.use_client_protocol) == Some(true) {
        UpstreamProtocolOptions::UseDownstreamProtocolConfig(UseDownstreamHttpConfig {
            http_protocol_options: Some(Http1ProtocolOptions::default()),
            http2_protocol_options: Some(h2_options()),
            ..Default::default()
        })
    } else if protocol.is_http2() || upgrade {
        UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(h2_options())),
        })
    } else if has_common {
        UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                Http1ProtocolOptions::default(),
            )),
        })
    } else {
        return None;
    };
    Some(HttpProtocolOptions {
        common_http_protocol_options: has_common.then_some(common),
        upstream_protocol_options: Some(upstream),
        ..Default::default()
    })
}

/// `PassthroughCluster` (or, with `inbound`, `InboundPassthroughCluster`): connections go
/// to the address the client dialled. Inbound ones leave from 127.0.0.6 so that the
/// sidecar's own redirection does not loop them back (Istio's convention).
fn passthrough_cluster(name: &str, connect_timeout: std::time::Duration, inbound: bool) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(
            DiscoveryType::OriginalDst as i32,
        )),
        connect_timeout: duration(connect_timeout),
        lb_policy: LbPolicy::ClusterProvided as i32,
        circuit_breakers: Some(circuit_breakers(None, Flavor::Sidecar)),
        upstream_bind_config: inbound.then(inbound_bind_config),
        typed_extension_protocol_options: [(
            HTTP_PROTOCOL_OPTIONS.to_string(),
            any(&HttpProtocolOptions {
                upstream_protocol_options: Some(
                    UpstreamProtocolOptions::UseDownstreamProtocolConfig(UseDownstreamHttpConfig {
                        http_protocol_options: Some(Http1ProtocolOptions::default()),
                        http2_protocol_options: Some(Http2ProtocolOptions::default()),
                        ..Default::default()
                    }),
                ),
                ..Default::default()
            }),
        )]
        .into(),
        ..Default::default()
    }
}

/// An inbound cluster to a Sidecar ingress listener's `defaultEndpoint` (Istio's
/// `buildInboundCluster` with an endpoint address): `STATIC`, one endpoint.
fn static_inbound_cluster(
    name: &str,
    endpoint: &InboundEndpoint,
    connect_timeout: std::time::Duration,
) -> Cluster {
    // Istio leaves from 127.0.0.6 unless the endpoint is the loopback, so that traffic to
    // the workload's own IP is not redirected back to the sidecar. (It sets that on Unix
    // socket endpoints too, where an IP source cannot be bound; Pilotfish leaves it off
    // there.)
    let bind = match endpoint {
        InboundEndpoint::Socket { address, .. } => address != "127.0.0.1" && address != "::1",
        InboundEndpoint::Pipe(_) => false,
    };
    let address = match endpoint {
        InboundEndpoint::Socket { address, port } => socket_address(address, *port),
        InboundEndpoint::Pipe(path) => Address {
            address: Some(address::Address::Pipe(Pipe {
                path: path.clone(),
                ..Default::default()
            })),
        },
    };
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        connect_timeout: duration(connect_timeout),
        circuit_breakers: Some(circuit_breakers(None, Flavor::Sidecar)),
        upstream_bind_config: bind.then(inbound_bind_config),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.to_string(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(EnvoyEndpoint {
                        address: Some(address),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn inbound_bind_config() -> BindConfig {
    BindConfig {
        source_address: Some(SocketAddress {
            address: "127.0.0.6".to_string(),
            port_specifier: Some(PortSpecifier::PortValue(0)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `inbound|<port>||` for each of the workload's ports: the original destination (the
/// workload itself), leaving from 127.0.0.6. A port's connection pool from the Sidecar
/// (`InboundPort::pool`) is applied as Istio applies a pool to an inbound cluster: circuit
/// breakers, connect timeout, TCP keepalive and the HTTP options of the pool, without
/// the HTTP/2 upgrade (outbound only).
pub fn inbound_clusters(
    ports: &[InboundPort],
    connect_timeout: std::time::Duration,
) -> Vec<Cluster> {
    ports
        .iter()
        .map(|p| {
            let name = names::inbound_cluster(p.port);
            let pool = p.pool.as_ref().map(|c| {
                let mut pool = (*c.value).clone();
                if let Some(http) = pool.http.as_mut() {
                    http.h2_upgrade_policy = None;
                }
                pool
            });
            let connect_timeout = pool
                .as_ref()
                .and_then(|p| p.tcp.as_ref())
                .and_then(|t| t.connect_timeout.as_ref())
                .map(|d| d.as_std())
                .filter(|d| !d.is_zero())
                .unwrap_or(connect_timeout);
            let mut cluster = match &p.endpoint {
                None => passthrough_cluster(&name, connect_timeout, true),
                Some(endpoint) => static_inbound_cluster(&name, endpoint, connect_timeout),
            };
            cluster.typed_extension_protocol_options.clear();
            let Some(pool) = pool else {
                if p.protocol.is_http2() {
                    cluster.typed_extension_protocol_options.insert(
                        HTTP_PROTOCOL_OPTIONS.to_string(),
                        any(&HttpProtocolOptions {
                            upstream_protocol_options: Some(
                                UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                                        Http2ProtocolOptions::default(),
                                    )),
                                }),
                            ),
                            ..Default::default()
                        }),
                    );
                }
                return cluster;
            };
            cluster.circuit_breakers = Some(circuit_breakers(Some(&pool), Flavor::Sidecar));
            cluster.upstream_connection_options = tcp_keepalive(Some(&pool));
            if let Some(options) = http_protocol_options(p.protocol, Some(&pool)) {
                cluster
                    .typed_extension_protocol_options
                    .insert(HTTP_PROTOCOL_OPTIONS.to_string(), any(&options));
            }
            cluster
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lb(v: serde_json::Value) -> LoadBalancerSettings {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn lb_mapping_for_sidecars() {
        let cases = [
            (json!({}), LbPolicy::LeastRequest),
            (json!({"simple": "ROUND_ROBIN"}), LbPolicy::RoundRobin),
            (json!({"simple": "RANDOM"}), LbPolicy::Random),
            (json!({"simple": "LEAST_CONN"}), LbPolicy::LeastRequest),
            (json!({"simple": "PASSTHROUGH"}), LbPolicy::ClusterProvided),
            (
                json!({"consistentHash": {"httpHeaderName": "x"}}),
                LbPolicy::RingHash,
            ),
            (
                json!({"consistentHash": {"useSourceIp": true, "maglev": {"tableSize": 65537}}}),
                LbPolicy::Maglev,
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                lb_setup(
                    Some(&lb(input.clone())),
                    Flavor::Sidecar,
                    "c",
                    &mut Vec::new()
                )
                .policy,
                expected,
                "{input}"
            );
        }
        let ring = lb_setup(
            Some(&lb(
                json!({"consistentHash": {"httpCookie": {"name": "s"}, "ringHash": {"minimumRingSize": 4096}}}),
            )),
            Flavor::Sidecar,
            "c",
            &mut Vec::new(),
        );
        let Some(LbConfig::RingHashLbConfig(cfg)) = ring.config else {
            panic!()
        };
        assert_eq!(cfg.minimum_ring_size.unwrap().value, 4096);
        let Some(LbConfig::MaglevLbConfig(m)) = lb_setup(
            Some(&lb(
                json!({"consistentHash": {"useSourceIp": true, "maglev": {"tableSize": 65537}}}),
            )),
            Flavor::Sidecar,
            "c",
            &mut Vec::new(),
        )
        .config
        else {
            panic!()
        };
        assert_eq!(m.table_size.unwrap().value, 65537);
    }

    #[test]
    fn proxyless_gets_only_round_robin_or_ring_hash() {
        for input in [
            json!({"simple": "RANDOM"}),
            json!({"simple": "LEAST_REQUEST"}),
            json!({}),
        ] {
            assert_eq!(
                lb_setup(Some(&lb(input)), Flavor::Proxyless, "c", &mut Vec::new()).policy,
                LbPolicy::RoundRobin
            );
        }
        let maglev = lb_setup(
            Some(&lb(
                json!({"consistentHash": {"httpHeaderName": "x", "maglev": {}}}),
            )),
            Flavor::Proxyless,
            "c",
            &mut Vec::new(),
        );
        assert_eq!(
            maglev.policy,
            LbPolicy::RingHash,
            "maglev falls back to ring hash"
        );
    }

    #[test]
    fn circuit_breakers_default_to_maximum_for_sidecars() {
        let pool: ConnectionPoolSettings = serde_json::from_value(json!({
            "tcp": {"maxConnections": 10},
            "http": {"http1MaxPendingRequests": 5, "http2MaxRequests": 20, "maxRetries": 3}
        }))
        .unwrap();
        let t = &circuit_breakers(Some(&pool), Flavor::Sidecar).thresholds[0];
        assert_eq!(t.max_connections.as_ref().unwrap().value, 10);
        assert_eq!(t.max_pending_requests.as_ref().unwrap().value, 5);
        assert_eq!(t.max_requests.as_ref().unwrap().value, 20);
        assert_eq!(t.max_retries.as_ref().unwrap().value, 3);
        let d = &circuit_breakers(None, Flavor::Sidecar).thresholds[0];
        assert_eq!(d.max_connections.as_ref().unwrap().value, u32::MAX);
        let p = &circuit_breakers(Some(&pool), Flavor::Proxyless).thresholds[0];
        assert_eq!(p.max_requests.as_ref().unwrap().value, 20);
        assert!(p.max_connections.is_none() && p.max_retries.is_none());
    }

    #[test]
    fn outlier_detection_enforces_only_configured_checks() {
        let od: OutlierDetection = serde_json::from_value(json!({
            "consecutive5xxErrors": 0,
            "consecutiveGatewayErrors": 3,
            "interval": "10s",
            "baseEjectionTime": "30s",
            "maxEjectionPercent": 150
        }))
        .unwrap();
        let o = outlier_detection(&od);
        assert_eq!(o.enforcing_consecutive_5xx.unwrap().value, 0);
        assert_eq!(o.consecutive_gateway_failure.unwrap().value, 3);
        assert_eq!(o.enforcing_consecutive_gateway_failure.unwrap().value, 100);
        assert_eq!(o.max_ejection_percent.unwrap().value, 100);
        assert_eq!(o.enforcing_success_rate.unwrap().value, 0);
        assert_eq!(o.interval.unwrap().seconds, 10);
    }

    #[test]
    fn http_options_follow_port_protocol_and_pool() {
        assert!(http_protocol_options(Protocol::Http, None).is_none());
        assert!(http_protocol_options(Protocol::Tcp, None).is_none());
        let tcp_pool: ConnectionPoolSettings =
            serde_json::from_value(json!({"tcp": {"idleTimeout": "30s"}})).unwrap();
        let tcp = http_protocol_options(Protocol::Tcp, Some(&tcp_pool)).unwrap();
        assert_eq!(
            tcp.common_http_protocol_options
                .unwrap()
                .idle_timeout
                .unwrap()
                .seconds,
            30,
            "tcp.idleTimeout is the cluster's idle timeout, on TCP clusters too (Istio)"
        );
        let h1 = http_protocol_options(Protocol::Http, Some(&tcp_pool)).unwrap();
        assert_eq!(
            h1.common_http_protocol_options
                .unwrap()
                .idle_timeout
                .unwrap()
                .seconds,
            30
        );
        let grpc = http_protocol_options(Protocol::Grpc, None).unwrap();
        assert!(matches!(
            grpc.upstream_protocol_options,
            Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_))
                }
            ))
        ));
        let pool: ConnectionPoolSettings = serde_json::from_value(
            json!({"http": {"idleTimeout": "5s", "maxRequestsPerConnection": 1}}),
        )
        .unwrap();
        let h1 = http_protocol_options(Protocol::Http, Some(&pool)).unwrap();
        let common = h1.common_http_protocol_options.unwrap();
        assert_eq!(common.idle_timeout.unwrap().seconds, 5);
        assert_eq!(common.max_requests_per_connection.unwrap().value, 1);
    }
}
