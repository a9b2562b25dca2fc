//! Conversions between the mesh model and the snapshot protobuf messages. Pure and total
//! in the model → protobuf direction; the other direction maps values a newer writer may
//! have added (unknown enum numbers) to safe defaults instead of failing.

use std::time::Duration;

use super::pb;
use crate::mesh_config::{MeshConfig, OutboundTrafficPolicy};
use crate::model::{
    Endpoint, EndpointHealth, ExportTo, Locality, PortEndpoints, Protocol, Resolution, Service,
    ServiceEndpoints, ServiceOrigin, ServicePort, TargetPort,
};
use crate::push_context::{
    AuthorizationPolicyConfig, ConfigMeta, DestinationRuleConfig, JwksOutcome, JwksSource,
    PeerAuthenticationConfig, PushContext, SidecarConfig, VirtualServiceConfig,
};

pub fn mesh_to_pb(m: &MeshConfig) -> pb::MeshSettings {
    pb::MeshSettings {
        root_namespace: m.root_namespace.clone(),
        outbound_traffic_policy: match m.outbound_traffic_policy {
            OutboundTrafficPolicy::AllowAny => pb::OutboundTrafficPolicy::AllowAny,
            OutboundTrafficPolicy::RegistryOnly => pb::OutboundTrafficPolicy::RegistryOnly,
        } as i32,
        default_service_export_to: m.default_service_export_to.clone(),
        default_virtual_service_export_to: m.default_virtual_service_export_to.clone(),
        default_destination_rule_export_to: m.default_destination_rule_export_to.clone(),
        connect_timeout_ms: u64::try_from(m.connect_timeout.as_millis()).unwrap_or(u64::MAX),
        trust_domain: m.trust_domain.clone(),
        disable_auto_mtls: !m.enable_auto_mtls,
    }
}

pub fn mesh_from_pb(m: pb::MeshSettings) -> MeshConfig {
    MeshConfig {
        root_namespace: m.root_namespace,
        outbound_traffic_policy: match pb::OutboundTrafficPolicy::try_from(
            m.outbound_traffic_policy,
        ) {
            Ok(pb::OutboundTrafficPolicy::RegistryOnly) => OutboundTrafficPolicy::RegistryOnly,
            _ => OutboundTrafficPolicy::AllowAny,
        },
        default_service_export_to: m.default_service_export_to,
        default_virtual_service_export_to: m.default_virtual_service_export_to,
        default_destination_rule_export_to: m.default_destination_rule_export_to,
        connect_timeout: Duration::from_millis(m.connect_timeout_ms),
        trust_domain: m.trust_domain,
        enable_auto_mtls: !m.disable_auto_mtls,
        // The controller's namespace filter: objects of unselected namespaces never reach
        // a snapshot, so replicas need no selectors.
        discovery_selectors: Vec::new(),
    }
}

pub(super) fn protocol_to_pb(p: Protocol) -> pb::Protocol {
    match p {
        Protocol::Http => pb::Protocol::Http,
        Protocol::Http2 => pb::Protocol::Http2,
        Protocol::Grpc => pb::Protocol::Grpc,
        Protocol::GrpcWeb => pb::Protocol::GrpcWeb,
        Protocol::Https => pb::Protocol::Https,
        Protocol::Tls => pb::Protocol::Tls,
        Protocol::Tcp => pb::Protocol::Tcp,
        Protocol::Udp => pb::Protocol::Udp,
        Protocol::Mongo => pb::Protocol::Mongo,
        Protocol::Mysql => pb::Protocol::Mysql,
        Protocol::Redis => pb::Protocol::Redis,
        Protocol::Unsupported => pb::Protocol::Unsupported,
    }
}

fn protocol_from_pb(p: i32) -> Protocol {
    match pb::Protocol::try_from(p) {
        Ok(pb::Protocol::Http) => Protocol::Http,
        Ok(pb::Protocol::Http2) => Protocol::Http2,
        Ok(pb::Protocol::Grpc) => Protocol::Grpc,
        Ok(pb::Protocol::GrpcWeb) => Protocol::GrpcWeb,
        Ok(pb::Protocol::Https) => Protocol::Https,
        Ok(pb::Protocol::Tls) => Protocol::Tls,
        Ok(pb::Protocol::Tcp) => Protocol::Tcp,
        Ok(pb::Protocol::Udp) => Protocol::Udp,
        Ok(pb::Protocol::Mongo) => Protocol::Mongo,
        Ok(pb::Protocol::Mysql) => Protocol::Mysql,
        Ok(pb::Protocol::Redis) => Protocol::Redis,
        // A protocol added by a newer writer is served as plain TCP, the safe default.
        Ok(pb::Protocol::Unsupported) | Err(_) => Protocol::Unsupported,
    }
}

