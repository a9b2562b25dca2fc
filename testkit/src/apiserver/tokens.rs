//! Service-account tokens as the real API server issues and reviews them:
//!
//! - **TokenRequest** (`POST /api/v1/namespaces/<ns>/serviceaccounts/<sa>/token`): a JWT
//!   signed with this server's own issuer key (ES256), for the requested audiences
//!   (default: the API server's own, its issuer URL), `expirationSeconds` (default
//!   3600, at least 600), optionally bound to a Pod, Secret or Node that must exist
//!   (and match `uid` when given). The service account must exist.
//! - **TokenReview** (`POST /apis/authentication.k8s.io/v1/tokenreviews`): signature,
//!   issuer, `nbf`/`exp` (60 s leeway), audiences (the review's, or the API server's; the
//!   intersection must not be empty) and the objects the token names — the service
//!   account, and the bound object — must still exist with the same UIDs. A refused
//!   token is still `201 Created`, with `status.error` saying why, as upstream.
//!
//! The clock tokens are judged by can be moved forward ([`TokenIssuer::advance`]), so a
//! test can see a token expire without waiting ten minutes.

use std::sync::atomic::{AtomicI64, Ordering};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ring::rand::SystemRandom;
use ring::signature::{
    self, ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair,
};
use serde_json::{Value, json};

use super::error::ApiError;
use super::store::Store;

/// The issuer (and default API audience) of a kube-apiserver with default flags.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// Clock skew tolerated on `nbf` and `exp`, as upstream's JWT validation.
const LEEWAY_SECONDS: i64 = 60;
const DEFAULT_EXPIRATION: i64 = 3600;
const MIN_EXPIRATION: i64 = 600;

/// The server's signing key and clock.
pub struct TokenIssuer {
    key: EcdsaKeyPair,
    key_id: String,
    rng: SystemRandom,
    /// Seconds added to the wall clock (moved by tests).
    offset: AtomicI64,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIssuer")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

fn wall_clock() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn rfc3339(secs: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(secs)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_default()
}

impl TokenIssuer {
    pub fn new() -> Self {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("ring generates a P-256 key");
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("ring reads the key it generated");
        let key_id = hex_prefix(key.public_key().as_ref());
        TokenIssuer {
            key,
            key_id,
            rng,
            offset: AtomicI64::new(0),
        }
    }

    /// Now, on this server's clock.
    pub fn now(&self) -> i64 {
        wall_clock() + self.offset.load(Ordering::Relaxed)
    }

    /// Moves the clock tokens are issued and judged by forward.
    pub fn advance(&self, seconds: i64) {
        self.offset.fetch_add(seconds, Ordering::Relaxed);
    }

    fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "kid": self.key_id});
        let signing_input = format!(
            "{}.{}",
            B64.encode(header.to_string()),
            B64.encode(claims.to_string())
        );
        let signature = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .expect("ECDSA signing does not fail");
        format!("{signing_input}.{}", B64.encode(signature.as_ref()))
    }

    /// The claims of `token` if this issuer signed it.
    fn verify(&self, token: &str) -> Result<Value, String> {
        let mut parts = token.split('.');
        let (Some(header), Some(claims), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("not a compact JWS (three dot-separated parts)".into());
        };
        let header: Value = B64
            .decode(header)
            .ok()
            .and_then(|h| serde_json::from_slice(&h).ok())
            .ok_or("the token header is not base64url JSON")?;
        if header["alg"] != "ES256" {
            return Err(format!("unexpected signing algorithm {}", header["alg"]));
        }
        let signature = B64
            .decode(signature)
            .map_err(|_| "the token signature is not base64url")?;
        let public = signature::UnparsedPublicKey::new(
            &ECDSA_P256_SHA256_FIXED,
            self.key.public_key().as_ref(),
        );
        let signed = &token[..token.len() - token.rsplit('.').next().map_or(0, str::len) - 1];
        public.verify(signed.as_bytes(), &signature).map_err(
            |_| "the token's signature does not verify with the service account issuer's keys",
        )?;
        B64.decode(claims)
            .ok()
            .and_then(|c| serde_json::from_slice(&c).ok())
            .ok_or_else(|| "the token claims are not base64url JSON".to_string())
    }
}

impl Default for TokenIssuer {
    fn default() -> Self {
        Self::new()
    }
}

fn hex_prefix(bytes: &[u8]) -> String {
    bytes.iter().take(10).map(|b| format!("{b:02x}")).collect()
}

fn uid_of(object: &Value) -> String {
    object["metadata"]["uid"].as_str().unwrap_or("").to_string()
}

/// The stored object of a built-in core kind, or its NotFound error.
fn core_object(
    store: &Store,
    plural: &str,
    namespace: Option<&str>,
    name: &str,
) -> Result<Value, ApiError> {
    let rt = store
        .registry
        .lookup("", "v1", plural)
        .ok_or_else(ApiError::no_such_route)?;
    store.get(&rt, namespace, name)
}

