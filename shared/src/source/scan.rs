//! Listing the config folder: which files hold configuration, which entries are skipped
//! and why, and which folders are Kubernetes ConfigMap (or Secret, projected) volumes.
//!
//! - `*.yaml`, `*.yml` and `*.json` regular files, recursively, following symbolic links.
//!   Hidden entries (editor swap files, `..2026_11_25_…` folders) are passed over silently.
//! - An entry that cannot be used — a folder that cannot be listed (`lost+found` on a
//!   volume mounted for a non-root user), a link that loops or leads nowhere, a link back to
//!   a folder already listed, a FIFO named `*.yaml` — is skipped with its reason; the rest
//!   of the folder is listed as usual. A folder that vanishes while listed is simply gone.
//! - A folder holding a `..data` link is laid out as kubelet lays out a ConfigMap volume:
//!   `key -> ..data/key`, `..data -> ..<timestamp>`, and kubelet updates it by writing a
//!   new `..<timestamp>` folder and renaming a new `..data` link over the old one. Its
//!   content is listed through the folder `..data` points to at that moment (one version,
//!   never a mix of two), and the caller checks afterwards that `..data` still points
//!   there ([`Swap::still_current`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

/// Folders nested deeper than this are skipped (a bound on the walk, whatever the links).
const MAX_DEPTH: usize = 32;

/// A file to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Where the file appears to users: its path under the root, with a ConfigMap
    /// volume's keys at the volume's folder (`cm/mesh.yaml`, not `cm/..data/mesh.yaml`).
    pub key: PathBuf,
    /// Where it is read from this time.
    pub read_path: PathBuf,
    /// The ConfigMap-style volume it belongs to (an index into [`Listing::swaps`]).
    pub swap: Option<usize>,
}

/// A ConfigMap-style folder and the version its `..data` link named when it was listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Swap {
    /// The folder under the root (the prefix of its files' keys).
    pub key: PathBuf,
    /// Its `..data` link.
    pub link: PathBuf,
    /// Where `..data` pointed.
    pub target: PathBuf,
    /// Part of it could not be listed: none of it may be taken from this listing.
    pub broken: bool,
}

impl Swap {
    /// Whether `..data` still points where it did when the folder was listed.
    pub fn still_current(&self) -> bool {
        std::fs::read_link(&self.link).is_ok_and(|t| t == self.target)
    }
}

/// What a walk of the folder found.
#[derive(Debug, Default)]
pub struct Listing {
    pub files: Vec<Listed>,
    /// Entries left out, by key, with the reason.
    pub skipped: BTreeMap<PathBuf, String>,
    /// Keys (files or folders) whose content is unknown this time (they exist but could
    /// not be looked into): what was read from them before stays in use.
    pub unknown: Vec<PathBuf>,
    pub swaps: Vec<Swap>,
    /// Folders listed (where they were read: through links, a ConfigMap volume's folder
    /// and its current version's), to be watched for changes.
    pub folders: Vec<PathBuf>,
}

impl Listing {
    /// Whether what was read from `key` before stays in use although it was not listed.
    pub fn keeps(&self, key: &Path) -> bool {
        self.unknown.iter().any(|u| key.starts_with(u))
            || self
                .swaps
                .iter()
                .any(|s| s.broken && key.starts_with(&s.key))
    }
}

/// Lists `root`. `fail_listing` makes listing these folders fail as if they were not
/// readable (tests run as root, which may read any folder).
pub fn list(root: &Path, fail_listing: &BTreeSet<PathBuf>) -> Listing {
    let mut walk = Walk {
        fail_listing,
        listing: Listing::default(),
        visited: BTreeSet::new(),
    };
    if let Ok(meta) = std::fs::metadata(root) {
        walk.visited.insert(identity(&meta));
    }
    walk.dir(root, root, None, 0);
    walk.listing
}

struct Walk<'a> {
    fail_listing: &'a BTreeSet<PathBuf>,
    listing: Listing,
    /// Folders listed in this walk, by device and inode: a link back to one is a loop.
    visited: BTreeSet<(u64, u64)>,
}

