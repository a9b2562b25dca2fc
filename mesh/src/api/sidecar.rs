//! `Sidecar` (`networking.istio.io`): what a workload's sidecar (or proxyless client)
//! reaches and accepts — the hosts it imports per egress listener, its ingress listeners,
//! its outbound traffic policy — for the workloads a selector picks, a whole namespace (no
//! selector) or, in the root namespace, the mesh.

use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::common::{Destination, Labels, null_as_default};
use super::destination_rule::ConnectionPoolSettings;
use super::status::IstioStatus;

/// The spec of a Sidecar.
///
/// Reference: https://istio.io/latest/docs/reference/config/networking/sidecar/
// The doc comment is the CRD's description, so its URL stays bare (kubectl shows plain text).
#[allow(clippy::duplicated_attributes, rustdoc::bare_urls)]
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "networking.istio.io",
    version = "v1",
    kind = "Sidecar",
    namespaced,
    status = "IstioStatus",
    derive = "PartialEq",
    category = "istio-io",
    category = "networking-istio-io",
    doc = "Configuration affecting network reachability of a sidecar. See more details at: https://istio.io/docs/reference/config/networking/sidecar.html"
)]
#[serde(rename_all = "camelCase")]
pub struct SidecarSpec {
    /// The workloads (in the Sidecar's namespace) this configuration applies to; every
    /// workload of the namespace when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<SidecarWorkloadSelector>,
    /// Listeners for traffic to the attached workload.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub ingress: Vec<IstioIngressListener>,
    /// Listeners for traffic from the attached workload, each with the hosts it imports.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub egress: Vec<IstioEgressListener>,
    /// Connection pool settings for every inbound port of the workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound_connection_pool: Option<ConnectionPoolSettings>,
    /// What happens to outbound traffic to hosts the registry does not know; the mesh's
    /// `outboundTrafficPolicy` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
}

/// `WorkloadSelector` of the Sidecar API (`labels`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SidecarWorkloadSelector {
    /// Labels selecting the workloads; an empty map selects every workload of the namespace.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Labels::is_empty"
    )]
    #[schemars(transform = selector_labels)]
    pub labels: Labels,
}

/// `IstioIngressListener`: a port on which the workload's sidecar accepts traffic.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IstioIngressListener {
    /// The port the listener accepts traffic on; required.
    pub port: SidecarPort,
    /// The IP (IPv4 or IPv6) the listener binds to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    /// How traffic reaches the listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_mode: Option<CaptureMode>,
    /// Where traffic is forwarded (`127.0.0.1:PORT`, `0.0.0.0:PORT`, `[::1]:PORT`,
    /// `[::]:PORT` or `unix://path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_endpoint: Option<String>,
    /// TLS termination for requests from outside the mesh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTlsSettings>,
    /// Connection pool settings for this port (instead of `inboundConnectionPool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
}

/// `IstioEgressListener`: the hosts a sidecar imports, on one port or (no port) on every
/// port no other listener names.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct IstioEgressListener {
    /// The port of the listener; absent for the catch-all listener (the last one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<SidecarPort>,
    /// The IP or Unix domain socket (`unix://path`) the listener binds to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    /// How traffic reaches the listener.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_mode: Option<CaptureMode>,
    /// The imported hosts, `namespace/dnsName` (`./` the Sidecar's namespace, `*/` any,
    /// `~/` none); required.
    #[serde(deserialize_with = "null_as_default")]
    pub hosts: Vec<String>,
}

/// `SidecarPort`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SidecarPort {
    /// The port number (0 for a Unix domain socket listener).
    #[serde(default)]
    pub number: u32,
    /// The protocol (`HTTP`, `HTTPS`, `GRPC`, `HTTP2`, `MONGO`, `TCP`, `TLS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// A label for the port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Deprecated; has no effect on Sidecars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

/// `CaptureMode`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CaptureMode {
    /// The environment's default capture.
    Default,
    /// Traffic is captured by iptables.
    Iptables,
    /// Traffic is not captured: the application connects to the listener's address.
    None,
}

/// `OutboundTrafficPolicy`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct OutboundTrafficPolicy {
    /// `REGISTRY_ONLY` (the proto's zero value) or `ALLOW_ANY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<OutboundTrafficPolicyMode>,
    /// Where `ALLOW_ANY` sends traffic to unknown hosts instead of passing it through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<Destination>,
}

/// `OutboundTrafficPolicy.Mode`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboundTrafficPolicyMode {
    RegistryOnly,
    AllowAny,
}

