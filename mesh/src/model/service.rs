//! Services and ports of the mesh model: what a client can address, with the protocol
//! Istio would infer for each port and who may see the service (`exportTo`).

use std::collections::BTreeMap;
use std::fmt;

/// Application protocol of a service port, as Istio classifies it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Protocol {
    Http,
    Http2,
    Grpc,
    GrpcWeb,
    Https,
    Tls,
    Tcp,
    Udp,
    Mongo,
    Mysql,
    Redis,
    /// Unnamed port without `appProtocol`. Istio would sniff it; Pilotfish keeps protocol
    /// sniffing off (DESIGN.md), so these ports are served as plain TCP.
    #[default]
    Unsupported,
}

impl Protocol {
    /// Istio's port-name / appProtocol vocabulary (case-insensitive). `None` when unknown.
    pub fn from_istio_name(name: &str) -> Option<Protocol> {
        Some(match name.to_ascii_lowercase().as_str() {
            "http" | "http1" => Protocol::Http,
            "http2" | "kubernetes.io/h2c" => Protocol::Http2,
            "grpc" => Protocol::Grpc,
            "grpc-web" => Protocol::GrpcWeb,
            "https" | "kubernetes.io/wss" => Protocol::Https,
            "kubernetes.io/ws" => Protocol::Http,
            "tls" => Protocol::Tls,
            "tcp" => Protocol::Tcp,
            "udp" => Protocol::Udp,
            "mongo" => Protocol::Mongo,
            "mysql" => Protocol::Mysql,
            "redis" => Protocol::Redis,
            _ => return None,
        })
    }

    /// Protocol of a Kubernetes service port, following Istio's rules: UDP ports are UDP;
    /// otherwise `appProtocol` wins; otherwise the port name's prefix before the first `-`
    /// (`http-web`, `grpc`, `tcp-db`); otherwise unsupported (plain TCP here).
    pub fn detect(
        port_name: Option<&str>,
        app_protocol: Option<&str>,
        l4: Option<&str>,
    ) -> Protocol {
        if l4.is_some_and(|p| p.eq_ignore_ascii_case("UDP")) {
            return Protocol::Udp;
        }
        if let Some(p) = app_protocol.and_then(Protocol::from_istio_name) {
            return p;
        }
        let Some(name) = port_name.filter(|n| !n.is_empty()) else {
            return Protocol::Unsupported;
        };
        // `grpc-web` contains a dash itself, so try the whole name first.
        if let Some(p) = Protocol::from_istio_name(name) {
            return p;
        }
        if name.to_ascii_lowercase().starts_with("grpc-web-") {
            return Protocol::GrpcWeb;
        }
        let prefix = name.split('-').next().unwrap_or(name);
        Protocol::from_istio_name(prefix).unwrap_or(Protocol::Unsupported)
    }

    /// Ports whose traffic is HTTP to Envoy (HTTP connection manager, route tables).
    pub fn is_http(self) -> bool {
        matches!(
            self,
            Protocol::Http | Protocol::Http2 | Protocol::Grpc | Protocol::GrpcWeb
        )
    }

    /// Ports that should use HTTP/2 towards the upstream.
    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc | Protocol::GrpcWeb)
    }

    /// Canonical spelling, as Istio prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http => "HTTP",
            Protocol::Http2 => "HTTP2",
            Protocol::Grpc => "GRPC",
            Protocol::GrpcWeb => "GRPC-Web",
            Protocol::Https => "HTTPS",
            Protocol::Tls => "TLS",
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Mongo => "Mongo",
            Protocol::Mysql => "MySQL",
            Protocol::Redis => "Redis",
            Protocol::Unsupported => "UnsupportedProtocol",
        }
    }

    /// Inverse of [`Protocol::as_str`] (used by the snapshot codec).
    pub fn from_canonical(s: &str) -> Option<Protocol> {
        ALL_PROTOCOLS.iter().copied().find(|p| p.as_str() == s)
    }
}

/// Every protocol, in declaration order.
pub const ALL_PROTOCOLS: [Protocol; 12] = [
    Protocol::Http,
    Protocol::Http2,
    Protocol::Grpc,
    Protocol::GrpcWeb,
    Protocol::Https,
    Protocol::Tls,
    Protocol::Tcp,
    Protocol::Udp,
    Protocol::Mongo,
    Protocol::Mysql,
    Protocol::Redis,
    Protocol::Unsupported,
];

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a workload's port is, relative to the service port.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TargetPort {
    Number(u32),
    /// A named container port, resolved per endpoint (EndpointSlices already carry the number).
    Name(String),
}

/// One port of a service.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServicePort {
    /// Port name; empty for an unnamed single port.
    pub name: String,
    pub port: u32,
    pub protocol: Protocol,
    pub target_port: Option<TargetPort>,
}

/// How clients reach the endpoints of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Resolution {
    /// The proxy load-balances over endpoints it gets by EDS (ClusterIP services, STATIC
    /// ServiceEntries).
    #[default]
    ClientSideLb,
    /// Traffic goes to the address the client dialled (headless services, NONE ServiceEntries).
    Passthrough,
    /// The proxy resolves the endpoints' host names by DNS (ExternalName, DNS ServiceEntries).
    Dns,
    /// DNS, connecting to one address at a time (`DNS_ROUND_ROBIN` ServiceEntries).
    DnsRoundRobin,
}

