//! RequestAuthentication → Envoy's `envoy.filters.http.jwt_authn`, as Istio 1.30 builds it
//! for a sidecar's inbound HTTP chains (`pilot/pkg/security/authn/policy_applier.go`,
//! `convertToEnvoyJwtConfig`), pure:
//!
//! - one provider per JWT rule, named `origins-<i>` in the rules' issuer order: issuer,
//!   audiences, `forward` (forwardOriginalToken), `forward_payload_header`
//!   (outputPayloadToHeader), `claim_to_headers`, the token locations (`from_headers` with
//!   their prefix, `from_params`, `from_cookies`), the verified payload in dynamic metadata
//!   under [`PAYLOAD_METADATA_KEY`] of namespace [`JWT_AUTHN_FILTER`] (what
//!   AuthorizationPolicy's `requestPrincipals` and `request.auth.*` match), the
//!   space-delimited claims normalized (`scope`, `permission` and the rule's), the route
//!   cache left alone (sidecars; Istio clears it only on gateways);
//! - the key set always inline (`local_jwks`), as istiod's default fetch mode
//!   (`PILOT_JWT_ENABLE_REMOTE_JWKS=false`): the rule's `jwks`, else what the controller
//!   fetched, else the fail-closed set
//!   ([`FAIL_CLOSED_JWKS`](pilotfish_mesh::push_context::request_authn::FAIL_CLOSED_JWKS));
//! - one requirement for every path: with one provider `{provider OR allow_missing}`,
//!   with several `OR(p1, p2, …, AND(OR(p1, allow_missing), OR(p2, allow_missing), …))` —
//!   a request without a token passes (AuthorizationPolicy decides), a request with an
//!   invalid token is rejected (401); CORS preflights bypass the filter.
//!
//! The istio-specific `istio_authn` filter Istio once placed after it is gone from Istio
//! 1.30 (it emits none), so neither does Pilotfish. Order on an inbound chain: jwt_authn,
//! then (AuthorizationPolicy) RBAC, then the router.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::config::route::v3::{RouteMatch, route_match};
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement,
    JwtRequirementAndList, JwtRequirementOrList, RequirementRule, jwt_provider,
    jwt_requirement::RequiresType, requirement_rule::RequirementType,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpFilter, http_filter::ConfigType,
};
use envoy_types::pb::google::protobuf::Empty;
use pilotfish_mesh::api::JwtRule;
use pilotfish_mesh::push_context::request_authn::local_jwks;
use pilotfish_mesh::push_context::{JwksOutcome, JwksSource};

use super::util::any;

/// The filter's name, also the dynamic-metadata namespace of verified payloads.
pub const JWT_AUTHN_FILTER: &str = "envoy.filters.http.jwt_authn";

/// The key, in [`JWT_AUTHN_FILTER`]'s dynamic metadata, under which a verified token's
/// payload (its claims) is stored: Istio's `filters.EnvoyJwtFilterPayload`. A request
/// principal is `<payload.iss>/<payload.sub>`.
pub const PAYLOAD_METADATA_KEY: &str = "payload";

/// Claims Istio always treats as space-delimited.
const DEFAULT_SPACE_DELIMITED_CLAIMS: [&str; 2] = ["permission", "scope"];

/// One JWT rule with the key set a sidecar gets inline for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResolvedJwtRule {
    pub rule: JwtRule,
    pub local_jwks: String,
}

/// The rules (in issuer order) with their key sets: what a workload's filter is built from.
pub fn resolve(
    rules: &[&JwtRule],
    jwks: &BTreeMap<JwksSource, JwksOutcome>,
) -> Arc<[ResolvedJwtRule]> {
    rules
        .iter()
        .map(|rule| ResolvedJwtRule {
            rule: (*rule).clone(),
            local_jwks: local_jwks(rule, jwks).to_string(),
        })
        .collect()
}

/// The `jwt_authn` HTTP filter for `rules`; `None` when there are none.
pub fn jwt_authn_filter(rules: &[ResolvedJwtRule]) -> Option<HttpFilter> {
    (!rules.is_empty()).then(|| HttpFilter {
        name: JWT_AUTHN_FILTER.to_string(),
        config_type: Some(ConfigType::TypedConfig(any(&jwt_authentication(rules)))),
        ..Default::default()
    })
}

