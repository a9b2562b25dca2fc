//! `AuthorizationPolicy` (`security.istio.io`): which requests a workload's sidecar (or
//! proxyless gRPC server) accepts — rules of sources (`from`), operations (`to`) and
//! conditions (`when`) with an action (ALLOW, DENY, AUDIT; CUSTOM is not supported by
//! Pilotfish), for the mesh (root namespace), a namespace, or the workloads a selector
//! picks. Every field of istio/api v1.30.3 `security/v1beta1/authorization_policy.proto`.

use kube::CustomResource;
use schemars::{JsonSchema, Schema};
use serde::{Deserialize, Serialize};

use super::common::null_as_default;
use super::destination_rule::TypeWorkloadSelector;
use super::status::IstioStatus;

/// The spec of an AuthorizationPolicy.
///
/// Reference: https://istio.io/latest/docs/reference/config/security/authorization-policy/
// The doc comment is the CRD's description, so its URL stays bare (kubectl shows plain text).
#[allow(clippy::duplicated_attributes, rustdoc::bare_urls)]
#[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "security.istio.io",
    version = "v1",
    kind = "AuthorizationPolicy",
    plural = "authorizationpolicies",
    namespaced,
    status = "IstioStatus",
    derive = "PartialEq",
    shortname = "ap",
    category = "istio-io",
    category = "security-istio-io",
    doc = "Configuration for access control on workloads. See more details at: https://istio.io/docs/reference/config/security/authorization-policy.html",
    printcolumn(
        name = "Action",
        type_ = "string",
        json_path = ".spec.action",
        description = "The operation to take."
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp",
        description = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC. Populated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/api-conventions.md#metadata"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = spec_rules)]
pub struct AuthorizationPolicySpec {
    /// The workloads (in the policy's namespace; in the root namespace, of every namespace)
    /// the policy applies to; every workload when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<TypeWorkloadSelector>,
    /// Deprecated single form of `targetRefs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<PolicyTargetReference>,
    /// The resources (Gateway, GatewayClass, Service, ServiceEntry) the policy attaches
    /// to. Istio applies such a policy only to gateways and waypoints, never to sidecars.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 16))]
    pub target_refs: Vec<PolicyTargetReference>,
    /// The rules; a request matches the policy when it matches one of them. `None` (absent)
    /// and `Some(empty)` differ for validation (a DENY policy needs the field) but not in
    /// effect: a policy without rules never matches.
    #[serde(
        default,
        deserialize_with = "null_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 512))]
    pub rules: Option<Vec<Rule>>,
    /// What to do with a matching request; ALLOW when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<AuthorizationAction>,
    /// The extension provider of a CUSTOM policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<ExtensionProvider>,
}

/// `AuthorizationPolicy.Action`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuthorizationAction {
    /// Allow a request only if it matches the rules (the default).
    Allow,
    /// Deny a request if it matches any of the rules.
    Deny,
    /// Audit a request if it matches any of the rules.
    Audit,
    /// Delegate the decision to an extension (ext_authz); not supported by Pilotfish.
    Custom,
}

/// `AuthorizationPolicy.ExtensionProvider`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionProvider {
    /// The provider's name in MeshConfig `extensionProviders`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// `istio.type.v1beta1.PolicyTargetReference`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = target_ref_rules)]
pub struct PolicyTargetReference {
    /// The group of the target; empty or absent for the core group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The kind of the target (Gateway, GatewayClass, Service, ServiceEntry).
    pub kind: String,
    /// The name of the target.
    pub name: String,
    /// Must be empty: cross-namespace references are not supported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `Rule`: sources, operations and conditions, all of which must match.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// Sources; any source when absent. Present but empty is invalid.
    #[serde(
        default,
        deserialize_with = "null_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 512))]
    pub from: Option<Vec<RuleFrom>>,
    /// Operations; any operation when absent. Present but empty is invalid.
    #[serde(
        default,
        deserialize_with = "null_as_none",
        skip_serializing_if = "Option::is_none"
    )]
    pub to: Option<Vec<RuleTo>>,
    /// Additional conditions, all of which must hold.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub when: Vec<Condition>,
}

