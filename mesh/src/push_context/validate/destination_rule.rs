//! DestinationRule validation and resolution (Istio's rules).

use std::collections::BTreeSet;

use super::common::*;
use super::{Validated, ValidationContext};
use crate::api::{
    ClientTlsSettings, ConnectionPoolSettings, DestinationRule, DestinationRuleSpec,
    LoadBalancerSettings, OutlierDetection, TlsMode, TrafficPolicy,
};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;
use crate::push_context::hosts::{check_host, resolve_short_name};

/// Validates one DestinationRule and returns its spec with the host resolved to an FQDN.
pub fn validate_destination_rule(
    dr: &DestinationRule,
    ctx: &ValidationContext,
) -> Validated<DestinationRuleSpec> {
    let namespace = namespace_of(&dr.metadata);
    let key = ConfigKey::new(
        ConfigKind::DestinationRule,
        &namespace,
        dr.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    let mut spec = dr.spec.clone();
    match check_host(&spec.host, true) {
        Err(r) => f.error("spec.host", r),
        Ok(()) => spec.host = resolve_short_name(&spec.host, &namespace, ctx.cluster_domain),
    }
    if spec.host == "*" {
        f.error(
            "spec.host",
            "wildcard host `*` is not allowed; use `*.<domain>` or a namespace-wide rule",
        );
    }
    check_export_to(&mut f, "spec.exportTo", &spec.export_to);
    if let Some(sel) = &spec.workload_selector {
        check_labels(
            &mut f,
            "spec.workloadSelector.matchLabels",
            &sel.match_labels,
        );
        if sel.match_labels.is_empty() {
            f.error(
                "spec.workloadSelector.matchLabels",
                "a workload selector needs at least one label",
            );
        }
    }
    if let Some(tp) = &spec.traffic_policy {
        traffic_policy(&mut f, "spec.trafficPolicy", tp);
    }
    let mut names = BTreeSet::new();
    for (i, s) in spec.subsets.iter().enumerate() {
        let path = format!("spec.subsets[{i}]");
        if let Err(r) = check_dns1123_label(&s.name) {
            f.error(format!("{path}.name"), r);
        }
        if !names.insert(s.name.clone()) {
            f.error(
                format!("{path}.name"),
                format!("duplicate subset name {:?}", s.name),
            );
        }
        check_labels(&mut f, &format!("{path}.labels"), &s.labels);
        if let Some(tp) = &s.traffic_policy {
            traffic_policy(&mut f, &format!("{path}.trafficPolicy"), tp);
        }
    }
    Validated::new(spec, f.list)
}

fn traffic_policy(f: &mut Findings, path: &str, tp: &TrafficPolicy) {
    if let Some(lb) = &tp.load_balancer {
        load_balancer(f, &format!("{path}.loadBalancer"), lb);
    }
    if let Some(cp) = &tp.connection_pool {
        connection_pool(f, &format!("{path}.connectionPool"), cp);
    }
    if let Some(od) = &tp.outlier_detection {
        outlier_detection(f, &format!("{path}.outlierDetection"), od);
    }
    if let Some(tls) = &tp.tls {
        client_tls(f, &format!("{path}.tls"), tls);
    }
    let mut ports = BTreeSet::new();
    for (i, pl) in tp.port_level_settings.iter().enumerate() {
        let pp = format!("{path}.portLevelSettings[{i}]");
        match &pl.port {
            None => f.error(
                format!("{pp}.port"),
                "port is required in portLevelSettings",
            ),
            Some(p) => {
                check_port(f, &format!("{pp}.port.number"), p.number);
                if !ports.insert(p.number) {
                    f.error(
                        format!("{pp}.port.number"),
                        format!("port {} appears twice in portLevelSettings", p.number),
                    );
                }
            }
        }
        if let Some(lb) = &pl.load_balancer {
            load_balancer(f, &format!("{pp}.loadBalancer"), lb);
        }
        if let Some(cp) = &pl.connection_pool {
            connection_pool(f, &format!("{pp}.connectionPool"), cp);
        }
        if let Some(od) = &pl.outlier_detection {
            outlier_detection(f, &format!("{pp}.outlierDetection"), od);
        }
        if let Some(tls) = &pl.tls {
            client_tls(f, &format!("{pp}.tls"), tls);
        }
    }
    if let Some(t) = &tp.tunnel {
        if t.target_host.is_empty() {
            f.error(
                format!("{path}.tunnel.targetHost"),
                "targetHost is required",
            );
        }
        check_port(f, &format!("{path}.tunnel.targetPort"), t.target_port);
        if let Some(p) = &t.protocol
            && p != "CONNECT"
            && p != "POST"
        {
            f.error(
                format!("{path}.tunnel.protocol"),
                format!("must be CONNECT or POST (got {p:?})"),
            );
        }
    }
}

fn load_balancer(f: &mut Findings, path: &str, lb: &LoadBalancerSettings) {
    if lb.simple.is_some() && lb.consistent_hash.is_some() {
        f.error(path, "only one of simple and consistentHash may be set");
    }
    if let Some(ch) = &lb.consistent_hash {
        let cp = format!("{path}.consistentHash");
        let keys = [
            ch.http_header_name.is_some(),
            ch.http_cookie.is_some(),
            ch.use_source_ip.is_some(),
            ch.http_query_parameter_name.is_some(),
        ];
        match keys.iter().filter(|k| **k).count() {
            0 => f.error(&cp, "a consistent hash needs one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName"),
            1 => {}
            _ => f.error(&cp, "only one of httpHeaderName, httpCookie, useSourceIp and httpQueryParameterName may be set"),
        }
        if let Some(c) = &ch.http_cookie
            && c.name.is_empty()
        {
            f.error(format!("{cp}.httpCookie.name"), "cookie name is required");
        }
        if ch.ring_hash.is_some() && ch.maglev.is_some() {
            f.error(&cp, "only one of ringHash and maglev may be set");
        }
        if ch.minimum_ring_size.is_some() && (ch.ring_hash.is_some() || ch.maglev.is_some()) {
            f.error(
                format!("{cp}.minimumRingSize"),
                "the deprecated minimumRingSize cannot be combined with ringHash or maglev",
            );
        }
        if let Some(m) = &ch.maglev
            && let Some(size) = m.table_size
            && !is_prime(size)
        {
            f.error(
                format!("{cp}.maglev.tableSize"),
                format!("table size must be a prime number (got {size})"),
            );
        }
    }
    if let Some(l) = &lb.locality_lb_setting {
        let lp = format!("{path}.localityLbSetting");
        if !l.distribute.is_empty() && !l.failover.is_empty() {
            f.error(&lp, "only one of distribute and failover may be set");
        }
        for (i, d) in l.distribute.iter().enumerate() {
            let total: u64 = d.to.values().map(|w| u64::from(*w)).sum();
            if total != 100 {
                f.error(
                    format!("{lp}.distribute[{i}].to"),
                    format!("weights must add up to 100 (got {total})"),
                );
            }
        }
        for (i, fo) in l.failover.iter().enumerate() {
            if fo.from.is_some() && fo.from == fo.to {
                f.error(
                    format!("{lp}.failover[{i}]"),
                    "failover from and to must be different regions",
                );
            }
        }
    }
    if let Some(w) = &lb.warmup_duration_secs
        && w.as_std().is_zero()
    {
        f.error(format!("{path}.warmupDurationSecs"), "must be positive");
    }
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2u64;
    while d.saturating_mul(d) <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

fn connection_pool(f: &mut Findings, path: &str, cp: &ConnectionPoolSettings) {
    if let Some(tcp) = &cp.tcp {
        let tp = format!("{path}.tcp");
        if let Some(v) = tcp.max_connections {
            check_non_negative(f, &format!("{tp}.maxConnections"), v.into());
        }
        for (field, d) in [
            ("connectTimeout", &tcp.connect_timeout),
            ("maxConnectionDuration", &tcp.max_connection_duration),
            ("idleTimeout", &tcp.idle_timeout),
        ] {
            if let Some(d) = d {
                check_duration_min_ms(f, &format!("{tp}.{field}"), d);
            }
        }
        if let Some(k) = &tcp.tcp_keepalive {
            for (field, d) in [("time", &k.time), ("interval", &k.interval)] {
                if let Some(d) = d
                    && d.as_std() < std::time::Duration::from_secs(1)
                {
                    f.error(
                        format!("{tp}.tcpKeepalive.{field}"),
                        format!("must be at least 1s (got {d})"),
                    );
                }
            }
        }
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
            if let Some(v) = v {
                check_non_negative(f, &format!("{hp}.{field}"), v.into());
            }
        }
        if let Some(d) = &http.idle_timeout {
            check_duration_min_ms(f, &format!("{hp}.idleTimeout"), d);
        }
    }
}

fn outlier_detection(f: &mut Findings, path: &str, od: &OutlierDetection) {
    if let Some(v) = od.consecutive_errors {
        check_non_negative(f, &format!("{path}.consecutiveErrors"), v.into());
    }
    for (field, d) in [
        ("interval", &od.interval),
        ("baseEjectionTime", &od.base_ejection_time),
    ] {
        if let Some(d) = d {
            check_duration_min_ms(f, &format!("{path}.{field}"), d);
        }
    }
    if let Some(p) = od.max_ejection_percent {
        check_int_percent(f, &format!("{path}.maxEjectionPercent"), p.into());
    }
    if let Some(p) = od.min_health_percent {
        check_int_percent(f, &format!("{path}.minHealthPercent"), p.into());
    }
    if od.consecutive_local_origin_failures.is_some()
        && od.split_external_local_origin_errors != Some(true)
    {
        f.error(
            format!("{path}.consecutiveLocalOriginFailures"),
            "requires splitExternalLocalOriginErrors: true",
        );
    }
}

fn client_tls(f: &mut Findings, path: &str, tls: &ClientTlsSettings) {
    let has_files = tls.client_certificate.is_some()
        || tls.private_key.is_some()
        || tls.ca_certificates.is_some();
    match tls.mode.unwrap_or(TlsMode::Disable) {
        TlsMode::Disable => {}
        TlsMode::Simple => {
            if tls.client_certificate.is_some() || tls.private_key.is_some() {
                f.warning(
                    path,
                    "client certificate and key are ignored in SIMPLE mode",
                );
            }
        }
        TlsMode::Mutual => {
            if tls.credential_name.is_none() {
                if tls.client_certificate.is_none() {
                    f.error(
                        format!("{path}.clientCertificate"),
                        "MUTUAL mode needs clientCertificate (or credentialName)",
                    );
                }
                if tls.private_key.is_none() {
                    f.error(
                        format!("{path}.privateKey"),
                        "MUTUAL mode needs privateKey (or credentialName)",
                    );
                }
            }
        }
        TlsMode::IstioMutual => {
            if has_files || tls.credential_name.is_some() {
                f.error(path, "ISTIO_MUTUAL uses the mesh's certificates; do not set certificate files or credentialName");
            }
            f.warning(
                format!("{path}.mode"),
                "Pilotfish does not issue certificates yet: ISTIO_MUTUAL relies on the sidecar's own SDS provider (secrets `default` and `ROOTCA`)",
            );
        }
    }
    if tls.credential_name.is_some() && has_files {
        f.error(
            path,
            "credentialName cannot be combined with certificate files",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push_context::validate::SubsetIndex;

    fn check(yaml: &str) -> Validated<DestinationRuleSpec> {
        let dr: DestinationRule = crate::api::parse_strict_yaml(yaml).unwrap();
        let subsets = SubsetIndex::default();
        let ctx = ValidationContext {
            cluster_domain: "cluster.local",
            subsets: &subsets,
            known_hosts: None,
        };
        validate_destination_rule(&dr, &ctx)
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
            "spec.trafficPolicy.loadBalancer.consistentHash",
            "spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize",
            "spec.trafficPolicy.outlierDetection.maxEjectionPercent",
            "spec.subsets[1].name",
        ] {
            assert!(paths.contains(&p), "missing {p} in {paths:?}");
        }
    }

    #[test]
    fn istio_mutual_is_accepted_with_a_warning() {
        let out = check(&format!(
            "{HEAD}spec:\n  host: reviews\n  trafficPolicy:\n    tls: {{mode: ISTIO_MUTUAL}}\n"
        ));
        assert!(out.spec.is_some());
        assert_eq!(out.findings.len(), 1);
        assert!(
            out.findings[0]
                .message
                .contains("does not issue certificates")
        );
    }

    #[test]
    fn primes() {
        assert!(is_prime(65537) && is_prime(2) && !is_prime(1) && !is_prime(65536));
    }
}
