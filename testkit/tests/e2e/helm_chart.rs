//! Pilotfish's own Helm chart (`manifests/helm/pilotfish`) and plain manifests
//! (`manifests/`) against the test API server with the real helm 4 and kubectl 1.33:
//! install with `--wait`, what `kubectl get` then lists, an upgrade that changes the replica
//! counts, uninstall; an external-Redis + autoscaler install; values the chart refuses; and
//! `kubectl apply --server-side -f manifests/` without Helm. Pods never run here (the server
//! fakes Deployment status), so these tests cover the objects, not the binaries in them.

use std::collections::BTreeSet;

use pilotfish_testkit::tools::workspace_root;
use serde_json::Value;

use crate::support::Cluster;

const NAMESPACE: &str = "pilotfish-system";
const NAMESPACED_KINDS: &str = "deployments,services,serviceaccounts,configmaps,poddisruptionbudgets,horizontalpodautoscalers,networkpolicies,roles,rolebindings";
const CLUSTER_KINDS: &str = "clusterroles,clusterrolebindings";
const CRDS: [&str; 3] = [
    "destinationrules.networking.istio.io",
    "serviceentries.networking.istio.io",
    "virtualservices.networking.istio.io",
];

fn chart() -> String {
    workspace_root()
        .join("manifests/helm/pilotfish")
        .display()
        .to_string()
}

fn chart_file(name: &str) -> String {
    workspace_root()
        .join("manifests/helm/pilotfish")
        .join(name)
        .display()
        .to_string()
}

/// `Kind/name` of every item of a `kubectl get -o json` list.
fn names(list: &Value) -> BTreeSet<String> {
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

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The value of environment variable `name` of the first container of a Deployment.
fn env<'a>(deployment: &'a Value, name: &str) -> Option<&'a Value> {
    deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

fn env_value<'a>(deployment: &'a Value, name: &str) -> &'a str {
    env(deployment, name)
        .and_then(|e| e["value"].as_str())
        .unwrap_or_else(|| panic!("env {name} missing from {}", deployment["metadata"]["name"]))
}

async fn namespaced_objects(cluster: &Cluster) -> BTreeSet<String> {
    names(
        &cluster
            .kubectl_json(&["get", NAMESPACED_KINDS, "--namespace", NAMESPACE])
            .await,
    )
    .into_iter()
    // The helm release records and the namespace's default ServiceAccount are not ours.
    .filter(|n| n != "ServiceAccount/default")
    .collect()
}

async fn pilotfish_cluster_objects(cluster: &Cluster) -> BTreeSet<String> {
    names(&cluster.kubectl_json(&["get", CLUSTER_KINDS]).await)
        .into_iter()
        .filter(|n| n.contains("pilotfish"))
        .collect()
}

async fn deployment(cluster: &Cluster, name: &str) -> Value {
    cluster
        .kubectl_json(&["get", "deployment", name, "--namespace", NAMESPACE])
        .await
}

fn default_objects() -> BTreeSet<String> {
    set(&[
        "Deployment/pilotfish-controller",
        "Deployment/pilotfish-redis",
        "Deployment/pilotfish-xds",
        "NetworkPolicy/pilotfish-controller",
        "NetworkPolicy/pilotfish-redis",
        "NetworkPolicy/pilotfish-xds",
        "PodDisruptionBudget/pilotfish-controller",
        "PodDisruptionBudget/pilotfish-xds",
        "Role/pilotfish-controller-leader-election",
        "RoleBinding/pilotfish-controller-leader-election",
        "Service/pilotfish-redis",
        "Service/pilotfish-xds",
        "ServiceAccount/pilotfish-controller",
        "ServiceAccount/pilotfish-redis",
        "ServiceAccount/pilotfish-xds",
    ])
}

