//! Pilotfish's own Istio CRDs (`crds/`) and the shared Istio YAML corpus, applied with the
//! real kubectl 1.33 to the test API server: the CRDs establish in every served version,
//! every valid document is accepted (server-side and client-side apply), and documents
//! the CRD schemas forbid are refused with the field named.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use pilotfish_mesh::api::yaml_documents;
use pilotfish_testkit::tools::workspace_root;

use crate::support::Cluster;

fn corpus_files(sub: &str) -> Vec<PathBuf> {
    let dir = workspace_root().join("mesh/tests/data/istio").join(sub);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// Namespaces the documents of `files` live in.
fn namespaces(files: &[PathBuf]) -> BTreeSet<String> {
    files
        .iter()
        .flat_map(|f| yaml_documents(&std::fs::read_to_string(f).unwrap()).unwrap())
        .filter_map(|d| {
            d.value["metadata"]["namespace"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// A copy of `file` without server-managed metadata (an exported object's
/// `resourceVersion` is a precondition a real server enforces too).
fn without_server_fields(file: &Path, into: &Path) -> PathBuf {
    let text: String = std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .filter(|l| {
            !l.trim_start().starts_with("resourceVersion:") && !l.trim_start().starts_with("uid:")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let out = into.join(file.file_name().unwrap());
    std::fs::write(&out, text).unwrap();
    out
}

#[tokio::test]
async fn the_istio_crds_and_corpus_apply_with_kubectl() {
    let cluster = Cluster::start().await;
    let crds = workspace_root().join("crds");
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()])
        .await;
    for crd in [
        "virtualservices.networking.istio.io",
        "destinationrules.networking.istio.io",
        "serviceentries.networking.istio.io",
        "sidecars.networking.istio.io",
        "peerauthentications.security.istio.io",
        "requestauthentications.security.istio.io",
        "authorizationpolicies.security.istio.io",
    ] {
        cluster
            .kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                &format!("crd/{crd}"),
                "--timeout=60s",
            ])
            .await;
    }
    let valid: Vec<PathBuf> = corpus_files("valid");
    for ns in namespaces(&valid).iter().filter(|ns| *ns != "default") {
        cluster.kubectl_ok(&["create", "namespace", ns]).await;
    }
    let scratch = tempfile::tempdir().unwrap();
    // Distinct objects: two docs tasks may define the same object (the later apply wins).
    let mut applied = BTreeSet::new();
    for (i, file) in valid.iter().enumerate() {
        let copy = without_server_fields(file, scratch.path());
        // Alternate server-side and client-side apply: both must accept Istio YAML.
        let args: Vec<&str> = if i % 2 == 0 {
            vec!["apply", "--server-side", "-f", copy.to_str().unwrap()]
        } else {
            vec!["apply", "-f", copy.to_str().unwrap()]
        };
        let out = cluster.kubectl(&args).await;
        assert!(out.success, "{}: {}", file.display(), out.stderr);
        for d in yaml_documents(&std::fs::read_to_string(file).unwrap()).unwrap() {
            let m = &d.value["metadata"];
            applied.insert((
                d.value["kind"].to_string(),
                m["namespace"].to_string(),
                m["name"].to_string(),
            ));
        }
    }
    let listed: usize = [
        "virtualservices",
        "destinationrules",
        "serviceentries",
        "sidecars",
        "peerauthentications",
        "requestauthentications",
        "authorizationpolicies",
    ]
    .into_iter()
    .map(|kind| async {
        let list = cluster.kubectl_json(&["get", kind, "-A"]).await;
        list["items"].as_array().unwrap().len()
    })
    .collect::<futures::future::JoinAll<_>>()
    .await
    .into_iter()
    .sum();
    assert_eq!(listed, applied.len(), "every corpus object is stored");
    // An object reads back as written, under every served version.
    for version in ["v1", "v1beta1", "v1alpha3"] {
        let vs = cluster
            .kubectl_json(&[
                "get",
                &format!("virtualservices.{version}.networking.istio.io"),
                "reviews",
                "-n",
                "default",
            ])
            .await;
        assert_eq!(vs["apiVersion"], format!("networking.istio.io/{version}"));
        assert!(
            vs["spec"]["http"].as_array().is_some_and(|h| !h.is_empty()),
            "{vs}"
        );
    }
}

#[tokio::test]
async fn documents_the_schemas_forbid_are_refused_with_the_field_named() {
    let cluster = Cluster::start().await;
    let crds = workspace_root().join("crds");
    cluster
        .kubectl_ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()])
        .await;
    cluster
        .kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "crd/virtualservices.networking.istio.io",
            "--timeout=60s",
        ])
        .await;
    cluster
        .kubectl_ok(&["create", "namespace", "bookinfo"])
        .await;
    let invalid = workspace_root().join("mesh/tests/data/istio/invalid-parse");
    // (file, text kubectl's error must contain)
    for (file, field) in [
        ("unknown-fields-deep.yaml", "destinaton"),
        ("wrong-type.yaml", "spec.http[0].route[0].weight"),
        ("bad-enum.yaml", "simple"),
        ("negative-port.yaml", "number"),
        ("string-match-two-kinds.yaml", "uri"),
    ] {
        let path = invalid.join(file);
        let out = cluster
            .kubectl(&["apply", "--server-side", "-f", path.to_str().unwrap()])
            .await;
        assert!(!out.success, "{file} was accepted");
        assert!(
            out.stderr.contains(field),
            "{file}: the error does not name {field:?}: {}",
            out.stderr
        );
    }
}
