//! `ServiceEntry` (`networking.istio.io`): adds services to the mesh's registry — external
//! APIs resolved by DNS, or workloads (VMs) with static endpoints.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::common::{Labels, null_as_default};
use super::status::IstioStatus;

/// The spec of a ServiceEntry: entries added to the mesh's service registry.
///
/// Reference: https://istio.io/latest/docs/reference/config/networking/service-entry/
// The kube attribute list repeats `type_ = "string"` across print columns by design. The
// doc comment is the CRD's description, so its URL stays bare (kubectl shows plain text).
#[allow(clippy::duplicated_attributes, rustdoc::bare_urls)]
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "networking.istio.io",
    version = "v1",
    kind = "ServiceEntry",
    namespaced,
    status = "IstioStatus",
    derive = "PartialEq",
    shortname = "se",
    category = "istio-io",
    category = "networking-istio-io",
    doc = "Configuration affecting service registry. See more details at: https://istio.io/docs/reference/config/networking/service-entry.html",
    printcolumn(
        name = "Hosts",
        type_ = "string",
        json_path = ".spec.hosts",
        description = "The hosts associated with the ServiceEntry"
    ),
    printcolumn(
        name = "Location",
        type_ = "string",
        json_path = ".spec.location",
        description = "Whether the service is external to the mesh or part of the mesh (MESH_EXTERNAL or MESH_INTERNAL)"
    ),
    printcolumn(
        name = "Resolution",
        type_ = "string",
        json_path = ".spec.resolution",
        description = "Service resolution mode for the hosts (NONE, STATIC, or DNS)"
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
pub struct ServiceEntrySpec {
    /// The hosts associated with the ServiceEntry; required.
    #[serde(deserialize_with = "null_as_default")]
    #[schemars(length(min = 1, max = 256), transform = host_items)]
    pub hosts: Vec<String>,
    /// Virtual IP addresses (or CIDRs) of the service.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 256), transform = address_items)]
    pub addresses: Vec<String>,
    /// The ports of the service.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 256), transform = port_list)]
    pub ports: Vec<ServicePort>,
    /// Whether the service is external to the mesh or part of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    /// How the service's endpoints are resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
    /// Endpoints of the service (or use `workloadSelector`).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 4096))]
    pub endpoints: Vec<WorkloadEntry>,
    /// Selects WorkloadEntries and pods as endpoints (MESH_INTERNAL services only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// A list of namespaces to which this service is exported.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub export_to: Vec<String>,
    /// Subject alternate names accepted in the server certificate.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub subject_alt_names: Vec<String>,
}

/// A port of a ServiceEntry (`ServicePort`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// Port number; required.
    #[schemars(transform = port_range)]
    pub number: u32,
    /// Protocol: HTTP, HTTPS, GRPC, HTTP2, MONGO, TCP or TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub protocol: Option<String>,
    /// Label assigned to the port; required.
    #[schemars(length(max = 256))]
    pub name: String,
    /// Port on the endpoints where traffic is received (default: `number`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = port_range)]
    pub target_port: Option<u32>,
}

/// Where a ServiceEntry's service lives (`ServiceEntry.Location`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Location {
    MeshExternal,
    MeshInternal,
}

/// How a ServiceEntry's endpoints are resolved (`ServiceEntry.Resolution`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    None,
    Static,
    Dns,
    DnsRoundRobin,
    DynamicDns,
}

/// A network endpoint of a service (`WorkloadEntry`, as embedded in a ServiceEntry).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = endpoint_rules)]
pub struct WorkloadEntry {
    /// Address (IP, DNS name or `unix://` socket) without the port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), transform = socket_address)]
    pub address: Option<String>,
    /// Port numbers of the endpoint, keyed by the service port's name.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    #[schemars(transform = endpoint_ports)]
    pub ports: BTreeMap<String, u32>,
    /// Labels of the endpoint.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    #[schemars(extend("maxProperties" = 256))]
    pub labels: Labels,
    /// Network the endpoint is in (for multi-network meshes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub network: Option<String>,
    /// Locality of the endpoint, `region/zone/subzone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub locality: Option<String>,
    /// Load balancing weight of the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// Service account of the workload (if it runs a sidecar).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub service_account: Option<String>,
}

/// Istio's networking `WorkloadSelector` (`labels`), used by ServiceEntry.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Labels selecting the workloads.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    #[schemars(transform = selector_labels)]
    pub labels: Labels,
}

// The rules Istio's ServiceEntry CRD adds to the structural schema (CEL
// `x-kubernetes-validations`, list and size bounds). The API server applies them before
// any webhook; validation (`push_context::validate`) repeats them for files.

/// `x-kubernetes-validations` of one schema node: `(rule, message)` pairs.
fn cel(schema: &mut Schema, rules: &[(&str, &str)]) {
    let list: Vec<serde_json::Value> = rules
        .iter()
        .map(|(rule, message)| serde_json::json!({"rule": rule, "message": message}))
        .collect();
    schema.insert("x-kubernetes-validations".into(), list.into());
}