/// What the default install must look like: the objects, and the properties the spec
/// asks for that a wrong template would silently lose.
async fn assert_default_install(cluster: &Cluster) {
    assert_eq!(namespaced_objects(cluster).await, default_objects());
    assert_eq!(
        pilotfish_cluster_objects(cluster).await,
        set(&[
            "ClusterRole/pilotfish-controller",
            "ClusterRole/pilotfish-xds-tokenreview",
            "ClusterRoleBinding/pilotfish-controller",
            "ClusterRoleBinding/pilotfish-xds-tokenreview",
        ])
    );
    for crd in CRDS {
        let crd = cluster.kubectl_json(&["get", "crd", crd]).await;
        let established = crd["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        });
        assert!(established, "{} not established", crd["metadata"]["name"]);
    }

    let xds = deployment(cluster, "pilotfish-xds").await;
    assert_eq!(xds["spec"]["replicas"], 3);
    assert_eq!(xds["status"]["readyReplicas"], 3);
    let pod = &xds["spec"]["template"]["spec"];
    // The token is for TokenReview of callers on 15012.
    assert_eq!(pod["automountServiceAccountToken"], true);
    assert_eq!(pod["serviceAccountName"], "pilotfish-xds");
    assert_eq!(
        env_value(&xds, "PILOTFISH_XDS_ADDR"),
        "off",
        "no plaintext port by default"
    );
    assert_eq!(
        env_value(&xds, "PILOTFISH_SECURE_XDS_ADDR"),
        "0.0.0.0:15012"
    );
    assert_eq!(
        env_value(&xds, "PILOTFISH_SERVING_DNS_NAMES"),
        "pilotfish-xds.pilotfish-system.svc,pilotfish-xds.pilotfish-system.svc.cluster.local"
    );
    assert_eq!(
        env_value(&xds, "PILOTFISH_CA_DIR"),
        "/etc/cacerts,/var/run/secrets/pilotfish/istio-ca"
    );
    let ca_volumes: Vec<(&str, bool)> = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| {
            Some((
                v["secret"]["secretName"].as_str()?,
                v["secret"]["optional"] == true,
            ))
        })
        .collect();
    assert_eq!(ca_volumes, [("cacerts", true), ("istio-ca-secret", true)]);
    let container = &pod["containers"][0];
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        container["securityContext"]["allowPrivilegeEscalation"],
        false
    );
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"][0],
        "ALL"
    );
    assert!(container["resources"]["limits"]["memory"].is_string());
    assert_eq!(
        env_value(&xds, "PILOTFISH_REDIS_URL"),
        "redis://pilotfish-redis.pilotfish-system.svc.cluster.local:6379"
    );
    let xds_account = cluster
        .kubectl_json(&["get", "serviceaccount", "pilotfish-xds", "-n", NAMESPACE])
        .await;
    assert_eq!(xds_account["automountServiceAccountToken"], true);
    let tokenreview = cluster
        .kubectl_json(&["get", "clusterrole", "pilotfish-xds-tokenreview"])
        .await;
    assert_eq!(
        tokenreview["rules"],
        serde_json::json!([{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]),
        "the xDS tier may review tokens and nothing else"
    );

    let service = cluster
        .kubectl_json(&["get", "service", "pilotfish-xds", "-n", NAMESPACE])
        .await;
    let grpc = &service["spec"]["ports"][0];
    assert_eq!(
        (grpc["port"].as_u64(), grpc["appProtocol"].as_str()),
        (Some(15012), Some("grpc"))
    );
    assert_eq!(service["spec"]["ports"][1]["port"], 15014);
    assert_eq!(service["spec"]["ports"].as_array().map(Vec::len), Some(2));

    let controller = deployment(cluster, "pilotfish-controller").await;
    assert_eq!(controller["spec"]["replicas"], 2);
    assert_eq!(controller["status"]["readyReplicas"], 2);
    assert_eq!(
        controller["spec"]["template"]["spec"]["serviceAccountName"],
        "pilotfish-controller"
    );
    // The Lease the controller is told to use is the one its Role lets it renew.
    let lease = env_value(&controller, "PILOTFISH_LEASE_NAME");
    let role = cluster
        .kubectl_json(&[
            "get",
            "role",
            "pilotfish-controller-leader-election",
            "-n",
            NAMESPACE,
        ])
        .await;
    let named: Vec<&Value> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| r["resourceNames"].is_array())
        .collect();
    assert_eq!(named.len(), 2, "{role}");
    assert_eq!(named[0]["resourceNames"][0], lease);
    // The CA: the two Secrets by name, and creating the self-signed one.
    assert_eq!(named[1]["resources"][0], "secrets");
    assert_eq!(
        named[1]["resourceNames"],
        serde_json::json!(["cacerts", "istio-ca-secret"])
    );
    assert_eq!(named[1]["verbs"], serde_json::json!(["get"]));
    assert_eq!(env_value(&controller, "PILOTFISH_MANAGE_CA"), "true");
    assert_eq!(
        env(&controller, "POD_NAMESPACE").expect("POD_NAMESPACE")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    let binding = cluster
        .kubectl_json(&["get", "clusterrolebinding", "pilotfish-controller"])
        .await;
    assert_eq!(binding["subjects"][0]["name"], "pilotfish-controller");
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_installs_upgrades_and_uninstalls() {
    let cluster = Cluster::start().await;
    let chart = chart();
    let out = cluster
        .helm_ok(&[
            "install",
            "pilotfish",
            &chart,
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--wait",
            "--timeout",
            "120s",
        ])
        .await;
    assert!(out.contains("STATUS: deployed"), "{out}");
    // NOTES.txt tells the user where proxies connect.
    assert!(
        out.contains("pilotfish-xds.pilotfish-system.svc.cluster.local:15012"),
        "{out}"
    );
    assert_default_install(&cluster).await;

    let out = cluster
        .helm_ok(&[
            "upgrade",
            "pilotfish",
            &chart,
            "--namespace",
            NAMESPACE,
            "--set",
            "xds.replicas=5",
            "--set",
            "controller.replicas=3",
            "--wait",
            "--timeout",
            "120s",
        ])
        .await;
    assert!(out.contains("REVISION: 2"), "{out}");
    for (name, replicas) in [("pilotfish-xds", 5), ("pilotfish-controller", 3)] {
        let d = deployment(&cluster, name).await;
        assert_eq!(d["spec"]["replicas"], replicas, "{name}");
        assert_eq!(d["metadata"]["generation"], 2, "{name}");
        assert_eq!(d["status"]["readyReplicas"], replicas, "{name}");
    }
    // Nothing else changed: same objects, Redis untouched.
    assert_eq!(namespaced_objects(&cluster).await, default_objects());
    assert_eq!(
        deployment(&cluster, "pilotfish-redis").await["metadata"]["generation"],
        1
    );
    let history = cluster
        .helm_ok(&["history", "pilotfish", "--namespace", NAMESPACE])
        .await;
    assert!(
        history.contains("superseded") && history.contains("deployed"),
        "{history}"
    );

    let out = cluster
        .helm_ok(&[
            "uninstall",
            "pilotfish",
            "--namespace",
            NAMESPACE,
            "--wait",
            "--timeout",
            "120s",
        ])
        .await;
    assert!(out.contains("release \"pilotfish\" uninstalled"), "{out}");
    assert_eq!(namespaced_objects(&cluster).await, BTreeSet::new());
    assert_eq!(pilotfish_cluster_objects(&cluster).await, BTreeSet::new());
    // helm keeps the CRDs (and so every VirtualService in the cluster) on uninstall.
    for crd in CRDS {
        cluster.kubectl_ok(&["get", "crd", crd]).await;
    }
    let list = cluster.helm_ok(&["list", "--all-namespaces"]).await;
    assert!(!list.contains("pilotfish"), "{list}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_with_an_external_tls_redis_and_an_autoscaler() {
    let cluster = Cluster::start().await;
    let out = cluster
        .helm_ok(&[
            "install",
            "mesh",
            &chart(),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--values",
            &chart_file("ci/external-redis-tls-values.yaml"),
            "--set",
            "xds.autoscaling.enabled=true",
            "--wait",
            "--timeout",
            "120s",
        ])
        .await;
    assert!(out.contains("STATUS: deployed"), "{out}");
    // Release "mesh" does not contain the chart name: objects are prefixed mesh-pilotfish.
    assert_eq!(
        namespaced_objects(&cluster).await,
        set(&[
            "ConfigMap/mesh-pilotfish-mesh",
            "Deployment/mesh-pilotfish-controller",
            "Deployment/mesh-pilotfish-xds",
            "HorizontalPodAutoscaler/mesh-pilotfish-xds",
            "NetworkPolicy/mesh-pilotfish-controller",
            "NetworkPolicy/mesh-pilotfish-xds",
            "PodDisruptionBudget/mesh-pilotfish-controller",
            "PodDisruptionBudget/mesh-pilotfish-xds",
            "Role/mesh-pilotfish-controller-leader-election",
            "RoleBinding/mesh-pilotfish-controller-leader-election",
            "Service/mesh-pilotfish-xds",
            "ServiceAccount/mesh-pilotfish-controller",
            "ServiceAccount/mesh-pilotfish-xds",
        ])
    );
    let hpa = cluster
        .kubectl_json(&["get", "hpa", "mesh-pilotfish-xds", "-n", NAMESPACE])
        .await;
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "mesh-pilotfish-xds");
    assert_eq!(hpa["spec"]["minReplicas"], 3);

    for name in ["mesh-pilotfish-xds", "mesh-pilotfish-controller"] {
        let d = deployment(&cluster, name).await;
        assert_eq!(
            env_value(&d, "PILOTFISH_REDIS_URL"),
            "rediss://pilotfish@redis.data.svc.cluster.local:6380/2",
            "{name}"
        );
        // The password arrives as a file from the existing Secret, never as a variable.
        assert_eq!(
            env_value(&d, "PILOTFISH_REDIS_PASSWORD_FILE"),
            "/etc/pilotfish/redis-password/password"
        );
        assert!(env(&d, "PILOTFISH_REDIS_PASSWORD").is_none(), "{name}");
        assert_eq!(
            env_value(&d, "PILOTFISH_REDIS_CA_FILE"),
            "/etc/pilotfish/redis-ca/ca.crt"
        );
        // Besides the CA Secrets the xDS pods mount.
        let volumes: Vec<&Value> = d["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .filter(|v| {
                !matches!(
                    v["secret"]["secretName"].as_str(),
                    Some("cacerts" | "istio-ca-secret")
                )
            })
            .collect();
        assert_eq!(volumes[0]["secret"]["secretName"], "pilotfish-redis");
        assert_eq!(volumes[0]["secret"]["items"][0]["key"], "redis-password");
        assert_eq!(volumes[1]["secret"]["secretName"], "pilotfish-redis-ca");
        let image = d["spec"]["template"]["spec"]["containers"][0]["image"]
            .as_str()
            .unwrap_or_default();
        assert!(
            image.starts_with("registry.example.com/mesh/pilotfish-") && image.contains("@sha256:"),
            "{image}"
        );
    }
    let controller = deployment(&cluster, "mesh-pilotfish-controller").await;
    assert_eq!(
        env_value(&controller, "PILOTFISH_MESH_CONFIG"),
        "/etc/pilotfish/mesh/mesh.yaml"
    );
    let mesh = cluster
        .kubectl_json(&["get", "configmap", "mesh-pilotfish-mesh", "-n", NAMESPACE])
        .await;
    let mesh_yaml = mesh["data"]["mesh.yaml"].as_str().unwrap_or_default();
    assert!(mesh_yaml.contains("mode: REGISTRY_ONLY"), "{mesh_yaml}");
    // With the autoscaler on, the chart leaves the replica count to it.
    let xds = deployment(&cluster, "mesh-pilotfish-xds").await;
    assert_eq!(xds["metadata"]["generation"], 1);

    cluster
        .helm_ok(&["uninstall", "mesh", "--namespace", NAMESPACE, "--wait"])
        .await;
    assert_eq!(namespaced_objects(&cluster).await, BTreeSet::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_refuses_values_that_cannot_work() {
    let cluster = Cluster::start().await;
    let chart = chart();
    let cases: [(&[&str], &str); 5] = [
        (
            &["redis.bundled.enabled=false"],
            "redis.external.url is required when redis.bundled.enabled is false",
        ),
        (
            &[
                "redis.bundled.enabled=false",
                "redis.external.url=redis://:hunter2@redis:6379",
            ],
            "must not carry a password",
        ),
        (
            &[
                "redis.bundled.enabled=false",
                "redis.external.url=redis://redis:6379",
                "redis.external.tls.caSecret=ca",
            ],
            "needs a rediss:// URL",
        ),
        (
            &["redis.external.url=redis://redis:6379"],
            "set redis.bundled.enabled=false to use the external Redis",
        ),
        (
            &[
                "xds.autoscaling.enabled=true",
                "xds.autoscaling.minReplicas=5",
                "xds.autoscaling.maxReplicas=2",
            ],
            "xds.autoscaling.minReplicas (5) is above xds.autoscaling.maxReplicas (2)",
        ),
    ];
    for (values, expected) in cases {
        let mut args = vec!["template", "pilotfish", chart.as_str()];
        for v in values {
            args.extend(["--set", v]);
        }
        let out = cluster.helm(&args).await;
        assert!(!out.success, "{values:?} rendered:\n{}", out.stdout);
        assert!(
            out.stderr.contains(expected),
            "{values:?}: expected {expected:?} in: {}",
            out.stderr
        );
    }
    // Nothing of the above may reach a cluster either.
    let out = cluster
        .helm(&[
            "install",
            "pilotfish",
            &chart,
            "--set",
            "redis.bundled.enabled=false",
        ])
        .await;
    assert!(!out.success, "{}", out.stdout);
    let deployments = names(&cluster.kubectl_json(&["get", "deployments", "-A"]).await);
    assert!(deployments.is_empty(), "{deployments:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_manifests_apply_and_delete_without_helm() {
    let cluster = Cluster::start().await;
    let manifests = workspace_root().join("manifests").display().to_string();
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", &manifests])
        .await;
    assert_eq!(namespaced_objects(&cluster).await, default_objects());
    assert_eq!(
        pilotfish_cluster_objects(&cluster).await,
        set(&[
            "ClusterRole/pilotfish-controller",
            "ClusterRole/pilotfish-xds-tokenreview",
            "ClusterRoleBinding/pilotfish-controller",
            "ClusterRoleBinding/pilotfish-xds-tokenreview",
        ])
    );
    for name in ["pilotfish-controller", "pilotfish-xds", "pilotfish-redis"] {
        cluster
            .kubectl_ok(&[
                "rollout",
                "status",
                &format!("deployment/{name}"),
                "-n",
                NAMESPACE,
                "--timeout=60s",
            ])
            .await;
    }
    // Applying the same files again changes nothing.
    let again = cluster
        .kubectl_ok(&["apply", "--server-side", "-f", &manifests])
        .await;
    assert!(!again.contains("created"), "{again}");
    assert_eq!(
        deployment(&cluster, "pilotfish-xds").await["metadata"]["generation"],
        1
    );

    cluster
        .kubectl_ok(&[
            "delete",
            "-f",
            &manifests,
            "--ignore-not-found",
            "--wait=true",
        ])
        .await;
    let namespaces = names(&cluster.kubectl_json(&["get", "namespaces"]).await);
    assert!(
        !namespaces.contains("Namespace/pilotfish-system"),
        "{namespaces:?}"
    );
    assert_eq!(pilotfish_cluster_objects(&cluster).await, BTreeSet::new());
    let crds = names(&cluster.kubectl_json(&["get", "crds"]).await);
    assert!(crds.is_empty(), "{crds:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_renders_the_replace_istiod_mode() {
    let cluster = Cluster::start().await;
    let out = cluster
        .helm_ok(&[
            "template",
            "pilotfish",
            &chart(),
            "--namespace",
            "istio-system",
            "--values",
            &chart_file("ci/replace-istiod-values.yaml"),
        ])
        .await;
    let docs: Vec<Value> = out
        .split("\n---")
        .filter_map(|d| serde_saphyr::from_str::<Value>(d).ok())
        .filter(|d| d.is_object())
        .collect();
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("{kind}/{name} not rendered"))
            .clone()
    };
    let istiod = find("Service", "istiod");
    let ports: Vec<u64> = istiod["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["port"].as_u64())
        .collect();
    assert_eq!(
        ports,
        [15012, 15010],
        "the plaintext port only because the values ask"
    );
    assert_eq!(
        istiod["spec"]["selector"],
        find("Service", "pilotfish-xds")["spec"]["selector"]
    );
    let xds = find("Deployment", "pilotfish-xds");
    assert_eq!(
        env_value(&xds, "PILOTFISH_SERVING_DNS_NAMES"),
        "pilotfish-xds.istio-system.svc,pilotfish-xds.istio-system.svc.cluster.local,istiod.istio-system.svc,istiod.istio-system.svc.cluster.local,xds.example.org"
    );
    assert_eq!(env_value(&xds, "PILOTFISH_XDS_ADDR"), "0.0.0.0:15010");
    assert_eq!(env_value(&xds, "PILOTFISH_TRUST_DOMAIN"), "example.org");
    // manageCA=false: the controller neither touches Secrets nor writes ConfigMaps.
    let controller = find("Deployment", "pilotfish-controller");
    assert_eq!(env_value(&controller, "PILOTFISH_MANAGE_CA"), "false");
    assert!(
        !out.contains("istio-ca-secret\"]"),
        "no Secret rule without manageCA"
    );
    let cluster_role = find("ClusterRole", "pilotfish-controller");
    assert!(!cluster_role["rules"].to_string().contains("configmaps"));
}
