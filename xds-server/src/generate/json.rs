//! Envoy resources as proto JSON (snake_case field names, as Envoy's own config dump
//! prints them) for golden files and `config_dump`.
//!
//! envoy-types has no JSON mapping, so messages are re-read through `prost-reflect` with
//! the embedded Envoy descriptor set ([`super::descriptors`]). Nested `Any`s print with
//! their `@type`, as long as their type is in the set.

use envoy_types::pb::envoy::admin::v3::{
    ClustersConfigDump, ConfigDump, EndpointsConfigDump, ListenersConfigDump, RoutesConfigDump,
    clusters_config_dump::DynamicCluster,
    endpoints_config_dump::DynamicEndpointConfig,
    listeners_config_dump::{DynamicListener, DynamicListenerState},
    routes_config_dump::DynamicRouteConfig,
};
use envoy_types::pb::google::protobuf::Any;
use pilotfish_mesh::model::Proxy;
use prost_reflect::{DynamicMessage, SerializeOptions};

use super::descriptors::pool;
use super::snapshot::GeneratedSnapshot;
use super::util::any;
use crate::ads::{Resource, XdsType};

/// Why a message could not be printed.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("the embedded Envoy descriptor set is unreadable: {0}")]
    Descriptors(String),
    #[error(
        "type {0} is not in the embedded Envoy descriptor set (add its file to scripts/envoy_descriptors.py)"
    )]
    UnknownType(String),
    #[error("{type_name} does not decode: {reason}")]
    Decode { type_name: String, reason: String },
}

/// An encoded message of `type_url` as proto JSON.
pub fn to_json(type_url: &str, bytes: &[u8]) -> Result<serde_json::Value, JsonError> {
    let pool = pool().map_err(|e| JsonError::Descriptors(e.to_string()))?;
    let type_name = type_url.rsplit('/').next().unwrap_or(type_url);
    let descriptor = pool
        .get_message_by_name(type_name)
        .ok_or_else(|| JsonError::UnknownType(type_name.to_string()))?;
    let message = DynamicMessage::decode(descriptor, bytes).map_err(|e| JsonError::Decode {
        type_name: type_name.to_string(),
        reason: e.to_string(),
    })?;
    let options = SerializeOptions::new().use_proto_field_name(true);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .map_err(|e| JsonError::Decode {
            type_name: type_name.to_string(),
            reason: e.to_string(),
        })
}

/// A generated resource as proto JSON.
pub fn resource_json(resource: &Resource) -> Result<serde_json::Value, JsonError> {
    to_json(&resource.body.type_url, &resource.body.value)
}

/// Every resource of `kind` for `proxy` as a JSON array, sorted by name.
pub fn resources_json(
    snapshot: &GeneratedSnapshot,
    proxy: &Proxy,
    kind: XdsType,
) -> Result<serde_json::Value, JsonError> {
    snapshot
        .all(proxy, kind)
        .values()
        .map(|r| resource_json(r))
        .collect::<Result<Vec<_>, _>>()
        .map(serde_json::Value::Array)
}

fn envoy_any(r: &Resource) -> Any {
    Any {
        type_url: r.body.type_url.clone(),
        value: r.body.value.clone(),
    }
}

/// What `proxy` would receive from this snapshot, in the shape of Envoy's
/// `/config_dump` (clusters, listeners, routes, endpoints; `version_info` is each
/// resource's content hash). Proxyless clients are shown every resource they could ask for.
pub fn config_dump(
    snapshot: &GeneratedSnapshot,
    proxy: &Proxy,
) -> Result<serde_json::Value, JsonError> {
    let clusters = ClustersConfigDump {
        dynamic_active_clusters: snapshot
            .all(proxy, XdsType::Cluster)
            .values()
            .map(|r| DynamicCluster {
                version_info: r.version.clone(),
                cluster: Some(envoy_any(r)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let listeners = ListenersConfigDump {
        dynamic_listeners: snapshot
            .all(proxy, XdsType::Listener)
            .values()
            .map(|r| DynamicListener {
                name: r.name.clone(),
                active_state: Some(DynamicListenerState {
                    version_info: r.version.clone(),
                    listener: Some(envoy_any(r)),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let routes = RoutesConfigDump {
        dynamic_route_configs: snapshot
            .all(proxy, XdsType::Route)
            .values()
            .map(|r| DynamicRouteConfig {
                version_info: r.version.clone(),
                route_config: Some(envoy_any(r)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let endpoints = EndpointsConfigDump {
        dynamic_endpoint_configs: snapshot
            .all(proxy, XdsType::Endpoint)
            .values()
            .map(|r| DynamicEndpointConfig {
                version_info: r.version.clone(),
                endpoint_config: Some(envoy_any(r)),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let dump = ConfigDump {
        configs: vec![
            any(&clusters),
            any(&listeners),
            any(&routes),
            any(&endpoints),
        ],
    };
    let a = any(&dump);
    to_json(&a.type_url, &a.value)
}
