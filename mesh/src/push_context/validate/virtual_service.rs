//! VirtualService validation, rule for rule as Istio 1.30 applies it (the webhook's
//! `ValidateVirtualService` and the CRD schema), and resolution of its hosts to FQDNs.
//! Each object is judged alone: references to DestinationRules and services are the
//! builder's business (`push_context::references`), never a reason to reject.

use std::collections::BTreeMap;

use super::Validated;
use super::common::*;
use super::names;
use crate::api::{
    CorsPolicy, Destination, Headers, HttpFaultInjection, HttpMatchRequest, HttpRedirect,
    HttpRetry, HttpRewrite, HttpRoute, HttpRouteDestination, L4MatchAttributes, Oneofs,
    RouteDestination, StringMatch, TcpRoute, TlsMatchAttributes, TlsRoute, VirtualService,
    VirtualServiceSpec, grpc_status_code,
};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;
use crate::push_context::hosts::resolve_short_name;

/// The `retryOn` policies Envoy knows (`x-envoy-retry-on` and `x-envoy-retry-grpc-on`)
/// that Istio accepts, besides HTTP status codes.
const RETRY_ON: [&str; 16] = [
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "envoy-ratelimited",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

/// The HTTP status codes Go's `net/http` names: a `retryOn` entry may be any of them.
const NAMED_HTTP_STATUS: [u16; 62] = [
    100, 101, 102, 103, 200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304,
    305, 307, 308, 400, 401, 402, 403, 404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415,
    416, 417, 418, 421, 422, 423, 424, 425, 426, 428, 429, 431, 451, 500, 501, 502, 503, 504, 505,
    506, 507, 508, 510, 511,
];

/// The methods a CORS policy may allow.
const CORS_METHODS: [&str; 10] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE", "*",
];

/// A direct-response body above this size is refused, above a tenth of it only warned.
const MAX_BODY: usize = 1024 * 1024;
const LARGE_BODY: usize = 100 * 1024;

/// Validates one VirtualService and returns its spec with every host resolved to an FQDN
/// (and delegate namespaces filled in).
pub fn validate_virtual_service(
    vs: &VirtualService,
    cluster_domain: &str,
) -> Validated<VirtualServiceSpec> {
    let namespace = namespace_of(&vs.metadata);
    let key = ConfigKey::new(
        ConfigKind::VirtualService,
        &namespace,
        vs.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    check_annotations(&mut f, vs.metadata.annotations.as_ref());
    let spec = &vs.spec;
    let is_delegate = spec.hosts.is_empty();
    if is_delegate {
        if !spec.gateways.is_empty() {
            f.error(
                "spec.gateways",
                "a delegate VirtualService (no hosts) cannot name gateways",
            );
        }
        if !spec.tls.is_empty() {
            f.error(
                "spec.tls",
                "a delegate VirtualService (no hosts) cannot have tls routes",
            );
        }
        if !spec.tcp.is_empty() {
            f.error(
                "spec.tcp",
                "a delegate VirtualService (no hosts) cannot have tcp routes",
            );
        }
    }
    let gateway_bound = !spec.gateways.is_empty() && !spec.gateways.iter().any(|g| g == "mesh");
    let mesh_bound = !gateway_bound;
    if !spec.gateways.is_empty() {
        check_gateway_names(&mut f, "spec.gateways", &spec.gateways);
    }
    if !gateway_bound {
        for (i, route) in spec.http.iter().enumerate() {
            for (j, m) in route.r#match.iter().enumerate() {
                for (field, map) in [
                    ("headers", &m.headers),
                    ("withoutHeaders", &m.without_headers),
                ] {
                    for name in map.keys().filter(|n| names::is_jwt_claim_route(n)) {
                        f.error(
                            format!("spec.http[{i}].match[{j}].{field}[{name}]"),
                            "routing on JWT claims is supported for gateways only",
                        );
                    }
                }
            }
        }
    }

    let sni_routes = spec
        .tls
        .iter()
        .any(|t| t.r#match.iter().any(|m| !m.sni_hosts.is_empty()));
    let mut all_hosts_valid = true;
    for (i, host) in spec.hosts.iter().enumerate() {
        let checked = if gateway_bound {
            check_gateway_host(sni_routes, host)
        } else {
            names::check_wildcard_domain(host)
        };
        match checked {
            Err(reason) if !names::is_ip(host) => {
                f.error(format!("spec.hosts[{i}]"), reason);
                all_hosts_valid = false;
            }
            Ok(()) if mesh_bound && host == "*" => {
                f.error(
                    format!("spec.hosts[{i}]"),
                    "the wildcard host `*` is not allowed for VirtualServices bound to the mesh",
                );
                all_hosts_valid = false;
            }
            _ => {}
        }
    }
    if all_hosts_valid {
        for (i, a) in spec.hosts.iter().enumerate() {
            for (j, b) in spec.hosts.iter().enumerate().skip(i + 1) {
                if hosts_overlap(a, b) {
                    f.error(
                        format!("spec.hosts[{j}]"),
                        format!("host {b:?} overlaps host {a:?} of the same VirtualService"),
                    );
                }
            }
        }
    }
    if spec.http.is_empty() && spec.tcp.is_empty() && spec.tls.is_empty() {
        f.error(
            "spec",
            "a VirtualService needs at least one http, tcp or tls route",
        );
    }
    for (i, route) in spec.http.iter().enumerate() {
        http_route(&mut f, &format!("spec.http[{i}]"), route, is_delegate);
    }
    for (i, route) in spec.tls.iter().enumerate() {
        tls_route(
            &mut f,
            &format!("spec.tls[{i}]"),
            route,
            &spec.hosts,
            gateway_bound,
        );
    }
    for (i, route) in spec.tcp.iter().enumerate() {
        tcp_route(&mut f, &format!("spec.tcp[{i}]"), route);
    }
    check_export_to(
        &mut f,
        "spec.exportTo",
        &namespace,
        &spec.export_to,
        ExportToOf::Config,
    );
    unreachable_http_routes(&mut f, &spec.http);
    unreachable_l4_routes(&mut f, "tcp", &spec.tcp, |r: &TcpRoute| &r.r#match);
    unreachable_l4_routes(&mut f, "tls", &spec.tls, |r: &TlsRoute| &r.r#match);

    Validated::new(resolve(spec, &namespace, cluster_domain), f.list)
}

/// The spec with hosts and destination hosts as FQDNs, delegate namespaces set, and
/// Istio's `regex: "*"` presence spelling made a presence match.
fn resolve(spec: &VirtualServiceSpec, namespace: &str, domain: &str) -> VirtualServiceSpec {
    let mut spec = spec.clone();
    let fqdn = |host: &mut String| *host = resolve_short_name(host, namespace, domain);
    spec.hosts.iter_mut().for_each(fqdn);
    for route in &mut spec.http {
        // `withoutHeaders: {h: {regex: "*"}}` is Istio's spelling of "h is absent".
        for m in &mut route.r#match {
            for value in m.without_headers.values_mut() {
                if *value == StringMatch::Regex("*".into()) {
                    *value = StringMatch::Any;
                }
            }
        }
        for d in &mut route.route {
            fqdn(&mut d.destination.host);
        }
        if let Some(m) = &mut route.mirror {
            fqdn(&mut m.host);
        }
        for m in &mut route.mirrors {
            fqdn(&mut m.destination.host);
        }
        if let Some(d) = &mut route.delegate
            && d.namespace.as_deref().unwrap_or("").is_empty()
        {
            d.namespace = Some(namespace.to_string());
        }
    }
    for route in &mut spec.tcp {
        route
            .route
            .iter_mut()
            .for_each(|d| fqdn(&mut d.destination.host));
    }
    for route in &mut spec.tls {
        route
            .route
            .iter_mut()
            .for_each(|d| fqdn(&mut d.destination.host));
    }
    spec
}

/// Whether two hosts of one VirtualService overlap (exactly, or through a wildcard in
/// either direction).
fn hosts_overlap(a: &str, b: &str) -> bool {
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(sa), Some(sb)) => {
            if a.len() < b.len() {
                sb.ends_with(sa)
            } else {
                sa.ends_with(sb)
            }
        }
        (Some(sa), None) => b.ends_with(sa),
        (None, Some(sb)) => a.ends_with(sb),
        (None, None) => a == b,
    }
}

