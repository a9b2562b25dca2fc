//! The route action of a VirtualService HTTP route, translated for Envoy's full feature
//! set: destinations (weights and subsets, resolved against the proxy's clusters),
//! redirects, direct responses, rewrites and header manipulation — what a route *does*
//! with a request. Also [`RouteEnv`], what every part of route translation reads.
//!
//! A destination the proxy has no cluster for (unknown or invisible host or port) sends
//! its share to `BlackHoleCluster` (503, as Envoy answers for a missing cluster) and is
//! noted as a [`Finding`]; the proxyless pass drops it instead.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{
    DataSource, HeaderValue, HeaderValueOption, data_source,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, RedirectAction, RouteAction, WeightedCluster,
    redirect_action::{PathRewriteSpecifier, RedirectResponseCode, SchemeRewriteSpecifier},
    route::Action,
    route_action::{ClusterSpecifier, HostRewriteSpecifier},
    weighted_cluster::{ClusterWeight, cluster_weight},
};
use envoy_types::pb::envoy::r#type::matcher::v3::RegexMatchAndSubstitute;
use envoy_types::pb::google::protobuf::Any;
use pilotfish_mesh::api::{
    Destination, HeaderOperations, Headers, HttpDirectResponse, HttpRedirect, HttpRewrite,
    HttpRoute, HttpRouteDestination,
};
use pilotfish_mesh::model::Proxy;
use pilotfish_mesh::push_context::PushContext;
use pilotfish_mesh::push_context::sidecar::EgressScope;

use crate::generate::findings::{Finding, RouteKind};
use crate::generate::names;
use crate::generate::plan::OutboundPlan;
use crate::generate::util::{regex_matcher, u32_value};

/// What route translation needs to know.
pub struct RouteEnv<'a> {
    pub push: &'a PushContext,
    pub proxy: &'a Proxy,
    pub plan: &'a OutboundPlan,
    /// The port of the route configuration (the listener port for sidecars, the service
    /// port for proxyless clients).
    pub port: u32,
    /// The Sidecar egress listener whose VirtualServices route this configuration (the
    /// one claiming the port, or a listener with an address of its own); `None` without a
    /// Sidecar.
    pub egress: Option<&'a EgressScope>,
}

/// One VirtualService HTTP route translated for Envoy: what every match of it shares (the
/// action, per-filter configs, header operations) and what translation noticed, kept by
/// feature so the proxyless pass can drop the notes of what it removes.
#[derive(Clone, Debug)]
pub struct TranslatedAction {
    pub action: Action,
    pub per_filter: HashMap<String, Any>,
    pub request_add: Vec<HeaderValueOption>,
    pub request_remove: Vec<String>,
    pub response_add: Vec<HeaderValueOption>,
    pub response_remove: Vec<String>,
    /// Destinations without a cluster.
    pub unresolved: Vec<Finding>,
    /// Header operations skipped (pseudo-headers).
    pub header_findings: Vec<Finding>,
    /// Mirrors without a cluster (left out).
    pub mirror_findings: Vec<Finding>,
}

impl TranslatedAction {
    /// No action yet: a route that ends up without a destination answers 503.
    pub fn unavailable() -> Self {
        TranslatedAction {
            action: Action::DirectResponse(DirectResponseAction {
                status: 503,
                ..Default::default()
            }),
            per_filter: HashMap::new(),
            request_add: Vec::new(),
            request_remove: Vec::new(),
            response_add: Vec::new(),
            response_remove: Vec::new(),
            unresolved: Vec::new(),
            header_findings: Vec::new(),
            mirror_findings: Vec::new(),
        }
    }

    /// Applies request and response header operations; setting `host` on the request
    /// becomes `host_rewrite`.
    pub fn apply_headers(&mut self, h: &Headers, host_rewrite: &mut Option<String>) {
        if let Some(req) = &h.request {
            let (add, remove) =
                header_operations(req, Some(host_rewrite), &mut self.header_findings);
            self.request_add.extend(add);
            self.request_remove.extend(remove);
        }
        if let Some(resp) = &h.response {
            let (add, remove) = header_operations(resp, None, &mut self.header_findings);
            self.response_add.extend(add);
            self.response_remove.extend(remove);
        }
    }

