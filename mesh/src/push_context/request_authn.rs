//! RequestAuthentication as Istio 1.30 applies it to a sidecar, and the key sets its JWT
//! rules need:
//!
//! - **Selection** (`model.getConfigsForWorkload` with `ShouldAttachPolicy`): the
//!   policies of the workload's namespace, then of the root namespace, each list oldest
//!   first; a policy with target references never applies to a sidecar; a policy applies
//!   when it has no selector or its selector's labels are a subset of the workload's — in
//!   the root namespace too, where a selector reaches workloads of every namespace (unlike
//!   PeerAuthentication). The rules of all applying policies are concatenated and ordered
//!   by issuer (Istio sorts them so the filter is deterministic; equal issuers keep policy
//!   order here, where Istio's sort leaves them unspecified).
//! - **Key sets** ([`JwksSource`], [`JwksOutcome`]): a rule with inline `jwks` uses it
//!   as is; any other rule needs the set at its `jwksUri`, or — with neither — the one
//!   OpenID discovery names at `<issuer>/.well-known/openid-configuration`. The control
//!   plane fetches them (the controller's resolver, `pilotfish_shared::jwks`) and the
//!   outcomes travel in the snapshot. A rule whose key set is missing or failed gets
//!   [`FAIL_CLOSED_JWKS`], as istiod does after a failed fetch.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{RequestAuthenticationConfig, config_age_order};
use crate::api::JwtRule;
use crate::model::labels_match;

/// Where a rule's key set comes from when it has no inline `jwks`: the URI, or (empty
/// URI) OpenID discovery from the issuer. Istio's resolver caches by the same pair.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JwksSource {
    pub issuer: String,
    /// Empty: discovered from `issuer`.
    pub jwks_uri: String,
}

impl JwksSource {
    /// The source a rule needs fetched; `None` when the rule carries its keys inline.
    pub fn of_rule(rule: &JwtRule) -> Option<JwksSource> {
        rule.jwks.is_empty().then(|| JwksSource {
            issuer: rule.issuer.clone(),
            jwks_uri: rule.jwks_uri.clone(),
        })
    }

    /// What is fetched first: the URI, or the issuer's discovery document.
    pub fn first_url(&self) -> String {
        if self.jwks_uri.is_empty() {
            format!(
                "{}{OPENID_DISCOVERY_SUFFIX}",
                self.issuer.trim_end_matches('/')
            )
        } else {
            self.jwks_uri.clone()
        }
    }
}

impl std::fmt::Display for JwksSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.jwks_uri.is_empty() {
            write!(f, "issuer {} (OpenID discovery)", self.issuer)
        } else {
            write!(f, "{} (issuer {})", self.jwks_uri, self.issuer)
        }
    }
}

/// The OpenID Connect discovery document's path under an issuer.
pub const OPENID_DISCOVERY_SUFFIX: &str = "/.well-known/openid-configuration";

/// The last outcome of fetching one key set.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum JwksOutcome {
    /// The key set (a JSON Web Key Set document, as served).
    Keys(String),
    /// No key set could be fetched; why (the rule fails closed).
    Failed(String),
}

/// A JSON Web Key Set whose one RSA public key has no private key anywhere (it was
/// generated for Pilotfish and the private half discarded): no token can verify against
/// it. Istio 1.30 inlines such a set (its own `PublicOnlyJwks`) when a fetch fails, so a
/// request carrying a token of that issuer is rejected while one without a token passes
/// on to authorization — the rule fails closed, never open.
pub const FAIL_CLOSED_JWKS: &str = r#"{"keys":[{"kty":"RSA","e":"AQAB","n":"pAdH-lGCmNBbrrnexWpFV-BTcdjGxNKcm9x86W72ctTgjt-SFyidIY0ff02AqwKkQ3eK4bctHKt_GGi0hQlq6oX8WNIytYzY83R1wq-CSLHDUN_MPtfbrlrZJRRmHACK8Lz307Hmex8fPO5uOB3zJfUy7LgYXOOJu1K8HILGsAztvqsrXvJT7BZRYm_aBZCGP5ZCsIimMeGGMaTV7JoQ8_k3YHbycrB3fdvXJwvvylTjILRSjsPSHRtWide-LC2OHUn1SXESPJipCPxxn1aJsULRGdIhvHamT_gxRl7b_edIGPTKYoAx-_MkR7_FuHB_vfQChFfmB8DUhp0Qzip8FQ"}]}"#;

/// The key set a sidecar gets inline for a rule: its own `jwks`, the fetched set, or
/// [`FAIL_CLOSED_JWKS`] when the fetch failed or has not happened.
pub fn local_jwks<'a>(
    rule: &'a JwtRule,
    resolved: &'a BTreeMap<JwksSource, JwksOutcome>,
) -> &'a str {
    match JwksSource::of_rule(rule) {
        None => &rule.jwks,
        Some(source) => match resolved.get(&source) {
            Some(JwksOutcome::Keys(keys)) => keys,
            _ => FAIL_CLOSED_JWKS,
        },
    }
}

