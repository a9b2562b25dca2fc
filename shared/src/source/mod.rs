//! A folder of Kubernetes-style YAML files as a mesh source (standalone mode and the
//! controller's `--config-dir` mode). Parsing is `pilotfish_mesh::document`; listing is
//! [`scan`], reading a file whole is `read`; this module keeps what was read, decides
//! what to re-read, and reports each problem once.
//!
//! - Each document stands alone. A document that does not parse is reported with the file,
//!   its index and the reason; the object it described keeps its last good version if it
//!   had one, and the file's other documents are used as they are now. Only a file that
//!   cannot be read or is not valid YAML as a whole keeps its last good content entirely.
//! - A file is read only once it has settled: its writer finished it (the watcher saw it
//!   closed after writing or renamed into place, [`DirSource::note`]), else unchanged for
//!   [`SETTLE`]; and the same file (inode, size, times) before, during and after the read. Until then its last content
//!   stays in use and the report asks for a rescan ([`RescanReport::retry_after`]), so a
//!   file caught between two halves of a write is never used.
//! - A ConfigMap-style volume (`..data` link) is taken in whole, one version at a time, with
//!   no settle window (kubelet writes a version whole before naming it): if
//!   `..data` moved during the scan, or a file of it was not settled, none of it is taken
//!   and it is retried.
//! - Entries that cannot be used (a folder that cannot be listed, a looping link, a FIFO)
//!   are skipped and reported once (log, `pilotfish_source_skipped_paths`); what was read
//!   from them before stays in use. Nothing in the folder can end the scan.
//! - Documents of kinds Pilotfish does not read are skipped; each such kind is reported
//!   once (log, and `pilotfish_source_ignored_objects{kind}`), the Istio kinds it does not
//!   support yet (Gateway, AuthorizationPolicy, ...) as warnings.
//! - A file whose size and times are unchanged is not read again, so a rescan of a quiet
//!   folder reads nothing ([`watch`] also drops the events the source's own reads cause).
//! - A removed file removes its objects.

pub mod metrics;
mod read;
pub mod scan;
pub mod watch;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

use pilotfish_mesh::document::{
    IgnoredObject, MeshObject, ParsedFile, SourceError, parse_text, to_inputs,
};
use pilotfish_mesh::push_context::BuildInputs;

pub use read::MAX_FILE_BYTES;
use read::{FileStamp, FirstSeen, ReadOutcome, read_settled};
pub use watch::{FolderEvent, FolderWatch};

/// How long a file must stay unchanged before it is read, unless the watcher saw its writer
/// finish it ([`FolderEvent::Finished`]: closed after writing, or renamed into place), in
/// which case it is read at once. A writer that pauses between two parts of a file it
/// keeps open is never read half-way; without close events (a network file system, lost
/// events) edits reach the mesh this much later.
pub const SETTLE: Duration = Duration::from_secs(1);

/// How soon a ConfigMap-style volume caught mid-swap is looked at again (kubelet finishes
/// a swap in moments).
const SWAP_RETRY: Duration = Duration::from_millis(100);

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

/// An entry of the folder left out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// Relative to the folder.
    pub path: PathBuf,
    pub reason: String,
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
    /// Entries skipped for the first time (or for a new reason).
    pub new_skipped: Vec<Skipped>,
    /// Files read from disk in this scan (those whose stamp changed and that settled).
    pub files_read: usize,
    /// Files (and ConfigMap-style volumes, and the folder itself) whose current content
    /// could not be taken in yet: changing, mid-swap, or not listable. Their last content
    /// stays in use.
    pub pending: usize,
    /// When to scan again for what is pending.
    pub retry_after: Option<Duration>,
}

