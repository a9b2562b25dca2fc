//! Validation of Istio configs exactly as Istio 1.30 judges them: the validation
//! webhook's rules (`pkg/config/validation` at the pinned release) plus the rules of
//! Istio's CRD schemas (CEL `x-kubernetes-validations`, sizes), which the API server
//! applies before the webhook. Each function is pure and judges one object alone, as
//! Istio does: references to other objects (subsets, hosts) are never a reason to reject
//! one — the builder reports those (`push_context::references`). Each returns the resolved
//! spec (hosts as FQDNs) when the object has no errors, plus every finding with its field
//! path. Errors and warnings are Istio's; the messages are ours.

pub(crate) mod authorization_policy;
mod common;
mod destination_rule;
mod names;
mod peer_authentication;
mod request_authentication;
mod service_entry;
pub(crate) mod sidecar;
mod virtual_service;

pub use authorization_policy::validate_authorization_policy;
pub use destination_rule::validate_destination_rule;
pub use peer_authentication::validate_peer_authentication;
pub use request_authentication::validate_request_authentication;
pub use service_entry::validate_service_entry;
pub use sidecar::{is_valid_cipher_suite, validate_sidecar};
pub use virtual_service::validate_virtual_service;

use crate::config::ConfigError;

/// The outcome of validating one object.
#[derive(Clone, Debug, PartialEq)]
pub struct Validated<T> {
    /// The resolved spec; `None` when there is at least one error.
    pub spec: Option<T>,
    pub findings: Vec<ConfigError>,
}

impl<T> Validated<T> {
    fn new(spec: T, findings: Vec<ConfigError>) -> Self {
        let ok = !findings.iter().any(ConfigError::is_error);
        Validated {
            spec: ok.then_some(spec),
            findings,
        }
    }
}