/// Whether `host` is covered by `pattern` (one direction only).
fn host_subset_of(host: &str, pattern: &str) -> bool {
    match (host.strip_prefix('*'), pattern.strip_prefix('*')) {
        (Some(sh), Some(sp)) => host.len() >= pattern.len() && sh.ends_with(sp),
        (Some(_), None) => false,
        (None, Some(sp)) => host.ends_with(sp),
        (None, None) => host == pattern,
    }
}

/// A host of a gateway-bound VirtualService: a wildcard domain, or (with SNI routes) the
/// `outbound_.<port>_._.<host>` names auto-passthrough gateways see.
fn check_gateway_host(sni: bool, host: &str) -> Result<(), String> {
    if sni && host.starts_with("outbound_") {
        let parts: Vec<&str> = host.split('_').collect();
        let malformed =
            || format!("{host:?} does not have the form outbound_.<port>_._.<hostname>");
        if parts.len() < 4 {
            return Err(malformed());
        }
        let port = parts[1].trim_matches('.');
        let hostname = parts[3].trim_matches('.');
        if parts[0] != "outbound"
            || !port.bytes().any(|b| b.is_ascii_digit())
            || !hostname.bytes().any(|b| b.is_ascii_alphabetic())
        {
            return Err(malformed());
        }
        return Ok(());
    }
    names::check_wildcard_domain(host)
}

/// Gateway references: `mesh`, `namespace/name`, or a legacy `name.namespace` (warned).
/// Like Istio, checking stops at the first name without a `/`.
fn check_gateway_names(f: &mut Findings, path: &str, gateways: &[String]) {
    for (i, gateway) in gateways.iter().enumerate() {
        let item = format!("{path}[{i}]");
        let Some((ns, name)) = gateway.split_once('/') else {
            if let Some((name, ns)) = gateway.split_once('.') {
                let ns = ns.split('.').next().unwrap_or(ns);
                f.warning(
                    &item,
                    format!(
                        "{gateway:?} uses the legacy gateway name format; write {:?}",
                        format!("{ns}/{name}")
                    ),
                );
            }
            f.check(&item, names::check_fqdn(gateway));
            return;
        };
        if ns.is_empty() || name.is_empty() {
            f.error(
                &item,
                "the namespace and the name of a gateway must not be empty",
            );
        }
        if !names::is_dns1123_label(ns) {
            f.error(&item, format!("{ns:?} is not a valid namespace"));
        }
        if !names::is_dns1123_label(name) {
            f.error(&item, format!("{name:?} is not a valid gateway name"));
        }
    }
}

