//! The effective mutual TLS mode of a workload, from the PeerAuthentications that apply to
//! it, with Istio's precedence: the mesh policy (root namespace, no selector), then the
//! namespace policy (no selector), then the workload policy (a selector matching the
//! workload's labels, in its own namespace) — each level overriding the one before unless
//! its mode is `UNSET`; the oldest policy wins among several of one level; `portLevelMtls`
//! of the chosen workload policy overrides per port (`UNSET` there takes the workload's
//! mode). A selector policy in the root namespace selects nothing (as in Istio's sidecar
//! path). Without any policy, a workload is PERMISSIVE.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{PeerAuthenticationConfig, config_age_order};
use crate::api::MtlsMode;
use crate::api::peer_authentication::MutualTls;
use crate::model::labels_match;

/// The mode and per-port overrides that apply to one workload. Modes are never `UNSET`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EffectiveMtls {
    /// The workload's mode (for ports without an override, and for passthrough traffic).
    pub mode: MtlsMode,
    /// Port-level overrides of the workload policy, by workload port.
    pub per_port: BTreeMap<u32, MtlsMode>,
}

impl Default for EffectiveMtls {
    fn default() -> Self {
        EffectiveMtls {
            mode: MtlsMode::Permissive,
            per_port: BTreeMap::new(),
        }
    }
}

impl EffectiveMtls {
    /// The mode of traffic to a workload port.
    pub fn for_port(&self, port: u32) -> MtlsMode {
        self.per_port.get(&port).copied().unwrap_or(self.mode)
    }
}

/// Composes the policies applying to a workload in `namespace` with `labels`.
/// `candidates` are the accepted policies of the workload's namespace and the root
/// namespace, in any order (others are ignored).
pub fn compose<'a>(
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    candidates: impl IntoIterator<Item = &'a Arc<PeerAuthenticationConfig>>,
) -> EffectiveMtls {
    let mut mesh: Option<&PeerAuthenticationConfig> = None;
    let mut ns: Option<&PeerAuthenticationConfig> = None;
    let mut workload: Option<&PeerAuthenticationConfig> = None;
    let older = |cur: Option<&PeerAuthenticationConfig>, c: &PeerAuthenticationConfig| {
        cur.is_none_or(|cur| istio_age_order(c, cur).is_lt())
    };
    for c in candidates {
        let c = &**c;
        if c.spec.has_workload_selector() {
            let selects = c.meta.namespace == namespace
                && c.meta.namespace != root_namespace
                && c.spec
                    .selector
                    .as_ref()
                    .is_some_and(|s| labels_match(&s.match_labels, labels));
            if selects && older(workload, c) {
                workload = Some(c);
            }
        } else if c.meta.namespace == root_namespace {
            if older(mesh, c) {
                mesh = Some(c);
            }
        } else if c.meta.namespace == namespace && older(ns, c) {
            ns = Some(c);
        }
    }
    let explicit = |c: Option<&PeerAuthenticationConfig>| {
        c.and_then(|c| c.spec.mtls.as_ref())
            .and_then(MutualTls::explicit_mode)
    };
    let mut out = EffectiveMtls::default();
    for level in [mesh, ns, workload] {
        if let Some(mode) = explicit(level) {
            out.mode = mode;
        }
    }
    if let Some(ports) = workload.and_then(|w| w.spec.port_level_mtls.as_ref()) {
        out.per_port = ports
            .iter()
            .map(|(port, mtls)| (*port, mtls.explicit_mode().unwrap_or(out.mode)))
            .collect();
    }
    out
}