fn jwt_authentication(rules: &[ResolvedJwtRule]) -> JwtAuthentication {
    let provider_name = |i: usize| format!("origins-{i}");
    let providers: HashMap<String, JwtProvider> = rules
        .iter()
        .enumerate()
        .map(|(i, r)| (provider_name(i), provider(r)))
        .collect();
    let named = |i: usize| JwtRequirement {
        requires_type: Some(RequiresType::ProviderName(provider_name(i))),
    };
    let or = |requirements: Vec<JwtRequirement>| JwtRequirement {
        requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList {
            requirements,
        })),
    };
    let allow_missing = || JwtRequirement {
        requires_type: Some(RequiresType::AllowMissing(Empty::default())),
    };
    // Per provider: its token, if present, must be valid.
    let mut each: Vec<JwtRequirement> = (0..rules.len())
        .map(|i| or(vec![named(i), allow_missing()]))
        .collect();
    let requires = if each.len() == 1 {
        each.remove(0)
    } else {
        // The AND fails when providers share a token location (the other provider's
        // check of the same token fails); the outer OR lets one valid provider pass.
        let mut any_of: Vec<JwtRequirement> = (0..rules.len()).map(named).collect();
        any_of.push(JwtRequirement {
            requires_type: Some(RequiresType::RequiresAll(JwtRequirementAndList {
                requirements: each,
            })),
        });
        or(any_of)
    };
    JwtAuthentication {
        providers,
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_string())),
                ..Default::default()
            }),
            requirement_type: Some(RequirementType::Requires(requires)),
        }],
        bypass_cors_preflight: true,
        ..Default::default()
    }
}

fn provider(resolved: &ResolvedJwtRule) -> JwtProvider {
    let rule = &resolved.rule;
    let claims: BTreeSet<&str> = rule
        .space_delimited_claims
        .iter()
        .map(String::as_str)
        .chain(DEFAULT_SPACE_DELIMITED_CLAIMS)
        .collect();
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        forward_payload_header: rule.output_payload_to_header.clone(),
        payload_in_metadata: PAYLOAD_METADATA_KEY.to_string(),
        normalize_payload_in_metadata: Some(jwt_provider::NormalizePayload {
            space_delimited_claims: claims.into_iter().map(str::to_string).collect(),
        }),
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .map(|c| JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
                ..Default::default()
            })
            .collect(),
        from_headers: rule
            .from_headers
            .iter()
            .map(|h| JwtHeader {
                name: h.name.clone(),
                value_prefix: h.prefix.clone(),
            })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        jwks_source_specifier: Some(jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(
                resolved.local_jwks.clone(),
            )),
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::push_context::request_authn::FAIL_CLOSED_JWKS;

    fn rule(issuer: &str, uri: &str) -> JwtRule {
        JwtRule {
            issuer: issuer.into(),
            jwks_uri: uri.into(),
            ..Default::default()
        }
    }

    #[test]
    fn one_rule_allows_a_missing_token_and_requires_a_valid_one() {
        let r = rule("a", "https://a/keys");
        let rules = resolve(&[&r], &BTreeMap::new());
        let config = jwt_authentication(&rules);
        let Some(RequirementType::Requires(JwtRequirement {
            requires_type: Some(RequiresType::RequiresAny(or)),
        })) = &config.rules[0].requirement_type
        else {
            panic!("an OR requirement");
        };
        assert_eq!(
            or.requirements[0].requires_type,
            Some(RequiresType::ProviderName("origins-0".into()))
        );
        assert_eq!(
            or.requirements[1].requires_type,
            Some(RequiresType::AllowMissing(Empty::default()))
        );
        let provider = &config.providers["origins-0"];
        assert_eq!(provider.payload_in_metadata, "payload");
        assert_eq!(
            provider
                .normalize_payload_in_metadata
                .as_ref()
                .map(|n| n.space_delimited_claims.clone()),
            Some(vec!["permission".to_string(), "scope".to_string()])
        );
        // Not fetched (yet): fail closed.
        assert_eq!(
            provider.jwks_source_specifier,
            Some(jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
                specifier: Some(data_source::Specifier::InlineString(
                    FAIL_CLOSED_JWKS.into()
                )),
                ..Default::default()
            }))
        );
        assert!(!provider.clear_route_cache);
    }

    #[test]
    fn several_rules_are_any_provider_or_all_valid_when_present() {
        let (a, b) = (rule("a", "https://a"), rule("b", "https://b"));
        let config = jwt_authentication(&resolve(&[&a, &b], &BTreeMap::new()));
        let Some(RequirementType::Requires(JwtRequirement {
            requires_type: Some(RequiresType::RequiresAny(or)),
        })) = &config.rules[0].requirement_type
        else {
            panic!("an OR requirement");
        };
        assert_eq!(or.requirements.len(), 3);
        let Some(RequiresType::RequiresAll(and)) = &or.requirements[2].requires_type else {
            panic!("the last alternative is an AND");
        };
        assert_eq!(and.requirements.len(), 2);
        assert!(jwt_authn_filter(&[]).is_none());
    }
}
