//! Who sees what: Istio 1.30's `exportTo` for services (Kubernetes Services with the
//! `networking.istio.io/exportTo` annotation, ServiceEntry hosts), VirtualServices and
//! DestinationRules, with MeshConfig's `defaultServiceExportTo`,
//! `defaultVirtualServiceExportTo` and `defaultDestinationRuleExportTo`.
//!
//! The rules, as `pilot/pkg/model/push_context.go` (tag 1.30.3) indexes them:
//! - an object's own `exportTo` replaces the mesh default (an empty list is "unset"; an
//!   unset mesh default is `*`);
//! - services and VirtualServices (`initServiceRegistry`, `initVirtualServices`): `*`
//!   anywhere makes the object public and the other entries do not matter; otherwise `~`
//!   anywhere hides it from everyone; otherwise `.` and the owner's own namespace name
//!   mean "the owner's namespace" and other entries name namespaces;
//! - a VirtualService a sidecar uses for a host is the one with the most specific host,
//!   then (equal hosts) the first in Istio's list order: exported privately (`.`/own
//!   namespace) to the proxy's namespace, then exported to it by name, then public —
//!   oldest first within each (`SelectVirtualServices`, `computeWildcardHostVirtualServiceIndex`);
//! - a delegate VirtualService is used by a root only when it is exported to the root's
//!   namespace or public (`virtualservice_controller.go`);
//! - DestinationRules (`setDestinationRules`, `destinationRule`,
//!   `getExportedDestinationRuleFromNamespace`, `mergeDestinationRule`,
//!   `SidecarScope.DestinationRule`): see [`DestinationRuleIndex`].
//!
//! This module answers only `exportTo`; a Sidecar's egress imports (if any) narrow what
//! it allows further and are applied by their own module.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::{ConfigMeta, DestinationRuleConfig, EffectiveDestinationRule, hosts};
use crate::api::DestinationRuleSpec;
use crate::mesh_config::MeshConfig;
use crate::model::{Proxy, Service, labels_match};

/// `exportTo` resolved for one owner: who may see the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exported {
    /// `*`: every namespace.
    Public,
    /// `~`: nobody.
    Nobody,
    /// The owner's own namespace (`.` or its name), and namespaces named explicitly.
    To {
        own_namespace: bool,
        others: BTreeSet<String>,
    },
}

/// How a proxy's namespace sees an exported object, in Istio's list order (private first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reach {
    /// Exported with `.` (or its own namespace's name) and the proxy is in that namespace.
    Private,
    /// Exported to the proxy's namespace by name.
    Named,
    /// Exported with `*`.
    Public,
}

impl Exported {
    /// Istio's reading of `own` (falling back to `mesh_default`, then `*`) for an object of
    /// `owner_namespace`.
    pub fn resolve(own: &[String], mesh_default: &[String], owner_namespace: &str) -> Exported {
        let entries: &[String] = if !own.is_empty() {
            own
        } else if !mesh_default.is_empty() {
            mesh_default
        } else {
            return Exported::Public;
        };
        if entries.iter().any(|e| e == "*") {
            return Exported::Public;
        }
        if entries.iter().any(|e| e == "~") {
            return Exported::Nobody;
        }
        let mut own_namespace = false;
        let mut others = BTreeSet::new();
        for e in entries {
            if e == "." || e == owner_namespace {
                own_namespace = true;
            } else {
                others.insert(e.clone());
            }
        }
        Exported::To {
            own_namespace,
            others,
        }
    }

    /// How a proxy in `namespace` sees an object of `owner_namespace`, if at all.
    pub fn reach(&self, owner_namespace: &str, namespace: &str) -> Option<Reach> {
        match self {
            Exported::Public => Some(Reach::Public),
            Exported::Nobody => None,
            Exported::To {
                own_namespace,
                others,
            } => {
                if *own_namespace && owner_namespace == namespace {
                    Some(Reach::Private)
                } else if others.contains(namespace) {
                    Some(Reach::Named)
                } else {
                    None
                }
            }
        }
    }
}