/// What a service was built from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceOrigin {
    Kubernetes,
    /// A ServiceEntry, by name (its namespace is the service's namespace).
    ServiceEntry {
        name: String,
    },
}

/// Namespaces a service is exported to (Istio `exportTo`), stored as written (`*`, `.`,
/// `~` or namespace names; empty: the mesh default). Read only by
/// `push_context::visibility`, which applies Istio's rules and the mesh default.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ExportTo(pub Vec<String>);

/// A service of the mesh: Kubernetes Service or one host of a ServiceEntry.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Service {
    /// Fully qualified host name: `<name>.<ns>.svc.<domain>` or a ServiceEntry host
    /// (which may be a wildcard like `*.example.com`).
    pub hostname: String,
    /// Kubernetes Service name, or the ServiceEntry's name.
    pub name: String,
    pub namespace: String,
    /// Virtual IPs or CIDRs (ClusterIP, ServiceEntry `addresses`). Empty for headless.
    pub addresses: Vec<String>,
    pub ports: Vec<ServicePort>,
    pub labels: BTreeMap<String, String>,
    /// Which workloads back the service (Kubernetes selector, ServiceEntry workloadSelector).
    pub selector: BTreeMap<String, String>,
    pub export_to: ExportTo,
    pub resolution: Resolution,
    pub origin: ServiceOrigin,
    /// True for `MESH_EXTERNAL` ServiceEntries and ExternalName services.
    pub mesh_external: bool,
    /// Target of an ExternalName service; DNS-resolved by the proxy.
    pub external_name: Option<String>,
    /// Creation time (ms since epoch) for Istio's "oldest wins" tie-breaks.
    pub creation_ms: i64,
    /// ServiceEntry `subjectAltNames`: identities the host's servers may present, verified
    /// (with its endpoints' service accounts) where Istio verifies them.
    pub subject_alt_names: Vec<String>,
    /// Whether EDS sends this service's unready (not terminating) endpoints, marked
    /// `UNHEALTHY`, with the panic threshold off (Istio's `SupportsUnhealthyEndpoints`):
    /// when the Service asks for a traffic distribution (zone-aware routing must know
    /// how many endpoints are healthy to spill over) or the send-unhealthy option is on.
    pub send_unhealthy_endpoints: bool,
}

impl Service {
    pub fn port(&self, number: u32) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.port == number)
    }

    pub fn port_by_name(&self, name: &str) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.name == name)
    }

    /// Whether `hostname` is a wildcard host (`*.example.com`).
    pub fn is_wildcard(&self) -> bool {
        self.hostname.starts_with('*')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_from_port_name_prefix() {
        assert_eq!(
            Protocol::detect(Some("http-web"), None, None),
            Protocol::Http
        );
        assert_eq!(Protocol::detect(Some("http2"), None, None), Protocol::Http2);
        assert_eq!(Protocol::detect(Some("grpc"), None, None), Protocol::Grpc);
        assert_eq!(
            Protocol::detect(Some("grpc-web"), None, None),
            Protocol::GrpcWeb
        );
        assert_eq!(
            Protocol::detect(Some("grpc-web-x"), None, None),
            Protocol::GrpcWeb
        );
        assert_eq!(Protocol::detect(Some("grpc-x"), None, None), Protocol::Grpc);
        assert_eq!(Protocol::detect(Some("tcp-db"), None, None), Protocol::Tcp);
        assert_eq!(Protocol::detect(Some("HTTPS"), None, None), Protocol::Https);
        assert_eq!(Protocol::detect(Some("mongo"), None, None), Protocol::Mongo);
        assert_eq!(
            Protocol::detect(Some("web"), None, None),
            Protocol::Unsupported
        );
        assert_eq!(Protocol::detect(None, None, None), Protocol::Unsupported);
        assert_eq!(
            Protocol::detect(Some("httpx"), None, None),
            Protocol::Unsupported
        );
    }

    #[test]
    fn app_protocol_wins_over_name_and_udp_wins_over_all() {
        assert_eq!(
            Protocol::detect(Some("tcp"), Some("grpc"), None),
            Protocol::Grpc
        );
        assert_eq!(
            Protocol::detect(Some("web"), Some("kubernetes.io/h2c"), None),
            Protocol::Http2
        );
        assert_eq!(
            Protocol::detect(Some("web"), Some("kubernetes.io/ws"), None),
            Protocol::Http
        );
        // An appProtocol Istio does not know falls back to the name.
        assert_eq!(
            Protocol::detect(Some("http"), Some("example.com/x"), None),
            Protocol::Http
        );
        assert_eq!(
            Protocol::detect(Some("http"), Some("http"), Some("UDP")),
            Protocol::Udp
        );
    }

    #[test]
    fn canonical_names_round_trip() {
        for p in ALL_PROTOCOLS {
            assert_eq!(Protocol::from_canonical(p.as_str()), Some(p));
        }
    }
}
