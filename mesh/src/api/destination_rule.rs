//! `DestinationRule` (`networking.istio.io`): policies applied to traffic for a service after
//! routing — load balancing, connection pools, outlier detection, client TLS — per service,
//! per port and per subset.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{Labels, PortSelector, null_as_default, sibling_oneofs};
use super::duration::Duration;
use super::status::IstioStatus;

/// The spec of a DestinationRule: policies applied to traffic for a service after routing.
///
/// Reference: https://istio.io/latest/docs/reference/config/networking/destination-rule/
// The kube attribute list repeats `type_ = "string"` across print columns by design. The
// doc comment is the CRD's description, so its URL stays bare (kubectl shows plain text).
#[allow(clippy::duplicated_attributes, rustdoc::bare_urls)]
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "networking.istio.io",
    version = "v1",
    kind = "DestinationRule",
    namespaced,
    status = "IstioStatus",
    derive = "PartialEq",
    shortname = "dr",
    category = "istio-io",
    category = "networking-istio-io",
    doc = "Configuration affecting load balancing, outlier detection, etc. See more details at: https://istio.io/docs/reference/config/networking/destination-rule.html",
    printcolumn(
        name = "Host",
        type_ = "string",
        json_path = ".spec.host",
        description = "The name of a service from the service registry"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DestinationRuleSpec {
    /// The name of a service from the service registry; required.
    pub host: String,
    /// Traffic policies for the whole service (load balancing, pools, outlier detection, TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
    /// Named sets of endpoints (versions) of the service, selected by labels.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subsets: Vec<Subset>,
    /// A list of namespaces to which this destination rule is exported.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub export_to: Vec<String>,
    /// The workloads (pods/VMs) this rule applies to; all in its namespace when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<TypeWorkloadSelector>,
}

/// Istio's `istio.type.v1beta1.WorkloadSelector` (`matchLabels`), used by DestinationRule.
/// (ServiceEntry's selector is the networking [`WorkloadSelector`](super::WorkloadSelector),
/// whose field is `labels`.)
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TypeWorkloadSelector {
    /// Labels selecting the pods/VMs the configuration applies to.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    #[schemars(transform = selector_label_rules)]
    pub match_labels: Labels,
}

/// The rules Istio's CRD puts on a DestinationRule's selector labels: at most 4096, keys
/// non-empty and without `*`, values of at most 63 characters without `*`.
fn selector_label_rules(schema: &mut schemars::Schema) {
    schema.insert("maxProperties".into(), 4096.into());
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([
            {"rule": "self.all(key, !key.contains(\"*\"))", "message": "a selector label key cannot contain '*'"},
            {"rule": "self.all(key, key.size() != 0)", "message": "a selector label key cannot be empty"}
        ]),
    );
    if let Some(values) = schema
        .get_mut("additionalProperties")
        .and_then(|v| v.as_object_mut())
    {
        values.insert("maxLength".into(), 63.into());
        values.insert(
            "x-kubernetes-validations".into(),
            serde_json::json!([{"rule": "!self.contains(\"*\")", "message": "a selector label value cannot contain '*'"}]),
        );
    }
}

/// Traffic policies for a service, a subset, or (without `portLevelSettings`) a port.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrafficPolicy {
    /// Load balancing algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection pool limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Ejection of unhealthy hosts from the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// TLS settings for connections to the upstream service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
    /// Policies for individual ports; they override the service-level ones.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 4096))]
    pub port_level_settings: Vec<PortTrafficPolicy>,
    /// Tunneling of TCP over another transport for this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<TunnelSettings>,
    /// Upstream PROXY protocol settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,
    /// Limit on concurrent retries relative to active requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<RetryBudget>,
}

/// Traffic policies for one port of the service.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PortTrafficPolicy {
    /// The port this policy applies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
    /// Load balancing algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    /// Connection pool limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    /// Ejection of unhealthy hosts from the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    /// TLS settings for connections to this port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
}

/// A named version of a service: endpoints selected by labels, with optional own policies.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Subset {
    /// Name of the subset (used in route destinations and cluster names); required.
    pub name: String,
    /// Labels selecting the subset's endpoints.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub labels: Labels,
    /// Policies for this subset; they override the service-level ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
}

