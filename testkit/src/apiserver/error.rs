//! `ApiError`: every way a request can fail, rendered as the `Status` object a real
//! kube-apiserver returns (same `code`, `reason`, message wording and `details`), because
//! kubectl prints the `message` and kube-rs matches on `code`/`reason`.

use serde_json::{Value, json};

/// One field-level cause of a 422 `Invalid` (or of an apply conflict), as in
/// `Status.details.causes`.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, ...
    pub reason: &'static str,
    /// Message without the field prefix, e.g. `Required value`.
    pub message: String,
    /// Dotted field path, e.g. `spec.hosts[0]`.
    pub field: String,
}

impl Cause {
    pub fn new(reason: &'static str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause {
            reason,
            message: message.into(),
            field: field.into(),
        }
    }

    /// `field: message`, the form the real server joins into the top-level message.
    pub fn render(&self) -> String {
        if self.field.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.field, self.message)
        }
    }
}

/// A failed request: HTTP code plus the `Status` body the real server would send.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// What an error is about, for the `details` block (`name`, `group`, `kind`).
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    pub group: &'a str,
    /// Resource plural for NotFound/AlreadyExists/Conflict, Kind for Invalid (as upstream).
    pub kind: &'a str,
    pub name: &'a str,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_subject(mut self, subject: Subject<'_>) -> Self {
        let mut details = json!({ "name": subject.name, "kind": subject.kind });
        if !subject.group.is_empty() {
            details["group"] = json!(subject.group);
        }
        self.details = Some(details);
        self
    }

    /// `group` qualified resource name as upstream prints it: `deployments.apps`.
    fn qualified(group: &str, plural: &str) -> String {
        if group.is_empty() {
            plural.to_string()
        } else {
            format!("{plural}.{group}")
        }
    }

    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", Self::qualified(group, plural));
        Self::new(404, "NotFound", message).with_subject(Subject {
            group,
            kind: plural,
            name,
        })
    }

    /// The path names no resource this server serves.
    pub fn no_such_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let message = format!(
            "{} \"{name}\" already exists",
            Self::qualified(group, plural)
        );
        Self::new(409, "AlreadyExists", message).with_subject(Subject {
            group,
            kind: plural,
            name,
        })
    }

    /// Optimistic-concurrency failure (stale `resourceVersion` or failed precondition).
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            Self::qualified(group, plural)
        );
        Self::new(409, "Conflict", message).with_subject(Subject {
            group,
            kind: plural,
            name,
        })
    }

    /// Server-side apply found fields owned by other managers (and `force` was false).
    pub fn apply_conflict(group: &str, plural: &str, name: &str, conflicts: &[Cause]) -> Self {
        let listed: Vec<String> = conflicts
            .iter()
            .map(|c| format!("{}: {}", c.message, c.field))
            .collect();
        let message = format!(
            "Apply failed with {} conflict{}: {}",
            conflicts.len(),
            if conflicts.len() == 1 { "" } else { "s" },
            listed.join("\n")
        );
        let mut error = Self::new(409, "Conflict", message).with_subject(Subject {
            group,
            kind: plural,
            name,
        });
        error.set_causes(conflicts);
        error
    }

    /// 422 with field causes; `kind` is the Kind (e.g. `VirtualService`).
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Self {
        let rendered: Vec<String> = causes.iter().map(Cause::render).collect();
        let joined = if rendered.len() == 1 {
            rendered[0].clone()
        } else {
            format!("[{}]", rendered.join(", "))
        };
        let message = format!(
            "{} \"{name}\" is invalid: {joined}",
            Self::qualified(group, kind)
        );
        let mut error =
            Self::new(422, "Invalid", message).with_subject(Subject { group, kind, name });
        error.set_causes(&causes);
        error
    }

    fn set_causes(&mut self, causes: &[Cause]) {
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({ "reason": c.reason, "message": c.message, "field": c.field }))
            .collect();
        if let Some(details) = self.details.as_mut() {
            details["causes"] = Value::Array(causes);
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }

    /// 410: a `resourceVersion` or `continue` token older than the retained history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn forbidden(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let message = format!(
            "{} \"{name}\" is forbidden: {why}",
            Self::qualified(group, plural)
        );
        Self::new(403, "Forbidden", message).with_subject(Subject {
            group,
            kind: plural,
            name,
        })
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// The `Status` object for the response body (or a watch `ERROR` event).
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_matches_upstream_wording() {
        let status = ApiError::not_found("apps", "deployments", "web").to_status();
        assert_eq!(status["message"], "deployments.apps \"web\" not found");
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["code"], 404);
        assert_eq!(status["details"]["group"], "apps");
        assert_eq!(status["details"]["kind"], "deployments");
    }

    #[test]
    fn invalid_joins_several_causes_in_brackets() {
        let causes = vec![
            Cause::new("FieldValueRequired", "spec.hosts", "Required value"),
            Cause::new(
                "FieldValueInvalid",
                "spec.port",
                "Invalid value: \"string\": bad",
            ),
        ];
        let status = ApiError::invalid("example.com", "Widget", "w", causes).to_status();
        assert_eq!(
            status["message"],
            "Widget.example.com \"w\" is invalid: [spec.hosts: Required value, spec.port: Invalid value: \"string\": bad]"
        );
        assert_eq!(status["details"]["causes"][1]["field"], "spec.port");
        assert_eq!(status["code"], 422);
    }
}
