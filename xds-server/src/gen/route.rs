//! VirtualService HTTP routes → Envoy routes, in order: every match kind (URI, scheme,
//! method, authority, headers, `withoutHeaders`, query parameters, `ignoreUriCase`),
//! weighted destinations and subsets, retries, timeouts, fault injection and CORS
//! (per-route filter configs), mirroring, rewrites, redirects, direct responses and header
//! manipulation; and the default route when no VirtualService applies.
//!
//! A match whose `port`, `sourceLabels`, `sourceNamespace` or `gateways` exclude this
//! proxy and port is left out (and a route whose matches are all left out). A destination
//! the proxy has no cluster for (unknown host or port) never reaches the output: sidecars
//! send its share to `BlackHoleCluster` (503, as Envoy answers for a missing cluster);
//! proxyless clients drop it, and a route with no destination left fails its RPCs.
//!
//! Proxyless gRPC gets only what its xDS client implements (timeouts as
//! `max_stream_duration`, retries on gRPC status codes, header hash policies, faults);
//! the rest is left out with a log line and a metric.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{
    DataSource, HeaderValue, HeaderValueOption, RuntimeFractionalPercent, data_source,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::route::v3::{
    Decorator, DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction,
    RetryPolicy, Route, RouteAction, RouteMatch, WeightedCluster,
    header_matcher::HeaderMatchSpecifier,
    query_parameter_matcher::QueryParameterMatchSpecifier,
    redirect_action::{PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier},
    retry_policy::{RetryBackOff, RetryHostPredicate, RetryPriority},
    route::Action,
    route_action::{
        ClusterSpecifier, HashPolicy, HostRewriteSpecifier, MaxStreamDuration, RequestMirrorPolicy,
        hash_policy::{ConnectionProperties, Cookie, Header, PolicySpecifier, QueryParameter},
    },
    route_match::PathSpecifier,
    weighted_cluster::ClusterWeight,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{
    FaultDelay, fault_delay::FaultDelaySecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
    FaultAbort, HttpFault, fault_abort::ErrorType,
};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatchAndSubstitute;
use envoy_types::pb::google::protobuf::Any;
use pilotfish_mesh::api::{
    ConsistentHashLb, CorsPolicy as IstioCors, Destination, HeaderOperations, Headers,
    HttpFaultInjection, HttpMatchRequest, HttpRetry, HttpRoute, StringMatch, UnmatchedPreflights,
};
use pilotfish_mesh::model::{Proxy, labels_match};
use pilotfish_mesh::push_context::PushContext;

use super::metrics::{UNRESOLVED_DESTINATIONS, proxyless_downgrade};
use super::names;
use super::plan::OutboundPlan;
use super::scope::Flavor;
use super::util::{
    any, api_duration, bool_value, percent, percent_hundred, regex_matcher, string_matcher,
    u32_value, zero_duration,
};

/// HTTP filter names: per-route configs are keyed by them.
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
pub const CORS_FILTER: &str = "envoy.filters.http.cors";
pub const ROUTER_FILTER: &str = "envoy.filters.http.router";

/// Istio's default retry policy for sidecars (when a route sets no `retries`).
const DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";
/// The gRPC status names gRPC's xDS client retries on; others are ignored by it.
const GRPC_RETRY_ON: [&str; 5] = [
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

/// What route translation needs to know.
pub struct RouteEnv<'a> {
    pub push: &'a PushContext,
    pub proxy: &'a Proxy,
    pub flavor: Flavor,
    pub plan: &'a OutboundPlan,
    /// The port of the route configuration (the listener port for sidecars, the service
    /// port for proxyless clients).
    pub port: u32,
}

/// Routes for one VirtualService HTTP route: one Envoy route per applicable match.
pub fn http_route(env: &RouteEnv<'_>, route: &HttpRoute) -> Vec<Route> {
    let matches: Vec<Option<&HttpMatchRequest>> = if route.r#match.is_empty() {
        vec![None]
    } else {
        let applicable: Vec<_> = route
            .r#match
            .iter()
            .filter(|m| match_applies(env, m))
            .map(Some)
            .collect();
        if applicable.is_empty() {
            return Vec::new();
        }
        applicable
    };
    let action = route_action(env, route);
    matches
        .into_iter()
        .map(|m| {
            let mut out = Route {
                name: route_name(route, m),
                r#match: Some(route_match(m)),
                action: Some(action.action.clone()),
                typed_per_filter_config: action.per_filter.clone(),
                request_headers_to_add: action.request_add.clone(),
                request_headers_to_remove: action.request_remove.clone(),
                response_headers_to_add: action.response_add.clone(),
                response_headers_to_remove: action.response_remove.clone(),
                ..Default::default()
            };
            if let Some(prefix) = m.and_then(|m| m.stat_prefix.as_ref()) {
                out.stat_prefix.clone_from(prefix);
            }
            out
        })
        .collect()
}

