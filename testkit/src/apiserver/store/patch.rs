//! The PATCH verb: JSON merge, JSON and strategic merge patches (refused with 415 on
//! custom resources, as upstream), and server-side apply: create or merge, a required
//! `fieldManager`, conflicts with fields another apply manager set to a different value
//! (409 unless `force`), and per-manager records of what each last applied, so fields a
//! manager stops applying are removed. The merges themselves are the pure functions of
//! the apiserver's `patch` module.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};

use super::{
    ObjectKey, PatchKind, Store, WriteOptions, Written, check_identity, check_type_meta, meta_str,
};
use crate::apiserver::convert::to_served;
use crate::apiserver::error::{ApiError, Cause};
use crate::apiserver::patch::{self as merges, Rules};
use crate::apiserver::registry::{ResourceType, Shape};

/// What one field manager last applied (server-side apply) to one object.
#[derive(Debug, Clone)]
pub(super) struct AppliedConfig {
    config: Value,
    leaves: BTreeMap<String, Value>,
}

/// Apply records per object: (manager, is-status-subresource) → config.
pub(super) type Ownership = BTreeMap<(String, bool), AppliedConfig>;

fn rules(rt: &ResourceType) -> Rules<'_> {
    match &rt.shape {
        Shape::BuiltIn { .. } => Rules::BuiltIn(&rt.kind),
        Shape::Custom { .. } => Rules::Schema(rt.schema()),
    }
}

impl Store {
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
            PatchKind::Merge => merges::merge_patch(&mut doc, &body),
            PatchKind::Json => merges::json_patch(&mut doc, &body).map_err(|e| ApiError {
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
                merges::strategic_merge(&mut doc, &body, rules(rt))
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
        let leaves = merges::leaf_paths(&config, rules);
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
        merges::apply_config(&mut doc, &config, previous, &owned_by_others, rules);
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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::testing::{config_map, rt, store};
    use super::*;

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
}