/// Whether a proxy in `namespace` sees `service` (Istio's `ServiceIndex`).
pub fn service_visible(mesh: &MeshConfig, service: &Service, namespace: &str) -> bool {
    Exported::resolve(
        &service.export_to.0,
        &mesh.default_service_export_to,
        &service.namespace,
    )
    .reach(&service.namespace, namespace)
    .is_some()
}

/// How a proxy in `namespace` sees a VirtualService of `owner_namespace` with `export_to`.
pub fn virtual_service_reach(
    mesh: &MeshConfig,
    owner_namespace: &str,
    export_to: &[String],
    namespace: &str,
) -> Option<Reach> {
    Exported::resolve(
        export_to,
        &mesh.default_virtual_service_export_to,
        owner_namespace,
    )
    .reach(owner_namespace, namespace)
}

/// Whether a root VirtualService of `root_namespace` may use a delegate of
/// `delegate_namespace` exporting itself with `export_to`: public, or exported to the
/// root's namespace (`.` counting as the delegate's own).
pub fn delegate_visible(
    mesh: &MeshConfig,
    delegate_namespace: &str,
    export_to: &[String],
    root_namespace: &str,
) -> bool {
    virtual_service_reach(mesh, delegate_namespace, export_to, root_namespace).is_some()
}

/// Same-host DestinationRules consolidated as Istio's `ConsolidatedDestRule`: the first
/// rule's spec with later rules' new subsets and (if it had none) traffic policy.
#[derive(Clone, Debug)]
struct Consolidated {
    /// The `exportTo` entries as written (`{"."}` for a workload-selector rule); Istio
    /// merges rules only when these sets are equal.
    export_to: BTreeSet<String>,
    namespace: String,
    spec: DestinationRuleSpec,
    sources: Vec<ConfigMeta>,
}

/// Consolidated rules of one namespace pool, by host (exact and wildcard).
#[derive(Clone, Debug, Default)]
struct HostRules {
    exact: HashMap<String, Vec<Consolidated>>,
    wildcard: BTreeMap<String, Vec<Consolidated>>,
}

impl HostRules {
    /// Istio's `mergeDestinationRule` with `ENABLE_ENHANCED_DESTINATIONRULE_MERGE` on
    /// (1.30's default).
    fn merge(&mut self, rule: &DestinationRuleConfig, export_to: &BTreeSet<String>) {
        let host = rule.spec.host.clone();
        let list = if host.starts_with('*') {
            self.wildcard.entry(host).or_default()
        } else {
            self.exact.entry(host).or_default()
        };
        let mut append_separately = true;
        for existing in list.iter_mut() {
            if *export_to == existing.export_to {
                append_separately = false;
            } else if !existing.export_to.is_empty() && export_to.is_superset(&existing.export_to) {
                // Merged into the narrower one and kept on its own as well.
                append_separately = true;
            } else {
                append_separately = true;
                continue;
            }
            let new_sel = rule
                .spec
                .workload_selector
                .as_ref()
                .map(|s| &s.match_labels);
            let old_sel = existing
                .spec
                .workload_selector
                .as_ref()
                .map(|s| &s.match_labels);
            match (old_sel, new_sel) {
                (Some(a), Some(b)) if a != b => {
                    append_separately = true;
                    continue;
                }
                (Some(_), Some(_)) | (None, None) => append_separately = false,
                // One with a selector and one without: merged, and `append_separately`
                // keeps what the exportTo comparison said (Istio's code, as written).
                _ => {}
            }
            for subset in &rule.spec.subsets {
                if !existing.spec.subsets.iter().any(|s| s.name == subset.name) {
                    existing.spec.subsets.push(subset.clone());
                }
            }
            if existing.spec.traffic_policy.is_none() {
                existing.spec.traffic_policy = rule.spec.traffic_policy.clone();
            }
            existing.sources.push(rule.meta.clone());
        }
        if append_separately || list.is_empty() {
            list.push(Consolidated {
                export_to: export_to.clone(),
                namespace: rule.meta.namespace.clone(),
                spec: rule.spec.clone(),
                sources: vec![rule.meta.clone()],
            });
        }
    }

