//! Which AuthorizationPolicies apply to a workload, as Istio 1.30 selects them for a
//! sidecar or proxyless gRPC server (`pilot/pkg/model/authorization.go`
//! `ListAuthorizationPolicies` with `policyattachment.go` `ShouldAttachPolicy`):
//!
//! - policies of the root namespace and of the workload's namespace are candidates (the
//!   root's first, each namespace's oldest first);
//! - a policy with `targetRef`/`targetRefs` never applies to a sidecar: Istio attaches
//!   those only to gateways and waypoints (Pilotfish serves neither) — the builder warns;
//! - otherwise a policy applies when it has no selector, or its selector's labels are a
//!   subset of the workload's (an empty selector selects everything) — a root-namespace
//!   selector matches workloads of every namespace;
//! - the applicable policies are grouped by action.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::Config;
use crate::api::{AuthorizationAction, AuthorizationPolicySpec};

/// An accepted AuthorizationPolicy as the snapshot carries it: the spec (Istio's JSON
/// form) and whether the policy is dry-run (the `istio.io/dry-run` annotation, which
/// decides between enforced and shadow rules; carried beside the spec because the
/// snapshot keeps no annotations).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct AuthorizationPolicyEntry {
    #[serde(flatten)]
    pub policy: AuthorizationPolicySpec,
    #[serde(
        default,
        rename = "pilotfishDryRun",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub dry_run: bool,
}

pub type AuthorizationPolicyConfig = Config<AuthorizationPolicyEntry>;

/// The policies that apply to one workload, grouped by action (Istio's
/// `AuthorizationPoliciesResult`); each list in Istio's order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkloadAuthorization {
    pub custom: Vec<Arc<AuthorizationPolicyConfig>>,
    pub deny: Vec<Arc<AuthorizationPolicyConfig>>,
    pub allow: Vec<Arc<AuthorizationPolicyConfig>>,
    pub audit: Vec<Arc<AuthorizationPolicyConfig>>,
}

impl WorkloadAuthorization {
    /// Whether no policy applies (the workload gets no RBAC filter).
    pub fn is_empty(&self) -> bool {
        self.custom.is_empty()
            && self.deny.is_empty()
            && self.allow.is_empty()
            && self.audit.is_empty()
    }
}

/// Whether `policy` applies to a sidecar workload with `labels` (Istio's
/// `ShouldAttachPolicy` for a non-gateway workload).
pub fn selects_workload(
    policy: &AuthorizationPolicySpec,
    labels: &BTreeMap<String, String>,
) -> bool {
    if !policy.effective_target_refs().is_empty() {
        return false;
    }
    policy
        .selector
        .as_ref()
        .is_none_or(|s| s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// The policies among `candidates` (already limited to the root and workload namespaces,
/// in Istio's order) that apply to a workload with `labels`, grouped by action.
pub fn select<'a>(
    candidates: impl IntoIterator<Item = &'a Arc<AuthorizationPolicyConfig>>,
    labels: &BTreeMap<String, String>,
) -> WorkloadAuthorization {
    group(
        candidates
            .into_iter()
            .filter(|p| selects_workload(&p.spec.policy, labels)),
    )
}

/// Groups policies by action, keeping their order.
pub fn group<'a>(
    policies: impl IntoIterator<Item = &'a Arc<AuthorizationPolicyConfig>>,
) -> WorkloadAuthorization {
    let mut out = WorkloadAuthorization::default();
    for policy in policies {
        let list = match policy.spec.policy.action() {
            AuthorizationAction::Allow => &mut out.allow,
            AuthorizationAction::Deny => &mut out.deny,
            AuthorizationAction::Audit => &mut out.audit,
            AuthorizationAction::Custom => &mut out.custom,
        };
        list.push(policy.clone());
    }
    out
}

