//! Identity of configuration objects and the errors reported about them.
//!
//! Every problem Pilotfish finds in user input is a [`ConfigError`] naming the object
//! (kind, namespace, name), the field path and the reason, so it can go verbatim to the
//! object's status, a Kubernetes Event, the log and a metric label.

use std::fmt;

/// Kinds of objects Pilotfish reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConfigKind {
    VirtualService,
    DestinationRule,
    ServiceEntry,
    PeerAuthentication,
    Sidecar,
    RequestAuthentication,
    AuthorizationPolicy,
    Service,
    EndpointSlice,
    Pod,
    MeshConfig,
}

impl ConfigKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKind::VirtualService => "VirtualService",
            ConfigKind::DestinationRule => "DestinationRule",
            ConfigKind::ServiceEntry => "ServiceEntry",
            ConfigKind::PeerAuthentication => "PeerAuthentication",
            ConfigKind::Sidecar => "Sidecar",
            ConfigKind::RequestAuthentication => "RequestAuthentication",
            ConfigKind::AuthorizationPolicy => "AuthorizationPolicy",
            ConfigKind::Service => "Service",
            ConfigKind::EndpointSlice => "EndpointSlice",
            ConfigKind::Pod => "Pod",
            ConfigKind::MeshConfig => "MeshConfig",
        }
    }

    /// Every kind, in declaration order.
    pub const ALL: [ConfigKind; 11] = [
        ConfigKind::VirtualService,
        ConfigKind::DestinationRule,
        ConfigKind::ServiceEntry,
        ConfigKind::PeerAuthentication,
        ConfigKind::Sidecar,
        ConfigKind::RequestAuthentication,
        ConfigKind::AuthorizationPolicy,
        ConfigKind::Service,
        ConfigKind::EndpointSlice,
        ConfigKind::Pod,
        ConfigKind::MeshConfig,
    ];

    pub fn from_name(kind: &str) -> Option<ConfigKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == kind)
    }
}

impl fmt::Display for ConfigKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `kind namespace/name` of one object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfigKey {
    pub kind: ConfigKind,
    pub namespace: String,
    pub name: String,
}

impl ConfigKey {
    pub fn new(kind: ConfigKind, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ConfigKey {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    /// The object is left out of the snapshot (its last accepted version, if any, stays).
    Error,
    /// The object is used; the finding is reported (Istio would only warn too).
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// One problem in one field of one object.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfigError {
    pub key: ConfigKey,
    pub severity: Severity,
    /// Field path in the object, e.g. `spec.http[0].route[1].weight`; empty when the
    /// problem concerns the object as a whole.
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub fn error(key: &ConfigKey, path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            key: key.clone(),
            severity: Severity::Error,
            path: path.into(),
            message: message.into(),
        }
    }

    pub fn warning(key: &ConfigKey, path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            severity: Severity::Warning,
            ..ConfigError::error(key, path, message)
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The field and reason without the object, for a status condition message.
    pub fn field_message(&self) -> String {
        if self.path.is_empty() {
            self.message.clone()
        } else {
            format!("{}: {}", self.path, self.message)
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.severity.as_str(),
            self.key,
            self.field_message()
        )
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_object_field_and_reason() {
        let key = ConfigKey::new(ConfigKind::VirtualService, "default", "reviews");
        let e = ConfigError::error(
            &key,
            "spec.http[0].route[1].weight",
            "must not be negative (got -10)",
        );
        assert_eq!(
            e.to_string(),
            "error VirtualService default/reviews: spec.http[0].route[1].weight: must not be negative (got -10)"
        );
        assert_eq!(
            ConfigKind::from_name("DestinationRule"),
            Some(ConfigKind::DestinationRule)
        );
    }
}
