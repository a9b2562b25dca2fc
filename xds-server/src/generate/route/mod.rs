//! VirtualService HTTP routes → Envoy routes. Each route is translated once, for
//! Envoy's full feature set: its matches and name here (every match kind — URI, scheme,
//! method, authority, headers, `withoutHeaders`, query parameters, `ignoreUriCase`), its
//! action in [`action`] (weighted destinations and subsets, redirects, direct responses,
//! rewrites, header manipulation) and how it treats requests in [`policy`] (retries,
//! timeouts, hash keys, fault injection, CORS, mirroring); then one Envoy route per
//! applicable match. The default route applies when no VirtualService does.
//!
//! A match whose `port`, `sourceLabels`, `sourceNamespace` or `gateways` exclude this
//! proxy and port is left out (and a route whose matches are all left out).
//!
//! Proxyless gRPC clients get the same translation passed through [`restrict`], which
//! removes what gRPC's xDS client lacks — header manipulation, CORS, mirroring, rewrites,
//! retry conditions other than gRPC status codes, hash keys other than headers, timeouts
//! outside `max_stream_duration`, and destinations without a cluster (gRPC has no
//! `BlackHoleCluster`: a route with none left fails its RPCs) — and returns each removal
//! as a [`Downgrade`]. Nothing here logs or counts: findings are returned, and the
//! snapshot reports them.

pub mod action;
pub mod policy;

use envoy_types::pb::envoy::config::route::v3::{
    Decorator, DirectResponseAction, HeaderMatcher, QueryParameterMatcher, Route, RouteAction,
    RouteMatch, WeightedCluster, header_matcher::HeaderMatchSpecifier,
    query_parameter_matcher::QueryParameterMatchSpecifier, route::Action,
    route_action::ClusterSpecifier, route_match::PathSpecifier, weighted_cluster::ClusterWeight,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter::ConfigType,
};
use envoy_types::pb::google::protobuf::Any;
use pilotfish_mesh::api::{HttpMatchRequest, HttpRoute, StringMatch};
use pilotfish_mesh::model::labels_match;

pub use action::{RouteEnv, TranslatedAction, destination_cluster, normalized_weights};

use super::findings::{Downgrade, Finding};
use super::names;
use super::scope::Flavor;
use super::util::{any, bool_value, regex_matcher, string_matcher, u32_value, zero_duration};

/// HTTP filter names: per-route configs are keyed by them.
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
pub const CORS_FILTER: &str = "envoy.filters.http.cors";
pub const ROUTER_FILTER: &str = "envoy.filters.http.router";

/// Routes for one VirtualService HTTP route, for a client of `flavor`: one Envoy route per
/// applicable match, and what translation (and, for proxyless clients, [`restrict`])
/// found.
pub fn http_route(
    env: &RouteEnv<'_>,
    route: &HttpRoute,
    flavor: Flavor,
) -> (Vec<Route>, Vec<Finding>) {
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
            return (Vec::new(), Vec::new());
        }
        applicable
    };
    let mut t = translate(env, route);
    let downgrades = match flavor {
        Flavor::Sidecar => Vec::new(),
        Flavor::Proxyless => restrict(env, route, &mut t),
    };
    let routes = matches
        .into_iter()
        .map(|m| {
            let mut out = Route {
                name: route_name(route, m),
                r#match: Some(route_match(m)),
                action: Some(t.action.clone()),
                typed_per_filter_config: t.per_filter.clone(),
                request_headers_to_add: t.request_add.clone(),
                request_headers_to_remove: t.request_remove.clone(),
                response_headers_to_add: t.response_add.clone(),
                response_headers_to_remove: t.response_remove.clone(),
                ..Default::default()
            };
            if let Some(prefix) = m.and_then(|m| m.stat_prefix.as_ref()) {
                out.stat_prefix.clone_from(prefix);
            }
            out
        })
        .collect();
    let findings = t
        .header_findings
        .into_iter()
        .chain(t.unresolved)
        .chain(t.mirror_findings)
        .chain(downgrades.into_iter().map(Finding::Downgrade))
        .collect();
    (routes, findings)
}