fn string_list(value: &Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

/// `POST .../serviceaccounts/<name>/token`.
pub fn token_request(
    store: &Store,
    issuer: &TokenIssuer,
    namespace: &str,
    name: &str,
    body: &Value,
) -> Result<Value, ApiError> {
    let account = core_object(store, "serviceaccounts", Some(namespace), name)?;
    let spec = &body["spec"];
    let mut audiences = string_list(&spec["audiences"]);
    if audiences.is_empty() {
        audiences.push(ISSUER.to_string());
    }
    let expiration = spec["expirationSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_EXPIRATION);
    if expiration < MIN_EXPIRATION {
        return Err(ApiError::invalid(
            "authentication.k8s.io",
            "TokenRequest",
            name,
            vec![super::error::Cause::new(
                "FieldValueInvalid",
                "spec.expirationSeconds",
                format!(
                    "Invalid value: {expiration}: may not specify a duration less than 10 minutes"
                ),
            )],
        ));
    }
    let now = issuer.now();
    let mut scope = json!({
        "namespace": namespace,
        "serviceaccount": {"name": name, "uid": uid_of(&account)},
    });
    let bound = &spec["boundObjectRef"];
    if !bound.is_null() {
        let kind = bound["kind"].as_str().unwrap_or("");
        let bound_name = bound["name"].as_str().unwrap_or("");
        let (plural, claim, ns) = match kind {
            "Pod" => ("pods", "pod", Some(namespace)),
            "Secret" => ("secrets", "secret", Some(namespace)),
            "Node" => ("nodes", "node", None),
            other => {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token to object of kind {other:?}: supported kinds are Pod, Secret and Node"
                )));
            }
        };
        let object = core_object(store, plural, ns, bound_name)?;
        let uid = uid_of(&object);
        if let Some(want) = bound["uid"].as_str().filter(|u| !u.is_empty())
            && want != uid
        {
            return Err(ApiError::conflict(
                "",
                plural,
                bound_name,
                &format!(
                    "the UID in the bound object reference ({want}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        scope[claim] = json!({"name": bound_name, "uid": uid});
    }
    let jti = hex_prefix(&rand::random::<[u8; 16]>());
    let claims = json!({
        "aud": audiences,
        "exp": now + expiration,
        "iat": now,
        "iss": ISSUER,
        "jti": jti,
        "kubernetes.io": scope,
        "nbf": now,
        "sub": format!("system:serviceaccount:{namespace}:{name}"),
    });
    let mut spec = spec.clone();
    spec["audiences"] = json!(audiences);
    spec["expirationSeconds"] = json!(expiration);
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": rfc3339(now)},
        "spec": spec,
        "status": {"token": issuer.sign(&claims), "expirationTimestamp": rfc3339(now + expiration)},
    }))
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`.
pub fn token_review(store: &Store, issuer: &TokenIssuer, body: &Value) -> Value {
    let spec = body["spec"].clone();
    let status = match review(store, issuer, &spec) {
        Ok(status) => status,
        Err(why) => json!({"user": {}, "error": format!("[invalid bearer token, {why}]")}),
    };
    json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    })
}

fn review(store: &Store, issuer: &TokenIssuer, spec: &Value) -> Result<Value, String> {
    let token = spec["token"].as_str().unwrap_or("");
    let claims = issuer.verify(token)?;
    if claims["iss"] != ISSUER {
        return Err(format!("unknown issuer {}", claims["iss"]));
    }
    let now = issuer.now();
    if claims["nbf"]
        .as_i64()
        .is_some_and(|nbf| now + LEEWAY_SECONDS < nbf)
    {
        return Err("service account token is not valid yet".into());
    }
    if claims["exp"]
        .as_i64()
        .is_none_or(|exp| now - LEEWAY_SECONDS > exp)
    {
        return Err("service account token has expired".into());
    }
    let token_audiences = match &claims["aud"] {
        Value::String(one) => vec![one.clone()],
        list => string_list(list),
    };
    let mut wanted = string_list(&spec["audiences"]);
    if wanted.is_empty() {
        wanted.push(ISSUER.to_string());
    }
    let granted: Vec<String> = wanted
        .iter()
        .filter(|a| token_audiences.contains(a))
        .cloned()
        .collect();
    if granted.is_empty() {
        return Err(format!(
            "token audiences {token_audiences:?} is invalid for the target audiences {wanted:?}"
        ));
    }
    let scope = &claims["kubernetes.io"];
    let namespace = scope["namespace"].as_str().unwrap_or("");
    let account = scope["serviceaccount"]["name"].as_str().unwrap_or("");
    let account_uid = scope["serviceaccount"]["uid"].as_str().unwrap_or("");
    let stored =
        core_object(store, "serviceaccounts", Some(namespace), account).map_err(|e| e.message)?;
    if uid_of(&stored) != account_uid {
        return Err(format!(
            "service account UID ({}) does not match claim ({account_uid})",
            uid_of(&stored)
        ));
    }
    let mut extra = json!({
        "authentication.kubernetes.io/credential-id": [format!("JTI={}", claims["jti"].as_str().unwrap_or(""))],
    });
    for (claim, plural, ns) in [
        ("pod", "pods", Some(namespace)),
        ("secret", "secrets", Some(namespace)),
        ("node", "nodes", None),
    ] {
        let bound = &scope[claim];
        if bound.is_null() {
            continue;
        }
        let name = bound["name"].as_str().unwrap_or("");
        let uid = bound["uid"].as_str().unwrap_or("");
        let object = core_object(store, plural, ns, name).map_err(|e| e.message)?;
        if uid_of(&object) != uid {
            return Err(format!(
                "{claim} UID ({}) does not match claim ({uid})",
                uid_of(&object)
            ));
        }
        extra[format!("authentication.kubernetes.io/{claim}-name")] = json!([name]);
        extra[format!("authentication.kubernetes.io/{claim}-uid")] = json!([uid]);
    }
    Ok(json!({
        "authenticated": true,
        "user": {
            "username": format!("system:serviceaccount:{namespace}:{account}"),
            "uid": account_uid,
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
            "extra": extra,
        },
        "audiences": granted,
    }))
}
