//! The test API server driven by the real helm 4: install (with and without `--wait`),
//! upgrade and uninstall of the fixture chart (Deployment, Service, ConfigMap,
//! ServiceAccount, Role/RoleBinding, a CRD in `crds/`), checked with kubectl.

use serde_json::Value;

use crate::support::{Cluster, fixture};

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|i| {
                    format!(
                        "{}/{}",
                        i["kind"].as_str().unwrap_or(""),
                        i["metadata"]["name"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

const CHART_KINDS: &str = "deployments,services,configmaps,serviceaccounts,roles,rolebindings";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_upgrade_and_uninstall_the_fixture_chart() {
    let cluster = Cluster::start().await;
    let chart = fixture("chart");
    let out = cluster.helm_ok(&["install", "demo", &chart]).await;
    assert!(out.contains("STATUS: deployed"), "{out}");

    let installed = names(&cluster.kubectl_json(&["get", CHART_KINDS]).await);
    for expected in [
        "Deployment/demo",
        "Service/demo",
        "ConfigMap/demo-config",
        "ServiceAccount/demo",
        "Role/demo",
        "RoleBinding/demo",
    ] {
        assert!(
            installed.contains(&expected.to_string()),
            "{expected} missing from {installed:?}"
        );
    }
    let crd = cluster
        .kubectl_json(&["get", "crd", "gadgets.fixture.example.com"])
        .await;
    assert_eq!(crd["status"]["conditions"][1]["type"], "Established");
    // The release record helm sent as a protobuf Secret.
    let release = cluster
        .kubectl_json(&["get", "secret", "-l", "owner=helm,name=demo"])
        .await;
    assert_eq!(release["items"][0]["type"], "helm.sh/release.v1");
    assert_eq!(
        release["items"][0]["metadata"]["labels"]["status"],
        "deployed"
    );

    let out = cluster
        .helm_ok(&[
            "upgrade",
            "demo",
            &chart,
            "--set",
            "greeting=bye",
            "--set",
            "replicas=3",
            "--wait",
            "--timeout",
            "120s",
        ])
        .await;
    assert!(out.contains("REVISION: 2"), "{out}");
    let config = cluster
        .kubectl_json(&["get", "configmap", "demo-config"])
        .await;
    assert_eq!(config["data"]["greeting"], "bye");
    let deployment = cluster.kubectl_json(&["get", "deployment", "demo"]).await;
    assert_eq!(deployment["spec"]["replicas"], 3);
    assert_eq!(deployment["metadata"]["generation"], 2);
    assert_eq!(deployment["status"]["readyReplicas"], 3);
    let history = cluster.helm_ok(&["history", "demo"]).await;
    assert!(
        history.contains("superseded") && history.contains("deployed"),
        "{history}"
    );

    let out = cluster
        .helm_ok(&["uninstall", "demo", "--wait", "--timeout", "120s"])
        .await;
    assert!(out.contains("release \"demo\" uninstalled"), "{out}");
    let left = names(&cluster.kubectl_json(&["get", CHART_KINDS]).await);
    assert!(
        left.iter()
            .all(|n| !n.ends_with("/demo") && !n.ends_with("/demo-config")),
        "left behind: {left:?}"
    );
    // helm keeps CRDs from crds/ on uninstall.
    cluster
        .kubectl_ok(&["get", "crd", "gadgets.fixture.example.com"])
        .await;
    let list = cluster.helm_ok(&["list"]).await;
    assert!(!list.contains("demo"), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_with_wait_into_a_new_namespace() {
    let cluster = Cluster::start().await;
    let chart = fixture("chart");
    let out = cluster
        .helm_ok(&[
            "install",
            "waited",
            &chart,
            "--namespace",
            "apps",
            "--create-namespace",
            "--wait",
            "--timeout",
            "120s",
        ])
        .await;
    assert!(out.contains("STATUS: deployed"), "{out}");
    let status = cluster
        .helm_ok(&["status", "waited", "--namespace", "apps"])
        .await;
    assert!(status.contains("STATUS: deployed"), "{status}");
    let deployment = cluster
        .kubectl_json(&["get", "deployment", "waited", "--namespace", "apps"])
        .await;
    assert_eq!(deployment["status"]["availableReplicas"], 1);
    let binding = cluster
        .kubectl_json(&["get", "rolebinding", "waited", "--namespace", "apps"])
        .await;
    assert_eq!(binding["subjects"][0]["namespace"], "apps");
}