/// Whether a match applies to this proxy and port.
fn match_applies(env: &RouteEnv<'_>, m: &HttpMatchRequest) -> bool {
    m.port.is_none_or(|p| p == env.port)
        && (m.gateways.is_empty() || m.gateways.iter().any(|g| g == "mesh"))
        && (m.source_labels.is_empty() || labels_match(&m.source_labels, &env.proxy.labels))
        && m.source_namespace
            .as_ref()
            .is_none_or(|ns| *ns == env.proxy.namespace)
}

/// Istio's route name: the route's name, with the match's name appended.
fn route_name(route: &HttpRoute, m: Option<&HttpMatchRequest>) -> String {
    match (route.name.as_deref(), m.and_then(|m| m.name.as_deref())) {
        (Some(r), Some(m)) => format!("{r}.{m}"),
        (Some(r), None) => r.to_string(),
        (None, Some(m)) => m.to_string(),
        (None, None) => String::new(),
    }
}

/// An Istio match → Envoy's; `None` matches everything (prefix `/`).
pub fn route_match(m: Option<&HttpMatchRequest>) -> RouteMatch {
    let mut out = RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix("/".into())),
        ..Default::default()
    };
    let Some(m) = m else {
        return out;
    };
    let ignore_case = m.ignore_uri_case == Some(true);
    match &m.uri {
        Some(StringMatch::Exact(p)) => out.path_specifier = Some(PathSpecifier::Path(p.clone())),
        Some(StringMatch::Prefix(p)) => out.path_specifier = Some(PathSpecifier::Prefix(p.clone())),
        Some(StringMatch::Regex(r)) => {
            out.path_specifier = Some(PathSpecifier::SafeRegex(regex_matcher(r)))
        }
        Some(StringMatch::Any) | None => {}
    }
    if ignore_case && matches!(m.uri, Some(StringMatch::Exact(_) | StringMatch::Prefix(_))) {
        out.case_sensitive = bool_value(false);
    }
    for (name, value) in [
        (":scheme", &m.scheme),
        (":method", &m.method),
        (":authority", &m.authority),
    ] {
        if let Some(v) = value {
            out.headers.push(header_matcher(name, v, false));
        }
    }
    for (name, v) in &m.headers {
        out.headers.push(header_matcher(name, v, false));
    }
    for (name, v) in &m.without_headers {
        out.headers.push(header_matcher(name, v, true));
    }
    for (name, v) in &m.query_params {
        let specifier = match v {
            StringMatch::Any => QueryParameterMatchSpecifier::PresentMatch(true),
            StringMatch::Exact(s) if s.is_empty() => {
                QueryParameterMatchSpecifier::PresentMatch(true)
            }
            other => match string_matcher(other, false) {
                Some(sm) => QueryParameterMatchSpecifier::StringMatch(sm),
                None => QueryParameterMatchSpecifier::PresentMatch(true),
            },
        };
        out.query_parameters.push(QueryParameterMatcher {
            name: name.clone(),
            query_parameter_match_specifier: Some(specifier),
        });
    }
    out
}

fn header_matcher(name: &str, m: &StringMatch, invert: bool) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        invert_match: invert,
        header_match_specifier: Some(match string_matcher(m, false) {
            Some(sm) => HeaderMatchSpecifier::StringMatch(sm),
            None => HeaderMatchSpecifier::PresentMatch(true),
        }),
        ..Default::default()
    }
}

/// The action shared by every match of one VirtualService route.
#[derive(Clone)]
struct TranslatedAction {
    action: Action,
    per_filter: HashMap<String, Any>,
    request_add: Vec<HeaderValueOption>,
    request_remove: Vec<String>,
    response_add: Vec<HeaderValueOption>,
    response_remove: Vec<String>,
}