fn http_route(f: &mut Findings, path: &str, route: &HttpRoute, is_delegate: bool) {
    route_conflicts(f, path, route, is_delegate);
    for (i, m) in route.r#match.iter().enumerate() {
        http_match(f, &format!("{path}.match[{i}]"), m);
    }
    if let Some(h) = &route.headers {
        headers(f, &format!("{path}.headers"), h);
    }
    if let Some(c) = &route.cors_policy {
        cors(f, &format!("{path}.corsPolicy"), c);
    }
    if let Some(fault) = &route.fault {
        fault_injection(f, &format!("{path}.fault"), fault);
    }
    if let Some(p) = route.mirror_percent {
        if p > 100 {
            f.error(
                format!("{path}.mirrorPercent"),
                format!("must be at most 100 (got {p})"),
            );
        }
        f.warning(
            format!("{path}.mirrorPercent"),
            "mirrorPercent is deprecated; use mirrorPercentage",
        );
    }
    if let Some(p) = &route.mirror_percentage
        && !(0.0..=100.0).contains(&p.value)
    {
        f.error(
            format!("{path}.mirrorPercentage.value"),
            format!("must be between 0 and 100 (got {})", p.value),
        );
    }
    if let Some(m) = &route.mirror {
        destination(f, &format!("{path}.mirror"), m);
    }
    for (i, m) in route.mirrors.iter().enumerate() {
        let mp = format!("{path}.mirrors[{i}]");
        destination(f, &format!("{mp}.destination"), &m.destination);
        if let Some(p) = &m.percentage
            && !(0.0..=100.0).contains(&p.value)
        {
            f.error(
                format!("{mp}.percentage.value"),
                format!("must be between 0 and 100 (got {})", p.value),
            );
        }
    }
    if let Some(r) = &route.redirect {
        redirect(f, &format!("{path}.redirect"), r);
    }
    if let Some(d) = &route.direct_response {
        let dp = format!("{path}.directResponse");
        if let Some(body) = &d.body {
            for g in body.conflicting_oneofs() {
                f.error(
                    format!("{dp}.body"),
                    format!("only one of {} may be set", g.set.join(", ")),
                );
            }
            let size = body.string.as_ref().map(String::len).unwrap_or(0)
                + body.bytes.as_ref().map(|b| b.0.len()).unwrap_or(0);
            if size > MAX_BODY {
                f.error(
                    format!("{dp}.body"),
                    format!("a direct-response body must be under 1 MB (got {size} bytes)"),
                );
            } else if size > LARGE_BODY {
                f.warning(
                    format!("{dp}.body"),
                    format!("a large direct-response body ({size} bytes) costs control-plane memory and push time"),
                );
            }
        }
        check_http_status(f, &format!("{dp}.status"), i64::from(d.status));
    }
    if let Some(r) = &route.retries {
        retries(f, &format!("{path}.retries"), r);
    }
    if let Some(rw) = &route.rewrite {
        rewrite(f, &format!("{path}.rewrite"), rw);
    }
    authority_rewrites(f, path, route);
    http_route_destinations(f, path, &route.route);
    if let Some(t) = &route.timeout {
        check_duration(f, &format!("{path}.timeout"), t);
    }
}

/// Which actions may be combined: a root route (with `delegate`) only delegates; a route
/// of a delegate may not delegate again; otherwise exactly one of route, redirect and
/// directResponse, with no fault or rewrite beside a redirect or direct response.
fn route_conflicts(f: &mut Findings, path: &str, route: &HttpRoute, is_delegate: bool) {
    if !is_delegate && route.delegate.is_some() {
        if route.redirect.is_some() {
            f.error(
                format!("{path}.redirect"),
                "a route that delegates cannot also redirect",
            );
        }
        if !route.route.is_empty() {
            f.error(
                format!("{path}.route"),
                "a route that delegates cannot also have destinations",
            );
        }
        return;
    }
    if is_delegate && route.delegate.is_some() {
        f.error(
            format!("{path}.delegate"),
            "a route of a delegate VirtualService cannot delegate again",
        );
    }
    let besides = |f: &mut Findings, action: &str| {
        if !route.route.is_empty() {
            f.error(
                format!("{path}.route"),
                format!("destinations cannot be combined with {action}"),
            );
        }
        if route.fault.is_some() {
            f.error(
                format!("{path}.fault"),
                format!("fault injection cannot be combined with {action}"),
            );
        }
        if route.rewrite.is_some() {
            f.error(
                format!("{path}.rewrite"),
                format!("rewrite cannot be combined with {action}"),
            );
        }
    };
    if route.redirect.is_some() {
        besides(f, "redirect");
        if route.direct_response.is_some() {
            f.error(
                format!("{path}.directResponse"),
                "directResponse cannot be combined with redirect",
            );
        }
    } else if route.direct_response.is_some() {
        besides(f, "directResponse");
    } else if route.route.is_empty() {
        f.error(
            path,
            "an HTTP route needs destinations (route), a redirect or a directResponse",
        );
    }
    if route.mirror.is_some() && !route.mirrors.is_empty() {
        f.error(
            format!("{path}.mirrors"),
            "mirror and mirrors cannot both be set",
        );
    }
}

