//! The four PATCH flavours as pure functions over JSON: RFC 7386 merge patch, RFC 6902
//! JSON patch, Kubernetes strategic merge patch (merge keys, `$patch: replace|delete`,
//! `$setElementOrder/…`, `$deleteFromPrimitiveList/…`, `$retainKeys`) and a server-side
//! apply merge (associative lists by key, atomic lists replaced, fields the manager
//! applied before and dropped now removed). Which lists merge by which key comes from
//! [`Rules`]: a hand-kept table for built-ins, the CRD schema for custom resources.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::schema::{self, ListStrategy};

/// Where list strategies come from for one kind.
#[derive(Debug, Clone, Copy)]
pub enum Rules<'a> {
    /// A built-in kind, by Kind name.
    BuiltIn(&'a str),
    /// A custom resource with (maybe) a structural schema.
    Schema(Option<&'a Value>),
}

const CONTAINER_LISTS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];

fn keyed(keys: &[&str]) -> ListStrategy {
    ListStrategy::Map(keys.iter().map(|k| k.to_string()).collect())
}

impl Rules<'_> {
    /// Strategy of the list at `path` (field names from the object root; list
    /// elements add no segment).
    pub fn list_strategy(&self, path: &[String]) -> ListStrategy {
        let n = path.len();
        let last = path.last().map(String::as_str).unwrap_or("");
        let parent = if n >= 2 { path[n - 2].as_str() } else { "" };
        // Object metadata merges the same way for every kind.
        if n == 2 && parent == "metadata" {
            return match last {
                "ownerReferences" => keyed(&["uid"]),
                "finalizers" => ListStrategy::Set,
                _ => ListStrategy::Atomic,
            };
        }
        match self {
            Rules::Schema(Some(schema)) => schema::list_strategy(schema, path),
            Rules::Schema(None) => ListStrategy::Atomic,
            Rules::BuiltIn(kind) => builtin_list_strategy(kind, parent, last, n),
        }
    }
}

