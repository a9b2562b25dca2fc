//! The test API server driven by the real kubectl 1.33: server-side apply of a CRD and
//! its custom resources, `wait`, refusal of invalid resources with the field named,
//! client-side apply of built-ins (strategic merge of Service ports), `get -o yaml`,
//! `get events`, `delete -f`, namespace deletion, and a `wait` satisfied by a watch.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::support::{Cluster, fixture, within};

async fn install_widget_crd(cluster: &Cluster) {
    let out = cluster
        .kubectl_ok(&["apply", "--server-side", "-f", &fixture("widgets-crd.yaml")])
        .await;
    assert!(
        out.contains(
            "customresourcedefinition.apiextensions.k8s.io/widgets.example.com serverside-applied"
        ),
        "{out}"
    );
    let out = cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "crd/widgets.example.com",
            "--timeout=60s",
        ])
        .await;
    assert!(out.contains("condition met"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_of_a_crd_then_custom_resources() {
    let cluster = Cluster::start().await;
    install_widget_crd(&cluster).await;
    let out = cluster
        .kubectl_ok(&[
            "apply",
            "--server-side",
            "-f",
            &fixture("widget-valid.yaml"),
        ])
        .await;
    assert!(
        out.contains("widget.example.com/sprocket serverside-applied"),
        "{out}"
    );

    let yaml = cluster
        .kubectl_ok(&["get", "widget", "sprocket", "-o", "yaml"])
        .await;
    assert!(yaml.contains("kind: Widget"), "{yaml}");
    assert!(yaml.contains("- sprocket.example.com"), "{yaml}");
    assert!(
        yaml.contains("mode: Safe"),
        "schema default missing: {yaml}"
    );

    let widget = cluster.kubectl_json(&["get", "wd", "sprocket"]).await;
    assert_eq!(
        widget["spec"]["routes"][1],
        json!({"name": "canary", "weight": 10})
    );
    assert_eq!(
        widget["spec"]["extra"]["anything"]["goes"],
        json!([1, 2, 3])
    );
    let version = widget["metadata"]["resourceVersion"].clone();

    // Re-applying the same file changes nothing.
    cluster
        .kubectl_ok(&[
            "apply",
            "--server-side",
            "-f",
            &fixture("widget-valid.yaml"),
        ])
        .await;
    let again = cluster.kubectl_json(&["get", "wd", "sprocket"]).await;
    assert_eq!(again["metadata"]["resourceVersion"], version);

    // Every served version reads the same object.
    let beta = cluster
        .kubectl_json(&["get", "widgets.v1beta1.example.com", "sprocket"])
        .await;
    assert_eq!(beta["apiVersion"], "example.com/v1beta1");
    assert_eq!(beta["spec"]["hosts"], json!(["sprocket.example.com"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_apply_of_a_changed_custom_resource_merges_it() {
    let cluster = Cluster::start().await;
    install_widget_crd(&cluster).await;
    let out = cluster
        .kubectl_ok(&["apply", "-f", &fixture("widget-valid.yaml")])
        .await;
    assert!(out.contains("widget.example.com/sprocket created"), "{out}");
    let original = std::fs::read_to_string(fixture("widget-valid.yaml")).unwrap();
    let changed = original
        .replace("replicas: 2", "replicas: 5")
        .replace("  labels:\n    team: mesh\n", "");
    assert_ne!(changed, original);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("widget.yaml");
    std::fs::write(&path, changed).unwrap();
    let out = cluster
        .kubectl_ok(&["apply", "-f", path.to_str().unwrap()])
        .await;
    assert!(
        out.contains("widget.example.com/sprocket configured"),
        "{out}"
    );
    let widget = cluster.kubectl_json(&["get", "widget", "sprocket"]).await;
    assert_eq!(widget["spec"]["replicas"], 5);
    assert!(
        widget["spec"].get("labels").is_none(),
        "dropped field kept: {widget}"
    );
    assert_eq!(widget["metadata"]["generation"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_custom_resources_are_refused_with_the_field_named() {
    let cluster = Cluster::start().await;
    install_widget_crd(&cluster).await;
    let invalid = fixture("widget-invalid.yaml");
    for args in [
        vec!["apply", "--server-side", "-f", invalid.as_str()],
        vec!["apply", "-f", invalid.as_str()],
        vec!["create", "-f", invalid.as_str()],
    ] {
        let out = cluster.kubectl(&args).await;
        assert!(!out.success, "kubectl {args:?} accepted an invalid widget");
        assert!(
            out.stderr.contains("The Widget \"broken\" is invalid"),
            "{args:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(
                "spec.mode: Unsupported value: \"Reckless\": supported values: \"Fast\", \"Safe\""
            ),
            "{args:?}: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains("spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer"),
            "{args:?}: {}",
            out.stderr
        );
    }
    let out = cluster
        .kubectl(&[
            "apply",
            "--server-side",
            "-f",
            &fixture("widget-unknown-field.yaml"),
        ])
        .await;
    assert!(!out.success);
    assert!(
        out.stderr.contains("unknown field \"spec.hostz\""),
        "{}",
        out.stderr
    );

    let out = cluster
        .kubectl(&["apply", "-f", &fixture("unknown-kind.yaml")])
        .await;
    assert!(!out.success);
    assert!(
        out.stderr
            .contains("no matches for kind \"Sprocket\" in version \"example.com/v1\""),
        "{}",
        out.stderr
    );

    let out = cluster.kubectl(&["get", "widget", "broken"]).await;
    assert!(!out.success);
    assert!(
        out.stderr
            .contains("widgets.example.com \"broken\" not found"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_apply_of_builtins_merges_service_ports_by_port() {
    let cluster = Cluster::start().await;
    let out = cluster
        .kubectl_ok(&[
            "apply",
            "-f",
            &fixture("service.yaml"),
            "-f",
            &fixture("deployment.yaml"),
        ])
        .await;
    assert!(
        out.contains("service/web created") && out.contains("deployment.apps/web created"),
        "{out}"
    );
    let before = cluster.kubectl_json(&["get", "service", "web"]).await;
    let cluster_ip = before["spec"]["clusterIP"].clone();
    assert!(
        cluster_ip
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.96.")),
        "{before}"
    );

    let out = cluster
        .kubectl_ok(&["apply", "-f", &fixture("service-changed.yaml")])
        .await;
    assert!(out.contains("service/web configured"), "{out}");
    let after = cluster.kubectl_json(&["get", "svc", "web"]).await;
    assert_eq!(
        after["spec"]["ports"],
        json!([
            {"name": "grpc", "port": 9000, "protocol": "TCP", "targetPort": 9000},
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8081},
        ])
    );
    assert_eq!(after["spec"]["clusterIP"], cluster_ip, "allocated IP kept");

    let out = cluster
        .kubectl_ok(&["apply", "-f", &fixture("deployment.yaml")])
        .await;
    assert!(out.contains("deployment.apps/web unchanged"), "{out}");
    let out = cluster
        .kubectl_ok(&["rollout", "status", "deployment/web", "--timeout=60s"])
        .await;
    assert!(out.contains("successfully rolled out"), "{out}");
    let deployment = cluster.kubectl_json(&["get", "deploy", "web"]).await;
    assert_eq!(deployment["status"]["availableReplicas"], 2);
    let out = cluster
        .kubectl_ok(&["scale", "deployment/web", "--replicas=5"])
        .await;
    assert!(out.contains("deployment.apps/web scaled"), "{out}");
    let deployment = cluster.kubectl_json(&["get", "deploy", "web"]).await;
    assert_eq!(deployment["spec"]["replicas"], 5);
    assert_eq!(deployment["status"]["availableReplicas"], 5);
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["env"][0]["name"],
        "MODE"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typos_in_builtin_manifests_are_refused_or_dropped() {
    let cluster = Cluster::start().await;
    let typo = fixture("service-typo.yaml");
    for args in [
        vec!["apply", "-f", typo.as_str()],
        vec!["apply", "--server-side", "-f", typo.as_str()],
    ] {
        let out = cluster.kubectl(&args).await;
        assert!(!out.success, "kubectl {args:?} accepted a typo");
        assert!(
            out.stderr.contains("Service in version \"v1\" cannot be handled as a Service: strict decoding error: unknown field \"spec.ports[0].targetport\""),
            "{args:?}: {}",
            out.stderr
        );
    }
    // Without strict validation the unknown field is dropped, with a warning.
    let out = cluster
        .kubectl(&["apply", "--validate=warn", "-f", &typo])
        .await;
    assert!(out.success, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("unknown field \"spec.ports[0].targetport\""),
        "{}",
        out.stderr
    );
    let service = cluster.kubectl_json(&["get", "service", "typo"]).await;
    assert_eq!(
        service["spec"]["ports"][0]["targetPort"], 80,
        "defaulted, typo dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_events_and_delete_from_files() {
    let cluster = Cluster::start().await;
    cluster
        .kubectl_ok(&[
            "create",
            "-f",
            &fixture("event.yaml"),
            "-f",
            &fixture("service.yaml"),
        ])
        .await;
    let listed = cluster.kubectl_ok(&["get", "events"]).await;
    assert!(listed.contains("web.rollout"), "{listed}");
    let all = cluster.kubectl_json(&["get", "events", "-A"]).await;
    assert_eq!(all["items"][0]["reason"], "ScalingReplicaSet");
    assert_eq!(all["items"][0]["involvedObject"]["name"], "web");
    let via_events_api = cluster
        .kubectl_json(&["get", "events.v1.events.k8s.io", "web.rollout"])
        .await;
    assert_eq!(via_events_api["note"], "Scaled up replica set web to 2");

    let out = cluster
        .kubectl_ok(&[
            "delete",
            "-f",
            &fixture("service.yaml"),
            "-f",
            &fixture("event.yaml"),
        ])
        .await;
    assert!(out.contains("service \"web\" deleted"), "{out}");
    let out = cluster.kubectl(&["get", "service", "web"]).await;
    assert!(!out.success);
    assert!(
        out.stderr
            .contains("Error from server (NotFound): services \"web\" not found"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_are_validated_and_deleting_one_deletes_its_contents() {
    let cluster = Cluster::start().await;
    let out = cluster.kubectl(&["create", "namespace", "Team_A"]).await;
    assert!(!out.success, "an invalid namespace name was accepted");
    assert!(
        out.stderr.contains("The Namespace \"Team_A\" is invalid")
            && out.stderr.contains("RFC 1123 label"),
        "{}",
        out.stderr
    );
    cluster.kubectl_ok(&["create", "namespace", "team"]).await;
    cluster
        .kubectl_ok(&[
            "-n",
            "team",
            "create",
            "configmap",
            "settings",
            "--from-literal=a=b",
        ])
        .await;
    let out = cluster
        .kubectl_ok(&["delete", "namespace", "team", "--timeout=60s"])
        .await;
    assert!(out.contains("namespace \"team\" deleted"), "{out}");
    let out = cluster
        .kubectl(&["-n", "team", "get", "configmap", "settings"])
        .await;
    assert!(!out.success, "config map survived its namespace");
    let out = cluster
        .kubectl(&["-n", "team", "create", "configmap", "again"])
        .await;
    assert!(
        out.stderr.contains("namespaces \"team\" not found"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_is_satisfied_by_a_later_change() {
    let cluster = Cluster::start().await;
    cluster
        .kubectl_ok(&["create", "configmap", "gate", "--from-literal=state=closed"])
        .await;
    let waiting = {
        let kubectl = pilotfish_testkit::tools::kubectl().unwrap_or_else(|e| panic!("{e}"));
        let home = tempfile::tempdir().unwrap();
        let env =
            pilotfish_testkit::tools::KubeEnv::new(home.path(), &cluster.server.kubeconfig_path());
        tokio::spawn(async move {
            let out = env
                .run(
                    &kubectl,
                    &[
                        "wait",
                        "--for=jsonpath={.data.state}=open",
                        "configmap/gate",
                        "--timeout=50s",
                    ],
                    crate::support::TOOL_TIMEOUT,
                )
                .await;
            drop(home);
            out
        })
    };
    // Give kubectl time to reach its watch; the wait must succeed either way.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let api: Api<ConfigMap> = Api::namespaced(cluster.client(), "default");
    api.patch(
        "gate",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"state": "open"}})),
    )
    .await
    .unwrap();
    let out = within("kubectl wait", waiting)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.success, "kubectl wait failed: {}", out.stderr);
    assert!(
        out.stdout.contains("configmap/gate condition met"),
        "{}",
        out.stdout
    );
}