    /// Istio's `MostSpecificHostMatch`: the exact host, else the most specific wildcard.
    fn most_specific(&self, hostname: &str) -> Option<&[Consolidated]> {
        if !hostname.starts_with('*')
            && let Some(list) = self.exact.get(hostname)
        {
            return Some(list);
        }
        if let Some(list) = self.wildcard.get(hostname) {
            return Some(list);
        }
        self.wildcard
            .iter()
            .filter(|(pattern, _)| hosts::host_matches(pattern, hostname) && *pattern != hostname)
            .max_by(|(a, _), (b, _)| {
                hosts::specificity(a)
                    .cmp(&hosts::specificity(b))
                    // Equal length: a stable choice (Istio iterates a map here).
                    .then_with(|| b.cmp(a))
            })
            .map(|(_, list)| list.as_slice())
    }
}

/// DestinationRules indexed as Istio 1.30 indexes them for visibility:
/// - `namespace_local[ns]`: rules of `ns` visible in `ns` (no `exportTo`, or one holding
///   `*`, `.` or `ns`; the mesh default does not matter here);
/// - `exported[ns]`: rules of `ns` exported beyond it (anything but "`.` or `ns` alone",
///   and, without `exportTo`, a mesh default not holding `.`);
/// - `root_local`: the root namespace's rules visible only there.
///
/// A workload-selector rule counts as `exportTo: ["."]`. Lookup for a proxy in namespace
/// P and a service in namespace S: P's local pool (for a proxy in the root namespace, the
/// root's private pool), else S's exported pool, else the root's exported pool — in each
/// pool the most specific host only, and in exported pools only rules whose `exportTo` is
/// empty, holds `*` or names P. Of the chosen host's consolidated rules, a workload-selector
/// rule of P's namespace matching the proxy wins, else the last rule without a selector.
#[derive(Clone, Debug, Default)]
pub struct DestinationRuleIndex {
    root_namespace: String,
    namespace_local: HashMap<String, HostRules>,
    exported: HashMap<String, HostRules>,
    root_local: HostRules,
}

impl DestinationRuleIndex {
    pub fn build(mesh: &MeshConfig, rules: &[Arc<DestinationRuleConfig>]) -> DestinationRuleIndex {
        let mut sorted: Vec<&Arc<DestinationRuleConfig>> = rules.iter().collect();
        // Istio's sortConfigBySelectorAndCreationTime.
        sorted.sort_by(|a, b| {
            b.spec
                .workload_selector
                .is_some()
                .cmp(&a.spec.workload_selector.is_some())
                .then_with(|| a.meta.creation_ms.cmp(&b.meta.creation_ms))
                .then_with(|| a.meta.name.cmp(&b.meta.name))
                .then_with(|| a.meta.namespace.cmp(&b.meta.namespace))
        });
        let mut index = DestinationRuleIndex {
            root_namespace: mesh.root_namespace.clone(),
            ..Default::default()
        };
        let default_private = mesh
            .default_destination_rule_export_to
            .iter()
            .any(|e| e == ".");
        for rule in sorted {
            let ns = rule.meta.namespace.as_str();
            let export_to: BTreeSet<String> = if rule.spec.workload_selector.is_some() {
                BTreeSet::from([".".to_string()])
            } else {
                rule.spec.export_to.iter().cloned().collect()
            };
            if export_to.is_empty()
                || export_to.contains("*")
                || export_to.contains(".")
                || export_to.contains(ns)
            {
                index
                    .namespace_local
                    .entry(ns.to_string())
                    .or_default()
                    .merge(rule, &export_to);
            }
            let private_only = if export_to.is_empty() {
                default_private
            } else {
                export_to.len() == 1 && (export_to.contains(".") || export_to.contains(ns))
            };
            if !private_only {
                index
                    .exported
                    .entry(ns.to_string())
                    .or_default()
                    .merge(rule, &export_to);
            } else if ns == index.root_namespace {
                index.root_local.merge(rule, &export_to);
            }
        }
        index
    }

