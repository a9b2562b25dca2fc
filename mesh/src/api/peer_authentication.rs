//! `PeerAuthentication` (`security.istio.io`): whether a workload's sidecar accepts mutual
//! TLS, plaintext or both on its inbound ports — for the mesh (root namespace, no
//! selector), a namespace (no selector) or the workloads a selector picks, with per-port
//! overrides for the latter.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::destination_rule::TypeWorkloadSelector;
use super::status::IstioStatus;

/// The spec of a PeerAuthentication: the mutual TLS mode of the selected workloads.
///
/// Reference: https://istio.io/latest/docs/reference/config/security/peer_authentication/
// The doc comment is the CRD's description, so its URL stays bare (kubectl shows plain text).
#[allow(clippy::duplicated_attributes, rustdoc::bare_urls)]
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "security.istio.io",
    version = "v1",
    kind = "PeerAuthentication",
    namespaced,
    status = "IstioStatus",
    derive = "PartialEq",
    shortname = "pa",
    category = "istio-io",
    category = "security-istio-io",
    doc = "Peer authentication configuration for workloads. See more details at: https://istio.io/docs/reference/config/security/peer_authentication.html",
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.mtls.mode",
        description = "Defines the mTLS mode used for peer authentication."
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "Time since the object was created"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_rules)]
pub struct PeerAuthenticationSpec {
    /// The workloads (in the policy's namespace) the policy applies to; every workload of
    /// the namespace (of the mesh, in the root namespace) when absent or empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<TypeWorkloadSelector>,
    /// Mutual TLS settings of the workloads; inherited from the parent policy when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtls: Option<MutualTls>,
    /// Per-port mutual TLS settings, by the workload's port (not the Service's); only with
    /// a selector.
    // `None` when absent; `Some(empty)` is kept apart because Istio rejects it.
    #[serde(
        default,
        deserialize_with = "null_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(transform = port_level_rules)]
    pub port_level_mtls: Option<BTreeMap<u32, MutualTls>>,
}

/// `PeerAuthentication.MutualTLS`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MutualTls {
    /// The mode; `UNSET` (or absent) inherits from the parent policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MtlsMode>,
}

/// `PeerAuthentication.MutualTLS.Mode`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    /// Inherit from the parent policy; PERMISSIVE when there is none.
    Unset,
    /// Plaintext only.
    Disable,
    /// Plaintext or mutual TLS.
    Permissive,
    /// Mutual TLS only (the client must present a certificate).
    Strict,
}

impl MutualTls {
    /// The mode, `None` when it inherits (absent or `UNSET`).
    pub fn explicit_mode(&self) -> Option<MtlsMode> {
        self.mode.filter(|m| *m != MtlsMode::Unset)
    }
}

impl PeerAuthenticationSpec {
    /// Whether the policy selects workloads (a selector with at least one label); without
    /// one it is the namespace's (or, in the root namespace, the mesh's) policy.
    pub fn has_workload_selector(&self) -> bool {
        self.selector
            .as_ref()
            .is_some_and(|s| !s.match_labels.is_empty())
    }
}

/// `null` reads as absent (Go's JSON decoding does the same for maps).
fn null_as_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer)
}

/// Istio's CRD rule on the spec: `portLevelMtls` needs a selector with labels.
fn spec_rules(schema: &mut Schema) {
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "has(self.portLevelMtls) ? (((has(self.selector) && has(self.selector.matchLabels)) ? self.selector.matchLabels : {}).size() > 0) : true",
            "message": "portLevelMtls requires selector"
        }]),
    );
}

/// Istio's CRD rules on `portLevelMtls`: at least one entry, keys are ports 1..65535.
fn port_level_rules(schema: &mut Schema) {
    schema.insert("minProperties".into(), 1.into());
    // schemars describes integer keys as a `^\d+$` pattern; Kubernetes' structural schemas
    // know only `additionalProperties`, and the CEL rule checks the keys.
    if let Some(serde_json::Value::Object(patterns)) = schema.remove("patternProperties")
        && let Some((_, values)) = patterns.into_iter().next()
    {
        schema.insert("additionalProperties".into(), values);
    }
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "self.all(key, 0 < int(key) && int(key) <= 65535)",
            "message": "port must be between 1-65535"
        }]),
    );
}
