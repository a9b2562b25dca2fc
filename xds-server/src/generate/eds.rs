//! EDS: one ClusterLoadAssignment per EDS cluster of the plan, named like the cluster.
//! Endpoints are the service port's endpoints selected by the subset's labels, grouped by
//! locality (each group weighted by the sum of its endpoint weights, which gRPC requires),
//! with health from EndpointSlice conditions, as Istio 1.30 sends them: ready endpoints are
//! `HEALTHY`; terminating ones are left out; unready ones are left out too (a mostly-unready
//! service must not push Envoy into panic routing to unready pods) unless the service sends
//! unhealthy endpoints (a traffic distribution, or the send-unhealthy option), then they
//! are `UNHEALTHY` and the cluster's panic threshold is 0.
//!
//! An endpoint whose workload runs a sidecar carries its `tlsMode` for the clusters'
//! auto-mTLS transport socket matches (`auto_mtls`).
//!
//! Locality-aware load balancing follows Istio: `distribute` re-weights localities for the
//! proxy's locality; with outlier detection configured, endpoints are prioritised by how
//! close their locality is to the proxy's (or by `failoverPriority` labels).

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{
    Address, HealthStatus, Locality as EnvoyLocality, SocketAddress, address,
    socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as EnvoyEndpoint, LbEndpoint, LocalityLbEndpoints,
    lb_endpoint::HostIdentifier,
};
use pilotfish_mesh::api::LocalityLoadBalancerSetting;
use pilotfish_mesh::model::{Endpoint, EndpointHealth, Locality};
use pilotfish_mesh::push_context::PushContext;

use super::auto_mtls::endpoint_metadata;
use super::findings::Finding;
use super::plan::{ClusterPlan, Discovery, OutboundPlan};
use super::scope::{Flavor, Scope};
use super::util::u32_value;

/// ClusterLoadAssignments of every EDS cluster of `plan`; endpoints that cannot be sent
/// are noted in `findings`.
pub fn load_assignments(
    push: &PushContext,
    plan: &OutboundPlan,
    scope: &Scope,
    findings: &mut Vec<Finding>,
) -> Vec<ClusterLoadAssignment> {
    plan.clusters()
        .iter()
        .filter(|c| c.discovery == Discovery::Eds)
        .map(|c| load_assignment(push, c, scope, findings))
        .collect()
}

/// The endpoints of one cluster, as a ClusterLoadAssignment named like the cluster. EDS
/// carries addresses, never names to resolve: an endpoint whose address is not an IP is
/// left out (and noted in `findings`).
pub fn load_assignment(
    push: &PushContext,
    cluster: &ClusterPlan,
    scope: &Scope,
    findings: &mut Vec<Finding>,
) -> ClusterLoadAssignment {
    let endpoints: Vec<&Endpoint> = cluster_endpoints(push, cluster)
        .into_iter()
        .filter(|e| {
            let is_ip = e.address.parse::<std::net::IpAddr>().is_ok();
            if !is_ip {
                findings.push(Finding::NonIpEndpoint {
                    cluster: cluster.name.clone(),
                    address: e.address.clone(),
                });
            }
            is_ip
        })
        .collect();
    let locality = LocalityContext {
        setting: cluster
            .policy
            .load_balancer
            .as_ref()
            .and_then(|l| l.locality_lb_setting.as_ref()),
        outlier_detection: cluster.policy.outlier_detection.is_some(),
        proxy_locality: scope.locality.as_ref(),
        proxy_labels: &scope.failover_labels,
    };
    ClusterLoadAssignment {
        cluster_name: cluster.name.clone(),
        endpoints: locality_groups(&endpoints, &locality),
        ..Default::default()
    }
}

/// The endpoints of a cluster's port and subset that are sent, as Istio 1.30 picks them:
/// terminating ones never, unready ones only when the service sends unhealthy endpoints.
pub fn cluster_endpoints<'a>(push: &'a PushContext, cluster: &'a ClusterPlan) -> Vec<&'a Endpoint> {
    let Some(eps) = push
        .endpoints(&cluster.service)
        .and_then(|e| e.port(cluster.port.port))
    else {
        return Vec::new();
    };
    eps.matching(&cluster.subset_labels)
        .filter(|e| is_sent(e.health, cluster.service.send_unhealthy_endpoints))
        .collect()
}

/// Whether an endpoint of this health is sent (Istio's endpoint builder filter).
fn is_sent(health: EndpointHealth, send_unhealthy: bool) -> bool {
    match health {
        EndpointHealth::Healthy => true,
        EndpointHealth::Unhealthy => send_unhealthy,
        // A rollout's old Pods must count neither as healthy nor as unhealthy.
        EndpointHealth::Terminating => false,
    }
}