fn http_match(f: &mut Findings, path: &str, m: &HttpMatchRequest) {
    for (name, value) in &m.headers {
        let hp = format!("{path}.headers[{name}]");
        f.check(&hp, names::check_match_header_name(name));
        check_string_match(f, &hp, value);
    }
    for (name, value) in &m.without_headers {
        let hp = format!("{path}.withoutHeaders[{name}]");
        f.check(&hp, names::check_match_header_name(name));
        // `regex: "*"` is not a regex here: it means "present".
        if value != &StringMatch::Regex("*".into()) {
            check_string_match(f, &hp, value);
        }
    }
    // The URI may match an empty prefix (everything); scheme, method and authority may not.
    if let Some(uri) = &m.uri {
        check_match_regex(f, &format!("{path}.uri"), uri);
    }
    for (field, value) in [
        ("scheme", &m.scheme),
        ("method", &m.method),
        ("authority", &m.authority),
    ] {
        if let Some(value) = value {
            check_string_match(f, &format!("{path}.{field}"), value);
        }
    }
    for (name, value) in &m.query_params {
        check_string_match(f, &format!("{path}.queryParams[{name}]"), value);
    }
    if let Some(port) = m.port.filter(|p| *p != 0) {
        f.check(format!("{path}.port"), names::check_port(port.into()));
    }
    check_labels(f, &format!("{path}.sourceLabels"), &m.source_labels);
    check_gateway_names(f, &format!("{path}.gateways"), &m.gateways);
    if let Some(ns) = m.source_namespace.as_deref().filter(|ns| !ns.is_empty())
        && !names::is_dns1123_label(ns)
    {
        f.error(
            format!("{path}.sourceNamespace"),
            format!("{ns:?} is not a valid namespace"),
        );
    }
}

fn headers(f: &mut Findings, path: &str, h: &Headers) {
    // A request header to add or set may set the authority (`host`/`:authority`);
    // removals and response headers may touch neither Host nor a pseudo-header.
    type NameRule = fn(&str) -> Result<(), String>;
    let sides: [(&str, _, NameRule); 2] = [
        ("request", &h.request, names::check_request_header_to_set),
        ("response", &h.response, names::check_header_to_change),
    ];
    for (side, ops, set_rule) in sides {
        let Some(ops) = ops else { continue };
        for (op, map) in [("add", &ops.add), ("set", &ops.set)] {
            for (name, value) in map {
                let hp = format!("{path}.{side}.{op}[{name}]");
                f.check(&hp, set_rule(name));
                f.check(&hp, names::check_header_value(value));
            }
        }
        for name in &ops.remove {
            f.check(
                format!("{path}.{side}.remove[{name}]"),
                names::check_header_to_change(name),
            );
        }
    }
}

/// The authority may be rewritten in one place only: `rewrite.authority` or one
/// `host`/`:authority` request header.
fn authority_rewrites(f: &mut Findings, path: &str, route: &HttpRoute) {
    let mut current = route
        .rewrite
        .as_ref()
        .and_then(|r| r.authority.clone())
        .filter(|a| !a.is_empty());
    let Some(ops) = route.headers.as_ref().and_then(|h| h.request.as_ref()) else {
        return;
    };
    for (op, map) in [("set", &ops.set), ("add", &ops.add)] {
        for (name, value) in map.iter().filter(|(n, _)| names::sets_authority(n)) {
            if let Some(have) = &current {
                f.error(
                    format!("{path}.headers.request.{op}[{name}]"),
                    format!(
                        "the authority is already rewritten to {have:?}; it can be rewritten once"
                    ),
                );
                return;
            }
            current = Some(value.clone());
        }
    }
}

fn cors(f: &mut Findings, path: &str, c: &CorsPolicy) {
    for (i, origin) in c.allow_origins.iter().enumerate() {
        let op = format!("{path}.allowOrigins[{i}]");
        match origin.value() {
            None | Some("") => f.error(
                &op,
                "an allowed origin needs a non-empty exact, prefix or regex",
            ),
            Some(_) => check_match_regex(f, &op, origin),
        }
    }
    for (i, method) in c.allow_methods.iter().enumerate() {
        if !CORS_METHODS.contains(&method.as_str()) {
            f.error(
                format!("{path}.allowMethods[{i}]"),
                format!("{method:?} is not a supported HTTP method"),
            );
        }
    }
    for (field, list) in [
        ("allowHeaders", &c.allow_headers),
        ("exposeHeaders", &c.expose_headers),
    ] {
        for (i, h) in list.iter().enumerate() {
            f.check(
                format!("{path}.{field}[{i}]"),
                names::check_cors_header_name(h),
            );
        }
    }
    if let Some(age) = &c.max_age {
        check_duration(f, &format!("{path}.maxAge"), age);
        if age.as_std().subsec_nanos() != 0 {
            f.error(
                format!("{path}.maxAge"),
                format!("maxAge must be a whole number of seconds (got {age})"),
            );
        }
    }
}

fn check_http_status(f: &mut Findings, path: &str, status: i64) {
    // Istio's bound is 600 inclusive, whatever its message says.
    if !(200..=600).contains(&status) {
        f.error(path, format!("HTTP status {status} is not in 200-599"));
    }
}

