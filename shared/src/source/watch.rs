//! Filesystem notifications for the folder source: one unit per event that can change
//! what the folder holds. Access events are dropped — the source's own reads would
//! otherwise wake it again, and a quiet folder would be re-read forever.
//!
//! Each folder the last scan listed is watched on its own ([`FolderWatch::follow`]), not
//! with notify's recursive mode: that one gives up on the whole tree at the first folder it
//! cannot watch (a `lost+found` it may not read, a folder removed while it walks), which
//! would end the process.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use notify::EventKind;
use notify::event::{MetadataKind, ModifyKind};
use tokio::sync::mpsc;

/// Whether an event can change the folder's content (creation, writes, renames,
/// removals, permission or ownership changes), as opposed to someone reading it.
pub fn changes_content(kind: &EventKind) -> bool {
    !matches!(
        kind,
        EventKind::Access(_) | EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime))
    )
}

/// The watches on the folders of a config folder.
pub struct FolderWatch {
    watcher: notify::RecommendedWatcher,
    watched: BTreeSet<PathBuf>,
}

impl std::fmt::Debug for FolderWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FolderWatch")
            .field("watched", &self.watched)
            .finish()
    }
}

impl FolderWatch {
    /// Watches `root` (only the folder itself until [`follow`](Self::follow) is told the
    /// rest); each event that can change content sends a unit on the channel. Callers
    /// debounce and then rescan. Fails when `root` cannot be watched.
    pub fn new(root: &Path) -> notify::Result<(Self, mpsc::UnboundedReceiver<()>)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // An error from the watcher may mean lost events: a rescan is the safe answer.
                if event.is_err() || event.is_ok_and(|e| changes_content(&e.kind)) {
                    let _ = tx.send(());
                }
            })?;
        use notify::Watcher;
        watcher.watch(root, notify::RecursiveMode::NonRecursive)?;
        let watched = BTreeSet::from([root.to_path_buf()]);
        Ok((FolderWatch { watcher, watched }, rx))
    }

    /// Watches exactly `folders` (the root among them): new ones are added, folders no
    /// longer listed are let go. A folder that cannot be watched is left out (the scan
    /// reports it if it cannot read it either; a folder that vanished is gone), and tried
    /// again at the next call.
    pub fn follow(&mut self, folders: &BTreeSet<PathBuf>) {
        use notify::Watcher;
        let gone: Vec<PathBuf> = self.watched.difference(folders).cloned().collect();
        for folder in gone {
            let _ = self.watcher.unwatch(&folder);
            self.watched.remove(&folder);
        }
        for folder in folders.difference(&self.watched.clone()) {
            match self
                .watcher
                .watch(folder, notify::RecursiveMode::NonRecursive)
            {
                Ok(()) => {
                    self.watched.insert(folder.clone());
                }
                Err(e) => {
                    tracing::debug!(folder = %folder.display(), error = %e, "cannot watch a folder of the config folder");
                }
            }
        }
    }

    /// The folders watched now.
    pub fn watched(&self) -> &BTreeSet<PathBuf> {
        &self.watched
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, RemoveKind};
    use std::time::Duration;

    #[test]
    fn reads_are_not_changes() {
        assert!(!changes_content(&EventKind::Access(AccessKind::Open(
            AccessMode::Read
        ))));
        assert!(!changes_content(&EventKind::Access(AccessKind::Close(
            AccessMode::Read
        ))));
        assert!(!changes_content(&EventKind::Modify(ModifyKind::Metadata(
            MetadataKind::AccessTime
        ))));
        assert!(changes_content(&EventKind::Create(CreateKind::File)));
        assert!(changes_content(&EventKind::Modify(ModifyKind::Data(
            DataChange::Content
        ))));
        assert!(changes_content(&EventKind::Remove(RemoveKind::File)));
    }

    /// Reading every file of a watched folder wakes nobody; writing one does.
    #[tokio::test]
    async fn reading_the_folder_sends_no_event() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            std::fs::write(dir.path().join(format!("{i}.yaml")), "a: 1\n").unwrap();
        }
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let (mut watch, mut events) = FolderWatch::new(dir.path()).unwrap();
        watch.follow(&BTreeSet::from([
            dir.path().to_path_buf(),
            dir.path().join("sub"),
            dir.path().join("gone"),
        ]));
        assert_eq!(
            watch.watched().len(),
            2,
            "a folder that is not there is left out"
        );
        for _ in 0..3 {
            for i in 0..5 {
                std::fs::read(dir.path().join(format!("{i}.yaml"))).unwrap();
            }
        }
        let quiet = tokio::time::timeout(Duration::from_millis(300), events.recv()).await;
        assert!(quiet.is_err(), "reading the folder produced an event");
        std::fs::write(dir.path().join("0.yaml"), "a: 2\n").unwrap();
        let woke = tokio::time::timeout(Duration::from_secs(5), events.recv()).await;
        assert!(matches!(woke, Ok(Some(()))), "a write produced no event");
        // A write in a followed subfolder wakes it too.
        while tokio::time::timeout(Duration::from_millis(100), events.recv())
            .await
            .is_ok()
        {}
        std::fs::write(dir.path().join("sub/1.yaml"), "a: 2\n").unwrap();
        let woke = tokio::time::timeout(Duration::from_secs(5), events.recv()).await;
        assert!(
            matches!(woke, Ok(Some(()))),
            "a write in a subfolder produced no event"
        );
    }
}