impl Walk<'_> {
    /// Lists the folder `read` (which users know as `key`).
    fn dir(&mut self, key: &Path, read: &Path, swap: Option<usize>, depth: usize) {
        if swap.is_none() {
            match std::fs::symlink_metadata(read.join("..data")) {
                Ok(m) if m.file_type().is_symlink() => return self.swap_volume(key, read, depth),
                _ => {}
            }
        }
        let entries = match self.read_dir(read) {
            Ok(entries) => entries,
            // Removed while we looked: it is gone, and so are its files — unless it is a
            // ConfigMap version kubelet just replaced, whose files are kept until the next
            // listing sees the new one.
            Err(e) if e.kind() == io::ErrorKind::NotFound && swap.is_none() && depth > 0 => {
                return;
            }
            Err(e) => return self.unreadable(key, swap, format!("cannot list folder: {e}")),
        };
        self.listing.folders.push(read.to_path_buf());
        for (name, path) in entries {
            let name_str = name.to_string_lossy();
            if name_str.starts_with('.') {
                continue;
            }
            let entry_key = key.join(&name);
            // Follows links, as ConfigMap volumes and users' own links need.
            let meta = match std::fs::metadata(&path) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    if std::fs::symlink_metadata(&path).is_ok() {
                        self.skip(&entry_key, swap, "a link to nothing".into());
                    } else if swap.is_some() {
                        self.broken(swap);
                    }
                    continue;
                }
                Err(e) => {
                    self.unreadable(&entry_key, swap, e.to_string());
                    continue;
                }
            };
            if meta.is_dir() {
                if !self.visited.insert(identity(&meta)) {
                    self.skip(
                        &entry_key,
                        swap,
                        "a link back to a folder already read (a loop)".into(),
                    );
                } else if depth + 1 > MAX_DEPTH {
                    self.skip(
                        &entry_key,
                        swap,
                        format!("nested deeper than {MAX_DEPTH} folders"),
                    );
                } else {
                    self.dir(&entry_key, &path, swap, depth + 1);
                }
            } else if [".yaml", ".yml", ".json"]
                .iter()
                .any(|ext| name_str.ends_with(ext))
            {
                if meta.is_file() {
                    self.listing.files.push(Listed {
                        key: entry_key,
                        read_path: path,
                        swap,
                    });
                } else {
                    self.skip(&entry_key, swap, "not a regular file".into());
                }
            }
        }
    }

    /// A ConfigMap-style volume: its content is the folder `..data` points to now.
    fn swap_volume(&mut self, key: &Path, read: &Path, depth: usize) {
        let link = read.join("..data");
        let target = match std::fs::read_link(&link) {
            Ok(t) => t,
            Err(e) => return self.unreadable(key, None, format!("cannot read ..data: {e}")),
        };
        // kubelet's swap is a rename of `..data` in this folder.
        self.listing.folders.push(read.to_path_buf());
        let index = self.listing.swaps.len();
        self.listing.swaps.push(Swap {
            key: key.to_path_buf(),
            link,
            target: target.clone(),
            broken: false,
        });
        self.dir(key, &read.join(&target), Some(index), depth);
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(std::ffi::OsString, PathBuf)>> {
        if self.fail_listing.contains(dir) {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        let mut entries = std::fs::read_dir(dir)?
            .map(|e| e.map(|e| (e.file_name(), e.path())))
            .collect::<io::Result<Vec<_>>>()?;
        entries.sort();
        Ok(entries)
    }

    /// An entry that exists but cannot be looked into: skipped, and whatever was read from
    /// it before stays in use.
    fn unreadable(&mut self, key: &Path, swap: Option<usize>, reason: String) {
        self.listing.unknown.push(key.to_path_buf());
        self.skip(key, swap, reason);
    }

    fn skip(&mut self, key: &Path, swap: Option<usize>, reason: String) {
        self.listing.skipped.insert(key.to_path_buf(), reason);
        self.broken(swap);
    }

    /// Inside a ConfigMap volume anything amiss means kubelet is mid-swap (or the volume
    /// is damaged): this listing of it is not used.
    fn broken(&mut self, swap: Option<usize>) {
        if let Some(i) = swap {
            self.listing.swaps[i].broken = true;
        }
    }
}

fn identity(meta: &std::fs::Metadata) -> (u64, u64) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (meta.dev(), meta.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A FIFO (named pipe) at `path`, made by coreutils' `mkfifo`.
    fn mkfifo(path: &std::path::Path) {
        let made = std::process::Command::new("mkfifo").arg(path).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", path.display());
    }

    fn keys(listing: &Listing) -> Vec<String> {
        listing
            .files
            .iter()
            .map(|f| f.key.display().to_string())
            .collect()
    }

    #[test]
    fn loops_dangling_links_fifos_and_unreadable_folders_are_skipped_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("a.yaml"), "").unwrap();
        std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
        std::fs::write(root.join("sub/deeper/b.yml"), "").unwrap();
        symlink("..", root.join("sub/up")).unwrap();
        symlink("self.yaml", root.join("self.yaml")).unwrap();
        symlink("nowhere.yaml", root.join("dangling.yaml")).unwrap();
        mkfifo(&root.join("pipe.yaml"));
        std::fs::create_dir(root.join("lost+found")).unwrap();
        std::fs::write(root.join("lost+found/c.yaml"), "").unwrap();

        let fail: BTreeSet<PathBuf> = [root.join("lost+found")].into();
        let listing = list(root, &fail);
        assert_eq!(keys(&listing).len(), 2);
        assert_eq!(listing.files[0].key, root.join("a.yaml"));
        assert_eq!(listing.files[1].key, root.join("sub/deeper/b.yml"));
        let reasons: BTreeMap<String, String> = listing
            .skipped
            .iter()
            .map(|(k, v)| {
                (
                    k.strip_prefix(root).unwrap().display().to_string(),
                    v.clone(),
                )
            })
            .collect();
        assert_eq!(reasons["dangling.yaml"], "a link to nothing");
        assert!(
            reasons["self.yaml"].contains("symbolic links"),
            "{reasons:?}"
        );
        assert_eq!(reasons["pipe.yaml"], "not a regular file");
        assert_eq!(
            reasons["sub/up"],
            "a link back to a folder already read (a loop)"
        );
        assert!(reasons["lost+found"].starts_with("cannot list folder: permission denied"));
        assert_eq!(reasons.len(), 5);
        // What was read under the unreadable folder and the looping link stays in use.
        assert!(listing.keeps(&root.join("lost+found/c.yaml")));
        assert!(listing.keeps(&root.join("self.yaml")));
        assert!(!listing.keeps(&root.join("a.yaml")));
    }

    /// kubelet's layout: `key -> ..data/key`, `..data -> ..<timestamp>`.
    #[test]
    fn a_configmap_volume_is_read_through_its_current_data_link_only() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("cm");
        std::fs::create_dir_all(vol.join("..2026_11_25_06_00_00.1")).unwrap();
        std::fs::create_dir_all(vol.join("..2026_11_25_05_00_00.0")).unwrap();
        std::fs::write(vol.join("..2026_11_25_06_00_00.1/mesh.yaml"), "").unwrap();
        std::fs::write(vol.join("..2026_11_25_05_00_00.0/old.yaml"), "").unwrap();
        symlink("..2026_11_25_06_00_00.1", vol.join("..data")).unwrap();
        symlink("..data/mesh.yaml", vol.join("mesh.yaml")).unwrap();
        let listing = list(dir.path(), &BTreeSet::new());
        assert_eq!(
            listing.files,
            [Listed {
                key: vol.join("mesh.yaml"),
                read_path: vol.join("..2026_11_25_06_00_00.1").join("mesh.yaml"),
                swap: Some(0),
            }]
        );
        assert!(listing.skipped.is_empty());
        assert!(listing.swaps[0].still_current());

        // kubelet swaps: a new version, `..data` renamed over, the old version removed.
        std::fs::create_dir(vol.join("..2026_11_25_07_00_00.2")).unwrap();
        symlink("..2026_11_25_07_00_00.2", vol.join("..data_tmp")).unwrap();
        std::fs::rename(vol.join("..data_tmp"), vol.join("..data")).unwrap();
        assert!(!listing.swaps[0].still_current());
        std::fs::remove_dir_all(vol.join("..2026_11_25_06_00_00.1")).unwrap();

        // A listing whose version vanished under it is not used (its files are kept).
        let fail: BTreeSet<PathBuf> = [vol.join("..2026_11_25_07_00_00.2")].into();
        let listing = list(dir.path(), &fail);
        assert!(listing.swaps[0].broken);
        assert!(listing.keeps(&vol.join("mesh.yaml")));
    }
}