fn fault_injection(f: &mut Findings, path: &str, fault: &HttpFaultInjection) {
    if fault.abort.is_none() && fault.delay.is_none() {
        f.error(path, "a fault needs an abort, a delay or both");
    }
    if let Some(a) = &fault.abort {
        let ap = format!("{path}.abort");
        if let Some(p) = &a.percentage {
            check_fault_percentage(f, &format!("{ap}.percentage"), p.value);
        }
        for g in a.conflicting_oneofs() {
            f.error(&ap, format!("only one of {} may be set", g.set.join(", ")));
        }
        if let Some(status) = a.http_status {
            check_http_status(f, &format!("{ap}.httpStatus"), status.into());
        } else if let Some(g) = &a.grpc_status {
            if grpc_status_code(g).is_none() {
                f.error(
                    format!("{ap}.grpcStatus"),
                    format!("{g:?} is not a gRPC status name (like UNAVAILABLE)"),
                );
            }
        } else if a.http2_error.is_some() {
            f.error(
                format!("{ap}.http2Error"),
                "HTTP/2 error aborts are not supported by Istio",
            );
        } else {
            f.warning(
                &ap,
                "the abort sets no httpStatus or grpcStatus, so it aborts nothing",
            );
        }
    }
    if let Some(d) = &fault.delay {
        let dp = format!("{path}.delay");
        if let Some(p) = &d.percentage {
            check_fault_percentage(f, &format!("{dp}.percentage"), p.value);
        }
        for g in d.conflicting_oneofs() {
            f.error(&dp, format!("only one of {} may be set", g.set.join(", ")));
        }
        if let Some(t) = &d.fixed_delay {
            check_duration(f, &format!("{dp}.fixedDelay"), t);
        } else if let Some(t) = &d.exponential_delay {
            check_duration(f, &format!("{dp}.exponentialDelay"), t);
            f.error(
                format!("{dp}.exponentialDelay"),
                "exponentialDelay is not supported by Istio",
            );
        }
    }
}

/// A destination: a host other than `*` (wildcard domains allowed), a DNS-label subset,
/// a port in range.
pub(super) fn destination(f: &mut Findings, path: &str, d: &Destination) {
    if d.host == "*" {
        f.error(
            format!("{path}.host"),
            "`*` is not a valid destination host",
        );
    } else {
        f.check(
            format!("{path}.host"),
            names::check_wildcard_domain(&d.host),
        );
    }
    if let Some(subset) = d.subset.as_deref().filter(|s| !s.is_empty())
        && !names::is_dns1123_label(subset)
    {
        f.error(
            format!("{path}.subset"),
            format!("{subset:?} is not a valid subset name"),
        );
    }
    if let Some(p) = &d.port {
        f.check(
            format!("{path}.port.number"),
            names::check_port(p.number.into()),
        );
    }
}

fn check_weights(f: &mut Findings, path: &str, weights: &[Option<i32>]) {
    let mut total: i64 = 0;
    for (i, w) in weights.iter().enumerate() {
        let w = w.unwrap_or(0);
        if w < 0 {
            f.error(
                format!("{path}.route[{i}].weight"),
                format!("weight must not be negative (got {w})"),
            );
        }
        total += i64::from(w);
    }
    if weights.len() > 1 && total == 0 {
        f.error(
            format!("{path}.route"),
            "the weights of several destinations add up to 0",
        );
    }
}

fn http_route_destinations(f: &mut Findings, path: &str, routes: &[HttpRouteDestination]) {
    for (i, r) in routes.iter().enumerate() {
        let rp = format!("{path}.route[{i}]");
        if let Some(h) = &r.headers {
            headers(f, &format!("{rp}.headers"), h);
        }
        destination(f, &format!("{rp}.destination"), &r.destination);
    }
    check_weights(
        f,
        path,
        &routes.iter().map(|r| r.weight).collect::<Vec<_>>(),
    );
}

fn route_destinations(f: &mut Findings, path: &str, routes: &[RouteDestination]) {
    for (i, r) in routes.iter().enumerate() {
        destination(f, &format!("{path}.route[{i}].destination"), &r.destination);
    }
    check_weights(
        f,
        path,
        &routes.iter().map(|r| r.weight).collect::<Vec<_>>(),
    );
}

fn retries(f: &mut Findings, path: &str, r: &HttpRetry) {
    let attempts = r.attempts.unwrap_or(0);
    if attempts < 0 {
        f.error(
            format!("{path}.attempts"),
            format!("attempts must not be negative (got {attempts})"),
        );
    }
    let configured = r.per_try_timeout.is_some()
        || r.retry_on.as_deref().is_some_and(|s| !s.is_empty())
        || r.retry_remote_localities.is_some();
    if attempts == 0 && configured {
        f.error(
            format!("{path}.attempts"),
            "retries are configured but attempts is 0 (retries disabled)",
        );
    }
    if let Some(t) = &r.per_try_timeout {
        check_duration(f, &format!("{path}.perTryTimeout"), t);
    }
    if let Some(on) = r.retry_on.as_deref().filter(|s| !s.is_empty()) {
        for policy in on.split(',') {
            let named_status = policy
                .parse::<i64>()
                .ok()
                .and_then(|code| u16::try_from(code).ok())
                .is_some_and(|code| NAMED_HTTP_STATUS.contains(&code));
            if !named_status && !RETRY_ON.contains(&policy) {
                f.error(
                    format!("{path}.retryOn"),
                    format!("{policy:?} is not a retry policy Envoy knows or an HTTP status code"),
                );
            }
        }
    }
    if let Some(b) = &r.backoff {
        check_duration(f, &format!("{path}.backoff"), b);
    }
}

