//! `VirtualService` (`networking.istio.io`): how requests to a host are routed — HTTP routes
//! with matches, weighted destinations, redirects, rewrites, retries, faults, mirroring and
//! CORS, plus TCP and TLS (SNI) routes. Field names follow Istio's JSON (camelCase).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::common::{
    Destination, Labels, Percent, StringMatch, bytes_schema, null_as_default, sibling_oneofs,
};
use super::duration::Duration;
use super::status::IstioStatus;

/// The spec of a VirtualService: configuration affecting traffic routing.
///
/// Reference: https://istio.io/latest/docs/reference/config/networking/virtual-service/
// The kube attribute list repeats `type_ = "string"` across print columns by design. The
// doc comment is the CRD's description, so its URL stays bare (kubectl shows plain text).
#[allow(clippy::duplicated_attributes, rustdoc::bare_urls)]
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "networking.istio.io",
    version = "v1",
    kind = "VirtualService",
    namespaced,
    status = "IstioStatus",
    derive = "PartialEq",
    shortname = "vs",
    category = "istio-io",
    category = "networking-istio-io",
    doc = "Configuration affecting traffic routing. See more details at: https://istio.io/docs/reference/config/networking/virtual-service.html",
    printcolumn(
        name = "Gateways",
        type_ = "string",
        json_path = ".spec.gateways",
        description = "The names of gateways and sidecars that should apply these routes"
    ),
    printcolumn(
        name = "Hosts",
        type_ = "string",
        json_path = ".spec.hosts",
        description = "The destination hosts to which traffic is being sent"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualServiceSpec {
    /// The destination hosts to which traffic is being sent (DNS names, wildcard prefixes allowed).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub hosts: Vec<String>,
    /// The names of gateways and sidecars that should apply these routes (`mesh` = all sidecars).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub gateways: Vec<String>,
    /// An ordered list of route rules for HTTP traffic.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub http: Vec<HttpRoute>,
    /// An ordered list of route rules for non-terminated TLS and HTTPS traffic.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tls: Vec<TlsRoute>,
    /// An ordered list of route rules for opaque TCP traffic.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub tcp: Vec<TcpRoute>,
    /// A list of namespaces to which this virtual service is exported (`.` = own, `*` = all).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub export_to: Vec<String>,
}

/// Conditions and actions for routing HTTP/1.1, HTTP2 and gRPC traffic.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = add_snake_case_mirror_percent)]
pub struct HttpRoute {
    /// The name assigned to the route for debugging purposes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Match conditions to be satisfied for the rule to be activated (OR-ed).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub r#match: Vec<HttpMatchRequest>,
    /// Weighted destinations to forward the traffic to.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub route: Vec<HttpRouteDestination>,
    /// Return an HTTP 301/302 redirect instead of forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<HttpRedirect>,
    /// Return a fixed response instead of forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_response: Option<HttpDirectResponse>,
    /// Delegate the routing to another VirtualService (only at the root of a delegation chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegate: Option<Delegate>,
    /// Rewrite the URI and/or Authority before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<HttpRewrite>,
    /// Timeout for HTTP requests; disabled by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Retry policy for HTTP requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<HttpRetry>,
    /// Fault injection policy applied at the client side.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<HttpFaultInjection>,
    /// Mirror traffic to this destination in addition to the intended one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Destination>,
    /// Several mirror destinations, each with its own percentage.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub mirrors: Vec<HttpMirrorPolicy>,
    /// Percentage of the traffic mirrored by `mirror` (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_percentage: Option<Percent>,
    /// Deprecated integer form of `mirrorPercentage`; also read as `mirror_percent`.
    #[serde(
        default,
        alias = "mirror_percent",
        skip_serializing_if = "Option::is_none"
    )]
    pub mirror_percent: Option<u32>,
    /// Cross-Origin Resource Sharing policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors_policy: Option<CorsPolicy>,
    /// Header manipulation rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

/// Istio's CRD also accepts the proto field name `mirror_percent`; list it so that the API
/// server keeps it instead of pruning it.
fn add_snake_case_mirror_percent(schema: &mut Schema) {
    if let Some(properties) = schema.get_mut("properties").and_then(|p| p.as_object_mut())
        && let Some(camel) = properties.get("mirrorPercent").cloned()
    {
        properties.insert("mirror_percent".into(), camel);
    }
}

