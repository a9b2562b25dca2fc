//! [`WeakTable`]: a content-addressed table of shared values that keeps none of them
//! alive. Interning makes equal content one `Arc`: the parts of many scopes and of
//! successive snapshots then share one copy of each resource and of each response body,
//! and comparing two of them is comparing pointers. Entries die with their last holder;
//! dead ones are swept whenever the table has doubled since the last sweep, so a table
//! holds at most about twice the live values.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// Interned values of `T`, bucketed by a hash of their content.
#[derive(Debug)]
pub struct WeakTable<T> {
    table: Mutex<Table<T>>,
}

#[derive(Debug)]
struct Table<T> {
    buckets: HashMap<u64, Vec<Weak<T>>>,
    entries: usize,
    sweep_at: usize,
}

impl<T> Default for WeakTable<T> {
    fn default() -> Self {
        WeakTable {
            table: Mutex::new(Table {
                buckets: HashMap::new(),
                entries: 0,
                sweep_at: 64,
            }),
        }
    }
}

impl<T> WeakTable<T> {
    /// The live value equal to `candidate` (`same` decides, among values of the same
    /// `hash`), or `candidate` itself, now interned.
    pub fn intern(&self, hash: u64, candidate: T, same: impl Fn(&T, &T) -> bool) -> Arc<T> {
        let mut table = self.lock();
        let bucket = table.buckets.entry(hash).or_default();
        if let Some(existing) = bucket
            .iter()
            .filter_map(Weak::upgrade)
            .find(|v| same(v, &candidate))
        {
            return existing;
        }
        let value = Arc::new(candidate);
        bucket.push(Arc::downgrade(&value));
        table.entries += 1;
        if table.entries > table.sweep_at {
            table.sweep();
        }
        value
    }

    /// Live values (after sweeping the dead).
    pub fn len(&self) -> usize {
        let mut table = self.lock();
        table.sweep();
        table.entries
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table<T>> {
        // Every mutation is one push or one retain: a poisoned table is still valid.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T> Table<T> {
    fn sweep(&mut self) {
        self.buckets.retain(|_, bucket| {
            bucket.retain(|w| w.strong_count() > 0);
            !bucket.is_empty()
        });
        self.entries = self.buckets.values().map(Vec::len).sum();
        self.sweep_at = 2 * self.entries + 64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_are_one_arc_and_dead_ones_are_forgotten() {
        let table = WeakTable::<String>::default();
        let a = table.intern(1, "a".to_string(), |x, y| x == y);
        let b = table.intern(1, "a".to_string(), |x, y| x == y);
        assert!(Arc::ptr_eq(&a, &b));
        let c = table.intern(1, "c".to_string(), |x, y| x == y);
        assert!(!Arc::ptr_eq(&a, &c), "same hash, other content");
        for i in 0..1000 {
            table.intern(i, i.to_string(), |x, y| x == y);
        }
        assert_eq!(table.len(), 2);
        assert!(table.lock().buckets.len() <= 2 + 64);
    }
}
