//! Semantic validation of Istio configs, following Istio's own rules (the webhook's checks
//! plus the reference checks `istioctl analyze` makes). Each function is pure: it takes one
//! object and a [`ValidationContext`] and returns the resolved spec (hosts as FQDNs) when
//! the object has no errors, plus every finding with its field path.

mod common;
mod destination_rule;
mod service_entry;
mod virtual_service;

use std::collections::{BTreeSet, HashMap, HashSet};

pub use destination_rule::validate_destination_rule;
pub use service_entry::validate_service_entry;
pub use virtual_service::validate_virtual_service;

use crate::config::ConfigError;
use crate::model::ExportTo;
use crate::push_context::hosts::host_matches;

/// The outcome of validating one object.
#[derive(Clone, Debug, PartialEq)]
pub struct Validated<T> {
    /// The resolved spec; `None` when there is at least one error.
    pub spec: Option<T>,
    pub findings: Vec<ConfigError>,
}

impl<T> Validated<T> {
    fn new(spec: T, findings: Vec<ConfigError>) -> Self {
        let ok = !findings.iter().any(ConfigError::is_error);
        Validated {
            spec: ok.then_some(spec),
            findings,
        }
    }
}

/// What validation may look up beyond the object itself.
pub struct ValidationContext<'a> {
    pub cluster_domain: &'a str,
    /// Subsets defined by the DestinationRules the caller accepted.
    pub subsets: &'a SubsetIndex,
    /// Hosts of the known services; `None` skips the "unknown host" warnings.
    pub known_hosts: Option<&'a KnownHosts>,
}

/// Host names of the known services, indexed for lookups by concrete host.
#[derive(Clone, Debug, Default)]
pub struct KnownHosts {
    exact: HashSet<String>,
    wildcards: Vec<String>,
}

impl KnownHosts {
    pub fn new<'h>(hosts: impl IntoIterator<Item = &'h str>) -> Self {
        let mut known = KnownHosts::default();
        for h in hosts {
            if h.starts_with('*') {
                known.wildcards.push(h.to_string());
            } else {
                known.exact.insert(h.to_string());
            }
        }
        known
    }

    /// Whether a service answers for `host` (exactly or through a wildcard host).
    pub fn covers(&self, host: &str) -> bool {
        self.exact.contains(host) || self.wildcards.iter().any(|w| host_matches(w, host))
    }
}

/// Subsets by DestinationRule host, with the rule's namespace and visibility. Exact hosts
/// are indexed; wildcard hosts are scanned.
#[derive(Clone, Debug, Default)]
pub struct SubsetIndex {
    exact: HashMap<String, Vec<SubsetEntry>>,
    wildcards: Vec<SubsetEntry>,
}

#[derive(Clone, Debug)]
struct SubsetEntry {
    host: String,
    namespace: String,
    export_to: ExportTo,
    subsets: BTreeSet<String>,
}

impl SubsetIndex {
    /// Records the subsets of one accepted DestinationRule (`host` already resolved).
    pub fn add(
        &mut self,
        host: &str,
        namespace: &str,
        export_to: ExportTo,
        subsets: impl IntoIterator<Item = String>,
    ) {
        let entry = SubsetEntry {
            host: host.to_string(),
            namespace: namespace.to_string(),
            export_to,
            subsets: subsets.into_iter().collect(),
        };
        if host.starts_with('*') {
            self.wildcards.push(entry);
        } else {
            self.exact.entry(host.to_string()).or_default().push(entry);
        }
    }

    /// Convenience for tests: public rules.
    pub fn from_pairs<'s>(
        rules: impl IntoIterator<Item = (&'s str, &'s str, &'s [&'s str])>,
    ) -> Self {
        let mut index = SubsetIndex::default();
        for (host, ns, subsets) in rules {
            index.add(
                host,
                ns,
                ExportTo::default(),
                subsets.iter().map(|s| s.to_string()),
            );
        }
        index
    }

    /// Whether a DestinationRule visible from `namespace` defines `subset` for `host`.
    pub fn defines(&self, host: &str, namespace: &str, subset: &str) -> bool {
        let exact = self.exact.get(host).into_iter().flatten();
        let wild = self
            .wildcards
            .iter()
            .filter(|e| host_matches(&e.host, host));
        exact.chain(wild).any(|e| {
            e.export_to.is_visible_to(&e.namespace, namespace) && e.subsets.contains(subset)
        })
    }
}
