//! RequestAuthentication as Istio 1.30 judges it: the webhook's
//! `ValidateRequestAuthentication` (at most one of selector / targetRef / targetRefs, the
//! workload selector's label rules, target references to a Service, ServiceEntry, Gateway
//! or GatewayClass of the policy's namespace, and per JWT rule `validateJwtRule`: issuer or
//! jwksUri, non-empty audiences and token locations, an http(s) jwksUri with a numeric
//! port, an inline jwks that parses as JSON Web Keys, claim-to-header names, a timeout of
//! whole milliseconds ≥ 1 ms; a warning for private key material in an inline jwks) and
//! the CRD's rules (at most one of jwks / jwksUri, jwksUri of 1–2048 characters, at most
//! 4096 rules, 16 target references and 64 space-delimited claims, non-empty list items,
//! target reference field formats).

use super::Validated;
use super::common::*;
use crate::api::request_authentication::{PolicyTargetReference, parse_jwks};
use crate::api::{JwtRule, RequestAuthentication, RequestAuthenticationSpec};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;

/// Istio's CRD: `maxProperties: 4096` on the selector's labels.
const MAX_SELECTOR_LABELS: usize = 4096;
/// Istio's CRD: `maxItems` of `jwtRules`, `targetRefs`, `spaceDelimitedClaims`.
const MAX_JWT_RULES: usize = 4096;
const MAX_TARGET_REFS: usize = 16;
const MAX_SPACE_DELIMITED_CLAIMS: usize = 64;
/// Istio's CRD: `maxLength` of `jwksUri`.
const MAX_JWKS_URI_LEN: usize = 2048;

/// The (group, kind) pairs a target reference may name (`allowedTargetRefs`; `""` is the
/// core group).
const ALLOWED_TARGETS: [(&str, &str); 4] = [
    ("core", "Service"),
    ("networking.istio.io", "ServiceEntry"),
    ("gateway.networking.k8s.io", "Gateway"),
    ("gateway.networking.k8s.io", "GatewayClass"),
];

