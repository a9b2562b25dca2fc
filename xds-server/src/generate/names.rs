//! Resource names, as Istio spells them (DESIGN.md "xDS conventions"): clusters
//! `outbound|<port>|<subset>|<fqdn>` and `inbound|<port>||`, sidecar listeners
//! `virtualOutbound`, `virtualInbound`, `0.0.0.0_<port>` and `<ip>_<port>`, the catch-all
//! route config of a port named by the port, a service's own route config and proxyless
//! listeners `<fqdn>:<port>`, proxyless servers' listeners
//! `xds.istio.io/grpc/lds/inbound/<ip>:<port>`; the workload label of mutual TLS; and the
//! virtual host domains Istio lists for a service.

use pilotfish_mesh::model::Service;

pub const PASSTHROUGH_CLUSTER: &str = "PassthroughCluster";
pub const BLACKHOLE_CLUSTER: &str = "BlackHoleCluster";
pub const INBOUND_PASSTHROUGH_CLUSTER: &str = "InboundPassthroughCluster";
pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
pub const VIRTUAL_OUTBOUND_PORT: u32 = 15001;
pub const VIRTUAL_INBOUND_PORT: u32 = 15006;
/// The prefix of the listener a proxyless gRPC server asks for: Istio's bootstrap sets
/// `server_listener_resource_name_template` to this followed by `%s`, which gRPC replaces
/// with the `<ip>:<port>` the server binds.
pub const SERVER_LISTENER_PREFIX: &str = "xds.istio.io/grpc/lds/inbound/";
/// The workload label (set by Istio's injector) saying how the workload takes inbound
/// traffic; `istio` means mutual TLS (a sidecar's, or a proxyless server's).
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";
/// The value of [`TLS_MODE_LABEL`] for workloads taking mutual TLS.
pub const TLS_MODE_ISTIO: &str = "istio";

