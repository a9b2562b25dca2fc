//! What a DestinationRule adds to a sidecar's outbound cluster besides the load balancer,
//! connection pool, outlier detection and TLS, as Istio 1.30 renders it
//! (`cluster_traffic_policy.go`): the PROXY protocol header (`proxyProtocol`: the
//! transport socket wrapped in `envoy.transport_sockets.upstream_proxy_protocol`), the
//! retry budget (`retryBudget`: the circuit breaker's `retry_budget`) and slow start
//! (`loadBalancer.warmup` / `warmupDurationSecs`: `slow_start_config` of round robin and
//! least request).
//!
//! gRPC's xDS client reads none of these: for proxyless clients each is left out with a
//! [`Downgrade`].

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::circuit_breakers::thresholds;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{
    LbConfig, LbPolicy, LeastRequestLbConfig, RoundRobinLbConfig, SlowStartConfig,
};
use envoy_types::pb::envoy::config::core::v3::{
    ProxyProtocolConfig, RuntimeDouble, TransportSocket, proxy_protocol_config, transport_socket,
};
use envoy_types::pb::envoy::extensions::transport_sockets::proxy_protocol::v3::ProxyProtocolUpstreamTransport;
use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use envoy_types::pb::envoy::r#type::v3::Percent;
use pilotfish_mesh::api::{LoadBalancerSettings, ProxyProtocol, ProxyProtocolVersion, RetryBudget};

use super::findings::{Downgrade, Finding};
use super::policy::ClusterPolicy;
use super::scope::Flavor;
use super::util::{any, api_duration, u32_value};

/// The transport socket Envoy registers the upstream PROXY protocol under.
pub const PROXY_PROTOCOL_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.upstream_proxy_protocol";
const RAW_BUFFER_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.raw_buffer";

/// Applies the policy's `proxyProtocol` and `retryBudget` to `cluster` (whose transport
/// socket and circuit breakers are already set); proxyless clients get neither.
pub fn apply_connection_options(
    cluster: &mut Cluster,
    policy: &ClusterPolicy,
    flavor: Flavor,
    findings: &mut Vec<Finding>,
) {
    if flavor == Flavor::Proxyless {
        if policy.proxy_protocol.is_some() {
            findings.push(Finding::Downgrade(Downgrade::new(
                "proxy_protocol",
                cluster.name.as_str(),
                "the upstream PROXY protocol",
            )));
        }
        if policy.retry_budget.is_some() {
            findings.push(Finding::Downgrade(Downgrade::new(
                "retry_budget",
                cluster.name.as_str(),
                "retry budgets",
            )));
        }
        return;
    }
    if let Some(proxy_protocol) = &policy.proxy_protocol {
        // As Istio: the cluster's socket (plaintext when it has none and no matches) and
        // every auto-mTLS match's socket go behind the PROXY header.
        if cluster.transport_socket.is_some() || cluster.transport_socket_matches.is_empty() {
            cluster.transport_socket = Some(proxy_protocol_socket(
                proxy_protocol,
                cluster.transport_socket.take(),
            ));
        }
        for m in &mut cluster.transport_socket_matches {
            m.transport_socket = Some(proxy_protocol_socket(
                proxy_protocol,
                m.transport_socket.take(),
            ));
        }
    }
    if let Some(budget) = &policy.retry_budget
        && let Some(thresholds) = cluster
            .circuit_breakers
            .as_mut()
            .and_then(|c| c.thresholds.first_mut())
    {
        thresholds.retry_budget = Some(retry_budget(budget));
    }
}

/// `inner` (plaintext when `None`) behind a PROXY protocol header of the configured
/// version (V1 when unset, Istio's enum default).
pub fn proxy_protocol_socket(
    proxy_protocol: &ProxyProtocol,
    inner: Option<TransportSocket>,
) -> TransportSocket {
    let version = match proxy_protocol.version {
        None | Some(ProxyProtocolVersion::V1) => proxy_protocol_config::Version::V1,
        Some(ProxyProtocolVersion::V2) => proxy_protocol_config::Version::V2,
    };
    let inner = inner.unwrap_or_else(|| TransportSocket {
        name: RAW_BUFFER_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any(
            &RawBuffer::default(),
        ))),
    });
    TransportSocket {
        name: PROXY_PROTOCOL_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any(
            &ProxyProtocolUpstreamTransport {
                config: Some(ProxyProtocolConfig {
                    version: version as i32,
                    ..Default::default()
                }),
                transport_socket: Some(inner),
                ..Default::default()
            },
        ))),
    }
}

/// Istio's retry budget: 20% of active requests and at least 3 concurrent retries unless
/// configured.
pub fn retry_budget(budget: &RetryBudget) -> thresholds::RetryBudget {
    thresholds::RetryBudget {
        budget_percent: Some(Percent {
            value: budget.percent.unwrap_or(20.0),
        }),
        min_retry_concurrency: u32_value(
            budget.min_retry_concurrency.filter(|n| *n > 0).unwrap_or(3),
        ),
        ..Default::default()
    }
}

/// Slow start for round robin and least request (the policies Envoy offers it for):
/// `warmup` (window, aggression 1 and minimum weight 10% unless set; Istio pins the
/// runtime key to `(`, which no runtime layer defines) or else the deprecated
/// `warmupDurationSecs` (window only).
pub fn slow_start_lb_config(policy: LbPolicy, lb: &LoadBalancerSettings) -> Option<LbConfig> {
    let slow_start = if let Some(warmup) = &lb.warmup {
        SlowStartConfig {
            slow_start_window: api_duration(&warmup.duration),
            aggression: Some(RuntimeDouble {
                default_value: warmup.aggression.unwrap_or(1.0),
                runtime_key: "(".to_string(),
            }),
            min_weight_percent: Some(Percent {
                value: warmup.minimum_percent.unwrap_or(10.0),
            }),
        }
    } else {
        SlowStartConfig {
            slow_start_window: api_duration(lb.warmup_duration_secs.as_ref()?),
            ..Default::default()
        }
    };
    match policy {
        LbPolicy::RoundRobin => Some(LbConfig::RoundRobinLbConfig(RoundRobinLbConfig {
            slow_start_config: Some(slow_start),
        })),
        LbPolicy::LeastRequest => Some(LbConfig::LeastRequestLbConfig(LeastRequestLbConfig {
            slow_start_config: Some(slow_start),
            ..Default::default()
        })),
        _ => None,
    }
}