/// The patch merge keys of the Kubernetes Go types for the lists our flows touch
/// (pod templates, Service ports, conditions). Anything else is atomic.
fn builtin_list_strategy(kind: &str, parent: &str, last: &str, depth: usize) -> ListStrategy {
    if CONTAINER_LISTS.contains(&parent) {
        return match last {
            "ports" => keyed(&["containerPort"]),
            "env" => keyed(&["name"]),
            "volumeMounts" => keyed(&["mountPath"]),
            "volumeDevices" => keyed(&["devicePath"]),
            "resizePolicy" => keyed(&["resourceName"]),
            _ => ListStrategy::Atomic,
        };
    }
    match (parent, last) {
        ("spec", l) if CONTAINER_LISTS.contains(&l) => keyed(&["name"]),
        ("spec", "ports") if kind == "Service" => keyed(&["port"]),
        ("spec", "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates") => {
            keyed(&["name"])
        }
        ("spec", "hostAliases") => keyed(&["ip"]),
        ("spec", "topologySpreadConstraints") => keyed(&["topologyKey", "whenUnsatisfiable"]),
        ("status", "conditions") => keyed(&["type"]),
        ("status", "addresses") if kind == "Node" => keyed(&["type"]),
        ("status", "podIPs" | "hostIPs") => keyed(&["ip"]),
        ("", "secrets") if kind == "ServiceAccount" && depth == 1 => keyed(&["name"]),
        _ => ListStrategy::Atomic,
    }
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

/// RFC 6902 JSON patch; the error names the failing operation.
pub fn json_patch(doc: &mut Value, patch: &Value) -> Result<(), String> {
    let operations: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(|e| format!("invalid JSON patch: {e}"))?;
    json_patch::patch(doc, &operations).map_err(|e| e.to_string())
}

fn path_with(path: &[String], key: &str) -> Vec<String> {
    let mut next = path.to_vec();
    next.push(key.to_string());
    next
}

fn is_directive(key: &str) -> bool {
    key == "$patch"
        || key == "$retainKeys"
        || key.starts_with("$setElementOrder/")
        || key.starts_with("$deleteFromPrimitiveList/")
}

/// A copy of a patch fragment with every directive removed (for inserting new values).
fn without_directives(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(k, _)| !is_directive(k))
                .map(|(k, v)| (k.clone(), without_directives(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .map(without_directives)
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Applies a strategic merge patch to `doc`.
pub fn strategic_merge(doc: &mut Value, patch: &Value, rules: Rules<'_>) -> Result<(), String> {
    let Value::Object(patch) = patch else {
        return Err("strategic merge patch must be a JSON object".to_string());
    };
    let mut map = match std::mem::take(doc) {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let result = merge_map(&mut map, patch, rules, &[]);
    *doc = Value::Object(map);
    result
}

fn merge_map(
    doc: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    rules: Rules<'_>,
    path: &[String],
) -> Result<(), String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *doc = match without_directives(&Value::Object(patch.clone())) {
                Value::Object(map) => map,
                _ => Map::new(),
            };
            return Ok(());
        }
        Some("delete") => {
            doc.clear();
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type: {other}")),
    }
    let mut orders: Vec<(&str, &Vec<Value>)> = Vec::new();
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix("$setElementOrder/") {
            if let Value::Array(order) = value {
                orders.push((field, order));
            }
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Value::Array(remove)) = (doc.get_mut(field), value) {
                items.retain(|item| !remove.contains(item));
            }
            continue;
        }
        if is_directive(key) {
            continue;
        }
        let child_path = path_with(path, key);
        match value {
            Value::Null => {
                doc.remove(key);
            }
            Value::Object(child_patch) => {
                if child_patch.get("$patch").and_then(Value::as_str) == Some("delete") {
                    doc.remove(key);
                    continue;
                }
                let entry = doc
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !entry.is_object() {
                    *entry = Value::Object(Map::new());
                }
                if let Value::Object(child) = entry {
                    merge_map(child, child_patch, rules, &child_path)?;
                }
            }
            Value::Array(items) => {
                let strategy = rules.list_strategy(&child_path);
                let entry = doc
                    .entry(key.clone())
                    .or_insert_with(|| Value::Array(vec![]));
                if !entry.is_array() {
                    *entry = Value::Array(vec![]);
                }
                if let Value::Array(current) = entry {
                    merge_list(current, items, &strategy, rules, &child_path)?;
                }
            }
            scalar => {
                doc.insert(key.clone(), scalar.clone());
            }
        }
    }
    if let Some(Value::Array(retain)) = patch.get("$retainKeys") {
        let keep: BTreeSet<&str> = retain.iter().filter_map(Value::as_str).collect();
        doc.retain(|k, _| keep.contains(k.as_str()));
    }
    for (field, order) in orders {
        let strategy = rules.list_strategy(&path_with(path, field));
        if let Some(Value::Array(items)) = doc.get_mut(field) {
            set_element_order(items, order, &strategy);
        }
    }
    Ok(())
}

fn element_key(item: &Value, keys: &[String]) -> Option<Vec<Value>> {
    let map = item.as_object()?;
    Some(
        keys.iter()
            .map(|k| map.get(k).cloned().unwrap_or(Value::Null))
            .collect(),
    )
}

/// Strategic merge uses only the first (the patch merge) key.
fn first_key(keys: &[String]) -> &[String] {
    &keys[..keys.len().min(1)]
}

fn merge_list(
    current: &mut Vec<Value>,
    patch: &[Value],
    strategy: &ListStrategy,
    rules: Rules<'_>,
    path: &[String],
) -> Result<(), String> {
    if patch
        .iter()
        .any(|item| item.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *current = patch
            .iter()
            .filter(|i| i.get("$patch").is_none())
            .map(without_directives)
            .collect();
        return Ok(());
    }
    match strategy {
        ListStrategy::Atomic => {
            *current = patch.iter().map(without_directives).collect();
        }
        ListStrategy::Set => {
            for item in patch {
                if !current.contains(item) {
                    current.push(item.clone());
                }
            }
        }
        ListStrategy::Map(keys) => {
            let keys = first_key(keys);
            for item in patch {
                let Some(key) = element_key(item, keys) else {
                    return Err(format!(
                        "list {} is merged by key {:?} but an element is not an object",
                        path.join("."),
                        keys
                    ));
                };
                let position = current
                    .iter()
                    .position(|c| element_key(c, keys).as_ref() == Some(&key));
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    current.retain(|c| element_key(c, keys).as_ref() != Some(&key));
                    continue;
                }
                let Value::Object(item_patch) = item else {
                    continue;
                };
                match position {
                    Some(i) => {
                        if let Value::Object(existing) = &mut current[i] {
                            merge_map(existing, item_patch, rules, path)?;
                        }
                    }
                    None => {
                        let mut fresh = Map::new();
                        merge_map(&mut fresh, item_patch, rules, path)?;
                        current.push(Value::Object(fresh));
                    }
                }
            }
        }
    }
    Ok(())
}

