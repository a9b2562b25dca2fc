//! Filesystem notifications for the folder source: one unit per event that can change
//! what the folder holds. Access events are dropped — the source's own reads would
//! otherwise wake it again, and a quiet folder would be re-read forever.

use std::path::Path;

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

/// Watches `root` recursively; each event that can change content sends a unit on the
/// channel. Keep the returned watcher alive. Callers debounce and then rescan.
pub fn watch_dir(
    root: &Path,
) -> notify::Result<(notify::RecommendedWatcher, mpsc::UnboundedReceiver<()>)> {
    use notify::Watcher;
    let (tx, rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // An error from the watcher may mean lost events: a rescan is the safe answer.
        if event.is_err() || event.is_ok_and(|e| changes_content(&e.kind)) {
            let _ = tx.send(());
        }
    })?;
    watcher.watch(root, notify::RecursiveMode::Recursive)?;
    Ok((watcher, rx))
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
        let (_watcher, mut events) = watch_dir(dir.path()).unwrap();
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
    }
}
