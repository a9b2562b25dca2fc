//! MeshConfig `discoverySelectors` in the Kubernetes mode, against the test API server:
//! objects of unselected namespaces (Services, Pods, EndpointSlices and Istio config) are
//! never stored nor published; labelling a namespace in or out makes its objects appear
//! or disappear; a changed mesh config file is applied without a restart.

use std::sync::Arc;

use pilotfish_controller::metrics::K8S_DISCOVERY_DROPPED;
use pilotfish_mesh::push_context::PushContext;
use pilotfish_shared::bus::Follower;
use pilotfish_shared::bus::memory::MemoryBus;
use serde_json::{Value, json};

use crate::k8s_support::*;

fn namespace(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
}

fn service_in(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 8080}]}
    })
}

fn pod_in(ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "example/app"}]}
    })
}

fn slice_in(ns: &str, service: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-a"), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": true}}]
    })
}

fn route_in(ns: &str) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"hosts": ["web"], "http": [{"route": [{"destination": {"host": "web"}}], "timeout": "3s"}]}
    })
}

/// Namespaces of the served Services and VirtualServices.
fn served(follower: &Follower<PushContext>) -> Option<(Vec<String>, Vec<String>)> {
    let ctx = follower.current()?;
    let mut services: Vec<String> = ctx
        .value
        .services()
        .iter()
        .map(|s| s.namespace.clone())
        .collect();
    services.sort();
    let mut routes: Vec<String> = ctx
        .value
        .virtual_services()
        .iter()
        .map(|v| v.meta.namespace.clone())
        .collect();
    routes.sort();
    Some((services, routes))
}

fn stored(replica: &Replica, kind: &str) -> u64 {
    replica.admin.leader()["objects"][kind]
        .as_u64()
        .unwrap_or_else(|| panic!("no {kind} count in {}", replica.admin.leader()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_selectors_keep_unselected_namespaces_out_and_follow_labels_and_the_mesh_file() {
    let cluster = Cluster::start().await;
    cluster.install_istio_crds().await;
    for (ns, labels) in [("shop", json!({"mesh": "on"})), ("lab", json!({}))] {
        cluster.apply(namespace(ns, labels)).await;
        cluster.apply(service_in(ns, "web")).await;
        cluster.apply(pod_in(ns, "web-1")).await;
        cluster.apply(slice_in(ns, "web")).await;
        cluster.apply(route_in(ns)).await;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh_file = dir.path().join("mesh.yaml");
    std::fs::write(
        &mesh_file,
        "discoverySelectors:\n- matchLabels: {mesh: \"on\"}\n",
    )
    .expect("write mesh.yaml");
    let bus = MemoryBus::new();
    let (follower, _task) = bus.follow(|b| pilotfish_testkit::keys::decoder()(b));
    let mut replica = Replica::start_configured(
        &cluster,
        "a",
        Arc::new(bus.publisher()),
        None,
        fast_timings(),
        Some(&mesh_file),
    );
    let only_shop = (vec!["shop".to_string()], vec!["shop".to_string()]);
    eventually("only the selected namespace served", || async {
        served(&follower).filter(|s| *s == only_shop)
    })
    .await;
    for kind in ["Service", "Pod", "EndpointSlice", "VirtualService"] {
        assert_eq!(
            stored(&replica, kind),
            1,
            "{kind}: the unselected one is not stored"
        );
    }

    // Ten times as many unselected namespaces, each with a Pod, a Service, an
    // EndpointSlice and a VirtualService: the stores do not grow by one entry.
    let namespaces_before = stored(&replica, "Namespace");
    let dropped_before: u64 = ["Service", "Pod", "EndpointSlice", "VirtualService"]
        .iter()
        .map(|k| K8S_DISCOVERY_DROPPED.with_label_values(&[k]).get())
        .sum();
    for i in 0..10 {
        let ns = format!("other-{i}");
        cluster.apply(namespace(&ns, json!({"mesh": "off"}))).await;
        cluster.apply(service_in(&ns, "web")).await;
        cluster.apply(pod_in(&ns, "web-1")).await;
        cluster.apply(slice_in(&ns, "web")).await;
        cluster.apply(route_in(&ns)).await;
    }
    eventually("the 40 unselected objects seen and dropped", || async {
        let dropped: u64 = ["Service", "Pod", "EndpointSlice", "VirtualService"]
            .iter()
            .map(|k| K8S_DISCOVERY_DROPPED.with_label_values(&[k]).get())
            .sum();
        (dropped >= dropped_before + 40 && stored(&replica, "Namespace") == namespaces_before + 10)
            .then_some(())
    })
    .await;
    for kind in ["Service", "Pod", "EndpointSlice", "VirtualService"] {
        assert_eq!(
            stored(&replica, kind),
            1,
            "{kind} grew with unselected objects"
        );
    }

    // Label `lab` in: its objects are listed and served.
    cluster.apply(namespace("lab", json!({"mesh": "on"}))).await;
    let both = (
        vec!["lab".to_string(), "shop".to_string()],
        vec!["lab".to_string(), "shop".to_string()],
    );
    eventually("the newly selected namespace served", || async {
        served(&follower).filter(|s| *s == both)
    })
    .await;
    assert_eq!(stored(&replica, "Pod"), 2);

    // Label `shop` out: its objects go.
    cluster.apply(namespace("shop", json!({}))).await;
    let only_lab = (vec!["lab".to_string()], vec!["lab".to_string()]);
    eventually("the deselected namespace gone", || async {
        served(&follower).filter(|s| *s == only_lab)
    })
    .await;
    assert_eq!(stored(&replica, "Service"), 1);

    // And back in: a narrowed selection widened again lists it afresh.
    cluster
        .apply(namespace("shop", json!({"mesh": "on"})))
        .await;
    eventually("the namespace labelled back in served again", || async {
        served(&follower).filter(|s| *s == both)
    })
    .await;

    // The mesh file changes: no selectors, every namespace.
    std::fs::write(&mesh_file, "rootNamespace: istio-system\n").expect("rewrite mesh.yaml");
    eventually(
        "every namespace served after the mesh config changed",
        || async { served(&follower).filter(|(services, _)| services.len() == 12) },
    )
    .await;
    // A mesh file that does not parse keeps the last good one.
    std::fs::write(
        &mesh_file,
        "discoverySelectors: [{matchExpressions: [{key: a, operator: Like}]}]\n",
    )
    .expect("rewrite mesh.yaml");
    tokio::time::sleep(pilotfish_controller::k8s::mesh_file::POLL * 2).await;
    assert_eq!(served(&follower).map(|(s, _)| s.len()), Some(12));
    replica.assert_alive();
}
