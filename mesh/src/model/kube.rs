//! Conversions from Kubernetes objects (`k8s-openapi` Service, EndpointSlice, Pod) into the
//! mesh model. Pure functions: the controller and the folder source call them alike.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::endpoint::{Endpoint, EndpointHealth, Locality, PortEndpoints};
use super::service::{
    ExportTo, Protocol, Resolution, Service, ServiceOrigin, ServicePort, TargetPort,
};
use crate::config::{ConfigError, ConfigKey, ConfigKind};

/// Annotation Istio reads for a Kubernetes Service's visibility.
pub const EXPORT_TO_ANNOTATION: &str = "networking.istio.io/exportTo";
/// Label EndpointSlices carry to name their Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Pod label overriding locality, `region.zone.subzone` or `region/zone/subzone`; Istio
/// reads it first, then the legacy [`LEGACY_LOCALITY_LABEL`].
pub const LOCALITY_LABEL: &str = "topology.istio.io/locality";
pub const LEGACY_LOCALITY_LABEL: &str = "istio-locality";
/// Node labels of a workload's locality (Kubernetes' GA names, then the beta ones).
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const BETA_REGION_LABEL: &str = "failure-domain.beta.kubernetes.io/region";
pub const BETA_ZONE_LABEL: &str = "failure-domain.beta.kubernetes.io/zone";
pub const SUBZONE_LABEL: &str = "topology.istio.io/subzone";
/// Istio's annotation standing in for `spec.trafficDistribution` (older Kubernetes).
pub const TRAFFIC_DISTRIBUTION_ANNOTATION: &str = "networking.istio.io/traffic-distribution";

/// What the mesh needs of a Pod: labels (subset selection), IPs, service account and
/// locality. The controller keeps only this, not whole Pods, to stay small.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ips: Vec<String>,
    pub service_account: Option<String>,
    /// Locality from the Pod's own locality label (`topology.istio.io/locality` or
    /// `istio-locality`); empty without one, and then its Node's applies.
    pub locality: Locality,
    /// The Node the Pod runs on (`spec.nodeName`), whose labels give its locality.
    pub node_name: String,
    /// False while the pod is not Ready (used for ServiceEntry workloadSelector endpoints).
    pub ready: bool,
}

impl PodInfo {
    pub fn from_k8s(pod: &Pod) -> PodInfo {
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let mut ips: Vec<String> = status
            .and_then(|s| s.pod_ips.as_ref())
            .map(|v| v.iter().map(|ip| ip.ip.clone()).collect())
            .unwrap_or_default();
        if ips.is_empty()
            && let Some(ip) = status.and_then(|s| s.pod_ip.clone())
        {
            ips.push(ip);
        }
        let ready = status
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        let spec = pod.spec.as_ref();
        let service_account = spec
            .and_then(|s| {
                s.service_account_name
                    .clone()
                    .or_else(|| s.service_account.clone())
            })
            .or_else(|| Some("default".to_string()));
        PodInfo {
            namespace: namespace_of(&pod.metadata),
            name: pod.metadata.name.clone().unwrap_or_default(),
            locality: pod_locality_label(&labels),
            node_name: spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
            labels,
            ips,
            service_account,
            ready,
        }
    }
}

/// The locality a Pod's own labels set, as Istio reads them (`topology.istio.io/locality`,
/// else `istio-locality`); empty without either.
fn pod_locality_label(labels: &BTreeMap<String, String>) -> Locality {
    labels
        .get(LOCALITY_LABEL)
        .or_else(|| labels.get(LEGACY_LOCALITY_LABEL))
        .map(|l| Locality::parse(l))
        .unwrap_or_default()
}

/// What the mesh needs of a Node: its name and the locality its labels give (region and
/// zone from Kubernetes' topology labels, GA names first, subzone from Istio's). The
/// controller keeps only this.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NodeInfo {
    pub name: String,
    pub locality: Locality,
}

impl NodeInfo {
    pub fn from_k8s(node: &Node) -> NodeInfo {
        let labels = node.metadata.labels.as_ref();
        let label = |names: &[&str]| {
            names
                .iter()
                .filter_map(|n| labels.and_then(|l| l.get(*n)))
                .find(|v| !v.is_empty())
                .cloned()
                .unwrap_or_default()
        };
        NodeInfo {
            name: node.metadata.name.clone().unwrap_or_default(),
            locality: Locality {
                region: label(&[REGION_LABEL, BETA_REGION_LABEL]),
                zone: label(&[ZONE_LABEL, BETA_ZONE_LABEL]),
                subzone: label(&[SUBZONE_LABEL]),
            },
        }
    }
}