/// Load balancing settings. `simple` and `consistentHash` are one proto oneof (`lb_policy`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = lb_policy_oneof)]
pub struct LoadBalancerSettings {
    /// A standard algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simple: Option<SimpleLb>,
    /// Consistent hashing (session affinity) on a header, cookie, source IP or query parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_hash: Option<ConsistentHashLb>,
    /// Locality load balancing settings (override the mesh-wide ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality_lb_setting: Option<LocalityLoadBalancerSetting>,
    /// Deprecated (use `warmup`): slow-start window for new endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_duration_secs: Option<Duration>,
    /// Slow-start configuration for new endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<WarmupConfiguration>,
}

sibling_oneofs!(LoadBalancerSettings, transform = lb_policy_oneof, {
    "lb_policy": [simple: "simple", consistent_hash: "consistentHash"],
});

/// Standard load balancing algorithms (`LoadBalancerSettings.SimpleLB`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SimpleLb {
    Unspecified,
    // Deprecated alias of `LEAST_REQUEST`. (A plain comment: a doc comment on one variant
    // would reorder the CRD's enum.)
    LeastConn,
    Random,
    Passthrough,
    RoundRobin,
    LeastRequest,
}

/// Slow-start ("warmup") configuration.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WarmupConfiguration {
    /// Duration of the warmup window; required.
    pub duration: Duration,
    /// Minimum percentage of traffic a new endpoint gets (0–100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub minimum_percent: Option<f64>,
    /// How fast traffic increases over the window (1.0 = linear).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub aggression: Option<f64>,
}

/// Consistent-hash load balancing. Two proto oneofs: the hash key (`httpHeaderName`,
/// `httpCookie`, `useSourceIp`, `httpQueryParameterName`) and the algorithm (`ringHash`,
/// `maglev`); at most one member of each may be set.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = consistent_hash_oneofs)]
pub struct ConsistentHashLb {
    /// Hash on this HTTP header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_header_name: Option<String>,
    /// Hash on this HTTP cookie (generated when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_cookie: Option<HttpCookie>,
    /// Hash on the source IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_source_ip: Option<bool>,
    /// Hash on this query parameter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_query_parameter_name: Option<String>,
    /// Ring hash algorithm settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_hash: Option<RingHash>,
    /// Maglev algorithm settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maglev: Option<MagLev>,
    /// Deprecated (use `ringHash.minimumRingSize`): minimum number of ring virtual nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

sibling_oneofs!(ConsistentHashLb, transform = consistent_hash_oneofs, {
    "hash_key": [
        http_header_name: "httpHeaderName",
        http_cookie: "httpCookie",
        use_source_ip: "useSourceIp",
        http_query_parameter_name: "httpQueryParameterName",
    ],
    "hash_algorithm": [ring_hash: "ringHash", maglev: "maglev"],
});

/// The cookie used as a consistent-hash key.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpCookie {
    /// Name of the cookie; required.
    pub name: String,
    /// Path of the generated cookie.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Lifetime of the generated cookie.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::duration::unbounded_schema")]
    pub ttl: Option<Duration>,
    /// Additional attributes of the generated cookie.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub attributes: Vec<HttpCookieAttribute>,
}

/// An attribute of a generated hash cookie (`HTTPCookie.Attribute`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpCookieAttribute {
    /// Name of the attribute (e.g. `SameSite`); required.
    pub name: String,
    /// Value of the attribute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Ring hash algorithm settings.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RingHash {
    /// Minimum number of virtual nodes on the ring (Envoy's default: 1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

/// Maglev algorithm settings.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MagLev {
    /// Table size (a prime; Envoy's default: 65537).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_size: Option<u64>,
}

/// Locality-aware load balancing: weighted distribution or failover between localities.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct LocalityLoadBalancerSetting {
    /// Traffic distribution from a locality to others (only one of distribute, failover or
    /// failoverPriority may be set).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub distribute: Vec<Distribute>,
    /// Region-level failover targets.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub failover: Vec<Failover>,
    /// Ordered labels used to prioritise endpoints for failover.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub failover_priority: Vec<String>,
    /// Enable or disable locality load balancing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// Weighted traffic distribution from one locality (`LocalityLoadBalancerSetting.Distribute`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Distribute {
    /// Originating locality, `region/zone/sub_zone`, `*` wildcards allowed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Upstream localities and their weights (summing to 100).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub to: BTreeMap<String, u32>,
}

/// Region-level failover (`LocalityLoadBalancerSetting.Failover`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Failover {
    /// Originating region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Region traffic fails over to when `from` has no healthy endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

/// Connection pool settings for an upstream host.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ConnectionPoolSettings {
    /// Settings common to HTTP and TCP connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpSettings>,
    /// HTTP connection pool settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSettings>,
}

