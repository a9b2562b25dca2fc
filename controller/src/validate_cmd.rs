//! `pilotfish-controller validate -f FILE_OR_DIR...`: checks Istio configs offline, like
//! `istioctl validate`, with Istio's verdicts. Every error and warning is printed with its
//! object and field path. Each object is judged alone; references (subsets, hosts) are
//! checked against the objects given and never fail one (a warning). Objects of Istio kinds
//! Pilotfish does not support yet (Gateway, AuthorizationPolicy, ...) and fields it does not know are
//! warnings too. Folders are listed as the folder source lists them
//! (`pilotfish_shared::source::scan`): entries it would skip (a folder it cannot list, a
//! looping link, a FIFO) are warnings, files it cannot read are errors, and neither stops
//! the rest from being checked. Exit status 1 when there is at least one error, 0
//! otherwise.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use pilotfish_mesh::config::{ConfigError, Severity};
use pilotfish_mesh::document::{IgnoredObject, MeshObject, SourceError, parse_text, to_inputs};
use pilotfish_mesh::mesh_config::MeshConfig;
use pilotfish_mesh::push_context::{BuildInputs, build};
use pilotfish_shared::source::scan;
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
    /// Entries of the folders given that were skipped, with the reason (warnings).
    pub skipped: Vec<(PathBuf, String)>,
}

/// What the warning about an object of an unsupported kind says.
pub const NOT_SUPPORTED_YET: &str = "not supported by Pilotfish yet: ignored";

impl Report {
    pub fn error_count(&self) -> usize {
        self.source_errors.len() + self.findings.iter().filter(|f| f.is_error()).count()
    }

    pub fn warning_count(&self) -> usize {
        self.unsupported.len()
            + self.skipped.len()
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
    let mut report = Report::default();
    // (label, where to read it)
    let mut files: Vec<(PathBuf, PathBuf)> = Vec::new();
    for p in paths {
        if p.is_dir() {
            let listing = scan::list(p, &BTreeSet::new());
            files.extend(listing.files.into_iter().map(|f| (f.key, f.read_path)));
            report.skipped.extend(listing.skipped);
        } else {
            // Named explicitly: read it whatever its extension, and fail if it is missing.
            std::fs::metadata(p).with_context(|| format!("cannot read {}", p.display()))?;
            files.push((p.clone(), p.clone()));
        }
    }
    let mut objects: Vec<MeshObject> = Vec::new();
    for (file, read_path) in files {
        let text = match std::fs::read(&read_path)
            .map_err(|e| e.to_string())
            .and_then(|b| String::from_utf8(b).map_err(|e| format!("not UTF-8 text: {e}")))
        {
            Ok(text) => text,
            Err(message) => {
                report.source_errors.push(SourceError {
                    file,
                    document: None,
                    object: None,
                    message: format!("cannot read: {message}"),
                });
                continue;
            }
        };
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

/// Prints the report; returns the process exit code.
pub fn print(report: &Report, format: OutputFormat, out: &mut impl Write) -> Result<i32> {
    match format {
        OutputFormat::Text => {
            for e in &report.source_errors {
                writeln!(out, "error: {e}")?;
            }
            for (path, reason) in &report.skipped {
                writeln!(out, "warning: {}: skipped: {reason}", path.display())?;
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
            items.extend(report.skipped.iter().map(|(path, reason)| {
                json!({
                    "severity": "warning",
                    "file": path,
                    "message": format!("skipped: {reason}"),
                })
            }));
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