/// Istio's order among policies: creation time, then name, then namespace.
fn istio_age_order(
    a: &PeerAuthenticationConfig,
    b: &PeerAuthenticationConfig,
) -> std::cmp::Ordering {
    a.meta
        .creation_ms
        .cmp(&b.meta.creation_ms)
        .then_with(|| a.meta.name.cmp(&b.meta.name))
        .then_with(|| config_age_order(&a.meta, &b.meta))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PeerAuthenticationSpec, TypeWorkloadSelector};
    use crate::push_context::{Config, ConfigMeta};

    fn pa(
        ns: &str,
        name: &str,
        age: i64,
        selector: &[(&str, &str)],
        mode: Option<MtlsMode>,
        ports: &[(u32, Option<MtlsMode>)],
    ) -> Arc<PeerAuthenticationConfig> {
        Arc::new(Config {
            meta: ConfigMeta {
                name: name.into(),
                namespace: ns.into(),
                creation_ms: age,
                generation: 1,
            },
            spec: PeerAuthenticationSpec {
                selector: (!selector.is_empty()).then(|| TypeWorkloadSelector {
                    match_labels: selector
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                }),
                mtls: mode.map(|m| MutualTls { mode: Some(m) }),
                port_level_mtls: (!ports.is_empty()).then(|| {
                    ports
                        .iter()
                        .map(|(p, m)| (*p, MutualTls { mode: *m }))
                        .collect()
                }),
            },
        })
    }

    fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
        l.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const ROOT: &str = "istio-system";

    #[test]
    fn no_policy_is_permissive() {
        let e = compose(ROOT, "app", &labels(&[("app", "a")]), []);
        assert_eq!(e, EffectiveMtls::default());
        assert_eq!(e.for_port(8080), MtlsMode::Permissive);
    }

    #[test]
    fn mesh_then_namespace_then_workload() {
        use MtlsMode::*;
        let all = [
            pa(ROOT, "mesh", 1, &[], Some(Strict), &[]),
            pa("app", "ns", 2, &[], Some(Disable), &[]),
            pa("app", "wl", 3, &[("app", "a")], Some(Permissive), &[]),
        ];
        let l = labels(&[("app", "a")]);
        assert_eq!(compose(ROOT, "app", &l, &all[..1]).mode, Strict);
        assert_eq!(compose(ROOT, "app", &l, &all[..2]).mode, Disable);
        assert_eq!(compose(ROOT, "app", &l, &all).mode, Permissive);
        // Another namespace sees only the mesh policy.
        assert_eq!(compose(ROOT, "other", &l, &all).mode, Strict);
        // A workload the selector does not match gets the namespace's.
        assert_eq!(
            compose(ROOT, "app", &labels(&[("app", "b")]), &all).mode,
            Disable
        );
    }

    #[test]
    fn unset_inherits_and_mesh_unset_is_permissive() {
        use MtlsMode::*;
        let l = labels(&[("app", "a")]);
        let all = [
            pa(ROOT, "mesh", 1, &[], Some(Unset), &[]),
            pa("app", "ns", 2, &[], None, &[]),
        ];
        assert_eq!(compose(ROOT, "app", &l, &all).mode, Permissive);
        let all = [
            pa(ROOT, "mesh", 1, &[], Some(Strict), &[]),
            pa("app", "ns", 2, &[], Some(Unset), &[]),
            pa(
                "app",
                "wl",
                3,
                &[("app", "a")],
                None,
                &[(80, None), (81, Some(Disable))],
            ),
        ];
        let e = compose(ROOT, "app", &l, &all);
        assert_eq!(e.mode, Strict);
        assert_eq!(e.for_port(80), Strict);
        assert_eq!(e.for_port(81), Disable);
        assert_eq!(e.for_port(82), Strict);
    }

    #[test]
    fn oldest_wins_within_a_level_and_root_selectors_select_nothing() {
        use MtlsMode::*;
        let l = labels(&[("app", "a")]);
        let all = [
            pa("app", "newer", 5, &[], Some(Disable), &[]),
            pa("app", "older", 4, &[], Some(Strict), &[]),
            pa("app", "b-wl", 7, &[("app", "a")], Some(Permissive), &[]),
            pa("app", "a-wl", 7, &[("app", "a")], Some(Disable), &[]),
            pa(
                ROOT,
                "root-wl",
                1,
                &[("app", "a")],
                Some(Strict),
                &[(80, Some(Strict))],
            ),
        ];
        assert_eq!(compose(ROOT, "app", &l, &all[..2]).mode, Strict);
        // Equal ages: the name decides (as Istio's sort).
        assert_eq!(compose(ROOT, "app", &l, &all[..4]).mode, Disable);
        let e = compose(ROOT, "other", &l, &all[4..]);
        assert_eq!(e, EffectiveMtls::default());
    }
}