/// TCP connection pool settings (`ConnectionPoolSettings.TCPSettings`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TcpSettings {
    /// Maximum number of HTTP/1 or TCP connections to a destination host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<i32>,
    /// TCP connection timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<Duration>,
    /// SO_KEEPALIVE settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<TcpKeepalive>,
    /// Maximum lifetime of a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connection_duration: Option<Duration>,
    /// Idle timeout of TCP connections (`0s` disables it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::duration::unbounded_schema")]
    pub idle_timeout: Option<Duration>,
}

/// TCP keepalive settings (`TCPSettings.TcpKeepalive`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TcpKeepalive {
    /// Probes sent without response before the connection is declared dead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<u32>,
    /// Idle time before probes start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Duration>,
    /// Time between probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
}

/// HTTP connection pool settings (`ConnectionPoolSettings.HTTPSettings`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpSettings {
    /// Maximum requests queued while waiting for a connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http1_max_pending_requests: Option<i32>,
    /// Maximum active requests to a destination.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http2_max_requests: Option<i32>,
    /// Maximum requests per connection (1 disables keep-alive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_per_connection: Option<i32>,
    /// Maximum outstanding retries to all hosts of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<i32>,
    /// Idle timeout of upstream connection pool connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    /// Whether HTTP/1.1 connections are upgraded to HTTP/2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2_upgrade_policy: Option<H2UpgradePolicy>,
    /// Preserve the client's protocol towards the backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_client_protocol: Option<bool>,
    /// Maximum concurrent streams per HTTP/2 connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<i32>,
}

/// Policy for upgrading HTTP/1.1 connections to HTTP/2 (`HTTPSettings.H2UpgradePolicy`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum H2UpgradePolicy {
    Default,
    DoNotUpgrade,
    Upgrade,
}

/// Outlier detection: ejection of hosts that keep failing.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Distinguish locally originated failures from upstream errors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_external_local_origin_errors: Option<bool>,
    /// Consecutive locally originated failures before ejection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_local_origin_failures: Option<u32>,
    /// Consecutive gateway errors (502, 503, 504) before ejection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_errors: Option<u32>,
    /// Consecutive 5xx errors before ejection (JSON `consecutive5xxErrors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_5xx_errors: Option<u32>,
    /// Time between ejection sweeps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// Minimum ejection duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ejection_time: Option<Duration>,
    /// Maximum percentage of hosts that can be ejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<i32>,
    /// Outlier detection stays on while at least this percentage of hosts is healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_health_percent: Option<i32>,
    /// Deprecated (use `consecutive5xxErrors`/`consecutiveGatewayErrors`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_errors: Option<i32>,
}

/// Client-side TLS settings for upstream connections (`ClientTLSSettings`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClientTlsSettings {
    /// Whether and how connections are secured with TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TlsMode>,
    /// Client certificate file (MUTUAL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<String>,
    /// Client private key file (MUTUAL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// CA certificates file used to verify the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
    /// Name of the secret holding the client's TLS material.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
    /// Alternate names accepted in the server certificate.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subject_alt_names: Vec<String>,
    /// SNI presented to the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Skip verifying the server's CA signature and SAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// Certificate revocation list file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_crl: Option<String>,
}

/// TLS mode of upstream connections (`ClientTLSSettings.TLSmode`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TlsMode {
    Disable,
    Simple,
    Mutual,
    IstioMutual,
}

/// Tunneling of TCP over another protocol (`TrafficPolicy.TunnelSettings`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TunnelSettings {
    /// Tunnel protocol: `CONNECT` (default) or `POST`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Host the connection is tunneled to; required.
    pub target_host: String,
    /// Port the connection is tunneled to; required.
    pub target_port: u32,
}

/// Upstream PROXY protocol settings (`TrafficPolicy.ProxyProtocol`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ProxyProtocol {
    /// PROXY protocol version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<ProxyProtocolVersion>,
}

/// PROXY protocol version (`ProxyProtocol.VERSION`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProxyProtocolVersion {
    V1,
    V2,
}