/// `outbound|<port>|<subset>|<fqdn>` (empty subset for the whole service).
pub fn outbound_cluster(port: u32, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

/// `inbound|<port>||`: the sidecar's own workload port.
pub fn inbound_cluster(port: u32) -> String {
    format!("inbound|{port}||")
}

/// The parts of an outbound cluster name: (port, subset, host).
pub fn parse_outbound_cluster(name: &str) -> Option<(u32, &str, &str)> {
    let rest = name.strip_prefix("outbound|")?;
    let mut parts = rest.splitn(3, '|');
    let port = parts.next()?.parse().ok()?;
    let subset = parts.next()?;
    let host = parts.next()?;
    Some((port, subset, host))
}

/// `0.0.0.0_<port>`: a sidecar's outbound listener for one port.
pub fn outbound_listener(port: u32) -> String {
    format!("0.0.0.0_{port}")
}

/// `<ip>_<port>`: a sidecar's outbound listener for one virtual IP of a service (Istio's
/// name: the bind address as written, IPv6 without brackets).
pub fn vip_listener(ip: &str, port: u32) -> String {
    format!("{ip}_{port}")
}

/// The name of a sidecar's catch-all route configuration for an outbound HTTP port.
pub fn sidecar_route(port: u32) -> String {
    port.to_string()
}

/// `<fqdn>:<port>`: a proxyless client's listener and route configuration, and a sidecar's
/// route configuration for a service with listeners of its own.
pub fn host_port(host: &str, port: u32) -> String {
    format!("{host}:{port}")
}

/// Splits the `<host>:<port>` of a proxyless server's listener name (IPv6 hosts in
/// brackets, returned without them), as Go's `net.SplitHostPort` reads it.
pub fn parse_server_listener(name: &str) -> Option<(&str, u32)> {
    let address = name.strip_prefix(SERVER_LISTENER_PREFIX)?;
    let (host, port) = address.rsplit_once(':')?;
    let host = match host.strip_prefix('[') {
        Some(v6) => v6.strip_suffix(']')?,
        None if host.contains(':') => return None,
        None => host,
    };
    if host.contains(['[', ']']) || port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((host, port.parse().ok()?))
}

/// Splits `<fqdn>:<port>`.
pub fn parse_host_port(name: &str) -> Option<(&str, u32)> {
    let (host, port) = name.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

/// Istio's SNI for an outbound cluster: `outbound_.<port>_.<subset>_.<fqdn>`.
pub fn outbound_sni(port: u32, subset: &str, host: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{host}")
}

/// The names a client in `proxy_namespace` may use for `service`, as Istio lists them in a
/// virtual host: the FQDN, then the absolute FQDN with its trailing dot (Istio >= 1.27,
/// PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN: `curl http://reviews.ns.svc.cluster.local./`
/// sends that Host); for Kubernetes services also `name.ns`, `name.ns.svc` and, from the
/// same namespace, the bare `name`; the service's virtual IP. Each with and without
/// `:<port>`. A wildcard ServiceEntry host is listed as is (and with its dot).
pub fn service_domains(
    service: &Service,
    port: u32,
    proxy_namespace: &str,
    cluster_domain: &str,
) -> Vec<String> {
    let mut hosts = vec![service.hostname.clone()];
    if service.hostname.parse::<std::net::IpAddr>().is_err() {
        hosts.push(format!("{}.", service.hostname));
    }
    let kube_suffix = format!(".{}.svc.{cluster_domain}", service.namespace);
    if let Some(name) = service.hostname.strip_suffix(&kube_suffix) {
        if service.namespace == proxy_namespace {
            hosts.push(name.to_string());
        }
        hosts.push(format!("{name}.{}", service.namespace));
        hosts.push(format!("{name}.{}.svc", service.namespace));
    }
    // A single IP (not a CIDR) is a name clients dial: `curl 10.0.0.9:9080`.
    hosts.extend(
        service
            .addresses
            .iter()
            .filter(|a| a.parse::<std::net::IpAddr>().is_ok())
            .cloned(),
    );
    let mut out = Vec::with_capacity(hosts.len() * 2);
    for h in hosts {
        // An IPv6 address takes brackets before a port, as in a Host header.
        if h.contains(':') {
            out.push(format!("[{h}]:{port}"));
        } else {
            out.push(format!("{h}:{port}"));
        }
        out.push(h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pilotfish_mesh::model::{ExportTo, Resolution, ServiceOrigin};

    fn svc(host: &str, ns: &str, addresses: &[&str]) -> Service {
        Service {
            hostname: host.into(),
            name: host.split('.').next().unwrap_or_default().into(),
            namespace: ns.into(),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            ports: Vec::new(),
            labels: Default::default(),
            selector: Default::default(),
            export_to: ExportTo::default(),
            resolution: Resolution::ClientSideLb,
            origin: ServiceOrigin::Kubernetes,
            mesh_external: false,
            external_name: None,
            send_unhealthy_endpoints: false,
            creation_ms: 0,
            subject_alt_names: Vec::new(),
        }
    }

    #[test]
    fn server_listener_names_split_as_go_does() {
        let p = |a: &str| {
            parse_server_listener(&format!("{SERVER_LISTENER_PREFIX}{a}"))
                .map(|(host, port)| (host.to_string(), port))
        };
        assert_eq!(p("0.0.0.0:8080"), Some(("0.0.0.0".into(), 8080)));
        assert_eq!(p("[::]:8080"), Some(("::".into(), 8080)));
        assert_eq!(p("[fd00::1]:50051"), Some(("fd00::1".into(), 50051)));
        for bad in [
            "::1:8080",
            "10.0.0.1",
            "10.0.0.1:",
            "10.0.0.1:x",
            "[::1:80",
            "a]:80",
        ] {
            assert_eq!(p(bad), None, "{bad}");
        }
        assert_eq!(
            parse_server_listener("reviews:9080"),
            None,
            "not a server listener"
        );
    }

    #[test]
    fn cluster_names_round_trip() {
        let name = outbound_cluster(9080, "v1", "reviews.default.svc.cluster.local");
        assert_eq!(name, "outbound|9080|v1|reviews.default.svc.cluster.local");
        assert_eq!(
            parse_outbound_cluster(&name),
            Some((9080, "v1", "reviews.default.svc.cluster.local"))
        );
        assert_eq!(parse_outbound_cluster("inbound|80||"), None);
        assert_eq!(inbound_cluster(8080), "inbound|8080||");
        assert_eq!(vip_listener("10.96.0.1", 80), "10.96.0.1_80");
        assert_eq!(
            vip_listener("fd00::1", 80),
            "fd00::1_80",
            "as Istio: no brackets"
        );
        assert_eq!(
            parse_host_port("a.b.svc.cluster.local:50051"),
            Some(("a.b.svc.cluster.local", 50051))
        );
        assert_eq!(parse_host_port("nonsense"), None);
    }

    #[test]
    fn domains_depend_on_the_client_namespace() {
        let s = svc(
            "reviews.bookinfo.svc.cluster.local",
            "bookinfo",
            &["10.0.0.9"],
        );
        let same = service_domains(&s, 9080, "bookinfo", "cluster.local");
        assert_eq!(
            same,
            [
                "reviews.bookinfo.svc.cluster.local:9080",
                "reviews.bookinfo.svc.cluster.local",
                "reviews.bookinfo.svc.cluster.local.:9080",
                "reviews.bookinfo.svc.cluster.local.",
                "reviews:9080",
                "reviews",
                "reviews.bookinfo:9080",
                "reviews.bookinfo",
                "reviews.bookinfo.svc:9080",
                "reviews.bookinfo.svc",
                "10.0.0.9:9080",
                "10.0.0.9",
            ]
        );
        let other = service_domains(&s, 9080, "default", "cluster.local");
        assert!(!other.iter().any(|d| d == "reviews"));
        assert!(other.iter().any(|d| d == "reviews.bookinfo"));
        let v6 = svc("db.data.svc.cluster.local", "data", &["fd00::9"]);
        let domains = service_domains(&v6, 5432, "data", "cluster.local");
        assert!(domains.iter().any(|d| d == "[fd00::9]:5432"), "{domains:?}");
        let external = svc("api.example.com", "default", &["240.0.0.0/16"]);
        assert_eq!(
            service_domains(&external, 443, "default", "cluster.local"),
            [
                "api.example.com:443",
                "api.example.com",
                "api.example.com.:443",
                "api.example.com."
            ]
        );
    }
}
