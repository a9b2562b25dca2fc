//! [`IstioStatus`]: the `status` of every Istio networking kind (`istio.meta.v1alpha1.IstioStatus`),
//! written through the status subresource (Pilotfish writes a `Reconciled` condition).
//!
//! Istio's Go writers encode `int64` generations as JSON strings (`"3"`); both strings and
//! numbers are read, numbers are written. The schema keeps unknown status fields, as Istio's
//! CRDs do, so that other writers are not pruned.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize};

use super::common::null_as_default;

/// Status of an Istio configuration object (a VirtualService, DestinationRule, ServiceEntry
/// or PeerAuthentication).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct IstioStatus {
    /// Current service state of the resource.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub conditions: Vec<IstioCondition>,
    /// Analyzer messages (errors, warnings) about the resource, kept as written.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(schema_with = "validation_messages_schema")]
    pub validation_messages: Vec<serde_json::Value>,
    /// The generation observed by the controller that wrote this status.
    #[serde(
        default,
        deserialize_with = "int_or_string_i64",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "int_or_string_schema")]
    pub observed_generation: Option<i64>,
}

/// One condition of the status (e.g. `Reconciled`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IstioCondition {
    /// Type of the condition (e.g. `Reconciled`).
    #[serde(default)]
    pub r#type: String,
    /// Status of the condition: `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Last time the condition was probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    /// Last time the condition changed status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Unique, one-word, CamelCase reason for the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable details about the last transition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The resource generation this condition refers to.
    #[serde(
        default,
        deserialize_with = "int_or_string_i64",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "int_or_string_schema")]
    pub observed_generation: Option<i64>,
}

fn int_or_string_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "anyOf": [{ "type": "integer" }, { "type": "string" }]
    })
}

fn validation_messages_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
    })
}

/// Reads an `int64` written either as a JSON number or as a decimal string.
fn int_or_string_i64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum IntOrString {
        Int(i64),
        String(String),
    }
    match Option::<IntOrString>::deserialize(deserializer)? {
        None => Ok(None),
        Some(IntOrString::Int(n)) => Ok(Some(n)),
        Some(IntOrString::String(s)) => s.parse().map(Some).map_err(|_| {
            serde::de::Error::custom(format!("expected an integer generation, got {s:?}"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_generations_written_as_strings_or_numbers() {
        let status: IstioStatus = serde_json::from_value(json!({
            "observedGeneration": "3",
            "conditions": [{"type": "Reconciled", "status": "True", "observedGeneration": 2,
                            "lastProbeTime": null}],
            "validationMessages": [{"level": "WARNING", "type": {"code": "IST0101"}}]
        }))
        .unwrap();
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.conditions[0].observed_generation, Some(2));
        assert_eq!(status.conditions[0].last_probe_time, None);
        assert_eq!(status.validation_messages[0]["type"]["code"], "IST0101");
        assert_eq!(
            serde_json::to_value(&status).unwrap()["observedGeneration"],
            3
        );
    }

    #[test]
    fn rejects_a_non_numeric_generation() {
        let err =
            serde_json::from_value::<IstioStatus>(json!({"observedGeneration": "x"})).unwrap_err();
        assert!(err.to_string().contains("integer generation"), "{err}");
    }
}
