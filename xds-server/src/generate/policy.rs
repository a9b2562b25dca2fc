//! The traffic policy that applies to one cluster: a DestinationRule's service-level
//! policy, overridden by its `portLevelSettings` for the cluster's port, then by the
//! subset's policy and the subset's own port-level settings (Istio's merge order; each
//! layer replaces whole sections — load balancer, connection pool, outlier detection, TLS).
//! `proxyProtocol` and `retryBudget` exist only at the policy level: as in Istio's
//! `MergeSubsetTrafficPolicy`, a port-level setting for the cluster's port leaves them out
//! of that layer, and a subset's own value wins.

use pilotfish_mesh::api::{
    ClientTlsSettings, ConnectionPoolSettings, LoadBalancerSettings, OutlierDetection,
    PortTrafficPolicy, ProxyProtocol, RetryBudget, Subset, TrafficPolicy,
};
use pilotfish_mesh::push_context::EffectiveDestinationRule;

/// The sections of a traffic policy that shape a cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterPolicy {
    pub load_balancer: Option<LoadBalancerSettings>,
    pub connection_pool: Option<ConnectionPoolSettings>,
    pub outlier_detection: Option<OutlierDetection>,
    pub tls: Option<ClientTlsSettings>,
    pub proxy_protocol: Option<ProxyProtocol>,
    pub retry_budget: Option<RetryBudget>,
}

impl ClusterPolicy {
    /// Applies `policy` on top, then its port-level settings for `port`.
    fn overlay(&mut self, policy: &TrafficPolicy, port: u32) {
        self.replace(
            &policy.load_balancer,
            &policy.connection_pool,
            &policy.outlier_detection,
            &policy.tls,
        );
        if let Some(p) = port_settings(&policy.port_level_settings, port) {
            self.replace(
                &p.load_balancer,
                &p.connection_pool,
                &p.outlier_detection,
                &p.tls,
            );
        }
    }

    fn replace(
        &mut self,
        lb: &Option<LoadBalancerSettings>,
        pool: &Option<ConnectionPoolSettings>,
        outlier: &Option<OutlierDetection>,
        tls: &Option<ClientTlsSettings>,
    ) {
        if lb.is_some() {
            self.load_balancer.clone_from(lb);
        }
        if pool.is_some() {
            self.connection_pool.clone_from(pool);
        }
        if outlier.is_some() {
            self.outlier_detection.clone_from(outlier);
        }
        if tls.is_some() {
            self.tls.clone_from(tls);
        }
    }
}

fn port_settings(settings: &[PortTrafficPolicy], port: u32) -> Option<&PortTrafficPolicy> {
    settings
        .iter()
        .find(|p| p.port.as_ref().is_some_and(|s| s.number == port))
}