/// A redirect changes at least one of uri, authority, port and scheme; its code is 3xx;
/// its scheme is http or https. Like Istio, only the first problem is reported.
fn redirect(f: &mut Findings, path: &str, r: &HttpRedirect) {
    for g in r.conflicting_oneofs() {
        f.error(path, format!("only one of {} may be set", g.set.join(", ")));
    }
    let set = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
    if !set(&r.uri)
        && !set(&r.authority)
        && r.port.is_none()
        && r.derive_port.is_none()
        && !set(&r.scheme)
    {
        f.error(
            path,
            "a redirect must change at least one of uri, authority, scheme or port",
        );
        return;
    }
    if let Some(code) = r.redirect_code.filter(|c| *c != 0)
        && !(300..=399).contains(&code)
    {
        f.error(
            format!("{path}.redirectCode"),
            format!("{code} is not a 3xx redirect code"),
        );
        return;
    }
    if let Some(scheme) = r.scheme.as_deref().filter(|s| !s.is_empty())
        && scheme != "http"
        && scheme != "https"
    {
        f.error(
            format!("{path}.scheme"),
            format!("the redirect scheme must be \"http\" or \"https\" (got {scheme:?})"),
        );
        return;
    }
    if let Some(port) = r.port.filter(|p| *p > 0) {
        f.check(format!("{path}.port"), names::check_port(port.into()));
    }
}

fn rewrite(f: &mut Findings, path: &str, rw: &HttpRewrite) {
    let uri = rw.uri.as_deref().is_some_and(|u| !u.is_empty());
    let authority = rw.authority.as_deref().is_some_and(|a| !a.is_empty());
    if uri && rw.uri_regex_rewrite.is_some() {
        f.error(path, "only one of uri and uriRegexRewrite may be set");
        return;
    }
    if !uri && rw.uri_regex_rewrite.is_none() && !authority {
        f.error(
            path,
            "a rewrite must set at least one of uri, uriRegexRewrite or authority",
        );
        return;
    }
    if let Some(rr) = &rw.uri_regex_rewrite {
        let rp = format!("{path}.uriRegexRewrite");
        let pattern = rr.r#match.as_deref().unwrap_or("");
        if pattern.is_empty() || rr.rewrite.as_deref().unwrap_or("").is_empty() {
            f.error(&rp, "uriRegexRewrite needs both match and rewrite");
        } else {
            f.check(format!("{rp}.match"), check_regex(pattern));
        }
    }
}

fn tls_route(
    f: &mut Findings,
    path: &str,
    route: &TlsRoute,
    hosts: &[String],
    gateway_bound: bool,
) {
    if route.r#match.is_empty() {
        f.error(
            format!("{path}.match"),
            "a TLS route needs at least one match",
        );
    }
    for (i, m) in route.r#match.iter().enumerate() {
        tls_match(f, &format!("{path}.match[{i}]"), m, hosts, gateway_bound);
    }
    if route.route.is_empty() {
        f.error(
            format!("{path}.route"),
            "a TLS route needs at least one destination",
        );
    }
    route_destinations(f, path, &route.route);
}

fn tls_match(
    f: &mut Findings,
    path: &str,
    m: &TlsMatchAttributes,
    hosts: &[String],
    gateway_bound: bool,
) {
    if m.sni_hosts.is_empty() {
        f.error(
            format!("{path}.sniHosts"),
            "a TLS match needs at least one SNI host",
        );
    }
    for (i, sni) in m.sni_hosts.iter().enumerate() {
        let sp = format!("{path}.sniHosts[{i}]");
        let checked = if gateway_bound {
            check_gateway_host(true, sni)
        } else {
            names::check_wildcard_domain(sni)
        };
        if let Err(reason) = checked {
            if names::is_ip(sni) {
                f.warning(
                    &sp,
                    format!("{sni:?} is an IP address, which SNI does not allow and most clients never send"),
                );
            } else {
                f.error(&sp, reason);
            }
            continue;
        }
        if !hosts.iter().any(|h| host_subset_of(sni, h)) {
            f.error(
                &sp,
                format!(
                    "SNI host {sni:?} is not covered by any host of the VirtualService ({})",
                    hosts.join(", ")
                ),
            );
        }
    }
    l4_match_common(
        f,
        path,
        &m.destination_subnets,
        m.port,
        &m.source_labels,
        &m.gateways,
    );
}

fn tcp_route(f: &mut Findings, path: &str, route: &TcpRoute) {
    for (i, m) in route.r#match.iter().enumerate() {
        tcp_match(f, &format!("{path}.match[{i}]"), m);
    }
    if route.route.is_empty() {
        f.error(
            format!("{path}.route"),
            "a TCP route needs at least one destination",
        );
    }
    route_destinations(f, path, &route.route);
}

