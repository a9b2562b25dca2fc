//! Structural OpenAPI v3 schemas of custom resources: pruning of unknown fields
//! (honouring `x-kubernetes-preserve-unknown-fields`), `default`s, and validation
//! (types, `nullable`, `x-kubernetes-int-or-string`, `required`, `enum`, bounds,
//! `pattern`, and the value-only `allOf`/`anyOf`/`oneOf`/`not` branches), producing causes
//! worded like the real server's. Also defines [`ListStrategy`] (how a list merges) and
//! answers which one a field has.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use regex::Regex;
use serde_json::{Map, Value};

use super::error::Cause;

/// What pruning and validation found.
#[derive(Debug, Default)]
pub struct Checked {
    /// Field paths that the schema does not declare (already removed from the object).
    pub unknown_fields: Vec<String>,
    /// Validation failures; non-empty means 422.
    pub causes: Vec<Cause>,
}

/// Prunes, defaults and validates a whole custom resource against its version schema.
/// `apiVersion`, `kind` and `metadata` are the server's business, not the schema's.
pub fn check_object(schema: &Value, object: &mut Value) -> Checked {
    let mut checked = Checked::default();
    if let Value::Object(fields) = object {
        for (key, value) in fields.iter_mut() {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            match property(schema, key) {
                Some(child) => prune_and_default(child, value, key, &mut checked.unknown_fields),
                None if preserves_unknown(schema) => {}
                None => checked.unknown_fields.push(key.clone()),
            }
        }
        fields.retain(|key, value| {
            matches!(key.as_str(), "apiVersion" | "kind" | "metadata")
                || (property(schema, key).is_some() || preserves_unknown(schema))
                    && !(value.is_null()
                        && property(schema, key).is_some_and(|child| !nullable(child)))
        });
        apply_defaults(schema, fields);
        for (key, value) in fields.iter() {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Some(child) = property(schema, key) {
                validate(child, value, key, &mut checked.causes);
            }
        }
        check_required(schema, fields, "", &mut checked.causes);
    }
    checked
}

/// Removes from `object` every field that `known` (the object after a typed decode and
/// re-encode) lacks, and returns their paths. Nulls are not fields: typed encoders omit
/// them, and so does the real server.
pub fn prune_unknown(object: &mut Value, known: &Value) -> Vec<String> {
    let mut unknown = Vec::new();
    prune_against(object, known, "", &mut unknown);
    unknown.sort();
    unknown
}

fn prune_against(object: &mut Value, known: &Value, path: &str, unknown: &mut Vec<String>) {
    match (object, known) {
        (Value::Object(fields), Value::Object(known_fields)) => {
            fields.retain(|key, value| {
                if value.is_null() || known_fields.contains_key(key) {
                    true
                } else {
                    unknown.push(join(path, key));
                    false
                }
            });
            for (key, value) in fields.iter_mut() {
                if let Some(known_value) = known_fields.get(key) {
                    prune_against(value, known_value, &join(path, key), unknown);
                }
            }
        }
        (Value::Array(items), Value::Array(known_items)) if items.len() == known_items.len() => {
            for (i, (item, known_item)) in items.iter_mut().zip(known_items).enumerate() {
                prune_against(item, known_item, &format!("{path}[{i}]"), unknown);
            }
        }
        _ => {}
    }
}

fn property<'a>(schema: &'a Value, key: &str) -> Option<&'a Value> {
    schema.get("properties").and_then(|p| p.get(key))
}

fn flag(schema: &Value, name: &str) -> bool {
    schema.get(name).and_then(Value::as_bool) == Some(true)
}

fn preserves_unknown(schema: &Value) -> bool {
    flag(schema, "x-kubernetes-preserve-unknown-fields")
}