/// The action every match of `route` shares, for Envoy's full feature set.
pub fn translate(env: &RouteEnv<'_>, route: &HttpRoute) -> TranslatedAction {
    let mut t = TranslatedAction::unavailable();
    let mut host_rewrite: Option<String> = None;
    if let Some(headers) = &route.headers {
        t.apply_headers(headers, &mut host_rewrite);
    }
    if let Some(fault) = &route.fault
        && let Some(config) = policy::fault_config(fault)
    {
        t.per_filter.insert(FAULT_FILTER.to_string(), any(&config));
    }
    if let Some(cors) = &route.cors_policy {
        t.per_filter
            .insert(CORS_FILTER.to_string(), any(&policy::cors_policy(cors)));
    }
    if let Some(redirect) = &route.redirect {
        t.action = Action::Redirect(action::redirect_action(redirect, env.port));
        return t;
    }
    if let Some(direct) = &route.direct_response {
        t.action = Action::DirectResponse(action::direct_response(direct));
        return t;
    }
    // No destination at all: the route answers 503.
    let Some(clusters) = action::destinations(env, route, &mut t, &mut host_rewrite) else {
        return t;
    };
    let mut ra = RouteAction {
        cluster_specifier: Some(clusters),
        ..Default::default()
    };
    policy::apply_timeouts(&mut ra, route.timeout.as_ref());
    ra.hash_policy = policy::route_hash_policy(env.plan, &ra);
    // Istio keeps a retry on the hashed host only for a single destination.
    let consistent_hash = matches!(ra.cluster_specifier, Some(ClusterSpecifier::Cluster(_)))
        && !ra.hash_policy.is_empty();
    ra.retry_policy = policy::retry_policy(route.retries.as_ref(), consistent_hash);
    ra.request_mirror_policies = policy::mirror_policies(env, route, &mut t.mirror_findings);
    if let Some(rewrite) = &route.rewrite {
        action::apply_rewrite(rewrite, &mut ra, &mut host_rewrite);
    }
    action::apply_host_rewrite(&mut ra, host_rewrite);
    t.action = Action::Route(ra);
    t
}

