//! Protobuf request bodies (`application/vnd.kubernetes.protobuf`): helm sends Secrets
//! (its release records) and DeleteOptions this way, kubectl's imperative `create
//! namespace|configmap|secret|serviceaccount`, `create token` and `auth can-i` too, and neither retries in JSON. The body
//! is the `k8s\0` magic plus a `runtime.Unknown` envelope; we decode those types with
//! `k8s-pb`, convert them to their `k8s-openapi` twins and continue in JSON like every
//! other request. Other kinds get a clear 415.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::api::core::v1 as pb_core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use prost::Message;
use serde_json::{Value, json};

use super::error::ApiError;

const MAGIC: &[u8] = b"k8s\0";

fn undecodable(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::bad_request(format!("unable to decode protobuf {what}: {e}"))
}

/// Decodes a protobuf request body into the equivalent JSON object.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let payload = body.strip_prefix(MAGIC).ok_or_else(|| {
        ApiError::bad_request("protobuf body does not start with the k8s\\0 envelope magic")
    })?;
    let envelope = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(payload)
        .map_err(|e| undecodable("envelope", e))?;
    let type_meta = envelope.type_meta.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let raw = envelope.raw.unwrap_or_default();
    match kind.as_str() {
        "Secret" => {
            let secret =
                pb_core::Secret::decode(raw.as_slice()).map_err(|e| undecodable("Secret", e))?;
            to_json(secret_from_pb(secret))
        }
        "ConfigMap" => {
            let map = pb_core::ConfigMap::decode(raw.as_slice())
                .map_err(|e| undecodable("ConfigMap", e))?;
            to_json(core::ConfigMap {
                metadata: meta_of(map.metadata),
                data: non_empty_map(map.data),
                binary_data: non_empty_map(
                    map.binary_data
                        .into_iter()
                        .map(|(k, v)| (k, ByteString(v)))
                        .collect(),
                ),
                immutable: map.immutable,
            })
        }
        "Namespace" => {
            let namespace = pb_core::Namespace::decode(raw.as_slice())
                .map_err(|e| undecodable("Namespace", e))?;
            to_json(core::Namespace {
                metadata: meta_of(namespace.metadata),
                spec: namespace.spec.map(|spec| core::NamespaceSpec {
                    finalizers: non_empty_vec(spec.finalizers),
                }),
                status: None,
            })
        }
        "ServiceAccount" => {
            let account = pb_core::ServiceAccount::decode(raw.as_slice())
                .map_err(|e| undecodable("ServiceAccount", e))?;
            to_json(core::ServiceAccount {
                metadata: meta_of(account.metadata),
                secrets: non_empty_vec(
                    account
                        .secrets
                        .into_iter()
                        .map(|r| core::ObjectReference {
                            api_version: r.api_version,
                            field_path: r.field_path,
                            kind: r.kind,
                            name: r.name,
                            namespace: r.namespace,
                            resource_version: r.resource_version,
                            uid: r.uid,
                        })
                        .collect(),
                ),
                image_pull_secrets: non_empty_vec(
                    account
                        .image_pull_secrets
                        .into_iter()
                        .map(|r| core::LocalObjectReference {
                            name: r.name.unwrap_or_default(),
                        })
                        .collect(),
                ),
                automount_service_account_token: account.automount_service_account_token,
            })
        }
        // `kubectl create token`.
        "TokenRequest" => {
            let request = k8s_pb::api::authentication::v1::TokenRequest::decode(raw.as_slice())
                .map_err(|e| undecodable("TokenRequest", e))?;
            let spec = request.spec.unwrap_or_default();
            let bound = spec.bound_object_ref.map(|r| {
                json!({"kind": r.kind, "apiVersion": r.api_version, "name": r.name, "uid": r.u_id})
            });
            Ok(json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "metadata": to_json(meta_of(request.metadata))?,
                "spec": {
                    "audiences": spec.audiences,
                    "expirationSeconds": spec.expiration_seconds,
                    "boundObjectRef": bound,
                },
            }))
        }
        "SelfSubjectAccessReview" => {
            use k8s_pb::api::authorization::v1 as pb_authz;
            let review = pb_authz::SelfSubjectAccessReview::decode(raw.as_slice())
                .map_err(|e| undecodable("SelfSubjectAccessReview", e))?;
            let spec = review.spec.unwrap_or_default();
            let resource = spec.resource_attributes.map(|r| {
                json!({"namespace": r.namespace, "verb": r.verb, "group": r.group,
                       "version": r.version, "resource": r.resource,
                       "subresource": r.subresource, "name": r.name})
            });
            let non_resource = spec
                .non_resource_attributes
                .map(|n| json!({"path": n.path, "verb": n.verb}));
            Ok(json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SelfSubjectAccessReview",
                "metadata": to_json(meta_of(review.metadata))?,
                "spec": {
                    "resourceAttributes": resource,
                    "nonResourceAttributes": non_resource,
                },
            }))
        }
        "DeleteOptions" => {
            let options = pb_meta::DeleteOptions::decode(raw.as_slice())
                .map_err(|e| undecodable("DeleteOptions", e))?;
            Ok(delete_options_from_pb(options))
        }
        other => Err(ApiError::unsupported_media_type(format!(
            "protobuf bodies are accepted for ConfigMap, Namespace, Secret, ServiceAccount, TokenRequest, SelfSubjectAccessReview and DeleteOptions only, not {other:?}; send JSON (e.g. kubectl create -f)"
        ))),
    }
}

