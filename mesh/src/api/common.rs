//! Messages shared by several Istio kinds ([`StringMatch`], [`Destination`], [`PortSelector`],
//! [`Percent`]), the oneof reporting helper [`OneofGroup`] and the `sibling_oneofs!` macro
//! that declares a message's oneofs, and the serde/schema helpers the type modules use.

use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Deserializes an explicit `null` like an absent field (Go's JSON decoding, which Kubernetes
/// and Istio use, treats both the same for lists and maps).
pub(crate) fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Schema of a base64 `bytes` field (`k8s_openapi::ByteString` has no `JsonSchema`).
pub(crate) fn bytes_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({ "type": "string", "format": "byte" })
}

/// Adds Istio's structural "at most one of these properties" constraint to an object schema:
/// `oneOf: [{not: {anyOf: [{required: [a]}, …]}}, {required: [a]}, …]`. Only `required`
/// appears inside the branches, as Kubernetes' structural-schema rules demand.
pub(crate) fn at_most_one_of(schema: &mut Schema, members: &[&str]) {
    let constraint = at_most_one_constraint(members);
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    match object.remove("oneOf") {
        None => {
            if let Some(serde_json::Value::Array(all_of)) = object.get_mut("allOf") {
                all_of.push(constraint);
            } else {
                object.insert("oneOf".into(), constraint["oneOf"].clone());
            }
        }
        Some(existing) => {
            // A second oneof group on the same message: both must hold.
            object.insert(
                "allOf".into(),
                serde_json::json!([{ "oneOf": existing }, constraint]),
            );
        }
    }
}

fn at_most_one_constraint(members: &[&str]) -> serde_json::Value {
    let each: Vec<serde_json::Value> = members
        .iter()
        .map(|m| serde_json::json!({ "required": [m] }))
        .collect();
    let mut branches = vec![serde_json::json!({ "not": { "anyOf": each.clone() } })];
    branches.extend(each);
    serde_json::json!({ "oneOf": branches })
}

/// One proto `oneof` whose members Istio's JSON carries as sibling fields (for example a
/// redirect's `port` and `derivePort`). The types keep each member as its own `Option`;
/// semantic validation reports a group with more than one member set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OneofGroup {
    /// The proto name of the oneof (e.g. `redirect_port`).
    pub name: &'static str,
    /// The JSON names of the members that are set, in declaration order.
    pub set: Vec<&'static str>,
}

impl OneofGroup {
    /// Collects the set members from `(json name, is set)` pairs.
    pub(crate) fn of(name: &'static str, members: &[(&'static str, bool)]) -> Self {
        OneofGroup {
            name,
            set: members
                .iter()
                .filter(|(_, set)| *set)
                .map(|(m, _)| *m)
                .collect(),
        }
    }

    /// True when more than one member is set, which Istio rejects.
    pub fn is_conflicting(&self) -> bool {
        self.set.len() > 1
    }
}

/// Messages that carry sibling-field oneofs report which members are set.
pub trait Oneofs {
    /// Every oneof group of this message (not of nested messages).
    fn oneof_groups(&self) -> Vec<OneofGroup>;

    /// The groups with more than one member set.
    fn conflicting_oneofs(&self) -> Vec<OneofGroup> {
        self.oneof_groups()
            .into_iter()
            .filter(OneofGroup::is_conflicting)
            .collect()
    }
}

/// Declares the sibling-field oneofs of one message, once, and derives both places that
/// need them from that declaration: the schema transform named after `transform =` (Istio's
/// structural "at most one of" constraint per group, for `#[schemars(transform = …)]` on
/// the message) and the message's [`Oneofs`] impl (which members are set, for validation).
///
/// Each group is its proto oneof name and its members, as `field: "jsonName"` (the Rust
/// field, an `Option`, and its serde name), in proto order:
///
/// ```text
/// sibling_oneofs!(HttpRedirect, transform = redirect_port_oneof, {
///     "redirect_port": [port: "port", derive_port: "derivePort"],
/// });
/// ```
macro_rules! sibling_oneofs {
    (
        $message:ty, transform = $transform:ident, {
            $( $group:literal : [ $( $field:ident : $json:literal ),+ $(,)? ] ),+ $(,)?
        }
    ) => {
        fn $transform(schema: &mut ::schemars::Schema) {
            $( $crate::api::common::at_most_one_of(schema, &[ $( $json ),+ ]); )+
        }

        impl $crate::api::common::Oneofs for $message {
            fn oneof_groups(&self) -> Vec<$crate::api::common::OneofGroup> {
                vec![ $(
                    $crate::api::common::OneofGroup::of(
                        $group,
                        &[ $( ($json, self.$field.is_some()) ),+ ],
                    )
                ),+ ]
            }
        }
    };
}
pub(crate) use sibling_oneofs;

/// Istio's `StringMatch`: a string compared exactly, by prefix, or by an RE2 regex.
///
/// JSON: `{"exact": "v"}`, `{"prefix": "v"}`, `{"regex": "v"}`. Istio also accepts the empty
/// object `{}` (no match type set); in `headers`, `withoutHeaders` and `queryParams` it means
/// "present, with any value", so it is kept as [`StringMatch::Any`]. Setting two match types
/// at once is a parse error.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StringMatch {
    /// `exact`: the whole value equals the string.
    Exact(String),
    /// `prefix`: the value starts with the string.
    Prefix(String),
    /// `regex`: the value matches the RE2 regular expression (anchored, as in Envoy).
    Regex(String),
    /// `{}`: no match type; a header or query parameter with this matcher only has to exist.
    Any,
}