/// Match conditions for an HTTP route; all conditions of one match must hold (AND).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpMatchRequest {
    /// The name assigned to a match; appended to the parent route's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// URI (path) to match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    /// URI scheme to match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<StringMatch>,
    /// HTTP method to match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    /// HTTP Authority (Host) to match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<StringMatch>,
    /// Headers to match, keyed by lower-case header name; `{}` matches presence.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub headers: BTreeMap<String, StringMatch>,
    /// The port on the host being addressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Labels constraining the source (client) workloads.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub source_labels: Labels,
    /// Names of gateways where the rule applies (overrides the VirtualService's `gateways`).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub gateways: Vec<String>,
    /// Query parameters to match; `exact: ""` or `{}` match presence.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub query_params: BTreeMap<String, StringMatch>,
    /// Match the URI case-insensitively (exact and prefix only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_uri_case: Option<bool>,
    /// Headers that must NOT match (same syntax as `headers`).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub without_headers: BTreeMap<String, StringMatch>,
    /// Source namespace constraining the client workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
    /// Human-readable prefix for the route's statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stat_prefix: Option<String>,
}

/// A weighted destination of an HTTP route.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteDestination {
    /// Where the request is forwarded.
    pub destination: Destination,
    /// Relative proportion of the traffic (`int32`, so a negative value parses and validation
    /// reports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Header manipulation applied when this destination is chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

/// A weighted destination of a TCP or TLS route.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct RouteDestination {
    /// Where the connection is forwarded.
    pub destination: Destination,
    /// Relative proportion of the traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// Route rule for opaque TCP traffic.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TcpRoute {
    /// Match conditions (OR-ed).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub r#match: Vec<L4MatchAttributes>,
    /// Where the connection is forwarded.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub route: Vec<RouteDestination>,
}

/// Route rule for non-terminated TLS (passthrough) traffic, matched by SNI.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsRoute {
    /// Match conditions (OR-ed); required.
    #[serde(deserialize_with = "null_as_default")]
    pub r#match: Vec<TlsMatchAttributes>,
    /// Where the connection is forwarded.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub route: Vec<RouteDestination>,
}

/// L4 connection match attributes.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct L4MatchAttributes {
    /// IPv4 or IPv6 destination addresses, with optional subnet.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub destination_subnets: Vec<String>,
    /// The port on the host being addressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Deprecated: source subnet (IPv4/IPv6 with optional prefix).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_subnet: Option<String>,
    /// Labels constraining the source workloads.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub source_labels: Labels,
    /// Names of gateways where the rule applies.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub gateways: Vec<String>,
    /// Source namespace constraining the client workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
}

/// TLS connection match attributes.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsMatchAttributes {
    /// SNI values to match (wildcard prefixes allowed); required.
    #[serde(deserialize_with = "null_as_default")]
    pub sni_hosts: Vec<String>,
    /// IPv4 or IPv6 destination addresses, with optional subnet.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub destination_subnets: Vec<String>,
    /// The port on the host being addressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Labels constraining the source workloads.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub source_labels: Labels,
    /// Names of gateways where the rule applies.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub gateways: Vec<String>,
    /// Source namespace constraining the client workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
}

/// An HTTP redirect. `port` and `derivePort` are one proto oneof (`redirect_port`): at most
/// one may be set, which [`Oneofs::conflicting_oneofs`](super::common::Oneofs::conflicting_oneofs)
/// reports.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = redirect_port_oneof)]
pub struct HttpRedirect {
    /// Overwrite the path of the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Overwrite the Authority/Host of the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// Overwrite the port of the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Set the port from the protocol default or the request's port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derive_port: Option<RedirectPortSelection>,
    /// Overwrite the scheme of the URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// HTTP status code of the redirect (default 301).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_code: Option<u32>,
}

sibling_oneofs!(HttpRedirect, transform = redirect_port_oneof, {
    "redirect_port": [port: "port", derive_port: "derivePort"],
});

/// How a redirect derives its port (`HTTPRedirect.RedirectPortSelection`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RedirectPortSelection {
    FromProtocolDefault,
    FromRequestPort,
}

/// A fixed response returned instead of forwarding.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpDirectResponse {
    /// HTTP status to return; required.
    pub status: u32,
    /// Response body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<HttpBody>,
}

/// A direct-response body. `string` and `bytes` are one proto oneof (`specifier`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = body_specifier_oneof)]
pub struct HttpBody {
    /// Response body as a string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// Response body as base64-encoded bytes.
    #[serde(
        default,
        deserialize_with = "base64_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "bytes_schema")]
    pub bytes: Option<ByteString>,
}

/// Reads base64 bytes with an error that says what was expected (the plain `ByteString`
/// error only names the offending symbol).
fn base64_bytes<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<ByteString>, D::Error> {
    use serde::de::{Error, IntoDeserializer};
    let Some(text) = Option::<String>::deserialize(deserializer)? else {
        return Ok(None);
    };
    let text_deserializer: serde::de::value::StrDeserializer<'_, serde::de::value::Error> =
        text.as_str().into_deserializer();
    ByteString::deserialize(text_deserializer)
        .map(Some)
        .map_err(|e| D::Error::custom(format!("invalid base64 {text:?}: {e}")))
}

