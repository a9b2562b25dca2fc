//! VirtualService validation and resolution: Istio's rules, plus reference checks against
//! the DestinationRules (subsets) and services the caller knows about.

use std::collections::BTreeSet;

use super::common::*;
use super::{Validated, ValidationContext};
use crate::api::{
    CorsPolicy, Destination, Headers, HttpFaultInjection, HttpMatchRequest, HttpRoute,
    HttpRouteDestination, Oneofs, RouteDestination, StringMatch, VirtualService,
    VirtualServiceSpec, grpc_status_code,
};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;
use crate::push_context::hosts::{check_host, resolve_short_name};

/// Envoy's retry conditions (`x-envoy-retry-on` and `x-envoy-retry-grpc-on`) Istio accepts
/// in `retryOn`, besides plain HTTP status codes.
const RETRY_ON: [&str; 19] = [
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "envoy-ratelimited",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
    "previous-hosts",
    "retriable-status-code",
    "gateway-error-retriable",
];

const HTTP_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// Validates one VirtualService and returns its spec with every host resolved to an FQDN.
pub fn validate_virtual_service(
    vs: &VirtualService,
    ctx: &ValidationContext,
) -> Validated<VirtualServiceSpec> {
    let namespace = namespace_of(&vs.metadata);
    let key = ConfigKey::new(
        ConfigKind::VirtualService,
        &namespace,
        vs.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    let mut spec = vs.spec.clone();
    let v = VsValidator {
        ctx,
        namespace: &namespace,
    };

    let mesh_bound = spec.gateways.is_empty() || spec.gateways.iter().any(|g| g == "mesh");
    for (i, host) in spec.hosts.iter_mut().enumerate() {
        let path = format!("spec.hosts[{i}]");
        if let Err(r) = check_host(host, true) {
            f.error(&path, r);
            continue;
        }
        if host == "*" && mesh_bound {
            f.error(
                &path,
                "wildcard host `*` is not allowed for VirtualServices bound to the mesh",
            );
        }
        *host = resolve_short_name(host, &namespace, ctx.cluster_domain);
    }
    let mut seen = BTreeSet::new();
    for (i, host) in spec.hosts.iter().enumerate() {
        if !seen.insert(host.clone()) {
            f.error(
                format!("spec.hosts[{i}]"),
                format!("duplicate host {host:?}"),
            );
        }
    }
    for (i, g) in spec.gateways.iter().enumerate() {
        let name = g.rsplit('/').next().unwrap_or(g);
        if g != "mesh" && check_host(name, false).is_err() {
            f.error(
                format!("spec.gateways[{i}]"),
                format!("{g:?} is not a valid gateway name (`mesh` or `[namespace/]name`)"),
            );
        }
    }
    check_export_to(&mut f, "spec.exportTo", &spec.export_to);
    if spec.hosts.is_empty() && spec.http.iter().any(|r| r.delegate.is_some()) {
        f.error(
            "spec.http",
            "a delegate VirtualService (no hosts) cannot delegate again",
        );
    }
    if spec.http.is_empty() && spec.tcp.is_empty() && spec.tls.is_empty() {
        f.error(
            "spec",
            "a VirtualService needs at least one http, tcp or tls route",
        );
    }

    for (i, route) in spec.http.iter_mut().enumerate() {
        v.http_route(
            &mut f,
            &format!("spec.http[{i}]"),
            route,
            spec.hosts.is_empty(),
        );
    }
    v.unreachable_routes(&mut f, &spec.http);
    for (i, route) in spec.tcp.iter_mut().enumerate() {
        let path = format!("spec.tcp[{i}]");
        for (j, m) in route.r#match.iter().enumerate() {
            let mp = format!("{path}.match[{j}]");
            if let Some(p) = m.port {
                check_port(&mut f, &format!("{mp}.port"), p);
            }
            for (k, s) in m.destination_subnets.iter().enumerate() {
                if let Err(r) = check_ip_or_cidr(s) {
                    f.error(format!("{mp}.destinationSubnets[{k}]"), r);
                }
            }
            if let Some(s) = &m.source_subnet
                && let Err(r) = check_ip_or_cidr(s)
            {
                f.error(format!("{mp}.sourceSubnet"), r);
            }
            check_labels(&mut f, &format!("{mp}.sourceLabels"), &m.source_labels);
        }
        v.route_destinations(&mut f, &path, &mut route.route);
    }
    for (i, route) in spec.tls.iter_mut().enumerate() {
        let path = format!("spec.tls[{i}]");
        if route.r#match.is_empty() {
            f.error(
                format!("{path}.match"),
                "a TLS route needs at least one match",
            );
        }
        for (j, m) in route.r#match.iter().enumerate() {
            let mp = format!("{path}.match[{j}]");
            if m.sni_hosts.is_empty() {
                f.error(
                    format!("{mp}.sniHosts"),
                    "a TLS match needs at least one SNI host",
                );
            }
            for (k, sni) in m.sni_hosts.iter().enumerate() {
                let resolved = resolve_short_name(sni, &namespace, ctx.cluster_domain);
                if let Err(r) = check_host(sni, true) {
                    f.error(format!("{mp}.sniHosts[{k}]"), r);
                } else if !spec
                    .hosts
                    .iter()
                    .any(|h| crate::push_context::hosts::host_matches(h, &resolved))
                {
                    f.error(
                        format!("{mp}.sniHosts[{k}]"),
                        format!("SNI host {sni:?} is not one of the VirtualService's hosts"),
                    );
                }
            }
            if let Some(p) = m.port {
                check_port(&mut f, &format!("{mp}.port"), p);
            }
        }
        v.route_destinations(&mut f, &path, &mut route.route);
    }
    Validated::new(spec, f.list)
}