impl RescanReport {
    /// Logs what is new: each error with what stays in use, each skipped entry and each
    /// ignored kind once.
    pub fn log(&self) {
        for e in &self.new_errors {
            if e.last_good_kept {
                tracing::warn!("{} (its last good version stays in use)", e.error);
            } else {
                tracing::warn!("{} (left out: there is no earlier good version)", e.error);
            }
        }
        for s in &self.new_skipped {
            tracing::warn!(path = %s.path.display(), reason = %s.reason, "skipping an entry of the config folder (what was read from it before stays in use)");
        }
        for k in &self.new_ignored_kinds {
            if k.not_supported_yet {
                tracing::warn!(kind = %k.kind, "objects of this kind are not supported by Pilotfish yet: ignored");
            } else {
                tracing::info!(kind = %k.kind, "ignoring objects of a kind Pilotfish does not read");
            }
        }
        if self.pending > 0 {
            tracing::debug!(
                pending = self.pending,
                "parts of the config folder are changing; they are read once settled"
            );
        }
    }

    fn retry_within(&mut self, delay: Duration) {
        self.pending += 1;
        self.retry_after = Some(self.retry_after.map_or(delay, |d| d.min(delay)));
    }
}

/// A folder of Kubernetes-style YAML files (`*.yaml`, `*.yml`, `*.json`, recursively;
/// hidden files and folders, such as editor swap files, are skipped; see [`scan`]).
#[derive(Debug)]
pub struct DirSource {
    root: PathBuf,
    files: BTreeMap<PathBuf, FileState>,
    seen_ignored_kinds: BTreeSet<String>,
    settle: Duration,
    /// Files waiting to settle: the stamp they had when this process first saw it.
    first_seen: BTreeMap<PathBuf, FirstSeen>,
    /// Files whose writer finished them (closed after writing, renamed into place) with no
    /// write seen since: read without the settle window.
    finished: BTreeSet<PathBuf>,
    /// Entries skipped by the last scan, with the reason.
    skipped: BTreeMap<PathBuf, String>,
    /// Folders the last scan listed (where they were read), to be watched.
    folders: BTreeSet<PathBuf>,
    /// Folders whose listing fails as if unreadable (tests run as root).
    fail_listing: BTreeSet<PathBuf>,
}