/// Applies `f` to the schema of a list's items or a map's values.
fn each(schema: &mut Schema, key: &str, f: impl FnOnce(&mut Schema)) {
    if let Some(node) = schema.get_mut(key)
        && let Ok(mut inner) = Schema::try_from(node.clone())
    {
        f(&mut inner);
        *node = inner.to_value();
    }
}

fn spec_rules(schema: &mut Schema) {
    cel(
        schema,
        &[
            (
                "(has(self.workloadSelector) ? 1 : 0) + (has(self.endpoints) ? 1 : 0) <= 1",
                "only one of workloadSelector and endpoints may be set",
            ),
            (
                "!((has(self.addresses) ? self.addresses : []).exists(k, k.contains(\"/\")) && !((has(self.resolution) ? self.resolution : \"NONE\") in [\"STATIC\", \"NONE\"]))",
                "CIDR addresses are allowed only with resolution NONE or STATIC",
            ),
            (
                "((has(self.resolution) ? self.resolution : \"NONE\") == \"NONE\") ? !has(self.endpoints) : true",
                "resolution NONE takes no endpoints",
            ),
            (
                "((has(self.resolution) ? self.resolution : \"\") == \"DNS_ROUND_ROBIN\") ? ((has(self.endpoints) ? self.endpoints : []).size() <= 1) : true",
                "resolution DNS_ROUND_ROBIN takes at most one endpoint",
            ),
        ],
    );
}

fn host_items(schema: &mut Schema) {
    each(schema, "items", |item| {
        cel(
            item,
            &[("self != \"*\"", "a host cannot be the wildcard `*`")],
        )
    });
}

fn address_items(schema: &mut Schema) {
    each(schema, "items", |item| {
        item.insert("maxLength".into(), 64.into());
    });
}

fn port_list(schema: &mut Schema) {
    schema.insert("x-kubernetes-list-type".into(), "map".into());
    schema.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["name"]),
    );
    cel(
        schema,
        &[(
            "self.all(l1, self.exists_one(l2, l1.number == l2.number))",
            "a port number may appear once",
        )],
    );
}

fn port_range(schema: &mut Schema) {
    cel(
        schema,
        &[(
            "0 < self && self <= 65535",
            "a port must be between 1 and 65535",
        )],
    );
}

fn endpoint_rules(schema: &mut Schema) {
    cel(
        schema,
        &[
            (
                "has(self.address) || has(self.network)",
                "an endpoint needs an address or a network",
            ),
            (
                "(has(self.address) ? self.address : \"\").startsWith(\"unix://\") ? !has(self.ports) : true",
                "a unix:// endpoint takes no ports",
            ),
        ],
    );
}

fn socket_address(schema: &mut Schema) {
    cel(
        schema,
        &[
            (
                "self.startsWith(\"unix://\") ? (self.substring(7, 8) == \"/\" || self.substring(7, 8) == \"@\") : true",
                "a unix:// address must be an absolute path or an abstract socket",
            ),
            (
                "self.startsWith(\"unix://\") ? !self.endsWith(\"/\") : true",
                "a unix:// address cannot be a directory",
            ),
        ],
    );
}

fn endpoint_ports(schema: &mut Schema) {
    schema.insert("maxProperties".into(), 128.into());
    cel(
        schema,
        &[(
            "self.all(key, size(key) < 63 && key.matches(\"^[a-zA-Z0-9](?:[-a-zA-Z0-9]*[a-zA-Z0-9])?$\"))",
            "port names must be DNS labels shorter than 63 characters",
        )],
    );
    each(schema, "additionalProperties", port_range);
}

fn selector_labels(schema: &mut Schema) {
    schema.insert("maxProperties".into(), 256.into());
    each(schema, "additionalProperties", |value| {
        value.insert("maxLength".into(), 63.into());
        cel(
            value,
            &[(
                "!self.contains(\"*\")",
                "a selector label value cannot contain '*'",
            )],
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn enums_accept_every_istio_value() {
        for value in ["MESH_EXTERNAL", "MESH_INTERNAL"] {
            let parsed: Location = serde_json::from_value(json!(value)).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), json!(value));
        }
        for value in ["NONE", "STATIC", "DNS", "DNS_ROUND_ROBIN", "DYNAMIC_DNS"] {
            let parsed: Resolution = serde_json::from_value(json!(value)).unwrap();
            assert_eq!(serde_json::to_value(parsed).unwrap(), json!(value));
        }
        assert!(serde_json::from_value::<Resolution>(json!("dns")).is_err());
    }

    #[test]
    fn missing_required_fields_are_errors() {
        let err = serde_json::from_value::<ServiceEntrySpec>(json!({"ports": []})).unwrap_err();
        assert!(err.to_string().contains("missing field `hosts`"), "{err}");
        let err = serde_json::from_value::<ServicePort>(json!({"number": 80})).unwrap_err();
        assert!(err.to_string().contains("missing field `name`"), "{err}");
    }
}