pub fn service_to_pb(s: &Service) -> pb::Service {
    pb::Service {
        hostname: s.hostname.clone(),
        name: s.name.clone(),
        namespace: s.namespace.clone(),
        addresses: s.addresses.clone(),
        ports: s
            .ports
            .iter()
            .map(|p| pb::ServicePort {
                name: p.name.clone(),
                port: p.port,
                protocol: protocol_to_pb(p.protocol) as i32,
                target_port: p.target_port.as_ref().map(|t| match t {
                    TargetPort::Number(n) => pb::service_port::TargetPort::TargetNumber(*n),
                    TargetPort::Name(n) => pb::service_port::TargetPort::TargetName(n.clone()),
                }),
            })
            .collect(),
        labels: s.labels.clone(),
        selector: s.selector.clone(),
        export_to: s.export_to.0.clone(),
        resolution: match s.resolution {
            Resolution::ClientSideLb => pb::Resolution::ClientSideLb,
            Resolution::Passthrough => pb::Resolution::Passthrough,
            Resolution::Dns => pb::Resolution::Dns,
            Resolution::DnsRoundRobin => pb::Resolution::DnsRoundRobin,
        } as i32,
        service_entry: match &s.origin {
            ServiceOrigin::Kubernetes => String::new(),
            ServiceOrigin::ServiceEntry { name } => name.clone(),
        },
        mesh_external: s.mesh_external,
        external_name: s.external_name.clone().unwrap_or_default(),
        creation_ms: s.creation_ms,
        subject_alt_names: s.subject_alt_names.clone(),
        send_unhealthy_endpoints: s.send_unhealthy_endpoints,
    }
}

pub fn service_from_pb(s: pb::Service) -> Service {
    Service {
        hostname: s.hostname,
        name: s.name,
        namespace: s.namespace,
        addresses: s.addresses,
        ports: s
            .ports
            .into_iter()
            .map(|p| ServicePort {
                name: p.name,
                port: p.port,
                protocol: protocol_from_pb(p.protocol),
                target_port: p.target_port.map(|t| match t {
                    pb::service_port::TargetPort::TargetNumber(n) => TargetPort::Number(n),
                    pb::service_port::TargetPort::TargetName(n) => TargetPort::Name(n),
                }),
            })
            .collect(),
        labels: s.labels,
        selector: s.selector,
        export_to: ExportTo(s.export_to),
        resolution: match pb::Resolution::try_from(s.resolution) {
            Ok(pb::Resolution::Passthrough) => Resolution::Passthrough,
            Ok(pb::Resolution::Dns) => Resolution::Dns,
            Ok(pb::Resolution::DnsRoundRobin) => Resolution::DnsRoundRobin,
            Ok(pb::Resolution::ClientSideLb) | Err(_) => Resolution::ClientSideLb,
        },
        origin: if s.service_entry.is_empty() {
            ServiceOrigin::Kubernetes
        } else {
            ServiceOrigin::ServiceEntry {
                name: s.service_entry,
            }
        },
        mesh_external: s.mesh_external,
        external_name: Some(s.external_name).filter(|n| !n.is_empty()),
        creation_ms: s.creation_ms,
        subject_alt_names: s.subject_alt_names,
        send_unhealthy_endpoints: s.send_unhealthy_endpoints,
    }
}

fn endpoint_to_pb(e: &Endpoint) -> pb::Endpoint {
    pb::Endpoint {
        address: e.address.clone(),
        port: e.port,
        labels: e.labels.clone(),
        region: e.locality.region.clone(),
        zone: e.locality.zone.clone(),
        subzone: e.locality.subzone.clone(),
        health: match e.health {
            EndpointHealth::Healthy => pb::Health::Healthy,
            EndpointHealth::Unhealthy => pb::Health::Unhealthy,
            EndpointHealth::Terminating => pb::Health::Terminating,
        } as i32,
        service_account: e.service_account.clone().unwrap_or_default(),
        weight: e.weight,
        network: e.network.clone(),
        workload: e.workload.clone().unwrap_or_default(),
    }
}

fn endpoint_from_pb(e: pb::Endpoint) -> Endpoint {
    Endpoint {
        address: e.address,
        port: e.port,
        labels: e.labels,
        locality: Locality {
            region: e.region,
            zone: e.zone,
            subzone: e.subzone,
        },
        health: match pb::Health::try_from(e.health) {
            Ok(pb::Health::Healthy) => EndpointHealth::Healthy,
            Ok(pb::Health::Terminating) => EndpointHealth::Terminating,
            // Unknown health from a newer writer: do not send traffic.
            Ok(pb::Health::Unhealthy) | Err(_) => EndpointHealth::Unhealthy,
        },
        service_account: Some(e.service_account).filter(|s| !s.is_empty()),
        weight: e.weight,
        network: e.network,
        workload: Some(e.workload).filter(|w| !w.is_empty()),
    }
}

