//! The write verbs: create (`generateName`, namespace checks, server-set metadata) and
//! update of the main resource or `/status` (optimistic concurrency, the status
//! subresource split, `generation` on spec changes, no-op writes that change nothing).
//! [`Store::finish_update`] is the common tail of update, patch, apply and `/scale`.
//! Every write is admitted first (typed decoding or the CRD schema, unknown fields per
//! `fieldValidation`), and the faked controllers run right after it commits.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rand::Rng;
use serde::Deserialize;
use serde_json::{Value, json};

use super::history::ChangeKind;
use super::{
    FieldValidation, ObjectKey, Store, WriteOptions, Written, check_identity, check_type_meta,
    crds_key, has_finalizers, meta_str, namespaces_key, now,
};
use crate::apiserver::controllers;
use crate::apiserver::convert::{to_served, to_stored};
use crate::apiserver::defaults;
use crate::apiserver::error::ApiError;
use crate::apiserver::meta;
use crate::apiserver::registry::{self, ResourceType, Shape, StorageKey};
use crate::apiserver::schema;

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

impl Store {
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
    pub(super) fn finish_update(
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
    use serde_json::json;

    use super::super::PatchKind;
    use super::super::testing::{config_map, opts, rt, store};
    use super::*;

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
}
