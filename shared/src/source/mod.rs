//! A folder of Kubernetes-style YAML files as a mesh source (standalone mode and the
//! controller's `--config-dir` mode). Parsing is `pilotfish_mesh::document`; this module
//! keeps what was read, decides what to re-read, and reports each problem once.
//!
//! - Each document stands alone. A document that does not parse is reported with the file,
//!   its index and the reason; the object it described keeps its last good version if it
//!   had one, and the file's other documents are used as they are now. Only a file that
//!   cannot be read or is not valid YAML as a whole keeps its last good content entirely.
//! - Documents of kinds Pilotfish does not read are skipped; each such kind is reported
//!   once (log, and `pilotfish_source_ignored_objects{kind}`), the Istio kinds it does not
//!   support yet (Gateway, Sidecar, AuthorizationPolicy, ...) as warnings.
//! - A file whose size and times are unchanged is not read again, so a rescan of a quiet
//!   folder reads nothing ([`watch`] also drops the events the source's own reads cause).
//! - A removed file removes its objects.

pub mod metrics;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use pilotfish_mesh::document::{
    IgnoredObject, MeshObject, ParsedFile, SourceError, parse_text, to_inputs,
};
use pilotfish_mesh::push_context::BuildInputs;

pub use watch::watch_dir;

/// What identifies a file's content without reading it: size, modification and change
/// times, and (on Unix) the inode, which a rename-into-place (editors, ConfigMap volume
/// swaps) changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    changed: (i64, i64),
    inode: (u64, u64),
}

impl FileStamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        #[cfg(unix)]
        let (changed, inode) = {
            use std::os::unix::fs::MetadataExt;
            ((meta.ctime(), meta.ctime_nsec()), (meta.dev(), meta.ino()))
        };
        #[cfg(not(unix))]
        let (changed, inode) = ((0, 0), (0, 0));
        FileStamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            changed,
            inode,
        }
    }
}

#[derive(Debug, Default)]
struct FileState {
    /// The stamp of the content last read; an equal stamp skips reading the file.
    stamp: Option<FileStamp>,
    /// Hash of the bytes last read, so content rewritten unchanged is not re-parsed.
    content_hash: [u8; 32],
    /// The objects in use: the file's good documents, plus the last good version of the
    /// objects whose document is broken now.
    good: Vec<MeshObject>,
    /// Documents of kinds Pilotfish does not read.
    ignored: Vec<IgnoredObject>,
    /// Errors of the current content (empty when it parsed).
    errors: Vec<SourceError>,
}

/// A problem found by a rescan, with what is used instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewError {
    pub error: SourceError,
    /// A last good version (of the object, or of the whole file) stays in use.
    pub last_good_kept: bool,
}

/// A kind of object the folder holds and Pilotfish does not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IgnoredKind {
    /// `apiVersion/kind`.
    pub kind: String,
    /// Istio reads it; Pilotfish does not support it yet.
    pub not_supported_yet: bool,
}

/// What a rescan found.
#[derive(Debug, Default, PartialEq)]
pub struct RescanReport {
    /// The set of good objects changed: a rebuild is due.
    pub changed: bool,
    /// Errors in files that changed during this scan (each reported once).
    pub new_errors: Vec<NewError>,
    /// Kinds seen for the first time that Pilotfish does not read (reported once).
    pub new_ignored_kinds: Vec<IgnoredKind>,
    /// Files read from disk in this scan (those whose stamp changed).
    pub files_read: usize,
}

impl RescanReport {
    /// Logs what is new: each error with what stays in use, each ignored kind once.
    pub fn log(&self) {
        for e in &self.new_errors {
            if e.last_good_kept {
                tracing::warn!("{} (its last good version stays in use)", e.error);
            } else {
                tracing::warn!("{} (left out: there is no earlier good version)", e.error);
            }
        }
        for k in &self.new_ignored_kinds {
            if k.not_supported_yet {
                tracing::warn!(kind = %k.kind, "objects of this kind are not supported by Pilotfish yet: ignored");
            } else {
                tracing::info!(kind = %k.kind, "ignoring objects of a kind Pilotfish does not read");
            }
        }
    }
}

/// A folder of Kubernetes-style YAML files (`*.yaml`, `*.yml`, `*.json`, recursively;
/// hidden files and folders, such as editor swap files, are skipped).
#[derive(Debug)]
pub struct DirSource {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    seen_ignored_kinds: BTreeSet<String>,
}

impl DirSource {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirSource {
            root: root.into(),
            files: BTreeMap::new(),
            seen_ignored_kinds: BTreeSet::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Re-reads the folder (only files whose stamp changed). Fails only when the folder
    /// itself cannot be listed.
    pub fn rescan(&mut self) -> io::Result<RescanReport> {
        let mut paths = Vec::new();
        collect_files(&self.root, &mut paths)?;
        paths.sort();
        let mut report = RescanReport::default();
        let present: BTreeSet<&PathBuf> = paths.iter().collect();
        let before = self.files.len();
        self.files.retain(|p, _| present.contains(p));
        if self.files.len() != before {
            report.changed = true;
        }
        for path in &paths {
            self.rescan_file(path, &mut report);
        }
        self.update_metrics();
        Ok(report)
    }