/// Orders `items` as `$setElementOrder` lists them; items it does not name keep their
/// relative order after the named ones.
fn set_element_order(items: &mut Vec<Value>, order: &[Value], strategy: &ListStrategy) {
    let rank = |item: &Value| -> usize {
        let found = match strategy {
            ListStrategy::Map(keys) => {
                let keys = first_key(keys);
                let key = element_key(item, keys);
                order.iter().position(|o| element_key(o, keys) == key)
            }
            _ => order.iter().position(|o| o == item),
        };
        found.unwrap_or(order.len())
    };
    let mut ranked: Vec<(usize, Value)> = items.drain(..).map(|i| (rank(&i), i)).collect();
    ranked.sort_by_key(|(r, _)| *r);
    items.extend(ranked.into_iter().map(|(_, i)| i));
}

/// Field paths (as server-side apply names them, e.g. `.spec.ports[port=80].targetPort`)
/// of every leaf an applied configuration sets, with the value it sets.
pub fn leaf_paths(config: &Value, rules: Rules<'_>) -> BTreeMap<String, Value> {
    let mut leaves = BTreeMap::new();
    collect_leaves(config, rules, &[], "", &mut leaves);
    leaves
}

fn collect_leaves(
    value: &Value,
    rules: Rules<'_>,
    path: &[String],
    rendered: &str,
    leaves: &mut BTreeMap<String, Value>,
) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, child) in map {
                // Identity fields are not owned by anyone.
                if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind") {
                    continue;
                }
                if path.len() == 1
                    && path[0] == "metadata"
                    && matches!(
                        key.as_str(),
                        "name" | "namespace" | "resourceVersion" | "uid"
                    )
                {
                    continue;
                }
                collect_leaves(
                    child,
                    rules,
                    &path_with(path, key),
                    &format!("{rendered}.{key}"),
                    leaves,
                );
            }
        }
        Value::Array(items) => match rules.list_strategy(path) {
            ListStrategy::Map(keys) => {
                for item in items {
                    let selector: Vec<String> = keys
                        .iter()
                        .filter_map(|k| item.get(k).map(|v| format!("{k}={v}")))
                        .collect();
                    collect_leaves(
                        item,
                        rules,
                        path,
                        &format!("{rendered}[{}]", selector.join(",")),
                        leaves,
                    );
                }
            }
            ListStrategy::Set => {
                for item in items {
                    leaves.insert(format!("{rendered}[v={item}]"), item.clone());
                }
            }
            ListStrategy::Atomic => {
                leaves.insert(rendered.to_string(), value.clone());
            }
        },
        other => {
            leaves.insert(rendered.to_string(), other.clone());
        }
    }
}

/// Server-side apply of `config` onto `live`: first removes what this manager applied
/// last time (`previous`) and no longer applies, unless another manager owns it
/// (`owned_by_others`, in [`leaf_paths`] form), then merges `config` in.
pub fn apply_config(
    live: &mut Value,
    config: &Value,
    previous: Option<&Value>,
    owned_by_others: &BTreeSet<String>,
    rules: Rules<'_>,
) {
    if let Some(previous) = previous {
        remove_dropped(live, previous, config, owned_by_others, rules, &[], "");
    }
    apply_merge(live, config, rules, &[]);
}

fn owned_under(owned: &BTreeSet<String>, rendered: &str) -> bool {
    owned.range(rendered.to_string()..).next().is_some_and(|p| {
        p == rendered
            || p.starts_with(&format!("{rendered}."))
            || p.starts_with(&format!("{rendered}["))
    })
}

