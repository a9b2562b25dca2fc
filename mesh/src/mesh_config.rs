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

const KNOWN_FIELDS: [&str; 8] = [
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
