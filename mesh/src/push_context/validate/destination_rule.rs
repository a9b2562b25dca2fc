//! DestinationRule validation, rule for rule as Istio 1.30 applies it (the webhook's
//! `ValidateDestinationRule` and the CRD schema), and resolution of its host to an FQDN.

use std::collections::{BTreeMap, BTreeSet};

use super::Validated;
use super::common::*;
use super::names;
use crate::api::{
    ClientTlsSettings, ConnectionPoolSettings, DestinationRule, DestinationRuleSpec,
    H2UpgradePolicy, LoadBalancerSettings, LocalityLoadBalancerSetting, Oneofs, OutlierDetection,
    PortTrafficPolicy, TlsMode, TrafficPolicy, TunnelSettings,
};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;
use crate::push_context::hosts::resolve_short_name;

/// The CRD's bounds on list and map sizes.
const MAX_PORT_LEVEL_SETTINGS: usize = 4096;
const MAX_SELECTOR_LABELS: usize = 4096;
/// Maglev table sizes must stay below this prime.
const MAGLEV_TABLE_LIMIT: u64 = 5_000_011;
/// Topology labels that `failoverPriority` may not name when `failover` is set.
const TOPOLOGY_LABELS: [&str; 3] = [
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "topology.istio.io/subzone",
];