/// The JWT rules that apply to a sidecar workload in `namespace` with `labels`, from the
/// policies of its namespace and of the root namespace, ordered by issuer.
pub fn rules_for_workload<'a>(
    root_namespace: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    candidates: impl IntoIterator<Item = &'a Arc<RequestAuthenticationConfig>>,
) -> Vec<&'a JwtRule> {
    let mut policies: Vec<&Arc<RequestAuthenticationConfig>> = candidates
        .into_iter()
        .filter(|ra| ra.meta.namespace == namespace || ra.meta.namespace == root_namespace)
        .filter(|ra| ra.spec.all_target_refs().next().is_none())
        .filter(|ra| {
            ra.spec
                .selector
                .as_ref()
                .is_none_or(|s| labels_match(&s.match_labels, labels))
        })
        .collect();
    // The workload's namespace first, then the root's; oldest first within each.
    policies.sort_by(|a, b| {
        (a.meta.namespace != namespace)
            .cmp(&(b.meta.namespace != namespace))
            .then_with(|| config_age_order(&a.meta, &b.meta))
    });
    let mut rules: Vec<&JwtRule> = policies
        .into_iter()
        .flat_map(|ra| ra.spec.jwt_rules.iter())
        .collect();
    rules.sort_by(|a, b| a.issuer.cmp(&b.issuer));
    rules
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RequestAuthenticationSpec;
    use crate::push_context::{Config, ConfigMeta};

    fn ra(namespace: &str, name: &str, age: i64, yaml: &str) -> Arc<RequestAuthenticationConfig> {
        Arc::new(Config {
            meta: ConfigMeta {
                name: name.into(),
                namespace: namespace.into(),
                creation_ms: age,
                generation: 1,
            },
            spec: serde_saphyr::from_str::<RequestAuthenticationSpec>(yaml).expect("spec"),
        })
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn namespace_root_and_selector_policies_apply_target_refs_never() {
        let all = vec![
            ra("shop", "ns-wide", 2, "jwtRules: [{issuer: b}]"),
            ra(
                "shop",
                "for-web",
                1,
                "selector: {matchLabels: {app: web}}\njwtRules: [{issuer: c}]",
            ),
            ra(
                "shop",
                "for-db",
                1,
                "selector: {matchLabels: {app: db}}\njwtRules: [{issuer: d}]",
            ),
            ra(
                "istio-system",
                "root-selector",
                1,
                "selector: {matchLabels: {app: web}}\njwtRules: [{issuer: a}]",
            ),
            ra(
                "shop",
                "gateway",
                1,
                "targetRefs: [{kind: Gateway, group: gateway.networking.k8s.io, name: gw}]\njwtRules: [{issuer: e}]",
            ),
            ra("other", "elsewhere", 1, "jwtRules: [{issuer: f}]"),
        ];
        let rules = rules_for_workload("istio-system", "shop", &labels(&[("app", "web")]), &all);
        let issuers: Vec<&str> = rules.iter().map(|r| r.issuer.as_str()).collect();
        assert_eq!(issuers, ["a", "b", "c"]);
        let rules = rules_for_workload("istio-system", "other", &labels(&[("app", "db")]), &all);
        let issuers: Vec<&str> = rules.iter().map(|r| r.issuer.as_str()).collect();
        assert_eq!(
            issuers,
            ["f"],
            "a root selector policy needs matching labels"
        );
    }

    #[test]
    fn equal_issuers_keep_namespace_then_root_then_age_order() {
        let all = vec![
            ra(
                "istio-system",
                "root",
                0,
                "jwtRules: [{issuer: x, jwksUri: 'http://root'}]",
            ),
            ra(
                "shop",
                "new",
                5,
                "jwtRules: [{issuer: x, jwksUri: 'http://new'}]",
            ),
            ra(
                "shop",
                "old",
                1,
                "jwtRules: [{issuer: x, jwksUri: 'http://old'}]",
            ),
        ];
        let rules = rules_for_workload("istio-system", "shop", &BTreeMap::new(), &all);
        let uris: Vec<&str> = rules.iter().map(|r| r.jwks_uri.as_str()).collect();
        assert_eq!(uris, ["http://old", "http://new", "http://root"]);
    }

    #[test]
    fn local_jwks_is_inline_fetched_or_fail_closed() {
        let inline = JwtRule {
            issuer: "i".into(),
            jwks: "{\"keys\":[]}".into(),
            ..Default::default()
        };
        let fetched = JwtRule {
            issuer: "i".into(),
            jwks_uri: "http://k".into(),
            ..Default::default()
        };
        let failed = JwtRule {
            issuer: "i".into(),
            jwks_uri: "http://down".into(),
            ..Default::default()
        };
        let pending = JwtRule {
            issuer: "discover-me".into(),
            ..Default::default()
        };
        let mut resolved = BTreeMap::new();
        resolved.insert(
            JwksSource::of_rule(&fetched).expect("source"),
            JwksOutcome::Keys("{\"keys\":[{\"kty\":\"EC\"}]}".into()),
        );
        resolved.insert(
            JwksSource::of_rule(&failed).expect("source"),
            JwksOutcome::Failed("connection refused".into()),
        );
        assert_eq!(local_jwks(&inline, &resolved), "{\"keys\":[]}");
        assert_eq!(
            local_jwks(&fetched, &resolved),
            "{\"keys\":[{\"kty\":\"EC\"}]}"
        );
        assert_eq!(local_jwks(&failed, &resolved), FAIL_CLOSED_JWKS);
        assert_eq!(local_jwks(&pending, &resolved), FAIL_CLOSED_JWKS);
        assert_eq!(
            JwksSource::of_rule(&pending).expect("source").first_url(),
            "discover-me/.well-known/openid-configuration"
        );
        let parsed: serde_json::Value = serde_json::from_str(FAIL_CLOSED_JWKS).expect("json");
        assert_eq!(parsed["keys"][0]["kty"], "RSA");
    }
}