/// Namespace of an object, `default` when unset (as `kubectl apply` would place it).
pub fn namespace_of(meta: &ObjectMeta) -> String {
    meta.namespace
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_string())
}

/// Creation time in ms since the epoch; 0 when unset.
pub fn creation_ms(meta: &ObjectMeta) -> i64 {
    meta.creation_timestamp
        .as_ref()
        .map(|t| t.0.as_millisecond())
        .unwrap_or(0)
}

/// Converts a Kubernetes Service. `domain` is the cluster domain (`cluster.local`).
pub fn service_from_k8s(svc: &KubeService, domain: &str) -> Result<Service, Vec<ConfigError>> {
    let name = svc.metadata.name.clone().unwrap_or_default();
    let namespace = namespace_of(&svc.metadata);
    let key = ConfigKey::new(ConfigKind::Service, &namespace, &name);
    if name.is_empty() {
        return Err(vec![ConfigError::error(
            &key,
            "metadata.name",
            "a Service needs a name",
        )]);
    }
    let spec = svc.spec.clone().unwrap_or_default();
    let mut errors = Vec::new();
    let mut ports = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let Some(port) = u32::try_from(p.port)
            .ok()
            .filter(|n| (1..=65535).contains(n))
        else {
            errors.push(ConfigError::error(
                &key,
                format!("spec.ports[{i}].port"),
                format!("port must be between 1 and 65535 (got {})", p.port),
            ));
            continue;
        };
        let target_port = match &p.target_port {
            Some(IntOrString::Int(n)) => u32::try_from(*n)
                .ok()
                .filter(|n| *n > 0)
                .map(TargetPort::Number),
            Some(IntOrString::String(s)) if !s.is_empty() => Some(TargetPort::Name(s.clone())),
            _ => None,
        };
        ports.push(ServicePort {
            name: p.name.clone().unwrap_or_default(),
            port,
            protocol: Protocol::detect(
                p.name.as_deref(),
                p.app_protocol.as_deref(),
                p.protocol.as_deref(),
            ),
            target_port,
        });
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let is_external_name = spec.type_.as_deref() == Some("ExternalName");
    let cluster_ips: Vec<String> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips.clone(),
        (_, Some(ip)) if !ip.is_empty() => vec![ip.clone()],
        _ => Vec::new(),
    };
    let headless = cluster_ips.iter().any(|ip| ip == "None");
    let (resolution, addresses) = if is_external_name {
        (Resolution::Dns, Vec::new())
    } else if headless {
        (Resolution::Passthrough, Vec::new())
    } else {
        (Resolution::ClientSideLb, cluster_ips)
    };
    let export_to = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EXPORT_TO_ANNOTATION))
        // As Istio's kube registry reads it: split on commas, each entry trimmed, not
        // validated (an entry naming no namespace shows the Service to no one more).
        .filter(|v| !v.is_empty())
        .map(|v| ExportTo(v.split(',').map(|s| s.trim().to_string()).collect()))
        .unwrap_or_default();
    Ok(Service {
        hostname: format!("{name}.{namespace}.svc.{domain}"),
        name,
        namespace,
        addresses,
        ports,
        labels: svc.metadata.labels.clone().unwrap_or_default(),
        selector: spec.selector.clone().unwrap_or_default(),
        export_to,
        resolution,
        origin: ServiceOrigin::Kubernetes,
        mesh_external: is_external_name,
        external_name: if is_external_name {
            spec.external_name.clone()
        } else {
            None
        },
        creation_ms: creation_ms(&svc.metadata),
        subject_alt_names: Vec::new(),
        send_unhealthy_endpoints: has_traffic_distribution(
            spec.traffic_distribution.as_deref(),
            svc.metadata.annotations.as_ref(),
        ),
    })
}

/// Whether a Service asks for a traffic distribution Istio 1.30 acts on: the spec field
/// (`PreferClose`, `PreferSameZone`, `PreferSameNode`), else Istio's annotation with the
/// same values in any case. Istio's namespace-level annotation is not read.
fn has_traffic_distribution(
    spec: Option<&str>,
    annotations: Option<&BTreeMap<String, String>>,
) -> bool {
    const KNOWN: [&str; 3] = ["PreferClose", "PreferSameZone", "PreferSameNode"];
    if spec.is_some_and(|v| KNOWN.contains(&v)) {
        return true;
    }
    annotations
        .and_then(|a| a.get(TRAFFIC_DISTRIBUTION_ANNOTATION))
        .is_some_and(|v| KNOWN.iter().any(|k| k.eq_ignore_ascii_case(v)))
}

