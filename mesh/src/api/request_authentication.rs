//! `RequestAuthentication` (`security.istio.io`): which JSON Web Tokens the selected
//! workloads' sidecars verify on inbound requests — per rule the issuer, audiences, where
//! the key set comes from (inline `jwks`, `jwksUri`, or OpenID discovery from the issuer),
//! where the token is looked for and what is passed on to the workload. A request with an
//! invalid token is rejected; one without a token is not (AuthorizationPolicy decides).

use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::common::null_as_default;
use super::destination_rule::TypeWorkloadSelector;
use super::duration::Duration;
use super::status::IstioStatus;

/// The spec of a RequestAuthentication: the JWT rules of the selected workloads.
///
/// Reference: https://istio.io/latest/docs/reference/config/security/request_authentication/
// The doc comment is the CRD's description, so its URL stays bare (kubectl shows plain text).
#[allow(clippy::duplicated_attributes, rustdoc::bare_urls)]
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "security.istio.io",
    version = "v1",
    kind = "RequestAuthentication",
    namespaced,
    status = "IstioStatus",
    derive = "PartialEq",
    shortname = "ra",
    category = "istio-io",
    category = "security-istio-io",
    doc = "Request authentication configuration for workloads. See more details at: https://istio.io/docs/reference/config/security/request_authentication.html"
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_rules)]
pub struct RequestAuthenticationSpec {
    /// The workloads the policy applies to: in the policy's namespace, and in every
    /// namespace when the policy is in the root namespace; all of them when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<TypeWorkloadSelector>,
    /// A single resource the policy applies to (gateways and waypoints; hidden in Istio's
    /// documentation in favour of `targetRefs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    /// The resources the policy applies to (gateways and waypoints only: a sidecar never
    /// takes a policy with target references).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(extend("maxItems" = 16))]
    pub target_refs: Vec<PolicyTargetReference>,
    /// The JWT rules: a request carrying a token of one of them must carry a valid one.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(extend("maxItems" = 4096))]
    pub jwt_rules: Vec<JwtRule>,
}

/// Istio's `istio.type.v1beta1.PolicyTargetReference`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = target_ref_rules)]
pub struct PolicyTargetReference {
    /// The group of the target resource (`""` is the core group).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("maxLength" = 253, "pattern" = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"))]
    pub group: String,
    /// The kind of the target resource (required by the schema; read leniently so that
    /// validation names it when missing).
    #[serde(default)]
    #[schemars(extend("minLength" = 1, "maxLength" = 63, "pattern" = "^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"))]
    pub kind: String,
    /// The name of the target resource (required by the schema, as `kind`).
    #[serde(default)]
    #[schemars(extend("minLength" = 1, "maxLength" = 253))]
    pub name: String,
    /// The namespace of the target resource; must be empty (the policy's own).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("x-kubernetes-validations" = [{"message": "cross namespace referencing is not currently supported", "rule": "self.size() == 0"}]))]
    pub namespace: String,
}

/// `JWTRule`: one token issuer and how its tokens are found, verified and passed on.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = jwt_rule_rules)]
pub struct JwtRule {
    /// The token's required `iss` claim (with no `jwks`/`jwksUri`, also where the key set
    /// is discovered: `<issuer>/.well-known/openid-configuration`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(extend("minLength" = 1))]
    pub issuer: String,
    /// Accepted `aud` values; any audience when empty.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(transform = non_empty_items)]
    pub audiences: Vec<String>,
    /// Where the key set is fetched from (by the control plane; http or https).
    // Istio's JSON decoding also accepts the proto name.
    #[serde(default, alias = "jwks_uri", skip_serializing_if = "String::is_empty")]
    #[schemars(extend("minLength" = 1, "maxLength" = 2048, "x-kubernetes-validations" = [{"message": "url must have scheme http:// or https://", "rule": "url(self).getScheme() in [\"http\", \"https\"]"}]))]
    pub jwks_uri: String,
    /// The key set inline (JSON Web Key Set); takes the place of `jwksUri`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub jwks: String,
    /// Headers the token is read from; the default locations (`Authorization: Bearer`,
    /// `access_token` parameter) when no location is given.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub from_headers: Vec<JwtHeader>,
    /// Query parameters the token is read from.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(transform = non_empty_items)]
    pub from_params: Vec<String>,
    /// The header a verified token's payload (base64 of its JSON) is written to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output_payload_to_header: String,
    /// Cookies the token is read from.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(transform = non_empty_items)]
    pub from_cookies: Vec<String>,
    /// Keep the token in the request passed to the workload.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forward_original_token: bool,
    /// Claims of a verified token copied into request headers.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// How long fetching the key set may take (default 5 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Claims holding space-separated values, split for AuthorizationPolicy matching
    /// (`scope` and `permission` always are).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(transform = space_delimited_rules)]
    pub space_delimited_claims: Vec<String>,
}

/// `JWTHeader`: a header carrying the token, with an optional prefix before it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct JwtHeader {
    /// The header name.
    #[schemars(extend("minLength" = 1))]
    pub name: String,
    /// The prefix to strip before the token (e.g. `"Bearer "`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
}