    /// The DestinationRule for traffic from `proxy` to `hostname` (a service of
    /// `service_namespace`, when known).
    pub fn lookup(
        &self,
        proxy: &Proxy,
        hostname: &str,
        service_namespace: Option<&str>,
    ) -> Option<EffectiveDestinationRule> {
        let client = proxy.namespace.as_str();
        let local = if client != self.root_namespace {
            self.namespace_local.get(client)
        } else {
            Some(&self.root_local)
        };
        if let Some(list) = local.and_then(|pool| pool.most_specific(hostname)) {
            return pick(proxy, list.iter());
        }
        let exported_from = |owner: &str| -> Option<Vec<&Consolidated>> {
            let list = self.exported.get(owner)?.most_specific(hostname)?;
            let visible: Vec<&Consolidated> = list
                .iter()
                .filter(|c| {
                    c.export_to.is_empty()
                        || c.export_to.contains("*")
                        || c.export_to.contains(client)
                })
                .collect();
            (!visible.is_empty()).then_some(visible)
        };
        let tiers = service_namespace
            .into_iter()
            .chain(std::iter::once(self.root_namespace.as_str()));
        for owner in tiers {
            if let Some(list) = exported_from(owner) {
                return pick(proxy, list.into_iter());
            }
        }
        None
    }
}

/// Istio's `SidecarScope.DestinationRule` (outbound): a matching workload-selector rule of
/// the proxy's own namespace, else the last rule without a selector.
fn pick<'a>(
    proxy: &Proxy,
    list: impl Iterator<Item = &'a Consolidated>,
) -> Option<EffectiveDestinationRule> {
    let mut catch_all = None;
    for c in list {
        match &c.spec.workload_selector {
            None => catch_all = Some(c),
            Some(sel) => {
                if c.namespace == proxy.namespace && labels_match(&sel.match_labels, &proxy.labels)
                {
                    return Some(effective(c));
                }
            }
        }
    }
    catch_all.map(effective)
}

fn effective(c: &Consolidated) -> EffectiveDestinationRule {
    EffectiveDestinationRule {
        spec: c.spec.clone(),
        sources: c.sources.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn export_to_reads_like_istio_service_index() {
        let r = |own: &[&str], def: &[&str], ns: &str| {
            Exported::resolve(&e(own), &e(def), "a").reach("a", ns)
        };
        assert_eq!(
            r(&[], &[], "b"),
            Some(Reach::Public),
            "unset everywhere is *"
        );
        assert_eq!(r(&[], &["."], "b"), None, "the mesh default applies");
        assert_eq!(r(&[], &["."], "a"), Some(Reach::Private));
        assert_eq!(
            r(&["*"], &["."], "b"),
            Some(Reach::Public),
            "own beats default"
        );
        assert_eq!(
            r(&["a"], &[], "a"),
            Some(Reach::Private),
            "own name is private"
        );
        assert_eq!(r(&["b", "c"], &[], "c"), Some(Reach::Named));
        assert_eq!(r(&["b", "c"], &[], "a"), None, "not its own namespace");
        assert_eq!(r(&["~"], &[], "a"), None, "~ hides it even at home");
        assert_eq!(r(&["~", "."], &[], "a"), None, "~ beats . (annotation)");
        assert_eq!(r(&["~", "*"], &[], "b"), Some(Reach::Public), "* beats ~");
        assert_eq!(r(&[" "], &[], "a"), None, "an unknown entry names no one");
    }
}