fn route_action(env: &RouteEnv<'_>, route: &HttpRoute) -> TranslatedAction {
    let sidecar = env.flavor == Flavor::Sidecar;
    let mut out = TranslatedAction {
        action: Action::DirectResponse(DirectResponseAction {
            status: 503,
            ..Default::default()
        }),
        per_filter: HashMap::new(),
        request_add: Vec::new(),
        request_remove: Vec::new(),
        response_add: Vec::new(),
        response_remove: Vec::new(),
    };
    let mut host_rewrite: Option<String> = None;
    if let Some(headers) = &route.headers {
        if sidecar {
            apply_headers(headers, &mut out, &mut host_rewrite);
        } else {
            proxyless_downgrade(
                "header_manipulation",
                env.proxy.namespace.as_str(),
                "header manipulation",
            );
        }
    }
    if let Some(fault) = &route.fault
        && let Some(config) = fault_config(fault)
    {
        out.per_filter
            .insert(FAULT_FILTER.to_string(), any(&config));
    }
    if let Some(cors) = &route.cors_policy {
        if sidecar {
            out.per_filter
                .insert(CORS_FILTER.to_string(), any(&cors_policy(cors)));
        } else {
            proxyless_downgrade("cors", env.proxy.namespace.as_str(), "CORS");
        }
    }

    if let Some(redirect) = &route.redirect {
        out.action = Action::Redirect(redirect_action(redirect, env.port));
        return out;
    }
    if let Some(direct) = &route.direct_response {
        out.action = Action::DirectResponse(DirectResponseAction {
            status: direct.status,
            body: direct.body.as_ref().and_then(|b| {
                let specifier = if let Some(s) = &b.string {
                    data_source::Specifier::InlineString(s.clone())
                } else {
                    data_source::Specifier::InlineBytes(b.bytes.as_ref()?.0.clone())
                };
                Some(DataSource {
                    specifier: Some(specifier),
                    ..Default::default()
                })
            }),
            ..Default::default()
        });
        return out;
    }

    // Weighted destinations.
    let weights = normalized_weights(&route.route.iter().map(|d| d.weight).collect::<Vec<_>>());
    let mut clusters: Vec<(String, u32, Option<&Headers>)> = Vec::new();
    for (dest, weight) in route.route.iter().zip(weights) {
        if weight == 0 {
            continue;
        }
        match resolve(env, &dest.destination) {
            Some(name) => clusters.push((name, weight, dest.headers.as_ref())),
            None if sidecar => clusters.push((
                names::BLACKHOLE_CLUSTER.to_string(),
                weight,
                dest.headers.as_ref(),
            )),
            None => {}
        }
    }
    if clusters.is_empty() {
        // No destination resolved (proxyless), or no destination at all: 503.
        return out;
    }
    let mut action = RouteAction::default();
    if clusters.len() == 1 {
        let (name, _, headers) = clusters.remove(0);
        if let Some(h) = headers {
            if sidecar {
                apply_headers(h, &mut out, &mut host_rewrite);
            } else {
                proxyless_downgrade("header_manipulation", &name, "header manipulation");
            }
        }
        action.cluster_specifier = Some(ClusterSpecifier::Cluster(name));
    } else {
        let weighted = clusters
            .into_iter()
            .map(|(name, weight, headers)| {
                let mut cw = ClusterWeight {
                    name,
                    weight: u32_value(weight),
                    ..Default::default()
                };
                if let Some(h) = headers.filter(|_| sidecar) {
                    let mut scratch = TranslatedAction {
                        action: Action::DirectResponse(DirectResponseAction::default()),
                        per_filter: HashMap::new(),
                        request_add: Vec::new(),
                        request_remove: Vec::new(),
                        response_add: Vec::new(),
                        response_remove: Vec::new(),
                    };
                    let mut rewrite = None;
                    apply_headers(h, &mut scratch, &mut rewrite);
                    cw.request_headers_to_add = scratch.request_add;
                    cw.request_headers_to_remove = scratch.request_remove;
                    cw.response_headers_to_add = scratch.response_add;
                    cw.response_headers_to_remove = scratch.response_remove;
                    cw.host_rewrite_specifier = rewrite.map(
                        envoy_types::pb::envoy::config::route::v3::weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral,
                    );
                }
                cw
            })
            .collect();
        action.cluster_specifier = Some(ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: weighted,
            ..Default::default()
        }));
    }

    // Timeouts.
    let timeout = route.timeout.as_ref().and_then(api_duration);
    match env.flavor {
        Flavor::Sidecar => {
            action.timeout = timeout.or_else(zero_duration);
            action.max_stream_duration = Some(MaxStreamDuration {
                max_stream_duration: timeout.or_else(zero_duration),
                grpc_timeout_header_max: timeout.or_else(zero_duration),
                ..Default::default()
            });
        }
        // gRPC reads deadlines from max_stream_duration only.
        Flavor::Proxyless => {
            if timeout.is_some() {
                action.max_stream_duration = Some(MaxStreamDuration {
                    max_stream_duration: timeout,
                    grpc_timeout_header_max: timeout,
                    ..Default::default()
                });
            }
        }
    }
    action.retry_policy = retry_policy(route.retries.as_ref(), env.flavor);

    // Consistent-hash keys come from the DestinationRule of the first destination.
    if let Some(ClusterSpecifier::Cluster(first)) = &action.cluster_specifier
        && let Some(hash) = env
            .plan
            .get(first)
            .and_then(|c| c.policy.load_balancer.as_ref())
            .and_then(|l| l.consistent_hash.as_ref())
    {
        action.hash_policy = hash_policy(hash, env.flavor, first);
    } else if let Some(ClusterSpecifier::WeightedClusters(w)) = &action.cluster_specifier
        && let Some(hash) = w
            .clusters
            .first()
            .and_then(|c| env.plan.get(&c.name))
            .and_then(|c| c.policy.load_balancer.as_ref())
            .and_then(|l| l.consistent_hash.as_ref())
    {
        action.hash_policy = hash_policy(hash, env.flavor, &w.clusters[0].name);
    }

    // Mirroring.
    let mut mirrors: Vec<(&Destination, f64)> = Vec::new();
    if let Some(m) = &route.mirror {
        let pct = route
            .mirror_percentage
            .as_ref()
            .map(|p| p.value)
            .or(route.mirror_percent.map(f64::from))
            .unwrap_or(100.0);
        mirrors.push((m, pct));
    }
    for m in &route.mirrors {
        mirrors.push((
            &m.destination,
            m.percentage.as_ref().map_or(100.0, |p| p.value),
        ));
    }
    if !mirrors.is_empty() && !sidecar {
        proxyless_downgrade("mirror", env.proxy.namespace.as_str(), "request mirroring");
    } else {
        for (dest, pct) in mirrors {
            let Some(cluster) = resolve(env, dest) else {
                continue;
            };
            action.request_mirror_policies.push(RequestMirrorPolicy {
                cluster,
                runtime_fraction: Some(RuntimeFractionalPercent {
                    default_value: Some(percent(pct)),
                    ..Default::default()
                }),
                trace_sampled: bool_value(false),
                ..Default::default()
            });
        }
    }

    // Rewrites.
    if let Some(rewrite) = &route.rewrite {
        if sidecar {
            // Envoy accepts one of prefix_rewrite and regex_rewrite; the regex wins.
            if let Some(uri) = rewrite
                .uri
                .as_ref()
                .filter(|_| rewrite.uri_regex_rewrite.is_none())
            {
                action.prefix_rewrite.clone_from(uri);
            }
            if let Some(authority) = &rewrite.authority {
                host_rewrite = Some(authority.clone());
            }
            if let Some(rr) = &rewrite.uri_regex_rewrite
                && let Some(pattern) = &rr.r#match
            {
                action.regex_rewrite = Some(RegexMatchAndSubstitute {
                    pattern: Some(regex_matcher(pattern)),
                    substitution: rr.rewrite.clone().unwrap_or_default(),
                });
            }
        } else {
            proxyless_downgrade(
                "rewrite",
                env.proxy.namespace.as_str(),
                "URI/authority rewrites",
            );
        }
    }
    if let Some(host) = host_rewrite {
        action.host_rewrite_specifier = Some(HostRewriteSpecifier::HostRewriteLiteral(host));
    }
    out.action = Action::Route(action);
    out
}

