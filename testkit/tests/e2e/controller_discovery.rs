//! The memory bound of MeshConfig `discoverySelectors` (issue 15 item 10), measured on
//! real processes: the test API server binary, `redis-server` and `pilotfish-controller`.
//! The baseline cluster has 10 selected namespaces, each with 10 Services, 10
//! EndpointSlices (2 endpoints) and 20 Pods; the second run adds 10 times as many
//! unselected namespaces with the same content. Each run starts a fresh controller,
//! waits for its snapshot, lets it settle and reads its resident set size (`VmRSS`);
//! the bound is RSS(with unselected) ≤ 1.2 × RSS(baseline). Run by `make
//! bench-discovery` (not part of `make test`); the figures are in docs/PERFORMANCE.md.

use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::{Api, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use pilotfish_testkit::redis::RedisServer;
use serde_json::{Value, json};

use crate::controller_k8s::{Cluster, Controller, eventually};

const SERVICES: usize = 10;
const PODS: usize = 20;
const SELECTED: usize = 10;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn objects_of(ns: &str) -> Vec<(ApiResource, Value)> {
    let core = |kind: &str, plural: &str| ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let slices = ApiResource {
        group: "discovery.k8s.io".into(),
        version: "v1".into(),
        api_version: "discovery.k8s.io/v1".into(),
        kind: "EndpointSlice".into(),
        plural: "endpointslices".into(),
    };
    let mut out = Vec::new();
    for s in 0..SERVICES {
        out.push((
            core("Service", "services"),
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": format!("svc-{s}"), "namespace": ns},
                   "spec": {"selector": {"app": format!("svc-{s}")},
                            "ports": [{"name": "http", "port": 8080}]}}),
        ));
        out.push((
            slices.clone(),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": format!("svc-{s}-a"), "namespace": ns,
                                "labels": {"kubernetes.io/service-name": format!("svc-{s}")}},
                   "addressType": "IPv4",
                   "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                   "endpoints": [
                       {"addresses": [format!("10.{}.{s}.1", ns.len())], "conditions": {"ready": true},
                        "targetRef": {"kind": "Pod", "name": format!("svc-{s}-0"), "namespace": ns}},
                       {"addresses": [format!("10.{}.{s}.2", ns.len())], "conditions": {"ready": true},
                        "targetRef": {"kind": "Pod", "name": format!("svc-{s}-1"), "namespace": ns}}]}),
        ));
    }
    for p in 0..PODS {
        let s = p / 2;
        out.push((
            core("Pod", "pods"),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": format!("svc-{s}-{}", p % 2), "namespace": ns,
                                "labels": {"app": format!("svc-{s}"), "version": "v1"}},
                   "spec": {"serviceAccountName": "default",
                            "containers": [{"name": "app", "image": "example/app:1.0",
                                            "ports": [{"containerPort": 8080}]}]}}),
        ));
    }
    out
}

async fn populate(cluster: &Cluster, prefix: &str, count: usize, labels: Value) {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&cluster.kubeconfig).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("kube config");
    let client = kube::Client::try_from(config).expect("client");
    let namespaces: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource {
            group: String::new(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "Namespace".into(),
            plural: "namespaces".into(),
        },
    );
    for i in 0..count {
        let ns = format!("{prefix}-{i}");
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": labels.clone()}
        }))
        .unwrap();
        namespaces
            .create(&PostParams::default(), &object)
            .await
            .expect("create namespace");
        stream::iter(objects_of(&ns))
            .for_each_concurrent(8, |(resource, value)| {
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &resource);
                async move {
                    let object: DynamicObject = serde_json::from_value(value).unwrap();
                    api.create(&PostParams::default(), &object)
                        .await
                        .expect("create object");
                }
            })
            .await;
    }
}

/// Starts a controller, waits until it has published a snapshot of the selected objects
/// and settled, and returns its RSS in KiB (then stops it).
async fn measure(
    cluster: &Cluster,
    redis_url: &str,
    mesh_file: &str,
    name: &str,
    pods: usize,
) -> u64 {
    let mut controller =
        Controller::new(name, redis_url, cluster).with_flags(&["--mesh-config", mesh_file]);
    controller.start();
    eventually(
        "the controller ready, with every selected Pod stored",
        || {
            let page = controller.leader_page()?;
            (controller.ready() && page["objects"]["Pod"] == json!(pods)).then_some(())
        },
    )
    .await;
    // Let the first build's garbage go and the allocator settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let page = controller.leader_page().expect("leader page");
    let rss = rss_kib(controller.pid().expect("running"));
    println!(
        "MEASURED discovery {name}: RSS {rss} KiB; stored {}",
        page["objects"]
    );
    controller.terminate();
    rss
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: make bench-discovery"]
async fn controller_rss_with_ten_times_as_many_unselected_namespaces() {
    let cluster = Cluster::start().await;
    let crds = pilotfish_testkit::tools::workspace_root().join("crds");
    cluster
        .kubectl(&["apply", "--server-side", "-f", crds.to_str().unwrap()])
        .await;
    let redis = RedisServer::start().expect("redis");
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh_file = dir.path().join("mesh.yaml");
    std::fs::write(
        &mesh_file,
        "discoverySelectors:\n- matchLabels: {mesh: \"on\"}\n",
    )
    .unwrap();
    let mesh_file = mesh_file.display().to_string();

    populate(&cluster, "selected", SELECTED, json!({"mesh": "on"})).await;
    let baseline = measure(
        &cluster,
        &redis.url(),
        &mesh_file,
        "baseline",
        SELECTED * PODS,
    )
    .await;
    populate(
        &cluster,
        "unselected",
        SELECTED * 10,
        json!({"mesh": "off"}),
    )
    .await;
    let with_unselected = measure(
        &cluster,
        &redis.url(),
        &mesh_file,
        "unselected",
        SELECTED * PODS,
    )
    .await;
    // For reference: the same cluster without selectors (every namespace read).
    let everything = dir.path().join("everything.yaml");
    std::fs::write(&everything, "rootNamespace: istio-system\n").unwrap();
    let unfiltered = measure(
        &cluster,
        &redis.url(),
        &everything.display().to_string(),
        "unfiltered",
        SELECTED * 11 * PODS,
    )
    .await;
    let ratio = with_unselected as f64 / baseline as f64;
    println!(
        "MEASURED discovery: baseline {baseline} KiB, with 10x unselected {with_unselected} KiB, ratio {ratio:.3}; without selectors {unfiltered} KiB"
    );
    assert!(
        ratio <= 1.2,
        "RSS grew {ratio:.3}x with unselected namespaces (bound 1.2x)"
    );
}