    fn rescan_file(&mut self, path: &Path, report: &mut RescanReport) {
        let label = self.relative(path);
        let stamp = std::fs::metadata(path).ok().map(|m| FileStamp::of(&m));
        if stamp.is_some() && self.files.get(path).is_some_and(|s| s.stamp == stamp) {
            return;
        }
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            // Vanished between listing and reading: the next scan removes it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) => {
                let err = SourceError {
                    file: label,
                    document: None,
                    object: None,
                    message: format!("cannot read: {e}"),
                };
                let state = self.files.entry(path.to_path_buf()).or_default();
                if state.errors != [err.clone()] {
                    report.new_errors.push(NewError {
                        error: err.clone(),
                        last_good_kept: !state.good.is_empty(),
                    });
                    state.errors = vec![err];
                }
                return;
            }
        };
        report.files_read += 1;
        metrics::FILE_READS.inc();
        let hash: [u8; 32] = Sha256::digest(&bytes).into();
        let state = self.files.entry(path.to_path_buf()).or_default();
        if state.stamp.is_some() && state.content_hash == hash {
            state.stamp = stamp;
            return;
        }
        let parsed = match std::str::from_utf8(&bytes) {
            Ok(text) => parse_text(&label, text),
            Err(e) => ParsedFile {
                errors: vec![SourceError {
                    file: label,
                    document: None,
                    object: None,
                    message: format!("not UTF-8 text: {e}"),
                }],
                ..Default::default()
            },
        };
        state.stamp = stamp;
        state.content_hash = hash;
        apply_parsed(state, parsed, report);
        for ignored in &state.ignored {
            if self.seen_ignored_kinds.insert(ignored.kind.clone()) {
                report.new_ignored_kinds.push(IgnoredKind {
                    kind: ignored.kind.clone(),
                    not_supported_yet: ignored.not_supported_yet,
                });
            }
        }
    }

    /// Current problems, file by file (broken documents serve their last good version).
    pub fn errors(&self) -> Vec<SourceError> {
        self.files
            .values()
            .flat_map(|s| s.errors.iter().cloned())
            .collect()
    }

    /// Good objects of every file, in path order.
    pub fn objects(&self) -> impl Iterator<Item = &MeshObject> {
        self.files.values().flat_map(|s| s.good.iter())
    }

    /// Objects of kinds Pilotfish does not read, in path order.
    pub fn ignored(&self) -> impl Iterator<Item = &IgnoredObject> {
        self.files.values().flat_map(|s| s.ignored.iter())
    }

    /// Builder inputs: `base` (mesh config, domain) plus every good object.
    pub fn inputs(&self, base: BuildInputs) -> BuildInputs {
        to_inputs(self.objects(), base)
    }

    fn update_metrics(&self) {
        let mut counts: BTreeMap<&str, i64> = self
            .seen_ignored_kinds
            .iter()
            .map(|k| (k.as_str(), 0))
            .collect();
        for ignored in self.ignored() {
            *counts.entry(ignored.kind.as_str()).or_default() += 1;
        }
        for (kind, n) in counts {
            metrics::IGNORED_OBJECTS.with_label_values(&[kind]).set(n);
        }
        metrics::INVALID_DOCUMENTS.set(self.errors().len() as i64);
    }

    fn relative(&self, path: &Path) -> PathBuf {
        path.strip_prefix(&self.root)
            .map(Path::to_path_buf)
            .unwrap_or_else(|_| path.to_path_buf())
    }
}

