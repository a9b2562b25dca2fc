//! How a route treats the requests it sends, translated for Envoy's full feature set:
//! retries, timeouts, consistent-hash keys (from the DestinationRule of the route's first
//! cluster), fault injection and CORS (per-route filter configs), request mirroring —
//! and, for each, what the proxyless pass keeps of it (gRPC's xDS client reads deadlines
//! from `max_stream_duration` only, retries on gRPC status codes only, hashes on headers
//! only, and mirrors nothing).

use envoy_types::pb::envoy::config::core::v3::RuntimeFractionalPercent;
use envoy_types::pb::envoy::config::route::v3::{
    RetryPolicy, RouteAction,
    retry_policy::{RetryBackOff, RetryHostPredicate, RetryPriority},
    route_action::{
        HashPolicy, MaxStreamDuration, RequestMirrorPolicy,
        hash_policy::{
            ConnectionProperties, Cookie, CookieAttribute, Header, PolicySpecifier, QueryParameter,
        },
    },
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
use pilotfish_mesh::api::{
    ConsistentHashLb, CorsPolicy as IstioCors, Destination, HttpFaultInjection, HttpRetry,
    HttpRoute, StringMatch, UnmatchedPreflights,
};

use super::action::{RouteEnv, first_cluster, resolve};
use crate::generate::findings::{Downgrade, Finding};
use crate::generate::plan::OutboundPlan;
use crate::generate::util::{
    any, api_duration, bool_value, percent, percent_hundred, string_matcher, u32_value,
    zero_duration,
};

/// Istio's default retry policy for sidecars (when a route sets no `retries`, and the
/// conditions of a `retries` without `retryOn`). Since Istio 1.24 it names no status
/// code: `retriable-status-codes` with an empty code list retries nothing, so a 503 (which
/// may come after a non-idempotent request reached the application) is not retried
/// (`EXCLUDE_UNSAFE_503_FROM_DEFAULT_RETRY`, the only behaviour left in 1.30).
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

/// Timeouts: the route's `timeout`, else none (Envoy's "disabled" is a zero duration);
/// gRPC deadlines are capped the same way.
pub fn apply_timeouts(action: &mut RouteAction, timeout: Option<&pilotfish_mesh::api::Duration>) {
    let timeout = timeout.and_then(api_duration);
    action.timeout = timeout.or_else(zero_duration);
    action.max_stream_duration = Some(MaxStreamDuration {
        max_stream_duration: timeout.or_else(zero_duration),
        grpc_timeout_header_max: timeout.or_else(zero_duration),
        ..Default::default()
    });
}

/// Proxyless: gRPC reads deadlines from `max_stream_duration` only, and only a configured
/// timeout is sent.
pub fn restrict_timeouts(
    action: &mut RouteAction,
    timeout: Option<&pilotfish_mesh::api::Duration>,
) {
    let timeout = timeout.and_then(api_duration);
    action.timeout = None;
    action.max_stream_duration = timeout.map(|t| MaxStreamDuration {
        max_stream_duration: Some(t),
        grpc_timeout_header_max: Some(t),
        ..Default::default()
    });
}

/// Istio's retry policy for a route. Without `retries` Istio's default applies (two
/// retries on connection failures, refused streams and gRPC `unavailable`/`cancelled`,
/// never on an HTTP status); `attempts: 0` disables retries. `consistent_hash` (a
/// single-destination route whose DestinationRule hashes) drops the previous-hosts
/// predicate unless `retryIgnorePreviousHosts` asks for it: a retry must stay on the
/// host the hash picked.
pub fn retry_policy(retries: Option<&HttpRetry>, consistent_hash: bool) -> Option<RetryPolicy> {
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
        return Some(RetryPolicy {
            retry_on: DEFAULT_RETRY_ON.to_string(),
            num_retries: u32_value(2),
            retry_host_predicate: if consistent_hash {
                Vec::new()
            } else {
                vec![host_predicate()]
            },
            host_selection_retry_max_attempts: 5,
            ..Default::default()
        });
    };
    let attempts = r.attempts.unwrap_or(0);
    if attempts <= 0 {
        return None;
    }
    let (retry_on, codes): (Vec<String>, Vec<u32>) = match &r.retry_on {
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
            Vec::new(),
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
    Some(RetryPolicy {
        retry_on: retry_on.join(","),
        num_retries: u32_value(attempts as u32),
        per_try_timeout: r.per_try_timeout.as_ref().and_then(api_duration),
        retry_host_predicate: if r.retry_ignore_previous_hosts.unwrap_or(!consistent_hash) {
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
    })
}

/// Proxyless: no retries unless the route configures them (no Istio default), and then
/// only on gRPC status codes, with attempts and back-off. Returns the downgrade when a
/// configured condition was left out.
pub fn restrict_retry(
    retries: Option<&HttpRetry>,
    policy: &mut Option<RetryPolicy>,
) -> Option<Downgrade> {
    let translated = policy.take();
    retries?;
    let translated = translated?;
    let mut retry_on: Vec<&str> = translated
        .retry_on
        .split(',')
        .filter(|o| !o.is_empty())
        .collect();
    let before = retry_on.len();
    retry_on.retain(|o| GRPC_RETRY_ON.contains(o));
    let downgrade = (retry_on.len() != before).then(|| {
        Downgrade::new(
            "retry_on",
            "route",
            "retry conditions other than gRPC status codes",
        )
    });
    if !retry_on.is_empty() {
        *policy = Some(RetryPolicy {
            retry_on: retry_on.join(","),
            num_retries: translated.num_retries,
            retry_back_off: translated.retry_back_off,
            ..Default::default()
        });
    }
    downgrade
}

/// The consistent-hash settings of the DestinationRule behind `cluster`, if any.
pub fn consistent_hash<'a>(plan: &'a OutboundPlan, cluster: &str) -> Option<&'a ConsistentHashLb> {
    plan.get(cluster)
        .and_then(|c| c.policy.load_balancer.as_ref())
        .and_then(|l| l.consistent_hash.as_ref())
}