/// The annotation that makes a policy dry-run (shadow rules only).
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Istio's `ValidateIPs`: an address, or a CIDR prefix (Go's `netip.ParsePrefix`: the
/// address may have host bits set; the length fits the family).
pub fn parse_ip_block(value: &str) -> Option<(IpAddr, u8)> {
    match value.split_once('/') {
        Some((addr, len)) => {
            let addr: IpAddr = addr.parse().ok()?;
            // Go refuses leading zeros and signs in the length.
            if len.is_empty()
                || (len.len() > 1 && len.starts_with('0'))
                || !len.bytes().all(|b| b.is_ascii_digit())
            {
                return None;
            }
            let len: u8 = len.parse().ok()?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            (len <= max).then_some((addr, len))
        }
        None => {
            let addr: IpAddr = value.parse().ok()?;
            Some((addr, if addr.is_ipv4() { 32 } else { 128 }))
        }
    }
}

/// Istio's `ValidatePorts`: decimal 0..65535.
pub fn parse_port(value: &str) -> Option<u32> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse::<u32>().ok().filter(|p| *p <= 65535)
}

/// The path template operators (`{*}`, `{**}`).
pub const MATCH_ONE_TEMPLATE: &str = "{*}";
pub const MATCH_ANY_TEMPLATE: &str = "{**}";

/// Whether a path uses the template operators (Istio's `ContainsPathTemplate`).
pub fn contains_path_template(path: &str) -> bool {
    path.contains(MATCH_ONE_TEMPLATE) || path.contains(MATCH_ANY_TEMPLATE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{PolicyTargetReference, TypeWorkloadSelector};
    use crate::push_context::ConfigMeta;

    fn policy(
        ns: &str,
        name: &str,
        action: AuthorizationAction,
        selector: Option<&[(&str, &str)]>,
    ) -> Arc<AuthorizationPolicyConfig> {
        Arc::new(Config {
            meta: ConfigMeta {
                name: name.into(),
                namespace: ns.into(),
                creation_ms: 0,
                generation: 1,
            },
            spec: AuthorizationPolicyEntry {
                policy: AuthorizationPolicySpec {
                    action: Some(action),
                    selector: selector.map(|l| TypeWorkloadSelector {
                        match_labels: l
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    }),
                    ..Default::default()
                },
                dry_run: false,
            },
        })
    }

    #[test]
    fn ip_blocks_follow_go_netip() {
        assert_eq!(
            parse_ip_block("10.0.0.1"),
            Some(("10.0.0.1".parse().unwrap(), 32))
        );
        assert_eq!(parse_ip_block("10.0.0.0/8").map(|b| b.1), Some(8));
        assert_eq!(parse_ip_block("10.0.0.1/8").map(|b| b.1), Some(8));
        assert_eq!(parse_ip_block("::1/128").map(|b| b.1), Some(128));
        assert!(parse_ip_block("10.0.0.0/33").is_none());
        assert!(parse_ip_block("10.0.0.0/08").is_none());
        assert!(parse_ip_block("300.0.0.0").is_none());
    }

    #[test]
    fn selector_subset_empty_selector_and_target_refs() {
        let labels: BTreeMap<String, String> = [
            ("app".to_string(), "a".to_string()),
            ("v".to_string(), "1".to_string()),
        ]
        .into();
        let mut with_ref = policy("ns", "ref", AuthorizationAction::Deny, None);
        Arc::make_mut(&mut with_ref).spec.policy.target_refs = vec![PolicyTargetReference {
            kind: "Service".into(),
            name: "a".into(),
            ..Default::default()
        }];
        let all = [
            policy("istio-system", "mesh", AuthorizationAction::Allow, None),
            policy(
                "ns",
                "match",
                AuthorizationAction::Deny,
                Some(&[("app", "a")]),
            ),
            policy(
                "ns",
                "other",
                AuthorizationAction::Deny,
                Some(&[("app", "b")]),
            ),
            policy("ns", "empty", AuthorizationAction::Audit, Some(&[])),
            policy("ns", "custom", AuthorizationAction::Custom, None),
            with_ref,
        ];
        let got = select(&all, &labels);
        let names = |l: &[Arc<AuthorizationPolicyConfig>]| {
            l.iter().map(|p| p.meta.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names(&got.allow), ["mesh"]);
        assert_eq!(names(&got.deny), ["match"]);
        assert_eq!(names(&got.audit), ["empty"]);
        assert_eq!(names(&got.custom), ["custom"]);
        assert!(select(&all[2..3], &labels).is_empty());
    }
}