/// `ServerTLSSettings` (shared with the Gateway API of Istio).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = server_tls_rules)]
pub struct ServerTlsSettings {
    /// Redirect HTTP to HTTPS (not supported on sidecars).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_redirect: Option<bool>,
    /// How connections to the port are secured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ServerTlsMode>,
    /// Server certificate file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_certificate: Option<String>,
    /// Private key file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// CA certificates file verifying client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
    /// Certificate revocation list file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_crl: Option<String>,
    /// Secret holding the TLS material.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
    /// Secrets holding the TLS material (one or two).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(transform = one_or_two)]
    pub credential_names: Vec<String>,
    /// Secret or ConfigMap holding the CA certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_credential_name: Option<String>,
    /// Inline certificate files (one or two).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(transform = one_or_two)]
    pub tls_certificates: Vec<TlsCertificate>,
    /// Alternate names accepted in client certificates.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subject_alt_names: Vec<String>,
    /// SPKI hashes of accepted client certificates.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub verify_certificate_spki: Vec<String>,
    /// Certificate hashes of accepted client certificates.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub verify_certificate_hash: Vec<String>,
    /// Minimum TLS version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_protocol_version: Option<TlsProtocol>,
    /// Maximum TLS version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_protocol_version: Option<TlsProtocol>,
    /// Cipher suites accepted.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub cipher_suites: Vec<String>,
}

/// `ServerTLSSettings.TLSCertificate`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsCertificate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_certificate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
}

/// `ServerTLSSettings.TLSmode`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServerTlsMode {
    Passthrough,
    Simple,
    Mutual,
    AutoPassthrough,
    IstioMutual,
    OptionalMutual,
}

/// `ServerTLSSettings.TLSProtocol`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TlsProtocol {
    #[serde(rename = "TLS_AUTO")]
    TlsAuto,
    #[serde(rename = "TLSV1_0")]
    Tlsv1_0,
    #[serde(rename = "TLSV1_1")]
    Tlsv1_1,
    #[serde(rename = "TLSV1_2")]
    Tlsv1_2,
    #[serde(rename = "TLSV1_3")]
    Tlsv1_3,
}

impl SidecarSpec {
    /// Whether the Sidecar has a `workloadSelector` (even an empty one: Istio then applies
    /// it to every workload of the namespace, but still ranks it with the selecting ones).
    pub fn has_workload_selector(&self) -> bool {
        self.workload_selector.is_some()
    }
}

impl OutboundTrafficPolicy {
    /// The mode; `REGISTRY_ONLY` (the proto's zero value) when unset.
    pub fn effective_mode(&self) -> OutboundTrafficPolicyMode {
        self.mode.unwrap_or(OutboundTrafficPolicyMode::RegistryOnly)
    }
}

/// Istio's CRD rules on the selector's labels.
fn selector_labels(schema: &mut Schema) {
    schema.insert("maxProperties".into(), 256.into());
    if let Some(serde_json::Value::Object(values)) = schema.get_mut("additionalProperties") {
        values.insert("maxLength".into(), 63.into());
        values.insert(
            "x-kubernetes-validations".into(),
            serde_json::json!([{
                "rule": "!self.contains(\"*\")",
                "message": "wildcard is not supported in selector"
            }]),
        );
    }
}

/// Istio's CRD bounds on `credentialNames` and `tlsCertificates`.
fn one_or_two(schema: &mut Schema) {
    schema.insert("minItems".into(), 1.into());
    schema.insert("maxItems".into(), 2.into());
}

/// Istio's CRD rules on `ServerTLSSettings`: the three TLS material sources exclude each
/// other pairwise.
fn server_tls_rules(schema: &mut Schema) {
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([
            {
                "rule": "(has(self.tlsCertificates) ? 1 : 0) + (has(self.credentialNames) ? 1 : 0) <= 1",
                "message": "only one of credentialNames or tlsCertificates can be set"
            },
            {
                "rule": "(has(self.credentialName) ? 1 : 0) + (has(self.credentialNames) ? 1 : 0) <= 1",
                "message": "only one of credentialName or credentialNames can be set"
            },
            {
                "rule": "(has(self.credentialNames) ? 1 : 0) + (has(self.tlsCertificates) ? 1 : 0) <= 1",
                "message": "only one of credentialName or tlsCertificates can be set"
            }
        ]),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn enums_accept_every_istio_value() {
        for value in ["DEFAULT", "IPTABLES", "NONE"] {
            let parsed: CaptureMode = serde_json::from_value(json!(value)).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), json!(value));
        }
        for value in ["REGISTRY_ONLY", "ALLOW_ANY"] {
            let parsed: OutboundTrafficPolicyMode = serde_json::from_value(json!(value)).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), json!(value));
        }
        for value in ["TLS_AUTO", "TLSV1_0", "TLSV1_1", "TLSV1_2", "TLSV1_3"] {
            let parsed: TlsProtocol = serde_json::from_value(json!(value)).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), json!(value));
        }
        for value in [
            "PASSTHROUGH",
            "SIMPLE",
            "MUTUAL",
            "AUTO_PASSTHROUGH",
            "ISTIO_MUTUAL",
            "OPTIONAL_MUTUAL",
        ] {
            let parsed: ServerTlsMode = serde_json::from_value(json!(value)).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), json!(value));
        }
    }

    #[test]
    fn an_unset_mode_is_registry_only() {
        assert_eq!(
            OutboundTrafficPolicy::default().effective_mode(),
            OutboundTrafficPolicyMode::RegistryOnly
        );
    }
}