/// Takes the new content of a file into its state: every good document as it is now, and
/// for each broken document the last good version of its object (if there was one); a
/// file broken as a whole keeps everything it had.
fn apply_parsed(state: &mut FileState, parsed: ParsedFile, report: &mut RescanReport) {
    let whole_file_broken = parsed.errors.iter().any(|e| e.document.is_none());
    let mut good = if whole_file_broken {
        state.good.clone()
    } else {
        parsed.objects
    };
    let mut kept = Vec::with_capacity(parsed.errors.len());
    for e in &parsed.errors {
        let previous = match (&e.object, whole_file_broken) {
            (_, true) => !state.good.is_empty(),
            (None, false) => false,
            (Some(name), false) => {
                let already = good.iter().any(|o| &o.name() == name);
                match state.good.iter().find(|o| &o.name() == name) {
                    Some(last) if !already => {
                        good.push(last.clone());
                        true
                    }
                    _ => already,
                }
            }
        };
        kept.push(previous);
    }
    if !whole_file_broken {
        state.ignored = parsed.ignored;
    }
    if parsed.errors != state.errors {
        report.new_errors.extend(
            parsed
                .errors
                .iter()
                .zip(&kept)
                .filter(|(e, _)| !state.errors.contains(e))
                .map(|(e, kept)| NewError {
                    error: e.clone(),
                    last_good_kept: *kept,
                }),
        );
        state.errors = parsed.errors;
    }
    if state.good != good {
        state.good = good;
        report.changed = true;
    }
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks, as ConfigMap volumes need (`..data` links).
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            collect_files(&path, out)?;
        } else if [".yaml", ".yml", ".json"]
            .iter()
            .any(|ext| name.ends_with(ext))
        {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{name: http, port: 80}]}\n";

    /// Writes `text` so that the file's stamp surely changes (a new inode), even within
    /// the file system's time granularity.
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp-write");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn keeps_last_good_content_of_a_broken_file_and_forgets_removed_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("svc.yaml");
        std::fs::write(&file, SVC).unwrap();
        std::fs::write(dir.path().join(".svc.yaml.swp"), "garbage: [").unwrap();
        let mut src = DirSource::new(dir.path());
        let r = src.rescan().unwrap();
        assert!(r.changed && r.new_errors.is_empty());
        assert_eq!(src.objects().count(), 1);

        // Unchanged: nothing to do, nothing read.
        assert_eq!(src.rescan().unwrap(), RescanReport::default());

        replace(&file, "apiVersion: v1\nkind: Service\nmetadata: {name: a\n");
        let r = src.rescan().unwrap();
        assert!(!r.changed);
        assert_eq!(r.files_read, 1);
        assert_eq!(r.new_errors.len(), 1);
        assert_eq!(r.new_errors[0].error.file, PathBuf::from("svc.yaml"));
        assert!(r.new_errors[0].last_good_kept);
        assert_eq!(src.objects().count(), 1, "last good content is kept");
        assert_eq!(src.errors().len(), 1);

        std::fs::remove_file(&file).unwrap();
        let r = src.rescan().unwrap();
        assert!(r.changed);
        assert_eq!(src.objects().count(), 0);
        assert!(src.errors().is_empty());
    }

    #[test]
    fn a_broken_file_at_first_load_keeps_nothing_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.yaml"), "kind: [unclosed\n").unwrap();
        let mut src = DirSource::new(dir.path());
        let r = src.rescan().unwrap();
        assert_eq!(r.new_errors.len(), 1);
        assert!(!r.new_errors[0].last_good_kept);
    }

    const VS: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r, namespace: ns}\nspec:\n  hosts: [r]\n  http: [{route: [{destination: {host: r}, weight: WEIGHT}]}]\n";

    /// A broken document keeps its object's last good version; the file's other
    /// documents are read as they are now.
    #[test]
    fn each_document_stands_alone() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mesh.yaml");
        let svc = |name: &str| SVC.replace("name: a", &format!("name: {name}"));
        std::fs::write(
            &file,
            format!("{}---\n{}", svc("a"), VS.replace("WEIGHT", "100")),
        )
        .unwrap();
        let mut src = DirSource::new(dir.path());
        src.rescan().unwrap();
        assert_eq!(src.objects().count(), 2);

        // The VirtualService breaks (a weight that is not a number) and the Service is
        // renamed in the same edit.
        replace(
            &file,
            &format!("{}---\n{}", svc("b"), VS.replace("WEIGHT", "lots")),
        );
        let r = src.rescan().unwrap();
        assert!(r.changed);
        assert_eq!(r.new_errors.len(), 1);
        assert!(r.new_errors[0].last_good_kept);
        let names: Vec<_> = src.objects().map(MeshObject::key).collect();
        assert_eq!(
            names,
            [
                ("Service", "default".to_string(), "b".to_string()),
                ("VirtualService", "ns".to_string(), "r".to_string())
            ]
        );
        let inputs = src.inputs(BuildInputs::default());
        assert_eq!(
            inputs.virtual_services[0].spec.http[0].route[0].weight,
            Some(100)
        );
    }

    #[test]
    fn ignored_kinds_are_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(
            dir.path().join("sub/a.yml"),
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n---\napiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: g}\nspec: {}\n",
        )
        .unwrap();
        let mut src = DirSource::new(dir.path());
        assert_eq!(
            src.rescan().unwrap().new_ignored_kinds,
            vec![
                IgnoredKind {
                    kind: "apps/v1/Deployment".to_string(),
                    not_supported_yet: false
                },
                IgnoredKind {
                    kind: "networking.istio.io/v1/Gateway".to_string(),
                    not_supported_yet: true
                }
            ]
        );
        std::fs::write(
            dir.path().join("b.yaml"),
            "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: y}\nspec: {}\n",
        )
        .unwrap();
        assert!(src.rescan().unwrap().new_ignored_kinds.is_empty());
        assert_eq!(src.ignored().count(), 3);
    }
}
