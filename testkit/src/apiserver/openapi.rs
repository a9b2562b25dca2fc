//! OpenAPI v3 stubs: the `/openapi/v3` index and one document per group/version that
//! holds, for each kind, the item path's `patch` operation tagged with
//! `x-kubernetes-group-version-kind` and a `fieldValidation` query parameter. That is
//! what kubectl and helm look for before sending `fieldValidation=Strict`; no schemas are
//! included, and strategic merge is deliberately not advertised (kubectl would otherwise
//! compute patches from the empty schema instead of its compiled-in types).

use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Value, json};

use super::registry::{Registry, ResourceType};

/// `api/v1` or `apis/<group>/<version>`: the index key and URL tail of a document.
fn document_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn item_path(rt: &ResourceType) -> String {
    let base = document_path(&rt.group, &rt.version);
    if rt.namespaced {
        format!("/{base}/namespaces/{{namespace}}/{}/{{name}}", rt.plural)
    } else {
        format!("/{base}/{}/{{name}}", rt.plural)
    }
}

fn query_parameter(name: &str, kind: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": kind}, "uniqueItems": true})
}

fn patch_operation(rt: &ResourceType) -> Value {
    let body_schema = json!({"schema": {"type": "object"}});
    json!({
        "operationId": format!("patch{}", rt.kind),
        "parameters": [
            query_parameter("dryRun", "string"),
            query_parameter("fieldManager", "string"),
            query_parameter("fieldValidation", "string"),
            query_parameter("force", "boolean"),
        ],
        "requestBody": {
            "content": {
                "application/apply-patch+yaml": body_schema,
                "application/json-patch+json": body_schema,
                "application/merge-patch+json": body_schema,
            },
            "required": true,
        },
        "responses": {"200": {"description": "OK"}},
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
    })
}

/// The document for one group/version, or `None` when nothing is served there.
pub fn document(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let types = registry.in_group_version(group, version);
    if types.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    for rt in &types {
        let mut parameters = vec![
            json!({"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}),
        ];
        if rt.namespaced {
            parameters.push(json!({"name": "namespace", "in": "path", "required": true, "schema": {"type": "string"}}));
        }
        paths.insert(
            item_path(rt),
            json!({"parameters": parameters, "patch": patch_operation(rt)}),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}

fn hash_of(value: &Value) -> String {
    let mut hasher = DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    format!("{:016X}", hasher.finish())
}

/// The index: every group/version with a URL whose hash changes with its content, so
/// kubectl's cache notices new CRD versions.
pub fn index(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let Some(doc) = document(registry, &group, &version) else {
                continue;
            };
            let path = document_path(&group, &version);
            paths.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", hash_of(&doc))}),
            );
        }
    }
    json!({ "paths": paths })
}

/// Splits an `/openapi/v3/...` tail (`api/v1`, `apis/apps/v1`) into group and version.
pub fn parse_document_path(tail: &str) -> Option<(String, String)> {
    let segments: Vec<&str> = tail.split('/').filter(|s| !s.is_empty()).collect();
    match segments.as_slice() {
        ["api", version] => Some((String::new(), version.to_string())),
        ["apis", group, version] => Some((group.to_string(), version.to_string())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_tag_patch_operations_with_their_kind() {
        let registry = Registry::default();
        let index = index(&registry);
        let url = index["paths"]["apis/apps/v1"]["serverRelativeURL"]
            .as_str()
            .unwrap();
        assert!(url.starts_with("/openapi/v3/apis/apps/v1?hash="));
        let (group, version) = parse_document_path("apis/apps/v1").unwrap();
        let doc = document(&registry, &group, &version).unwrap();
        let patch =
            &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"],
            "Deployment"
        );
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "fieldValidation")
        );
        assert!(
            patch["requestBody"]["content"]
                .get("application/strategic-merge-patch+json")
                .is_none()
        );
        let core = document(&registry, "", "v1").unwrap();
        assert!(core["paths"].get("/api/v1/namespaces/{name}").is_some());
    }
}
