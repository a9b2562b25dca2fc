//! `pilotfish-controller validate` as a user runs it: the real binary on the shared corpus.

use std::path::{Path, PathBuf};
use std::process::Command;

fn corpus(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../mesh/tests/data/istio")
        .join(sub)
}

fn validate(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pilotfish-controller"))
        .arg("validate")
        .args(args)
        .output()
        .expect("run pilotfish-controller");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn valid_corpus_passes_with_exit_status_zero() {
    let dir = corpus("valid");
    let (code, out) = validate(&["-f", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(" 0 error(s)"), "{out}");
}

#[test]
fn errors_print_object_field_and_file_and_exit_one() {
    let file = corpus("invalid/negative-weight.yaml");
    let (code, out) = validate(&["-f", file.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("error:"))
        .expect("an error line");
    assert!(line.contains("VirtualService bookinfo/reviews"), "{line}");
    assert!(line.contains("negative-weight.yaml"), "{line}");
    assert!(
        line.ends_with("spec.http[0].route[1].weight: weight must not be negative (got -10)"),
        "{line}"
    );
}

#[test]
fn warnings_alone_exit_zero_and_json_is_machine_readable() {
    let file = corpus("warnings/istio-mutual.yaml");
    let (code, out) = validate(&["-f", file.to_str().unwrap(), "-o", "json"]);
    assert_eq!(code, 0, "{out}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON output");
    assert_eq!(doc["errors"], 0);
    assert_eq!(doc["warnings"], 1);
    let f = &doc["findings"][0];
    assert_eq!(f["kind"], "DestinationRule");
    assert_eq!(f["path"], "spec.trafficPolicy.tls.mode");
    assert_eq!(f["severity"], "warning");
}

#[test]
fn parse_errors_are_reported_with_file_and_document() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a}\nspec:\n  host: a\n  subsets: [{name: v1, lables: {version: v1}}]\n",
    )
    .unwrap();
    let (code, out) = validate(&["-f", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("typo.yaml: document 1:"), "{out}");
    assert!(out.contains("spec.subsets[0].lables"), "{out}");
}

#[test]
fn a_missing_file_is_a_usage_error() {
    let (code, _) = validate(&["-f", "/nonexistent/pilotfish.yaml"]);
    assert_eq!(code, 2);
}
