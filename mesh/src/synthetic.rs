//! Synthetic meshes for benchmarks, load tools and tests: `n` services spread over
//! namespaces, each with Pods and an EndpointSlice, a share of them with a VirtualService
//! (80/20 split and a header route) and a DestinationRule (two subsets, a traffic policy).
//! Deterministic: the same parameters give the same objects.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use crate::api::{DestinationRule, VirtualService};
use crate::mesh_config::MeshConfig;
use crate::model::PodInfo;
use crate::push_context::BuildInputs;

/// Shape of a synthetic mesh.
#[derive(Clone, Copy, Debug)]
pub struct MeshShape {
    pub services: usize,
    pub endpoints_per_service: usize,
    /// Every `routed_every`-th service gets a VirtualService and a DestinationRule
    /// (10 → 10% of services).
    pub routed_every: usize,
    pub namespaces: usize,
}

impl MeshShape {
    /// The shape the foundation issue benchmarks: 5 endpoints each, 10% routed.
    pub fn standard(services: usize) -> Self {
        MeshShape {
            services,
            endpoints_per_service: 5,
            routed_every: 10,
            namespaces: 20,
        }
    }
}

fn meta(name: &str, ns: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ns.to_string()),
        labels: Some(labels),
        // Fixed timestamps keep the mesh deterministic.
        creation_timestamp: Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
        generation: Some(1),
        ..Default::default()
    }
}

/// Builds the inputs of a synthetic mesh.
pub fn mesh(shape: MeshShape) -> BuildInputs {
    let mut inputs = BuildInputs {
        mesh: MeshConfig::default(),
        cluster_domain: "cluster.local".to_string(),
        ..Default::default()
    };
    for i in 0..shape.services {
        let ns = format!("ns-{}", i % shape.namespaces.max(1));
        let name = format!("svc-{i}");
        let app: BTreeMap<String, String> = [("app".to_string(), name.clone())].into();
        inputs.services.push(Arc::new(Service {
            metadata: meta(&name, &ns, app.clone()),
            spec: Some(ServiceSpec {
                cluster_ip: Some(format!(
                    "10.{}.{}.{}",
                    96 + (i >> 16) % 32,
                    (i >> 8) % 256,
                    i % 256
                )),
                ports: Some(vec![ServicePort {
                    name: Some("http".into()),
                    port: 8080,
                    ..Default::default()
                }]),
                selector: Some(app.clone()),
                ..Default::default()
            }),
            status: None,
        }));
        let mut slice_endpoints = Vec::new();
        for e in 0..shape.endpoints_per_service {
            let pod = format!("{name}-{e}");
            let ip = format!(
                "10.{}.{}.{}",
                128 + (i >> 14) % 64,
                (i >> 6) % 256,
                (i % 64) * 4 + e % 4
            );
            let version = if e % 5 == 4 { "v2" } else { "v1" };
            let mut labels = app.clone();
            labels.insert("version".into(), version.into());
            inputs.pods.push(Arc::new(PodInfo {
                namespace: ns.clone(),
                name: pod.clone(),
                labels,
                ips: vec![ip.clone()],
                service_account: Some(name.clone()),
                locality: Default::default(),
                node_name: String::new(),
                ready: true,
            }));
            slice_endpoints.push(Endpoint {
                addresses: vec![ip],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                target_ref: Some(ObjectReference {
                    kind: Some("Pod".into()),
                    name: Some(pod),
                    namespace: Some(ns.clone()),
                    ..Default::default()
                }),
                zone: Some(format!("zone-{}", e % 3)),
                ..Default::default()
            });
        }
        inputs.endpoint_slices.push(Arc::new(EndpointSlice {
            address_type: "IPv4".into(),
            endpoints: slice_endpoints,
            metadata: meta(
                &format!("{name}-slice"),
                &ns,
                [(
                    crate::model::kube::SERVICE_NAME_LABEL.to_string(),
                    name.clone(),
                )]
                .into(),
            ),
            ports: Some(vec![EndpointPort {
                name: Some("http".into()),
                port: Some(8080),
                ..Default::default()
            }]),
        }));
        if shape.routed_every > 0 && i % shape.routed_every == 0 {
            inputs
                .destination_rules
                .push(Arc::new(destination_rule(&name, &ns)));
            inputs
                .virtual_services
                .push(Arc::new(virtual_service(&name, &ns)));
        }
    }
    inputs
}

fn destination_rule(name: &str, ns: &str) -> DestinationRule {
    let value = serde_json::json!({
        "apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": "1970-01-01T00:00:00Z", "generation": 1},
        "spec": {
            "host": name,
            "trafficPolicy": {
                "connectionPool": {"tcp": {"maxConnections": 100}, "http": {"http1MaxPendingRequests": 10}},
                "outlierDetection": {"consecutive5xxErrors": 5, "interval": "10s", "baseEjectionTime": "30s"}
            },
            "subsets": [
                {"name": "v1", "labels": {"version": "v1"}},
                {"name": "v2", "labels": {"version": "v2"}}
            ]
        }
    });
    // The literal above is a valid DestinationRule; a failure here is a bug in this file.
    crate::api::parse_strict(&value).expect("synthetic DestinationRule parses")
}

fn virtual_service(name: &str, ns: &str) -> VirtualService {
    let value = serde_json::json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": "1970-01-01T00:00:00Z", "generation": 1},
        "spec": {
            "hosts": [name],
            "http": [
                {
                    "match": [{"headers": {"end-user": {"exact": "jason"}}}],
                    "route": [{"destination": {"host": name, "subset": "v2"}}]
                },
                {
                    "timeout": "5s",
                    "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "5xx,reset"},
                    "route": [
                        {"destination": {"host": name, "subset": "v1"}, "weight": 80},
                        {"destination": {"host": name, "subset": "v2"}, "weight": 20}
                    ]
                }
            ]
        }
    });
    crate::api::parse_strict(&value).expect("synthetic VirtualService parses")
}