impl DirSource {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self::with_settle(root, SETTLE)
    }

    /// A source that reads files once unchanged for `settle` (tests use short windows).
    pub fn with_settle(root: impl Into<PathBuf>, settle: Duration) -> Self {
        let root_path: PathBuf = root.into();
        // The watcher reports absolute paths (notify joins a relative watch to the working
        // directory), so files are keyed by absolute paths too: otherwise a file its
        // writer finished would never be recognised under a relative `--config-dir` and
        // would wait out the settle window.
        let root_path = std::path::absolute(&root_path).unwrap_or(root_path);
        DirSource {
            root: root_path.clone(),
            files: BTreeMap::new(),
            seen_ignored_kinds: BTreeSet::new(),
            settle,
            first_seen: BTreeMap::new(),
            finished: BTreeSet::new(),
            skipped: BTreeMap::new(),
            folders: BTreeSet::from([root_path.clone()]),
            fail_listing: BTreeSet::new(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Takes in what the watcher saw: a file a writer finished is read at the next scan
    /// without the settle window, until a write to it is seen again.
    pub fn note(&mut self, event: FolderEvent) {
        match event {
            FolderEvent::Finished(path) => {
                self.finished.insert(path);
            }
            FolderEvent::Changed { writing } => {
                for path in &writing {
                    self.finished.remove(path);
                }
            }
            FolderEvent::Lost => self.finished.clear(),
        }
    }

    /// Re-reads the folder (only files whose stamp changed, once they settled). Never
    /// fails: what cannot be read is reported and keeps its last content.
    pub fn rescan(&mut self) -> RescanReport {
        let listing = scan::list(&self.root, &self.fail_listing);
        let mut report = RescanReport::default();
        for (path, reason) in &listing.skipped {
            if self.skipped.get(path) != Some(reason) {
                report.new_skipped.push(Skipped {
                    path: self.relative(path),
                    reason: reason.clone(),
                });
            }
        }
        self.skipped = listing.skipped.clone();
        self.folders = listing.folders.iter().cloned().collect();
        self.folders.insert(self.root.clone());
        if listing.unknown.contains(&self.root) {
            report.retry_within(self.settle);
        }

        let now = SystemTime::now();
        let outcomes: Vec<(&scan::Listed, ReadOutcome)> = listing
            .files
            .iter()
            .map(|f| {
                let previous = self.files.get(&f.key).and_then(|s| s.stamp);
                let first_seen = self.first_seen.get(&f.key).copied();
                // kubelet writes a ConfigMap version whole before `..data` names it, so a
                // file of the current version needs no settle window (the swap checks
                // below catch a version replaced mid-scan); nor does a file whose writer
                // finished it; other loose files do.
                let settle = if f.swap.is_some() || self.finished.contains(&f.key) {
                    Duration::ZERO
                } else {
                    self.settle
                };
                let outcome = read_settled(&f.read_path, previous, first_seen, settle, now);
                (f, outcome)
            })
            .collect();

        // A ConfigMap-style volume is taken whole or not at all.
        let mut swap_usable: Vec<bool> = listing
            .swaps
            .iter()
            .map(|s| !s.broken && s.still_current())
            .collect();
        for (f, outcome) in &outcomes {
            if let (Some(i), ReadOutcome::Unsettled { .. } | ReadOutcome::Gone) = (f.swap, outcome)
            {
                swap_usable[i] = false;
            }
        }
        let held: Vec<&Path> = listing
            .swaps
            .iter()
            .zip(&swap_usable)
            .filter(|(_, usable)| !**usable)
            .map(|(s, _)| s.key.as_path())
            .collect();
        for _ in &held {
            report.retry_within(SWAP_RETRY.min(self.settle));
        }

        let present: BTreeSet<&PathBuf> = outcomes
            .iter()
            .filter(|(_, o)| !matches!(o, ReadOutcome::Gone))
            .map(|(f, _)| &f.key)
            .collect();
        let before = self.files.len();
        self.files.retain(|p, _| {
            present.contains(p) || listing.keeps(p) || held.iter().any(|h| p.starts_with(h))
        });
        if self.files.len() != before {
            report.changed = true;
        }
        self.first_seen.retain(|p, _| present.contains(p));
        self.finished.retain(|p| present.contains(p));

        for (f, outcome) in outcomes {
            let usable = f.swap.is_none_or(|i| swap_usable[i]);
            match outcome {
                ReadOutcome::Unchanged => {
                    self.first_seen.remove(&f.key);
                    self.finished.remove(&f.key);
                }
                ReadOutcome::Gone => {}
                ReadOutcome::Unsettled { stamp, retry_after } => {
                    metrics::DEFERRED_READS.inc();
                    // Changed while read: a writer is at it again, whatever it finished.
                    self.finished.remove(&f.key);
                    let retry_after = retry_after.max(SWAP_RETRY.min(self.settle));
                    if self.first_seen.get(&f.key).is_none_or(|s| s.stamp != stamp) {
                        let at = Instant::now();
                        self.first_seen
                            .insert(f.key.clone(), FirstSeen { stamp, at });
                    }
                    report.retry_within(retry_after);
                }
                ReadOutcome::Failed(message) => {
                    self.read_failed(&f.key, message, &mut report);
                }
                ReadOutcome::Read { .. } if !usable => {}
                ReadOutcome::Read { stamp, bytes } => {
                    self.first_seen.remove(&f.key);
                    self.finished.remove(&f.key);
                    self.take_content(&f.key, stamp, &bytes, &mut report);
                }
            }
        }
        self.update_metrics();
        report
    }

    /// A file that exists but cannot be read: reported once; its last good content stays.
    fn read_failed(&mut self, key: &Path, message: String, report: &mut RescanReport) {
        let err = SourceError {
            file: self.relative(key),
            document: None,
            object: None,
            message: format!("cannot read: {message}"),
        };
        let state = self.files.entry(key.to_path_buf()).or_default();
        if state.errors != [err.clone()] {
            report.new_errors.push(NewError {
                error: err.clone(),
                last_good_kept: !state.good.is_empty(),
            });
            state.errors = vec![err];
        }
    }

    /// Takes in a file's content, read whole.
    fn take_content(
        &mut self,
        key: &Path,
        stamp: FileStamp,
        bytes: &[u8],
        report: &mut RescanReport,
    ) {
        let label = self.relative(key);
        report.files_read += 1;
        metrics::FILE_READS.inc();
        let hash: [u8; 32] = Sha256::digest(bytes).into();
        let state = self.files.entry(key.to_path_buf()).or_default();
        if state.stamp.is_some() && state.content_hash == hash && state.errors.is_empty() {
            state.stamp = Some(stamp);
            return;
        }
        let parsed = match std::str::from_utf8(bytes) {
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
        state.stamp = Some(stamp);
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

    /// Entries the last scan skipped, relative to the folder, with the reason.
    pub fn skipped(&self) -> Vec<Skipped> {
        self.skipped
            .iter()
            .map(|(p, reason)| Skipped {
                path: self.relative(p),
                reason: reason.clone(),
            })
            .collect()
    }

    /// The folders the last scan listed (the root always among them): what to watch.
    pub fn folders(&self) -> &BTreeSet<PathBuf> {
        &self.folders
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
        metrics::SKIPPED_PATHS.set(self.skipped.len() as i64);
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
        let mut src = DirSource::with_settle(dir.path(), Duration::ZERO);
        let r = src.rescan();
        assert!(r.changed && r.new_errors.is_empty());
        assert_eq!(src.objects().count(), 1);

        // Unchanged: nothing to do, nothing read.
        assert_eq!(src.rescan(), RescanReport::default());

        replace(&file, "apiVersion: v1\nkind: Service\nmetadata: {name: a\n");
        let r = src.rescan();
        assert!(!r.changed);
        assert_eq!(r.files_read, 1);
        assert_eq!(r.new_errors.len(), 1);
        assert_eq!(r.new_errors[0].error.file, PathBuf::from("svc.yaml"));
        assert!(r.new_errors[0].last_good_kept);
        assert_eq!(src.objects().count(), 1, "last good content is kept");
        assert_eq!(src.errors().len(), 1);

        std::fs::remove_file(&file).unwrap();
        let r = src.rescan();
        assert!(r.changed);
        assert_eq!(src.objects().count(), 0);
        assert!(src.errors().is_empty());
    }

    #[test]
    fn a_broken_file_at_first_load_keeps_nothing_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bad.yaml"), "kind: [unclosed\n").unwrap();
        let mut src = DirSource::with_settle(dir.path(), Duration::ZERO);
        let r = src.rescan();
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
        let mut src = DirSource::with_settle(dir.path(), Duration::ZERO);
        src.rescan();
        assert_eq!(src.objects().count(), 2);

        // The VirtualService breaks (a weight that is not a number) and the Service is
        // renamed in the same edit.
        replace(
            &file,
            &format!("{}---\n{}", svc("b"), VS.replace("WEIGHT", "lots")),
        );
        let r = src.rescan();
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
        let mut src = DirSource::with_settle(dir.path(), Duration::ZERO);
        assert_eq!(
            src.rescan().new_ignored_kinds,
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
        assert!(src.rescan().new_ignored_kinds.is_empty());
        assert_eq!(src.ignored().count(), 3);
    }

    const SVC_B: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: b}\nspec: {ports: [{name: http, port: 80}]}\n";

    fn names(src: &DirSource) -> Vec<String> {
        src.objects().map(|o| o.key().2).collect()
    }

    /// A file written in two parts with a pause between them: neither part alone is used;
    /// the whole file is, once it stopped changing.
    #[test]
    fn a_file_is_read_only_once_it_stopped_changing() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let settle = Duration::from_millis(300);
        let mut src = DirSource::with_settle(dir.path(), settle);
        let path = dir.path().join("mesh.yaml");
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(format!("{SVC}---\n").as_bytes()).unwrap();
        let r = src.rescan();
        assert_eq!((r.pending, r.files_read, r.changed), (1, 0, false));
        let retry = r.retry_after.expect("a rescan is asked for");
        assert!(retry <= settle, "{retry:?}");
        assert!(names(&src).is_empty());
        file.write_all(SVC_B.as_bytes()).unwrap();
        drop(file);
        assert_eq!(src.rescan().pending, 1);
        std::thread::sleep(settle);
        let r = src.rescan();
        assert_eq!((r.pending, r.files_read, r.changed), (0, 1, true));
        assert_eq!(r.retry_after, None);
        assert_eq!(names(&src), ["a", "b"]);

        // An edit in place: the old content stays in use until the new one settled.
        std::fs::write(&path, SVC).unwrap();
        assert_eq!(src.rescan().pending, 1);
        assert_eq!(names(&src), ["a", "b"]);
        std::thread::sleep(settle);
        assert!(src.rescan().changed);
        assert_eq!(names(&src), ["a"]);
    }

    /// A file its writer finished (closed after writing, renamed into place) is read at
    /// once, without the settle window; a write seen after that brings the window back,
    /// and so does a watcher that may have lost events.
    #[test]
    fn a_file_its_writer_finished_is_read_without_the_settle_window() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        // Far longer than the test: only the writer's close lets a file be read.
        let mut src = DirSource::with_settle(dir.path(), Duration::from_secs(3600));
        let path = dir.path().join("mesh.yaml");
        std::fs::write(&path, SVC).unwrap();
        assert_eq!(src.rescan().pending, 1, "no close seen yet: it waits");
        src.note(FolderEvent::Finished(path.clone()));
        let r = src.rescan();
        assert_eq!((r.pending, r.files_read, r.changed), (0, 1, true));
        assert_eq!(names(&src), ["a"]);

        // Reopened and written again, not closed: the window applies again.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        file.write_all(format!("---\n{SVC_B}").as_bytes()).unwrap();
        src.note(FolderEvent::Changed {
            writing: vec![path.clone()],
        });
        assert_eq!(src.rescan().pending, 1);
        assert_eq!(names(&src), ["a"], "the half-written file is not used");
        drop(file);
        src.note(FolderEvent::Finished(path.clone()));
        assert!(src.rescan().changed);
        assert_eq!(names(&src), ["a", "b"]);

        // A close followed by lost events proves nothing.
        std::fs::write(&path, SVC).unwrap();
        src.note(FolderEvent::Finished(path.clone()));
        src.note(FolderEvent::Lost);
        assert_eq!(src.rescan().pending, 1);
        assert_eq!(names(&src), ["a", "b"]);
    }

    /// Under a relative root, a file is still recognised by the absolute path the watcher
    /// reports when its writer finishes it.
    #[test]
    fn a_relative_root_matches_the_watchers_absolute_paths() {
        let cwd = std::env::current_dir().unwrap();
        let dir = tempfile::tempdir_in(&cwd).unwrap();
        let relative = dir.path().strip_prefix(&cwd).unwrap();
        assert!(relative.is_relative());
        let mut src = DirSource::with_settle(relative, Duration::from_secs(3600));
        std::fs::write(relative.join("mesh.yaml"), SVC).unwrap();
        assert_eq!(src.rescan().pending, 1);
        src.note(FolderEvent::Finished(dir.path().join("mesh.yaml")));
        let r = src.rescan();
        assert_eq!(
            (r.pending, r.files_read),
            (0, 1),
            "read at once, without the window"
        );
        assert_eq!(names(&src), ["a"]);
    }

    /// A folder that cannot be listed (`lost+found` under a non-root uid) is skipped and
    /// reported once; the rest is read; what was read from it before stays in use.
    #[test]
    fn an_unreadable_folder_is_skipped_and_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("team")).unwrap();
        std::fs::write(dir.path().join("team/b.yaml"), SVC_B).unwrap();
        std::fs::write(dir.path().join("a.yaml"), SVC).unwrap();
        let mut src = DirSource::with_settle(dir.path(), Duration::ZERO);
        src.rescan();
        assert_eq!(names(&src), ["a", "b"]);

        src.fail_listing.insert(dir.path().join("team"));
        let r = src.rescan();
        assert_eq!(
            r.new_skipped,
            [Skipped {
                path: "team".into(),
                reason: "cannot list folder: permission denied".into()
            }]
        );
        assert_eq!((r.changed, r.pending), (false, 0), "{r:?}");
        assert_eq!(names(&src), ["a", "b"], "team/b.yaml keeps its content");
        assert_eq!(src.skipped().len(), 1);
        assert!(src.rescan().new_skipped.is_empty(), "reported once");

        // Readable again: nothing skipped; removed: its objects go.
        src.fail_listing.clear();
        src.rescan();
        assert!(src.skipped().is_empty());
        std::fs::remove_dir_all(dir.path().join("team")).unwrap();
        assert!(src.rescan().changed);
        assert_eq!(names(&src), ["a"]);

        // The folder itself unlistable: everything stays, and the scan is retried.
        src.fail_listing.insert(dir.path().to_path_buf());
        let r = src.rescan();
        assert_eq!((r.changed, r.pending), (false, 1));
        assert_eq!(names(&src), ["a"]);
    }

    /// kubelet's ConfigMap volume: `key -> ..data/key`, `..data -> ..<timestamp>`. A swap
    /// is taken in whole; a version that cannot be read whole is not taken at all.
    #[test]
    fn a_configmap_swap_is_taken_whole() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let version = |name: &str, a: &str, b: &str| {
            std::fs::create_dir(root.join(name)).unwrap();
            std::fs::write(root.join(name).join("a.yaml"), a).unwrap();
            std::fs::write(root.join(name).join("b.yaml"), b).unwrap();
        };
        let swap_to = |name: &str| {
            symlink(name, root.join("..data_tmp")).unwrap();
            std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        };
        version("..2026_11_25_06_00_00.1", SVC, SVC_B);
        swap_to("..2026_11_25_06_00_00.1");
        symlink("..data/a.yaml", root.join("a.yaml")).unwrap();
        symlink("..data/b.yaml", root.join("b.yaml")).unwrap();
        let mut src = DirSource::with_settle(root, Duration::ZERO);
        let r = src.rescan();
        assert_eq!((r.files_read, r.pending), (2, 0));
        assert_eq!(names(&src), ["a", "b"]);
        assert_eq!(src.errors(), []);

        // Version 2 renames both Services; its folder cannot be listed at first (as if
        // removed under the scan): nothing of it is taken, version 1 stays whole.
        let v2 = "..2026_11_25_06_01_00.2";
        version(
            v2,
            &SVC.replace("name: a", "name: a2"),
            &SVC_B.replace("name: b", "name: b2"),
        );
        swap_to(v2);
        std::fs::remove_dir_all(root.join("..2026_11_25_06_00_00.1")).unwrap();
        src.fail_listing.insert(root.join(v2));
        let r = src.rescan();
        assert!(!r.changed && r.pending > 0, "{r:?}");
        assert_eq!(names(&src), ["a", "b"]);
        src.fail_listing.clear();
        let r = src.rescan();
        assert_eq!((r.changed, r.files_read, r.pending), (true, 2, 0));
        assert_eq!(names(&src), ["a2", "b2"]);
        assert_eq!(src.skipped(), []);
    }
}
