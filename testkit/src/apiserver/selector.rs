//! Label selectors (`a=b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`) and field
//! selectors (`path=value`, `path!=value`) as the list and watch verbs take them.

use serde_json::Value;

use super::error::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelRequirement>);

/// Splits on commas that are not inside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_set(key: &str, rest: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{whole}', expected: '(' and ')' around the values of {key}"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let requirement = if let Some((k, v)) = part.split_once("!=") {
                LabelRequirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelRequirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelRequirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some(key) = part.strip_prefix('!') {
                LabelRequirement::NotExists(key.trim().into())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                LabelRequirement::NotIn(k.trim().into(), parse_set(k, rest, part)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                LabelRequirement::In(k.trim().into(), parse_set(k, rest, part)?)
            } else if part.contains(char::is_whitespace) || part.contains('(') {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: found '{part}', expected: in, notin, =, ==, !=, gt, lt"
                )));
            } else {
                LabelRequirement::Exists(part.into())
            };
            requirements.push(requirement);
        }
        Ok(LabelSelector(requirements))
    }

    /// Whether an object (its `metadata.labels`) satisfies every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = object.pointer("/metadata/labels");
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelRequirement::Equals(k, v) => label(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            LabelRequirement::In(k, set) => label(k).is_some_and(|l| set.iter().any(|v| v == l)),
            LabelRequirement::NotIn(k, set) => {
                !label(k).is_some_and(|l| set.iter().any(|v| v == l))
            }
            LabelRequirement::Exists(k) => label(k).is_some(),
            LabelRequirement::NotExists(k) => label(k).is_none(),
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
struct FieldRequirement {
    path: Vec<String>,
    value: String,
    negated: bool,
}

/// A parsed `fieldSelector`. Any dotted path into the served object is accepted (the
/// real server only allows a per-kind list); a missing field compares as `""`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<FieldRequirement>);

impl FieldSelector {
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (path, value, negated) = if let Some((k, v)) = part.split_once("!=") {
                (k, v, true)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, v, false)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{part}'"
                )));
            };
            requirements.push(FieldRequirement {
                path: path.trim().split('.').map(str::to_string).collect(),
                value: value.trim().to_string(),
                negated,
            });
        }
        Ok(FieldSelector(requirements))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|r| {
            let mut current = Some(object);
            for segment in &r.path {
                current = current.and_then(|v| v.get(segment));
            }
            let actual = match current {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (actual == r.value) != r.negated
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_selector_operators() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let matches = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(matches(""));
        assert!(matches("app=web"));
        assert!(matches("app==web,tier"));
        assert!(!matches("app!=web"));
        assert!(matches("app in (web, api),tier notin (back)"));
        assert!(!matches("app notin (web)"));
        assert!(matches("!owner"));
        assert!(!matches("!app"));
        assert!(!matches("missing"));
        assert!(matches("missing!=x"));
    }

    #[test]
    fn label_selector_rejects_garbage() {
        assert_eq!(LabelSelector::parse("app in web").unwrap_err().code, 400);
    }

    #[test]
    fn field_selector_paths() {
        let o = obj(json!({}));
        let matches = |s: &str| FieldSelector::parse(s).unwrap().matches(&o);
        assert!(matches("metadata.name=a,metadata.namespace==ns"));
        assert!(matches("status.phase!=Pending"));
        assert!(!matches("metadata.name=b"));
        assert!(matches("spec.nodeName="));
        assert_eq!(FieldSelector::parse("nonsense").unwrap_err().code, 400);
    }
}