/// `namespace/name` of a workload (built without `format!`: this runs once per endpoint).
pub fn workload_name(namespace: &str, name: &str) -> String {
    let mut s = String::with_capacity(namespace.len() + 1 + name.len());
    s.push_str(namespace);
    s.push('/');
    s.push_str(name);
    s
}

/// Pods by `(namespace, name)`, for EndpointSlice `targetRef` lookups, with the Nodes
/// that give them their locality. Borrows pods and nodes: building it costs one hash
/// insert per object, no copies.
#[derive(Default)]
pub struct PodIndex<'a> {
    pods: HashMap<(&'a str, &'a str), &'a PodInfo>,
    nodes: HashMap<&'a str, &'a Locality>,
}

impl<'a> PodIndex<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<&'a PodInfo> {
        self.pods.get(&(namespace, name)).copied()
    }

    /// Every indexed pod, in no particular order.
    pub fn pods(&self) -> impl Iterator<Item = &'a PodInfo> + '_ {
        self.pods.values().copied()
    }

    /// A pod's locality as Istio 1.30 gives it: its own locality label, else its Node's
    /// topology labels; empty when neither is known.
    pub fn locality(&self, pod: &PodInfo) -> Locality {
        if !pod.locality.is_empty() {
            return pod.locality.clone();
        }
        self.nodes
            .get(pod.node_name.as_str())
            .map(|l| (*l).clone())
            .unwrap_or_default()
    }
}

/// Indexes `pods` by `(namespace, name)` and `nodes` by name.
pub fn pod_index<'a>(
    pods: impl IntoIterator<Item = &'a PodInfo>,
    nodes: impl IntoIterator<Item = &'a NodeInfo>,
) -> PodIndex<'a> {
    PodIndex {
        pods: pods
            .into_iter()
            .map(|p| ((p.namespace.as_str(), p.name.as_str()), p))
            .collect(),
        nodes: nodes
            .into_iter()
            .map(|n| (n.name.as_str(), &n.locality))
            .collect(),
    }
}

/// The Service an EndpointSlice belongs to, as `(namespace, name)`.
pub fn slice_service(slice: &EndpointSlice) -> Option<(String, String)> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some((namespace_of(&slice.metadata), name.clone()))
}