/// The proxyless pass: removes from a translated route what gRPC's xDS client lacks (or
/// would reject) and returns what it removed, in the order the features are translated.
pub fn restrict(env: &RouteEnv<'_>, route: &HttpRoute, t: &mut TranslatedAction) -> Vec<Downgrade> {
    let namespace = env.proxy.namespace.as_str();
    let mut out = Vec::new();
    if route.headers.is_some() {
        out.push(Downgrade::new(
            "header_manipulation",
            namespace,
            "header manipulation",
        ));
    }
    // Header operations of the destinations go too (without a downgrade of their own
    // unless a single destination is left, below).
    t.clear_headers();
    if route.cors_policy.is_some() {
        out.push(Downgrade::new("cors", namespace, "CORS"));
    }
    t.per_filter.remove(CORS_FILTER);
    // Mirrors are never resolved for gRPC: nothing to say about theirs.
    t.mirror_findings.clear();
    // Redirects and direct responses stay as they are.
    let Action::Route(ra) = &mut t.action else {
        return out;
    };
    // Destinations without a cluster went to BlackHoleCluster, which gRPC does not have:
    // they are dropped, and a route with none left answers 503.
    let destinations = action::weighted_destinations(route);
    let kept: Vec<_> = ra
        .cluster_specifier
        .as_ref()
        .map(action::cluster_entries)
        .unwrap_or_default()
        .into_iter()
        .zip(destinations)
        .filter(|((name, _), _)| name != names::BLACKHOLE_CLUSTER)
        .collect();
    match kept.as_slice() {
        [] => {
            t.action = Action::DirectResponse(DirectResponseAction {
                status: 503,
                ..Default::default()
            });
            return out;
        }
        [((name, _), (dest, _))] => {
            if dest.headers.is_some() {
                out.push(Downgrade::new(
                    "header_manipulation",
                    name.as_str(),
                    "header manipulation",
                ));
            }
            ra.cluster_specifier = Some(ClusterSpecifier::Cluster(name.clone()));
        }
        several => {
            let clusters = several
                .iter()
                .map(|((name, weight), _)| ClusterWeight {
                    name: name.clone(),
                    weight: weight.and_then(u32_value),
                    ..Default::default()
                })
                .collect();
            ra.cluster_specifier = Some(ClusterSpecifier::WeightedClusters(WeightedCluster {
                clusters,
                ..Default::default()
            }));
        }
    }
    policy::restrict_timeouts(ra, route.timeout.as_ref());
    out.extend(policy::restrict_retry(
        route.retries.as_ref(),
        &mut ra.retry_policy,
    ));
    out.extend(policy::restrict_hash(env.plan, ra));
    if !policy::mirrors(route).is_empty() {
        out.push(Downgrade::new("mirror", namespace, "request mirroring"));
    }
    ra.request_mirror_policies.clear();
    if route.rewrite.is_some() {
        out.push(Downgrade::new(
            "rewrite",
            namespace,
            "URI/authority rewrites",
        ));
    }
    action::clear_rewrites(ra);
    out
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

/// The route used when no VirtualService applies: everything to the service's cluster,
/// with Istio's default timeout (none) and retry policy; for proxyless clients without
/// the retry policy, timeouts and decorator, and with header hash keys only.
pub fn default_route(
    env: &RouteEnv<'_>,
    cluster: &str,
    host: &str,
    port: u32,
    flavor: Flavor,
) -> (Route, Vec<Downgrade>) {
    let mut action = RouteAction {
        cluster_specifier: Some(ClusterSpecifier::Cluster(cluster.to_string())),
        // Istio's default route keeps the previous-hosts predicate even when hashing.
        retry_policy: policy::retry_policy(None, false),
        ..Default::default()
    };
    policy::apply_timeouts(&mut action, None);
    action.hash_policy = policy::route_hash_policy(env.plan, &action);
    let mut downgrades = Vec::new();
    let decorator = match flavor {
        Flavor::Sidecar => Some(Decorator {
            operation: format!("{host}:{port}/*"),
            ..Default::default()
        }),
        Flavor::Proxyless => {
            policy::restrict_timeouts(&mut action, None);
            downgrades.extend(policy::restrict_retry(None, &mut action.retry_policy));
            downgrades.extend(policy::restrict_hash(env.plan, &mut action));
            None
        }
    };
    let route = Route {
        name: "default".to_string(),
        r#match: Some(route_match(None)),
        decorator,
        action: Some(Action::Route(action)),
        ..Default::default()
    };
    (route, downgrades)
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

/// An HTTP filter of a listener's filter chain, with its typed config.
pub fn http_filter(name: &str, config: Any) -> HttpFilter {
    HttpFilter {
        name: name.to_string(),
        config_type: Some(ConfigType::TypedConfig(config)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::findings::RouteKind;
    use crate::generate::plan::{OutboundPlan, outbound_plan};
    use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy::PolicySpecifier;
    use pilotfish_mesh::document::{parse_text, to_inputs};
    use pilotfish_mesh::model::Proxy;
    use pilotfish_mesh::push_context::{BuildInputs, PushContext, build};
    use serde_json::json;

    fn m(v: serde_json::Value) -> HttpMatchRequest {
        serde_json::from_value(v).unwrap()
    }

    /// Services `a` (its DestinationRule hashes on a cookie) and `b` (on a header).
    const MESH: &str = "\
apiVersion: v1
kind: Service
metadata: {name: a, namespace: shop}
spec: {clusterIP: 10.96.0.1, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: b, namespace: shop}
spec: {clusterIP: 10.96.0.2, ports: [{name: http, port: 80}]}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: a, namespace: shop}
spec: {host: a, trafficPolicy: {loadBalancer: {consistentHash: {httpCookie: {name: s, ttl: 10s}}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: b, namespace: shop}
spec: {host: b, trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}}
";

    fn mesh() -> (PushContext, Proxy, OutboundPlan) {
        let parsed = parse_text(std::path::Path::new("t.yaml"), MESH);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let inputs = to_inputs(
            &parsed.objects,
            BuildInputs {
                cluster_domain: "cluster.local".into(),
                ..Default::default()
            },
        );
        let push = build(&inputs, None).context;
        let proxy = Proxy {
            namespace: "shop".into(),
            ..Proxy::with_defaults("sidecar~10.0.0.1~c.shop~shop.svc.cluster.local")
        };
        let sidecar = std::sync::Arc::new(push.sidecar_scope(None, &proxy.namespace));
        let plan = outbound_plan(&push, &proxy, sidecar, Flavor::Sidecar, &mut Vec::new());
        (push, proxy, plan)
    }

    /// A route as the builder hands it over (hosts are fully qualified by then).
    fn http(v: serde_json::Value) -> HttpRoute {
        serde_json::from_value(v).unwrap()
    }

    const A: &str = "outbound|80||a.shop.svc.cluster.local";
    const B: &str = "outbound|80||b.shop.svc.cluster.local";

    fn route_action(t: &TranslatedAction) -> &RouteAction {
        match &t.action {
            Action::Route(ra) => ra,
            other => panic!("expected a route action, got {other:?}"),
        }
    }

    #[test]
    fn translation_is_for_envoy_and_the_proxyless_pass_returns_what_it_removed() {
        let (push, proxy, plan) = mesh();
        let env = RouteEnv {
            push: &push,
            proxy: &proxy,
            plan: &plan,
            port: 80,
            egress: None,
        };
        let route = http(json!({
            "route": [
                {"destination": {"host": "nope.shop.svc.cluster.local"}, "weight": 40},
                {"destination": {"host": "a.shop.svc.cluster.local"}, "weight": 60,
                 "headers": {"request": {"set": {"x-a": "1"}}}}
            ],
            "corsPolicy": {"allowOrigins": [{"exact": "https://a.com"}]},
            "fault": {"abort": {"httpStatus": 500}},
            "mirror": {"host": "nope-mirror.shop.svc.cluster.local"},
            "rewrite": {"uri": "/v2"},
            "retries": {"attempts": 2, "retryOn": "5xx,unavailable"},
            "timeout": "3s"
        }));
        let mut t = translate(&env, &route);
        // Envoy's view: the unknown destination's share answers 503 through BlackHole.
        let ra = route_action(&t);
        let Some(ClusterSpecifier::WeightedClusters(w)) = &ra.cluster_specifier else {
            panic!("weighted clusters expected: {ra:?}");
        };
        let names: Vec<&str> = w.clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, [names::BLACKHOLE_CLUSTER, A]);
        assert_eq!(ra.prefix_rewrite, "/v2");
        assert!(
            ra.hash_policy.is_empty(),
            "the first cluster (BlackHole) has no rule"
        );
        assert!(t.per_filter.contains_key(CORS_FILTER));
        assert_eq!(t.unresolved.len(), 1);
        assert_eq!(
            t.mirror_findings.len(),
            1,
            "the mirror's host is unknown too"
        );

        let downgrades = restrict(&env, &route, &mut t);
        let features: Vec<(&str, &str)> = downgrades
            .iter()
            .map(|d| (d.feature, d.resource.as_str()))
            .collect();
        assert_eq!(
            features,
            [
                ("cors", "shop"),
                ("header_manipulation", A),
                ("retry_on", "route"),
                ("hash_policy", A),
                ("mirror", "shop"),
                ("rewrite", "shop"),
            ]
        );
        let ra = route_action(&t);
        assert_eq!(
            ra.cluster_specifier,
            Some(ClusterSpecifier::Cluster(A.into())),
            "gRPC has no BlackHole: the unknown destination is dropped"
        );
        assert!(ra.hash_policy.is_empty(), "gRPC hashes on headers only");
        assert!(ra.prefix_rewrite.is_empty() && ra.request_mirror_policies.is_empty());
        assert_eq!(
            ra.retry_policy.as_ref().map(|r| r.retry_on.as_str()),
            Some("unavailable")
        );
        assert_eq!(ra.timeout, None);
        assert!(
            ra.max_stream_duration.is_some(),
            "deadlines through max_stream_duration"
        );
        assert!(!t.per_filter.contains_key(CORS_FILTER) && t.per_filter.contains_key(FAULT_FILTER));
        assert!(
            t.mirror_findings.is_empty(),
            "mirrors are not resolved for gRPC"
        );
        assert_eq!(
            t.unresolved,
            [Finding::UnresolvedDestination {
                kind: RouteKind::Http,
                cluster: "outbound|80||nope.shop.svc.cluster.local".into(),
                namespace: "shop".into(),
            }]
        );
    }

    #[test]
    fn proxyless_hash_keys_come_from_the_first_cluster_left() {
        let (push, proxy, plan) = mesh();
        let env = RouteEnv {
            push: &push,
            proxy: &proxy,
            plan: &plan,
            port: 80,
            egress: None,
        };
        let route = http(json!({"route": [
            {"destination": {"host": "nope.shop.svc.cluster.local"}, "weight": 20},
            {"destination": {"host": "b.shop.svc.cluster.local"}, "weight": 40},
            {"destination": {"host": "a.shop.svc.cluster.local"}, "weight": 40}
        ]}));
        let (sidecar, findings) = http_route(&env, &route, Flavor::Sidecar);
        assert_eq!(findings.len(), 1, "{findings:?}");
        let Some(Action::Route(ra)) = &sidecar[0].action else {
            panic!()
        };
        assert!(ra.hash_policy.is_empty());
        let (proxyless, findings) = http_route(&env, &route, Flavor::Proxyless);
        assert_eq!(
            findings.len(),
            1,
            "only the unresolved destination: {findings:?}"
        );
        let Some(Action::Route(ra)) = &proxyless[0].action else {
            panic!()
        };
        let Some(ClusterSpecifier::WeightedClusters(w)) = &ra.cluster_specifier else {
            panic!("{ra:?}")
        };
        let kept: Vec<(&str, u32)> = w
            .clusters
            .iter()
            .map(|c| (c.name.as_str(), c.weight.map_or(0, |w| w.value)))
            .collect();
        assert_eq!(kept, [(B, 40), (A, 40)], "weights stay as configured");
        assert!(matches!(
            ra.hash_policy
                .first()
                .and_then(|h| h.policy_specifier.as_ref()),
            Some(PolicySpecifier::Header(_))
        ));
    }

    #[test]
    fn proxyless_routes_without_a_destination_left_answer_503() {
        let (push, proxy, plan) = mesh();
        let env = RouteEnv {
            push: &push,
            proxy: &proxy,
            plan: &plan,
            port: 80,
            egress: None,
        };
        let route = http(json!({
            "route": [{"destination": {"host": "nope.shop.svc.cluster.local"}}],
            "retries": {"attempts": 2, "retryOn": "5xx"}
        }));
        let (routes, findings) = http_route(&env, &route, Flavor::Proxyless);
        assert!(matches!(
            routes[0].action,
            Some(Action::DirectResponse(DirectResponseAction {
                status: 503,
                ..
            }))
        ));
        assert!(
            findings
                .iter()
                .all(|f| matches!(f, Finding::UnresolvedDestination { .. })),
            "nothing else is translated for a route that answers 503: {findings:?}"
        );
        let (default, downgrades) =
            default_route(&env, A, "a.shop.svc.cluster.local", 80, Flavor::Proxyless);
        assert!(default.decorator.is_none());
        assert_eq!(
            downgrades.iter().map(|d| d.feature).collect::<Vec<_>>(),
            ["hash_policy"]
        );
        let (default, downgrades) =
            default_route(&env, A, "a.shop.svc.cluster.local", 80, Flavor::Sidecar);
        assert!(default.decorator.is_some() && downgrades.is_empty());
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
}
