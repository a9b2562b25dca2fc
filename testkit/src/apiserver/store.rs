//! The one store behind the server's one lock: objects as JSON per storage bucket, a
//! global `resourceVersion` counter, a bounded history of changes that watches read
//! from, server-side-apply ownership records, and every verb's semantics (create with
//! `generateName`, optimistic concurrency, status subresource, generation, finalizers,
//! namespace and CRD cascades, owner-reference garbage collection). Faked controllers
//! run right after the write that triggers them, inside the same lock.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rand::Rng;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use super::controllers;
use super::convert::{to_served, to_stored};
use super::defaults::{self, Allocator};
use super::error::{ApiError, Cause};
use super::meta;
use super::patch::{self, Rules};
use super::registry::{self, Registry, ResourceType, Shape, StorageKey};
use super::scale;
use super::schema;
use super::selector::{FieldSelector, LabelSelector};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed write, as watches replay it.
#[derive(Debug)]
pub struct Change {
    pub revision: u64,
    pub kind: ChangeKind,
    pub storage: StorageKey,
    pub namespace: String,
    /// The object after the change (for a deletion: its last state, stamped with the
    /// deletion's `resourceVersion`), in stored form.
    pub object: Arc<Value>,
    /// The object before the change, so watches with selectors can tell an object
    /// leaving their selection from one entering it.
    pub previous: Option<Arc<Value>>,
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

/// What one field manager last applied (server-side apply) to one object.
#[derive(Debug, Clone)]
struct AppliedConfig {
    config: Value,
    leaves: BTreeMap<String, Value>,
}

/// Apply records per object: (manager, is-status-subresource) → config.
type Ownership = BTreeMap<(String, bool), AppliedConfig>;

#[derive(Debug)]
pub struct Store {
    pub registry: Registry,
    objects: BTreeMap<StorageKey, BTreeMap<ObjectKey, Arc<Value>>>,
    revision: u64,
    history: VecDeque<Arc<Change>>,
    /// Watches from a revision below this (and continue tokens) get 410 Gone.
    history_floor: u64,
    history_limit: usize,
    ownership: HashMap<(StorageKey, ObjectKey), Ownership>,
    allocator: Allocator,
    notify: watch::Sender<u64>,
}

/// Current time as `metav1.Time` serializes it.
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn new_uid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The suffix `generateName` gets: five characters from upstream's alphabet.
fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
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

fn rules(rt: &ResourceType) -> Rules<'_> {
    match &rt.shape {
        Shape::BuiltIn { .. } => Rules::BuiltIn(&rt.kind),
        Shape::Custom { .. } => Rules::Schema(rt.schema()),
    }
}