/// Endpoints of `service` from its EndpointSlices, one [`PortEndpoints`] per service port,
/// sorted and de-duplicated (two slices may list the same address during a rollover).
/// Labels and service account come from the Pod a slice endpoint's `targetRef` names,
/// locality from that Pod's locality label or its Node ([`PodIndex::locality`]).
pub fn endpoints_from_slices<'a>(
    service: &Service,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    pods: &PodIndex<'_>,
) -> Vec<PortEndpoints> {
    let mut by_port: BTreeMap<u32, Vec<Endpoint>> =
        service.ports.iter().map(|p| (p.port, Vec::new())).collect();
    for slice in slices {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        for slice_port in slice.ports.iter().flatten() {
            let slice_port_name = slice_port.name.clone().unwrap_or_default();
            let Some(target) = slice_port
                .port
                .and_then(|p| u32::try_from(p).ok())
                .filter(|p| *p > 0)
            else {
                continue;
            };
            // EndpointSlice ports carry the Service port's name; a single unnamed port
            // matches the single unnamed service port.
            let Some(service_port) = service.ports.iter().find(|p| p.name == slice_port_name)
            else {
                continue;
            };
            let list = by_port.entry(service_port.port).or_default();
            for ep in &slice.endpoints {
                let Some(address) = ep.addresses.first() else {
                    continue;
                };
                let conditions = ep.conditions.clone().unwrap_or_default();
                let pod = ep
                    .target_ref
                    .as_ref()
                    .filter(|r| r.kind.as_deref() == Some("Pod"))
                    .and_then(|r| {
                        let ns = r
                            .namespace
                            .as_deref()
                            .or(slice.metadata.namespace.as_deref())
                            .unwrap_or("default");
                        pods.get(ns, r.name.as_deref().unwrap_or_default())
                    });
                let mut locality = pod.map(|p| pods.locality(p)).unwrap_or_default();
                // Without the Pod's Node (a config folder without Node objects), the zone
                // Kubernetes copied from that Node's label into the slice stands in.
                if locality.is_empty()
                    && let Some(zone) = &ep.zone
                {
                    locality.zone = zone.clone();
                }
                list.push(Endpoint {
                    address: address.clone(),
                    port: target,
                    labels: pod.map(|p| p.labels.clone()).unwrap_or_default(),
                    locality,
                    health: EndpointHealth::from_conditions(
                        conditions.ready,
                        conditions.terminating,
                    ),
                    service_account: pod.and_then(|p| p.service_account.clone()),
                    weight: None,
                    network: String::new(),
                    workload: pod.map(|p| workload_name(&p.namespace, &p.name)),
                });
            }
        }
    }
    by_port
        .into_iter()
        .map(|(service_port, mut endpoints)| {
            endpoints.sort();
            endpoints.dedup_by(|a, b| a.address == b.address && a.port == b.port);
            PortEndpoints {
                service_port,
                endpoints,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ObjectReference, PodIP, PodSpec, PodStatus, ServicePort as KubePort, ServiceSpec,
    };
    use k8s_openapi::api::discovery::v1::{
        Endpoint as SliceEndpoint, EndpointConditions, EndpointPort,
    };

    fn mk_service(name: &str, ns: &str, spec: ServiceSpec) -> KubeService {
        KubeService {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            spec: Some(spec),
            status: None,
        }
    }

    fn mk_port(name: Option<&str>, port: i32, app_protocol: Option<&str>) -> KubePort {
        KubePort {
            name: name.map(str::to_string),
            port,
            app_protocol: app_protocol.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn cluster_ip_service_with_named_ports() {
        let svc = mk_service(
            "reviews",
            "bookinfo",
            ServiceSpec {
                cluster_ip: Some("10.0.0.7".into()),
                ports: Some(vec![
                    mk_port(Some("http"), 9080, None),
                    mk_port(Some("grpc-api"), 9090, None),
                    mk_port(Some("web"), 8080, Some("http2")),
                    mk_port(None, 5432, None),
                ]),
                selector: Some([("app".to_string(), "reviews".to_string())].into()),
                ..Default::default()
            },
        );
        let s = service_from_k8s(&svc, "cluster.local").unwrap();
        assert_eq!(s.hostname, "reviews.bookinfo.svc.cluster.local");
        assert_eq!(s.resolution, Resolution::ClientSideLb);
        assert_eq!(s.addresses, vec!["10.0.0.7".to_string()]);
        let protocols: Vec<_> = s.ports.iter().map(|p| p.protocol).collect();
        assert_eq!(
            protocols,
            vec![
                Protocol::Http,
                Protocol::Grpc,
                Protocol::Http2,
                Protocol::Unsupported
            ]
        );
        assert_eq!(s.selector.get("app").map(String::as_str), Some("reviews"));
    }

    #[test]
    fn headless_service_is_passthrough() {
        let svc = mk_service(
            "db",
            "default",
            ServiceSpec {
                cluster_ip: Some("None".into()),
                ports: Some(vec![mk_port(Some("tcp"), 5432, None)]),
                ..Default::default()
            },
        );
        let s = service_from_k8s(&svc, "example.org").unwrap();
        assert_eq!(s.resolution, Resolution::Passthrough);
        assert!(s.addresses.is_empty());
        assert_eq!(s.hostname, "db.default.svc.example.org");
    }

    #[test]
    fn external_name_service_is_dns_and_external() {
        let svc = mk_service(
            "ext",
            "default",
            ServiceSpec {
                type_: Some("ExternalName".into()),
                external_name: Some("api.example.com".into()),
                ports: Some(vec![mk_port(Some("https"), 443, None)]),
                ..Default::default()
            },
        );
        let s = service_from_k8s(&svc, "cluster.local").unwrap();
        assert_eq!(s.resolution, Resolution::Dns);
        assert!(s.mesh_external);
        assert_eq!(s.external_name.as_deref(), Some("api.example.com"));
        assert_eq!(s.ports[0].protocol, Protocol::Https);
    }

    #[test]
    fn traffic_distribution_sends_unhealthy_endpoints() {
        let with = |spec: Option<&str>, annotation: Option<&str>| {
            let mut svc = mk_service(
                "a",
                "ns1",
                ServiceSpec {
                    traffic_distribution: spec.map(str::to_string),
                    ..Default::default()
                },
            );
            svc.metadata.annotations = annotation
                .map(|v| [(TRAFFIC_DISTRIBUTION_ANNOTATION.to_string(), v.to_string())].into());
            service_from_k8s(&svc, "cluster.local")
                .unwrap()
                .send_unhealthy_endpoints
        };
        assert!(!with(None, None));
        for value in ["PreferClose", "PreferSameZone", "PreferSameNode"] {
            assert!(with(Some(value), None), "{value}");
        }
        // Values Istio does not act on.
        assert!(!with(Some("Any"), None));
        assert!(
            !with(Some("preferclose"), None),
            "the spec field is case-sensitive"
        );
        // The annotation, any case, when the field says nothing Istio knows.
        assert!(with(None, Some("preferclose")));
        assert!(with(Some("Other"), Some("PreferSameNode")));
        assert!(!with(None, Some("nearby")));
    }

    #[test]
    fn export_to_annotation_is_read() {
        let mut svc = mk_service("a", "ns1", ServiceSpec::default());
        svc.metadata.annotations =
            Some([(EXPORT_TO_ANNOTATION.to_string(), ". , ns2".to_string())].into());
        let s = service_from_k8s(&svc, "cluster.local").unwrap();
        assert_eq!(s.export_to, ExportTo(vec![".".into(), "ns2".into()]));
    }

    #[test]
    fn bad_port_is_reported_with_its_path() {
        let svc = mk_service(
            "a",
            "ns1",
            ServiceSpec {
                ports: Some(vec![
                    mk_port(Some("http"), 80, None),
                    mk_port(Some("x"), 70000, None),
                ]),
                ..Default::default()
            },
        );
        let errs = service_from_k8s(&svc, "cluster.local").unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].path, "spec.ports[1].port");
        assert!(errs[0].message.contains("70000"), "{}", errs[0]);
    }

    fn mk_pod(ns: &str, name: &str, labels: &[(&str, &str)], ip: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PodSpec {
                service_account_name: Some("bookinfo-reviews".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                pod_ips: Some(vec![PodIP { ip: ip.into() }]),
                ..Default::default()
            }),
        }
    }

    fn mk_slice(
        ns: &str,
        service: &str,
        port_name: Option<&str>,
        port: i32,
        eps: Vec<SliceEndpoint>,
    ) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: eps,
            metadata: ObjectMeta {
                name: Some(format!("{service}-abc")),
                namespace: Some(ns.into()),
                labels: Some([(SERVICE_NAME_LABEL.to_string(), service.to_string())].into()),
                ..Default::default()
            },
            ports: Some(vec![EndpointPort {
                name: port_name.map(str::to_string),
                port: Some(port),
                ..Default::default()
            }]),
        }
    }

    fn mk_slice_endpoint(
        ip: &str,
        pod: Option<&str>,
        ready: Option<bool>,
        zone: Option<&str>,
    ) -> SliceEndpoint {
        SliceEndpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready,
                serving: ready,
                // What Kubernetes (>= 1.26) writes for an endpoint that is not shutting down.
                terminating: Some(false),
            }),
            target_ref: pod.map(|p| ObjectReference {
                kind: Some("Pod".into()),
                name: Some(p.into()),
                ..Default::default()
            }),
            zone: zone.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn slice_endpoints_take_labels_from_pods_and_zone_from_slice() {
        let svc = service_from_k8s(
            &mk_service(
                "reviews",
                "default",
                ServiceSpec {
                    ports: Some(vec![mk_port(Some("http"), 9080, None)]),
                    ..Default::default()
                },
            ),
            "cluster.local",
        )
        .unwrap();
        let infos: Vec<PodInfo> = [
            mk_pod(
                "default",
                "reviews-v1",
                &[("app", "reviews"), ("version", "v1")],
                "10.1.0.1",
            ),
            mk_pod(
                "default",
                "reviews-v2",
                &[("app", "reviews"), ("version", "v2")],
                "10.1.0.2",
            ),
        ]
        .iter()
        .map(PodInfo::from_k8s)
        .collect();
        let pods = pod_index(&infos, []);
        let slice = mk_slice(
            "default",
            "reviews",
            Some("http"),
            9080,
            vec![
                mk_slice_endpoint("10.1.0.2", Some("reviews-v2"), Some(false), Some("zone-b")),
                mk_slice_endpoint("10.1.0.1", Some("reviews-v1"), None, Some("zone-a")),
                mk_slice_endpoint("10.1.0.9", None, Some(true), None),
            ],
        );
        // The same slice twice (a rollover) must not duplicate endpoints.
        let eps = endpoints_from_slices(&svc, [&slice, &slice], &pods);
        assert_eq!(eps.len(), 1);
        assert_eq!(eps[0].service_port, 9080);
        let list = &eps[0].endpoints;
        assert_eq!(
            list.iter().map(|e| e.address.as_str()).collect::<Vec<_>>(),
            ["10.1.0.1", "10.1.0.2", "10.1.0.9"]
        );
        assert_eq!(
            list[0].labels.get("version").map(String::as_str),
            Some("v1")
        );
        assert_eq!(list[0].locality.zone, "zone-a");
        assert_eq!(list[0].service_account.as_deref(), Some("bookinfo-reviews"));
        assert_eq!(list[1].health, EndpointHealth::Unhealthy);
        assert!(list[2].labels.is_empty());
        assert_eq!(list[0].port, 9080);
    }

    #[test]
    fn unnamed_slice_port_matches_unnamed_service_port_and_target_port_is_used() {
        let svc = service_from_k8s(
            &mk_service(
                "web",
                "default",
                ServiceSpec {
                    ports: Some(vec![KubePort {
                        port: 80,
                        target_port: Some(IntOrString::Int(8080)),
                        ..Default::default()
                    }]),
                    ..Default::default()
                },
            ),
            "cluster.local",
        )
        .unwrap();
        let slice = mk_slice(
            "default",
            "web",
            None,
            8080,
            vec![mk_slice_endpoint("10.2.0.1", None, None, None)],
        );
        let eps = endpoints_from_slices(&svc, [&slice], &PodIndex::new());
        assert_eq!(eps[0].service_port, 80);
        assert_eq!(eps[0].endpoints[0].port, 8080);
    }

    fn mk_node(name: &str, labels: &[(&str, &str)]) -> NodeInfo {
        NodeInfo::from_k8s(&Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    #[test]
    fn node_labels_give_the_locality_ga_names_first() {
        let node = mk_node(
            "n1",
            &[
                (REGION_LABEL, "eu"),
                (BETA_REGION_LABEL, "old"),
                (BETA_ZONE_LABEL, "eu-1b"),
                (SUBZONE_LABEL, "rack2"),
            ],
        );
        assert_eq!(node.locality.to_string(), "eu/eu-1b/rack2");
        assert_eq!(mk_node("bare", &[]).locality, Locality::default());
    }

    #[test]
    fn pod_locality_comes_from_its_label_else_its_node() {
        let with_node = |labels: &[(&str, &str)], node: &str| {
            let mut pod = mk_pod("default", "p", labels, "10.0.0.1");
            pod.spec.get_or_insert_default().node_name = Some(node.into());
            PodInfo::from_k8s(&pod)
        };
        let nodes = [
            mk_node("n1", &[(REGION_LABEL, "eu"), (ZONE_LABEL, "eu-1a")]),
            mk_node("n2", &[(REGION_LABEL, "us"), (ZONE_LABEL, "us-1c")]),
        ];
        let pods = [
            with_node(&[], "n1"),
            // Istio's label wins over the Node, the new name over the legacy one.
            with_node(&[(LEGACY_LOCALITY_LABEL, "us.us-east-1a.rack7")], "n1"),
            with_node(
                &[
                    (LOCALITY_LABEL, "ap/ap-2b"),
                    (LEGACY_LOCALITY_LABEL, "us.us-east-1a.rack7"),
                ],
                "n1",
            ),
            // Region labels on the Pod are not Istio's source: the Node is.
            with_node(&[(REGION_LABEL, "moon")], "n2"),
            with_node(&[], "unknown"),
        ];
        assert_eq!(pods[0].node_name, "n1");
        let index = pod_index(&pods, &nodes);
        let got: Vec<String> = pods.iter().map(|p| index.locality(p).to_string()).collect();
        assert_eq!(
            got,
            [
                "eu/eu-1a/",
                "us/us-east-1a/rack7",
                "ap/ap-2b/",
                "us/us-1c/",
                "//"
            ]
        );
        assert_eq!(
            PodInfo::from_k8s(&mk_pod("d", "p", &[], "10.0.0.1")).ips,
            ["10.0.0.1"]
        );
    }
}