/// `ClaimToHeader`: one claim copied into one header.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct ClaimToHeader {
    /// The header written.
    #[schemars(extend("minLength" = 1, "pattern" = "^[-_A-Za-z0-9]+$"))]
    pub header: String,
    /// The claim read.
    #[schemars(extend("minLength" = 1))]
    pub claim: String,
}

impl RequestAuthenticationSpec {
    /// The target references of either field (`targetRef` first).
    pub fn all_target_refs(&self) -> impl Iterator<Item = &PolicyTargetReference> {
        self.target_ref.iter().chain(self.target_refs.iter())
    }
}

impl JwtRule {
    /// The key-set fetch timeout: the rule's, else Istio's 5 s.
    pub fn fetch_timeout(&self) -> std::time::Duration {
        self.timeout
            .map(|t| t.as_std())
            .unwrap_or(std::time::Duration::from_secs(5))
    }
}

/// Istio's CRD rule on the spec: at most one of `selector`, `targetRef`, `targetRefs`.
fn spec_rules(schema: &mut Schema) {
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "(has(self.selector) ? 1 : 0) + (has(self.targetRef) ? 1 : 0) + (has(self.targetRefs) ? 1 : 0) <= 1",
            "message": "only one of targetRefs or selector can be set"
        }]),
    );
}

/// Istio's CRD rule on a JWT rule: at most one of `jwksUri` (or `jwks_uri`) and `jwks`;
/// the proto spelling `jwks_uri` is a property of its own, as in Istio's CRD.
fn jwt_rule_rules(schema: &mut Schema) {
    if let Some(serde_json::Value::Object(properties)) = schema.get_mut("properties")
        && let Some(uri) = properties.get("jwksUri").cloned()
    {
        properties.insert("jwks_uri".into(), uri);
    }
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "(has(self.jwksUri) ? 1 : 0) + (has(self.jwks_uri) ? 1 : 0) + (has(self.jwks) ? 1 : 0) <= 1",
            "message": "only one of jwks or jwksUri can be set"
        }]),
    );
}

/// Istio's CRD: a target reference names its `kind` and `name`.
fn target_ref_rules(schema: &mut Schema) {
    schema.insert("required".into(), serde_json::json!(["kind", "name"]));
}

/// Istio's CRD: list items of at least one character.
fn non_empty_items(schema: &mut Schema) {
    if let Some(serde_json::Value::Object(items)) = schema.get_mut("items") {
        items.insert("minLength".into(), 1.into());
    }
}

/// Istio's CRD on `spaceDelimitedClaims`: non-empty items, at most 64.
fn space_delimited_rules(schema: &mut Schema) {
    non_empty_items(schema);
    schema.insert("maxItems".into(), 64.into());
}

/// Parses a JSON Web Key Set (or a single JSON Web Key, which Istio's parser accepts
/// too): every key has a known `kty` and its public members. Returns the indexes of keys
/// holding private material.
pub fn parse_jwks(text: &str) -> Result<Vec<usize>, String> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let keys: Vec<&serde_json::Value> = match value.get("keys") {
        Some(serde_json::Value::Array(keys)) => keys.iter().collect(),
        Some(_) => return Err("\"keys\" must be an array".into()),
        None if value.is_object() => vec![&value],
        None => return Err("a JSON Web Key Set must be an object".into()),
    };
    let mut private = Vec::new();
    for (i, key) in keys.into_iter().enumerate() {
        let member = |name: &str| key.get(name).and_then(|v| v.as_str());
        let kty = member("kty").ok_or_else(|| format!("key {i}: missing \"kty\""))?;
        let required: &[&str] = match kty {
            "RSA" => &["n", "e"],
            "EC" => &["crv", "x", "y"],
            "OKP" => &["crv", "x"],
            "oct" => &["k"],
            other => return Err(format!("key {i}: unsupported key type {other:?}")),
        };
        for name in required {
            let v = member(name).ok_or_else(|| format!("key {i}: missing {name:?}"))?;
            if *name != "crv" && !is_base64url(v) {
                return Err(format!("key {i}: {name:?} is not base64url"));
            }
        }
        if kty == "oct" || key.get("d").is_some() {
            private.push(i);
        }
    }
    Ok(private)
}

fn is_base64url(v: &str) -> bool {
    !v.is_empty()
        && v.trim_end_matches('=')
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Istio's JSON decoding and CRD accept the proto spelling `jwks_uri`; it is the same
    /// field, written back as `jwksUri`.
    #[test]
    fn jwks_uri_reads_in_either_spelling() {
        let rule: JwtRule =
            serde_json::from_value(serde_json::json!({"issuer": "i", "jwks_uri": "https://k"}))
                .expect("parses");
        assert_eq!(rule.jwks_uri, "https://k");
        assert_eq!(
            serde_json::to_value(&rule).expect("writes"),
            serde_json::json!({"issuer": "i", "jwksUri": "https://k"})
        );
        let crd = serde_json::to_value(schemars::schema_for!(JwtRule)).expect("schema");
        assert!(crd["properties"]["jwks_uri"].is_object());
    }
}