fn tcp_match(f: &mut Findings, path: &str, m: &L4MatchAttributes) {
    l4_match_common(
        f,
        path,
        &m.destination_subnets,
        m.port,
        &m.source_labels,
        &m.gateways,
    );
}

fn l4_match_common(
    f: &mut Findings,
    path: &str,
    subnets: &[String],
    port: Option<u32>,
    source_labels: &BTreeMap<String, String>,
    gateways: &[String],
) {
    for (i, s) in subnets.iter().enumerate() {
        f.check(
            format!("{path}.destinationSubnets[{i}]"),
            names::check_ip_subnet(s),
        );
    }
    if let Some(port) = port.filter(|p| *p != 0) {
        f.check(format!("{path}.port"), names::check_port(port.into()));
    }
    check_labels(f, &format!("{path}.sourceLabels"), source_labels);
    check_gateway_names(f, &format!("{path}.gateways"), gateways);
}

/// A route's name in warnings: its `name`, else its index.
fn route_label(route: &HttpRoute, index: usize) -> String {
    match route.name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => format!("{name:?}"),
        None => format!("#{index}"),
    }
}

fn match_label(m: &HttpMatchRequest, index: usize) -> String {
    match m.name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => format!("{name:?}"),
        None => format!("#{index}"),
    }
}

/// The conditions of a match, for comparing two matches (the name does not count).
fn conditions(m: &HttpMatchRequest) -> HttpMatchRequest {
    HttpMatchRequest {
        name: None,
        ..m.clone()
    }
}

