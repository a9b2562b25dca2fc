//! Conversion between a served version and the stored form. Most versions differ only in
//! `apiVersion`; `events.k8s.io/v1` Events rename core `v1` Event fields, and both are
//! one store, so an event written by kube-rs' recorder is read by `kubectl get events`.

use serde_json::{Map, Value};

use super::registry::{Conversion, ResourceType};

/// (events.k8s.io/v1 name, core/v1 name) pairs of renamed Event fields.
const EVENT_FIELDS: [(&str, &str); 7] = [
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

fn rename(object: &mut Value, pairs: impl Iterator<Item = (&'static str, &'static str)>) {
    if let Value::Object(map) = object {
        for (from, to) in pairs {
            match map.remove(from) {
                Some(value) => {
                    map.insert(to.to_string(), value);
                }
                None => {
                    map.remove(to);
                }
            }
        }
    }
}

fn set_type_meta(object: &mut Value, api_version: &str, kind: &str) {
    if !object.is_object() {
        *object = Value::Object(Map::new());
    }
    object["apiVersion"] = Value::String(api_version.to_string());
    object["kind"] = Value::String(kind.to_string());
}

/// The stored object as `served` serves it (with `apiVersion`/`kind` set).
pub fn to_served(stored: &Value, served: &ResourceType) -> Value {
    let mut object = stored.clone();
    if served.conversion == Conversion::EventsV1 {
        rename(
            &mut object,
            EVENT_FIELDS.iter().map(|(events, core)| (*core, *events)),
        );
    }
    set_type_meta(&mut object, &served.api_version(), &served.kind);
    object
}

/// An object written through `served`, in stored form.
pub fn to_stored(mut object: Value, served: &ResourceType) -> Value {
    if served.conversion == Conversion::EventsV1 {
        rename(&mut object, EVENT_FIELDS.iter().copied());
    }
    set_type_meta(&mut object, &served.storage_api_version, &served.kind);
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;
    use serde_json::json;

    #[test]
    fn events_round_trip_between_versions() {
        let registry = Registry::default();
        let events_v1 = registry.lookup("events.k8s.io", "v1", "events").unwrap();
        let core = registry.lookup("", "v1", "events").unwrap();
        let written = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "default"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hello", "reason": "Test",
            "reportingController": "pilotfish", "type": "Normal"
        });
        let stored = to_stored(written.clone(), &events_v1);
        assert_eq!(stored["apiVersion"], "v1");
        assert_eq!(stored["involvedObject"]["name"], "p");
        assert_eq!(stored["message"], "hello");
        assert_eq!(stored["reportingComponent"], "pilotfish");
        assert!(stored.get("note").is_none());
        assert_eq!(to_served(&stored, &core)["message"], "hello");
        assert_eq!(to_served(&stored, &events_v1), written);
    }
}