fn nullable(schema: &Value) -> bool {
    flag(schema, "nullable")
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn apply_defaults(schema: &Value, fields: &mut Map<String, Value>) {
    if let Some(Value::Object(props)) = schema.get("properties") {
        for (key, child) in props {
            if let Some(default) = child.get("default")
                && !fields.contains_key(key)
            {
                fields.insert(key.clone(), default.clone());
            }
        }
    }
}

/// Removes what the schema does not declare and fills defaults, depth first.
fn prune_and_default(schema: &Value, value: &mut Value, path: &str, unknown: &mut Vec<String>) {
    if flag(schema, "x-kubernetes-int-or-string") {
        return;
    }
    match value {
        Value::Object(fields) => {
            let additional = schema.get("additionalProperties");
            let embedded = flag(schema, "x-kubernetes-embedded-resource");
            let mut remove = Vec::new();
            for (key, child_value) in fields.iter_mut() {
                let child_schema =
                    property(schema, key).or_else(|| additional.filter(|a| a.is_object()));
                match child_schema {
                    Some(child) => {
                        if child_value.is_null() && !nullable(child) {
                            remove.push(key.clone());
                        } else {
                            prune_and_default(child, child_value, &join(path, key), unknown);
                        }
                    }
                    None if additional == Some(&Value::Bool(true)) || preserves_unknown(schema) => {
                    }
                    None if embedded
                        && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") => {}
                    None => {
                        unknown.push(join(path, key));
                        remove.push(key.clone());
                    }
                }
            }
            for key in remove {
                fields.remove(&key);
            }
            apply_defaults(schema, fields);
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                for (i, item) in items.iter_mut().enumerate() {
                    prune_and_default(item_schema, item, &format!("{path}[{i}]"), unknown);
                }
            }
        }
        _ => {}
    }
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match (expected, value) {
        ("integer", Value::Number(n)) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        ("number", Value::Number(_)) => true,
        (expected, value) => expected == type_name(value),
    }
}

/// How the real server quotes a value inside `Invalid value: ...`.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => format!("\"{}\"", type_name(other)),
    }
}

fn invalid(path: &str, value: &Value, detail: String) -> Cause {
    Cause::new(
        "FieldValueInvalid",
        path,
        format!("Invalid value: {}: {detail}", shown(value)),
    )
}

fn check_required(
    schema: &Value,
    fields: &Map<String, Value>,
    path: &str,
    causes: &mut Vec<Cause>,
) {
    if let Some(Value::Array(required)) = schema.get("required") {
        for key in required.iter().filter_map(Value::as_str) {
            if !fields.contains_key(key) {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    join(path, key),
                    "Required value",
                ));
            }
        }
    }
}

fn number(schema: &Value, name: &str) -> Option<f64> {
    schema.get(name).and_then(Value::as_f64)
}

