//! `pilotfish-controller validate -f FILE_OR_DIR...`: checks Istio configs offline, like
//! `istioctl validate`, with Istio's verdicts. Every error and warning is printed with its
//! object and field path. Each object is judged alone; references (subsets, hosts) are
//! checked against the objects given and never fail one (a warning). Objects of Istio kinds
//! Pilotfish does not support yet (Gateway, Sidecar, ...) and fields it does not know are
//! warnings too. Exit status 1 when there is at least one error, 0 otherwise.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use pilotfish_mesh::config::{ConfigError, Severity};
use pilotfish_mesh::document::{IgnoredObject, MeshObject, SourceError, parse_text, to_inputs};
use pilotfish_mesh::mesh_config::MeshConfig;
use pilotfish_mesh::push_context::{BuildInputs, build};
use serde_json::json;

/// Output format of the command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

/// Everything validation found.
#[derive(Debug, Default)]
pub struct Report {
    pub source_errors: Vec<SourceError>,
    pub findings: Vec<ConfigError>,
    /// Where each object came from: `(kind, namespace, name)` → file.
    pub origins: BTreeMap<(String, String, String), PathBuf>,
    pub objects: usize,
    /// Objects of Istio kinds Pilotfish does not support yet, with their file (warnings).
    pub unsupported: Vec<(PathBuf, IgnoredObject)>,
}

/// What the warning about an object of an unsupported kind says.
pub const NOT_SUPPORTED_YET: &str = "not supported by Pilotfish yet: ignored";

impl Report {
    pub fn error_count(&self) -> usize {
        self.source_errors.len() + self.findings.iter().filter(|f| f.is_error()).count()
    }

    pub fn warning_count(&self) -> usize {
        self.unsupported.len()
            + self
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Warning)
                .count()
    }

    fn origin(&self, f: &ConfigError) -> Option<&PathBuf> {
        self.origins.get(&(
            f.key.kind.as_str().to_string(),
            f.key.namespace.clone(),
            f.key.name.clone(),
        ))
    }
}

/// Validates files and folders (folders recursively: `*.yaml`, `*.yml`, `*.json`).
pub fn validate_paths(paths: &[PathBuf], mesh: MeshConfig, cluster_domain: &str) -> Result<Report> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files).with_context(|| format!("cannot read {}", p.display()))?;
    }
    let mut report = Report::default();
    let mut objects: Vec<MeshObject> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let parsed = parse_text(&file, &text);
        report.source_errors.extend(parsed.errors);
        report.unsupported.extend(
            parsed
                .ignored
                .into_iter()
                .filter(|i| i.not_supported_yet)
                .map(|i| (file.clone(), i)),
        );
        for o in parsed.objects {
            let (kind, ns, name) = o.key();
            report
                .origins
                .insert((kind.to_string(), ns, name), file.clone());
            objects.push(o);
        }
    }
    report.objects = objects.len();
    let inputs = to_inputs(
        &objects,
        BuildInputs {
            mesh,
            cluster_domain: cluster_domain.to_string(),
            ..Default::default()
        },
    );
    report.findings = build(&inputs, None).findings;
    Ok(report)
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)?.collect::<Result<_, _>>()?;
        entries.sort_by_key(|e| e.path());
        for e in entries {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue;
            }
            if p.is_dir() || [".yaml", ".yml", ".json"].iter().any(|x| name.ends_with(x)) {
                collect(&p, out)?;
            }
        }
        Ok(())
    } else {
        // Named explicitly: read it whatever its extension, and fail if it is missing.
        std::fs::metadata(path)?;
        out.push(path.to_path_buf());
        Ok(())
    }
}

/// Prints the report; returns the process exit code.
pub fn print(report: &Report, format: OutputFormat, out: &mut impl Write) -> Result<i32> {
    match format {
        OutputFormat::Text => {
            for e in &report.source_errors {
                writeln!(out, "error: {e}")?;
            }
            for (file, i) in &report.unsupported {
                writeln!(
                    out,
                    "warning: {} {}/{} ({}): {NOT_SUPPORTED_YET}",
                    i.kind,
                    i.namespace,
                    i.name,
                    file.display()
                )?;
            }
            for f in &report.findings {
                let file = report
                    .origin(f)
                    .map(|p| format!(" ({})", p.display()))
                    .unwrap_or_default();
                writeln!(
                    out,
                    "{}: {}{}: {}",
                    f.severity.as_str(),
                    f.key,
                    file,
                    f.field_message()
                )?;
            }
            writeln!(
                out,
                "{} object(s) checked: {} error(s), {} warning(s)",
                report.objects,
                report.error_count(),
                report.warning_count()
            )?;
        }
        OutputFormat::Json => {
            let mut items: Vec<serde_json::Value> = report
                .source_errors
                .iter()
                .map(|e| {
                    json!({
                        "severity": "error",
                        "file": e.file,
                        "document": e.document,
                        "message": e.message,
                    })
                })
                .collect();
            items.extend(report.unsupported.iter().map(|(file, i)| {
                json!({
                    "severity": "warning",
                    "kind": i.kind,
                    "namespace": i.namespace,
                    "name": i.name,
                    "message": NOT_SUPPORTED_YET,
                    "file": file,
                    "document": i.document,
                })
            }));
            items.extend(report.findings.iter().map(|f| {
                json!({
                    "severity": f.severity.as_str(),
                    "kind": f.key.kind.as_str(),
                    "namespace": f.key.namespace,
                    "name": f.key.name,
                    "path": f.path,
                    "message": f.message,
                    "file": report.origin(f),
                })
            }));
            let doc = json!({
                "objects": report.objects,
                "errors": report.error_count(),
                "warnings": report.warning_count(),
                "findings": items,
            });
            writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        }
    }
    Ok(if report.error_count() > 0 { 1 } else { 0 })
}