/// Limit on concurrent retries (`TrafficPolicy.RetryBudget`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RetryBudget {
    /// Concurrent retries as a percentage of active plus pending requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub percent: Option<f64>,
    /// Minimum retry concurrency allowed regardless of the percentage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_retry_concurrency: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::common::Oneofs;
    use serde_json::json;

    /// Every value Istio's CRD accepts, in its spelling, reads and writes back unchanged.
    fn assert_enum_values<T>(values: &[&str])
    where
        T: serde::de::DeserializeOwned + Serialize + std::fmt::Debug,
    {
        for value in values {
            let parsed: T =
                serde_json::from_value(json!(value)).unwrap_or_else(|e| panic!("{value}: {e}"));
            assert_eq!(serde_json::to_value(&parsed).unwrap(), json!(value));
        }
        assert!(serde_json::from_value::<T>(json!("round_robin")).is_err());
    }

    #[test]
    fn enums_accept_every_istio_value() {
        assert_enum_values::<SimpleLb>(&[
            "UNSPECIFIED",
            "LEAST_CONN",
            "RANDOM",
            "PASSTHROUGH",
            "ROUND_ROBIN",
            "LEAST_REQUEST",
        ]);
        assert_enum_values::<TlsMode>(&["DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"]);
        assert_enum_values::<H2UpgradePolicy>(&["DEFAULT", "DO_NOT_UPGRADE", "UPGRADE"]);
        assert_enum_values::<ProxyProtocolVersion>(&["V1", "V2"]);
    }

    /// The members each oneof group of a `T` parsed from `value` reports as set.
    fn set_members<T: serde::de::DeserializeOwned + Oneofs>(
        value: serde_json::Value,
    ) -> Vec<Vec<&'static str>> {
        let message: T = serde_json::from_value(value).unwrap();
        message.oneof_groups().into_iter().map(|g| g.set).collect()
    }

    /// `sibling_oneofs!` pairs each field with its JSON name: setting one member (by its
    /// JSON name) reports exactly that name, in its own group.
    #[test]
    fn each_oneof_member_reports_under_its_json_name() {
        let none: Vec<&str> = Vec::new();
        for (value, expected) in [
            (json!({"simple": "RANDOM"}), vec!["simple"]),
            (json!({"consistentHash": {}}), vec!["consistentHash"]),
        ] {
            assert_eq!(set_members::<LoadBalancerSettings>(value), vec![expected]);
        }
        for (value, expected) in [
            (
                json!({"httpHeaderName": "h"}),
                [vec!["httpHeaderName"], none.clone()],
            ),
            (
                json!({"httpCookie": {"name": "c"}}),
                [vec!["httpCookie"], none.clone()],
            ),
            (
                json!({"useSourceIp": true}),
                [vec!["useSourceIp"], none.clone()],
            ),
            (
                json!({"httpQueryParameterName": "q"}),
                [vec!["httpQueryParameterName"], none.clone()],
            ),
            (json!({"ringHash": {}}), [none.clone(), vec!["ringHash"]]),
            (json!({"maglev": {}}), [none.clone(), vec!["maglev"]]),
        ] {
            assert_eq!(set_members::<ConsistentHashLb>(value), expected);
        }
    }

    #[test]
    fn consistent_hash_reports_each_oneof_group() {
        let lb: ConsistentHashLb = serde_json::from_value(json!({
            "httpHeaderName": "x-user",
            "useSourceIp": true,
            "maglev": {"tableSize": 65537}
        }))
        .unwrap();
        let groups = lb.oneof_groups();
        assert_eq!(groups[0].name, "hash_key");
        assert_eq!(groups[0].set, vec!["httpHeaderName", "useSourceIp"]);
        assert_eq!(groups[1].set, vec!["maglev"]);
        let conflicting = lb.conflicting_oneofs();
        assert_eq!(conflicting.len(), 1);
        assert_eq!(conflicting[0].name, "hash_key");

        let lb: LoadBalancerSettings = serde_json::from_value(json!({
            "simple": "RANDOM",
            "consistentHash": {"useSourceIp": true}
        }))
        .unwrap();
        assert_eq!(
            lb.conflicting_oneofs()[0].set,
            vec!["simple", "consistentHash"]
        );
    }

    #[test]
    fn digit_fields_use_istio_json_names() {
        let outlier = OutlierDetection {
            consecutive_5xx_errors: Some(5),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&outlier).unwrap(),
            json!({"consecutive5xxErrors": 5})
        );
        let http = HttpSettings {
            http1_max_pending_requests: Some(1),
            http2_max_requests: Some(2),
            h2_upgrade_policy: Some(H2UpgradePolicy::Upgrade),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&http).unwrap(),
            json!({"http1MaxPendingRequests": 1, "http2MaxRequests": 2, "h2UpgradePolicy": "UPGRADE"})
        );
    }
}
