//! Auto mutual TLS for sidecars, as Istio's `enableAutoMtls` (on by default): a cluster
//! whose DestinationRule says nothing about TLS originates Istio mutual TLS to the
//! endpoints that run a sidecar and plaintext to the rest, without anyone writing
//! `ISTIO_MUTUAL`. Envoy tells the two apart per endpoint: EDS marks an endpoint whose
//! workload carries `security.istio.io/tlsMode` with that mode in the
//! `envoy.transport_socket_match` metadata ([`endpoint_metadata`]), and the cluster's
//! `transport_socket_matches` pick mTLS for `tlsMode: istio`, plaintext otherwise.
//!
//! Istio's rules ([`decide`]): never for mesh-external services, nor when the service's
//! namespace (or the mesh) PeerAuthentication is `DISABLE`; a passthrough service (headless,
//! or `loadBalancer.simple: PASSTHROUGH`) gets mTLS only when every endpoint runs a
//! sidecar, and then as the cluster's one transport socket (Envoy cannot match endpoint
//! metadata for an `ORIGINAL_DST` cluster). Proxyless gRPC reads only `transport_socket`,
//! so it gets no auto mTLS (as in Istio).

use envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch;
use envoy_types::pb::envoy::config::core::v3::{Metadata, TransportSocket, transport_socket};
use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use pilotfish_mesh::api::{MtlsMode, SimpleLb};
use pilotfish_mesh::model::{Endpoint, Resolution, Service};
use pilotfish_mesh::push_context::PushContext;

use super::plan::{ClusterPlan, Discovery};
use super::util::any;

pub use super::names::{TLS_MODE_ISTIO, TLS_MODE_LABEL};
/// The endpoint metadata namespace Envoy matches `transport_socket_matches` against.
pub const TRANSPORT_SOCKET_MATCH_KEY: &str = "envoy.transport_socket_match";
/// The key of the mode in that metadata (Istio's short name of the label).
const TLS_MODE_KEY: &str = "tlsMode";
const RAW_BUFFER: &str = "envoy.transport_sockets.raw_buffer";

/// How a cluster without DestinationRule TLS reaches its endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AutoMtls {
    /// Plaintext (the cluster's transport socket stays unset).
    Off,
    /// Mutual TLS to endpoints marked `tlsMode: istio`, plaintext to the others.
    ByEndpoint,
    /// Mutual TLS to every endpoint (a passthrough service whose endpoints all run a
    /// sidecar).
    Always,
}

/// Istio's decision for a sidecar's cluster that has no DestinationRule TLS settings.
pub fn decide(push: &PushContext, plan: &ClusterPlan) -> AutoMtls {
    let service = &plan.service;
    if !push.mesh().enable_auto_mtls || service.mesh_external {
        return AutoMtls::Off;
    }
    let passthrough = service.resolution == Resolution::Passthrough
        || plan.policy.load_balancer.as_ref().and_then(|lb| lb.simple)
            == Some(SimpleLb::Passthrough);
    if passthrough && !all_run_sidecars(push, service, plan.port.port) {
        return AutoMtls::Off;
    }
    if push.namespace_mtls_mode(&service.namespace) == MtlsMode::Disable {
        return AutoMtls::Off;
    }
    if plan.discovery == Discovery::OriginalDst {
        AutoMtls::Always
    } else {
        AutoMtls::ByEndpoint
    }
}

/// Whether `service` has endpoints on `port` and every one of them (any subset, any
/// health: Istio's `ServiceEndpointsByPort`) runs a sidecar — what a passthrough service
/// needs for auto mTLS. Its endpoints therefore shape its cluster: see
/// `snapshot::change_kind`.
pub fn all_run_sidecars(push: &PushContext, service: &Service, port: u32) -> bool {
    push.endpoints(service)
        .and_then(|e| e.port(port))
        .is_some_and(|p| !p.endpoints.is_empty() && p.endpoints.iter().all(runs_sidecar))
}

/// Whether an endpoint's workload runs a sidecar that takes mutual TLS.
fn runs_sidecar(e: &Endpoint) -> bool {
    e.labels.get(TLS_MODE_LABEL).map(String::as_str) == Some(TLS_MODE_ISTIO)
}