fn has_finalizers(object: &Value) -> bool {
    object
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

/// Copies `field` of `metadata` from `from` into `to` (or removes it when absent).
fn carry_meta(to: &mut Value, from: &Value, field: &str) {
    let value = from.get("metadata").and_then(|m| m.get(field)).cloned();
    if let Some(Value::Object(meta)) = to.get_mut("metadata") {
        match value {
            Some(v) => {
                meta.insert(field.to_string(), v);
            }
            None => {
                meta.remove(field);
            }
        }
    }
}

/// The part of an object whose change bumps `metadata.generation`.
fn spec_part(object: &Value, status_separate: bool) -> Value {
    let mut copy = object.clone();
    if let Value::Object(map) = &mut copy {
        map.remove("metadata");
        if status_separate {
            map.remove("status");
        }
    }
    copy
}

fn validate_metadata(rt: &ResourceType, object: &Value) -> Result<(), ApiError> {
    let causes = meta::validate(rt, object);
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(
            &rt.group,
            &rt.kind,
            meta_str(object, "name"),
            causes,
        ))
    }
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

    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Changes after `revision`, or `None` when the history no longer reaches back there.
    pub fn changes_after(&self, revision: u64) -> Option<Vec<Arc<Change>>> {
        if revision < self.history_floor {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|c| c.revision > revision)
                .cloned()
                .collect(),
        )
    }

    pub fn history_floor(&self) -> u64 {
        self.history_floor
    }

    /// All stored objects of a storage bucket (optionally one namespace), in key order.
    pub fn objects_in(&self, storage: &StorageKey, namespace: Option<&str>) -> Vec<Arc<Value>> {
        let Some(bucket) = self.objects.get(storage) else {
            return Vec::new();
        };
        match namespace {
            None => bucket.values().cloned().collect(),
            Some(ns) => bucket
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
        }
    }

    /// Forgets the watch history, so every watch and continue token from before now
    /// gets 410 Gone (what an etcd compaction does to a slow client).
    pub fn expire_history(&mut self) {
        self.revision += 1;
        self.history.clear();
        self.history_floor = self.revision;
        self.notify.send_replace(self.revision);
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

    fn commit(
        &mut self,
        kind: ChangeKind,
        storage: &StorageKey,
        mut object: Value,
        previous: Option<Arc<Value>>,
    ) -> Arc<Value> {
        self.revision += 1;
        if let Some(Value::Object(meta)) = object.get_mut("metadata") {
            meta.insert(
                "resourceVersion".into(),
                Value::String(self.revision.to_string()),
            );
        }
        let object = Arc::new(object);
        let key = object_key(&object);
        let bucket = self.objects.entry(storage.clone()).or_default();
        match kind {
            ChangeKind::Deleted => {
                bucket.remove(&key);
            }
            ChangeKind::Added | ChangeKind::Modified => {
                bucket.insert(key.clone(), object.clone());
            }
        }
        self.history.push_back(Arc::new(Change {
            revision: self.revision,
            kind,
            storage: storage.clone(),
            namespace: key.0,
            object: object.clone(),
            previous,
        }));
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.history_floor = dropped.revision;
            }
        }
        self.notify.send_replace(self.revision);
        object
    }

    pub fn get(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let key = Self::key_for(rt, namespace, name);
        self.stored(&rt.storage, &key)
            .map(|o| to_served(&o, rt))
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))
    }

    pub fn list(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        options: &ListOptions,
    ) -> Result<Value, ApiError> {
        let (list_revision, start) = match &options.continue_token {
            None => (self.revision, None),
            Some(token) => {
                let mut parts = token.splitn(3, '/');
                let revision = parts.next().and_then(|r| r.parse::<u64>().ok());
                let (Some(revision), Some(ns), Some(name)) = (revision, parts.next(), parts.next())
                else {
                    return Err(ApiError::bad_request(format!(
                        "invalid continue token \"{token}\""
                    )));
                };
                if revision < self.history_floor {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                }
                (revision, Some((ns.to_string(), name.to_string())))
            }
        };
        let empty = BTreeMap::new();
        let bucket = self.objects.get(&rt.storage).unwrap_or(&empty);
        let lower = match &start {
            Some(key) => Bound::Excluded(key.clone()),
            None => Bound::Unbounded,
        };
        let mut items = Vec::new();
        let mut remaining = 0usize;
        let mut last_key = None;
        for (key, object) in bucket.range((lower, Bound::Unbounded)) {
            if namespace.is_some_and(|ns| rt.namespaced && key.0 != ns) {
                continue;
            }
            let served = to_served(object, rt);
            if !options.labels.matches(&served) || !options.fields.matches(&served) {
                continue;
            }
            if options
                .limit
                .is_some_and(|limit| limit > 0 && items.len() >= limit)
            {
                remaining += 1;
                continue;
            }
            last_key = Some(key.clone());
            items.push(served);
        }
        let mut metadata = json!({ "resourceVersion": list_revision.to_string() });
        if remaining > 0
            && let Some((ns, name)) = last_key
        {
            metadata["continue"] = json!(format!("{list_revision}/{ns}/{name}"));
            metadata["remainingItemCount"] = json!(remaining);
        }
        Ok(json!({
            "apiVersion": rt.api_version(),
            "kind": rt.list_kind,
            "metadata": metadata,
            "items": items,
        }))
    }

    /// Refuses content in a namespace that does not exist or is being deleted.
    fn check_namespace_open(&self, namespace: &str) -> Result<(), ApiError> {
        match self.stored(&namespaces_key(), &(String::new(), namespace.to_string())) {
            None => Err(ApiError::not_found("", "namespaces", namespace)),
            Some(ns) if ns.pointer("/metadata/deletionTimestamp").is_some() => {
                Err(ApiError::forbidden(
                    "",
                    "namespaces",
                    namespace,
                    &format!(
                        "unable to create new content in namespace {namespace} because it is being terminated"
                    ),
                ))
            }
            Some(_) => Ok(()),
        }
    }

    /// Schema/type checks; returns warnings (unknown fields under `Warn`).
    fn admit(
        &self,
        rt: &ResourceType,
        object: &mut Value,
        options: &WriteOptions,
    ) -> Result<Vec<String>, ApiError> {
        let cannot_handle = |why: String| {
            ApiError::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: {why}",
                kind = rt.kind,
                version = rt.version
            ))
        };
        if let Err(e) = ObjectMeta::deserialize(&object["metadata"]) {
            return Err(cannot_handle(format!("metadata: {e}")));
        }
        let name = meta_str(object, "name").to_string();
        // Decoding (which finds unknown fields) comes before validation, as upstream:
        // under `Strict` an unknown field is reported even if values are also invalid.
        let (unknown_fields, causes) = match &rt.shape {
            Shape::BuiltIn { round_trip } => {
                let known = round_trip(object).map_err(cannot_handle)?;
                (schema::prune_unknown(object, &known), Vec::new())
            }
            Shape::Custom { schema: None, .. } => (Vec::new(), Vec::new()),
            Shape::Custom {
                schema: Some(schema),
                ..
            } => {
                let checked = schema::check_object(schema, object);
                (checked.unknown_fields, checked.causes)
            }
        };
        let unknown: Vec<String> = unknown_fields
            .iter()
            .map(|f| format!("unknown field \"{f}\""))
            .collect();
        let mut warnings = Vec::new();
        if !unknown.is_empty() {
            match options.field_validation {
                FieldValidation::Strict => {
                    return Err(cannot_handle(format!(
                        "strict decoding error: {}",
                        unknown.join(", ")
                    )));
                }
                FieldValidation::Warn => warnings = unknown,
                FieldValidation::Ignore => {}
            }
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(&rt.group, &rt.kind, &name, causes));
        }
        if rt.storage == crds_key() {
            registry::validate_and_default_crd(object)?;
        }
        Ok(warnings)
    }

    pub fn create(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        mut object: Value,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        check_type_meta(rt, &mut object)?;
        let namespace = if rt.namespaced {
            let path_ns = namespace.unwrap_or("");
            let body_ns = meta_str(&object, "namespace");
            if !body_ns.is_empty() && body_ns != path_ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            object["metadata"]["namespace"] = json!(path_ns);
            path_ns.to_string()
        } else {
            if let Some(Value::Object(meta)) = object.get_mut("metadata") {
                meta.remove("namespace");
            }
            String::new()
        };
        if !meta_str(&object, "resourceVersion").is_empty() {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let mut name = meta_str(&object, "name").to_string();
        let generate = meta_str(&object, "generateName").to_string();
        if name.is_empty() && !generate.is_empty() {
            name = (0..16)
                .map(|_| format!("{generate}{}", name_suffix()))
                .find(|n| {
                    self.stored(&rt.storage, &(namespace.clone(), n.clone()))
                        .is_none()
                })
                .unwrap_or_default();
            object["metadata"]["name"] = json!(name);
        }
        validate_metadata(rt, &object)?;
        if rt.namespaced {
            self.check_namespace_open(&namespace)?;
        }
        let key = (namespace, name.clone());
        if self.stored(&rt.storage, &key).is_some() {
            return Err(ApiError::already_exists(&rt.group, &rt.plural, &name));
        }
        if let Value::Object(map) = &mut object {
            if rt.status_subresource {
                map.remove("status");
            }
            if let Some(status) = defaults::initial_status(rt) {
                map.insert("status".into(), status);
            }
        }
        defaults::apply(rt, &mut object, None, &mut self.allocator);
        let warnings = self.admit(rt, &mut object, options)?;
        let meta = &mut object["metadata"];
        meta["uid"] = json!(new_uid());
        meta["creationTimestamp"] = json!(now());
        if let Value::Object(meta) = meta {
            meta.remove("deletionTimestamp");
            meta.remove("deletionGracePeriodSeconds");
            meta.remove("managedFields");
            meta.remove("generation");
            if rt.tracks_generation {
                meta.insert("generation".into(), json!(1));
            }
        }
        let stored = to_stored(object, rt);
        if options.dry_run {
            return Ok(Written {
                object: to_served(&stored, rt),
                created: true,
                warnings,
            });
        }
        let committed = self.commit(ChangeKind::Added, &rt.storage, stored, None);
        self.after_write(&rt.storage, &key);
        Ok(Written {
            object: to_served(&committed, rt),
            created: true,
            warnings,
        })
    }

    /// PUT of the main resource (`status_only == false`) or of `/status`.
    pub fn update(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        mut object: Value,
        status_only: bool,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let key = Self::key_for(rt, namespace, name);
        check_type_meta(rt, &mut object)?;
        check_identity(rt, &object, &key)?;
        let old = self
            .stored(&rt.storage, &key)
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        let wanted = meta_str(&object, "resourceVersion");
        if !wanted.is_empty() && wanted != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        self.finish_update(rt, &key, old, object, status_only, options)
    }

    /// The common tail of update and patch: `new` is the full intended object in
    /// `rt`'s version.
    fn finish_update(
        &mut self,
        rt: &ResourceType,
        key: &ObjectKey,
        old: Arc<Value>,
        mut new: Value,
        status_only: bool,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let old_served = to_served(&old, rt);
        if status_only {
            let mut merged = old_served.clone();
            match new.get("status") {
                Some(status) => merged["status"] = status.clone(),
                None => {
                    if let Value::Object(map) = &mut merged {
                        map.remove("status");
                    }
                }
            }
            new = merged;
        } else if rt.status_subresource
            && let Value::Object(map) = &mut new
        {
            match old_served.get("status") {
                Some(status) => {
                    map.insert("status".into(), status.clone());
                }
                None => {
                    map.remove("status");
                }
            }
        }
        if !new.get("metadata").is_some_and(Value::is_object) {
            new["metadata"] = json!({});
        }
        for field in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ] {
            carry_meta(&mut new, &old_served, field);
        }
        defaults::apply(rt, &mut new, Some(&old_served), &mut self.allocator);
        validate_metadata(rt, &new)?;
        let warnings = self.admit(rt, &mut new, options)?;
        if rt.tracks_generation
            && spec_part(&new, rt.status_subresource)
                != spec_part(&old_served, rt.status_subresource)
        {
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            new["metadata"]["generation"] = json!(generation + 1);
        }
        let stored = to_stored(new, rt);
        // A write that changes nothing is not a write: no new resourceVersion, no event.
        if stored == *old || options.dry_run {
            return Ok(Written {
                object: to_served(&stored, rt),
                created: false,
                warnings,
            });
        }
        if stored.pointer("/metadata/deletionTimestamp").is_some() && !has_finalizers(&stored) {
            let gone = self.remove_object(&rt.storage, key, stored, true);
            return Ok(Written {
                object: to_served(&gone, rt),
                created: false,
                warnings,
            });
        }
        let committed = self.commit(ChangeKind::Modified, &rt.storage, stored, Some(old));
        self.after_write(&rt.storage, key);
        Ok(Written {
            object: to_served(&committed, rt),
            created: false,
            warnings,
        })
    }

    #[allow(clippy::too_many_arguments)] // one argument per part of a PATCH request
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        kind: PatchKind,
        body: Value,
        status_only: bool,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let key = Self::key_for(rt, namespace, name);
        let old = self.stored(&rt.storage, &key);
        if kind == PatchKind::Apply {
            return self.apply(rt, &key, body, status_only, old, options);
        }
        let old = old.ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        let mut doc = to_served(&old, rt);
        match kind {
            PatchKind::Merge => patch::merge_patch(&mut doc, &body),
            PatchKind::Json => patch::json_patch(&mut doc, &body).map_err(|e| ApiError {
                code: 422,
                reason: "Invalid",
                message: e,
                details: None,
            })?,
            PatchKind::Strategic => {
                if rt.is_custom() {
                    return Err(ApiError::unsupported_media_type(
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                    ));
                }
                patch::strategic_merge(&mut doc, &body, rules(rt))
                    .map_err(ApiError::bad_request)?;
            }
            PatchKind::Apply => {}
        }
        check_type_meta(rt, &mut doc)?;
        check_identity(rt, &doc, &key)?;
        let wanted = meta_str(&doc, "resourceVersion");
        if !wanted.is_empty() && wanted != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        self.finish_update(rt, &key, old, doc, status_only, options)
    }

    fn apply(
        &mut self,
        rt: &ResourceType,
        key: &ObjectKey,
        mut config: Value,
        status_only: bool,
        old: Option<Arc<Value>>,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let manager = options.field_manager.clone().filter(|m| !m.is_empty()).ok_or_else(|| {
            ApiError::bad_request(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            )
        })?;
        if !config.is_object() {
            return Err(ApiError::bad_request("apply patch body must be an object"));
        }
        for field in ["apiVersion", "kind"] {
            if config
                .get(field)
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
            {
                return Err(ApiError::bad_request(format!("{field} must be set")));
            }
        }
        check_type_meta(rt, &mut config)?;
        check_identity(rt, &config, key)?;
        let rules = rules(rt);
        let leaves = patch::leaf_paths(&config, rules);
        let record_key = (rt.storage.clone(), key.clone());
        let me = (manager.clone(), status_only);
        let Some(old) = old else {
            if status_only {
                return Err(ApiError::not_found(&rt.group, &rt.plural, &key.1));
            }
            let mut body = config.clone();
            body["metadata"]["name"] = json!(key.1);
            let written = self.create(rt, Some(&key.0), body, options)?;
            if !options.dry_run {
                self.ownership
                    .entry(record_key)
                    .or_default()
                    .insert(me, AppliedConfig { config, leaves });
            }
            return Ok(written);
        };
        let records = self.ownership.get(&record_key).cloned().unwrap_or_default();
        let mut conflicts = Vec::new();
        let mut owned_by_others = BTreeSet::new();
        for ((other, other_status), applied) in &records {
            if (other, *other_status) == (&manager, status_only) {
                continue;
            }
            for (path, value) in &applied.leaves {
                match leaves.get(path) {
                    Some(mine) if mine != value => conflicts.push((other.clone(), path.clone())),
                    _ => {
                        owned_by_others.insert(path.clone());
                    }
                }
            }
        }
        if !conflicts.is_empty() && !options.force {
            let causes: Vec<Cause> = conflicts
                .iter()
                .map(|(other, path)| {
                    Cause::new(
                        "FieldManagerConflict",
                        path.clone(),
                        format!("conflict with \"{other}\""),
                    )
                })
                .collect();
            return Err(ApiError::apply_conflict(
                &rt.group, &rt.plural, &key.1, &causes,
            ));
        }
        let mut doc = to_served(&old, rt);
        let previous = records.get(&me).map(|a| &a.config);
        patch::apply_config(&mut doc, &config, previous, &owned_by_others, rules);
        let wanted = meta_str(&config, "resourceVersion");
        if !wanted.is_empty() && wanted != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                &key.1,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let written = self.finish_update(rt, key, old, doc, status_only, options)?;
        if !options.dry_run && self.stored(&rt.storage, key).is_some() {
            let records = self.ownership.entry(record_key).or_default();
            // Forced fields change hands.
            for (other, path) in &conflicts {
                for ((name, _), applied) in records.iter_mut() {
                    if name == other {
                        applied.leaves.remove(path);
                    }
                }
            }
            records.insert(me, AppliedConfig { config, leaves });
        }
        Ok(written)
    }

    /// GET of `/scale`.
    pub fn get_scale(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Value, ApiError> {
        let paths = rt.scale.as_ref().ok_or_else(ApiError::no_such_route)?;
        Ok(scale::scale_of(paths, &self.get(rt, namespace, name)?))
    }

    /// PUT (`patch == None`) or PATCH of `/scale`: the Scale is changed, then its
    /// `spec.replicas` is written into the object.
    #[allow(clippy::too_many_arguments)] // one argument per part of the request
    pub fn write_scale(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        patch: Option<PatchKind>,
        body: Value,
        options: &WriteOptions,
    ) -> Result<Written, ApiError> {
        let paths = rt.scale.clone().ok_or_else(ApiError::no_such_route)?;
        let key = Self::key_for(rt, namespace, name);
        let old = self
            .stored(&rt.storage, &key)
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        let current = to_served(&old, rt);
        let mut wanted = scale::scale_of(&paths, &current);
        match patch {
            None => wanted = body,
            Some(PatchKind::Json) => {
                patch::json_patch(&mut wanted, &body).map_err(|e| ApiError {
                    code: 422,
                    reason: "Invalid",
                    message: e,
                    details: None,
                })?
            }
            // A Scale has no lists, so every other flavour merges like a merge patch.
            Some(_) => patch::merge_patch(&mut wanted, &body),
        }
        let precondition = meta_str(&wanted, "resourceVersion");
        if !precondition.is_empty() && precondition != meta_str(&old, "resourceVersion") {
            return Err(ApiError::conflict(
                &rt.group,
                &rt.plural,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let replicas = wanted.pointer("/spec/replicas").and_then(Value::as_i64);
        let replicas = match replicas {
            Some(r) if r >= 0 => r,
            _ => {
                return Err(ApiError::invalid(
                    "autoscaling",
                    "Scale",
                    name,
                    vec![Cause::new(
                        "FieldValueInvalid",
                        "spec.replicas",
                        format!(
                            "Invalid value: {}: must be greater than or equal to 0",
                            wanted.pointer("/spec/replicas").unwrap_or(&Value::Null)
                        ),
                    )],
                ));
            }
        };
        let mut updated = current;
        scale::set_replicas(&paths, &mut updated, replicas);
        let written = self.finish_update(rt, &key, old, updated, false, options)?;
        Ok(Written {
            object: scale::scale_of(&paths, &written.object),
            ..written
        })
    }

    pub fn delete(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        delete_options: &Value,
        options: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let key = Self::key_for(rt, namespace, name);
        let old = self
            .stored(&rt.storage, &key)
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, name))?;
        for (field, label) in [("uid", "UID"), ("resourceVersion", "ResourceVersion")] {
            if let Some(wanted) = delete_options
                .pointer(&format!("/preconditions/{field}"))
                .and_then(Value::as_str)
                && wanted != meta_str(&old, field)
            {
                return Err(ApiError::conflict(
                    &rt.group,
                    &rt.plural,
                    name,
                    &format!(
                        "Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {}",
                        meta_str(&old, field)
                    ),
                ));
            }
        }
        if options.dry_run {
            return Ok(to_served(&old, rt));
        }
        let orphan = delete_options
            .get("propagationPolicy")
            .and_then(Value::as_str)
            == Some("Orphan")
            || delete_options
                .get("orphanDependents")
                .and_then(Value::as_bool)
                == Some(true);
        if has_finalizers(&old) {
            if old.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(to_served(&old, rt));
            }
            let mut marked = (*old).clone();
            marked["metadata"]["deletionTimestamp"] = json!(now());
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            let committed = self.commit(ChangeKind::Modified, &rt.storage, marked, Some(old));
            return Ok(to_served(&committed, rt));
        }
        if rt.storage == namespaces_key() {
            return Ok(to_served(&self.delete_namespace(&key, old), rt));
        }
        if rt.storage == crds_key() {
            self.purge_custom_resources(&old);
        }
        let gone = self.remove_object(&rt.storage, &key, (*old).clone(), !orphan);
        Ok(to_served(&gone, rt))
    }

    pub fn delete_collection(
        &mut self,
        rt: &ResourceType,
        namespace: Option<&str>,
        list_options: &ListOptions,
        delete_options: &Value,
        options: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let all = ListOptions {
            limit: None,
            continue_token: None,
            ..list_options.clone()
        };
        let mut list = self.list(rt, namespace, &all)?;
        let mut deleted = Vec::new();
        if let Some(Value::Array(items)) = list.get("items").cloned() {
            for item in items {
                let ns = meta_str(&item, "namespace").to_string();
                let name = meta_str(&item, "name").to_string();
                match self.delete(rt, Some(&ns), &name, delete_options, options) {
                    Ok(object) => deleted.push(object),
                    Err(e) if e.code == 404 => {}
                    Err(e) => return Err(e),
                }
            }
        }
        list["items"] = Value::Array(deleted);
        list["metadata"] = json!({"resourceVersion": self.revision.to_string()});
        Ok(list)
    }

    /// Marks the namespace terminating, deletes everything in it, then the namespace.
    fn delete_namespace(&mut self, key: &ObjectKey, old: Arc<Value>) -> Arc<Value> {
        let mut terminating = (*old).clone();
        terminating["metadata"]["deletionTimestamp"] = json!(now());
        terminating["status"] = json!({"phase": "Terminating"});
        let terminating = self.commit(
            ChangeKind::Modified,
            &namespaces_key(),
            terminating,
            Some(old),
        );
        let namespace = &key.1;
        let namespaced: Vec<StorageKey> = self
            .registry
            .storages()
            .into_iter()
            .filter(|t| t.namespaced)
            .map(|t| t.storage.clone())
            .collect();
        for storage in namespaced {
            for object in self.objects_in(&storage, Some(namespace)) {
                let object_key = object_key(&object);
                if self.stored(&storage, &object_key).is_some() {
                    self.remove_object(&storage, &object_key, (*object).clone(), true);
                }
            }
        }
        self.remove_object(&namespaces_key(), key, (*terminating).clone(), true);
        terminating
    }

    /// Deleting a CRD deletes its custom resources and stops serving its kinds.
    fn purge_custom_resources(&mut self, crd: &Value) {
        let storage = StorageKey {
            group: crd
                .pointer("/spec/group")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            resource: crd
                .pointer("/spec/names/plural")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        };
        for object in self.objects_in(&storage, None) {
            let key = object_key(&object);
            self.remove_object(&storage, &key, (*object).clone(), true);
        }
        self.objects.remove(&storage);
        self.registry.remove_crd(meta_str(crd, "name"));
    }

    /// Commits the deletion of one object, then (unless orphaning) of everything that
    /// names it as owner.
    fn remove_object(
        &mut self,
        storage: &StorageKey,
        key: &ObjectKey,
        last: Value,
        collect_dependents: bool,
    ) -> Arc<Value> {
        let previous = self.stored(storage, key);
        let uid = meta_str(&last, "uid").to_string();
        let gone = self.commit(ChangeKind::Deleted, storage, last, previous);
        self.ownership.remove(&(storage.clone(), key.clone()));
        if collect_dependents && !uid.is_empty() {
            let dependents: Vec<(StorageKey, ObjectKey, Value)> = self
                .objects
                .iter()
                .flat_map(|(storage, bucket)| {
                    bucket.iter().filter_map(|(key, object)| {
                        let owned = object
                            .pointer("/metadata/ownerReferences")
                            .and_then(Value::as_array)
                            .is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid.as_str()));
                        owned.then(|| (storage.clone(), key.clone(), (**object).clone()))
                    })
                })
                .collect();
            for (storage, key, object) in dependents {
                if self.stored(&storage, &key).is_some() {
                    self.remove_object(&storage, &key, object, true);
                }
            }
        }
        gone
    }

    /// Runs the faked controllers (and CRD serving) after a committed write.
    fn after_write(&mut self, storage: &StorageKey, key: &ObjectKey) {
        let Some(rt) = self.registry.for_storage(storage) else {
            return;
        };
        let Some(object) = self.stored(storage, key) else {
            return;
        };
        if *storage == crds_key()
            && let Err(e) = self.registry.install_crd(&object)
        {
            tracing::warn!(crd = %key.1, error = %e, "could not serve custom resource definition");
            return;
        }
        if let Some(status) = controllers::reconcile(&rt, &object, &now()) {
            let mut updated = (*object).clone();
            updated["status"] = status;
            self.commit(ChangeKind::Modified, storage, updated, Some(object));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        let (tx, _rx) = watch::channel(0);
        Store::new(100, tx)
    }

    fn rt(store: &Store, group: &str, version: &str, plural: &str) -> Arc<ResourceType> {
        store.registry.lookup(group, version, plural).expect(plural)
    }

    fn opts() -> WriteOptions {
        WriteOptions::default()
    }

    fn config_map(name: &str, data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
    }

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

    #[test]
    fn create_get_conflicts_and_generate_name() {
        let mut store = store();
        let cm = rt(&store, "", "v1", "configmaps");
        let created = store
            .create(
                &cm,
                Some("default"),
                config_map("a", json!({"k": "v"})),
                &opts(),
            )
            .unwrap();
        assert!(created.created);
        assert!(!meta_str(&created.object, "uid").is_empty());
        let again = store.create(&cm, Some("default"), config_map("a", json!({})), &opts());
        assert_eq!(again.unwrap_err().reason, "AlreadyExists");
        let generated = store
            .create(
                &cm,
                Some("default"),
                json!({"metadata": {"generateName": "gen-"}}),
                &opts(),
            )
            .unwrap();
        let name = meta_str(&generated.object, "name");
        assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
        let missing_ns = store.create(&cm, Some("nope"), config_map("b", json!({})), &opts());
        assert_eq!(
            missing_ns.unwrap_err().message,
            "namespaces \"nope\" not found"
        );
    }

    #[test]
    fn update_with_stale_resource_version_conflicts() {
        let mut store = store();
        let cm = rt(&store, "", "v1", "configmaps");
        let first = store
            .create(
                &cm,
                Some("default"),
                config_map("a", json!({"k": "1"})),
                &opts(),
            )
            .unwrap();
        let mut stale = first.object.clone();
        let mut fresh = first.object.clone();
        fresh["data"]["k"] = json!("2");
        store
            .update(&cm, Some("default"), "a", fresh, false, &opts())
            .unwrap();
        stale["data"]["k"] = json!("3");
        let err = store
            .update(&cm, Some("default"), "a", stale, false, &opts())
            .unwrap_err();
        assert_eq!((err.code, err.reason), (409, "Conflict"));
    }

    #[test]
    fn no_op_update_keeps_resource_version() {
        let mut store = store();
        let cm = rt(&store, "", "v1", "configmaps");
        let first = store
            .create(
                &cm,
                Some("default"),
                config_map("a", json!({"k": "1"})),
                &opts(),
            )
            .unwrap();
        let before = store.revision();
        let same = store
            .update(
                &cm,
                Some("default"),
                "a",
                first.object.clone(),
                false,
                &opts(),
            )
            .unwrap();
        assert_eq!(store.revision(), before);
        assert_eq!(
            same.object["metadata"]["resourceVersion"],
            first.object["metadata"]["resourceVersion"]
        );
    }

    #[test]
    fn status_subresource_and_generation() {
        let mut store = store();
        let deploy = rt(&store, "apps", "v1", "deployments");
        let body = json!({"metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}},
                                  "spec": {"containers": [{"name": "app", "image": "a"}]}}},
            "status": {"replicas": 99}});
        let created = store
            .create(&deploy, Some("default"), body, &opts())
            .unwrap();
        assert!(
            created.object.get("status").is_none(),
            "create ignores status"
        );
        assert_eq!(created.object["metadata"]["generation"], 1);
        // The faked controller reported the rollout.
        let current = store.get(&deploy, Some("default"), "web").unwrap();
        assert_eq!(current["status"]["observedGeneration"], 1);
        assert_eq!(current["status"]["readyReplicas"], 2);
        // A label change is not a spec change.
        let patched = store
            .patch(
                &deploy,
                Some("default"),
                "web",
                PatchKind::Merge,
                json!({"metadata": {"labels": {"x": "y"}}, "status": {"replicas": 5}}),
                false,
                &opts(),
            )
            .unwrap();
        assert_eq!(patched.object["metadata"]["generation"], 1);
        assert_eq!(
            patched.object["status"]["replicas"], 2,
            "main resource writes ignore status"
        );
        let patched = store
            .patch(
                &deploy,
                Some("default"),
                "web",
                PatchKind::Merge,
                json!({"spec": {"replicas": 3}}),
                false,
                &opts(),
            )
            .unwrap();
        assert_eq!(patched.object["metadata"]["generation"], 2);
        // /status writes ignore spec.
        let status = store
            .patch(
                &deploy,
                Some("default"),
                "web",
                PatchKind::Merge,
                json!({"spec": {"replicas": 7}, "status": {"replicas": 1}}),
                true,
                &opts(),
            )
            .unwrap();
        assert_eq!(status.object["spec"]["replicas"], 3);
        assert_eq!(status.object["status"]["replicas"], 1);
    }

    #[test]
    fn finalizers_delay_deletion_until_removed() {
        let mut store = store();
        let cm = rt(&store, "", "v1", "configmaps");
        let mut body = config_map("a", json!({}));
        body["metadata"]["finalizers"] = json!(["example.com/keep"]);
        store.create(&cm, Some("default"), body, &opts()).unwrap();
        let marked = store
            .delete(&cm, Some("default"), "a", &json!({}), &opts())
            .unwrap();
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        assert!(store.get(&cm, Some("default"), "a").is_ok());
        store
            .patch(
                &cm,
                Some("default"),
                "a",
                PatchKind::Merge,
                json!({"metadata": {"finalizers": null}}),
                false,
                &opts(),
            )
            .unwrap();
        assert_eq!(store.get(&cm, Some("default"), "a").unwrap_err().code, 404);
    }

    #[test]
    fn deleting_a_namespace_deletes_its_contents_and_dependents_follow_owners() {
        let mut store = store();
        let ns = rt(&store, "", "v1", "namespaces");
        let cm = rt(&store, "", "v1", "configmaps");
        store
            .create(&ns, None, json!({"metadata": {"name": "team"}}), &opts())
            .unwrap();
        let owner = store
            .create(&cm, Some("team"), config_map("owner", json!({})), &opts())
            .unwrap();
        let mut dependent = config_map("dependent", json!({}));
        dependent["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap",
            "name": "owner", "uid": owner.object["metadata"]["uid"]}]);
        store
            .create(&cm, Some("default"), dependent, &opts())
            .unwrap();
        store
            .delete(&ns, None, "team", &json!({}), &opts())
            .unwrap();
        assert_eq!(store.get(&ns, None, "team").unwrap_err().code, 404);
        assert_eq!(store.get(&cm, Some("team"), "owner").unwrap_err().code, 404);
        assert_eq!(
            store
                .get(&cm, Some("default"), "dependent")
                .unwrap_err()
                .code,
            404
        );
    }

    #[test]
    fn list_pages_with_continue_tokens() {
        let mut store = store();
        let cm = rt(&store, "", "v1", "configmaps");
        for name in ["a", "b", "c"] {
            store
                .create(&cm, Some("default"), config_map(name, json!({})), &opts())
                .unwrap();
        }
        let mut options = ListOptions {
            limit: Some(2),
            ..ListOptions::default()
        };
        let page = store.list(&cm, Some("default"), &options).unwrap();
        assert_eq!(page["items"].as_array().unwrap().len(), 2);
        assert_eq!(page["metadata"]["remainingItemCount"], 1);
        options.continue_token = page["metadata"]["continue"].as_str().map(str::to_string);
        let rest = store.list(&cm, Some("default"), &options).unwrap();
        assert_eq!(rest["items"][0]["metadata"]["name"], "c");
        assert!(rest["metadata"].get("continue").is_none());
        store.expire_history();
        assert_eq!(
            store.list(&cm, Some("default"), &options).unwrap_err().code,
            410
        );
    }

    #[test]
    fn server_side_apply_creates_merges_and_detects_conflicts() {
        let mut store = store();
        let cm = rt(&store, "", "v1", "configmaps");
        let as_manager = |m: &str, force: bool| WriteOptions {
            field_manager: Some(m.to_string()),
            force,
            ..WriteOptions::default()
        };
        let created = store
            .patch(
                &cm,
                Some("default"),
                "a",
                PatchKind::Apply,
                config_map("a", json!({"x": "1", "y": "1"})),
                false,
                &as_manager("one", false),
            )
            .unwrap();
        assert!(created.created);
        store
            .patch(
                &cm,
                Some("default"),
                "a",
                PatchKind::Apply,
                config_map("a", json!({"z": "2"})),
                false,
                &as_manager("two", false),
            )
            .unwrap();
        // "one" drops y: removed; z belongs to "two" and stays.
        let merged = store
            .patch(
                &cm,
                Some("default"),
                "a",
                PatchKind::Apply,
                config_map("a", json!({"x": "1"})),
                false,
                &as_manager("one", false),
            )
            .unwrap();
        assert_eq!(merged.object["data"], json!({"x": "1", "z": "2"}));
        let conflict = store
            .patch(
                &cm,
                Some("default"),
                "a",
                PatchKind::Apply,
                config_map("a", json!({"z": "3"})),
                false,
                &as_manager("one", false),
            )
            .unwrap_err();
        assert_eq!(conflict.code, 409);
        assert!(
            conflict.message.contains("conflict with \"two\": .data.z"),
            "{}",
            conflict.message
        );
        let forced = store
            .patch(
                &cm,
                Some("default"),
                "a",
                PatchKind::Apply,
                config_map("a", json!({"x": "1", "z": "3"})),
                false,
                &as_manager("one", true),
            )
            .unwrap();
        assert_eq!(forced.object["data"]["z"], "3");
    }

    #[test]
    fn custom_resources_are_validated_against_their_schema() {
        let mut store = store();
        let crds = rt(
            &store,
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
        );
        let crd = json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                        "status": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}}}]}
        });
        store.create(&crds, None, crd, &opts()).unwrap();
        let established = store.get(&crds, None, "widgets.example.com").unwrap();
        assert_eq!(
            established["status"]["conditions"][1]["type"],
            "Established"
        );
        let widgets = rt(&store, "example.com", "v1", "widgets");
        let bad = store
            .create(
                &widgets,
                Some("default"),
                json!({"metadata": {"name": "w"}, "spec": {"size": "big"}}),
                &opts(),
            )
            .unwrap_err();
        assert_eq!(bad.code, 422);
        assert!(bad.message.contains("spec.size"), "{}", bad.message);
        let strict = WriteOptions {
            field_validation: FieldValidation::Strict,
            ..opts()
        };
        let unknown = store
            .create(
                &widgets,
                Some("default"),
                json!({"metadata": {"name": "w"}, "spec": {"colour": 1}}),
                &strict,
            )
            .unwrap_err();
        assert_eq!(unknown.code, 400);
        assert!(
            unknown.message.contains("unknown field \"spec.colour\""),
            "{}",
            unknown.message
        );
        let warned = store
            .create(
                &widgets,
                Some("default"),
                json!({"metadata": {"name": "w"}, "spec": {"colour": 1}}),
                &opts(),
            )
            .unwrap();
        assert_eq!(warned.warnings, vec!["unknown field \"spec.colour\""]);
        assert_eq!(warned.object["spec"], json!({}));
        store
            .delete(&crds, None, "widgets.example.com", &json!({}), &opts())
            .unwrap();
        assert!(
            store
                .registry
                .lookup("example.com", "v1", "widgets")
                .is_none()
        );
        assert!(store.objects_in(&widgets.storage, None).is_empty());
    }

    #[test]
    fn history_is_bounded() {
        let (tx, _rx) = watch::channel(0);
        let mut store = Store::new(3, tx);
        let cm = rt(&store, "", "v1", "configmaps");
        let start = store.revision();
        for name in ["a", "b", "c", "d"] {
            store
                .create(&cm, Some("default"), config_map(name, json!({})), &opts())
                .unwrap();
        }
        assert!(store.changes_after(start).is_none());
        assert_eq!(store.changes_after(store.revision() - 2).unwrap().len(), 2);
    }
}