/// Validates `value` (already pruned) against `schema`, appending causes.
pub fn validate(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    if value.is_null() {
        if !nullable(schema) && schema.get("type").is_some() {
            causes.push(Cause::new(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    let int_or_string = flag(schema, "x-kubernetes-int-or-string");
    if int_or_string {
        if !matches!(type_name(value), "integer" | "string") {
            causes.push(Cause::new(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: \"{t}\": {path} in body must be of type integer,string: \"{t}\"",
                    t = type_name(value)
                ),
            ));
            return;
        }
    } else if let Some(expected) = schema.get("type").and_then(Value::as_str)
        && !type_matches(expected, value)
    {
        let actual = type_name(value);
        causes.push(Cause::new(
            "FieldValueTypeInvalid",
            path,
            format!("Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""),
        ));
        return;
    }
    validate_value(schema, value, path, causes);
    validate_junctors(schema, value, path, causes, int_or_string);
    match value {
        Value::Object(fields) => {
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, child_value) in fields {
                if let Some(child) = property(schema, key).or(additional) {
                    validate(child, child_value, &join(path, key), causes);
                }
            }
            check_required(schema, fields, path, causes);
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items").filter(|i| i.is_object()) {
                for (i, item) in items.iter().enumerate() {
                    validate(item_schema, item, &format!("{path}[{i}]"), causes);
                }
            }
            check_list_uniqueness(schema, items, path, causes);
        }
        _ => {}
    }
}

/// `enum`, bounds, lengths, `pattern`: the validations that do not descend.
fn validate_value(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    if let Some(Value::Array(allowed)) = schema.get("enum")
        && !allowed.contains(value)
    {
        let listed: Vec<String> = allowed.iter().map(shown).collect();
        causes.push(Cause::new(
            "FieldValueNotSupported",
            path,
            format!(
                "Unsupported value: {}: supported values: {}",
                shown(value),
                listed.join(", ")
            ),
        ));
    }
    match value {
        Value::Number(n) => {
            let Some(x) = n.as_f64() else { return };
            let exclusive_max = flag(schema, "exclusiveMaximum");
            let exclusive_min = flag(schema, "exclusiveMinimum");
            if let Some(max) = number(schema, "maximum")
                && (x > max || exclusive_max && x == max)
            {
                let relation = if exclusive_max {
                    "less than"
                } else {
                    "less than or equal to"
                };
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should be {relation} {max}"),
                ));
            }
            if let Some(min) = number(schema, "minimum")
                && (x < min || exclusive_min && x == min)
            {
                let relation = if exclusive_min {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should be {relation} {min}"),
                ));
            }
            if let Some(step) = number(schema, "multipleOf")
                && step > 0.0
                && (x / step).fract() != 0.0
            {
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should be a multiple of {step}"),
                ));
            }
        }
        Value::String(s) => {
            let length = s.chars().count() as f64;
            if let Some(max) = number(schema, "maxLength")
                && length > max
            {
                causes.push(Cause::new(
                    "FieldValueTooLong",
                    path,
                    format!("Too long: may not be more than {max} bytes"),
                ));
            }
            if let Some(min) = number(schema, "minLength")
                && length < min
            {
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should be at least {min} chars long"),
                ));
            }
            if let Some(pattern) = schema.get("pattern").and_then(Value::as_str) {
                match pattern_matches(pattern, s) {
                    Some(false) => {
                        causes.push(invalid(
                            path,
                            value,
                            format!("{path} in body should match '{pattern}'"),
                        ));
                    }
                    Some(true) => {}
                    None => causes.push(invalid(
                        path,
                        value,
                        format!("{path} has a schema pattern '{pattern}' that cannot be compiled"),
                    )),
                }
            }
        }
        Value::Array(items) => {
            let count = items.len() as f64;
            if let Some(max) = number(schema, "maxItems")
                && count > max
            {
                causes.push(Cause::new(
                    "FieldValueTooMany",
                    path,
                    format!("Too many: {}: must have at most {max} items", items.len()),
                ));
            }
            if let Some(min) = number(schema, "minItems")
                && count < min
            {
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should have at least {min} items"),
                ));
            }
        }
        Value::Object(fields) => {
            let count = fields.len() as f64;
            if let Some(max) = number(schema, "maxProperties")
                && count > max
            {
                causes.push(Cause::new(
                    "FieldValueTooMany",
                    path,
                    format!("Too many: {}: must have at most {max} items", fields.len()),
                ));
            }
            if let Some(min) = number(schema, "minProperties")
                && count < min
            {
                causes.push(invalid(
                    path,
                    value,
                    format!("{path} in body should have at least {min} properties"),
                ));
            }
        }
        _ => {}
    }
}

/// Whether `text` matches `pattern` (`None`: the pattern does not compile). Compiled
/// patterns are cached: a CRD's patterns are checked on every write of every object.
fn pattern_matches(pattern: &str, text: &str) -> Option<bool> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<Regex>>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let compiled = cache
        .entry(pattern.to_string())
        .or_insert_with(|| Regex::new(pattern).ok());
    compiled.as_ref().map(|re| re.is_match(text))
}

/// Duplicate entries in `set` and `map` lists are rejected, as upstream does.
fn check_list_uniqueness(schema: &Value, items: &[Value], path: &str, causes: &mut Vec<Cause>) {
    let keys_of = |item: &Value| -> Option<Value> {
        match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => Some(item.clone()),
            Some("map") => {
                let keys = schema.get("x-kubernetes-list-map-keys")?.as_array()?;
                Some(Value::Array(
                    keys.iter()
                        .map(|k| {
                            k.as_str()
                                .and_then(|k| item.get(k))
                                .cloned()
                                .unwrap_or(Value::Null)
                        })
                        .collect(),
                ))
            }
            _ => None,
        }
    };
    let mut seen = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let Some(key) = keys_of(item) else { return };
        if seen.contains(&key) {
            causes.push(Cause::new(
                "FieldValueDuplicate",
                format!("{path}[{i}]"),
                format!(
                    "Duplicate value: {}",
                    serde_json::to_string(&key).unwrap_or_default()
                ),
            ));
        } else {
            seen.push(key);
        }
    }
}

