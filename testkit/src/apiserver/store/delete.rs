//! The delete verbs: delete (uid and resourceVersion preconditions; finalizers hold
//! the object with a `deletionTimestamp` until they are removed) and deletecollection,
//! and the cascades a deletion starts: a namespace turns `Terminating`, loses its
//! contents, then goes; a CRD takes its custom resources and kinds with it; dependents
//! that name a deleted owner follow it unless `propagationPolicy=Orphan`.

use std::sync::Arc;

use serde_json::{Value, json};

use super::history::ChangeKind;
use super::{
    ListOptions, ObjectKey, Store, WriteOptions, crds_key, has_finalizers, meta_str,
    namespaces_key, now, object_key,
};
use crate::apiserver::convert::to_served;
use crate::apiserver::error::ApiError;
use crate::apiserver::registry::{ResourceType, StorageKey};

impl Store {
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
    pub(super) fn remove_object(
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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::PatchKind;
    use super::super::testing::{config_map, opts, rt, store};

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
}