    /// Removes every header operation (route and destination level) and what was noted
    /// about them.
    pub fn clear_headers(&mut self) {
        self.request_add.clear();
        self.request_remove.clear();
        self.response_add.clear();
        self.response_remove.clear();
        self.header_findings.clear();
    }
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

/// The destinations of `route` that carry traffic (positive weight), with their weights,
/// in order: the entries of the translated cluster specifier.
pub fn weighted_destinations(route: &HttpRoute) -> Vec<(&HttpRouteDestination, u32)> {
    let weights = normalized_weights(&route.route.iter().map(|d| d.weight).collect::<Vec<_>>());
    route
        .route
        .iter()
        .zip(weights)
        .filter(|(_, w)| *w > 0)
        .collect()
}

/// The cluster a destination names: `Ok` when this proxy has it, else `Err` with the
/// name (HTTP routes answer 503 for it, TCP routes send it to `BlackHoleCluster`).
pub fn destination_cluster(env: &RouteEnv<'_>, dest: &Destination) -> Result<String, String> {
    let port = match &dest.port {
        Some(p) => p.number,
        None => env
            .plan
            .sidecar
            .service_for(env.push, &dest.host)
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

/// The cluster an HTTP destination names for this proxy, when the proxy has it; one it
/// lacks is noted in `findings`.
pub fn resolve(
    env: &RouteEnv<'_>,
    dest: &Destination,
    findings: &mut Vec<Finding>,
) -> Option<String> {
    destination_cluster(env, dest)
        .map_err(|cluster| {
            findings.push(Finding::UnresolvedDestination {
                kind: RouteKind::Http,
                cluster,
                namespace: env.proxy.namespace.clone(),
            })
        })
        .ok()
}

/// The weighted destinations of `route` as a cluster specifier, or `None` when it has
/// none. A single destination's header operations join the route's (`t`); each weighted
/// cluster carries its own.
pub fn destinations(
    env: &RouteEnv<'_>,
    route: &HttpRoute,
    t: &mut TranslatedAction,
    host_rewrite: &mut Option<String>,
) -> Option<ClusterSpecifier> {
    let mut clusters: Vec<(String, u32, Option<&Headers>)> = weighted_destinations(route)
        .into_iter()
        .map(|(dest, weight)| {
            let name = resolve(env, &dest.destination, &mut t.unresolved)
                .unwrap_or_else(|| names::BLACKHOLE_CLUSTER.to_string());
            (name, weight, dest.headers.as_ref())
        })
        .collect();
    match clusters.len() {
        0 => None,
        1 => {
            let (name, _, headers) = clusters.remove(0);
            if let Some(h) = headers {
                t.apply_headers(h, host_rewrite);
            }
            Some(ClusterSpecifier::Cluster(name))
        }
        _ => {
            let weighted = clusters
                .into_iter()
                .map(|(name, weight, headers)| {
                    let mut cw = ClusterWeight {
                        name,
                        weight: u32_value(weight),
                        ..Default::default()
                    };
                    if let Some(h) = headers {
                        let mut scratch = TranslatedAction::unavailable();
                        let mut rewrite = None;
                        scratch.apply_headers(h, &mut rewrite);
                        cw.request_headers_to_add = scratch.request_add;
                        cw.request_headers_to_remove = scratch.request_remove;
                        cw.response_headers_to_add = scratch.response_add;
                        cw.response_headers_to_remove = scratch.response_remove;
                        cw.host_rewrite_specifier =
                            rewrite.map(cluster_weight::HostRewriteSpecifier::HostRewriteLiteral);
                        t.header_findings.extend(scratch.header_findings);
                    }
                    cw
                })
                .collect();
            Some(ClusterSpecifier::WeightedClusters(WeightedCluster {
                clusters: weighted,
                ..Default::default()
            }))
        }
    }
}

/// A cluster specifier as (name, weight) entries, in order: one entry for a single cluster.
pub fn cluster_entries(specifier: &ClusterSpecifier) -> Vec<(String, Option<u32>)> {
    match specifier {
        ClusterSpecifier::Cluster(name) => vec![(name.clone(), None)],
        ClusterSpecifier::WeightedClusters(w) => w
            .clusters
            .iter()
            .map(|c| (c.name.clone(), c.weight.map(|w| w.value)))
            .collect(),
        _ => Vec::new(),
    }
}

/// The first cluster a route sends to (where its consistent-hash keys come from).
pub fn first_cluster(action: &RouteAction) -> Option<&str> {
    match &action.cluster_specifier {
        Some(ClusterSpecifier::Cluster(name)) => Some(name),
        Some(ClusterSpecifier::WeightedClusters(w)) => w.clusters.first().map(|c| c.name.as_str()),
        _ => None,
    }
}

/// URI and authority rewrites. Envoy accepts one of prefix_rewrite and regex_rewrite; the
/// regex wins.
pub fn apply_rewrite(
    rewrite: &HttpRewrite,
    action: &mut RouteAction,
    host_rewrite: &mut Option<String>,
) {
    if let Some(uri) = rewrite
        .uri
        .as_ref()
        .filter(|_| rewrite.uri_regex_rewrite.is_none())
    {
        action.prefix_rewrite.clone_from(uri);
    }
    if let Some(authority) = &rewrite.authority {
        *host_rewrite = Some(authority.clone());
    }
    if let Some(rr) = &rewrite.uri_regex_rewrite
        && let Some(pattern) = &rr.r#match
    {
        action.regex_rewrite = Some(RegexMatchAndSubstitute {
            pattern: Some(regex_matcher(pattern)),
            substitution: rr.rewrite.clone().unwrap_or_default(),
        });
    }
}

/// Sets the authority rewrite the headers or the rewrite asked for.
pub fn apply_host_rewrite(action: &mut RouteAction, host_rewrite: Option<String>) {
    if let Some(host) = host_rewrite {
        action.host_rewrite_specifier = Some(HostRewriteSpecifier::HostRewriteLiteral(host));
    }
}

/// Removes every rewrite (URI and authority).
pub fn clear_rewrites(action: &mut RouteAction) {
    action.prefix_rewrite.clear();
    action.regex_rewrite = None;
    action.host_rewrite_specifier = None;
}

/// `set` overwrites, `add` appends, `remove` removes. Setting `host`/`:authority` on a
/// request is an authority rewrite (Envoy refuses to add those headers directly);
/// other pseudo-headers cannot be changed: skipped and noted.
pub fn header_operations(
    ops: &HeaderOperations,
    mut host_rewrite: Option<&mut Option<String>>,
    findings: &mut Vec<Finding>,
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
            findings.push(Finding::PseudoHeader {
                header: key.to_string(),
            });
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

pub fn redirect_action(r: &HttpRedirect, listener_port: u32) -> RedirectAction {
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

pub fn direct_response(direct: &HttpDirectResponse) -> DirectResponseAction {
    DirectResponseAction {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
    fn header_operations_turn_host_into_a_rewrite() {
        let ops: HeaderOperations = serde_json::from_value(json!({
            "set": {"host": "b.example.com", "x-a": "1", ":path": "/p"}, "add": {"x-b": "2"}, "remove": ["x-c", ":path"]
        }))
        .unwrap();
        let mut rewrite = None;
        let mut findings = Vec::new();
        let (add, remove) = header_operations(&ops, Some(&mut rewrite), &mut findings);
        assert_eq!(rewrite.as_deref(), Some("b.example.com"));
        assert_eq!(add.len(), 2);
        assert_eq!(
            add[0].append_action,
            HeaderAppendAction::OverwriteIfExistsOrAdd as i32
        );
        assert_eq!(remove, ["x-c"]);
        assert_eq!(
            findings,
            [Finding::PseudoHeader {
                header: ":path".into()
            }],
            "a pseudo-header is skipped and noted"
        );
    }
}
