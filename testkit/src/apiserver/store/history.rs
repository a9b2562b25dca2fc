//! The change history: [`Store::commit`] is the one way a write lands (next
//! `resourceVersion`, stored object, a [`Change`] in the bounded history, watches woken),
//! and watches read the history back from a revision, or learn it is gone (410).

use std::sync::Arc;

use serde_json::Value;

use super::{Store, object_key};
use crate::apiserver::registry::StorageKey;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed write, as watches replay it.
#[derive(Debug)]
pub struct Change {
    pub revision: u64,
    pub kind: ChangeKind,
    pub storage: StorageKey,
    pub namespace: String,
    /// The object after the change (for a deletion: its last state, stamped with the
    /// deletion's `resourceVersion`), in stored form.
    pub object: Arc<Value>,
    /// The object before the change, so watches with selectors can tell an object
    /// leaving their selection from one entering it.
    pub previous: Option<Arc<Value>>,
}

impl Store {
    pub(super) fn commit(
        &mut self,
        kind: ChangeKind,
        storage: &StorageKey,
        mut object: Value,
        previous: Option<Arc<Value>>,
    ) -> Arc<Value> {
        self.revision += 1;
        if let Some(Value::Object(meta)) = object.get_mut("metadata") {
            meta.insert(
                "resourceVersion".into(),
                Value::String(self.revision.to_string()),
            );
        }
        let object = Arc::new(object);
        let key = object_key(&object);
        let bucket = self.objects.entry(storage.clone()).or_default();
        match kind {
            ChangeKind::Deleted => {
                bucket.remove(&key);
            }
            ChangeKind::Added | ChangeKind::Modified => {
                bucket.insert(key.clone(), object.clone());
            }
        }
        self.history.push_back(Arc::new(Change {
            revision: self.revision,
            kind,
            storage: storage.clone(),
            namespace: key.0,
            object: object.clone(),
            previous,
        }));
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.history_floor = dropped.revision;
            }
        }
        self.notify.send_replace(self.revision);
        object
    }

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Changes after `revision`, or `None` when the history no longer reaches back there.
    pub fn changes_after(&self, revision: u64) -> Option<Vec<Arc<Change>>> {
        if revision < self.history_floor {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|c| c.revision > revision)
                .cloned()
                .collect(),
        )
    }

    pub fn history_floor(&self) -> u64 {
        self.history_floor
    }

    /// Forgets the watch history, so every watch and continue token from before now
    /// gets 410 Gone (what an etcd compaction does to a slow client).
    pub fn expire_history(&mut self) {
        self.revision += 1;
        self.history.clear();
        self.history_floor = self.revision;
        self.notify.send_replace(self.revision);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{config_map, opts, rt};
    use super::*;
    use serde_json::json;
    use tokio::sync::watch;

    #[test]
    fn history_is_bounded() {
        let (tx, _rx) = watch::channel(0);
        let mut store = Store::new(3, tx);
        let cm = rt(&store, "", "v1", "configmaps");
        let start = store.revision();
        for name in ["a", "b", "c", "d"] {
            store
                .create(&cm, Some("default"), config_map(name, json!({})), &opts())
                .unwrap();
        }
        assert!(store.changes_after(start).is_none());
        assert_eq!(store.changes_after(store.revision() - 2).unwrap().len(), 2);
    }
}