/// Consistent-hash keys of a DestinationRule: a header, a cookie, the source IP or a
/// query parameter.
pub fn hash_policy(hash: &ConsistentHashLb) -> Vec<HashPolicy> {
    let specifier = if let Some(h) = &hash.http_header_name {
        PolicySpecifier::Header(Header {
            header_name: h.clone(),
            ..Default::default()
        })
    } else if let Some(c) = &hash.http_cookie {
        PolicySpecifier::Cookie(Cookie {
            name: c.name.clone(),
            ttl: c.ttl.as_ref().and_then(api_duration),
            path: c.path.clone().unwrap_or_default(),
            attributes: c
                .attributes
                .iter()
                .map(|a| CookieAttribute {
                    name: a.name.clone(),
                    value: a.value.clone().unwrap_or_default(),
                })
                .collect(),
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

/// The hash keys of a route: those of its first cluster's DestinationRule.
pub fn route_hash_policy(plan: &OutboundPlan, action: &RouteAction) -> Vec<HashPolicy> {
    first_cluster(action)
        .and_then(|first| consistent_hash(plan, first))
        .map(hash_policy)
        .unwrap_or_default()
}

/// Proxyless: gRPC hashes on headers only. Returns the keys it supports of `hash`, and
/// the downgrade of `cluster` when another key was configured.
pub fn proxyless_hash_policy(
    hash: &ConsistentHashLb,
    cluster: &str,
) -> (Vec<HashPolicy>, Option<Downgrade>) {
    if hash.http_header_name.is_some() {
        return (hash_policy(hash), None);
    }
    let other_key = hash.http_cookie.is_some()
        || hash.use_source_ip.is_some()
        || hash.http_query_parameter_name.is_some();
    let downgrade = other_key.then(|| {
        Downgrade::new(
            "hash_policy",
            cluster,
            "hashing on cookies, source IP or query parameters",
        )
    });
    (Vec::new(), downgrade)
}

/// Proxyless: the route's hash keys as gRPC supports them, taken again from its first
/// cluster (the proxyless pass may have dropped the cluster before it).
pub fn restrict_hash(plan: &OutboundPlan, action: &mut RouteAction) -> Option<Downgrade> {
    action.hash_policy.clear();
    let first = first_cluster(action)?.to_string();
    let hash = consistent_hash(plan, &first)?;
    let (keys, downgrade) = proxyless_hash_policy(hash, &first);
    action.hash_policy = keys;
    downgrade
}

/// The route's mirrors (`mirror` with its percentage, then `mirrors`) that the proxy has a
/// cluster for; the others are noted in `findings` and left out.
pub fn mirror_policies(
    env: &RouteEnv<'_>,
    route: &HttpRoute,
    findings: &mut Vec<Finding>,
) -> Vec<RequestMirrorPolicy> {
    mirrors(route)
        .into_iter()
        .filter_map(|(dest, pct)| {
            let cluster = resolve(env, dest, findings)?;
            Some(RequestMirrorPolicy {
                cluster,
                runtime_fraction: Some(RuntimeFractionalPercent {
                    default_value: Some(percent(pct)),
                    ..Default::default()
                }),
                trace_sampled: bool_value(false),
                // Istio >= 1.28 (DISABLE_SHADOW_HOST_SUFFIX): the mirror keeps the Host
                // as it is, without Envoy's `-shadow` suffix.
                disable_shadow_host_suffix_append: true,
                ..Default::default()
            })
        })
        .collect()
}

/// Every mirror a route configures, with its percentage (100 unless given).
pub fn mirrors(route: &HttpRoute) -> Vec<(&Destination, f64)> {
    let mut out: Vec<(&Destination, f64)> = Vec::new();
    if let Some(m) = &route.mirror {
        let pct = route
            .mirror_percentage
            .as_ref()
            .map(|p| p.value)
            .or(route.mirror_percent.map(f64::from))
            .unwrap_or(100.0);
        out.push((m, pct));
    }
    for m in &route.mirrors {
        out.push((
            &m.destination,
            m.percentage.as_ref().map_or(100.0, |p| p.value),
        ));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn retries_follow_istio_defaults_and_gating() {
        let default = retry_policy(None, false).unwrap();
        assert_eq!(default.num_retries, u32_value(2));
        // Istio >= 1.24: no status code, so a 503 is not retried.
        assert_eq!(
            default.retry_on,
            "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"
        );
        assert!(default.retriable_status_codes.is_empty());
        assert_eq!(default.host_selection_retry_max_attempts, 5);
        assert_eq!(default.retry_host_predicate.len(), 1);
        let hashed = retry_policy(None, true).unwrap();
        assert!(
            hashed.retry_host_predicate.is_empty(),
            "stay on the hashed host"
        );
        let attempts_only: HttpRetry = serde_json::from_value(json!({"attempts": 4})).unwrap();
        let p = retry_policy(Some(&attempts_only), false).unwrap();
        assert_eq!(
            (p.retry_on.as_str(), p.num_retries),
            (default.retry_on.as_str(), u32_value(4))
        );
        assert!(p.retriable_status_codes.is_empty());
        assert!(
            retry_policy(Some(&attempts_only), true)
                .unwrap()
                .retry_host_predicate
                .is_empty()
        );
        let mut proxyless = retry_policy(None, false);
        assert_eq!(restrict_retry(None, &mut proxyless), None);
        assert!(proxyless.is_none(), "no default retries for gRPC");
        let r: HttpRetry = serde_json::from_value(json!({
            "attempts": 3, "perTryTimeout": "2s", "retryOn": "gateway-error,503,unavailable",
            "retryRemoteLocalities": true, "retryIgnorePreviousHosts": false, "backoff": "100ms"
        }))
        .unwrap();
        let p = retry_policy(Some(&r), true).unwrap();
        assert_eq!(
            p.retry_on,
            "gateway-error,unavailable,retriable-status-codes"
        );
        assert_eq!(p.retriable_status_codes, [503]);
        assert!(p.retry_host_predicate.is_empty());
        assert!(p.retry_priority.is_some());
        assert_eq!(p.per_try_timeout.unwrap().seconds, 2);
        let mut g = Some(p);
        let downgrade = restrict_retry(Some(&r), &mut g).unwrap();
        assert_eq!(downgrade.feature, "retry_on");
        let g = g.unwrap();
        assert_eq!(g.retry_on, "unavailable");
        assert!(g.per_try_timeout.is_none());
        assert!(g.retry_back_off.is_some());
        let off: HttpRetry = serde_json::from_value(json!({"attempts": 0})).unwrap();
        assert!(retry_policy(Some(&off), false).is_none());
        let only_http: HttpRetry =
            serde_json::from_value(json!({"attempts": 2, "retryOn": "5xx"})).unwrap();
        let mut none_left = retry_policy(Some(&only_http), false);
        assert!(restrict_retry(Some(&only_http), &mut none_left).is_some());
        assert!(none_left.is_none(), "no gRPC condition left: no retries");
    }

    #[test]
    fn hash_policies_per_key_and_proxyless_gating() {
        let h: ConsistentHashLb = serde_json::from_value(json!({"httpCookie": {
            "name": "s", "ttl": "10s",
            "attributes": [{"name": "SameSite", "value": "Strict"}, {"name": "Secure"}]
        }}))
        .unwrap();
        let Some(PolicySpecifier::Cookie(cookie)) = &hash_policy(&h)[0].policy_specifier else {
            panic!("cookie hash policy expected")
        };
        let attributes: Vec<(&str, &str)> = cookie
            .attributes
            .iter()
            .map(|a| (a.name.as_str(), a.value.as_str()))
            .collect();
        assert_eq!(attributes, [("SameSite", "Strict"), ("Secure", "")]);
        let (keys, downgrade) = proxyless_hash_policy(&h, "c");
        assert!(keys.is_empty());
        assert_eq!(
            downgrade.map(|d| (d.feature, d.resource)),
            Some(("hash_policy", "c".to_string()))
        );
        let h: ConsistentHashLb =
            serde_json::from_value(json!({"httpHeaderName": "x-user"})).unwrap();
        assert!(matches!(
            hash_policy(&h)[0].policy_specifier,
            Some(PolicySpecifier::Header(_))
        ));
        assert_eq!(proxyless_hash_policy(&h, "c"), (hash_policy(&h), None));
        let h: ConsistentHashLb = serde_json::from_value(json!({"useSourceIp": true})).unwrap();
        assert!(matches!(
            hash_policy(&h)[0].policy_specifier,
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