/// What locality-aware balancing needs to know.
pub struct LocalityContext<'a> {
    pub setting: Option<&'a LocalityLoadBalancerSetting>,
    pub outlier_detection: bool,
    pub proxy_locality: Option<&'a Locality>,
    /// The proxy's values of the `failoverPriority` labels.
    pub proxy_labels: &'a [(String, Option<String>)],
}

impl LocalityContext<'_> {
    /// No locality-aware balancing (DNS clusters' inline endpoints, tests).
    pub fn none() -> LocalityContext<'static> {
        LocalityContext {
            setting: None,
            outlier_detection: false,
            proxy_locality: None,
            proxy_labels: &[],
        }
    }
}

/// Groups endpoints by (locality, priority) with Istio's locality settings applied.
pub fn locality_groups(
    endpoints: &[&Endpoint],
    ctx: &LocalityContext<'_>,
) -> Vec<LocalityLbEndpoints> {
    let enabled = ctx.setting.is_none_or(|s| s.enabled != Some(false));
    let proxy_locality = ctx.proxy_locality.filter(|_| enabled);
    let failover_priority = ctx
        .setting
        .map(|s| s.failover_priority.as_slice())
        .unwrap_or_default();

    // Priority of each endpoint.
    // Istio fails over only where outlier detection can notice the failure.
    let priority = |e: &Endpoint| -> u32 {
        if !enabled || !ctx.outlier_detection {
            return 0;
        }
        if !failover_priority.is_empty() {
            return label_priority(failover_priority, ctx.proxy_labels, e);
        }
        proxy_locality.map_or(0, |proxy| {
            locality_priority(proxy, &e.locality, ctx.setting)
        })
    };

    let mut groups: BTreeMap<(u32, Locality), Vec<&Endpoint>> = BTreeMap::new();
    for e in endpoints {
        groups
            .entry((priority(e), e.locality.clone()))
            .or_default()
            .push(e);
    }
    // Envoy wants priorities numbered 0, 1, 2… without gaps.
    let mut used: Vec<u32> = groups.keys().map(|(p, _)| *p).collect();
    used.dedup();
    let renumber = |p: u32| used.iter().position(|u| *u == p).unwrap_or(0) as u32;

    let mut out: Vec<LocalityLbEndpoints> = groups
        .into_iter()
        .map(|((p, locality), eps)| {
            let weight: u32 = eps.iter().map(|e| e.weight.unwrap_or(1)).sum();
            LocalityLbEndpoints {
                // Always present, even when empty: gRPC's xDS client rejects a
                // LocalityLbEndpoints without `locality` ("field not present").
                locality: Some(EnvoyLocality {
                    region: locality.region.clone(),
                    zone: locality.zone.clone(),
                    sub_zone: locality.subzone.clone(),
                }),
                lb_endpoints: eps.iter().map(|e| lb_endpoint(e)).collect(),
                load_balancing_weight: u32_value(weight.max(1)),
                priority: renumber(p),
                ..Default::default()
            }
        })
        .collect();

    if let (Some(proxy), Some(setting)) = (proxy_locality, ctx.setting) {
        apply_distribute(proxy, setting, &mut out);
    }
    out
}

fn lb_endpoint(e: &Endpoint) -> LbEndpoint {
    LbEndpoint {
        health_status: match e.health {
            EndpointHealth::Healthy => HealthStatus::Healthy,
            EndpointHealth::Unhealthy => HealthStatus::Unhealthy,
            // Never sent (see `is_sent`).
            EndpointHealth::Terminating => HealthStatus::Draining,
        } as i32,
        load_balancing_weight: e.weight.and_then(u32_value),
        host_identifier: Some(HostIdentifier::Endpoint(EnvoyEndpoint {
            address: Some(socket_address(&e.address, e.port)),
            ..Default::default()
        })),
        metadata: endpoint_metadata(e),
    }
}

