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
    let file = corpus("warnings/unreachable-route.yaml");
    let (code, out) = validate(&["-f", file.to_str().unwrap(), "-o", "json"]);
    assert_eq!(code, 0, "{out}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON output");
    assert_eq!(doc["errors"], 0);
    // The unreachable route, and the destination host no Service of this one file
    // defines, once per route.
    assert_eq!(doc["warnings"], 3);
    let findings = doc["findings"].as_array().expect("findings");
    let f = findings
        .iter()
        .find(|f| f["path"] == "spec.http[1]")
        .expect("the unreachable route's finding");
    assert_eq!(f["kind"], "VirtualService");
    assert_eq!(f["name"], "ratings");
    assert_eq!(f["severity"], "warning");
    assert!(findings.iter().all(|f| f["severity"] == "warning"));
}

#[test]
fn parse_errors_are_reported_with_file_and_document() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.yaml");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a}\nspec:\n  host: a\n  subsets: [{name: v1, labels: [version]}]\n",
    )
    .unwrap();
    let (code, out) = validate(&["-f", dir.path().to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("typo.yaml: document 1:"), "{out}");
    assert!(out.contains("spec.subsets[0].labels"), "{out}");
}

/// A folder as found on a mounted volume: entries the folder source skips (a folder it
/// cannot list, a link that loops, a FIFO named `*.yaml`) are warnings naming the entry;
/// a file that cannot be read is an error; the rest is checked all the same.
#[test]
fn unusable_entries_of_a_folder_are_reported_and_the_rest_checked() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(
        root.join("svc.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{name: http, port: 80}]}\n",
    )
    .unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();
    std::os::unix::fs::symlink("..", root.join("sub/up")).unwrap();
    std::os::unix::fs::symlink("loop.yaml", root.join("loop.yaml")).unwrap();
    let fifo = Command::new("mkfifo").arg(root.join("pipe.yaml")).status();
    assert!(fifo.is_ok_and(|s| s.success()));
    std::fs::write(root.join("binary.yaml"), [0xff, 0xfe, 0x00]).unwrap();
    let (code, out) = validate(&["-f", root.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    for expected in [
        "warning: ",
        "loop.yaml: skipped: ",
        "pipe.yaml: skipped: not a regular file",
        "sub/up: skipped: a link back to a folder already read (a loop)",
        "binary.yaml: cannot read: not UTF-8 text",
        "1 object(s) checked: 1 error(s), 3 warning(s)",
    ] {
        assert!(out.contains(expected), "{expected:?} missing in:\n{out}");
    }
}

/// A field Pilotfish does not know (a newer Istio's, or a typo) is a warning naming it;
/// the object is validated and used all the same.
#[test]
fn unknown_fields_are_warnings_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("newer.yaml");
    std::fs::write(
        &file,
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a}\nspec:\n  host: a\n  subsets: [{name: v1, lables: {version: v1}}]\n",
    )
    .unwrap();
    let (code, out) = validate(&["-f", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("spec.subsets[0].lables"))
        .unwrap_or_else(|| panic!("no line names the field:\n{out}"));
    assert!(
        line.starts_with("warning: DestinationRule default/a"),
        "{line}"
    );
    assert!(line.contains("unknown field"), "{line}");
}

/// Istio's sample layout — a Gateway and the VirtualService bound to it in one file —
/// beside a Sidecar and an AuthorizationPolicy: valid Istio configuration, so exit 0; the
/// kind Pilotfish does not support yet (Gateway) is a warning, the Sidecar and the
/// AuthorizationPolicy are checked like the VirtualService.
#[test]
fn unsupported_istio_kinds_are_warnings_not_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gateway.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: bookinfo-gateway}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]\n---\napiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: bookinfo}\nspec:\n  hosts: ['*']\n  gateways: [bookinfo-gateway]\n  http: [{route: [{destination: {host: productpage, port: {number: 9080}}}]}]\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("policy.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default}\nspec: {egress: [{hosts: ['./*']}]}\n---\napiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny-all}\nspec: {}\n",
    )
    .unwrap();
    let (code, out) = validate(&["-f", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    let kind = "networking.istio.io/v1/Gateway default/bookinfo-gateway";
    assert!(
        out.lines().any(|l| l.starts_with("warning: ")
            && l.contains(kind)
            && l.ends_with("not supported by Pilotfish yet: ignored")),
        "{kind}:\n{out}"
    );
    assert!(
        !out.contains("AuthorizationPolicy default/deny-all"),
        "{out}"
    );
    assert!(out.contains("3 object(s) checked: 0 error(s)"), "{out}");
}

/// A CUSTOM AuthorizationPolicy is refused with the reason, naming the field.
#[test]
fn custom_authorization_policy_is_refused_clearly() {
    let file = corpus("invalid/ap-custom.yaml");
    let (code, out) = validate(&["-f", file.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.lines().any(
            |l| l.starts_with("error: AuthorizationPolicy istio-system/ext-authz")
                && l.contains("spec.action: CUSTOM (ext_authz) is not supported by Pilotfish")
        ),
        "{out}"
    );
}

/// Istio validates each object alone: a VirtualService whose subsets are defined in a
/// DestinationRule of another file is valid on its own (a warning says the subset is not
/// among the objects given).
#[test]
fn a_virtual_service_whose_subsets_live_elsewhere_validates_alone() {
    let file = corpus("valid/request-routing.yaml");
    let (code, out) = validate(&["-f", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("warning:") && l.contains(".subset: subset")),
        "{out}"
    );
}

#[test]
fn a_missing_file_is_a_usage_error() {
    let (code, _) = validate(&["-f", "/nonexistent/pilotfish.yaml"]);
    assert_eq!(code, 2);
}

#[test]
fn peer_authentication_errors_name_the_field() {
    let file = corpus("invalid/pa-port-level-without-selector.yaml");
    let (code, out) = validate(&["-f", file.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("error:"))
        .expect("an error line");
    assert!(
        line.contains("PeerAuthentication bookinfo/default"),
        "{line}"
    );
    assert!(
        line.contains("spec.portLevelMtls: port-level mTLS needs"),
        "{line}"
    );
}

/// RequestAuthentication is validated, not reported unsupported: a jwksUri without a
/// scheme is an error naming the rule's field.
#[test]
fn request_authentication_errors_name_the_field() {
    let file = corpus("invalid/ra-jwks-uri-without-scheme.yaml");
    let (code, out) = validate(&["-f", file.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    let line = out
        .lines()
        .find(|l| l.starts_with("error:"))
        .expect("an error line");
    assert!(
        line.contains("RequestAuthentication bookinfo/tokens")
            && line.contains("spec.jwtRules[0].jwksUri"),
        "{line}"
    );
    assert!(!out.contains("not supported by Pilotfish yet"), "{out}");
}