/// The wire form of [`StringMatch`]: a struct, so that unknown keys are seen by the strict
/// parser and the "only one of" rule gets a clear message.
#[derive(Serialize, Deserialize, Default)]
struct StringMatchWire {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    regex: Option<String>,
}

impl StringMatch {
    /// The matched string, or `None` for [`StringMatch::Any`].
    pub fn value(&self) -> Option<&str> {
        match self {
            StringMatch::Exact(s) | StringMatch::Prefix(s) | StringMatch::Regex(s) => Some(s),
            StringMatch::Any => None,
        }
    }
}

impl Serialize for StringMatch {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut wire = StringMatchWire::default();
        match self {
            StringMatch::Exact(s) => wire.exact = Some(s.clone()),
            StringMatch::Prefix(s) => wire.prefix = Some(s.clone()),
            StringMatch::Regex(s) => wire.regex = Some(s.clone()),
            StringMatch::Any => {}
        }
        wire.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for StringMatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let wire = StringMatchWire::deserialize(deserializer)?;
        match (wire.exact, wire.prefix, wire.regex) {
            (Some(s), None, None) => Ok(StringMatch::Exact(s)),
            (None, Some(s), None) => Ok(StringMatch::Prefix(s)),
            (None, None, Some(s)) => Ok(StringMatch::Regex(s)),
            (None, None, None) => Ok(StringMatch::Any),
            _ => Err(serde::de::Error::custom(
                "a string match sets only one of `exact`, `prefix` or `regex`",
            )),
        }
    }
}

impl JsonSchema for StringMatch {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "StringMatch".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let mut schema = json_schema!({
            "type": "object",
            "description": "Describes how to match a given string: exact, prefix or regex (RE2).",
            "properties": {
                "exact": { "type": "string" },
                "prefix": { "type": "string" },
                "regex": { "type": "string", "description": "RE2 style regex-based match." }
            }
        });
        at_most_one_of(&mut schema, &["exact", "prefix", "regex"]);
        schema
    }
}

/// Istio's `PortSelector`: a port on the destination service.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct PortSelector {
    /// Valid port number.
    #[serde(default)]
    pub number: u32,
}

/// Istio's `Percent`: a percentage in the range 0.0–100.0.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Percent {
    /// The percentage (a double, so fractions such as 0.1 are allowed).
    #[serde(default)]
    pub value: f64,
}

/// Istio's `Destination`: a service (and optionally a subset and port) that traffic goes to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    /// The name of a service from the service registry (short names resolve in the rule's namespace).
    pub host: String,
    /// The name of a subset within the service, defined in a DestinationRule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    /// The port on the host; required only when the service exposes several ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
}

/// Labels as Istio writes them (`sourceLabels`, subset `labels`, …): an ordered map so that
/// serialization is deterministic.
pub type Labels = BTreeMap<String, String>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn string_match_reads_and_writes_each_member() {
        for (input, expected) in [
            (json!({"exact": "a"}), StringMatch::Exact("a".into())),
            (json!({"prefix": "/p"}), StringMatch::Prefix("/p".into())),
            (json!({"regex": "^x.*"}), StringMatch::Regex("^x.*".into())),
            (json!({}), StringMatch::Any),
        ] {
            let parsed: StringMatch = serde_json::from_value(input.clone()).unwrap();
            assert_eq!(parsed, expected);
            assert_eq!(serde_json::to_value(&parsed).unwrap(), input);
        }
        assert_eq!(StringMatch::Prefix("/p".into()).value(), Some("/p"));
        assert_eq!(StringMatch::Any.value(), None);
    }

    #[test]
    fn string_match_with_two_members_is_an_error() {
        let err = serde_json::from_value::<StringMatch>(json!({"exact": "a", "prefix": "b"}))
            .unwrap_err();
        assert!(err.to_string().contains("only one of"), "{err}");
        let err = serde_json::from_value::<StringMatch>(json!("a")).unwrap_err();
        assert!(err.to_string().contains("invalid type"), "{err}");
    }

    #[test]
    fn at_most_one_of_combines_two_groups_with_all_of() {
        let mut schema = json_schema!({"type": "object"});
        at_most_one_of(&mut schema, &["a", "b"]);
        assert_eq!(schema.get("oneOf").unwrap().as_array().unwrap().len(), 3);
        at_most_one_of(&mut schema, &["c", "d", "e"]);
        let all_of = schema.get("allOf").unwrap().as_array().unwrap();
        assert_eq!(all_of.len(), 2);
        assert_eq!(all_of[1]["oneOf"].as_array().unwrap().len(), 4);
        assert!(schema.get("oneOf").is_none());
    }

    #[test]
    fn oneof_group_reports_conflicts() {
        let group = OneofGroup::of("k", &[("a", true), ("b", false), ("c", true)]);
        assert_eq!(group.set, vec!["a", "c"]);
        assert!(group.is_conflicting());
        assert!(!OneofGroup::of("k", &[("a", true), ("b", false)]).is_conflicting());
    }
}