/// `Rule.From`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RuleFrom {
    /// The source; required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
}

/// `Rule.To`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RuleTo {
    /// The operation; required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
}

/// Declares a `Vec<String>` field that reads `null` as empty and is omitted when empty.
macro_rules! string_list {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($(#[$field_meta:meta])* $field:ident,)* }) => {
        #[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
        $(#[$meta])*
        #[serde(rename_all = "camelCase")]
        $vis struct $name {
            $(
                $(#[$field_meta])*
                #[serde(
                    default,
                    deserialize_with = "null_as_default",
                    skip_serializing_if = "Vec::is_empty"
                )]
                pub $field: Vec<String>,
            )*
        }
    };
}

string_list! {
    /// `Source`: the peer and request identities, namespaces and addresses a request may
    /// come from; the fields are ANDed.
    #[schemars(transform = source_rules)]
    pub struct Source {
        /// Peer identities (`<trust domain>/ns/<ns>/sa/<sa>`) from the mTLS certificate.
        principals,
        /// Peer identities that must not match.
        not_principals,
        /// Request identities (`<iss>/<sub>`) from a validated JWT.
        request_principals,
        /// Request identities that must not match.
        not_request_principals,
        /// Namespaces of the peer identity.
        namespaces,
        /// Namespaces that must not match.
        not_namespaces,
        /// Service accounts (`<ns>/<sa>` or `<sa>` in the policy's namespace).
        #[schemars(length(max = 16), transform = max_length_320_items)]
        service_accounts,
        /// Service accounts that must not match.
        #[schemars(length(max = 16), transform = max_length_320_items)]
        not_service_accounts,
        /// Source IPs or CIDR blocks of the connection.
        ip_blocks,
        /// Source IP blocks that must not match.
        not_ip_blocks,
        /// Original client IPs (X-Forwarded-For or proxy protocol).
        remote_ip_blocks,
        /// Original client IP blocks that must not match.
        not_remote_ip_blocks,
        /// Trust domains of the peer identity.
        trust_domains,
        /// Trust domains that must not match.
        not_trust_domains,
    }
}

string_list! {
    /// `Operation`: the hosts, ports, methods and paths of a request; the fields are ANDed.
    pub struct Operation {
        /// Hosts (`:authority`), case-insensitive; HTTP only.
        hosts,
        /// Hosts that must not match.
        not_hosts,
        /// Destination ports of the connection.
        ports,
        /// Ports that must not match.
        not_ports,
        /// HTTP methods; HTTP only.
        methods,
        /// Methods that must not match.
        not_methods,
        /// Paths (normalized), with `*` prefix/suffix or `{*}`/`{**}` templates; HTTP only.
        paths,
        /// Paths that must not match.
        not_paths,
    }
}

/// `Condition`: an Istio attribute (`key`) and the values it must (or must not) have.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The attribute, e.g. `request.headers[User-Agent]`, `source.ip`; required.
    pub key: String,
    /// Values the attribute may have.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub values: Vec<String>,
    /// Values the attribute must not have.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub not_values: Vec<String>,
}

impl AuthorizationPolicySpec {
    /// The action, ALLOW when absent.
    pub fn action(&self) -> AuthorizationAction {
        self.action.unwrap_or(AuthorizationAction::Allow)
    }

    /// The rules (none when absent).
    pub fn rules(&self) -> &[Rule] {
        self.rules.as_deref().unwrap_or(&[])
    }

    /// `targetRefs`, or the deprecated `targetRef` when `targetRefs` is empty (Istio's
    /// `GetTargetRefs`).
    pub fn effective_target_refs(&self) -> Vec<&PolicyTargetReference> {
        if self.target_refs.is_empty() {
            self.target_ref.iter().collect()
        } else {
            self.target_refs.iter().collect()
        }
    }
}

impl Rule {
    /// The sources (none when absent).
    pub fn from(&self) -> &[RuleFrom] {
        self.from.as_deref().unwrap_or(&[])
    }

    /// The operations (none when absent).
    pub fn to(&self) -> &[RuleTo] {
        self.to.as_deref().unwrap_or(&[])
    }
}

/// `null` reads as absent (Go's JSON decoding does the same for slices).
fn null_as_none<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer)
}

