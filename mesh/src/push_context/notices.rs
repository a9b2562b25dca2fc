//! What Pilotfish accepts but does not do: Istio fields the generators do not translate
//! yet, and Istio behaviour Pilotfish approximates. Each such field that an accepted object
//! sets is reported as a warning naming the field, so `validate`, the object's status
//! condition (`AcceptedWithWarnings`) and the log all say it is ignored.
//!
//! [`Untranslated`] is the one list of untranslated fields (the README's "not supported"
//! list follows it): translating a field means deleting its variant here, and the compiler
//! then points at the walker line that reported it.

use crate::api::{
    DestinationRuleSpec, LoadBalancerSettings, Resolution, ServiceEntrySpec, TlsMode,
    TrafficPolicy, VirtualServiceSpec,
};
use crate::config::{ConfigError, ConfigKey};

/// Fields of Istio's networking v1 API that Pilotfish parses and validates but does not
/// translate into xDS yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Untranslated {
    /// VirtualService `tcp[].match[].destinationSubnets`.
    TcpDestinationSubnets,
    /// VirtualService `tcp[].match[].sourceSubnet`.
    TcpSourceSubnet,
    /// VirtualService `tls[]` (SNI routes).
    TlsRoutes,
    /// DestinationRule `trafficPolicy.proxyProtocol`.
    ProxyProtocol,
    /// DestinationRule `trafficPolicy.retryBudget`.
    RetryBudget,
    /// DestinationRule `trafficPolicy.tunnel`.
    Tunnel,
    /// DestinationRule `loadBalancer.warmup`.
    Warmup,
    /// DestinationRule `loadBalancer.warmupDurationSecs`.
    WarmupDurationSecs,
    /// DestinationRule `loadBalancer.consistentHash.httpCookie.attributes`.
    CookieAttributes,
    /// DestinationRule `tls.caCrl`.
    CaCrl,
    /// DestinationRule `connectionPool.tcp.idleTimeout`.
    TcpIdleTimeout,
    /// ServiceEntry `subjectAltNames`.
    ServiceEntrySubjectAltNames,
    /// ServiceEntry `endpoints[].network`.
    EndpointNetwork,
    /// ServiceEntry `endpoints[].serviceAccount`.
    EndpointServiceAccount,
}

impl Untranslated {
    /// Every untranslated field, for documentation and tests.
    pub const ALL: [Untranslated; 14] = [
        Untranslated::TcpDestinationSubnets,
        Untranslated::TcpSourceSubnet,
        Untranslated::TlsRoutes,
        Untranslated::ProxyProtocol,
        Untranslated::RetryBudget,
        Untranslated::Tunnel,
        Untranslated::Warmup,
        Untranslated::WarmupDurationSecs,
        Untranslated::CookieAttributes,
        Untranslated::CaCrl,
        Untranslated::TcpIdleTimeout,
        Untranslated::ServiceEntrySubjectAltNames,
        Untranslated::EndpointNetwork,
        Untranslated::EndpointServiceAccount,
    ];

    /// What ignoring the field means for traffic.
    pub fn consequence(self) -> &'static str {
        match self {
            Untranslated::TcpDestinationSubnets => {
                "the match does not test the destination address"
            }
            Untranslated::TcpSourceSubnet => "the match does not test the source address",
            Untranslated::TlsRoutes => {
                "TLS traffic to these hosts is not routed by SNI (it goes to the host's own service)"
            }
            Untranslated::ProxyProtocol => "no PROXY protocol header is sent upstream",
            Untranslated::RetryBudget => "retries are limited by maxRetries only",
            Untranslated::Tunnel => "connections are not tunneled",
            Untranslated::Warmup | Untranslated::WarmupDurationSecs => {
                "new endpoints get their full share of traffic at once"
            }
            Untranslated::CookieAttributes => "the generated cookie carries no extra attributes",
            Untranslated::CaCrl => "server certificates are not checked against the CRL",
            Untranslated::TcpIdleTimeout => "Envoy's default TCP idle timeout applies",
            Untranslated::ServiceEntrySubjectAltNames => {
                "server certificates are not checked against these names"
            }
            Untranslated::EndpointNetwork => "all endpoints are treated as one network",
            Untranslated::EndpointServiceAccount => "the endpoint's identity is not verified",
        }
    }
}

/// Collects the notices about one object.
struct Notices<'k> {
    key: &'k ConfigKey,
    list: Vec<ConfigError>,
}

impl Notices<'_> {
    fn untranslated(&mut self, path: String, field: Untranslated) {
        self.list.push(ConfigError::warning(
            self.key,
            path,
            format!(
                "not translated by Pilotfish yet, so it is ignored: {}",
                field.consequence()
            ),
        ));
    }

    fn behaviour(&mut self, path: &str, message: &str) {
        self.list
            .push(ConfigError::warning(self.key, path, message));
    }
}

