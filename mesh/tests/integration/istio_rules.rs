//! Istio's validation rules as a table (`tests/data/istio-rules.yaml`): every rule Istio
//! 1.30.3 applies to VirtualServices, DestinationRules, ServiceEntries,
//! PeerAuthentications, Sidecars and RequestAuthentications — the webhook's
//! and the CRD schema's — is a case citing that rule, with Istio's verdict as the expected
//! value. Each case runs through Pilotfish's validator for its kind, alone (as Istio judges
//! it), and must get the same verdict, naming the cited field.

use std::path::Path;

use pilotfish_mesh::api::{
    AuthorizationPolicy, DestinationRule, IstioResource, PeerAuthentication, RequestAuthentication,
    ServiceEntry, Sidecar, VirtualService,
};
use pilotfish_mesh::config::{ConfigError, Severity};
use pilotfish_mesh::push_context::{
    validate_authorization_policy, validate_destination_rule, validate_peer_authentication,
    validate_request_authentication, validate_service_entry, validate_sidecar,
    validate_virtual_service,
};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    /// Where the rule is in Istio (documentation for the reader; required).
    istio: String,
    kind: String,
    #[serde(default)]
    metadata: Option<Value>,
    spec: Value,
    verdict: Verdict,
    /// The field the error or warning must name.
    #[serde(default)]
    path: Option<String>,
}

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Error,
    Warning,
    Accepted,
}

fn cases() -> Vec<Case> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/istio-rules.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The object of a case: its spec under `apiVersion`/`kind`, named `t` in `ns1`.
fn object(case: &Case) -> Value {
    let mut metadata = json!({"name": "t", "namespace": "ns1"});
    if let Some(Value::Object(extra)) = &case.metadata {
        for (k, v) in extra {
            metadata[k] = v.clone();
        }
    }
    let group = if matches!(
        case.kind.as_str(),
        "PeerAuthentication" | "RequestAuthentication" | "AuthorizationPolicy"
    ) {
        "security.istio.io"
    } else {
        "networking.istio.io"
    };
    json!({
        "apiVersion": format!("{group}/v1"),
        "kind": case.kind,
        "metadata": metadata,
        "spec": case.spec,
    })
}

fn findings(case: &Case) -> Vec<ConfigError> {
    let parsed = IstioResource::parse_strict(&object(case))
        .unwrap_or_else(|e| panic!("{}: does not parse: {e}", case.name))
        .unwrap_or_else(|| panic!("{}: not an Istio kind", case.name));
    let domain = "cluster.local";
    match parsed {
        IstioResource::VirtualService(vs) => {
            validate_virtual_service(&VirtualService::clone(&vs), domain).findings
        }
        IstioResource::DestinationRule(dr) => {
            validate_destination_rule(&DestinationRule::clone(&dr), domain).findings
        }
        IstioResource::ServiceEntry(se) => {
            validate_service_entry(&ServiceEntry::clone(&se), domain).findings
        }
        IstioResource::PeerAuthentication(pa) => {
            validate_peer_authentication(&PeerAuthentication::clone(&pa)).findings
        }
        IstioResource::Sidecar(sc) => validate_sidecar(&Sidecar::clone(&sc)).findings,
        IstioResource::RequestAuthentication(ra) => {
            validate_request_authentication(&RequestAuthentication::clone(&ra)).findings
        }
        IstioResource::AuthorizationPolicy(ap) => {
            validate_authorization_policy(&AuthorizationPolicy::clone(&ap)).findings
        }
    }
}

fn verdict_of(findings: &[ConfigError]) -> Verdict {
    if findings.iter().any(ConfigError::is_error) {
        Verdict::Error
    } else if findings.is_empty() {
        Verdict::Accepted
    } else {
        Verdict::Warning
    }
}

#[test]
fn pilotfish_gives_istios_verdict_for_every_rule() {
    let cases = cases();
    assert!(
        cases.len() >= 150,
        "the table shrank to {} cases",
        cases.len()
    );
    let mut names = std::collections::BTreeSet::new();
    let mut failures = Vec::new();
    for case in &cases {
        assert!(
            names.insert(case.name.as_str()),
            "duplicate case {:?}",
            case.name
        );
        assert!(!case.istio.trim().is_empty(), "{}: no citation", case.name);
        assert_eq!(
            case.path.is_some(),
            case.verdict != Verdict::Accepted,
            "{}: a path is given exactly for errors and warnings",
            case.name
        );
        let found = findings(case);
        let got = verdict_of(&found);
        let wanted_severity = match case.verdict {
            Verdict::Error => Some(Severity::Error),
            Verdict::Warning => Some(Severity::Warning),
            Verdict::Accepted => None,
        };
        let names_path = match (&case.path, wanted_severity) {
            (Some(path), Some(severity)) => found
                .iter()
                .any(|f| f.severity == severity && &f.path == path),
            _ => true,
        };
        if got != case.verdict || !names_path {
            failures.push(format!(
                "{} ({}): Istio says {:?}{}, Pilotfish says {:?}:\n    {}",
                case.name,
                case.istio,
                case.verdict,
                case.path
                    .as_deref()
                    .map(|p| format!(" at {p}"))
                    .unwrap_or_default(),
                got,
                found
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n    ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_table_covers_each_kind_and_verdict() {
    let cases = cases();
    for kind in ["VirtualService", "DestinationRule", "ServiceEntry"] {
        for verdict in [Verdict::Error, Verdict::Warning, Verdict::Accepted] {
            assert!(
                cases.iter().any(|c| c.kind == kind && c.verdict == verdict),
                "no {kind} case with verdict {verdict:?}"
            );
        }
    }
}
