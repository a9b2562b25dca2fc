//! Identity of a connected proxy (an Envoy sidecar or a proxyless gRPC client), as the
//! xDS generators need it: namespace, labels, IP and which flavour of output it takes.
//!
//! Parsing an xDS `Node` into a [`Proxy`] lives in the xDS server; this type only says
//! what a proxy *is*, so generators stay pure functions of (PushContext, Proxy, names).

use std::collections::BTreeMap;
use std::net::IpAddr;

/// Which family of xDS output a proxy receives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum ProxyGenerator {
    /// Envoy sidecar: listeners 15001/15006, per-port listeners and route configs.
    #[default]
    Envoy,
    /// Proxyless gRPC (`GENERATOR=grpc` in node metadata, or a gRPC client):
    /// `api_listener` per `<fqdn>:<port>`, only features gRPC's xDS client supports.
    Grpc,
}

/// Role of an Envoy proxy, from the first field of an Istio node id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum ProxyType {
    #[default]
    Sidecar,
    /// `router~...`: a gateway. Gateways are not served yet; the type is kept so
    /// gateway-only VirtualServices can be told apart.
    Router,
}

/// A connected proxy. Built once per stream from the first request's node.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Proxy {
    /// Node id exactly as sent by the client.
    pub id: String,
    pub proxy_type: ProxyType,
    pub generator: ProxyGenerator,
    /// Workload IPs (first one is the primary). Empty when the node id carries none.
    pub ips: Vec<IpAddr>,
    /// Pod name (`<pod>` of `<pod>.<ns>`), when known.
    pub pod_name: Option<String>,
    /// Namespace of the workload; `default` when the node does not say.
    pub namespace: String,
    /// DNS domain of the proxy, e.g. `default.svc.cluster.local`.
    pub dns_domain: Option<String>,
    /// Workload labels (node metadata `LABELS`): DestinationRule `workloadSelector`,
    /// VirtualService `sourceLabels` and inbound listeners use them.
    pub labels: BTreeMap<String, String>,
    /// Node metadata `CLUSTER_ID`.
    pub cluster_id: Option<String>,
    /// Istio version the proxy reports (`ISTIO_VERSION`), for debug pages only.
    pub istio_version: Option<String>,
    /// Where the proxy runs (the node's `locality`), for locality-aware load balancing.
    /// When the node does not say, the generators use the locality of its own endpoint.
    pub locality: Option<super::Locality>,
    /// Node metadata `SERVICE_ACCOUNT`: when set, an authenticated stream's identity must
    /// name this service account (as Istio checks).
    pub service_account: Option<String>,
    /// The identity the stream authenticated as (token or client certificate) and that
    /// matched this node's namespace; `None` on the plaintext port. Istio's
    /// `VerifiedIdentity`.
    pub verified_identity: Option<super::SpiffeId>,
}

impl Proxy {
    /// A proxy in `namespace` with no further identity, as used for nodes whose id does
    /// not follow Istio's conventions.
    pub fn with_defaults(id: impl Into<String>) -> Self {
        Proxy {
            id: id.into(),
            namespace: "default".to_string(),
            ..Proxy::default()
        }
    }

    pub fn is_proxyless(&self) -> bool {
        self.generator == ProxyGenerator::Grpc
    }
}
