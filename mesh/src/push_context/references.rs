//! References between objects, which Istio never rejects an object for: a VirtualService
//! destination naming a host no service answers for, or a subset no visible
//! DestinationRule defines. The object is served; the route to the missing subset fails
//! with 503 (its cluster does not exist, so the generators send it to the black-hole
//! cluster), as in Istio. Each such reference is a warning naming the field.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::api::{Destination, VirtualServiceSpec};
use crate::config::{ConfigError, ConfigKey};
use crate::push_context::hosts::host_matches;
use crate::push_context::visibility::Exported;

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
    export_to: Exported,
    subsets: BTreeSet<String>,
}

impl SubsetIndex {
    /// Records the subsets of one accepted DestinationRule (`host` already resolved).
    pub fn add(
        &mut self,
        host: &str,
        namespace: &str,
        export_to: Exported,
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

    /// Whether a DestinationRule visible from `namespace` defines `subset` for `host`.
    pub fn defines(&self, host: &str, namespace: &str, subset: &str) -> bool {
        let exact = self.exact.get(host).into_iter().flatten();
        let wild = self
            .wildcards
            .iter()
            .filter(|e| host_matches(&e.host, host));
        exact.chain(wild).any(|e| {
            e.export_to.reach(&e.namespace, namespace).is_some() && e.subsets.contains(subset)
        })
    }
}

/// Warnings about the destinations of one accepted VirtualService (resolved spec) of
/// `namespace`: unknown hosts (when `known` is given) and undefined subsets.
pub fn virtual_service_references(
    key: &ConfigKey,
    spec: &VirtualServiceSpec,
    subsets: &SubsetIndex,
    known: Option<&KnownHosts>,
) -> Vec<ConfigError> {
    let mut out = Vec::new();
    let mut check = |path: String, d: &Destination| {
        if let Some(known) = known
            && !known.covers(&d.host)
        {
            out.push(ConfigError::warning(
                key,
                format!("{path}.host"),
                format!(
                    "host {:?} is not a known service or ServiceEntry host",
                    d.host
                ),
            ));
        }
        if let Some(subset) = d.subset.as_deref().filter(|s| !s.is_empty())
            && !subsets.defines(&d.host, &key.namespace, subset)
        {
            out.push(ConfigError::warning(
                key,
                format!("{path}.subset"),
                format!(
                    "subset {subset:?} is not defined by any DestinationRule for host {:?} visible here: requests routed to it fail with 503",
                    d.host
                ),
            ));
        }
    };
    for (i, route) in spec.http.iter().enumerate() {
        for (j, d) in route.route.iter().enumerate() {
            check(
                format!("spec.http[{i}].route[{j}].destination"),
                &d.destination,
            );
        }
        if let Some(m) = &route.mirror {
            check(format!("spec.http[{i}].mirror"), m);
        }
        for (j, m) in route.mirrors.iter().enumerate() {
            check(
                format!("spec.http[{i}].mirrors[{j}].destination"),
                &m.destination,
            );
        }
    }
    for (kind, routes) in [
        ("tcp", spec.tcp.iter().map(|r| &r.route).collect::<Vec<_>>()),
        ("tls", spec.tls.iter().map(|r| &r.route).collect()),
    ] {
        for (i, list) in routes.into_iter().enumerate() {
            for (j, d) in list.iter().enumerate() {
                check(
                    format!("spec.{kind}[{i}].route[{j}].destination"),
                    &d.destination,
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigKind;

    #[test]
    fn an_undefined_subset_is_a_warning_naming_the_route() {
        let mut subsets = SubsetIndex::default();
        subsets.add(
            "reviews.default.svc.cluster.local",
            "default",
            Exported::Public,
            ["v1".to_string()],
        );
        let spec: VirtualServiceSpec = serde_json::from_value(serde_json::json!({
            "hosts": ["reviews.default.svc.cluster.local"],
            "http": [{"route": [
                {"destination": {"host": "reviews.default.svc.cluster.local", "subset": "v1"}, "weight": 50},
                {"destination": {"host": "reviews.default.svc.cluster.local", "subset": "v9"}, "weight": 50}
            ]}]
        }))
        .unwrap();
        let key = ConfigKey::new(ConfigKind::VirtualService, "default", "reviews");
        let found = virtual_service_references(&key, &spec, &subsets, None);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(!found[0].is_error());
        assert_eq!(found[0].path, "spec.http[0].route[1].destination.subset");
        assert!(found[0].message.contains("503"));
    }
}