/// Istio's CRD rule on the spec: at most one of `selector`, `targetRef`, `targetRefs`.
fn spec_rules(schema: &mut Schema) {
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "(has(self.selector) ? 1 : 0) + (has(self.targetRef) ? 1 : 0) + (has(self.targetRefs) ? 1 : 0) <= 1",
            "message": "only one of targetRefs or selector can be set"
        }]),
    );
}

/// Istio's CRD rule on a source: `serviceAccounts` excludes principals and namespaces.
fn source_rules(schema: &mut Schema) {
    schema.insert(
        "x-kubernetes-validations".into(),
        serde_json::json!([{
            "rule": "(has(self.serviceAccounts) || has(self.notServiceAccounts)) ? (!has(self.principals) && !has(self.notPrincipals) && !has(self.namespaces) && !has(self.notNamespaces)) : true",
            "message": "Cannot set serviceAccounts with namespaces or principals"
        }]),
    );
}

/// Istio's CRD rule on service account values: at most 320 characters each.
fn max_length_320_items(schema: &mut Schema) {
    if let Some(items) = schema.get_mut("items").and_then(|v| v.as_object_mut()) {
        items.insert("maxLength".into(), 320.into());
    }
}

/// Istio's CRD rules on a `PolicyTargetReference`: Kubernetes name formats, and no
/// namespace (cross-namespace references are not supported).
fn target_ref_rules(schema: &mut Schema) {
    let Some(props) = schema.get_mut("properties").and_then(|v| v.as_object_mut()) else {
        return;
    };
    let set = |props: &mut serde_json::Map<String, serde_json::Value>,
               field: &str,
               extra: serde_json::Value| {
        if let (Some(node), serde_json::Value::Object(extra)) =
            (props.get_mut(field).and_then(|v| v.as_object_mut()), extra)
        {
            node.extend(extra);
        }
    };
    set(
        props,
        "group",
        serde_json::json!({
            "maxLength": 253,
            "pattern": "^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
        }),
    );
    set(
        props,
        "kind",
        serde_json::json!({
            "maxLength": 63, "minLength": 1,
            "pattern": "^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
        }),
    );
    set(
        props,
        "name",
        serde_json::json!({"maxLength": 253, "minLength": 1}),
    );
    set(
        props,
        "namespace",
        serde_json::json!({"x-kubernetes-validations": [{
            "rule": "self.size() == 0",
            "message": "cross namespace referencing is not currently supported"
        }]}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_every_field_and_keeps_absent_apart_from_empty() {
        let spec: AuthorizationPolicySpec = serde_json::from_value(json!({
            "selector": {"matchLabels": {"app": "a"}},
            "action": "DENY",
            "rules": [{
                "from": [{"source": {"principals": ["cluster.local/ns/a/sa/b"], "notIpBlocks": ["10.0.0.0/8"]}}],
                "to": [{"operation": {"methods": ["GET"], "notPaths": ["/admin*"], "ports": ["8080"]}}],
                "when": [{"key": "request.headers[x]", "values": ["y"]}]
            }, {}]
        }))
        .unwrap();
        assert_eq!(spec.action(), AuthorizationAction::Deny);
        assert_eq!(spec.rules().len(), 2);
        assert_eq!(
            spec.rules()[0].from()[0]
                .source
                .as_ref()
                .unwrap()
                .not_ip_blocks,
            ["10.0.0.0/8"]
        );
        assert_eq!(spec.rules()[1].from, None);
        let empty: AuthorizationPolicySpec = serde_json::from_value(json!({"rules": []})).unwrap();
        assert_eq!(empty.rules, Some(Vec::new()));
        let absent: AuthorizationPolicySpec = serde_json::from_value(json!({})).unwrap();
        assert_eq!(absent.rules, None);
        assert_eq!(absent.action(), AuthorizationAction::Allow);
    }

    #[test]
    fn target_refs_fall_back_to_the_deprecated_single_form() {
        let spec: AuthorizationPolicySpec = serde_json::from_value(
            json!({"targetRef": {"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "g"}}),
        )
        .unwrap();
        assert_eq!(spec.effective_target_refs().len(), 1);
    }
}
