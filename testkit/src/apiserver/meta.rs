//! Object metadata validation as the real server does it for every kind: the name format
//! (DNS-1123 label for Namespaces, DNS-1035 label for Services, path segment for RBAC,
//! DNS-1123 subdomain otherwise), label keys and values, and the 256 KiB limit on
//! annotations (which big CRDs hit under client-side apply's last-applied annotation).

use std::sync::OnceLock;

use regex::Regex;
use serde_json::Value;

use super::error::Cause;
use super::registry::ResourceType;

const DNS1123_LABEL: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1035_LABEL: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const QUALIFIED_NAME: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const ANNOTATIONS_LIMIT: usize = 256 * 1024;

/// Whether all of `text` matches `pattern`. The patterns are constants that compile
/// (the unit tests prove it); were one not to, nothing would match.
fn full_match(pattern: &'static str, cell: &'static OnceLock<Option<Regex>>, text: &str) -> bool {
    cell.get_or_init(|| Regex::new(&format!("^(?:{pattern})$")).ok())
        .as_ref()
        .is_some_and(|re| re.is_match(text))
}

fn is_dns1123_label(text: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    text.len() <= 63 && full_match(DNS1123_LABEL, &RE, text)
}

fn is_dns1123_subdomain(text: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    text.len() <= 253 && full_match(DNS1123_SUBDOMAIN, &RE, text)
}

fn is_dns1035_label(text: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    text.len() <= 63 && full_match(DNS1035_LABEL, &RE, text)
}

fn is_qualified_name_part(text: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    text.len() <= 63 && full_match(QUALIFIED_NAME, &RE, text)
}

fn is_label_value(text: &str) -> bool {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    text.len() <= 63 && full_match(LABEL_VALUE, &RE, text)
}

fn name_problem(rt: &ResourceType, name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("Required value: name or generateName is required".to_string());
    }
    match (rt.group.as_str(), rt.kind.as_str()) {
        ("", "Namespace") if !is_dns1123_label(name) => Some(format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '{DNS1123_LABEL}')"
        )),
        ("", "Service") if !is_dns1035_label(name) => Some(format!(
            "Invalid value: \"{name}\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '{DNS1035_LABEL}')"
        )),
        ("", "Namespace" | "Service") => None,
        ("rbac.authorization.k8s.io", _) => {
            if name == "." || name == ".." || name.contains('/') || name.contains('%') {
                Some(format!(
                    "Invalid value: \"{name}\": may not contain '/' or '%' or be '.' or '..'"
                ))
            } else {
                None
            }
        }
        _ if !is_dns1123_subdomain(name) => Some(format!(
            "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '{DNS1123_SUBDOMAIN}')"
        )),
        _ => None,
    }
}

/// Why a label key is invalid, if it is (`prefix/name` with a DNS subdomain prefix).
fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns1123_subdomain(prefix)
    {
        return Some(format!(
            "Invalid value: \"{key}\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        ));
    }
    if !is_qualified_name_part(name) {
        return Some(format!(
            "Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '{QUALIFIED_NAME}')"
        ));
    }
    None
}

/// Metadata problems of `object` written through `rt` (empty when valid).
pub fn validate(rt: &ResourceType, object: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let metadata = object.get("metadata");
    let name = metadata
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(problem) = name_problem(rt, name) {
        let reason = if name.is_empty() {
            "FieldValueRequired"
        } else {
            "FieldValueInvalid"
        };
        causes.push(Cause::new(reason, "metadata.name", problem));
    }
    if let Some(Value::Object(labels)) = metadata.and_then(|m| m.get("labels")) {
        for (key, value) in labels {
            if let Some(problem) = label_key_problem(key) {
                causes.push(Cause::new("FieldValueInvalid", "metadata.labels", problem));
            }
            let text = value.as_str().unwrap_or("");
            if !is_label_value(text) {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    format!("metadata.labels.{key}"),
                    format!(
                        "Invalid value: \"{text}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '{LABEL_VALUE}')"
                    ),
                ));
            }
        }
    }
    if let Some(Value::Object(annotations)) = metadata.and_then(|m| m.get("annotations")) {
        let size: usize = annotations
            .iter()
            .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
            .sum();
        if size > ANNOTATIONS_LIMIT {
            causes.push(Cause::new(
                "FieldValueTooLong",
                "metadata.annotations",
                format!("Too long: may not be more than {ANNOTATIONS_LIMIT} bytes"),
            ));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;
    use serde_json::json;

    fn check(group: &str, plural: &str, object: Value) -> Vec<String> {
        let registry = Registry::default();
        let rt = registry.lookup(group, "v1", plural).unwrap();
        validate(&rt, &object).iter().map(Cause::render).collect()
    }

    #[test]
    fn names_follow_each_kinds_rule() {
        assert!(check("", "configmaps", json!({"metadata": {"name": "a.b-c"}})).is_empty());
        assert!(
            check("", "configmaps", json!({"metadata": {"name": "Upper"}}))[0]
                .contains("RFC 1123 subdomain")
        );
        assert!(
            check("", "namespaces", json!({"metadata": {"name": "a.b"}}))[0]
                .contains("RFC 1123 label")
        );
        assert!(
            check("", "services", json!({"metadata": {"name": "1abc"}}))[0].contains("DNS-1035")
        );
        assert!(
            check(
                "rbac.authorization.k8s.io",
                "clusterroles",
                json!({"metadata": {"name": "system:view"}})
            )
            .is_empty()
        );
        assert_eq!(
            check("", "configmaps", json!({"metadata": {}})),
            vec!["metadata.name: Required value: name or generateName is required"]
        );
    }

    #[test]
    fn labels_and_annotations() {
        let ok = json!({"metadata": {"name": "a", "labels": {"app.kubernetes.io/name": "web", "empty": ""}}});
        assert!(check("", "configmaps", ok).is_empty());
        let bad = json!({"metadata": {"name": "a", "labels": {"bad key": "x", "k": "has space"}}});
        let problems = check("", "configmaps", bad);
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[1].starts_with("metadata.labels.k: Invalid value: \"has space\""));
        let huge = "x".repeat(ANNOTATIONS_LIMIT + 1);
        let problems = check(
            "",
            "configmaps",
            json!({"metadata": {"name": "a", "annotations": {"k": huge}}}),
        );
        assert_eq!(
            problems,
            vec!["metadata.annotations: Too long: may not be more than 262144 bytes"]
        );
    }
}
