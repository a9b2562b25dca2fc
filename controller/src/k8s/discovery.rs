//! MeshConfig `discoverySelectors`: which namespaces' objects the controller keeps, as
//! Istio 1.30's discovery namespace filter decides (`pkg/kube/namespace/filter.go`) with
//! enhanced resource scoping on (1.30's default), so Istio's own config kinds are
//! filtered too.
//!
//! Kubernetes cannot filter a watch by a namespace's labels, so the filter is applied by
//! the watch tasks to every namespaced object as it arrives, before it is queued or
//! stored ([`Selection::allows`]). The mode loop owns the Namespace store (name and
//! labels) and the mesh config, computes the [`Selection`] ([`select`]) whenever either
//! changes, drops what a narrower selection leaves out of the stores at once, and
//! publishes it; each namespaced watch restarts (a fresh list) when it changes, so the
//! objects of a newly selected namespace appear. Cluster-scoped kinds (Nodes, Namespaces)
//! are never filtered; the root namespace gets no special treatment (as in Istio: select
//! it if its configuration should apply).

use std::collections::{BTreeMap, BTreeSet};

use pilotfish_mesh::mesh_config::NamespaceSelector;

/// The namespaces whose objects are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Selectors are set but the namespaces are not listed yet: nothing can be judged,
    /// so namespaced watches wait (as Istio waits for its namespace informer).
    Pending,
    /// No selectors: every namespace.
    All,
    /// The namespaces some selector matches.
    Only(BTreeSet<String>),
}

impl Selection {
    /// Whether an object of `namespace` is kept (`""`: cluster-scoped, always kept).
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Selection::Pending => false,
            Selection::All => true,
            Selection::Only(set) => namespace.is_empty() || set.contains(namespace),
        }
    }

    /// Whether `self` selects a namespace `before` did not (a watch filtered by `before`
    /// must list again to see its objects; a narrower selection needs no new list).
    pub fn widens(&self, before: &Selection) -> bool {
        match (before, self) {
            (_, Selection::Pending) => false,
            (Selection::Pending, _) => true,
            (Selection::All, _) => false,
            (Selection::Only(_), Selection::All) => true,
            (Selection::Only(old), Selection::Only(new)) => !new.is_subset(old),
        }
    }

    /// Whether namespaced watches may list now.
    pub fn is_known(&self) -> bool {
        !matches!(self, Selection::Pending)
    }
}

/// The selection `selectors` make of `namespaces` (name → labels); `namespaces_listed`
/// says whether the Namespace list is complete. Any selector matching selects a
/// namespace; an empty selector matches every namespace; no selectors select all.
pub fn select<'a>(
    selectors: &[NamespaceSelector],
    namespaces_listed: bool,
    namespaces: impl IntoIterator<Item = (&'a str, &'a BTreeMap<String, String>)>,
) -> Selection {
    if selectors.is_empty() {
        return Selection::All;
    }
    if !namespaces_listed {
        return Selection::Pending;
    }
    Selection::Only(
        namespaces
            .into_iter()
            .filter(|(_, labels)| selectors.iter().any(|s| s.matches(labels)))
            .map(|(name, _)| name.to_string())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::mesh_config::MeshConfig;

    fn selectors(yaml: &str) -> Vec<NamespaceSelector> {
        MeshConfig::from_yaml(yaml)
            .unwrap()
            .config
            .discovery_selectors
    }

    #[test]
    fn selection_follows_istio_discovery_filter() {
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (prod, dev, bare) = (
            labels(&[("env", "prod")]),
            labels(&[("env", "dev"), ("team", "x")]),
            labels(&[]),
        );
        let namespaces = [("a", &prod), ("b", &dev), ("c", &bare)];
        assert_eq!(select(&[], false, namespaces), Selection::All);
        let sel = selectors(
            "discoverySelectors: [{matchLabels: {env: prod}}, {matchExpressions: [{key: team, operator: Exists}]}]",
        );
        assert_eq!(select(&sel, false, namespaces), Selection::Pending);
        let chosen = select(&sel, true, namespaces);
        assert_eq!(
            chosen,
            Selection::Only(["a".to_string(), "b".to_string()].into())
        );
        assert!(chosen.allows("a") && chosen.allows("b") && !chosen.allows("c"));
        assert!(chosen.allows(""), "cluster-scoped objects are kept");
        assert!(!Selection::Pending.allows("a"));
        let only = |names: &[&str]| Selection::Only(names.iter().map(|n| n.to_string()).collect());
        assert!(only(&["a", "b"]).widens(&only(&["a"])));
        assert!(
            !only(&["a"]).widens(&only(&["a", "b"])),
            "narrower: no new list"
        );
        assert!(Selection::All.widens(&only(&["a"])));
        assert!(!only(&["a"]).widens(&Selection::All));
        assert!(only(&[]).widens(&Selection::Pending));
        let everything = selectors("discoverySelectors: [{}]");
        assert_eq!(
            select(&everything, true, namespaces),
            Selection::Only(["a", "b", "c"].map(String::from).into())
        );
    }
}
