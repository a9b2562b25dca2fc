//! Semantic validation corpora: every file under `data/istio/invalid/`,
//! `data/istio/schema-only/` and `data/istio/warnings/` states, in `# expect:` header lines, the exact findings the
//! builder must report (other warnings, such as unknown hosts, are allowed; other errors
//! are not). The realistic corpus under `data/istio/valid/` must build without errors.

use std::path::{Path, PathBuf};

use pilotfish_mesh::config::Severity;
use pilotfish_mesh::document::{parse_text, to_inputs};
use pilotfish_mesh::push_context::{BuildInputs, build};

fn data_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/istio")
        .join(sub)
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn inputs_of(files: &[PathBuf]) -> BuildInputs {
    let mut objects = Vec::new();
    for f in files {
        let parsed = parse_text(f, &std::fs::read_to_string(f).unwrap());
        assert!(
            parsed.errors.is_empty(),
            "{}: {:?}",
            f.display(),
            parsed.errors
        );
        objects.extend(parsed.objects);
    }
    to_inputs(
        &objects,
        BuildInputs {
            cluster_domain: "cluster.local".into(),
            ..Default::default()
        },
    )
}

fn check_expectations(subs: &[&str], expected_severity: Severity) {
    let files: Vec<PathBuf> = subs
        .iter()
        .flat_map(|sub| yaml_files(&data_dir(sub)))
        .collect();
    assert!(files.len() >= 5, "corpus {subs:?} is missing");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expected: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: "))
            .collect();
        assert!(
            !expected.is_empty(),
            "{} has no `# expect:` line",
            file.display()
        );
        let out = build(&inputs_of(std::slice::from_ref(&file)), None);
        let found: Vec<String> = out.findings.iter().map(|f| f.to_string()).collect();
        for e in &expected {
            assert!(
                found.iter().any(|f| f == e),
                "{}: expected\n  {e}\nfound\n  {}",
                file.display(),
                found.join("\n  ")
            );
        }
        let unexpected: Vec<&String> = out
            .findings
            .iter()
            .zip(&found)
            .filter(|(f, text)| f.is_error() && !expected.contains(&text.as_str()))
            .map(|(_, text)| text)
            .collect();
        assert!(
            unexpected.is_empty(),
            "{}: unexpected errors {unexpected:?}",
            file.display()
        );
        if expected_severity == Severity::Warning {
            assert!(
                out.errors().next().is_none(),
                "{}: {:?}",
                file.display(),
                found
            );
        }
    }
}

#[test]
fn invalid_corpus_reports_the_expected_errors() {
    check_expectations(&["invalid", "schema-only"], Severity::Error);
}

#[test]
fn warning_corpus_reports_the_expected_warnings_and_no_errors() {
    check_expectations(&["warnings"], Severity::Warning);
}

#[test]
fn realistic_corpus_builds_without_errors() {
    let files = yaml_files(&data_dir("valid"));
    assert!(!files.is_empty());
    let out = build(&inputs_of(&files), None);
    let errors: Vec<String> = out.errors().map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(out.context.authorization_policies().len(), 3);
    assert!(!out.context.virtual_services().is_empty());
    assert!(!out.context.destination_rules().is_empty());
}
