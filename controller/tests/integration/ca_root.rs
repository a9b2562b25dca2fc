//! The leader's CA duties against the test API server: `istio-ca-secret` created once
//! with a self-signed root, `istio-ca-root-cert` written to every namespace (new ones
//! too, edits repaired, Kubernetes' own skipped), a plugged-in `cacerts` taking over, and
//! nothing written by a non-leader.

use std::time::{Duration, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use pilotfish_ca::bundle;
use pilotfish_controller::k8s::ca_root::{self, CaRootConfig, ROOT_CONFIGMAP, ROOT_KEY};
use pilotfish_controller::k8s::lease::Leadership;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::k8s_support::Cluster;

fn leadership(leader: bool) -> Leadership {
    Leadership {
        identity: "me".into(),
        leader,
        valid_until: leader.then(|| Instant::now() + Duration::from_secs(3600)),
        term: 1,
        holder: None,
        transitions: 0,
        epoch_floor: 0,
    }
}

async fn namespace(client: &kube::Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let _ = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
}

async fn root_in(client: &kube::Client, ns: &str) -> Option<String> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(ROOT_CONFIGMAP)
        .await
        .unwrap()
        .and_then(|c| c.data?.get(ROOT_KEY).cloned())
}

/// Polls `check` for up to 30 s.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_creates_the_ca_and_publishes_the_root_everywhere() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    for ns in ["istio-system", "bookinfo", "kube-public"] {
        namespace(&client, ns).await;
    }
    let (tx, rx) = watch::channel(leadership(false));
    let config = CaRootConfig {
        namespace: "istio-system".into(),
        trust_domain: "cluster.local".into(),
        recheck_every: Duration::from_secs(1),
    };
    let task = tokio::spawn(ca_root::run(client.clone(), config, rx));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "istio-system");
    assert!(
        secrets.get_opt("istio-ca-secret").await.unwrap().is_none(),
        "a standby writes nothing"
    );
    assert_eq!(root_in(&client, "bookinfo").await, None);

    tx.send_replace(leadership(true));
    // The leader writes the namespaces one after another: wait for both that are read.
    eventually("the root in bookinfo and istio-system", async || {
        root_in(&client, "bookinfo").await.is_some()
            && root_in(&client, "istio-system").await.is_some()
    })
    .await;
    let secret = secrets.get("istio-ca-secret").await.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("istio.io/ca-root"));
    let data = secret.data.unwrap();
    let ca_cert = String::from_utf8(data["ca-cert.pem"].0.clone()).unwrap();
    assert_eq!(root_in(&client, "bookinfo").await.unwrap(), ca_cert);
    assert_eq!(root_in(&client, "istio-system").await.unwrap(), ca_cert);
    assert_eq!(
        root_in(&client, "kube-public").await,
        None,
        "Kubernetes' own namespace"
    );
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "bookinfo")
        .get(ROOT_CONFIGMAP)
        .await
        .unwrap();
    assert_eq!(cm.metadata.labels.unwrap()["istio.io/config"], "true");

    // A new namespace gets it; an edited one is repaired.
    namespace(&client, "late").await;
    eventually("the root in a new namespace", async || {
        root_in(&client, "late").await.is_some()
    })
    .await;
    Api::<ConfigMap>::namespaced(client.clone(), "bookinfo")
        .patch(
            ROOT_CONFIGMAP,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {ROOT_KEY: "tampered"}})),
        )
        .await
        .unwrap();
    eventually("the edit repaired", async || {
        root_in(&client, "bookinfo").await.as_deref() == Some(ca_cert.as_str())
    })
    .await;

    // An operator plugs in a CA: its root is published at the next re-read.
    let (plugged, plugged_root) = plugged_ca();
    secrets
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("cacerts".into()),
                    ..Default::default()
                },
                data: Some(
                    [
                        ("ca-cert.pem", plugged.ca_cert.clone()),
                        ("ca-key.pem", plugged.ca_key.clone()),
                        ("cert-chain.pem", plugged.cert_chain.clone()),
                        ("root-cert.pem", plugged.root_cert.clone()),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v)))
                    .collect(),
                ),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    eventually("the plugged-in root", async || {
        root_in(&client, "bookinfo").await.as_deref() == Some(plugged_root.as_str())
    })
    .await;
    task.abort();
}

/// A root and an intermediate it signed, in `cacerts` layout.
fn plugged_ca() -> (pilotfish_ca::CaFiles, String) {
    let root = bundle::generate_self_signed(
        "example.org",
        Duration::from_secs(86400 * 30),
        SystemTime::now(),
    )
    .unwrap();
    // The self-signed bundle is a valid `cacerts` too (its own root): enough to show
    // that `cacerts` wins over `istio-ca-secret`.
    let root_pem = String::from_utf8(root.ca_cert.clone()).unwrap();
    (root, root_pem)
}