/// Validates one RequestAuthentication.
pub fn validate_request_authentication(
    ra: &RequestAuthentication,
) -> Validated<RequestAuthenticationSpec> {
    let namespace = namespace_of(&ra.metadata);
    let key = ConfigKey::new(
        ConfigKind::RequestAuthentication,
        &namespace,
        ra.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    check_annotations(&mut f, ra.metadata.annotations.as_ref());
    let spec = &ra.spec;
    let set = usize::from(spec.selector.is_some())
        + usize::from(spec.target_ref.is_some())
        + usize::from(!spec.target_refs.is_empty());
    if set > 1 {
        f.error(
            "spec",
            "only one of targetRefs, targetRef or selector can be set",
        );
    }
    if let Some(sel) = &spec.selector {
        check_workload_selector(
            &mut f,
            "spec.selector.matchLabels",
            &sel.match_labels,
            MAX_SELECTOR_LABELS,
            "the selector has no labels, so the policy applies to the whole namespace (the mesh, in the root namespace)",
        );
    }
    if let Some(target) = &spec.target_ref {
        check_target_ref(&mut f, "spec.targetRef", target);
    }
    if spec.target_refs.len() > MAX_TARGET_REFS {
        f.error(
            "spec.targetRefs",
            format!("at most {MAX_TARGET_REFS} target references are allowed"),
        );
    }
    for (i, target) in spec.target_refs.iter().enumerate() {
        check_target_ref(&mut f, &format!("spec.targetRefs[{i}]"), target);
    }
    if spec.jwt_rules.len() > MAX_JWT_RULES {
        f.error(
            "spec.jwtRules",
            format!("at most {MAX_JWT_RULES} JWT rules are allowed"),
        );
    }
    for (i, rule) in spec.jwt_rules.iter().enumerate() {
        check_jwt_rule(&mut f, &format!("spec.jwtRules[{i}]"), rule);
    }
    Validated::new(spec.clone(), f.list)
}

fn check_target_ref(f: &mut Findings, path: &str, target: &PolicyTargetReference) {
    if target.name.is_empty() {
        f.error(format!("{path}.name"), "targetRef name must be set");
    }
    if target.name.len() > 253 {
        f.error(format!("{path}.name"), "at most 253 characters");
    }
    if !target.namespace.is_empty() {
        f.error(
            format!("{path}.namespace"),
            "targetRef namespace must not be set; cross namespace referencing is not supported",
        );
    }
    if !target.group.is_empty() && !is_dns_subdomain(&target.group) {
        f.error(
            format!("{path}.group"),
            format!("{:?} is not a valid API group", target.group),
        );
    }
    if target.kind.is_empty() || target.kind.len() > 63 || !is_kind_name(&target.kind) {
        f.error(
            format!("{path}.kind"),
            format!("{:?} is not a valid kind", target.kind),
        );
    }
    let group = if target.group.is_empty() {
        "core"
    } else {
        target.group.as_str()
    };
    if !ALLOWED_TARGETS
        .iter()
        .any(|(g, k)| *g == group && *k == target.kind)
    {
        f.error(
            path,
            format!(
                "targetRef must be to a core Service, a networking.istio.io ServiceEntry, or a gateway.networking.k8s.io Gateway or GatewayClass, but was {}/{}",
                target.group, target.kind
            ),
        );
    }
}

fn check_jwt_rule(f: &mut Findings, path: &str, rule: &JwtRule) {
    for (i, audience) in rule.audiences.iter().enumerate() {
        if audience.is_empty() {
            f.error(
                format!("{path}.audiences[{i}]"),
                "audience must be a non-empty string",
            );
        }
    }
    if rule.issuer.is_empty() && rule.jwks_uri.is_empty() {
        f.error(path, "issuer or jwksUri must be a non-empty string");
    }
    if !rule.jwks_uri.is_empty() {
        f.check(format!("{path}.jwksUri"), check_jwks_uri(&rule.jwks_uri));
        if !rule.jwks.is_empty() {
            f.error(path, "only one of jwks or jwksUri can be set");
        }
    }
    if !rule.jwks.is_empty() {
        match parse_jwks(&rule.jwks) {
            Err(reason) => f.error(
                format!("{path}.jwks"),
                format!("jwks parse error: {reason}"),
            ),
            Ok(private) => {
                for i in private {
                    f.warning(
                        format!("{path}.jwks"),
                        format!("jwks key at index {i} contains private key material; only public keys are used for verification"),
                    );
                }
            }
        }
    }
    for (i, header) in rule.from_headers.iter().enumerate() {
        if header.name.is_empty() {
            f.error(
                format!("{path}.fromHeaders[{i}].name"),
                "location header name must be a non-empty string",
            );
        }
    }
    for (i, param) in rule.from_params.iter().enumerate() {
        if param.is_empty() {
            f.error(
                format!("{path}.fromParams[{i}]"),
                "location query must be a non-empty string",
            );
        }
    }
    for (i, cookie) in rule.from_cookies.iter().enumerate() {
        if cookie.is_empty() {
            f.error(
                format!("{path}.fromCookies[{i}]"),
                "cookie name must be a non-empty string",
            );
        }
    }
    for (i, pair) in rule.output_claim_to_headers.iter().enumerate() {
        let item = format!("{path}.outputClaimToHeaders[{i}]");
        if pair.claim.is_empty() || pair.header.is_empty() {
            f.error(
                item,
                "outputClaimToHeaders header and claim value must be non-empty strings",
            );
            continue;
        }
        if !pair
            .header
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            f.error(
                format!("{item}.header"),
                format!("header name {} is not a valid header name", pair.header),
            );
        }
    }
    if let Some(timeout) = &rule.timeout {
        check_duration(f, &format!("{path}.timeout"), timeout);
    }
    if rule.space_delimited_claims.len() > MAX_SPACE_DELIMITED_CLAIMS {
        f.error(
            format!("{path}.spaceDelimitedClaims"),
            format!("at most {MAX_SPACE_DELIMITED_CLAIMS} claims are allowed"),
        );
    }
    for (i, claim) in rule.space_delimited_claims.iter().enumerate() {
        if claim.is_empty() {
            f.error(
                format!("{path}.spaceDelimitedClaims[{i}]"),
                "a claim name must be a non-empty string",
            );
        }
    }
}

/// A jwksUri as Istio reads it (`security.ParseJwksURI` and the CRD): 1–2048 characters,
/// scheme `http` or `https` (any case), a numeric port when one is given, a host.
pub fn check_jwks_uri(uri: &str) -> Result<(), String> {
    if uri.len() > MAX_JWKS_URI_LEN {
        return Err(format!(
            "jwksUri has at most {MAX_JWKS_URI_LEN} characters ({})",
            uri.len()
        ));
    }
    let (scheme, rest) = uri
        .split_once("://")
        .ok_or_else(|| format!("jwksUri {uri:?} must have scheme http:// or https://"))?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return Err(format!("URI scheme {scheme:?} is not supported"));
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let port = if let Some(bracketed) = host_port.strip_prefix('[') {
        let (_, after) = bracketed
            .split_once(']')
            .ok_or_else(|| format!("jwksUri {uri:?} has an unclosed IPv6 address"))?;
        after.strip_prefix(':')
    } else {
        host_port.split_once(':').map(|(_, p)| p)
    };
    if let Some(port) = port
        && !port.is_empty()
        && (!port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u32>().is_err())
    {
        return Err(format!("jwksUri {uri:?} has an invalid port {port:?}"));
    }
    Ok(())
}

/// The CRD's pattern for `group`: a lower-case DNS subdomain of at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The CRD's pattern for `kind`: `^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`.
fn is_kind_name(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic())
        && !s.ends_with('-')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}