/// Notices about an accepted VirtualService.
pub fn virtual_service_notices(key: &ConfigKey, spec: &VirtualServiceSpec) -> Vec<ConfigError> {
    let mut n = Notices {
        key,
        list: Vec::new(),
    };
    for (i, route) in spec.tcp.iter().enumerate() {
        for (j, m) in route.r#match.iter().enumerate() {
            let path = format!("spec.tcp[{i}].match[{j}]");
            if !m.destination_subnets.is_empty() {
                n.untranslated(
                    format!("{path}.destinationSubnets"),
                    Untranslated::TcpDestinationSubnets,
                );
            }
            if m.source_subnet.as_deref().is_some_and(|s| !s.is_empty()) {
                n.untranslated(
                    format!("{path}.sourceSubnet"),
                    Untranslated::TcpSourceSubnet,
                );
            }
        }
    }
    if !spec.tls.is_empty() {
        n.untranslated("spec.tls".to_string(), Untranslated::TlsRoutes);
    }
    n.list
}

/// Notices about an accepted DestinationRule.
pub fn destination_rule_notices(key: &ConfigKey, spec: &DestinationRuleSpec) -> Vec<ConfigError> {
    let mut n = Notices {
        key,
        list: Vec::new(),
    };
    if let Some(tp) = &spec.traffic_policy {
        traffic_policy(&mut n, "spec.trafficPolicy", tp);
    }
    for (i, s) in spec.subsets.iter().enumerate() {
        if let Some(tp) = &s.traffic_policy {
            traffic_policy(&mut n, &format!("spec.subsets[{i}].trafficPolicy"), tp);
        }
    }
    n.list
}

fn traffic_policy(n: &mut Notices, path: &str, tp: &TrafficPolicy) {
    if tp.proxy_protocol.is_some() {
        n.untranslated(format!("{path}.proxyProtocol"), Untranslated::ProxyProtocol);
    }
    if tp.retry_budget.is_some() {
        n.untranslated(format!("{path}.retryBudget"), Untranslated::RetryBudget);
    }
    if tp.tunnel.is_some() {
        n.untranslated(format!("{path}.tunnel"), Untranslated::Tunnel);
    }
    let mut port_level = |lb: Option<&LoadBalancerSettings>,
                          tls: Option<&crate::api::ClientTlsSettings>,
                          pool: Option<&crate::api::ConnectionPoolSettings>,
                          at: &str| {
        if let Some(lb) = lb {
            load_balancer(n, &format!("{at}.loadBalancer"), lb);
        }
        if let Some(tls) = tls {
            if tls.ca_crl.as_deref().is_some_and(|c| !c.is_empty()) {
                n.untranslated(format!("{at}.tls.caCrl"), Untranslated::CaCrl);
            }
            if tls.mode == Some(TlsMode::IstioMutual) {
                n.behaviour(
                    &format!("{at}.tls.mode"),
                    "Pilotfish does not issue certificates yet: ISTIO_MUTUAL relies on the sidecar's own SDS provider (secrets `default` and `ROOTCA`)",
                );
            }
        }
        if pool
            .and_then(|p| p.tcp.as_ref())
            .is_some_and(|t| t.idle_timeout.is_some())
        {
            n.untranslated(
                format!("{at}.connectionPool.tcp.idleTimeout"),
                Untranslated::TcpIdleTimeout,
            );
        }
    };
    port_level(
        tp.load_balancer.as_ref(),
        tp.tls.as_ref(),
        tp.connection_pool.as_ref(),
        path,
    );
    for (i, pl) in tp.port_level_settings.iter().enumerate() {
        port_level(
            pl.load_balancer.as_ref(),
            pl.tls.as_ref(),
            pl.connection_pool.as_ref(),
            &format!("{path}.portLevelSettings[{i}]"),
        );
    }
}

fn load_balancer(n: &mut Notices, path: &str, lb: &LoadBalancerSettings) {
    if lb.warmup.is_some() {
        n.untranslated(format!("{path}.warmup"), Untranslated::Warmup);
    }
    if lb.warmup_duration_secs.is_some() {
        n.untranslated(
            format!("{path}.warmupDurationSecs"),
            Untranslated::WarmupDurationSecs,
        );
    }
    if lb
        .consistent_hash
        .as_ref()
        .and_then(|c| c.http_cookie.as_ref())
        .is_some_and(|c| !c.attributes.is_empty())
    {
        n.untranslated(
            format!("{path}.consistentHash.httpCookie.attributes"),
            Untranslated::CookieAttributes,
        );
    }
}

