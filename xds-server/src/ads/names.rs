//! Subscribed resource names, stored once per distinct set: [`NameSet`] and its interner
//! [`NameSets`].
//!
//! A sidecar subscribes EDS to every cluster it has and RDS to every route configuration
//! its listeners name, so the streams of one scope subscribe to the same long list. Kept
//! per stream, those lists would cost more memory than everything else the stream holds
//! (1,200 names are about 100 KiB). Interned, the streams share one `Arc<NameSet>`, and
//! the engine uses the set's identity as part of the key of the responses it shares.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

use super::intern::WeakTable;

/// A set of resource names, sorted and without duplicates. Equal sets obtained from the
/// same [`NameSets`] are the same `Arc`.
#[derive(Debug, PartialEq, Eq)]
pub struct NameSet {
    names: Box<[String]>,
    hash: u64,
    /// Sum of the names' lengths: what the per-stream byte cap counts.
    bytes: usize,
}

impl NameSet {
    fn from_sorted(names: Vec<String>) -> NameSet {
        let mut hasher = DefaultHasher::new();
        names.hash(&mut hasher);
        NameSet {
            hash: hasher.finish(),
            bytes: names.iter().map(String::len).sum(),
            names: names.into_boxed_slice(),
        }
    }

    /// The empty set (not interned: nothing is keyed on an empty subscription).
    pub fn empty() -> Arc<NameSet> {
        Arc::new(NameSet::from_sorted(Vec::new()))
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Bytes of the names (their lengths summed).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn contains(&self, name: &str) -> bool {
        self.names
            .binary_search_by(|n| n.as_str().cmp(name))
            .is_ok()
    }

    /// The names, in order.
    pub fn iter(&self) -> impl Iterator<Item = &String> {
        self.names.iter()
    }

    /// Whether `names` (in any order, possibly repeated; compared as bytes) is exactly
    /// this set. Used to tell an unchanged SotW request (every ACK repeats the whole list)
    /// without building a set or a string: a list sent in this set's order is one pass.
    pub fn same_as<'a>(&self, names: impl Iterator<Item = &'a [u8]> + Clone) -> bool {
        let mut mine = self.names.iter();
        let mut theirs = names.clone();
        loop {
            match (theirs.next(), mine.next()) {
                (None, None) => return true,
                (Some(a), Some(b)) if a == b.as_bytes() => continue,
                _ => break,
            }
        }
        if !names.clone().all(|n| self.contains_bytes(n)) {
            return false;
        }
        let mut distinct: Vec<&[u8]> = names.collect();
        distinct.sort_unstable();
        distinct.dedup();
        distinct.len() == self.names.len()
    }

    fn contains_bytes(&self, name: &[u8]) -> bool {
        self.names
            .binary_search_by(|n| n.as_bytes().cmp(name))
            .is_ok()
    }
}

impl serde::Serialize for NameSet {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.names.iter())
    }
}

/// The interner: every live set once, by content, held weakly (a set lives as long as
/// some stream subscribes to it).
#[derive(Debug, Default)]
pub struct NameSets {
    table: WeakTable<NameSet>,
}

impl NameSets {
    pub fn new() -> Arc<NameSets> {
        Arc::new(NameSets::default())
    }

    /// The shared set of `names` (sorted and deduplicated here).
    pub fn intern(&self, mut names: Vec<String>) -> Arc<NameSet> {
        names.sort_unstable();
        names.dedup();
        let candidate = NameSet::from_sorted(names);
        self.table.intern(candidate.hash, candidate, |a, b| a == b)
    }

    /// The shared set of `names` if it holds at most `max_names` names of at most
    /// `max_bytes` bytes in all; else nothing is interned and the set's (count, bytes) is
    /// returned, for the error.
    pub fn intern_within(
        &self,
        mut names: Vec<String>,
        max_names: usize,
        max_bytes: usize,
    ) -> Result<Arc<NameSet>, (usize, usize)> {
        names.sort_unstable();
        names.dedup();
        let bytes: usize = names.iter().map(String::len).sum();
        if names.len() > max_names || bytes > max_bytes {
            return Err((names.len(), bytes));
        }
        Ok(self.intern(names))
    }

    /// Live distinct sets.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn equal_sets_are_one_arc_whatever_the_order() {
        let sets = NameSets::default();
        let a = sets.intern(v(&["b", "a", "c"]));
        let b = sets.intern(v(&["c", "a", "b", "a"]));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.iter().collect::<Vec<_>>(), ["a", "b", "c"]);
        let other = sets.intern(v(&["a"]));
        assert!(!Arc::ptr_eq(&a, &other));
        assert_eq!(sets.len(), 2);
    }

    #[test]
    fn sets_nobody_holds_are_forgotten() {
        let sets = NameSets::default();
        for i in 0..1000 {
            sets.intern(v(&[&i.to_string()]));
        }
        let kept = sets.intern(v(&["kept"]));
        assert_eq!(sets.len(), 1);
        assert!(Arc::ptr_eq(&kept, &sets.intern(v(&["kept"]))));
    }

    #[test]
    fn same_as_compares_content_not_order() {
        let sets = NameSets::default();
        let s = sets.intern(v(&["a", "b"]));
        let same = |names: &[&str]| s.same_as(names.iter().map(|n| n.as_bytes()));
        assert!(same(&["a", "b"]));
        assert!(same(&["b", "a"]));
        assert!(same(&["b", "a", "b"]));
        assert!(same(&["a", "b", "b"]));
        assert!(!same(&["a", "a"]));
        assert!(!same(&["a"]));
        assert!(!same(&["a", "b", "c"]));
        assert!(!same(&[]));
        assert!(s.contains("b") && !s.contains("c"));
    }
}