struct VsValidator<'a> {
    ctx: &'a ValidationContext<'a>,
    namespace: &'a str,
}

impl VsValidator<'_> {
    fn http_route(&self, f: &mut Findings, path: &str, route: &mut HttpRoute, is_delegate: bool) {
        let actions = [
            ("route", !route.route.is_empty()),
            ("redirect", route.redirect.is_some()),
            ("directResponse", route.direct_response.is_some()),
            ("delegate", route.delegate.is_some()),
        ];
        let set: Vec<_> = actions
            .iter()
            .filter(|(_, s)| *s)
            .map(|(n, _)| *n)
            .collect();
        match set.len() {
            0 => f.error(
                path,
                "an HTTP route needs one of route, redirect, directResponse or delegate",
            ),
            1 => {}
            _ => f.error(
                path,
                format!("an HTTP route may set only one of {}", set.join(", ")),
            ),
        }
        for (i, m) in route.r#match.iter().enumerate() {
            self.http_match(f, &format!("{path}.match[{i}]"), m);
        }
        self.http_route_destinations(f, path, &mut route.route);
        if let Some(r) = &route.redirect {
            let rp = format!("{path}.redirect");
            for g in r.conflicting_oneofs() {
                f.error(&rp, format!("only one of {} may be set", g.set.join(", ")));
            }
            if let Some(code) = r.redirect_code
                && ![301, 302, 303, 307, 308].contains(&code)
            {
                f.error(
                    format!("{rp}.redirectCode"),
                    format!("must be 301, 302, 303, 307 or 308 (got {code})"),
                );
            }
            if let Some(p) = r.port {
                check_port(f, &format!("{rp}.port"), p);
            }
            if r.uri.is_none()
                && r.authority.is_none()
                && r.port.is_none()
                && r.derive_port.is_none()
                && r.scheme.is_none()
            {
                f.error(
                    &rp,
                    "a redirect must change at least one of uri, authority, port or scheme",
                );
            }
            if route.rewrite.is_some() {
                f.error(
                    format!("{path}.rewrite"),
                    "rewrite cannot be combined with redirect",
                );
            }
        }
        if let Some(d) = &route.direct_response {
            let dp = format!("{path}.directResponse");
            if !(200..=599).contains(&d.status) {
                f.error(
                    format!("{dp}.status"),
                    format!("must be between 200 and 599 (got {})", d.status),
                );
            }
            if let Some(body) = &d.body {
                for g in body.conflicting_oneofs() {
                    f.error(
                        format!("{dp}.body"),
                        format!("only one of {} may be set", g.set.join(", ")),
                    );
                }
            }
        }
        if let Some(d) = &mut route.delegate {
            let dp = format!("{path}.delegate");
            if is_delegate {
                f.error(&dp, "a delegate VirtualService cannot delegate again");
            }
            if d.name.as_deref().unwrap_or("").is_empty() {
                f.error(format!("{dp}.name"), "delegate name is required");
            }
            if d.namespace.as_deref().unwrap_or("").is_empty() {
                d.namespace = Some(self.namespace.to_string());
            }
        }
        if let Some(rw) = &route.rewrite {
            let rp = format!("{path}.rewrite");
            if rw.uri.is_some() && rw.uri_regex_rewrite.is_some() {
                f.error(&rp, "only one of uri and uriRegexRewrite may be set");
            }
            if let Some(rr) = &rw.uri_regex_rewrite {
                match rr.r#match.as_deref() {
                    None | Some("") => f.error(
                        format!("{rp}.uriRegexRewrite.match"),
                        "regex to match is required",
                    ),
                    Some(re) => {
                        if let Err(e) = check_re2(re) {
                            f.error(format!("{rp}.uriRegexRewrite.match"), e);
                        }
                    }
                }
                if rr.rewrite.is_none() {
                    f.error(
                        format!("{rp}.uriRegexRewrite.rewrite"),
                        "rewrite is required",
                    );
                }
            }
        }
        if let Some(t) = &route.timeout {
            // A zero timeout disables it in Envoy; Istio accepts `0s`.
            if !t.as_std().is_zero() {
                check_duration_min_ms(f, &format!("{path}.timeout"), t);
            }
        }
        if let Some(r) = &route.retries {
            let rp = format!("{path}.retries");
            if let Some(a) = r.attempts {
                check_non_negative(f, &format!("{rp}.attempts"), a.into());
            }
            if let Some(t) = &r.per_try_timeout {
                check_duration_min_ms(f, &format!("{rp}.perTryTimeout"), t);
            }
            if let Some(on) = &r.retry_on {
                for cond in on.split(',').map(str::trim) {
                    let is_code = cond.len() == 3
                        && cond.parse::<u16>().is_ok_and(|c| (100..=599).contains(&c));
                    if !is_code && !RETRY_ON.contains(&cond) {
                        f.error(
                            format!("{rp}.retryOn"),
                            format!("{cond:?} is not a retry condition Envoy knows"),
                        );
                    }
                }
            }
        }
        if let Some(fault) = &route.fault {
            self.fault(f, &format!("{path}.fault"), fault);
        }
        if route.mirror.is_some() && !route.mirrors.is_empty() {
            f.error(
                format!("{path}.mirrors"),
                "mirror and mirrors cannot both be set",
            );
        }
        if let Some(m) = &mut route.mirror {
            self.destination(f, &format!("{path}.mirror"), m);
        }
        if let Some(p) = &route.mirror_percentage {
            check_percent(f, &format!("{path}.mirrorPercentage"), p);
        }
        if let Some(p) = route.mirror_percent {
            check_int_percent(f, &format!("{path}.mirrorPercent"), p.into());
        }
        for (i, m) in route.mirrors.iter_mut().enumerate() {
            let mp = format!("{path}.mirrors[{i}]");
            self.destination(f, &format!("{mp}.destination"), &mut m.destination);
            if let Some(p) = &m.percentage {
                check_percent(f, &format!("{mp}.percentage"), p);
            }
        }
        if let Some(c) = &route.cors_policy {
            cors(f, &format!("{path}.corsPolicy"), c);
        }
        if let Some(h) = &route.headers {
            headers(f, &format!("{path}.headers"), h);
        }
    }

    fn http_match(&self, f: &mut Findings, path: &str, m: &HttpMatchRequest) {
        for (field, sm) in [
            ("uri", &m.uri),
            ("scheme", &m.scheme),
            ("method", &m.method),
            ("authority", &m.authority),
        ] {
            if let Some(sm) = sm {
                check_string_match(f, &format!("{path}.{field}"), sm);
                if matches!(sm, StringMatch::Any) {
                    f.error(
                        format!("{path}.{field}"),
                        "set one of exact, prefix or regex",
                    );
                }
            }
        }
        if let Some(StringMatch::Exact(method)) = &m.method
            && !HTTP_METHODS.contains(&method.as_str())
        {
            f.warning(
                format!("{path}.method.exact"),
                format!("{method:?} is not a standard HTTP method"),
            );
        }
        check_string_match_map(f, &format!("{path}.headers"), &m.headers);
        check_string_match_map(f, &format!("{path}.withoutHeaders"), &m.without_headers);
        check_string_match_map(f, &format!("{path}.queryParams"), &m.query_params);
        for name in m.headers.keys().chain(m.without_headers.keys()) {
            if name.chars().any(|c| c.is_ascii_uppercase()) {
                f.warning(
                    format!("{path}.headers[{name}]"),
                    "header names are matched case-insensitively; write them in lower case",
                );
            }
        }
        if let Some(p) = m.port {
            check_port(f, &format!("{path}.port"), p);
        }
        check_labels(f, &format!("{path}.sourceLabels"), &m.source_labels);
        if let Some(ns) = &m.source_namespace
            && let Err(r) = check_dns1123_label(ns)
        {
            f.error(format!("{path}.sourceNamespace"), r);
        }
    }

    fn fault(&self, f: &mut Findings, path: &str, fault: &HttpFaultInjection) {
        if fault.delay.is_none() && fault.abort.is_none() {
            f.error(path, "a fault needs a delay or an abort");
        }
        if let Some(d) = &fault.delay {
            let dp = format!("{path}.delay");
            for g in d.conflicting_oneofs() {
                f.error(&dp, format!("only one of {} may be set", g.set.join(", ")));
            }
            match (&d.fixed_delay, &d.exponential_delay) {
                (Some(t), _) => check_duration_min_ms(f, &format!("{dp}.fixedDelay"), t),
                (None, Some(_)) => f.error(
                    format!("{dp}.exponentialDelay"),
                    "exponentialDelay is not supported by Istio",
                ),
                (None, None) => f.error(&dp, "a delay needs fixedDelay"),
            }
            if let Some(p) = &d.percentage {
                check_percent(f, &format!("{dp}.percentage"), p);
            }
            if let Some(p) = d.percent {
                check_int_percent(f, &format!("{dp}.percent"), p.into());
            }
        }
        if let Some(a) = &fault.abort {
            let ap = format!("{path}.abort");
            for g in a.conflicting_oneofs() {
                f.error(&ap, format!("only one of {} may be set", g.set.join(", ")));
            }
            match (a.http_status, &a.grpc_status, &a.http2_error) {
                (Some(s), _, _) if !(200..=599).contains(&s) => f.error(
                    format!("{ap}.httpStatus"),
                    format!("must be between 200 and 599 (got {s})"),
                ),
                (None, Some(g), _) if grpc_status_code(g).is_none() => f.error(
                    format!("{ap}.grpcStatus"),
                    format!("{g:?} is not a gRPC status name (like UNAVAILABLE)"),
                ),
                (None, None, Some(_)) => f.error(
                    format!("{ap}.http2Error"),
                    "http2Error aborts are not supported by Istio",
                ),
                (None, None, None) => f.error(&ap, "an abort needs httpStatus or grpcStatus"),
                _ => {}
            }
            if let Some(p) = &a.percentage {
                check_percent(f, &format!("{ap}.percentage"), p);
            }
        }
    }

    fn http_route_destinations(
        &self,
        f: &mut Findings,
        path: &str,
        routes: &mut [HttpRouteDestination],
    ) {
        let weights: Vec<Option<i32>> = routes.iter().map(|r| r.weight).collect();
        check_weights(f, path, &weights);
        for (i, r) in routes.iter_mut().enumerate() {
            let rp = format!("{path}.route[{i}]");
            self.destination(f, &format!("{rp}.destination"), &mut r.destination);
            if let Some(h) = &r.headers {
                headers(f, &format!("{rp}.headers"), h);
            }
        }
    }

    fn route_destinations(&self, f: &mut Findings, path: &str, routes: &mut [RouteDestination]) {
        if routes.is_empty() {
            f.error(
                format!("{path}.route"),
                "at least one destination is required",
            );
        }
        let weights: Vec<Option<i32>> = routes.iter().map(|r| r.weight).collect();
        check_weights(f, path, &weights);
        for (i, r) in routes.iter_mut().enumerate() {
            self.destination(
                f,
                &format!("{path}.route[{i}].destination"),
                &mut r.destination,
            );
        }
    }

    /// Checks a destination and resolves its host. Subsets must be defined by a
    /// DestinationRule the VirtualService's namespace can see.
    fn destination(&self, f: &mut Findings, path: &str, d: &mut Destination) {
        if let Err(r) = check_host(&d.host, false) {
            f.error(format!("{path}.host"), r);
            return;
        }
        d.host = resolve_short_name(&d.host, self.namespace, self.ctx.cluster_domain);
        if let Some(p) = &d.port {
            check_port(f, &format!("{path}.port.number"), p.number);
        }
        if let Some(known) = self.ctx.known_hosts
            && !known.covers(&d.host)
        {
            f.warning(
                format!("{path}.host"),
                format!(
                    "host {:?} is not a known service or ServiceEntry host",
                    d.host
                ),
            );
        }
        if let Some(subset) = d.subset.as_deref() {
            if let Err(r) = check_dns1123_label(subset) {
                f.error(format!("{path}.subset"), r);
            } else if !self.ctx.subsets.defines(&d.host, self.namespace, subset) {
                f.error(
                    format!("{path}.subset"),
                    format!(
                        "subset {subset:?} is not defined by any DestinationRule for host {:?}",
                        d.host
                    ),
                );
            }
        }
    }

    /// Istio's "conflicting matches" warnings: a route that matches everything hides the
    /// routes after it, and a match repeated verbatim never wins.
    fn unreachable_routes(&self, f: &mut Findings, routes: &[HttpRoute]) {
        let mut seen: Vec<(usize, &HttpMatchRequest)> = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            let catch_all = route.r#match.is_empty() || route.r#match.iter().any(is_catch_all);
            if catch_all && i + 1 < routes.len() {
                f.warning(
                    format!("spec.http[{i}]"),
                    format!("this route matches all requests, so the {} route(s) after it are never used", routes.len() - i - 1),
                );
                break;
            }
            for (j, m) in route.r#match.iter().enumerate() {
                if let Some((earlier, _)) = seen.iter().find(|(_, prev)| same_conditions(prev, m)) {
                    f.warning(
                        format!("spec.http[{i}].match[{j}]"),
                        format!("this match repeats one of spec.http[{earlier}] and is never used"),
                    );
                }
            }
            seen.extend(route.r#match.iter().map(|m| (i, m)));
        }
    }
}