pub fn endpoints_to_pb(e: &ServiceEndpoints) -> pb::ServiceEndpoints {
    pb::ServiceEndpoints {
        hostname: e.hostname.clone(),
        namespace: e.namespace.clone(),
        ports: e
            .ports
            .iter()
            .map(|p| pb::PortEndpoints {
                service_port: p.service_port,
                endpoints: p.endpoints.iter().map(endpoint_to_pb).collect(),
            })
            .collect(),
    }
}

pub fn endpoints_from_pb(e: pb::ServiceEndpoints) -> ServiceEndpoints {
    ServiceEndpoints {
        hostname: e.hostname,
        namespace: e.namespace,
        ports: e
            .ports
            .into_iter()
            .map(|p| PortEndpoints {
                service_port: p.service_port,
                endpoints: p.endpoints.into_iter().map(endpoint_from_pb).collect(),
            })
            .collect(),
    }
}

/// The configs of a snapshot as protobuf messages, in their encoding order.
pub fn configs_to_pb(ctx: &PushContext) -> Vec<pb::Config> {
    let data = ctx.data();
    let mut configs: Vec<pb::Config> = data
        .virtual_services
        .iter()
        .map(|vs| config_to_pb_vs(vs))
        .chain(data.destination_rules.iter().map(|dr| config_to_pb_dr(dr)))
        .chain(
            data.peer_authentications
                .iter()
                .map(|pa| config_to_pb_pa(pa)),
        )
        .chain(data.sidecars.iter().map(|sc| config_to_pb_sidecar(sc)))
        .chain(
            data.request_authentications
                .iter()
                .map(|ra| config_to_pb(pb::Kind::RequestAuthentication, &ra.meta, &ra.spec)),
        )
        .chain(
            data.authorization_policies
                .iter()
                .map(|ap| config_to_pb_ap(ap)),
        )
        .collect();
    configs.sort_by(|a, b| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)));
    configs
}

pub fn config_to_pb_vs(vs: &VirtualServiceConfig) -> pb::Config {
    config_to_pb(pb::Kind::VirtualService, &vs.meta, &vs.spec)
}

pub fn config_to_pb_dr(dr: &DestinationRuleConfig) -> pb::Config {
    config_to_pb(pb::Kind::DestinationRule, &dr.meta, &dr.spec)
}

pub fn config_to_pb_sidecar(sc: &SidecarConfig) -> pb::Config {
    config_to_pb(pb::Kind::Sidecar, &sc.meta, &sc.spec)
}

/// The resolved key sets, in their encoding order (the map's: issuer, then URI).
pub fn jwks_to_pb(ctx: &PushContext) -> Vec<pb::Jwks> {
    ctx.jwks()
        .iter()
        .map(|(source, outcome)| pb::Jwks {
            issuer: source.issuer.clone(),
            jwks_uri: source.jwks_uri.clone(),
            outcome: Some(match outcome {
                JwksOutcome::Keys(keys) => pb::jwks::Outcome::Keys(keys.clone()),
                JwksOutcome::Failed(error) => pb::jwks::Outcome::Error(error.clone()),
            }),
        })
        .collect()
}

pub fn jwks_from_pb(j: pb::Jwks) -> (JwksSource, JwksOutcome) {
    let outcome = match j.outcome {
        Some(pb::jwks::Outcome::Keys(keys)) => JwksOutcome::Keys(keys),
        Some(pb::jwks::Outcome::Error(error)) => JwksOutcome::Failed(error),
        None => JwksOutcome::Failed("no outcome recorded".into()),
    };
    (
        JwksSource {
            issuer: j.issuer,
            jwks_uri: j.jwks_uri,
        },
        outcome,
    )
}

pub fn config_to_pb_ap(ap: &AuthorizationPolicyConfig) -> pb::Config {
    config_to_pb(pb::Kind::AuthorizationPolicy, &ap.meta, &ap.spec)
}

pub fn config_to_pb_pa(pa: &PeerAuthenticationConfig) -> pb::Config {
    config_to_pb(pb::Kind::PeerAuthentication, &pa.meta, &pa.spec)
}

fn config_to_pb<T: serde::Serialize>(kind: pb::Kind, meta: &ConfigMeta, spec: &T) -> pb::Config {
    pb::Config {
        kind: kind as i32,
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
        creation_ms: meta.creation_ms,
        generation: meta.generation,
        // Serializing plain serde structs with BTreeMaps cannot fail and is deterministic.
        spec_json: serde_json::to_vec(spec).unwrap_or_default(),
    }
}