/// `allOf`/`anyOf`/`oneOf`/`not`: structural schemas allow only value validations in
/// them, so each branch is checked in full against the value, without pruning.
fn validate_junctors(
    schema: &Value,
    value: &Value,
    path: &str,
    causes: &mut Vec<Cause>,
    int_or_string: bool,
) {
    let branch_ok = |branch: &Value| {
        let mut found = Vec::new();
        validate(branch, value, path, &mut found);
        found.is_empty()
    };
    let branches = |name: &str| {
        schema
            .get(name)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    for branch in branches("allOf") {
        validate(&branch, value, path, causes);
    }
    let any_of = branches("anyOf");
    // The int-or-string idiom `anyOf: [{type: integer}, {type: string}]` is already
    // satisfied by the type check above.
    if !any_of.is_empty() && !int_or_string && !any_of.iter().any(branch_ok) {
        causes.push(invalid(
            path,
            value,
            format!("{path} in body must validate at least one schema (anyOf)"),
        ));
    }
    let one_of = branches("oneOf");
    if !one_of.is_empty() {
        let passing = one_of.iter().filter(|b| branch_ok(b)).count();
        if passing != 1 {
            let detail = if passing == 0 {
                "Found none valid"
            } else {
                "Found more than one valid"
            };
            causes.push(invalid(
                path,
                value,
                format!("{path} in body must validate one and only one schema (oneOf). {detail}"),
            ));
        }
    }
    if let Some(not) = schema.get("not")
        && branch_ok(not)
    {
        causes.push(invalid(
            path,
            value,
            format!("{path} in body must not validate the schema (not)"),
        ));
    }
}

/// How a list field merges under strategic merge and server-side apply. Custom resources
/// declare it in their schema (`x-kubernetes-list-type`, read by [`list_strategy`]);
/// built-in kinds get it from the patch module's hand-kept table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListStrategy {
    /// Replaced whole.
    Atomic,
    /// Elements are objects identified by these keys (`ports` by `port`, …).
    Map(Vec<String>),
    /// Elements are scalars merged as a set (`finalizers`).
    Set,
}

