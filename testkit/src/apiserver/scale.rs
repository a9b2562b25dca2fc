//! The `/scale` subresource (`autoscaling/v1` Scale) of workloads and of CRDs that
//! declare one: pure conversions between an object and its Scale view, which
//! `kubectl scale` and autoscalers read and write.

use serde_json::{Map, Value, json};

use super::registry::ScalePaths;

/// Renders a `LabelSelector` object (`matchLabels`, `matchExpressions`) as the string
/// form Scale's `status.selector` carries; a string is taken as it is.
pub(super) fn selector_string(selector: &Value) -> Option<String> {
    if let Value::String(text) = selector {
        return Some(text.clone());
    }
    let mut parts = Vec::new();
    if let Some(Value::Object(labels)) = selector.get("matchLabels") {
        for (key, value) in labels {
            parts.push(format!("{key}={}", value.as_str().unwrap_or("")));
        }
    }
    if let Some(Value::Array(expressions)) = selector.get("matchExpressions") {
        for expression in expressions {
            let key = expression["key"].as_str().unwrap_or("");
            let values: Vec<&str> = expression["values"]
                .as_array()
                .map(|v| v.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            parts.push(match expression["operator"].as_str().unwrap_or("") {
                "In" => format!("{key} in ({})", values.join(",")),
                "NotIn" => format!("{key} notin ({})", values.join(",")),
                "Exists" => key.to_string(),
                _ => format!("!{key}"),
            });
        }
    }
    (!parts.is_empty()).then(|| parts.join(","))
}

/// The Scale view of `object` (served form).
pub fn scale_of(paths: &ScalePaths, object: &Value) -> Value {
    let mut metadata = Map::new();
    for field in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(value) = object.get("metadata").and_then(|m| m.get(field)) {
            metadata.insert(field.to_string(), value.clone());
        }
    }
    let replicas = |pointer: &str| object.pointer(pointer).cloned().unwrap_or(json!(0));
    let mut status = json!({ "replicas": replicas(&paths.status_replicas) });
    if let Some(selector) = paths
        .label_selector
        .as_deref()
        .and_then(|p| object.pointer(p))
        .and_then(selector_string)
    {
        status["selector"] = json!(selector);
    }
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": metadata,
        "spec": { "replicas": replicas(&paths.spec_replicas) },
        "status": status,
    })
}

/// Sets the replica count a Scale asks for into `object`, creating parents as needed.
pub fn set_replicas(paths: &ScalePaths, object: &mut Value, replicas: i64) {
    let mut current = object;
    let segments: Vec<&str> = paths.spec_replicas.split('/').skip(1).collect();
    for (i, segment) in segments.iter().enumerate() {
        if !current.is_object() {
            *current = Value::Object(Map::new());
        }
        let Value::Object(map) = current else { return };
        if i + 1 == segments.len() {
            map.insert(segment.to_string(), json!(replicas));
            return;
        }
        current = map.entry(segment.to_string()).or_insert_with(|| json!({}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workload() -> ScalePaths {
        ScalePaths {
            spec_replicas: "/spec/replicas".into(),
            status_replicas: "/status/replicas".into(),
            label_selector: Some("/spec/selector".into()),
        }
    }

    #[test]
    fn scale_view_of_a_deployment() {
        let deployment = json!({
            "metadata": {"name": "web", "namespace": "default", "resourceVersion": "7", "labels": {"x": "y"}},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]}},
            "status": {"replicas": 1}
        });
        let scale = scale_of(&workload(), &deployment);
        assert_eq!(scale["spec"]["replicas"], 2);
        assert_eq!(
            scale["status"],
            json!({"replicas": 1, "selector": "app=web,tier in (a,b)"})
        );
        assert_eq!(
            scale["metadata"],
            json!({"name": "web", "namespace": "default", "resourceVersion": "7"})
        );
    }

    #[test]
    fn replicas_are_written_where_the_paths_say() {
        let paths = ScalePaths {
            spec_replicas: "/spec/size".into(),
            status_replicas: "/status/size".into(),
            label_selector: None,
        };
        let mut object = json!({"metadata": {"name": "w"}});
        set_replicas(&paths, &mut object, 4);
        assert_eq!(object["spec"]["size"], 4);
        assert_eq!(scale_of(&paths, &object)["status"], json!({"replicas": 0}));
    }
}