/// Weights of a route's destinations: unset counts as 0, except that a route with no
/// weight at all splits evenly; if every weight is 0 the split is even too.
pub fn normalized_weights(weights: &[Option<i32>]) -> Vec<u32> {
    if weights.len() == 1 {
        return vec![1];
    }
    let given: Vec<u32> = weights
        .iter()
        .map(|w| w.unwrap_or(0).max(0) as u32)
        .collect();
    if given.iter().all(|w| *w == 0) {
        return vec![1; weights.len()];
    }
    given
}

/// The cluster a destination names: `Ok` when this proxy has it, else `Err` with the
/// name (HTTP routes answer 503 for it, TCP routes send it to `BlackHoleCluster`).
pub(crate) fn destination_cluster(
    env: &RouteEnv<'_>,
    dest: &Destination,
) -> Result<String, String> {
    let port = match &dest.port {
        Some(p) => p.number,
        None => env
            .push
            .service_for(&dest.host, &env.proxy.namespace)
            .and_then(|s| (s.ports.len() == 1).then(|| s.ports[0].port))
            .unwrap_or(env.port),
    };
    let name = names::outbound_cluster(port, dest.subset.as_deref().unwrap_or(""), &dest.host);
    if env.plan.contains(&name) {
        Ok(name)
    } else {
        Err(name)
    }
}

/// The cluster a destination names for this proxy, when the proxy has it.
fn resolve(env: &RouteEnv<'_>, dest: &Destination) -> Option<String> {
    destination_cluster(env, dest)
        .map_err(|name| {
            tracing::warn!(
                cluster = %name,
                namespace = %env.proxy.namespace,
                "route destination has no cluster for this proxy (unknown or invisible host or port); it answers 503"
            );
            UNRESOLVED_DESTINATIONS.with_label_values(&["http"]).inc();
        })
        .ok()
}

fn apply_headers(h: &Headers, out: &mut TranslatedAction, host_rewrite: &mut Option<String>) {
    if let Some(req) = &h.request {
        let (add, remove) = header_operations(req, Some(host_rewrite));
        out.request_add.extend(add);
        out.request_remove.extend(remove);
    }
    if let Some(resp) = &h.response {
        let (add, remove) = header_operations(resp, None);
        out.response_add.extend(add);
        out.response_remove.extend(remove);
    }
}