/// A match request with no conditions (a name or stat prefix only) matches everything.
fn is_catch_all(m: &HttpMatchRequest) -> bool {
    same_conditions(m, &HttpMatchRequest::default())
}

fn same_conditions(a: &HttpMatchRequest, b: &HttpMatchRequest) -> bool {
    let strip = |m: &HttpMatchRequest| HttpMatchRequest {
        name: None,
        stat_prefix: None,
        ..m.clone()
    };
    strip(a) == strip(b)
}

/// Weights are relative (Istio 1.15+): each must be non-negative and, with several
/// destinations, at least one must be positive.
fn check_weights(f: &mut Findings, path: &str, weights: &[Option<i32>]) {
    for (i, w) in weights.iter().enumerate() {
        if let Some(w) = w
            && *w < 0
        {
            f.error(
                format!("{path}.route[{i}].weight"),
                format!("weight must not be negative (got {w})"),
            );
        }
    }
    if weights.len() > 1 && weights.iter().all(|w| w.unwrap_or(0) == 0) {
        f.error(
            format!("{path}.route"),
            "with several destinations, at least one weight must be positive",
        );
    }
}

fn cors(f: &mut Findings, path: &str, c: &CorsPolicy) {
    for (i, o) in c.allow_origins.iter().enumerate() {
        check_string_match(f, &format!("{path}.allowOrigins[{i}]"), o);
    }
    for (i, m) in c.allow_methods.iter().enumerate() {
        if m != "*" && !HTTP_METHODS.contains(&m.as_str()) {
            f.error(
                format!("{path}.allowMethods[{i}]"),
                format!("{m:?} is not an HTTP method"),
            );
        }
    }
    for (field, list) in [
        ("allowHeaders", &c.allow_headers),
        ("exposeHeaders", &c.expose_headers),
    ] {
        for (i, h) in list.iter().enumerate() {
            if h != "*"
                && let Err(r) = check_header_name(h)
            {
                f.error(format!("{path}.{field}[{i}]"), r);
            }
        }
    }
    if let Some(age) = &c.max_age
        && age.as_std().subsec_nanos() != 0
    {
        f.error(
            format!("{path}.maxAge"),
            format!("maxAge must be a whole number of seconds (got {age})"),
        );
    }
}