/// The policy for the cluster of `port` (and `subset`, when given) under `rule`.
pub fn cluster_policy(
    rule: Option<&EffectiveDestinationRule>,
    port: u32,
    subset: Option<&Subset>,
) -> ClusterPolicy {
    let mut out = ClusterPolicy::default();
    if let Some(policy) = rule.and_then(|r| r.spec.traffic_policy.as_ref()) {
        out.overlay(policy, port);
        if port_settings(&policy.port_level_settings, port).is_none() {
            out.proxy_protocol.clone_from(&policy.proxy_protocol);
            out.retry_budget.clone_from(&policy.retry_budget);
        }
    }
    if let Some(policy) = subset.and_then(|s| s.traffic_policy.as_ref()) {
        out.overlay(policy, port);
        if port_settings(&policy.port_level_settings, port).is_none() {
            if policy.proxy_protocol.is_some() {
                out.proxy_protocol.clone_from(&policy.proxy_protocol);
            }
            if policy.retry_budget.is_some() {
                out.retry_budget.clone_from(&policy.retry_budget);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::api::{DestinationRuleSpec, SimpleLb, TlsMode};
    use serde_json::json;

    fn rule(spec: serde_json::Value) -> EffectiveDestinationRule {
        EffectiveDestinationRule {
            spec: serde_json::from_value::<DestinationRuleSpec>(spec).unwrap(),
            sources: Vec::new(),
        }
    }

    #[test]
    fn port_then_subset_layers_override_whole_sections() {
        let r = rule(json!({
            "host": "a",
            "trafficPolicy": {
                "loadBalancer": {"simple": "RANDOM"},
                "tls": {"mode": "SIMPLE"},
                "portLevelSettings": [
                    {"port": {"number": 8080}, "loadBalancer": {"simple": "ROUND_ROBIN"}}
                ]
            },
            "subsets": [{
                "name": "v1", "labels": {"v": "1"},
                "trafficPolicy": {
                    "tls": {"mode": "DISABLE"},
                    "portLevelSettings": [
                        {"port": {"number": 8080}, "loadBalancer": {"simple": "LEAST_REQUEST"}}
                    ]
                }
            }]
        }));
        let simple = |p: &ClusterPolicy| p.load_balancer.as_ref().and_then(|l| l.simple);
        let mode = |p: &ClusterPolicy| p.tls.as_ref().and_then(|t| t.mode);

        let p = cluster_policy(Some(&r), 9090, None);
        assert_eq!(simple(&p), Some(SimpleLb::Random));
        assert_eq!(mode(&p), Some(TlsMode::Simple));

        let p = cluster_policy(Some(&r), 8080, None);
        assert_eq!(simple(&p), Some(SimpleLb::RoundRobin));

        let subset = &r.spec.subsets[0];
        let p = cluster_policy(Some(&r), 8080, Some(subset));
        assert_eq!(simple(&p), Some(SimpleLb::LeastRequest));
        assert_eq!(mode(&p), Some(TlsMode::Disable));

        let p = cluster_policy(Some(&r), 9090, Some(subset));
        assert_eq!(
            simple(&p),
            Some(SimpleLb::Random),
            "subset sets no LB: inherited"
        );

        assert_eq!(cluster_policy(None, 80, None), ClusterPolicy::default());
    }

    #[test]
    fn policy_level_fields_skip_port_level_layers_and_subsets_win() {
        let r = rule(json!({
            "host": "a",
            "trafficPolicy": {
                "proxyProtocol": {"version": "V1"},
                "retryBudget": {"percent": 10},
                "portLevelSettings": [{"port": {"number": 8080}, "loadBalancer": {"simple": "RANDOM"}}]
            },
            "subsets": [
                {"name": "v2", "labels": {"v": "2"}, "trafficPolicy": {"proxyProtocol": {"version": "V2"}}},
                {"name": "v3", "labels": {"v": "3"}, "trafficPolicy": {"retryBudget": {"percent": 50},
                    "portLevelSettings": [{"port": {"number": 9090}, "loadBalancer": {"simple": "RANDOM"}}]}}
            ]
        }));
        use pilotfish_mesh::api::ProxyProtocolVersion;
        let version = |p: &ClusterPolicy| p.proxy_protocol.as_ref().and_then(|v| v.version);
        let percent = |p: &ClusterPolicy| p.retry_budget.as_ref().and_then(|b| b.percent);
        let p = cluster_policy(Some(&r), 9090, None);
        assert_eq!(version(&p), Some(ProxyProtocolVersion::V1));
        assert_eq!(percent(&p), Some(10.0));
        let p = cluster_policy(Some(&r), 8080, None);
        assert_eq!(
            (version(&p), percent(&p)),
            (None, None),
            "a port-level setting replaces the whole policy (Istio)"
        );
        let p = cluster_policy(Some(&r), 9090, Some(&r.spec.subsets[0]));
        assert_eq!(version(&p), Some(ProxyProtocolVersion::V2));
        assert_eq!(percent(&p), Some(10.0), "inherited");
        let p = cluster_policy(Some(&r), 9090, Some(&r.spec.subsets[1]));
        assert_eq!(
            percent(&p),
            Some(10.0),
            "the subset's port-level layer has none"
        );
        let p = cluster_policy(Some(&r), 80, Some(&r.spec.subsets[1]));
        assert_eq!(percent(&p), Some(50.0));
    }
}