/// `set` overwrites, `add` appends, `remove` removes. Setting `host`/`:authority` on a
/// request is an authority rewrite (Envoy refuses to add those headers directly);
/// other pseudo-headers cannot be changed and are skipped.
fn header_operations(
    ops: &HeaderOperations,
    mut host_rewrite: Option<&mut Option<String>>,
) -> (Vec<HeaderValueOption>, Vec<String>) {
    let mut add = Vec::new();
    let mut push = |key: &str, value: &str, action: HeaderAppendAction| {
        let lower = key.to_ascii_lowercase();
        if (lower == "host" || lower == ":authority")
            && let Some(slot) = host_rewrite.as_deref_mut()
        {
            *slot = Some(value.to_string());
            return;
        }
        if lower.starts_with(':') {
            tracing::warn!(header = key, "pseudo-headers cannot be set; skipped");
            return;
        }
        add.push(HeaderValueOption {
            header: Some(HeaderValue {
                key: key.to_string(),
                value: value.to_string(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        });
    };
    for (k, v) in &ops.set {
        push(k, v, HeaderAppendAction::OverwriteIfExistsOrAdd);
    }
    for (k, v) in &ops.add {
        push(k, v, HeaderAppendAction::AppendIfExistsOrAdd);
    }
    // Envoy refuses to remove pseudo-headers and `host`.
    let remove = ops
        .remove
        .iter()
        .filter(|k| !k.starts_with(':') && !k.eq_ignore_ascii_case("host"))
        .cloned()
        .collect();
    (add, remove)
}

fn redirect_action(r: &pilotfish_mesh::api::HttpRedirect, listener_port: u32) -> RedirectAction {
    use pilotfish_mesh::api::RedirectPortSelection;
    RedirectAction {
        host_redirect: r.authority.clone().unwrap_or_default(),
        port_redirect: match (r.port, r.derive_port) {
            (Some(p), _) => p,
            (None, Some(RedirectPortSelection::FromRequestPort)) => listener_port,
            // FROM_PROTOCOL_DEFAULT: Envoy uses the scheme's default port when unset.
            _ => 0,
        },
        response_code: match r.redirect_code.unwrap_or(301) {
            302 => RedirectResponseCode::Found,
            303 => RedirectResponseCode::SeeOther,
            307 => RedirectResponseCode::TemporaryRedirect,
            308 => RedirectResponseCode::PermanentRedirect,
            _ => RedirectResponseCode::MovedPermanently,
        } as i32,
        scheme_rewrite_specifier: r.scheme.clone().map(SchemeRewriteSpecifier::SchemeRedirect),
        path_rewrite_specifier: r.uri.clone().map(PathRewriteSpecifier::PathRedirect),
        ..Default::default()
    }
}

/// Istio's retry policy for a route. Sidecars without `retries` get Istio's default (two
/// retries on connection failures and 503); `attempts: 0` disables retries.
pub fn retry_policy(retries: Option<&HttpRetry>, flavor: Flavor) -> Option<RetryPolicy> {
    let host_predicate = || {
        RetryHostPredicate {
        name: "envoy.retry_host_predicates.previous_hosts".to_string(),
        config_type: Some(
            envoy_types::pb::envoy::config::route::v3::retry_policy::retry_host_predicate::ConfigType::TypedConfig(
                any(&PreviousHostsPredicate {}),
            ),
        ),
    }
    };
    let Some(r) = retries else {
        return match flavor {
            Flavor::Sidecar => Some(RetryPolicy {
                retry_on: DEFAULT_RETRY_ON.to_string(),
                num_retries: u32_value(2),
                retry_host_predicate: vec![host_predicate()],
                host_selection_retry_max_attempts: 5,
                retriable_status_codes: vec![503],
                ..Default::default()
            }),
            Flavor::Proxyless => None,
        };
    };
    let attempts = r.attempts.unwrap_or(0);
    if attempts <= 0 {
        return None;
    }
    let (mut retry_on, codes): (Vec<String>, Vec<u32>) = match &r.retry_on {
        Some(s) => {
            let mut on = Vec::new();
            let mut codes = Vec::new();
            for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                match part.parse::<u32>() {
                    Ok(code) => codes.push(code),
                    Err(_) => on.push(part.to_string()),
                }
            }
            if !codes.is_empty() && !on.iter().any(|o| o == "retriable-status-codes") {
                on.push("retriable-status-codes".to_string());
            }
            (on, codes)
        }
        None => (
            DEFAULT_RETRY_ON.split(',').map(str::to_string).collect(),
            vec![503],
        ),
    };
    // Envoy and gRPC both require a positive base interval.
    let back_off = r
        .backoff
        .as_ref()
        .filter(|d| !d.as_std().is_zero())
        .and_then(api_duration)
        .map(|base| RetryBackOff {
            base_interval: Some(base),
            max_interval: None,
        });
    match flavor {
        Flavor::Sidecar => Some(RetryPolicy {
            retry_on: retry_on.join(","),
            num_retries: u32_value(attempts as u32),
            per_try_timeout: r.per_try_timeout.as_ref().and_then(api_duration),
            retry_host_predicate: if r.retry_ignore_previous_hosts.unwrap_or(true) {
                vec![host_predicate()]
            } else {
                Vec::new()
            },
            retry_priority: (r.retry_remote_localities == Some(true)).then(|| RetryPriority {
                name: "envoy.retry_priorities.previous_priorities".to_string(),
                config_type: Some(
                    envoy_types::pb::envoy::config::route::v3::retry_policy::retry_priority::ConfigType::TypedConfig(
                        any(&PreviousPrioritiesConfig { update_frequency: 2 }),
                    ),
                ),
            }),
            host_selection_retry_max_attempts: 5,
            retriable_status_codes: codes,
            retry_back_off: back_off,
            ..Default::default()
        }),
        Flavor::Proxyless => {
            let before = retry_on.len();
            retry_on.retain(|o| GRPC_RETRY_ON.contains(&o.as_str()));
            if retry_on.len() != before {
                proxyless_downgrade("retry_on", "route", "retry conditions other than gRPC status codes");
            }
            if retry_on.is_empty() {
                return None;
            }
            Some(RetryPolicy {
                retry_on: retry_on.join(","),
                num_retries: u32_value(attempts as u32),
                retry_back_off: back_off,
                ..Default::default()
            })
        }
    }
}

/// Consistent-hash keys of a DestinationRule. gRPC hashes on headers only.
pub fn hash_policy(hash: &ConsistentHashLb, flavor: Flavor, cluster: &str) -> Vec<HashPolicy> {
    let specifier = if let Some(h) = &hash.http_header_name {
        PolicySpecifier::Header(Header {
            header_name: h.clone(),
            ..Default::default()
        })
    } else if flavor == Flavor::Proxyless {
        if hash.http_cookie.is_some()
            || hash.use_source_ip.is_some()
            || hash.http_query_parameter_name.is_some()
        {
            proxyless_downgrade(
                "hash_policy",
                cluster,
                "hashing on cookies, source IP or query parameters",
            );
        }
        return Vec::new();
    } else if let Some(c) = &hash.http_cookie {
        PolicySpecifier::Cookie(Cookie {
            name: c.name.clone(),
            ttl: c.ttl.as_ref().and_then(api_duration),
            path: c.path.clone().unwrap_or_default(),
            ..Default::default()
        })
    } else if hash.use_source_ip == Some(true) {
        PolicySpecifier::ConnectionProperties(ConnectionProperties { source_ip: true })
    } else if let Some(q) = &hash.http_query_parameter_name {
        PolicySpecifier::QueryParameter(QueryParameter { name: q.clone() })
    } else {
        return Vec::new();
    };
    vec![HashPolicy {
        policy_specifier: Some(specifier),
        ..Default::default()
    }]
}

/// Fault injection as the fault filter's per-route config. A missing percentage means
/// every request (Istio's reading); `exponentialDelay` and `http2Error` are not
/// implemented by Istio either and are left out.
pub fn fault_config(f: &HttpFaultInjection) -> Option<HttpFault> {
    let mut out = HttpFault::default();
    if let Some(d) = &f.delay
        && let Some(fixed) = d.fixed_delay.as_ref().filter(|d| !d.as_std().is_zero())
    {
        out.delay = Some(FaultDelay {
            percentage: Some(match (&d.percentage, d.percent) {
                (Some(p), _) => percent(p.value),
                (None, Some(p)) => percent_hundred(p.max(0) as u32),
                (None, None) => percent(100.0),
            }),
            fault_delay_secifier: Some(FaultDelaySecifier::FixedDelay(
                api_duration(fixed).unwrap_or_default(),
            )),
        });
    }
    if let Some(a) = &f.abort {
        let error = if let Some(s) = a.http_status.filter(|s| (200..600).contains(s)) {
            Some(ErrorType::HttpStatus(s as u32))
        } else {
            a.grpc_status
                .as_deref()
                .and_then(pilotfish_mesh::api::grpc_status_code)
                .map(ErrorType::GrpcStatus)
        };
        if let Some(error) = error {
            out.abort = Some(FaultAbort {
                percentage: Some(
                    a.percentage
                        .as_ref()
                        .map_or(percent(100.0), |p| percent(p.value)),
                ),
                error_type: Some(error),
                ..Default::default()
            });
        }
    }
    (out.delay.is_some() || out.abort.is_some()).then_some(out)
}

/// A CORS policy as the CORS filter's per-route config.
pub fn cors_policy(c: &IstioCors) -> CorsPolicy {
    let mut origins: Vec<_> = c
        .allow_origins
        .iter()
        .filter_map(|m| string_matcher(m, false))
        .collect();
    origins.extend(
        c.allow_origin
            .iter()
            .filter_map(|o| string_matcher(&StringMatch::Exact(o.clone()), false)),
    );
    CorsPolicy {
        allow_origin_string_match: origins,
        allow_methods: c.allow_methods.join(","),
        allow_headers: c.allow_headers.join(","),
        expose_headers: c.expose_headers.join(","),
        max_age: c
            .max_age
            .as_ref()
            .map(|d| d.as_std().as_secs().to_string())
            .unwrap_or_default(),
        allow_credentials: c.allow_credentials.and_then(bool_value),
        forward_not_matching_preflights: match c.unmatched_preflights {
            Some(UnmatchedPreflights::Ignore) => bool_value(false),
            Some(UnmatchedPreflights::Forward) => bool_value(true),
            _ => None,
        },
        ..Default::default()
    }
}

/// The route used when no VirtualService applies: everything to the service's cluster,
/// with Istio's default timeout (none) and retry policy.
pub fn default_route(env: &RouteEnv<'_>, cluster: &str, host: &str, port: u32) -> Route {
    let mut action = RouteAction {
        cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.to_string())),
        retry_policy: retry_policy(None, env.flavor),
        ..Default::default()
    };
    if env.flavor == Flavor::Sidecar {
        action.timeout = zero_duration();
        action.max_stream_duration = Some(MaxStreamDuration {
            max_stream_duration: zero_duration(),
            grpc_timeout_header_max: zero_duration(),
            ..Default::default()
        });
    }
    if let Some(hash) = env
        .plan
        .get(cluster)
        .and_then(|c| c.policy.load_balancer.as_ref())
        .and_then(|l| l.consistent_hash.as_ref())
    {
        action.hash_policy = hash_policy(hash, env.flavor, cluster);
    }
    Route {
        name: "default".to_string(),
        r#match: Some(route_match(None)),
        decorator: (env.flavor == Flavor::Sidecar).then(|| Decorator {
            operation: format!("{host}:{port}/*"),
            ..Default::default()
        }),
        action: Some(Action::Route(action)),
        ..Default::default()
    }
}