fn remove_dropped(
    live: &mut Value,
    previous: &Value,
    config: &Value,
    owned: &BTreeSet<String>,
    rules: Rules<'_>,
    path: &[String],
    rendered: &str,
) {
    match (live, previous, config) {
        (Value::Object(live), Value::Object(previous), config) => {
            for (key, previous_child) in previous {
                let child_rendered = format!("{rendered}.{key}");
                let child_path = path_with(path, key);
                match config.get(key) {
                    None => {
                        if !owned_under(owned, &child_rendered) {
                            live.remove(key);
                        }
                    }
                    Some(config_child) => {
                        if let Some(live_child) = live.get_mut(key) {
                            remove_dropped(
                                live_child,
                                previous_child,
                                config_child,
                                owned,
                                rules,
                                &child_path,
                                &child_rendered,
                            );
                        }
                    }
                }
            }
        }
        (Value::Array(live), Value::Array(previous), Value::Array(config)) => {
            match rules.list_strategy(path) {
                ListStrategy::Map(keys) => {
                    for previous_item in previous {
                        let key = element_key(previous_item, &keys);
                        let in_config = config.iter().find(|c| element_key(c, &keys) == key);
                        let Some(index) = live.iter().position(|l| element_key(l, &keys) == key)
                        else {
                            continue;
                        };
                        match in_config {
                            None => {
                                live.remove(index);
                            }
                            Some(config_item) => remove_dropped(
                                &mut live[index],
                                previous_item,
                                config_item,
                                owned,
                                rules,
                                path,
                                rendered,
                            ),
                        }
                    }
                }
                ListStrategy::Set => {
                    live.retain(|item| !previous.contains(item) || config.contains(item));
                }
                ListStrategy::Atomic => {}
            }
        }
        _ => {}
    }
}

