//! ServiceEntry → services and endpoints of the mesh model: one service per host, with
//! static endpoints, endpoints selected from Pods by `workloadSelector`, or (DNS without
//! endpoints) the host itself as the endpoint the proxy resolves.

use std::collections::BTreeMap;

use crate::api::{Location, Resolution as SeResolution, ServiceEntrySpec};
use crate::model::kube::PodIndex;
use crate::model::{
    Endpoint, EndpointHealth, ExportTo, Locality, PodInfo, PortEndpoints, Protocol, Resolution,
    Service, ServiceEndpoints, ServiceOrigin, ServicePort, TargetPort, labels_match,
};

/// Converts an accepted (resolved) ServiceEntry. `pods` are candidates for its
/// `workloadSelector` (only those in the entry's namespace are used), with their Nodes.
pub fn services_from_entry<'p>(
    name: &str,
    namespace: &str,
    creation_ms: i64,
    spec: &ServiceEntrySpec,
    pods: &PodIndex<'p>,
) -> (Vec<Service>, Vec<ServiceEndpoints>) {
    let resolution = match spec.resolution.unwrap_or(SeResolution::None) {
        SeResolution::None => Resolution::Passthrough,
        SeResolution::Static => Resolution::ClientSideLb,
        SeResolution::Dns | SeResolution::DynamicDns => Resolution::Dns,
        SeResolution::DnsRoundRobin => Resolution::DnsRoundRobin,
    };
    let ports: Vec<ServicePort> = spec
        .ports
        .iter()
        .map(|p| ServicePort {
            name: p.name.clone(),
            port: p.number,
            protocol: p
                .protocol
                .as_deref()
                .and_then(Protocol::from_istio_name)
                .unwrap_or(Protocol::Unsupported),
            target_port: p.target_port.map(TargetPort::Number),
        })
        .collect();
    let selector: BTreeMap<String, String> = spec
        .workload_selector
        .as_ref()
        .map(|s| s.labels.clone())
        .unwrap_or_default();
    let selected: Vec<&PodInfo> = if spec.workload_selector.is_some() {
        let mut v: Vec<&PodInfo> = pods
            .pods()
            .filter(|p| p.namespace == namespace && labels_match(&selector, &p.labels))
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    } else {
        Vec::new()
    };

    let mut services = Vec::new();
    let mut endpoints = Vec::new();
    for host in &spec.hosts {
        services.push(Service {
            hostname: host.clone(),
            name: name.to_string(),
            namespace: namespace.to_string(),
            addresses: spec.addresses.clone(),
            ports: ports.clone(),
            labels: BTreeMap::new(),
            selector: selector.clone(),
            export_to: ExportTo(spec.export_to.clone()),
            resolution,
            origin: ServiceOrigin::ServiceEntry {
                name: name.to_string(),
            },
            mesh_external: spec.location.unwrap_or(Location::MeshExternal)
                == Location::MeshExternal,
            external_name: None,
            send_unhealthy_endpoints: false,
            creation_ms,
            subject_alt_names: spec.subject_alt_names.clone(),
        });
        let mut per_port = Vec::new();
        for port in &ports {
            let target = match port.target_port {
                Some(TargetPort::Number(n)) => n,
                _ => port.port,
            };
            let mut list: Vec<Endpoint> = Vec::new();
            for we in &spec.endpoints {
                let Some(address) = we.address.clone() else {
                    continue;
                };
                list.push(Endpoint {
                    address,
                    port: we.ports.get(&port.name).copied().unwrap_or(target),
                    labels: endpoint_labels(we),
                    locality: we
                        .locality
                        .as_deref()
                        .map(Locality::parse)
                        .unwrap_or_default(),
                    health: EndpointHealth::Healthy,
                    service_account: we.service_account.clone(),
                    weight: we.weight.filter(|w| *w > 0),
                    network: we.network.clone().unwrap_or_default(),
                    workload: None,
                });
            }
            for pod in &selected {
                for ip in pod.ips.iter().take(1) {
                    list.push(Endpoint {
                        address: ip.clone(),
                        port: target,
                        labels: pod.labels.clone(),
                        locality: pods.locality(pod),
                        health: if pod.ready {
                            EndpointHealth::Healthy
                        } else {
                            EndpointHealth::Unhealthy
                        },
                        service_account: pod.service_account.clone(),
                        weight: None,
                        network: String::new(),
                        workload: Some(format!("{}/{}", pod.namespace, pod.name)),
                    });
                }
            }
            // DNS entries without endpoints: the proxy resolves the host itself.
            if list.is_empty()
                && spec.workload_selector.is_none()
                && matches!(resolution, Resolution::Dns | Resolution::DnsRoundRobin)
            {
                list.push(Endpoint {
                    address: host.clone(),
                    port: target,
                    labels: BTreeMap::new(),
                    locality: Locality::default(),
                    health: EndpointHealth::Healthy,
                    service_account: None,
                    weight: None,
                    network: String::new(),
                    workload: None,
                });
            }
            list.sort();
            per_port.push(PortEndpoints {
                service_port: port.port,
                endpoints: list,
            });
        }
        per_port.sort_by_key(|p| p.service_port);
        endpoints.push(ServiceEndpoints {
            hostname: host.clone(),
            namespace: namespace.to_string(),
            ports: per_port,
        });
    }
    (services, endpoints)
}