/// A catch-all route: to `cluster`, or (without one) a fixed `status` response.
pub fn catch_all_route(name: &str, cluster: Option<&str>, status: u32) -> Route {
    let action = match cluster {
        Some(c) => Action::Route(RouteAction {
            cluster_specifier: Some(ClusterSpecifier::Cluster(c.to_string())),
            timeout: zero_duration(),
            ..Default::default()
        }),
        None => Action::DirectResponse(DirectResponseAction {
            status,
            ..Default::default()
        }),
    };
    Route {
        name: name.to_string(),
        r#match: Some(route_match(None)),
        action: Some(action),
        ..Default::default()
    }
}

/// The HTTP filter configs used by listeners (typed, for the filter chain).
pub fn http_filter(
    name: &str,
    config: Any,
) -> envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter {
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType;
    envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter {
        name: name.to_string(),
        config_type: Some(ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(v: serde_json::Value) -> HttpMatchRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn weights_are_normalised() {
        assert_eq!(normalized_weights(&[Some(80), Some(20)]), [80, 20]);
        assert_eq!(normalized_weights(&[None, None]), [1, 1]);
        assert_eq!(normalized_weights(&[Some(0), Some(0)]), [1, 1]);
        assert_eq!(normalized_weights(&[Some(100), None]), [100, 0]);
        assert_eq!(
            normalized_weights(&[Some(0)]),
            [1],
            "a single destination takes everything"
        );
        assert_eq!(normalized_weights(&[Some(-5), Some(10)]), [0, 10]);
    }

    #[test]
    fn uri_matches_map_to_path_specifiers() {
        let exact = route_match(Some(&m(
            json!({"uri": {"exact": "/a"}, "ignoreUriCase": true}),
        )));
        assert_eq!(exact.path_specifier, Some(PathSpecifier::Path("/a".into())));
        assert_eq!(exact.case_sensitive, bool_value(false));
        let regex = route_match(Some(&m(
            json!({"uri": {"regex": "/a/[0-9]+"}, "ignoreUriCase": true}),
        )));
        assert!(matches!(
            regex.path_specifier,
            Some(PathSpecifier::SafeRegex(_))
        ));
        assert_eq!(
            regex.case_sensitive, None,
            "case folding does not apply to regexes"
        );
        let none = route_match(Some(&m(json!({"headers": {"x": {"exact": "1"}}}))));
        assert_eq!(none.path_specifier, Some(PathSpecifier::Prefix("/".into())));
    }

    #[test]
    fn header_like_matches_become_header_matchers() {
        let r = route_match(Some(&m(json!({
            "method": {"exact": "GET"},
            "authority": {"prefix": "api."},
            "scheme": {"exact": "https"},
            "headers": {"x-user": {"regex": "a.*"}, "x-present": {}},
            "withoutHeaders": {"x-debug": {}},
            "queryParams": {"q": {"exact": ""}, "v": {"prefix": "1"}}
        }))));
        let names: Vec<(&str, bool)> = r
            .headers
            .iter()
            .map(|h| (h.name.as_str(), h.invert_match))
            .collect();
        assert_eq!(
            names,
            [
                (":scheme", false),
                (":method", false),
                (":authority", false),
                ("x-present", false),
                ("x-user", false),
                ("x-debug", true)
            ]
        );
        assert_eq!(
            r.headers[3].header_match_specifier,
            Some(HeaderMatchSpecifier::PresentMatch(true))
        );
        assert_eq!(
            r.query_parameters[0].query_parameter_match_specifier,
            Some(QueryParameterMatchSpecifier::PresentMatch(true))
        );
        assert!(matches!(
            r.query_parameters[1].query_parameter_match_specifier,
            Some(QueryParameterMatchSpecifier::StringMatch(_))
        ));
    }

    #[test]
    fn retries_follow_istio_defaults_and_gating() {
        let default = retry_policy(None, Flavor::Sidecar).unwrap();
        assert_eq!(default.num_retries, u32_value(2));
        assert_eq!(default.retriable_status_codes, [503]);
        assert!(retry_policy(None, Flavor::Proxyless).is_none());
        let r: HttpRetry = serde_json::from_value(json!({
            "attempts": 3, "perTryTimeout": "2s", "retryOn": "gateway-error,503,unavailable",
            "retryRemoteLocalities": true, "retryIgnorePreviousHosts": false, "backoff": "100ms"
        }))
        .unwrap();
        let p = retry_policy(Some(&r), Flavor::Sidecar).unwrap();
        assert_eq!(
            p.retry_on,
            "gateway-error,unavailable,retriable-status-codes"
        );
        assert_eq!(p.retriable_status_codes, [503]);
        assert!(p.retry_host_predicate.is_empty());
        assert!(p.retry_priority.is_some());
        assert_eq!(p.per_try_timeout.unwrap().seconds, 2);
        let g = retry_policy(Some(&r), Flavor::Proxyless).unwrap();
        assert_eq!(g.retry_on, "unavailable");
        assert!(g.per_try_timeout.is_none());
        let off: HttpRetry = serde_json::from_value(json!({"attempts": 0})).unwrap();
        assert!(retry_policy(Some(&off), Flavor::Sidecar).is_none());
    }

    #[test]
    fn hash_policies_per_key_and_proxyless_gating() {
        let h: ConsistentHashLb =
            serde_json::from_value(json!({"httpCookie": {"name": "s", "ttl": "10s"}})).unwrap();
        let p = hash_policy(&h, Flavor::Sidecar, "c");
        assert!(matches!(
            p[0].policy_specifier,
            Some(PolicySpecifier::Cookie(_))
        ));
        assert!(hash_policy(&h, Flavor::Proxyless, "c").is_empty());
        let h: ConsistentHashLb =
            serde_json::from_value(json!({"httpHeaderName": "x-user"})).unwrap();
        assert_eq!(hash_policy(&h, Flavor::Proxyless, "c").len(), 1);
        let h: ConsistentHashLb = serde_json::from_value(json!({"useSourceIp": true})).unwrap();
        assert!(matches!(
            hash_policy(&h, Flavor::Sidecar, "c")[0].policy_specifier,
            Some(PolicySpecifier::ConnectionProperties(
                ConnectionProperties { source_ip: true }
            ))
        ));
    }

    #[test]
    fn faults_default_to_every_request() {
        let f: HttpFaultInjection = serde_json::from_value(json!({
            "delay": {"fixedDelay": "5s"},
            "abort": {"grpcStatus": "UNAVAILABLE", "percentage": {"value": 10}}
        }))
        .unwrap();
        let c = fault_config(&f).unwrap();
        assert_eq!(c.delay.unwrap().percentage.unwrap().numerator, 1_000_000);
        let abort = c.abort.unwrap();
        assert_eq!(abort.error_type, Some(ErrorType::GrpcStatus(14)));
        assert_eq!(abort.percentage.unwrap().numerator, 100_000);
        let legacy: HttpFaultInjection =
            serde_json::from_value(json!({"delay": {"fixedDelay": "1s", "percent": 30}})).unwrap();
        assert_eq!(
            fault_config(&legacy)
                .unwrap()
                .delay
                .unwrap()
                .percentage
                .unwrap()
                .numerator,
            30
        );
    }

    #[test]
    fn header_operations_turn_host_into_a_rewrite() {
        let ops: HeaderOperations = serde_json::from_value(json!({
            "set": {"host": "b.example.com", "x-a": "1"}, "add": {"x-b": "2"}, "remove": ["x-c", ":path"]
        }))
        .unwrap();
        let mut rewrite = None;
        let (add, remove) = header_operations(&ops, Some(&mut rewrite));
        assert_eq!(rewrite.as_deref(), Some("b.example.com"));
        assert_eq!(add.len(), 2);
        assert_eq!(
            add[0].append_action,
            HeaderAppendAction::OverwriteIfExistsOrAdd as i32
        );
        assert_eq!(remove, ["x-c"]);
    }

    #[test]
    fn cors_maps_origins_and_preflight_handling() {
        let c: IstioCors = serde_json::from_value(json!({
            "allowOrigins": [{"exact": "https://a.com"}, {"regex": ".*\\.b\\.com"}],
            "allowOrigin": ["https://legacy.com"],
            "allowMethods": ["GET", "POST"], "maxAge": "24h", "allowCredentials": true,
            "unmatchedPreflights": "IGNORE"
        }))
        .unwrap();
        let p = cors_policy(&c);
        assert_eq!(p.allow_origin_string_match.len(), 3);
        assert_eq!(p.allow_methods, "GET,POST");
        assert_eq!(p.max_age, "86400");
        assert_eq!(p.forward_not_matching_preflights, bool_value(false));
    }
}