/// A TCP socket address.
pub fn socket_address(address: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: address.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// Istio's locality failover order: same region/zone/subzone, same zone, same region, the
/// configured failover region, anything else.
fn locality_priority(
    proxy: &Locality,
    endpoint: &Locality,
    setting: Option<&LocalityLoadBalancerSetting>,
) -> u32 {
    if endpoint.region == proxy.region {
        if endpoint.zone == proxy.zone {
            if endpoint.subzone == proxy.subzone {
                return 0;
            }
            return 1;
        }
        return 2;
    }
    let failover_target = setting.and_then(|s| {
        s.failover
            .iter()
            .find(|f| f.from.as_deref() == Some(proxy.region.as_str()))
            .and_then(|f| f.to.as_deref())
    });
    if failover_target == Some(endpoint.region.as_str()) {
        3
    } else {
        4
    }
}

/// `failoverPriority`: endpoints sharing all listed label values with the proxy first,
/// then those sharing all but the last, and so on.
fn label_priority(keys: &[String], proxy_labels: &[(String, Option<String>)], e: &Endpoint) -> u32 {
    let matching = keys
        .iter()
        .take_while(|k| {
            let proxy = proxy_labels
                .iter()
                .find(|(pk, _)| pk == *k)
                .and_then(|(_, v)| v.as_ref());
            proxy.is_some() && proxy == e.labels.get(*k)
        })
        .count();
    (keys.len() - matching) as u32
}

/// Whether a locality matches a `region/zone/subzone` pattern where `*` (or a missing
/// part) matches anything.
pub fn locality_matches(pattern: &str, l: &Locality) -> bool {
    let parts: Vec<&str> = pattern.split('/').collect();
    let values = [&l.region, &l.zone, &l.subzone];
    parts
        .iter()
        .zip(values)
        .all(|(p, v)| *p == "*" || *p == v.as_str())
}

/// `distribute`: the first rule whose `from` matches the proxy re-weights localities; a
/// locality none of its `to` patterns match gets no traffic (its group is removed).
fn apply_distribute(
    proxy: &Locality,
    setting: &LocalityLoadBalancerSetting,
    groups: &mut Vec<LocalityLbEndpoints>,
) {
    let Some(rule) = setting.distribute.iter().find(|d| {
        d.from
            .as_deref()
            .is_some_and(|f| locality_matches(f, proxy))
    }) else {
        return;
    };
    let locality_of = |g: &LocalityLbEndpoints| {
        g.locality
            .as_ref()
            .map(|l| Locality {
                region: l.region.clone(),
                zone: l.zone.clone(),
                subzone: l.sub_zone.clone(),
            })
            .unwrap_or_default()
    };
    let mut new_weights: Vec<Option<u32>> = vec![None; groups.len()];
    for (pattern, share) in &rule.to {
        let matched: Vec<usize> = (0..groups.len())
            .filter(|&i| {
                new_weights[i].is_none() && locality_matches(pattern, &locality_of(&groups[i]))
            })
            .collect();
        let total: u64 = matched
            .iter()
            .map(|&i| {
                groups[i]
                    .load_balancing_weight
                    .as_ref()
                    .map_or(1, |w| w.value) as u64
            })
            .sum();
        for i in matched {
            let own = groups[i]
                .load_balancing_weight
                .as_ref()
                .map_or(1, |w| w.value) as u64;
            // Split the share by the localities' own weights, rounding up as Istio does.
            let weight = (own * u64::from(*share)).div_ceil(total.max(1));
            new_weights[i] = Some(u32::try_from(weight).unwrap_or(u32::MAX));
        }
    }
    let mut i = 0;
    groups.retain(|_| {
        let keep = new_weights[i].is_some_and(|w| w > 0);
        i += 1;
        keep
    });
    let mut kept = new_weights.into_iter().flatten().filter(|w| *w > 0);
    for g in groups.iter_mut() {
        g.load_balancing_weight = kept.next().and_then(u32_value);
    }
}

/// The flavour-independent load assignment of a DNS cluster (inline in CDS): one group,
/// no locality policy (Envoy resolves the names itself).
pub fn dns_load_assignment(
    cluster: &ClusterPlan,
    endpoints: &[&Endpoint],
    flavor: Flavor,
) -> ClusterLoadAssignment {
    let _ = flavor;
    ClusterLoadAssignment {
        cluster_name: cluster.name.clone(),
        endpoints: locality_groups(endpoints, &LocalityContext::none()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::api::{Distribute, Failover};

    fn ep(addr: &str, locality: &str) -> Endpoint {
        Endpoint {
            address: addr.into(),
            port: 80,
            labels: Default::default(),
            locality: Locality::parse(locality),
            health: EndpointHealth::Healthy,
            service_account: None,
            weight: None,
            network: String::new(),
            workload: None,
        }
    }

    fn summary(groups: &[LocalityLbEndpoints]) -> Vec<(String, u32, u32, usize)> {
        groups
            .iter()
            .map(|g| {
                let l = g.locality.clone().unwrap_or_default();
                (
                    format!("{}/{}/{}", l.region, l.zone, l.sub_zone),
                    g.priority,
                    g.load_balancing_weight.as_ref().map_or(0, |w| w.value),
                    g.lb_endpoints.len(),
                )
            })
            .collect()
    }

    #[test]
    fn groups_by_locality_with_weights_summed() {
        let mut a = ep("10.0.0.1", "r1/z1/");
        a.weight = Some(3);
        let b = ep("10.0.0.2", "r1/z1/");
        let c = ep("10.0.0.3", "r2/z1/");
        let groups = locality_groups(&[&a, &b, &c], &LocalityContext::none());
        assert_eq!(
            summary(&groups),
            [("r1/z1/".into(), 0, 4, 2), ("r2/z1/".into(), 0, 1, 1)]
        );
        assert_eq!(
            groups[0].lb_endpoints[0]
                .load_balancing_weight
                .as_ref()
                .unwrap()
                .value,
            3
        );
    }

    #[test]
    fn failover_prioritises_by_closeness_only_with_outlier_detection() {
        let eps = [
            ep("10.0.0.1", "r1/z1/s1"),
            ep("10.0.0.2", "r1/z2/s1"),
            ep("10.0.0.3", "r2/z1/s1"),
            ep("10.0.0.4", "r3/z1/s1"),
        ];
        let refs: Vec<&Endpoint> = eps.iter().collect();
        let proxy = Locality::parse("r1/z1/s1");
        let setting = LocalityLoadBalancerSetting {
            failover: vec![Failover {
                from: Some("r1".into()),
                to: Some("r3".into()),
            }],
            ..Default::default()
        };
        let mut ctx = LocalityContext {
            setting: Some(&setting),
            outlier_detection: true,
            proxy_locality: Some(&proxy),
            proxy_labels: &[],
        };
        let prio: Vec<(String, u32)> = summary(&locality_groups(&refs, &ctx))
            .into_iter()
            .map(|(l, p, _, _)| (l, p))
            .collect();
        // Gaps closed: same locality 0, same region 1, failover region 2, others 3.
        assert_eq!(
            prio,
            [
                ("r1/z1/s1".into(), 0),
                ("r1/z2/s1".into(), 1),
                ("r3/z1/s1".into(), 2),
                ("r2/z1/s1".into(), 3),
            ]
        );
        ctx.outlier_detection = false;
        assert!(locality_groups(&refs, &ctx).iter().all(|g| g.priority == 0));
    }

    #[test]
    fn distribute_reweights_and_drops_unlisted_localities() {
        let eps = [
            ep("10.0.0.1", "r1/z1/"),
            ep("10.0.0.2", "r1/z2/"),
            ep("10.0.0.3", "r1/z2/"),
            ep("10.0.0.4", "r2/z1/"),
        ];
        let refs: Vec<&Endpoint> = eps.iter().collect();
        let proxy = Locality::parse("r1/z1/");
        let setting = LocalityLoadBalancerSetting {
            distribute: vec![Distribute {
                from: Some("r1/z1/*".into()),
                to: [("r1/z1/*".to_string(), 80), ("r1/z2/*".to_string(), 20)].into(),
            }],
            ..Default::default()
        };
        let ctx = LocalityContext {
            setting: Some(&setting),
            outlier_detection: false,
            proxy_locality: Some(&proxy),
            proxy_labels: &[],
        };
        assert_eq!(
            summary(&locality_groups(&refs, &ctx)),
            [("r1/z1/".into(), 0, 80, 1), ("r1/z2/".into(), 0, 20, 2)]
        );
    }

    #[test]
    fn failover_priority_labels_order_endpoints() {
        let mut same = ep("10.0.0.1", "");
        same.labels = [
            ("net".to_string(), "a".to_string()),
            ("rack".to_string(), "1".to_string()),
        ]
        .into();
        let mut half = ep("10.0.0.2", "");
        half.labels = [
            ("net".to_string(), "a".to_string()),
            ("rack".to_string(), "2".to_string()),
        ]
        .into();
        let other = ep("10.0.0.3", "");
        let setting = LocalityLoadBalancerSetting {
            failover_priority: vec!["net".into(), "rack".into()],
            ..Default::default()
        };
        let proxy = Locality::default();
        let labels = [
            ("net".to_string(), Some("a".to_string())),
            ("rack".to_string(), Some("1".to_string())),
        ];
        let ctx = LocalityContext {
            setting: Some(&setting),
            outlier_detection: true,
            proxy_locality: Some(&proxy),
            proxy_labels: &labels,
        };
        let groups = locality_groups(&[&same, &half, &other], &ctx);
        let prio: Vec<u32> = groups.iter().map(|g| g.priority).collect();
        assert_eq!(prio, [0, 1, 2]);
    }

    #[test]
    fn locality_patterns() {
        let l = Locality::parse("us/us-1a/rack");
        assert!(locality_matches("us/*", &l));
        assert!(locality_matches("us/us-1a/*", &l));
        assert!(locality_matches("*", &l));
        assert!(!locality_matches("eu/*", &l));
    }
}