/// Istio's label for the network an endpoint is on.
pub const NETWORK_LABEL: &str = "topology.istio.io/network";

/// An inline endpoint's labels, with its `network` as `topology.istio.io/network` unless
/// the labels set it (Istio's `AugmentLabels`): subsets and `failoverPriority` can select
/// by network. Pilotfish serves one network: endpoints of every network are reached
/// directly, as Istio does without `meshNetworks` gateways.
fn endpoint_labels(we: &crate::api::WorkloadEntry) -> BTreeMap<String, String> {
    let mut labels = we.labels.clone();
    if let Some(network) = we.network.as_deref().filter(|n| !n.is_empty()) {
        labels
            .entry(NETWORK_LABEL.to_string())
            .or_insert_with(|| network.to_string());
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ServiceEntry;
    use crate::model::kube::pod_index;

    fn spec(yaml: &str) -> ServiceEntrySpec {
        let se: ServiceEntry = crate::api::parse_strict_yaml(&format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: e, namespace: ns}}\nspec:\n{yaml}"
        ))
        .unwrap();
        se.spec
    }

    #[test]
    fn dns_entry_without_endpoints_resolves_its_host() {
        let s = spec(
            "  hosts: [api.example.com]\n  ports: [{number: 443, name: https, protocol: HTTPS}]\n  resolution: DNS\n",
        );
        let (services, eps) = services_from_entry("e", "ns", 0, &s, &PodIndex::new());
        assert_eq!(services[0].resolution, Resolution::Dns);
        assert!(services[0].mesh_external);
        assert_eq!(services[0].ports[0].protocol, Protocol::Https);
        assert_eq!(eps[0].ports[0].endpoints[0].address, "api.example.com");
        assert_eq!(eps[0].ports[0].endpoints[0].port, 443);
    }

    #[test]
    fn static_endpoints_use_named_ports_labels_and_locality() {
        let s = spec(
            "  hosts: [vm.internal]\n  location: MESH_INTERNAL\n  ports: [{number: 80, name: http, protocol: HTTP, targetPort: 8080}]\n  resolution: STATIC\n  endpoints:\n  - {address: 10.0.0.2, labels: {version: v2}, locality: us/us-1a}\n  - {address: 10.0.0.1, ports: {http: 9090}, weight: 3}\n",
        );
        let (services, eps) = services_from_entry("e", "ns", 0, &s, &PodIndex::new());
        assert!(!services[0].mesh_external);
        let list = &eps[0].ports[0].endpoints;
        assert_eq!(list[0].address, "10.0.0.1");
        assert_eq!(list[0].port, 9090);
        assert_eq!(list[0].weight, Some(3));
        assert_eq!(list[1].port, 8080);
        assert_eq!(list[1].locality.zone, "us-1a");
        assert_eq!(
            list[1].labels.get("version").map(String::as_str),
            Some("v2")
        );
    }

    #[test]
    fn workload_selector_picks_pods_of_its_namespace() {
        let s = spec(
            "  hosts: [svc.mesh]\n  ports: [{number: 80, name: http}]\n  resolution: STATIC\n  workloadSelector: {labels: {app: x}}\n",
        );
        let mk = |ns: &str, name: &str, app: &str, ip: &str| PodInfo {
            namespace: ns.into(),
            name: name.into(),
            labels: [("app".to_string(), app.to_string())].into(),
            ips: vec![ip.into()],
            ready: true,
            ..Default::default()
        };
        let pods = [
            mk("ns", "a", "x", "10.0.0.1"),
            mk("other", "b", "x", "10.0.0.2"),
            mk("ns", "c", "y", "10.0.0.3"),
        ];
        let (_, eps) = services_from_entry("e", "ns", 0, &s, &pod_index(&pods, []));
        let addrs: Vec<_> = eps[0].ports[0]
            .endpoints
            .iter()
            .map(|e| e.address.as_str())
            .collect();
        assert_eq!(addrs, ["10.0.0.1"]);
    }
}