/// The list strategy the schema declares at a field path (`x-kubernetes-list-type`).
pub fn list_strategy(schema: &Value, path: &[String]) -> ListStrategy {
    let mut current = schema;
    for segment in path {
        while let Some(items) = current
            .get("items")
            .filter(|_| current.get("type").and_then(Value::as_str) == Some("array"))
        {
            current = items;
        }
        let next = property(current, segment).or_else(|| {
            current
                .get("additionalProperties")
                .filter(|a| a.is_object())
        });
        match next {
            Some(next) => current = next,
            None => return ListStrategy::Atomic,
        }
    }
    match current
        .get("x-kubernetes-list-type")
        .and_then(Value::as_str)
    {
        Some("map") => {
            let keys = current
                .get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .map(|keys| {
                    keys.iter()
                        .filter_map(|k| k.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            ListStrategy::Map(keys)
        }
        Some("set") => ListStrategy::Set,
        _ => ListStrategy::Atomic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn widget_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["hosts"],
                    "properties": {
                        "hosts": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                        "mode": {"type": "string", "enum": ["A", "B"], "default": "A"},
                        "replicas": {"type": "integer", "minimum": 0, "maximum": 10},
                        "port": {"x-kubernetes-int-or-string": true,
                                 "anyOf": [{"type": "integer"}, {"type": "string"}]},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "note": {"type": "string", "nullable": true},
                        "match": {
                            "type": "object",
                            "properties": {"exact": {"type": "string"}, "prefix": {"type": "string"}},
                            "oneOf": [{"required": ["exact"]}, {"required": ["prefix"]}]
                        },
                        "routes": {
                            "type": "array",
                            "x-kubernetes-list-type": "map",
                            "x-kubernetes-list-map-keys": ["name"],
                            "items": {"type": "object", "properties": {"name": {"type": "string"}}}
                        }
                    }
                },
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
            }
        })
    }

    fn check(object: Value) -> (Value, Checked) {
        let mut object = object;
        let checked = check_object(&widget_schema(), &mut object);
        (object, checked)
    }

    #[test]
    fn valid_object_is_defaulted_and_kept() {
        let (object, checked) = check(json!({
            "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"},
            "spec": {"hosts": ["a"], "port": "http", "labels": {"x": "y"},
                     "extra": {"anything": [1, 2]}, "note": null, "match": {"exact": "/"}}
        }));
        assert!(checked.causes.is_empty(), "{:?}", checked.causes);
        assert!(checked.unknown_fields.is_empty());
        assert_eq!(object["spec"]["mode"], "A");
        assert_eq!(object["spec"]["extra"]["anything"], json!([1, 2]));
        assert!(object["spec"]["note"].is_null());
    }

    #[test]
    fn unknown_fields_are_pruned_and_reported() {
        let (object, checked) = check(json!({
            "metadata": {"name": "w"}, "bogus": 1,
            "spec": {"hosts": ["a"], "typo": true, "match": {"exact": "/", "regex": "x"}}
        }));
        assert_eq!(
            checked.unknown_fields,
            vec!["bogus", "spec.match.regex", "spec.typo"]
        );
        assert!(object.get("bogus").is_none());
        assert!(object["spec"].get("typo").is_none());
        assert!(checked.causes.is_empty());
    }

    #[test]
    fn violations_are_named_by_field() {
        let (_, checked) = check(json!({
            "spec": {"replicas": "three", "mode": "C", "hosts": [], "port": 1.5,
                     "match": {"exact": "/", "prefix": "/a"}}
        }));
        let rendered: Vec<String> = checked.causes.iter().map(Cause::render).collect();
        assert!(rendered.contains(&"spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"".to_string()), "{rendered:?}");
        assert!(
            rendered.contains(
                &"spec.mode: Unsupported value: \"C\": supported values: \"A\", \"B\"".to_string()
            ),
            "{rendered:?}"
        );
        assert!(
            rendered
                .iter()
                .any(|r| r.starts_with("spec.hosts: Invalid value")
                    && r.contains("at least 1 items")),
            "{rendered:?}"
        );
        assert!(
            rendered.iter().any(|r| r.starts_with("spec.port:")),
            "{rendered:?}"
        );
        assert!(
            rendered
                .iter()
                .any(|r| r.starts_with("spec.match:") && r.contains("oneOf")),
            "{rendered:?}"
        );
    }

    #[test]
    fn required_and_bounds() {
        let (_, checked) = check(json!({"spec": {"replicas": 11}}));
        let rendered: Vec<String> = checked.causes.iter().map(Cause::render).collect();
        assert!(
            rendered.contains(&"spec.hosts: Required value".to_string()),
            "{rendered:?}"
        );
        assert!(
            rendered
                .iter()
                .any(|r| r.contains("less than or equal to 10")),
            "{rendered:?}"
        );
    }

    #[test]
    fn null_for_non_nullable_field_is_pruned() {
        let (object, checked) = check(json!({"spec": {"hosts": ["a"], "replicas": null}}));
        assert!(checked.causes.is_empty(), "{:?}", checked.causes);
        assert!(object["spec"].get("replicas").is_none());
    }

    #[test]
    fn duplicate_map_keys_are_rejected() {
        let (_, checked) =
            check(json!({"spec": {"hosts": ["a"], "routes": [{"name": "x"}, {"name": "x"}]}}));
        assert_eq!(checked.causes.len(), 1, "{:?}", checked.causes);
        assert_eq!(checked.causes[0].field, "spec.routes[1]");
    }

    #[test]
    fn prune_unknown_compares_with_the_typed_round_trip() {
        let mut object = json!({"spec": {"ports": [{"port": 80, "targetport": 8080}], "typo": 1, "clusterIP": null}});
        let known = json!({"spec": {"ports": [{"port": 80}]}});
        let unknown = prune_unknown(&mut object, &known);
        assert_eq!(unknown, vec!["spec.ports[0].targetport", "spec.typo"]);
        assert_eq!(
            object,
            json!({"spec": {"ports": [{"port": 80}], "clusterIP": null}})
        );
    }

    #[test]
    fn patterns_and_lengths() {
        let schema = json!({"type": "string", "pattern": "^[a-z]+$", "maxLength": 5});
        let mut causes = Vec::new();
        validate(&schema, &json!("abc"), "spec.name", &mut causes);
        assert!(causes.is_empty(), "{causes:?}");
        validate(&schema, &json!("ABCDEFG"), "spec.name", &mut causes);
        let rendered: Vec<String> = causes.iter().map(Cause::render).collect();
        assert_eq!(
            rendered,
            vec![
                "spec.name: Too long: may not be more than 5 bytes",
                "spec.name: Invalid value: \"ABCDEFG\": spec.name in body should match '^[a-z]+$'",
            ]
        );
    }

    #[test]
    fn list_strategy_follows_schema() {
        let schema = widget_schema();
        let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            list_strategy(&schema, &path(&["spec", "routes"])),
            ListStrategy::Map(vec!["name".to_string()])
        );
        assert_eq!(
            list_strategy(&schema, &path(&["spec", "hosts"])),
            ListStrategy::Atomic
        );
    }
}