/// Istio's unreachable-route analysis, as warnings: a route after one without matches, a
/// route whose every match repeats an earlier one, a match repeated verbatim, and a
/// prefix match covered by an earlier, shorter prefix with the same other conditions.
fn unreachable_http_routes(f: &mut Findings, routes: &[HttpRoute]) {
    let mut seen: Vec<(HttpMatchRequest, usize)> = Vec::new();
    let mut catch_all: Option<usize> = None;
    let mut prefixes: Vec<PrefixMatch> = Vec::new();
    for (i, route) in routes.iter().enumerate() {
        let path = format!("spec.http[{i}]");
        if route.r#match.is_empty() {
            if let Some(earlier) = catch_all {
                f.warning(
                    &path,
                    format!("route {} is never used: route {} before it has no matches either (only the last route may have none)", route_label(route, i), route_label(&routes[earlier], earlier)),
                );
            }
            catch_all = Some(i);
            continue;
        }
        let mut repeated = 0;
        for (j, m) in route.r#match.iter().enumerate() {
            if let Some(earlier) = catch_all {
                f.warning(
                    &path,
                    format!(
                        "route {} is never used: route {} before it matches every request",
                        route_label(route, i),
                        route_label(&routes[earlier], earlier)
                    ),
                );
                continue;
            }
            let cond = conditions(m);
            if let Some((_, earlier)) = seen.iter().find(|(c, _)| *c == cond) {
                f.warning(
                    format!("{path}.match[{j}]"),
                    format!(
                        "match {} of route {} is never used: route {} has the same match",
                        match_label(m, j),
                        route_label(route, i),
                        route_label(&routes[*earlier], *earlier)
                    ),
                );
                repeated += 1;
                continue;
            }
            seen.push((cond, i));
            if let Some(p) = PrefixMatch::of(m, i, j) {
                prefixes.push(p);
            }
        }
        if repeated == route.r#match.len() {
            f.warning(
                &path,
                format!(
                    "route {} is never used: every match of it is used by earlier routes",
                    route_label(route, i)
                ),
            );
        }
    }
    for (a_index, a) in prefixes.iter().enumerate() {
        for b in &prefixes[a_index + 1..] {
            if a.prefix != b.prefix && a.covers(b) {
                f.warning(
                    format!("spec.http[{}].match[{}]", b.route, b.index),
                    format!(
                        "match {} of route {} (prefix {:?}) is never used: match {} of route {} (prefix {:?}) takes its requests first",
                        match_label(&routes[b.route].r#match[b.index], b.index),
                        route_label(&routes[b.route], b.route),
                        b.prefix,
                        match_label(&routes[a.route].r#match[a.index], a.index),
                        route_label(&routes[a.route], a.route),
                        a.prefix
                    ),
                );
            }
        }
    }
}

/// What Istio's overlap analysis compares of a URI-prefix match: the prefix, the port, and
/// the exact or prefix values (as `exact:v` / `prefix:v`, empty for anything else) of the
/// method (default `exact:GET`), authority, headers, query parameters and withoutHeaders.
struct PrefixMatch {
    route: usize,
    index: usize,
    prefix: String,
    port: u32,
    method: String,
    authority: String,
    headers: BTreeMap<String, String>,
    query_params: BTreeMap<String, String>,
    without_headers: BTreeMap<String, String>,
}

fn exact_or_prefix(m: Option<&StringMatch>) -> String {
    match m {
        Some(StringMatch::Exact(v)) if !v.is_empty() => format!("exact:{v}"),
        Some(StringMatch::Prefix(v)) if !v.is_empty() => format!("prefix:{v}"),
        _ => String::new(),
    }
}

impl PrefixMatch {
    fn of(m: &HttpMatchRequest, route: usize, index: usize) -> Option<PrefixMatch> {
        let Some(StringMatch::Prefix(prefix)) = &m.uri else {
            return None;
        };
        if prefix.is_empty() {
            return None;
        }
        let mut method = exact_or_prefix(m.method.as_ref());
        if method.is_empty() {
            method = "exact:GET".to_string();
        }
        let map = |values: &BTreeMap<String, StringMatch>| {
            values
                .iter()
                .map(|(k, v)| (k.clone(), exact_or_prefix(Some(v))))
                .collect()
        };
        Some(PrefixMatch {
            route,
            index,
            prefix: prefix.clone(),
            port: m.port.unwrap_or(0),
            method,
            authority: exact_or_prefix(m.authority.as_ref()),
            headers: map(&m.headers),
            query_params: map(&m.query_params),
            without_headers: map(&m.without_headers),
        })
    }

    /// Whether the earlier match `self` takes every request of the later one.
    fn covers(&self, later: &PrefixMatch) -> bool {
        let value_covers = |a: &str, b: &str| a == b || a.starts_with(b);
        let map_covers = |a: &BTreeMap<String, String>, b: &BTreeMap<String, String>| {
            a.len() == b.len()
                && a.iter()
                    .all(|(k, v)| b.get(k).is_some_and(|bv| value_covers(v, bv)))
        };
        later.prefix.starts_with(&self.prefix)
            && self.port == later.port
            && value_covers(&self.method, &later.method)
            && value_covers(&self.authority, &later.authority)
            && map_covers(&self.headers, &later.headers)
            && map_covers(&self.query_params, &later.query_params)
            && map_covers(&self.without_headers, &later.without_headers)
    }
}

/// The same analysis for TCP and TLS routes (no names, no prefix overlap).
fn unreachable_l4_routes<R, M: PartialEq>(
    f: &mut Findings,
    kind: &str,
    routes: &[R],
    matches: impl Fn(&R) -> &Vec<M>,
) {
    let mut seen: Vec<(&M, usize)> = Vec::new();
    let mut catch_all: Option<usize> = None;
    for (i, route) in routes.iter().enumerate() {
        let path = format!("spec.{kind}[{i}]");
        let list = matches(route);
        if list.is_empty() {
            if let Some(earlier) = catch_all {
                f.warning(
                    &path,
                    format!("route #{i} is never used: route #{earlier} before it has no matches either (only the last route may have none)"),
                );
            }
            catch_all = Some(i);
            continue;
        }
        let mut repeated = 0;
        for (j, m) in list.iter().enumerate() {
            if let Some(earlier) = catch_all {
                f.warning(
                    &path,
                    format!("route #{i} is never used: route #{earlier} before it matches every connection"),
                );
                continue;
            }
            if let Some((_, earlier)) = seen.iter().find(|(c, _)| *c == m) {
                f.warning(
                    format!("{path}.match[{j}]"),
                    format!("match #{j} of route #{i} is never used: route #{earlier} has the same match"),
                );
                repeated += 1;
            } else {
                seen.push((m, i));
            }
        }
        if repeated == list.len() {
            f.warning(
                &path,
                format!("route #{i} is never used: every match of it is used by earlier routes"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> Validated<VirtualServiceSpec> {
        let vs: VirtualService = crate::api::parse_strict_yaml(yaml).unwrap();
        validate_virtual_service(&vs, "cluster.local")
    }

    const HEAD: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\n";

    #[test]
    fn resolves_hosts_and_accepts_weighted_subsets() {
        let out = check(&format!(
            "{HEAD}spec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {{host: reviews, subset: v1}}\n      weight: 80\n    - destination: {{host: reviews, subset: v9}}\n      weight: 20\n"
        ));
        assert!(out.findings.is_empty(), "{:?}", out.findings);
        let spec = out.spec.unwrap();
        assert_eq!(spec.hosts, vec!["reviews.default.svc.cluster.local"]);
        assert_eq!(
            spec.http[0].route[1].destination.host,
            "reviews.default.svc.cluster.local"
        );
    }

    #[test]
    fn reports_each_error_with_its_path() {
        let out = check(&format!(
            "{HEAD}spec:\n  hosts: [reviews]\n  http:\n  - match:\n    - uri: {{regex: \"([a-z\"}}\n    route:\n    - destination: {{host: reviews, subset: V_1}}\n      weight: -10\n    - destination: {{host: reviews, subset: v1}}\n      weight: 20\n"
        ));
        assert!(out.spec.is_none());
        let paths: Vec<_> = out.findings.iter().map(|e| e.path.as_str()).collect();
        for p in [
            "spec.http[0].match[0].uri.regex",
            "spec.http[0].route[0].weight",
            "spec.http[0].route[0].destination.subset",
        ] {
            assert!(paths.contains(&p), "{p} not in {paths:?}");
        }
    }

    #[test]
    fn host_overlap_and_subset_follow_istio() {
        assert!(hosts_overlap("*.com", "foo.com"));
        assert!(hosts_overlap("foo.com", "*.com"));
        assert!(hosts_overlap("*.foo.com", "*.com"));
        assert!(!hosts_overlap("*.foo.com", "foo.com"));
        assert!(!hosts_overlap(
            "reviews",
            "reviews.default.svc.cluster.local"
        ));
        assert!(host_subset_of("a.foo.com", "*.foo.com"));
        assert!(host_subset_of("*.a.foo.com", "*.foo.com"));
        assert!(!host_subset_of("*.foo.com", "a.foo.com"));
    }
}