fn to_json(object: impl serde::Serialize) -> Result<Value, ApiError> {
    serde_json::to_value(object)
        .map_err(|e| ApiError::internal(format!("re-encoding a protobuf body as JSON: {e}")))
}

fn meta_of(metadata: Option<pb_meta::ObjectMeta>) -> meta::ObjectMeta {
    metadata.map(object_meta_from_pb).unwrap_or_default()
}

fn non_empty_map<V>(map: BTreeMap<String, V>) -> Option<BTreeMap<String, V>> {
    (!map.is_empty()).then_some(map)
}

fn non_empty_vec<V>(items: Vec<V>) -> Option<Vec<V>> {
    (!items.is_empty()).then_some(items)
}

fn object_meta_from_pb(m: pb_meta::ObjectMeta) -> meta::ObjectMeta {
    meta::ObjectMeta {
        name: m.name,
        generate_name: m.generate_name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        labels: non_empty_map(m.labels),
        annotations: non_empty_map(m.annotations),
        finalizers: non_empty_vec(m.finalizers),
        owner_references: non_empty_vec(
            m.owner_references
                .into_iter()
                .map(|r| meta::OwnerReference {
                    api_version: r.api_version.unwrap_or_default(),
                    kind: r.kind.unwrap_or_default(),
                    name: r.name.unwrap_or_default(),
                    uid: r.uid.unwrap_or_default(),
                    controller: r.controller,
                    block_owner_deletion: r.block_owner_deletion,
                })
                .collect(),
        ),
        ..Default::default()
    }
}

fn secret_from_pb(s: pb_core::Secret) -> core::Secret {
    core::Secret {
        metadata: meta_of(s.metadata),
        data: non_empty_map(
            s.data
                .into_iter()
                .map(|(k, v)| (k, ByteString(v)))
                .collect(),
        ),
        string_data: non_empty_map(s.string_data),
        type_: s.r#type,
        immutable: s.immutable,
    }
}

fn delete_options_from_pb(o: pb_meta::DeleteOptions) -> Value {
    let mut options = json!({"kind": "DeleteOptions", "apiVersion": "v1"});
    if let Some(seconds) = o.grace_period_seconds {
        options["gracePeriodSeconds"] = json!(seconds);
    }
    if let Some(policy) = o.propagation_policy {
        options["propagationPolicy"] = json!(policy);
    }
    if let Some(orphan) = o.orphan_dependents {
        options["orphanDependents"] = json!(orphan);
    }
    if !o.dry_run.is_empty() {
        options["dryRun"] = json!(o.dry_run);
    }
    if let Some(p) = o.preconditions {
        let mut preconditions = json!({});
        if let Some(uid) = p.uid {
            preconditions["uid"] = json!(uid);
        }
        if let Some(rv) = p.resource_version {
            preconditions["resourceVersion"] = json!(rv);
        }
        options["preconditions"] = preconditions;
    }
    options
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};

    fn envelope(kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some("v1".into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: None,
            content_type: None,
        };
        let mut body = MAGIC.to_vec();
        body.extend(unknown.encode_to_vec());
        body
    }

    #[test]
    fn decodes_a_helm_release_secret() {
        let secret = pb_core::Secret {
            metadata: Some(pb_meta::ObjectMeta {
                name: Some("sh.helm.release.v1.demo.v1".into()),
                labels: [("owner".to_string(), "helm".to_string())].into(),
                ..Default::default()
            }),
            data: [("release".to_string(), b"hello".to_vec())].into(),
            r#type: Some("helm.sh/release.v1".into()),
            ..Default::default()
        };
        let json = decode(&envelope("Secret", secret.encode_to_vec())).unwrap();
        assert_eq!(json["kind"], "Secret");
        assert_eq!(json["metadata"]["name"], "sh.helm.release.v1.demo.v1");
        assert_eq!(json["metadata"]["labels"]["owner"], "helm");
        assert_eq!(json["data"]["release"], "aGVsbG8=");
        assert_eq!(json["type"], "helm.sh/release.v1");
    }

    #[test]
    fn decodes_delete_options() {
        let options = pb_meta::DeleteOptions {
            propagation_policy: Some("Background".into()),
            ..Default::default()
        };
        let json = decode(&envelope("DeleteOptions", options.encode_to_vec())).unwrap();
        assert_eq!(json["propagationPolicy"], "Background");
    }

    #[test]
    fn decodes_namespaces_and_refuses_unknown_kinds_and_bare_bodies() {
        assert_eq!(decode(&envelope("Pod", vec![])).unwrap_err().code, 415);
        let namespace = pb_core::Namespace {
            metadata: Some(pb_meta::ObjectMeta {
                name: Some("team".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let json = decode(&envelope("Namespace", namespace.encode_to_vec())).unwrap();
        assert_eq!(json["kind"], "Namespace");
        assert_eq!(json["metadata"]["name"], "team");
        assert_eq!(decode(b"{}").unwrap_err().code, 400);
    }
}
