//! The subset of Istio's MeshConfig that Pilotfish honours, parsed from the same YAML an
//! Istio operator already has (`--mesh-config FILE`, read by
//! `pilotfish_shared::cli::load_mesh_config`). Fields Pilotfish does not implement are
//! returned as ignored (the caller reports them once), never rejected: a full Istio mesh
//! config must load.

use std::time::Duration;

use serde_json::Value;

/// What to do with traffic to hosts the mesh does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum OutboundTrafficPolicy {
    /// Unknown destinations go to `PassthroughCluster`.
    #[default]
    AllowAny,
    /// Unknown destinations go to `BlackHoleCluster`.
    RegistryOnly,
}

/// Mesh-wide settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MeshConfig {
    /// Namespace whose DestinationRules (and exported configs) apply mesh-wide.
    pub root_namespace: String,
    pub outbound_traffic_policy: OutboundTrafficPolicy,
    /// Default `exportTo` for services, VirtualServices and DestinationRules that set none.
    pub default_service_export_to: Vec<String>,
    pub default_virtual_service_export_to: Vec<String>,
    pub default_destination_rule_export_to: Vec<String>,
    /// Cluster connect timeout when no DestinationRule sets one.
    pub connect_timeout: Duration,
    pub trust_domain: String,
    /// `enableAutoMtls` (default true): sidecars originate Istio mutual TLS to endpoints
    /// that carry a sidecar, without a DestinationRule saying so.
    pub enable_auto_mtls: bool,
    /// `discoverySelectors`: which namespaces the controller reads (any selector matching
    /// a namespace's labels selects it; none: every namespace). Read by the controller
    /// only; not part of a snapshot.
    pub discovery_selectors: Vec<NamespaceSelector>,
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`, all of which must
/// hold), as MeshConfig's `discoverySelectors` holds them. An empty selector selects
/// every namespace (Kubernetes' `labels.Everything()`, as Istio converts it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceSelector {
    pub match_labels: std::collections::BTreeMap<String, String>,
    pub match_expressions: Vec<LabelRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelRequirement {
    pub key: String,
    pub operator: LabelOperator,
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl NamespaceSelector {
    /// Whether `labels` satisfy every requirement (Kubernetes' selector semantics:
    /// `NotIn` and `DoesNotExist` hold for a missing label).
    pub fn matches(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.match_labels
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let value = labels.get(&r.key);
                match r.operator {
                    LabelOperator::In => value.is_some_and(|v| r.values.contains(v)),
                    LabelOperator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                    LabelOperator::Exists => value.is_some(),
                    LabelOperator::DoesNotExist => value.is_none(),
                }
            })
    }
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig {
            root_namespace: "istio-system".to_string(),
            outbound_traffic_policy: OutboundTrafficPolicy::AllowAny,
            default_service_export_to: Vec::new(),
            default_virtual_service_export_to: Vec::new(),
            default_destination_rule_export_to: Vec::new(),
            connect_timeout: Duration::from_secs(10),
            trust_domain: "cluster.local".to_string(),
            enable_auto_mtls: true,
            discovery_selectors: Vec::new(),
        }
    }
}

/// A MeshConfig that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MeshConfigError {
    #[error("mesh config is not valid YAML: {0}")]
    Yaml(String),
    #[error("mesh config field {field}: {reason}")]
    Field { field: String, reason: String },
}

/// A loaded MeshConfig plus the top-level fields that were present but are not implemented.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedMeshConfig {
    pub config: MeshConfig,
    pub ignored_fields: Vec<String>,
}

const KNOWN_FIELDS: [&str; 9] = [
    "discoverySelectors",
    "rootNamespace",
    "outboundTrafficPolicy",
    "defaultServiceExportTo",
    "defaultVirtualServiceExportTo",
    "defaultDestinationRuleExportTo",
    "connectTimeout",
    "trustDomain",
    "enableAutoMtls",
];

impl MeshConfig {
    /// Parses Istio MeshConfig YAML (the `mesh` key of Istio's ConfigMap). An empty
    /// document gives the defaults.
    pub fn from_yaml(text: &str) -> Result<LoadedMeshConfig, MeshConfigError> {
        let value: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_saphyr::from_str(text).map_err(|e| MeshConfigError::Yaml(e.to_string()))?
        };
        Self::from_value(&value)
    }

    pub fn from_value(value: &Value) -> Result<LoadedMeshConfig, MeshConfigError> {
        let mut config = MeshConfig::default();
        let Some(obj) = value.as_object() else {
            if value.is_null() {
                return Ok(LoadedMeshConfig {
                    config,
                    ignored_fields: Vec::new(),
                });
            }
            return Err(MeshConfigError::Field {
                field: "(root)".into(),
                reason: "must be a mapping".into(),
            });
        };
        if let Some(v) = obj.get("rootNamespace") {
            config.root_namespace = string_field("rootNamespace", v)?;
        }
        if let Some(v) = obj.get("outboundTrafficPolicy") {
            let mode = v
                .get("mode")
                .map(|m| string_field("outboundTrafficPolicy.mode", m))
                .transpose()?;
            config.outbound_traffic_policy = match mode.as_deref() {
                None | Some("ALLOW_ANY") => OutboundTrafficPolicy::AllowAny,
                Some("REGISTRY_ONLY") => OutboundTrafficPolicy::RegistryOnly,
                Some(other) => {
                    return Err(MeshConfigError::Field {
                        field: "outboundTrafficPolicy.mode".into(),
                        reason: format!("must be ALLOW_ANY or REGISTRY_ONLY (got {other:?})"),
                    });
                }
            };
        }
        for (field, target) in [
            (
                "defaultServiceExportTo",
                &mut config.default_service_export_to,
            ),
            (
                "defaultVirtualServiceExportTo",
                &mut config.default_virtual_service_export_to,
            ),
            (
                "defaultDestinationRuleExportTo",
                &mut config.default_destination_rule_export_to,
            ),
        ] {
            if let Some(v) = obj.get(field) {
                *target = string_list_field(field, v)?;
            }
        }
        if let Some(v) = obj.get("connectTimeout") {
            let text = string_field("connectTimeout", v)?;
            config.connect_timeout = text
                .parse::<crate::api::Duration>()
                .map(|d| d.as_std())
                .map_err(|e| MeshConfigError::Field {
                    field: "connectTimeout".into(),
                    reason: e.to_string(),
                })?;
        }
        if let Some(v) = obj.get("trustDomain") {
            config.trust_domain = string_field("trustDomain", v)?;
        }
        if let Some(v) = obj.get("discoverySelectors") {
            config.discovery_selectors = discovery_selectors(v)?;
        }
        if let Some(v) = obj.get("enableAutoMtls") {
            config.enable_auto_mtls = v.as_bool().ok_or_else(|| MeshConfigError::Field {
                field: "enableAutoMtls".into(),
                reason: format!("must be a boolean (got {v})"),
            })?;
        }
        let mut ignored_fields: Vec<String> = obj
            .keys()
            .filter(|k| !KNOWN_FIELDS.contains(&k.as_str()))
            .cloned()
            .collect();
        ignored_fields.sort();
        Ok(LoadedMeshConfig {
            config,
            ignored_fields,
        })
    }
}

fn string_field(field: &str, v: &Value) -> Result<String, MeshConfigError> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| MeshConfigError::Field {
            field: field.to_string(),
            reason: format!("must be a string (got {v})"),
        })
}

/// `discoverySelectors`, with the checks Kubernetes' `labels.NewRequirement` makes when
/// Istio converts them (`LabelSelectorAsSelector`): a known operator, values for `In` and
/// `NotIn`, none for `Exists` and `DoesNotExist`, a non-empty key. Istio logs such an
/// error and keeps its previous filter; Pilotfish refuses the mesh config (at start) or
/// keeps the previous one (on reload).
fn discovery_selectors(v: &Value) -> Result<Vec<NamespaceSelector>, MeshConfigError> {
    let field = "discoverySelectors";
    let err = |path: String, reason: String| MeshConfigError::Field {
        field: path,
        reason,
    };
    let list = v
        .as_array()
        .ok_or_else(|| err(field.into(), "must be a list of label selectors".into()))?;
    let mut out = Vec::new();
    for (i, sel) in list.iter().enumerate() {
        let path = format!("{field}[{i}]");
        let mut selector = NamespaceSelector::default();
        if sel.is_null() {
            out.push(selector);
            continue;
        }
        let obj = sel
            .as_object()
            .ok_or_else(|| err(path.clone(), "must be a label selector".into()))?;
        for key in obj.keys() {
            if key != "matchLabels" && key != "matchExpressions" {
                return Err(err(
                    format!("{path}.{key}"),
                    "unknown field (a selector has matchLabels and matchExpressions)".into(),
                ));
            }
        }
        if let Some(labels) = obj.get("matchLabels").filter(|l| !l.is_null()) {
            let labels = labels
                .as_object()
                .ok_or_else(|| err(format!("{path}.matchLabels"), "must be a mapping".into()))?;
            for (k, val) in labels {
                let item = format!("{path}.matchLabels[{k}]");
                if k.is_empty() {
                    return Err(err(item, "a label key cannot be empty".into()));
                }
                selector
                    .match_labels
                    .insert(k.clone(), string_field(&item, val)?);
            }
        }
        if let Some(exprs) = obj.get("matchExpressions").filter(|l| !l.is_null()) {
            let exprs = exprs
                .as_array()
                .ok_or_else(|| err(format!("{path}.matchExpressions"), "must be a list".into()))?;
            for (j, e) in exprs.iter().enumerate() {
                let item = format!("{path}.matchExpressions[{j}]");
                let key = e
                    .get("key")
                    .map(|k| string_field(&format!("{item}.key"), k))
                    .transpose()?
                    .unwrap_or_default();
                if key.is_empty() {
                    return Err(err(
                        format!("{item}.key"),
                        "a label key cannot be empty".into(),
                    ));
                }
                let op = e
                    .get("operator")
                    .map(|o| string_field(&format!("{item}.operator"), o))
                    .transpose()?
                    .unwrap_or_default();
                let operator = match op.as_str() {
                    "In" => LabelOperator::In,
                    "NotIn" => LabelOperator::NotIn,
                    "Exists" => LabelOperator::Exists,
                    "DoesNotExist" => LabelOperator::DoesNotExist,
                    other => {
                        return Err(err(
                            format!("{item}.operator"),
                            format!("{other:?} is not a valid label selector operator"),
                        ));
                    }
                };
                let values = match e.get("values").filter(|v| !v.is_null()) {
                    Some(v) => string_list_field(&format!("{item}.values"), v)?,
                    None => Vec::new(),
                };
                let needs_values = matches!(operator, LabelOperator::In | LabelOperator::NotIn);
                if needs_values && values.is_empty() {
                    return Err(err(
                        format!("{item}.values"),
                        format!("{op} needs at least one value"),
                    ));
                }
                if !needs_values && !values.is_empty() {
                    return Err(err(
                        format!("{item}.values"),
                        format!("{op} takes no values"),
                    ));
                }
                selector.match_expressions.push(LabelRequirement {
                    key,
                    operator,
                    values,
                });
            }
        }
        out.push(selector);
    }
    Ok(out)
}

fn string_list_field(field: &str, v: &Value) -> Result<Vec<String>, MeshConfigError> {
    let list = v.as_array().ok_or_else(|| MeshConfigError::Field {
        field: field.to_string(),
        reason: "must be a list of strings".into(),
    })?;
    list.iter()
        .enumerate()
        .map(|(i, e)| string_field(&format!("{field}[{i}]"), e))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_selectors_parse_and_match_like_kubernetes() {
        let loaded = MeshConfig::from_yaml(
            "discoverySelectors:\n- matchLabels: {env: prod}\n- matchExpressions:\n  - {key: team, operator: In, values: [a, b]}\n  - {key: legacy, operator: DoesNotExist}\n",
        )
        .unwrap();
        assert!(loaded.ignored_fields.is_empty());
        let sel = &loaded.config.discovery_selectors;
        assert_eq!(sel.len(), 2);
        let labels = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(sel[0].matches(&labels(&[("env", "prod")])));
        assert!(!sel[0].matches(&labels(&[("env", "dev")])));
        assert!(sel[1].matches(&labels(&[("team", "a")])));
        assert!(!sel[1].matches(&labels(&[("team", "a"), ("legacy", "")])));
        assert!(!sel[1].matches(&labels(&[])));
        assert!(
            NamespaceSelector::default().matches(&labels(&[])),
            "{{}} selects all"
        );
        let not_in = MeshConfig::from_yaml(
            "discoverySelectors: [{matchExpressions: [{key: a, operator: NotIn, values: [x]}]}]",
        )
        .unwrap();
        assert!(not_in.config.discovery_selectors[0].matches(&labels(&[])));
        for (bad, path) in [
            (
                "[{matchExpressions: [{key: a, operator: Like, values: [x]}]}]",
                "discoverySelectors[0].matchExpressions[0].operator",
            ),
            (
                "[{matchExpressions: [{key: a, operator: In}]}]",
                "discoverySelectors[0].matchExpressions[0].values",
            ),
            (
                "[{matchExpressions: [{key: a, operator: Exists, values: [x]}]}]",
                "discoverySelectors[0].matchExpressions[0].values",
            ),
            ("[{matchLabel: {a: b}}]", "discoverySelectors[0].matchLabel"),
        ] {
            match MeshConfig::from_yaml(&format!("discoverySelectors: {bad}")) {
                Err(MeshConfigError::Field { field, .. }) => assert_eq!(field, path, "{bad}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn defaults_match_istio() {
        let loaded = MeshConfig::from_yaml("").unwrap();
        assert_eq!(loaded.config.root_namespace, "istio-system");
        assert_eq!(
            loaded.config.outbound_traffic_policy,
            OutboundTrafficPolicy::AllowAny
        );
        assert_eq!(loaded.config.connect_timeout, Duration::from_secs(10));
        assert!(loaded.config.enable_auto_mtls);
        let off = MeshConfig::from_yaml("enableAutoMtls: false").unwrap();
        assert!(!off.config.enable_auto_mtls);
        assert!(off.ignored_fields.is_empty());
        assert!(MeshConfig::from_yaml("enableAutoMtls: \"no\"").is_err());
    }

    #[test]
    fn reads_known_fields_and_lists_ignored_ones() {
        let loaded = MeshConfig::from_yaml(
            "rootNamespace: mesh-root\noutboundTrafficPolicy:\n  mode: REGISTRY_ONLY\nconnectTimeout: 2.5s\n\
             defaultVirtualServiceExportTo: [\".\"]\naccessLogFile: /dev/stdout\nenableTracing: true\n",
        )
        .unwrap();
        assert_eq!(loaded.config.root_namespace, "mesh-root");
        assert_eq!(
            loaded.config.outbound_traffic_policy,
            OutboundTrafficPolicy::RegistryOnly
        );
        assert_eq!(loaded.config.connect_timeout, Duration::from_millis(2500));
        assert_eq!(
            loaded.config.default_virtual_service_export_to,
            vec![".".to_string()]
        );
        assert_eq!(
            loaded.ignored_fields,
            vec!["accessLogFile".to_string(), "enableTracing".to_string()]
        );
    }

    #[test]
    fn bad_values_name_the_field() {
        let err = MeshConfig::from_yaml("outboundTrafficPolicy:\n  mode: SOMETIMES\n").unwrap_err();
        assert!(
            err.to_string().contains("outboundTrafficPolicy.mode"),
            "{err}"
        );
        let err = MeshConfig::from_yaml("connectTimeout: soon\n").unwrap_err();
        assert!(err.to_string().contains("connectTimeout"), "{err}");
    }
}