fn headers(f: &mut Findings, path: &str, h: &Headers) {
    for (side, ops) in [("request", &h.request), ("response", &h.response)] {
        let Some(ops) = ops else { continue };
        for (field, names) in [
            ("set", ops.set.keys().collect::<Vec<_>>()),
            ("add", ops.add.keys().collect()),
            ("remove", ops.remove.iter().collect()),
        ] {
            for name in names {
                if let Err(r) = check_header_name(name) {
                    f.error(format!("{path}.{side}.{field}[{name}]"), r);
                } else if side == "request" && name.eq_ignore_ascii_case("host") {
                    f.error(
                        format!("{path}.{side}.{field}[{name}]"),
                        "use rewrite.authority to change the Host header",
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push_context::validate::SubsetIndex;

    fn vs(yaml: &str) -> VirtualService {
        crate::api::parse_strict_yaml(yaml).unwrap()
    }

    fn check(yaml: &str) -> Validated<VirtualServiceSpec> {
        let subsets = SubsetIndex::from_pairs([(
            "reviews.default.svc.cluster.local",
            "default",
            &["v1", "v2"][..],
        )]);
        let ctx = ValidationContext {
            cluster_domain: "cluster.local",
            subsets: &subsets,
            known_hosts: None,
        };
        validate_virtual_service(&vs(yaml), &ctx)
    }

    const HEAD: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\n";

    #[test]
    fn resolves_hosts_and_accepts_weighted_subsets() {
        let out = check(&format!(
            "{HEAD}spec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {{host: reviews, subset: v1}}\n      weight: 80\n    - destination: {{host: reviews, subset: v2}}\n      weight: 20\n"
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
            "{HEAD}spec:\n  hosts: [reviews]\n  http:\n  - match:\n    - uri: {{regex: \"([a-z\"}}\n    route:\n    - destination: {{host: reviews, subset: v9}}\n      weight: -10\n    - destination: {{host: reviews, subset: v1}}\n      weight: 20\n"
        ));
        assert!(out.spec.is_none());
        let paths: Vec<_> = out.findings.iter().map(|e| e.path.as_str()).collect();
        assert!(
            paths.contains(&"spec.http[0].match[0].uri.regex"),
            "{paths:?}"
        );
        assert!(paths.contains(&"spec.http[0].route[0].weight"), "{paths:?}");
        assert!(
            paths.contains(&"spec.http[0].route[0].destination.subset"),
            "{paths:?}"
        );
    }
}