/// Notices about an accepted ServiceEntry.
pub fn service_entry_notices(key: &ConfigKey, spec: &ServiceEntrySpec) -> Vec<ConfigError> {
    let mut n = Notices {
        key,
        list: Vec::new(),
    };
    if !spec.subject_alt_names.is_empty() {
        n.untranslated(
            "spec.subjectAltNames".to_string(),
            Untranslated::ServiceEntrySubjectAltNames,
        );
    }
    for (i, ep) in spec.endpoints.iter().enumerate() {
        if ep.network.as_deref().is_some_and(|s| !s.is_empty()) {
            n.untranslated(
                format!("spec.endpoints[{i}].network"),
                Untranslated::EndpointNetwork,
            );
        }
        if ep.service_account.as_deref().is_some_and(|s| !s.is_empty()) {
            n.untranslated(
                format!("spec.endpoints[{i}].serviceAccount"),
                Untranslated::EndpointServiceAccount,
            );
        }
    }
    if spec.resolution == Some(Resolution::DynamicDns) {
        n.behaviour(
            "spec.resolution",
            "DYNAMIC_DNS is served as DNS by Pilotfish (no dynamic forward proxy)",
        );
    }
    n.list
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigKind;
    use serde_json::json;

    fn paths(list: &[ConfigError]) -> Vec<&str> {
        list.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn every_untranslated_field_is_named_where_it_is_set() {
        let vs: VirtualServiceSpec = serde_json::from_value(json!({
            "hosts": ["a"],
            "tcp": [{"match": [{"destinationSubnets": ["10.0.0.0/8"], "sourceSubnet": "10.1.0.0/16"}], "route": [{"destination": {"host": "a"}}]}],
            "tls": [{"match": [{"sniHosts": ["a"]}], "route": [{"destination": {"host": "a"}}]}]
        }))
        .unwrap();
        let key = ConfigKey::new(ConfigKind::VirtualService, "ns", "n");
        let found = virtual_service_notices(&key, &vs);
        assert_eq!(
            paths(&found),
            [
                "spec.tcp[0].match[0].destinationSubnets",
                "spec.tcp[0].match[0].sourceSubnet",
                "spec.tls"
            ]
        );
        assert!(found.iter().all(|f| !f.is_error()));
        assert!(found[0].message.contains("not translated by Pilotfish yet"));

        let dr: DestinationRuleSpec = serde_json::from_value(json!({
            "host": "a",
            "trafficPolicy": {
                "proxyProtocol": {"version": "V1"},
                "retryBudget": {"percent": 20},
                "loadBalancer": {"warmup": {"duration": "10s"}, "warmupDurationSecs": "5s",
                    "consistentHash": {"httpCookie": {"name": "c", "attributes": [{"name": "SameSite", "value": "Strict"}]}}},
                "connectionPool": {"tcp": {"idleTimeout": "1h"}},
                "portLevelSettings": [{"port": {"number": 80}, "tls": {"mode": "SIMPLE", "caCrl": "/crl.pem"}}]
            },
            "subsets": [{"name": "v1", "trafficPolicy": {"tunnel": {"targetHost": "h.example", "targetPort": 8443}}}]
        }))
        .unwrap();
        let key = ConfigKey::new(ConfigKind::DestinationRule, "ns", "n");
        assert_eq!(
            paths(&destination_rule_notices(&key, &dr)),
            [
                "spec.trafficPolicy.proxyProtocol",
                "spec.trafficPolicy.retryBudget",
                "spec.trafficPolicy.loadBalancer.warmup",
                "spec.trafficPolicy.loadBalancer.warmupDurationSecs",
                "spec.trafficPolicy.loadBalancer.consistentHash.httpCookie.attributes",
                "spec.trafficPolicy.connectionPool.tcp.idleTimeout",
                "spec.trafficPolicy.portLevelSettings[0].tls.caCrl",
                "spec.subsets[0].trafficPolicy.tunnel",
            ]
        );

        let se: ServiceEntrySpec = serde_json::from_value(json!({
            "hosts": ["a.example"],
            "subjectAltNames": ["spiffe://x"],
            "resolution": "STATIC",
            "endpoints": [{"address": "10.0.0.1", "network": "n1", "serviceAccount": "sa"}]
        }))
        .unwrap();
        let key = ConfigKey::new(ConfigKind::ServiceEntry, "ns", "n");
        assert_eq!(
            paths(&service_entry_notices(&key, &se)),
            [
                "spec.subjectAltNames",
                "spec.endpoints[0].network",
                "spec.endpoints[0].serviceAccount"
            ]
        );
    }
}