/// The cluster's `transport_socket_matches` for [`AutoMtls::ByEndpoint`]: `mtls` for
/// endpoints marked `tlsMode: istio`, plaintext for every other endpoint (Istio's
/// `tlsMode-istio` and `tlsMode-disabled` entries).
pub fn socket_matches(mtls: TransportSocket) -> Vec<TransportSocketMatch> {
    vec![
        TransportSocketMatch {
            name: format!("tlsMode-{TLS_MODE_ISTIO}"),
            r#match: Some(string_struct(TLS_MODE_KEY, TLS_MODE_ISTIO)),
            transport_socket: Some(mtls),
        },
        TransportSocketMatch {
            name: "tlsMode-disabled".to_string(),
            r#match: Some(Struct::default()),
            transport_socket: Some(TransportSocket {
                name: RAW_BUFFER.to_string(),
                config_type: Some(transport_socket::ConfigType::TypedConfig(any(
                    &RawBuffer::default(),
                ))),
            }),
        },
    ]
}

/// An endpoint's metadata for transport socket matching: its workload's
/// `security.istio.io/tlsMode`, unless unset or `disabled` (as Istio sends it, for every
/// client: gRPC ignores it).
pub fn endpoint_metadata(e: &Endpoint) -> Option<Metadata> {
    let mode = e.labels.get(TLS_MODE_LABEL)?;
    if mode.is_empty() || mode == "disabled" {
        return None;
    }
    Some(Metadata {
        filter_metadata: [(
            TRANSPORT_SOCKET_MATCH_KEY.to_string(),
            string_struct(TLS_MODE_KEY, mode),
        )]
        .into(),
        ..Default::default()
    })
}

fn string_struct(key: &str, value: &str) -> Struct {
    Struct {
        fields: [(
            key.to_string(),
            Value {
                kind: Some(Kind::StringValue(value.to_string())),
            },
        )]
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::document::{parse_text, to_inputs};
    use pilotfish_mesh::mesh_config::MeshConfig;
    use pilotfish_mesh::model::Proxy;
    use pilotfish_mesh::push_context::{BuildInputs, build};

    use crate::generate::plan::outbound_plan;
    use crate::generate::scope::Flavor;

    const MESH: &str = "\
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  clusterIP: 10.96.0.1
  selector: {app: web}
  ports: [{name: http, port: 80}]
---
apiVersion: v1
kind: Pod
metadata: {name: web-1, namespace: shop, labels: {app: web, security.istio.io/tlsMode: istio}}
spec: {serviceAccountName: web}
status:
  podIPs: [{ip: 10.1.0.1}]
  conditions: [{type: Ready, status: 'True'}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 80, protocol: TCP}]
endpoints:
- addresses: [10.1.0.1]
  targetRef: {kind: Pod, namespace: shop, name: web-1}
";

    fn web_decision(mesh: MeshConfig) -> AutoMtls {
        let parsed = parse_text(std::path::Path::new("t.yaml"), MESH);
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        let inputs = to_inputs(
            &parsed.objects,
            BuildInputs {
                cluster_domain: "cluster.local".into(),
                mesh,
                ..Default::default()
            },
        );
        let push = build(&inputs, None).context;
        let proxy = Proxy {
            namespace: "shop".into(),
            ..Proxy::with_defaults("p")
        };
        let sidecar = std::sync::Arc::new(push.sidecar_scope(None, "shop"));
        let plan = outbound_plan(&push, &proxy, sidecar, Flavor::Sidecar, &mut Vec::new());
        let web = plan
            .clusters()
            .iter()
            .find(|c| c.service.name == "web")
            .expect("web's cluster");
        decide(&push, web)
    }

    #[test]
    fn on_by_default_and_off_when_the_mesh_config_says_so() {
        assert_eq!(web_decision(MeshConfig::default()), AutoMtls::ByEndpoint);
        let off = MeshConfig {
            enable_auto_mtls: false,
            ..MeshConfig::default()
        };
        assert_eq!(web_decision(off), AutoMtls::Off);
    }

    #[test]
    fn only_an_endpoint_with_a_sidecar_is_marked() {
        let endpoint = |mode: Option<&str>| Endpoint {
            address: "10.0.0.1".into(),
            port: 80,
            labels: mode
                .map(|m| [(TLS_MODE_LABEL.to_string(), m.to_string())].into())
                .unwrap_or_default(),
            locality: Default::default(),
            health: Default::default(),
            service_account: None,
            weight: None,
            network: String::new(),
            workload: None,
        };
        let marked = endpoint_metadata(&endpoint(Some("istio"))).expect("marked");
        let m = &marked.filter_metadata[TRANSPORT_SOCKET_MATCH_KEY];
        // The cluster's `tlsMode-istio` match selects exactly this metadata.
        let matches = socket_matches(TransportSocket::default());
        assert_eq!(matches[0].r#match.as_ref(), Some(m));
        assert_eq!(matches[1].r#match, Some(Struct::default()));
        assert!(endpoint_metadata(&endpoint(Some("disabled"))).is_none());
        assert!(endpoint_metadata(&endpoint(None)).is_none());
    }
}