fn apply_merge(live: &mut Value, config: &Value, rules: Rules<'_>, path: &[String]) {
    match config {
        Value::Object(config) => {
            if !live.is_object() {
                *live = Value::Object(Map::new());
            }
            let Value::Object(live) = live else { return };
            for (key, config_child) in config {
                if config_child.is_null() {
                    live.remove(key);
                    continue;
                }
                let child_path = path_with(path, key);
                let live_child = live.entry(key.clone()).or_insert(Value::Null);
                apply_merge(live_child, config_child, rules, &child_path);
            }
        }
        Value::Array(config_items) => match (rules.list_strategy(path), live) {
            (ListStrategy::Map(keys), Value::Array(live_items)) => {
                for item in config_items {
                    let key = element_key(item, &keys);
                    match live_items.iter_mut().find(|l| element_key(l, &keys) == key) {
                        Some(existing) => apply_merge(existing, item, rules, path),
                        None => live_items.push(item.clone()),
                    }
                }
            }
            (ListStrategy::Set, Value::Array(live_items)) => {
                for item in config_items {
                    if !live_items.contains(item) {
                        live_items.push(item.clone());
                    }
                }
            }
            (_, live) => *live = Value::Array(config_items.clone()),
        },
        scalar => *live = scalar.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SERVICE: Rules<'static> = Rules::BuiltIn("Service");
    const DEPLOYMENT: Rules<'static> = Rules::BuiltIn("Deployment");

    #[test]
    fn strategic_merge_merges_service_ports_by_port() {
        let mut svc = json!({"spec": {"ports": [
            {"port": 80, "targetPort": 8080, "protocol": "TCP"},
            {"port": 443, "targetPort": 8443, "protocol": "TCP"}
        ]}});
        // What kubectl's client-side apply sends when 443 is dropped and 80 retargeted.
        let patch = json!({"spec": {
            "$setElementOrder/ports": [{"port": 9090}, {"port": 80}],
            "ports": [{"port": 80, "targetPort": 9000}, {"port": 9090, "targetPort": 9090},
                      {"$patch": "delete", "port": 443}]
        }});
        strategic_merge(&mut svc, &patch, SERVICE).unwrap();
        assert_eq!(
            svc["spec"]["ports"],
            json!([
                {"port": 9090, "targetPort": 9090},
                {"port": 80, "targetPort": 9000, "protocol": "TCP"}
            ])
        );
    }

    #[test]
    fn strategic_merge_containers_env_and_nulls() {
        let mut deploy = json!({"metadata": {"labels": {"a": "1", "b": "2"}},
        "spec": {"template": {"spec": {"containers": [
            {"name": "app", "image": "v1", "env": [{"name": "X", "value": "1"}]},
            {"name": "side", "image": "s1"}
        ]}}}});
        let patch = json!({"metadata": {"labels": {"b": null}},
        "spec": {"template": {"spec": {"containers": [
            {"name": "app", "image": "v2", "env": [{"name": "Y", "value": "2"}]}
        ]}}}});
        strategic_merge(&mut deploy, &patch, DEPLOYMENT).unwrap();
        assert_eq!(deploy["metadata"]["labels"], json!({"a": "1"}));
        let containers = &deploy["spec"]["template"]["spec"]["containers"];
        assert_eq!(containers[0]["image"], "v2");
        assert_eq!(
            containers[0]["env"],
            json!([{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}])
        );
        assert_eq!(containers[1]["name"], "side");
    }

    #[test]
    fn strategic_merge_replace_and_primitive_delete() {
        let mut obj = json!({"metadata": {"finalizers": ["a", "b"]},
                             "spec": {"selector": {"x": "1", "y": "2"}}});
        let patch = json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"], "finalizers": ["c"]},
                           "spec": {"selector": {"$patch": "replace", "z": "3"}}});
        strategic_merge(&mut obj, &patch, SERVICE).unwrap();
        assert_eq!(obj["metadata"]["finalizers"], json!(["b", "c"]));
        assert_eq!(obj["spec"]["selector"], json!({"z": "3"}));
    }

    #[test]
    fn unkeyed_lists_are_replaced() {
        let mut role = json!({"rules": [{"verbs": ["get"]}]});
        strategic_merge(
            &mut role,
            &json!({"rules": [{"verbs": ["list"]}]}),
            Rules::BuiltIn("Role"),
        )
        .unwrap();
        assert_eq!(role["rules"], json!([{"verbs": ["list"]}]));
    }

    #[test]
    fn json_patch_reports_failures() {
        let mut doc = json!({"spec": {"a": 1}});
        json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "/spec/a", "value": 2}]),
        )
        .unwrap();
        assert_eq!(doc["spec"]["a"], 2);
        assert!(
            json_patch(
                &mut doc,
                &json!([{"op": "test", "path": "/spec/a", "value": 3}])
            )
            .is_err()
        );
        assert!(json_patch(&mut doc, &json!({"op": "nonsense"})).is_err());
    }

    #[test]
    fn apply_removes_fields_the_manager_dropped() {
        let previous = json!({"metadata": {"labels": {"a": "1", "b": "2"}},
                              "spec": {"ports": [{"port": 80}, {"port": 81}]}});
        let mut live = previous.clone();
        live["metadata"]["labels"]["other"] = json!("kept");
        live["spec"]["clusterIP"] = json!("10.0.0.1");
        let config = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"ports": [{"port": 80, "name": "http"}]}});
        apply_config(
            &mut live,
            &config,
            Some(&previous),
            &BTreeSet::new(),
            SERVICE,
        );
        assert_eq!(
            live["metadata"]["labels"],
            json!({"a": "1", "other": "kept"})
        );
        assert_eq!(live["spec"]["ports"], json!([{"port": 80, "name": "http"}]));
        assert_eq!(live["spec"]["clusterIP"], "10.0.0.1");
    }

    #[test]
    fn apply_keeps_fields_other_managers_own() {
        let previous = json!({"data": {"a": "1", "b": "2"}});
        let mut live = previous.clone();
        let owned: BTreeSet<String> = [".data.b".to_string()].into();
        apply_config(
            &mut live,
            &json!({"data": {"a": "3"}}),
            Some(&previous),
            &owned,
            Rules::BuiltIn("ConfigMap"),
        );
        assert_eq!(live["data"], json!({"a": "3", "b": "2"}));
    }

    #[test]
    fn leaf_paths_name_list_elements_by_key() {
        let leaves = leaf_paths(
            &json!({"apiVersion": "v1", "metadata": {"name": "s", "labels": {"a": "1"}},
                    "spec": {"ports": [{"port": 80, "targetPort": 8080}]}}),
            SERVICE,
        );
        let keys: Vec<&str> = leaves.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            vec![
                ".metadata.labels.a",
                ".spec.ports[port=80].port",
                ".spec.ports[port=80].targetPort"
            ]
        );
    }
}