sibling_oneofs!(HttpBody, transform = body_specifier_oneof, {
    "specifier": [string: "string", bytes: "bytes"],
});

/// The VirtualService that a route delegates to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct Delegate {
    /// Name of the delegate VirtualService.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Namespace of the delegate VirtualService (default: the delegating one's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// Rewrite of the URI and Authority before forwarding.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRewrite {
    /// Rewrite the path (or the matched prefix) with this value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Rewrite the Authority/Host header with this value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    /// Rewrite the path with a regex substitution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

/// A regex substitution of the path.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RegexRewrite {
    /// RE2 regex to match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#match: Option<String>,
    /// Replacement; may use capture groups (`\1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<String>,
}

/// Retry policy for HTTP requests.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRetry {
    /// Number of retries; 0 disables retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// Timeout per attempt, including the initial call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<Duration>,
    /// Conditions under which retry takes place (comma-separated Envoy retry policies and codes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<String>,
    /// Whether retries may go to other localities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_remote_localities: Option<bool>,
    /// Whether retries avoid previously tried hosts (Istio's default: true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_ignore_previous_hosts: Option<bool>,
    /// Minimum duration between retry attempts (Envoy's default: 25ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
}

/// Cross-Origin Resource Sharing policy.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CorsPolicy {
    /// Origins allowed, as string matches.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_origins: Vec<StringMatch>,
    /// Deprecated: exact origins allowed (use `allowOrigins`).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_origin: Vec<String>,
    /// HTTP methods allowed.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_methods: Vec<String>,
    /// HTTP headers allowed in requests.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub allow_headers: Vec<String>,
    /// HTTP headers browsers may read.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub expose_headers: Vec<String>,
    /// How long a preflight result may be cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    /// Whether the actual request may carry credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    /// Whether preflight requests not matching an allowed origin are forwarded upstream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmatched_preflights: Option<UnmatchedPreflights>,
}

/// What to do with preflight requests that match no allowed origin.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UnmatchedPreflights {
    Unspecified,
    Forward,
    Ignore,
}

/// Fault injection: delays and aborts applied at the client side.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpFaultInjection {
    /// Delay requests before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<HttpFaultDelay>,
    /// Abort requests with an error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<HttpFaultAbort>,
}

/// A fault-injection delay. `fixedDelay` and `exponentialDelay` are one proto oneof
/// (`http_delay_type`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = delay_type_oneof)]
pub struct HttpFaultDelay {
    /// Fixed delay before forwarding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_delay: Option<Duration>,
    /// Exponential delay (not implemented by Istio; accepted for compatibility).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exponential_delay: Option<Duration>,
    /// Percentage of requests delayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
    /// Deprecated integer percentage (0–100) of requests delayed; use `percentage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
}

sibling_oneofs!(HttpFaultDelay, transform = delay_type_oneof, {
    "http_delay_type": [fixed_delay: "fixedDelay", exponential_delay: "exponentialDelay"],
});

/// A fault-injection abort. `httpStatus`, `grpcStatus` and `http2Error` are one proto oneof
/// (`error_type`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = abort_error_type_oneof)]
pub struct HttpFaultAbort {
    /// HTTP status code returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<i32>,
    /// gRPC status returned (e.g. `UNAVAILABLE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<String>,
    /// HTTP/2 error (not implemented by Istio; accepted for compatibility).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http2_error: Option<String>,
    /// Percentage of requests aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

sibling_oneofs!(HttpFaultAbort, transform = abort_error_type_oneof, {
    "error_type": [http_status: "httpStatus", grpc_status: "grpcStatus", http2_error: "http2Error"],
});

/// One mirror destination with its own percentage.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpMirrorPolicy {
    /// Where the traffic is mirrored; required.
    pub destination: Destination,
    /// Percentage of the traffic mirrored (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

/// Header manipulation for requests and responses.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Headers {
    /// Manipulation of request headers (before forwarding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    /// Manipulation of response headers (before returning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

/// Header operations: overwrite, append, remove.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HeaderOperations {
    /// Overwrite these headers.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub set: BTreeMap<String, String>,
    /// Append to these headers.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub add: BTreeMap<String, String>,
    /// Remove these headers.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub remove: Vec<String>,
}

