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
const NAMESPACED_KINDS: &str = "deployments,services,serviceaccounts,configmaps,secrets,poddisruptionbudgets,horizontalpodautoscalers,networkpolicies,roles,rolebindings";
const CLUSTER_KINDS: &str = "clusterroles,clusterrolebindings";
const CRDS: [&str; 7] = [
    "destinationrules.networking.istio.io",
    "serviceentries.networking.istio.io",
    "sidecars.networking.istio.io",
    "virtualservices.networking.istio.io",
    "peerauthentications.security.istio.io",
    "requestauthentications.security.istio.io",
    "authorizationpolicies.security.istio.io",
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
    .filter(|n| n != "ServiceAccount/default" && !n.starts_with("Secret/sh.helm.release."))
    .collect()
}

async fn pilotfish_cluster_objects(cluster: &Cluster) -> BTreeSet<String> {
    names(&cluster.kubectl_json(&["get", CLUSTER_KINDS]).await)
        .into_iter()
        .filter(|n| n.contains("pilotfish"))
        .collect()
}

/// A volume of a Deployment's pods, by name.
fn volume<'a>(deployment: &'a Value, name: &str) -> &'a Value {
    deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| {
            panic!(
                "volume {name} missing from {}",
                deployment["metadata"]["name"]
            )
        })
}

/// The generated secrets (Redis password, signing key) and the replicas' public key.
async fn generated_secrets(cluster: &Cluster) -> Vec<Value> {
    let mut out = Vec::new();
    for (kind, name) in [
        ("secret", "pilotfish-redis-auth"),
        ("secret", "pilotfish-snapshot-signing"),
        ("configmap", "pilotfish-snapshot-verify-keys"),
    ] {
        let object = cluster
            .kubectl_json(&["get", kind, name, "-n", NAMESPACE])
            .await;
        out.push(object["data"].clone());
    }
    out
}

async fn deployment(cluster: &Cluster, name: &str) -> Value {
    cluster
        .kubectl_json(&["get", "deployment", name, "--namespace", NAMESPACE])
        .await
}

