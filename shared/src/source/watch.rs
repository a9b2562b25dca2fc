//! Filesystem notifications for the folder source: one [`FolderEvent`] per event that can
//! change what the folder holds. Access events are dropped — the source's own reads would
//! otherwise wake it again, and a quiet folder would be re-read forever — except a close
//! after writing, which tells the source that a writer finished a file.
//!
//! Each folder the last scan listed is watched on its own ([`FolderWatch::follow`]), not
//! with notify's recursive mode: that one gives up on the whole tree at the first folder it
//! cannot watch (a `lost+found` it may not read, a folder removed while it walks), which
//! would end the process.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use notify::EventKind;
use notify::event::{AccessKind, AccessMode, MetadataKind, ModifyKind, RenameMode};
use tokio::sync::mpsc;

/// What a filesystem event tells the folder source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FolderEvent {
    /// Content may have changed; these paths are being written (empty for events without
    /// paths, and for a watcher error, which may mean lost events).
    Changed { writing: Vec<PathBuf> },
    /// A writer finished this file: it closed it after writing, or renamed a file to it
    /// (how atomic writers and editors save). Its content is whole as far as the writer
    /// is concerned, so it needs no settle window.
    Finished(PathBuf),
    /// The watcher may have lost events: nothing it said about writers can be trusted.
    Lost,
}

/// What a notify event means for the folder source; `None` for someone reading it.
pub fn classify(event: &notify::Event) -> Option<FolderEvent> {
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {
            event.paths.first().cloned().map(FolderEvent::Finished)
        }
        // `To` names the destination; `Both` lists the source, then the destination.
        EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::Both)) => {
            event.paths.last().cloned().map(FolderEvent::Finished)
        }
        ref kind if changes_content(kind) => Some(FolderEvent::Changed {
            writing: event.paths.clone(),
        }),
        _ => None,
    }
}

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
    /// rest); each event that can change content, or that says a writer finished a file,
    /// is sent on the channel. Callers hand it to the source, debounce and then rescan.
    /// Fails when `root` cannot be watched.
    pub fn new(root: &Path) -> notify::Result<(Self, mpsc::UnboundedReceiver<FolderEvent>)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // An error from the watcher may mean lost events: a rescan is the safe answer.
                let event = match event {
                    Ok(e) => classify(&e),
                    Err(_) => Some(FolderEvent::Lost),
                };
                if let Some(event) = event {
                    let _ = tx.send(event);
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
    use notify::event::{CreateKind, DataChange, RemoveKind};
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

    #[test]
    fn a_close_after_writing_or_a_rename_finishes_a_file() {
        let event = |kind, paths: &[&str]| {
            let mut e = notify::Event::new(kind);
            for p in paths {
                e = e.add_path(PathBuf::from(p));
            }
            classify(&e)
        };
        assert_eq!(
            event(
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                &["/d/a.yaml"]
            ),
            Some(FolderEvent::Finished("/d/a.yaml".into()))
        );
        assert_eq!(
            event(
                EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
                &["/d/.a.yaml.tmp", "/d/a.yaml"]
            ),
            Some(FolderEvent::Finished("/d/a.yaml".into()))
        );
        assert_eq!(
            event(
                EventKind::Modify(ModifyKind::Name(RenameMode::To)),
                &["/d/a.yaml"]
            ),
            Some(FolderEvent::Finished("/d/a.yaml".into()))
        );
        assert_eq!(
            event(
                EventKind::Modify(ModifyKind::Data(DataChange::Any)),
                &["/d/a.yaml"]
            ),
            Some(FolderEvent::Changed {
                writing: vec!["/d/a.yaml".into()]
            })
        );
        assert_eq!(
            event(
                EventKind::Access(AccessKind::Close(AccessMode::Read)),
                &["/d/a.yaml"]
            ),
            None
        );
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
        assert!(
            matches!(woke, Ok(Some(FolderEvent::Changed { .. }))),
            "a write produced no event: {woke:?}"
        );
        // `fs::write` closes the file: the writer finished it, under the path the scan uses.
        let mut finished = None;
        while let Ok(Some(e)) = tokio::time::timeout(Duration::from_secs(2), events.recv()).await {
            if let FolderEvent::Finished(path) = e {
                finished = Some(path);
                break;
            }
        }
        assert_eq!(finished, Some(dir.path().join("0.yaml")));
        // A write in a followed subfolder wakes it too.
        while tokio::time::timeout(Duration::from_millis(100), events.recv())
            .await
            .is_ok()
        {}
        std::fs::write(dir.path().join("sub/1.yaml"), "a: 2\n").unwrap();
        let woke = tokio::time::timeout(Duration::from_secs(5), events.recv()).await;
        assert!(
            matches!(woke, Ok(Some(_))),
            "a write in a subfolder produced no event"
        );
    }
}
