//! The one store behind the server's one lock: objects as JSON per storage bucket, a
//! global `resourceVersion` counter, a bounded history of changes that watches read
//! from, and server-side-apply ownership records. This file holds the state, the
//! request and result types the verbs share and the small helpers they use; the verbs
//! are split by family, each an `impl Store` block in its own file:
//!
//! - [`history`]: committing a change (revision, history, watch wake-up) and reading
//!   the history back.
//! - [`read`]: get, and list with selectors and `limit`/`continue` paging.
//! - [`write`]: create (`generateName`) and update (optimistic concurrency, status
//!   subresource, generation), admission (schemas, field validation) and the faked
//!   controllers that run after a write, inside the same lock.
//! - [`patch`]: the merge, JSON and strategic merge patches, and server-side apply with
//!   its per-manager records.
//! - [`scale`]: the `/scale` subresource.
//! - [`delete`]: delete and deletecollection with preconditions and finalizers, and the
//!   namespace, CRD and owner-reference cascades.

mod delete;
mod history;
mod patch;
mod read;
mod scale;
mod write;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::defaults::Allocator;
use super::error::ApiError;
use super::registry::{Registry, ResourceType, StorageKey};
use super::selector::{FieldSelector, LabelSelector};

pub use history::{Change, ChangeKind};

/// (namespace, name); the namespace is `""` for cluster-scoped objects.
pub type ObjectKey = (String, String);

/// Namespaces every cluster starts with.
const INITIAL_NAMESPACES: [&str; 4] = ["default", "kube-system", "kube-public", "kube-node-lease"];

fn namespaces_key() -> StorageKey {
    StorageKey {
        group: String::new(),
        resource: "namespaces".to_string(),
    }
}

fn crds_key() -> StorageKey {
    StorageKey {
        group: "apiextensions.k8s.io".to_string(),
        resource: "customresourcedefinitions".to_string(),
    }
}

/// `fieldValidation` query parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Strict,
    #[default]
    Warn,
    Ignore,
}

#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_manager: Option<String>,
    pub field_validation: FieldValidation,
    pub force: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    Merge,
    Json,
    Strategic,
    Apply,
}

/// The result of a write: the object to return, whether it was created (201), and
/// warnings for the `Warning` header.
#[derive(Debug)]
pub struct Written {
    pub object: Value,
    pub created: bool,
    pub warnings: Vec<String>,
}

#[derive(Debug)]
pub struct Store {
    pub registry: Registry,
    objects: BTreeMap<StorageKey, BTreeMap<ObjectKey, Arc<Value>>>,
    revision: u64,
    history: VecDeque<Arc<Change>>,
    /// Watches from a revision below this (and continue tokens) get 410 Gone.
    history_floor: u64,
    history_limit: usize,
    ownership: HashMap<(StorageKey, ObjectKey), patch::Ownership>,
    allocator: Allocator,
    notify: watch::Sender<u64>,
}

/// Current time as `metav1.Time` serializes it.
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn meta_str<'a>(object: &'a Value, field: &str) -> &'a str {
    object
        .get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn object_key(object: &Value) -> ObjectKey {
    (
        meta_str(object, "namespace").to_string(),
        meta_str(object, "name").to_string(),
    )
}

fn has_finalizers(object: &Value) -> bool {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// Checks `apiVersion`/`kind` in a body against the endpoint, then fills them in.
fn check_type_meta(rt: &ResourceType, body: &mut Value) -> Result<(), ApiError> {
    let Value::Object(map) = body else {
        return Err(ApiError::bad_request(format!(
            "the body of the request is not a {} object",
            rt.kind
        )));
    };
    let expected = rt.api_version();
    if let Some(found) = map.get("apiVersion").and_then(Value::as_str)
        && found != expected
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({found}) does not match the expected API version ({expected})"
        )));
    }
    if let Some(found) = map.get("kind").and_then(Value::as_str)
        && found != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({found}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    map.insert("apiVersion".into(), Value::String(expected));
    map.insert("kind".into(), Value::String(rt.kind.clone()));
    if !map.get("metadata").is_some_and(Value::is_object) {
        map.insert("metadata".into(), Value::Object(Map::new()));
    }
    Ok(())
}

fn check_identity(rt: &ResourceType, object: &Value, key: &ObjectKey) -> Result<(), ApiError> {
    let name = meta_str(object, "name");
    if !name.is_empty() && name != key.1 {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            key.1
        )));
    }
    let namespace = meta_str(object, "namespace");
    if rt.namespaced && !namespace.is_empty() && namespace != key.0 {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

impl Store {
    pub fn new(history_limit: usize, notify: watch::Sender<u64>) -> Self {
        let mut store = Store {
            registry: Registry::default(),
            objects: BTreeMap::new(),
            revision: 0,
            history: VecDeque::new(),
            history_floor: 0,
            history_limit: history_limit.max(1),
            ownership: HashMap::new(),
            allocator: Allocator::default(),
            notify,
        };
        if let Some(rt) = store.registry.lookup("", "v1", "namespaces") {
            for name in INITIAL_NAMESPACES {
                let body = json!({"metadata": {"name": name}});
                // Cannot fail: the names are valid and the store is empty.
                let _ = store.create(&rt, None, body, &WriteOptions::default());
            }
        }
        store
    }

    fn stored(&self, storage: &StorageKey, key: &ObjectKey) -> Option<Arc<Value>> {
        self.objects.get(storage).and_then(|b| b.get(key)).cloned()
    }

    fn key_for(rt: &ResourceType, namespace: Option<&str>, name: &str) -> ObjectKey {
        let ns = if rt.namespaced {
            namespace.unwrap_or("")
        } else {
            ""
        };
        (ns.to_string(), name.to_string())
    }
}

#[cfg(test)]
mod testing {
    //! Helpers the verb files' tests share.

    use std::sync::Arc;

    use serde_json::{Value, json};
    use tokio::sync::watch;

    use super::{Store, WriteOptions};
    use crate::apiserver::registry::ResourceType;

    pub(super) fn store() -> Store {
        let (tx, _rx) = watch::channel(0);
        Store::new(100, tx)
    }

    pub(super) fn rt(store: &Store, group: &str, version: &str, plural: &str) -> Arc<ResourceType> {
        store.registry.lookup(group, version, plural).expect(plural)
    }

    pub(super) fn opts() -> WriteOptions {
        WriteOptions::default()
    }

    pub(super) fn config_map(name: &str, data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{rt, store};
    use super::*;

    #[test]
    fn starts_with_the_usual_namespaces() {
        let store = store();
        let ns = rt(&store, "", "v1", "namespaces");
        let list = store.list(&ns, None, &ListOptions::default()).unwrap();
        let names: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            vec!["default", "kube-node-lease", "kube-public", "kube-system"]
        );
        assert_eq!(list["items"][0]["status"]["phase"], "Active");
    }
}