/// Validates one DestinationRule and returns its spec with the host resolved to an FQDN.
pub fn validate_destination_rule(
    dr: &DestinationRule,
    cluster_domain: &str,
) -> Validated<DestinationRuleSpec> {
    let namespace = namespace_of(&dr.metadata);
    let key = ConfigKey::new(
        ConfigKind::DestinationRule,
        &namespace,
        dr.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    check_annotations(&mut f, dr.metadata.annotations.as_ref());
    let spec = &dr.spec;
    f.check("spec.host", names::check_wildcard_domain(&spec.host));
    if let Some(tp) = &spec.traffic_policy {
        traffic_policy(&mut f, "spec.trafficPolicy", &namespace, tp);
    }
    let mut subset_names = BTreeSet::new();
    for (i, s) in spec.subsets.iter().enumerate() {
        let path = format!("spec.subsets[{i}]");
        if !subset_names.insert(s.name.as_str()) {
            f.error(
                format!("{path}.name"),
                format!("duplicate subset name {:?}", s.name),
            );
        }
        if s.name.is_empty() {
            f.error(format!("{path}.name"), "subset name must not be empty");
        } else if !names::is_dns1123_label(&s.name) {
            f.error(
                format!("{path}.name"),
                format!("{:?} is not a valid subset name", s.name),
            );
        }
        check_labels(&mut f, &format!("{path}.labels"), &s.labels);
        if let Some(tp) = &s.traffic_policy {
            traffic_policy(&mut f, &format!("{path}.trafficPolicy"), &namespace, tp);
        }
    }
    let export_of = if spec.workload_selector.is_some() {
        ExportToOf::SelectorRule
    } else {
        ExportToOf::Config
    };
    check_export_to(
        &mut f,
        "spec.exportTo",
        &namespace,
        &spec.export_to,
        export_of,
    );
    if let Some(sel) = &spec.workload_selector {
        check_workload_selector(
            &mut f,
            "spec.workloadSelector.matchLabels",
            &sel.match_labels,
            MAX_SELECTOR_LABELS,
            "the workload selector has no labels, so the rule applies to every workload of the namespace",
        );
    }
    let mut resolved = spec.clone();
    resolved.host = resolve_short_name(&spec.host, &namespace, cluster_domain);
    Validated::new(resolved, f.list)
}

fn traffic_policy(f: &mut Findings, path: &str, namespace: &str, tp: &TrafficPolicy) {
    let empty = tp.load_balancer.is_none()
        && tp.connection_pool.is_none()
        && tp.outlier_detection.is_none()
        && tp.tls.is_none()
        && tp.port_level_settings.is_empty()
        && tp.tunnel.is_none()
        && tp.proxy_protocol.is_none()
        && tp.retry_budget.is_none();
    if empty {
        f.error(path, "a traffic policy must set at least one field");
        return;
    }
    if tp.tunnel.is_some() && tp.proxy_protocol.is_some() {
        f.error(path, "tunnel and proxyProtocol cannot both be set");
        return;
    }
    if let Some(od) = &tp.outlier_detection {
        outlier_detection(f, &format!("{path}.outlierDetection"), od);
    }
    if let Some(cp) = &tp.connection_pool {
        connection_pool(f, &format!("{path}.connectionPool"), cp);
    }
    if let Some(lb) = &tp.load_balancer {
        load_balancer(
            f,
            &format!("{path}.loadBalancer"),
            lb,
            tp.outlier_detection.as_ref(),
        );
    }
    if let Some(tls) = &tp.tls {
        client_tls(f, &format!("{path}.tls"), namespace, tls);
    }
    if tp.port_level_settings.len() > MAX_PORT_LEVEL_SETTINGS {
        f.error(
            format!("{path}.portLevelSettings"),
            format!("at most {MAX_PORT_LEVEL_SETTINGS} port-level settings are allowed"),
        );
    }
    for (i, pl) in tp.port_level_settings.iter().enumerate() {
        port_traffic_policy(f, &format!("{path}.portLevelSettings[{i}]"), namespace, pl);
    }
    if let Some(t) = &tp.tunnel {
        tunnel(f, &format!("{path}.tunnel"), t);
    }
    if let Some(rb) = &tp.retry_budget
        && let Some(p) = rb.percent
        && !(0.0..=100.0).contains(&p)
    {
        f.error(
            format!("{path}.retryBudget.percent"),
            format!("must be between 0 and 100 (got {p})"),
        );
    }
}

fn port_traffic_policy(f: &mut Findings, path: &str, namespace: &str, pl: &PortTrafficPolicy) {
    if pl.port.is_none() {
        f.error(format!("{path}.port"), "a port-level setting needs a port");
    }
    if pl.load_balancer.is_none()
        && pl.connection_pool.is_none()
        && pl.outlier_detection.is_none()
        && pl.tls.is_none()
    {
        f.error(path, "a port-level setting must set at least one policy");
        return;
    }
    if let Some(od) = &pl.outlier_detection {
        outlier_detection(f, &format!("{path}.outlierDetection"), od);
    }
    if let Some(cp) = &pl.connection_pool {
        connection_pool(f, &format!("{path}.connectionPool"), cp);
    }
    if let Some(lb) = &pl.load_balancer {
        load_balancer(
            f,
            &format!("{path}.loadBalancer"),
            lb,
            pl.outlier_detection.as_ref(),
        );
    }
    if let Some(tls) = &pl.tls {
        client_tls(f, &format!("{path}.tls"), namespace, tls);
    }
}

fn tunnel(f: &mut Findings, path: &str, t: &TunnelSettings) {
    if let Some(p) = t.protocol.as_deref().filter(|p| !p.is_empty())
        && p != "CONNECT"
        && p != "POST"
    {
        f.error(
            format!("{path}.protocol"),
            format!("must be CONNECT or POST (got {p:?})"),
        );
    }
    if names::check_fqdn(&t.target_host).is_err() && !names::is_ip(&t.target_host) {
        f.error(
            format!("{path}.targetHost"),
            format!(
                "{:?} is neither a valid FQDN nor an IP address",
                t.target_host
            ),
        );
    }
    f.check(
        format!("{path}.targetPort"),
        names::check_port(t.target_port.into()),
    );
}

fn outlier_detection(f: &mut Findings, path: &str, od: &OutlierDetection) {
    if let Some(d) = &od.base_ejection_time {
        check_duration(f, &format!("{path}.baseEjectionTime"), d);
    }
    if od.consecutive_errors.is_some_and(|n| n != 0) {
        f.warning(
            format!("{path}.consecutiveErrors"),
            "consecutiveErrors is deprecated; use consecutiveGatewayErrors or consecutive5xxErrors",
        );
    }
    if od.split_external_local_origin_errors != Some(true)
        && od.consecutive_local_origin_failures.is_some_and(|n| n > 0)
    {
        f.error(
            format!("{path}.consecutiveLocalOriginFailures"),
            "consecutiveLocalOriginFailures needs splitExternalLocalOriginErrors: true",
        );
    }
    if let Some(d) = &od.interval {
        check_duration(f, &format!("{path}.interval"), d);
    }
    if let Some(p) = od.max_ejection_percent {
        check_int_percent(f, &format!("{path}.maxEjectionPercent"), p.into());
    }
    if let Some(p) = od.min_health_percent {
        check_int_percent(f, &format!("{path}.minHealthPercent"), p.into());
    }
}

pub(super) fn connection_pool(f: &mut Findings, path: &str, cp: &ConnectionPoolSettings) {
    if cp.http.is_none() && cp.tcp.is_none() {
        f.error(path, "a connection pool must set tcp, http or both");
        return;
    }
    if let Some(http) = &cp.http {
        let hp = format!("{path}.http");
        for (field, v) in [
            ("http1MaxPendingRequests", http.http1_max_pending_requests),
            ("http2MaxRequests", http.http2_max_requests),
            ("maxRequestsPerConnection", http.max_requests_per_connection),
            ("maxRetries", http.max_retries),
            ("maxConcurrentStreams", http.max_concurrent_streams),
        ] {
            if let Some(v) = v
                && v < 0
            {
                f.error(
                    format!("{hp}.{field}"),
                    format!("must not be negative (got {v})"),
                );
            }
        }
        if let Some(d) = &http.idle_timeout {
            check_duration(f, &format!("{hp}.idleTimeout"), d);
        }
        if http.h2_upgrade_policy == Some(H2UpgradePolicy::Upgrade)
            && http.use_client_protocol == Some(true)
        {
            f.error(
                format!("{hp}.useClientProtocol"),
                "useClientProtocol cannot be true when h2UpgradePolicy is UPGRADE",
            );
        }
    }
    if let Some(tcp) = &cp.tcp {
        let tp = format!("{path}.tcp");
        if let Some(v) = tcp.max_connections
            && v < 0
        {
            f.error(
                format!("{tp}.maxConnections"),
                format!("must not be negative (got {v})"),
            );
        }
        if let Some(d) = &tcp.connect_timeout {
            check_duration(f, &format!("{tp}.connectTimeout"), d);
        }
        if let Some(d) = &tcp.max_connection_duration {
            check_duration(f, &format!("{tp}.maxConnectionDuration"), d);
        }
        // Below a millisecond (`0s` included) the idle timeout is disabled, not wrong.
        if let Some(d) = &tcp.idle_timeout
            && d.as_std().as_millis() != 0
        {
            check_duration(f, &format!("{tp}.idleTimeout"), d);
        }
        if let Some(k) = &tcp.tcp_keepalive {
            if let Some(d) = &k.time {
                check_duration(f, &format!("{tp}.tcpKeepalive.time"), d);
            }
            if let Some(d) = &k.interval {
                check_duration(f, &format!("{tp}.tcpKeepalive.interval"), d);
            }
        }
    }
}

/// Envoy's primality test for Maglev table sizes (1 counts as prime, as there).
fn is_prime(n: u64) -> bool {
    if n != 0 && n < 4 {
        return true;
    }
    if n.is_multiple_of(2) {
        return false;
    }
    let mut d = 3u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

fn load_balancer(
    f: &mut Findings,
    path: &str,
    lb: &LoadBalancerSettings,
    outlier: Option<&OutlierDetection>,
) {
    for g in lb.conflicting_oneofs() {
        f.error(path, format!("only one of {} may be set", g.set.join(", ")));
    }
    if let Some(ch) = &lb.consistent_hash {
        let cp = format!("{path}.consistentHash");
        for g in ch.conflicting_oneofs() {
            f.error(&cp, format!("only one of {} may be set", g.set.join(", ")));
        }
        if let Some(cookie) = &ch.http_cookie {
            if cookie.name.is_empty() {
                f.error(format!("{cp}.httpCookie.name"), "the cookie needs a name");
            }
            let mut attribute_names = BTreeSet::new();
            for (i, a) in cookie.attributes.iter().enumerate() {
                let ap = format!("{cp}.httpCookie.attributes[{i}].name");
                if a.name.is_empty() {
                    f.error(ap, "a cookie attribute needs a name");
                } else if !attribute_names.insert(a.name.as_str()) {
                    f.error(ap, format!("duplicate cookie attribute {:?}", a.name));
                }
            }
        }
        if ch.minimum_ring_size.is_some_and(|n| n != 0) {
            f.warning(
                format!("{cp}.minimumRingSize"),
                "minimumRingSize is deprecated; use ringHash.minimumRingSize",
            );
            if ch.ring_hash.is_some() || ch.maglev.is_some() {
                f.error(
                    format!("{cp}.minimumRingSize"),
                    "minimumRingSize cannot be combined with ringHash or maglev",
                );
            }
        }
        if let Some(m) = &ch.maglev {
            let size = m.table_size.unwrap_or(0);
            let tp = format!("{cp}.maglev.tableSize");
            if size == 0 {
                f.error(&tp, "maglev needs a tableSize");
            }
            if size >= MAGLEV_TABLE_LIMIT {
                f.error(
                    &tp,
                    format!("tableSize must be below {MAGLEV_TABLE_LIMIT} (got {size})"),
                );
            }
            if !is_prime(size) {
                f.error(
                    &tp,
                    format!("tableSize must be a prime number (got {size})"),
                );
            }
        }
    }
    if let Some(l) = &lb.locality_lb_setting {
        locality_lb(f, &format!("{path}.localityLbSetting"), l, outlier);
    }
    if let Some(w) = &lb.warmup_duration_secs {
        check_duration_min(f, &format!("{path}.warmupDurationSecs"), w);
    }
    if let Some(w) = &lb.warmup {
        let wp = format!("{path}.warmup");
        check_duration(f, &format!("{wp}.duration"), &w.duration);
        if let Some(p) = w.minimum_percent
            && !(0.0..=100.0).contains(&p)
        {
            f.error(
                format!("{wp}.minimumPercent"),
                format!("must be between 0 and 100 (got {p})"),
            );
        }
        if let Some(a) = w.aggression
            && a < 1.0
        {
            f.error(
                format!("{wp}.aggression"),
                format!("must be at least 1 (got {a})"),
            );
        }
    }
}

fn locality_lb(
    f: &mut Findings,
    path: &str,
    l: &LocalityLoadBalancerSetting,
    outlier: Option<&OutlierDetection>,
) {
    if !l.distribute.is_empty() && !l.failover.is_empty() {
        f.error(path, "distribute and failover cannot both be set");
        return;
    }
    if !l.failover.is_empty()
        && let Some(label) = l
            .failover_priority
            .iter()
            .find(|p| TOPOLOGY_LABELS.contains(&p.as_str()))
    {
        f.error(
            format!("{path}.failoverPriority"),
            format!("with failover set, failoverPriority cannot name the topology label {label:?}"),
        );
        return;
    }
    let mut sources = Vec::new();
    for (i, d) in l.distribute.iter().enumerate() {
        let dp = format!("{path}.distribute[{i}]");
        sources.push(d.from.clone().unwrap_or_default());
        if let Some((loc, w)) = d.to.iter().find(|(_, w)| **w == 0 || **w > 100) {
            f.error(
                format!("{dp}.to[{loc}]"),
                format!("a locality weight must be between 1 and 100 (got {w})"),
            );
            return;
        }
        let total: u64 = d.to.values().map(|w| u64::from(*w)).sum();
        if total != 100 {
            f.error(
                format!("{dp}.to"),
                format!("the weights must add up to 100 (got {total})"),
            );
            return;
        }
        let targets: Vec<String> = d.to.keys().cloned().collect();
        f.check(format!("{dp}.to"), check_localities(&targets));
    }
    f.check(format!("{path}.distribute"), check_localities(&sources));
    if (!l.failover.is_empty() || !l.failover_priority.is_empty()) && outlier.is_none() {
        f.warning(
            path,
            "failover needs an outlierDetection policy to take effect",
        );
    }
    for (i, fo) in l.failover.iter().enumerate() {
        let fp = format!("{path}.failover[{i}]");
        let from = fo.from.as_deref().unwrap_or("");
        let to = fo.to.as_deref().unwrap_or("");
        if from == to {
            f.error(&fp, "failover from and to must be different regions");
        }
        if from.contains('/') || to.contains('/') {
            f.error(&fp, "failover names regions only (no zone or subzone)");
        }
        if from.contains('*') || to.contains('*') {
            f.error(&fp, "failover regions cannot contain the wildcard '*'");
        }
    }
}

/// Localities (`region/zone/subzone`, a trailing `*` allowed) that do not overlap.
fn check_localities(localities: &[String]) -> Result<(), String> {
    // region → zone → subzones; "*" marks "everything below".
    let mut seen: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for locality in localities {
        let stars = locality.matches('*').count();
        if stars > 1 || (stars == 1 && !locality.ends_with('*')) {
            return Err(format!(
                "locality {locality:?}: at most one '*', and only at the end"
            ));
        }
        let overlap = || Err(format!("locality {locality:?} overlaps an earlier one"));
        if seen.contains_key("*") {
            return overlap();
        }
        let parts: Vec<&str> = locality.splitn(3, '/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "locality {locality:?} has an empty region, zone or subzone"
            ));
        }
        let all = || BTreeSet::from(["*".to_string()]);
        match parts.as_slice() {
            [region] => {
                if seen.contains_key(*region) {
                    return overlap();
                }
                seen.insert(region.to_string(), BTreeMap::from([("*".into(), all())]));
            }
            [region, zone] => {
                let zones = seen.entry(region.to_string()).or_default();
                if zones.contains_key("*") || zones.contains_key(*zone) {
                    return overlap();
                }
                zones.insert(zone.to_string(), all());
            }
            [region, zone, subzone] => {
                let zones = seen.entry(region.to_string()).or_default();
                if zones.contains_key("*") {
                    return overlap();
                }
                let subzones = zones.entry(zone.to_string()).or_default();
                if subzones.contains("*") || !subzones.insert(subzone.to_string()) {
                    return overlap();
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn client_tls(f: &mut Findings, path: &str, namespace: &str, tls: &ClientTlsSettings) {
    let set = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
    let credential = tls.credential_name.as_deref().unwrap_or("");
    if let Some(reference) = credential.strip_prefix("configmap://") {
        match reference.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() => {
                if ns != namespace {
                    f.error(
                        format!("{path}.credentialName"),
                        format!("a configmap:// credential must be in the rule's namespace {namespace:?}"),
                    );
                }
            }
            _ => f.error(
                format!("{path}.credentialName"),
                "a configmap:// credential needs the form configmap://<namespace>/<name>",
            ),
        }
    }
    let mode = tls.mode.unwrap_or(TlsMode::Disable);
    if tls.insecure_skip_verify == Some(true) {
        if mode == TlsMode::Simple
            && (set(&tls.ca_certificates)
                || !credential.is_empty()
                || !tls.subject_alt_names.is_empty())
        {
            f.error(
                path,
                "with insecureSkipVerify, caCertificates, credentialName and subjectAltNames cannot be set",
            );
        }
        if mode == TlsMode::Mutual
            && (set(&tls.ca_certificates) || !tls.subject_alt_names.is_empty())
        {
            f.error(
                path,
                "with insecureSkipVerify, caCertificates and subjectAltNames cannot be set",
            );
        }
    }
    if matches!(mode, TlsMode::Simple | TlsMode::Mutual) && !credential.is_empty() {
        if set(&tls.client_certificate)
            || set(&tls.ca_certificates)
            || set(&tls.private_key)
            || set(&tls.ca_crl)
        {
            f.error(
                path,
                "with credentialName, certificate, key, CA and CRL files cannot be set",
            );
        }
        return;
    }
    if mode == TlsMode::Mutual {
        if !set(&tls.client_certificate) {
            f.error(
                format!("{path}.clientCertificate"),
                "MUTUAL mode needs clientCertificate (or credentialName)",
            );
        }
        if !set(&tls.private_key) {
            f.error(
                format!("{path}.privateKey"),
                "MUTUAL mode needs privateKey (or credentialName)",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> Validated<DestinationRuleSpec> {
        let dr: DestinationRule = crate::api::parse_strict_yaml(yaml).unwrap();
        validate_destination_rule(&dr, "cluster.local")
    }

    const HEAD: &str = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: default}\n";

    #[test]
    fn accepts_and_resolves() {
        let out = check(&format!(
            "{HEAD}spec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer:\n      consistentHash:\n        httpHeaderName: x-user\n        maglev: {{tableSize: 65537}}\n  subsets:\n  - name: v1\n    labels: {{version: v1}}\n"
        ));
        assert!(out.findings.is_empty(), "{:?}", out.findings);
        assert_eq!(out.spec.unwrap().host, "reviews.default.svc.cluster.local");
    }

    #[test]
    fn rejects_duplicate_subsets_and_bad_policies() {
        let out = check(&format!(
            "{HEAD}spec:\n  host: reviews\n  trafficPolicy:\n    loadBalancer:\n      simple: ROUND_ROBIN\n      consistentHash:\n        maglev: {{tableSize: 1000}}\n    outlierDetection:\n      maxEjectionPercent: 150\n  subsets:\n  - name: v1\n  - name: v1\n"
        ));
        assert!(out.spec.is_none());
        let paths: Vec<_> = out.findings.iter().map(|e| e.path.as_str()).collect();
        for p in [
            "spec.trafficPolicy.loadBalancer",
            "spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize",
            "spec.trafficPolicy.outlierDetection.maxEjectionPercent",
            "spec.subsets[1].name",
        ] {
            assert!(paths.contains(&p), "missing {p} in {paths:?}");
        }
    }

    #[test]
    fn primes_and_localities() {
        assert!(is_prime(65537) && is_prime(2) && is_prime(1) && !is_prime(0) && !is_prime(65536));
        let l = |v: &[&str]| check_localities(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(l(&["us-east", "us-west/zone1", "eu/z/s1", "eu/z/s2"]).is_ok());
        assert!(l(&["us-east", "us-east/zone1"]).is_err());
        assert!(l(&["*", "a"]).is_err());
        assert!(l(&["a/*/b"]).is_err());
        assert!(l(&["a//b"]).is_err());
    }
}
