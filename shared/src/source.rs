//! A folder of Kubernetes-style YAML files as a mesh source (standalone mode and the
//! controller's `--config-dir` mode): remembers the last good content of every file,
//! re-reads on change, and reports each problem once. A file that fails to parse keeps its
//! last good content and is reported with the file, the document index and the reason; a
//! removed file removes its objects. Parsing itself is `pilotfish_mesh::document`.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use pilotfish_mesh::document::{MeshObject, ParsedFile, SourceError, parse_text, to_inputs};
use pilotfish_mesh::push_context::BuildInputs;

#[derive(Debug, Default)]
struct FileState {
    /// Hash of the bytes last read, so unchanged files are not re-parsed.
    content_hash: [u8; 32],
    /// Objects of the last version of the file that parsed without errors.
    good: Vec<MeshObject>,
    /// Errors of the current content (empty when it parsed).
    errors: Vec<SourceError>,
}

/// What a rescan found.
#[derive(Debug, Default, PartialEq)]
pub struct RescanReport {
    /// The set of good objects changed: a rebuild is due.
    pub changed: bool,
    /// Errors in files that changed during this scan (each reported once).
    pub new_errors: Vec<SourceError>,
    /// Kinds seen for the first time that are not mesh objects (reported once).
    pub new_unknown_kinds: Vec<String>,
}

/// A folder of Kubernetes-style YAML files (`*.yaml`, `*.yml`, `*.json`, recursively;
/// hidden files and folders, such as editor swap files, are skipped).
#[derive(Debug)]
pub struct DirSource {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    seen_unknown_kinds: BTreeSet<String>,
}

impl DirSource {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirSource {
            root: root.into(),
            files: BTreeMap::new(),
            seen_unknown_kinds: BTreeSet::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Re-reads the folder. Fails only when the folder itself cannot be listed.
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
            let bytes = match std::fs::read(path) {
                Ok(b) => b,
                // Vanished between listing and reading: the next scan removes it.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    let err = SourceError {
                        file: self.relative(path),
                        document: None,
                        message: format!("cannot read: {e}"),
                    };
                    let state = self.files.entry(path.clone()).or_default();
                    if state.errors != [err.clone()] {
                        report.new_errors.push(err.clone());
                        state.errors = vec![err];
                    }
                    continue;
                }
            };
            let hash: [u8; 32] = Sha256::digest(&bytes).into();
            if self.files.get(path).is_some_and(|s| s.content_hash == hash) {
                continue;
            }
            let label = self.relative(path);
            let parsed = match std::str::from_utf8(&bytes) {
                Ok(text) => parse_text(&label, text),
                Err(e) => ParsedFile {
                    errors: vec![SourceError {
                        file: label.clone(),
                        document: None,
                        message: format!("not UTF-8 text: {e}"),
                    }],
                    ..Default::default()
                },
            };
            for kind in parsed.unknown_kinds {
                if self.seen_unknown_kinds.insert(kind.clone()) {
                    report.new_unknown_kinds.push(kind);
                }
            }
            let state = self.files.entry(path.clone()).or_default();
            state.content_hash = hash;
            if parsed.errors.is_empty() {
                if state.good != parsed.objects {
                    state.good = parsed.objects;
                    report.changed = true;
                }
                state.errors.clear();
            } else {
                report.new_errors.extend(parsed.errors.iter().cloned());
                state.errors = parsed.errors;
            }
        }
        Ok(report)
    }

    /// Current problems, file by file (a file with errors serves its last good content).
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

    /// Builder inputs: `base` (mesh config, domain) plus every good object.
    pub fn inputs(&self, base: BuildInputs) -> BuildInputs {
        to_inputs(self.objects(), base)
    }

    fn relative(&self, path: &Path) -> PathBuf {
        path.strip_prefix(&self.root)
            .map(Path::to_path_buf)
            .unwrap_or_else(|_| path.to_path_buf())
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

/// Watches `root` recursively; each filesystem event sends a unit on the channel. Keep the
/// returned watcher alive. Callers debounce and then [`DirSource::rescan`]; since a rescan
/// compares content, spurious events cost only a directory walk.
pub fn watch_dir(
    root: &Path,
) -> notify::Result<(notify::RecommendedWatcher, mpsc::UnboundedReceiver<()>)> {
    use notify::Watcher;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok() {
            let _ = tx.send(());
        }
    })?;
    watcher.watch(root, notify::RecursiveMode::Recursive)?;
    Ok((watcher, rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SVC: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{name: http, port: 80}]}\n";

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

        // Unchanged: nothing to do.
        assert_eq!(src.rescan().unwrap(), RescanReport::default());

        std::fs::write(&file, "apiVersion: v1\nkind: Service\nmetadata: {name: a\n").unwrap();
        let r = src.rescan().unwrap();
        assert!(!r.changed);
        assert_eq!(r.new_errors.len(), 1);
        assert_eq!(r.new_errors[0].file, PathBuf::from("svc.yaml"));
        assert_eq!(src.objects().count(), 1, "last good content is kept");
        assert_eq!(src.errors().len(), 1);

        std::fs::remove_file(&file).unwrap();
        let r = src.rescan().unwrap();
        assert!(r.changed);
        assert_eq!(src.objects().count(), 0);
        assert!(src.errors().is_empty());
    }

    #[test]
    fn unknown_kinds_are_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(
            dir.path().join("sub/a.yml"),
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
        )
        .unwrap();
        let mut src = DirSource::new(dir.path());
        assert_eq!(
            src.rescan().unwrap().new_unknown_kinds,
            vec!["apps/v1/Deployment".to_string()]
        );
        std::fs::write(
            dir.path().join("b.yaml"),
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: y}\n",
        )
        .unwrap();
        assert!(src.rescan().unwrap().new_unknown_kinds.is_empty());
    }
}
