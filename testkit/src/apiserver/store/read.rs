//! The read verbs: get, and list with label and field selectors and `limit`/`continue`
//! paging (a continue token is `revision/namespace/name`; one from before the history
//! floor gets 410). Lists are always served from the current state.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use serde_json::{Value, json};

use super::{ListOptions, Store};
use crate::apiserver::convert::to_served;
use crate::apiserver::error::ApiError;
use crate::apiserver::registry::{ResourceType, StorageKey};

impl Store {
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
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::testing::{config_map, opts, rt, store};
    use super::*;

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
}
