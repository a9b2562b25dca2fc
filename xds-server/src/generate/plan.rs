//! The outbound plan of a scope: every outbound cluster a proxy gets — one per visible
//! service port and per DestinationRule subset — with the service, port, subset labels,
//! merged traffic policy and how the proxy discovers its endpoints. CDS, EDS, LDS and RDS
//! are all derived from one plan, so a route can only name a cluster that CDS sends and
//! every EDS cluster gets its ClusterLoadAssignment.

use std::collections::HashMap;
use std::sync::Arc;

use pilotfish_mesh::api::{Labels, SimpleLb};
use pilotfish_mesh::model::{Protocol, Proxy, Resolution, Service, ServicePort};
use pilotfish_mesh::push_context::{EffectiveDestinationRule, PushContext};

use super::findings::{Downgrade, Finding};
use super::names;
use super::policy::{ClusterPolicy, cluster_policy};
use super::scope::Flavor;

/// How a cluster's endpoints are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// Endpoints come by EDS (a ClusterLoadAssignment named like the cluster).
    Eds,
    /// The proxy resolves host names by DNS, using every address (`STRICT_DNS`).
    StrictDns,
    /// The proxy resolves one host name and connects to one address at a time (`LOGICAL_DNS`).
    LogicalDns,
    /// Traffic goes to the address the client dialled (`ORIGINAL_DST`).
    OriginalDst,
}

/// One outbound cluster.
#[derive(Clone, Debug)]
pub struct ClusterPlan {
    pub name: String,
    pub service: Arc<Service>,
    pub port: ServicePort,
    /// Subset name; empty for the whole service.
    pub subset: String,
    /// Labels the subset selects endpoints by (empty for the whole service).
    pub subset_labels: Labels,
    pub policy: ClusterPolicy,
    pub discovery: Discovery,
}

/// Every outbound cluster of one scope, sorted by name.
#[derive(Debug, Default)]
pub struct OutboundPlan {
    pub clusters: Vec<ClusterPlan>,
    by_name: HashMap<String, usize>,
}

impl OutboundPlan {
    pub fn get(&self, name: &str) -> Option<&ClusterPlan> {
        self.by_name.get(name).map(|&i| &self.clusters[i])
    }

    pub fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    fn from_clusters(mut clusters: Vec<ClusterPlan>) -> OutboundPlan {
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        // A name can only repeat when two subsets share a name, which the builder rejects;
        // keep the first rather than ever sending one name twice.
        clusters.dedup_by(|b, a| a.name == b.name);
        let by_name = clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        OutboundPlan { clusters, by_name }
    }
}

/// The plan for `proxy` (whose scope the result is shared by); services a proxyless
/// client cannot use are noted in `findings`.
pub fn outbound_plan(
    push: &PushContext,
    proxy: &Proxy,
    flavor: Flavor,
    findings: &mut Vec<Finding>,
) -> OutboundPlan {
    let mut clusters = Vec::new();
    for service in push.services_visible_to(&proxy.namespace) {
        let rule = push.destination_rule(proxy, &service.hostname, Some(&service.namespace));
        for port in &service.ports {
            // UDP is not proxied by sidecars (Istio skips it too).
            if port.protocol == Protocol::Udp {
                continue;
            }
            let base = cluster_policy(rule.as_ref(), port.port, None);
            let Some(kind) = discovery(service, &base, flavor, findings) else {
                continue;
            };
            clusters.push(ClusterPlan {
                name: names::outbound_cluster(port.port, "", &service.hostname),
                service: service.clone(),
                port: port.clone(),
                subset: String::new(),
                subset_labels: Labels::new(),
                policy: base,
                discovery: kind,
            });
            for subset in rule
                .iter()
                .flat_map(|r: &EffectiveDestinationRule| &r.spec.subsets)
            {
                let policy = cluster_policy(rule.as_ref(), port.port, Some(subset));
                let Some(kind) = discovery(service, &policy, flavor, findings) else {
                    continue;
                };
                clusters.push(ClusterPlan {
                    name: names::outbound_cluster(port.port, &subset.name, &service.hostname),
                    service: service.clone(),
                    port: port.clone(),
                    subset: subset.name.clone(),
                    subset_labels: subset.labels.clone(),
                    policy,
                    discovery: kind,
                });
            }
        }
    }
    OutboundPlan::from_clusters(clusters)
}

/// How `service` is discovered; `None` when the flavour cannot use it at all.
fn discovery(
    service: &Service,
    policy: &ClusterPolicy,
    flavor: Flavor,
    findings: &mut Vec<Finding>,
) -> Option<Discovery> {
    let passthrough_lb = policy
        .load_balancer
        .as_ref()
        .and_then(|l| l.simple)
        .is_some_and(|s| s == SimpleLb::Passthrough);
    match flavor {
        Flavor::Sidecar => Some(match service.resolution {
            Resolution::ClientSideLb if passthrough_lb => Discovery::OriginalDst,
            Resolution::ClientSideLb => Discovery::Eds,
            Resolution::Passthrough => Discovery::OriginalDst,
            Resolution::Dns => Discovery::StrictDns,
            Resolution::DnsRoundRobin => Discovery::LogicalDns,
        }),
        // gRPC clients balance over EDS endpoints only; they cannot resolve DNS clusters
        // here nor connect to "the original destination".
        Flavor::Proxyless => match service.resolution {
            Resolution::ClientSideLb | Resolution::Passthrough if !service.is_wildcard() => {
                Some(Discovery::Eds)
            }
            _ => {
                findings.push(Finding::Downgrade(Downgrade::new(
                    "non_eds_cluster",
                    service.hostname.as_str(),
                    "DNS-resolved or wildcard services (no EDS cluster is sent)",
                )));
                None
            }
        },
    }
}