fn default_objects() -> BTreeSet<String> {
    set(&[
        "ConfigMap/pilotfish-snapshot-verify-keys",
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
        "Secret/pilotfish-redis-auth",
        "Secret/pilotfish-snapshot-signing",
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
        .filter(|(name, _)| !name.starts_with("pilotfish-"))
        .collect();
    assert_eq!(ca_volumes, [("cacerts", true), ("istio-ca-secret", true)]);
    // The Redis password (generated at install) is required, not optional.
    assert!(
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "pilotfish-redis-auth"
                && v["secret"]["optional"].is_null()),
        "{}",
        pod["volumes"]
    );
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

    // The bundled Redis requires a generated password, which both binaries read from a
    // file; only the controller mounts the signing key; both mount the public key.
    let redis = deployment(cluster, "pilotfish-redis").await;
    let command = redis["spec"]["template"]["spec"]["containers"][0]["command"].to_string();
    for needle in ["--requirepass", "--protected-mode yes", "--maxmemory 192mb"] {
        assert!(command.contains(needle), "{needle}: {command}");
    }
    assert_eq!(
        volume(&redis, "redis-auth")["secret"]["secretName"],
        "pilotfish-redis-auth"
    );
    for d in [&controller, &xds] {
        assert_eq!(
            env_value(d, "PILOTFISH_REDIS_PASSWORD_FILE"),
            "/etc/pilotfish/redis-password/password"
        );
        assert_eq!(
            volume(d, "redis-password")["secret"]["secretName"],
            "pilotfish-redis-auth"
        );
        assert_eq!(
            env_value(d, "PILOTFISH_VERIFY_KEYS"),
            "/etc/pilotfish/verify-keys"
        );
        assert_eq!(
            volume(d, "verify-keys")["configMap"]["name"],
            "pilotfish-snapshot-verify-keys"
        );
        assert_eq!(env_value(d, "PILOTFISH_MAX_BLOB_BYTES"), "8388608");
    }
    assert_eq!(
        env_value(&controller, "PILOTFISH_SIGNING_KEY_FILE"),
        "/etc/pilotfish/signing/signing-key.pem"
    );
    assert_eq!(
        volume(&controller, "signing-key")["secret"]["secretName"],
        "pilotfish-snapshot-signing"
    );
    assert!(
        xds["spec"]["template"]["spec"]["volumes"]
            .to_string()
            .find("snapshot-signing")
            .is_none(),
        "the replicas must not see the private key"
    );
    let [password, signing, verify] = &generated_secrets(cluster).await[..] else {
        panic!("three generated objects")
    };
    assert!(password["password"].as_str().is_some_and(|p| p.len() >= 40));
    assert!(signing["signing-key.pem"].is_string());
    assert!(
        verify["current.pem"]
            .as_str()
            .is_some_and(|c| c.starts_with("-----BEGIN CERTIFICATE-----")),
        "{verify}"
    );
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
    let secrets = generated_secrets(&cluster).await;

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
    // Nothing else changed: same objects, the same generated password and keys (read back
    // with `lookup`), Redis untouched.
    assert_eq!(namespaced_objects(&cluster).await, default_objects());
    assert_eq!(generated_secrets(&cluster).await, secrets);
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
            "ConfigMap/mesh-pilotfish-snapshot-verify-keys",
            "Deployment/mesh-pilotfish-controller",
            "Deployment/mesh-pilotfish-xds",
            "HorizontalPodAutoscaler/mesh-pilotfish-xds",
            "NetworkPolicy/mesh-pilotfish-controller",
            "NetworkPolicy/mesh-pilotfish-xds",
            "PodDisruptionBudget/mesh-pilotfish-controller",
            "PodDisruptionBudget/mesh-pilotfish-xds",
            "Role/mesh-pilotfish-controller-leader-election",
            "RoleBinding/mesh-pilotfish-controller-leader-election",
            "Secret/mesh-pilotfish-snapshot-signing",
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
        let password = &volume(&d, "redis-password")["secret"];
        assert_eq!(password["secretName"], "pilotfish-redis");
        assert_eq!(password["items"][0]["key"], "redis-password");
        assert_eq!(
            volume(&d, "redis-ca")["secret"]["secretName"],
            "pilotfish-redis-ca"
        );
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
    let cases: [(&[&str], &str); 7] = [
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
        (
            &["snapshotSigning.existingSecret=my-key"],
            "snapshotSigning.existingVerifyKeysConfigMap must name the ConfigMap",
        ),
        (
            &["snapshotSigning.existingVerifyKeysConfigMap=my-keys"],
            "existingVerifyKeysConfigMap needs snapshotSigning.existingSecret",
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
    // What the manifests' header says to do first: the secrets the chart would generate.
    let keys = tempfile::tempdir().unwrap();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(keys.path())
            .output()
            .expect("run openssl");
        assert!(out.status.success(), "openssl {args:?}: {out:?}");
    };
    openssl(&[
        "genpkey",
        "-algorithm",
        "ed25519",
        "-out",
        "signing-key.pem",
    ]);
    openssl(&[
        "pkey",
        "-in",
        "signing-key.pem",
        "-pubout",
        "-out",
        "verify-key.pem",
    ]);
    let file = |name: &str| keys.path().join(name).display().to_string();
    cluster
        .kubectl_ok(&["create", "namespace", NAMESPACE])
        .await;
    for args in [
        vec![
            "create",
            "secret",
            "generic",
            "pilotfish-snapshot-signing",
            "--from-file",
        ],
        vec![
            "create",
            "configmap",
            "pilotfish-snapshot-verify-keys",
            "--from-file",
        ],
    ] {
        let from = if args[1] == "secret" {
            file("signing-key.pem")
        } else {
            file("verify-key.pem")
        };
        let mut full = args.clone();
        full.extend([from.as_str(), "-n", NAMESPACE]);
        cluster.kubectl_ok(&full).await;
    }
    cluster
        .kubectl_ok(&[
            "create",
            "secret",
            "generic",
            "pilotfish-redis-auth",
            "--from-literal=password=not-a-real-password-0123456789abcdef",
            "-n",
            NAMESPACE,
        ])
        .await;
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

/// A cluster that already runs Istio: its CRDs (here Pilotfish's with one field more and
/// Istio's labels, as a newer Istio's look) and an object using that field. Writes the
/// CRDs and the object to `dir` and applies them as Istio's installer would.
async fn install_istio_like_crds(cluster: &Cluster, dir: &std::path::Path) {
    let mut crds = pilotfish_mesh::api::crd::crds();
    for crd in &mut crds {
        crd.metadata.labels = Some([("app".to_string(), "istio-pilot".to_string())].into());
        for version in &mut crd.spec.versions {
            let props = version
                .schema
                .as_mut()
                .and_then(|s| s.open_api_v3_schema.as_mut())
                .expect("schema");
            let mut value = serde_json::to_value(&*props).unwrap();
            value["properties"]["spec"]["properties"]["futureField"] =
                serde_json::json!({"type": "string"});
            *props = serde_json::from_value(value).unwrap();
        }
    }
    let path = dir.join("istio-crds.json");
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": crds});
    std::fs::write(&path, list.to_string()).unwrap();
    cluster
        .kubectl_ok(&[
            "apply",
            "--server-side",
            "--field-manager=istio-installer",
            "-f",
            path.to_str().unwrap(),
        ])
        .await;
    for crd in CRDS {
        cluster
            .kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                &format!("crd/{crd}"),
                "--timeout=60s",
            ])
            .await;
    }
    let vs = dir.join("vs.yaml");
    std::fs::write(
        &vs,
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\nspec:\n  futureField: kept\n  hosts: [reviews]\n  http: [{route: [{destination: {host: reviews}}]}]\n",
    )
    .unwrap();
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", vs.to_str().unwrap()])
        .await;
}

/// Istio's CRDs and the objects using their newer fields are as they were.
async fn assert_istio_crds_untouched(cluster: &Cluster) {
    for crd in CRDS {
        let got = cluster.kubectl_json(&["get", "crd", crd]).await;
        assert_eq!(got["metadata"]["labels"]["app"], "istio-pilot", "{crd}");
        for version in got["spec"]["versions"].as_array().unwrap() {
            assert_eq!(
                version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["futureField"]
                    ["type"],
                "string",
                "{crd} {}",
                version["name"]
            );
        }
    }
    let vs = cluster
        .kubectl_json(&["get", "virtualservice", "reviews", "-n", "default"])
        .await;
    assert_eq!(vs["spec"]["futureField"], "kept", "{vs}");
}

/// With Istio's (possibly newer) CRDs installed, neither the chart nor the plain
/// manifests for such clusters change them. Helm 4 applies a chart's `crds/` with
/// server-side apply on install: over CRDs another manager owns that is a field conflict,
/// and the install stops before changing anything; `--skip-crds` installs the rest, and
/// upgrades and uninstall never touch `crds/`. `manifests/pilotfish.yaml` holds no CRD
/// (they are in `manifests/crds.yaml`, for clusters without Istio).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istios_own_crds_are_left_alone() {
    let scratch = tempfile::tempdir().unwrap();
    let cluster = Cluster::start().await;
    install_istio_like_crds(&cluster, scratch.path()).await;
    let chart = chart();
    let install = |extra: &'static [&'static str]| {
        let mut args = vec![
            "install",
            "pilotfish",
            chart.as_str(),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--wait",
            "--timeout",
            "120s",
        ];
        args.extend_from_slice(extra);
        args
    };
    let refused = cluster.helm(&install(&[])).await;
    assert!(!refused.success, "{}", refused.stdout);
    assert!(refused.stderr.contains("conflict"), "{}", refused.stderr);
    assert_istio_crds_untouched(&cluster).await;

    cluster.helm_ok(&install(&["--skip-crds"])).await;
    assert_istio_crds_untouched(&cluster).await;
    assert_eq!(namespaced_objects(&cluster).await, default_objects());
    cluster
        .helm_ok(&[
            "upgrade",
            "pilotfish",
            &chart,
            "--namespace",
            NAMESPACE,
            "--set",
            "xds.replicas=4",
            "--wait",
            "--timeout",
            "120s",
        ])
        .await;
    assert_istio_crds_untouched(&cluster).await;
    cluster
        .helm_ok(&["uninstall", "pilotfish", "--namespace", NAMESPACE, "--wait"])
        .await;
    assert_istio_crds_untouched(&cluster).await;

    let cluster = Cluster::start().await;
    install_istio_like_crds(&cluster, scratch.path()).await;
    let manifests = workspace_root().join("manifests/pilotfish.yaml");
    let out = cluster
        .kubectl_ok(&["apply", "--server-side", "-f", manifests.to_str().unwrap()])
        .await;
    assert!(!out.contains("customresourcedefinition"), "{out}");
    assert_istio_crds_untouched(&cluster).await;
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