/// gRPC status names `fault.abort.grpcStatus` accepts, in code order. Istio documents the
/// all-caps names only (`UNAVAILABLE`, not `14`).
pub const GRPC_STATUS_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The numeric code of a gRPC status name (`UNAVAILABLE` → 14).
pub fn grpc_status_code(name: &str) -> Option<u32> {
    GRPC_STATUS_NAMES
        .iter()
        .position(|n| *n == name)
        .map(|i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::common::Oneofs;
    use serde_json::json;

    #[test]
    fn enums_accept_every_istio_value() {
        for value in ["FROM_PROTOCOL_DEFAULT", "FROM_REQUEST_PORT"] {
            let parsed: RedirectPortSelection = serde_json::from_value(json!(value)).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), json!(value));
        }
        for value in ["UNSPECIFIED", "FORWARD", "IGNORE"] {
            let parsed: UnmatchedPreflights = serde_json::from_value(json!(value)).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), json!(value));
        }
    }

    /// The members each oneof group of a `T` parsed from `value` reports as set.
    fn set_members<T: serde::de::DeserializeOwned + Oneofs>(
        value: serde_json::Value,
    ) -> Vec<Vec<&'static str>> {
        let message: T = serde_json::from_value(value).unwrap();
        message.oneof_groups().into_iter().map(|g| g.set).collect()
    }

    /// `sibling_oneofs!` pairs each field with its JSON name: setting one member (by its
    /// JSON name) reports exactly that name.
    #[test]
    fn each_oneof_member_reports_under_its_json_name() {
        for (value, expected) in [
            (json!({"port": 8443}), "port"),
            (json!({"derivePort": "FROM_REQUEST_PORT"}), "derivePort"),
        ] {
            assert_eq!(set_members::<HttpRedirect>(value), vec![vec![expected]]);
        }
        for (value, expected) in [
            (json!({"string": "hi"}), "string"),
            (json!({"bytes": "aGk="}), "bytes"),
        ] {
            assert_eq!(set_members::<HttpBody>(value), vec![vec![expected]]);
        }
        for (value, expected) in [
            (json!({"fixedDelay": "1s"}), "fixedDelay"),
            (json!({"exponentialDelay": "1s"}), "exponentialDelay"),
        ] {
            assert_eq!(set_members::<HttpFaultDelay>(value), vec![vec![expected]]);
        }
        for (value, expected) in [
            (json!({"httpStatus": 503}), "httpStatus"),
            (json!({"grpcStatus": "UNAVAILABLE"}), "grpcStatus"),
            (json!({"http2Error": "REFUSED_STREAM"}), "http2Error"),
        ] {
            assert_eq!(set_members::<HttpFaultAbort>(value), vec![vec![expected]]);
        }
    }

    #[test]
    fn sibling_oneofs_report_what_is_set() {
        let redirect: HttpRedirect =
            serde_json::from_value(json!({"port": 8443, "derivePort": "FROM_REQUEST_PORT"}))
                .unwrap();
        assert_eq!(
            redirect.conflicting_oneofs()[0].set,
            vec!["port", "derivePort"]
        );
        let body: HttpBody = serde_json::from_value(json!({"bytes": "aGk="})).unwrap();
        assert_eq!(
            body.bytes.as_ref().map(|b| b.0.as_slice()),
            Some(&b"hi"[..])
        );
        assert!(body.conflicting_oneofs().is_empty());
        let abort: HttpFaultAbort =
            serde_json::from_value(json!({"httpStatus": 503, "grpcStatus": "UNAVAILABLE"}))
                .unwrap();
        assert_eq!(
            abort.oneof_groups()[0].set,
            vec!["httpStatus", "grpcStatus"]
        );
        let delay: HttpFaultDelay = serde_json::from_value(json!({"fixedDelay": "1s"})).unwrap();
        assert!(delay.conflicting_oneofs().is_empty());
    }

    #[test]
    fn negative_weights_parse_so_validation_can_report_them() {
        let destination: HttpRouteDestination =
            serde_json::from_value(json!({"destination": {"host": "a"}, "weight": -5})).unwrap();
        assert_eq!(destination.weight, Some(-5));
    }

    #[test]
    fn match_keyword_fields_and_aliases_use_istio_names() {
        let route: HttpRoute = serde_json::from_value(json!({
            "match": [{"uri": {"prefix": "/"}, "headers": {"x-canary": {}}}],
            "mirror_percent": 5
        }))
        .unwrap();
        assert_eq!(route.r#match[0].uri, Some(StringMatch::Prefix("/".into())));
        assert_eq!(route.r#match[0].headers["x-canary"], StringMatch::Any);
        assert_eq!(route.mirror_percent, Some(5));
        let written = serde_json::to_value(&route).unwrap();
        assert_eq!(written["mirrorPercent"], 5);
        assert_eq!(written["match"][0]["headers"]["x-canary"], json!({}));
    }

    #[test]
    fn null_lists_and_maps_read_as_empty() {
        let spec: VirtualServiceSpec =
            serde_json::from_value(json!({"hosts": null, "http": [{"match": null}]})).unwrap();
        assert!(spec.hosts.is_empty());
        assert!(spec.http[0].r#match.is_empty());
    }
}
