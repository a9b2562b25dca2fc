//! ServiceEntry validation, rule for rule as Istio 1.30 applies it (the webhook's
//! `ValidateServiceEntry` and the CRD schema's rules), and resolution of its hosts.

use std::collections::BTreeSet;

use super::Validated;
use super::common::*;
use super::names;
use crate::api::{Location, Resolution, ServiceEntry, ServiceEntrySpec, WorkloadEntry};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;
use crate::push_context::hosts::resolve_short_name;

/// The label that opts a ServiceEntry out of Istio's address auto-allocation.
const AUTO_ALLOCATE_LABEL: &str = "networking.istio.io/enable-autoallocate-ip";
/// The label that sends a service's traffic through a waypoint.
const USE_WAYPOINT_LABEL: &str = "istio.io/use-waypoint";

/// The CRD's bounds (`maxItems`, `maxLength`, `maxProperties`).
const MAX_HOSTS: usize = 256;
const MAX_ADDRESSES: usize = 256;
const MAX_ADDRESS_LEN: usize = 64;
const MAX_PORTS: usize = 256;
const MAX_PORT_FIELD_LEN: usize = 256;
const MAX_ENDPOINTS: usize = 4096;
const MAX_ENDPOINT_ADDRESS_LEN: usize = 256;
const MAX_ENDPOINT_LABELS: usize = 256;
const MAX_ENDPOINT_PORTS: usize = 128;
const MAX_LOCALITY_LEN: usize = 2048;
const MAX_SERVICE_ACCOUNT_LEN: usize = 253;
const MAX_SELECTOR_LABELS: usize = 256;

/// Validates one ServiceEntry and returns its spec with hosts resolved to FQDNs.
pub fn validate_service_entry(
    se: &ServiceEntry,
    cluster_domain: &str,
) -> Validated<ServiceEntrySpec> {
    let namespace = namespace_of(&se.metadata);
    let key = ConfigKey::new(
        ConfigKind::ServiceEntry,
        &namespace,
        se.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    check_annotations(&mut f, se.metadata.annotations.as_ref());
    let spec = &se.spec;
    let mut resolved = spec.clone();
    for host in &mut resolved.hosts {
        *host = resolve_short_name(host, &namespace, cluster_domain);
    }
    schema_rules(&mut f, spec);

    // A broken selector ends the webhook's checks at once.
    if let Some(sel) = &spec.workload_selector {
        let before = f.list.len();
        check_selector_labels(&mut f, "spec.workloadSelector.labels", &sel.labels);
        if f.list[before..].iter().any(|e| e.is_error()) {
            return Validated::new(resolved, f.list);
        }
        if sel.labels.is_empty() {
            f.warning(
                "spec.workloadSelector.labels",
                "the workload selector has no labels, so it selects every workload of the namespace",
            );
        }
    }
    if spec.workload_selector.is_some() && !spec.endpoints.is_empty() {
        f.error(
            "spec.workloadSelector",
            "only one of workloadSelector and endpoints may be set",
        );
    }
    let resolution = spec.resolution.unwrap_or(Resolution::None);
    if spec.hosts.is_empty() {
        f.error("spec.hosts", "a ServiceEntry needs at least one host");
    }
    for (i, host) in spec.hosts.iter().enumerate() {
        let path = format!("spec.hosts[{i}]");
        if host == "*" {
            f.error(&path, "`*` is not a valid ServiceEntry host");
            continue;
        }
        f.check(&path, names::check_wildcard_domain(host));
        if resolution != Resolution::DynamicDns
            && let Err(reason) = names::check_no_partial_wildcard(host)
        {
            f.warning(&path, reason);
        }
    }
    let mut cidr = false;
    for (i, address) in spec.addresses.iter().enumerate() {
        cidr |= address.contains('/');
        f.check(
            format!("spec.addresses[{i}]"),
            names::check_ip_subnet(address),
        );
    }
    if cidr && !matches!(resolution, Resolution::None | Resolution::Static) {
        f.error(
            "spec.addresses",
            "CIDR addresses are allowed only with resolution NONE or STATIC",
        );
    }

    let opted_out = se
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(AUTO_ALLOCATE_LABEL))
        .is_some_and(|v| v.eq_ignore_ascii_case("false"));
    let auto_allocated = resolution != Resolution::None && !opted_out && spec.addresses.is_empty();
    let mut port_names = BTreeSet::new();
    let mut port_numbers = BTreeSet::new();
    for (i, p) in spec.ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        if !port_names.insert(p.name.as_str()) {
            f.error(
                format!("{path}.name"),
                format!("port name {:?} is declared twice", p.name),
            );
        }
        if !port_numbers.insert(p.number) {
            f.error(
                format!("{path}.number"),
                format!("port {} is declared twice", p.number),
            );
        }
        if let Some(target) = p.target_port.filter(|t| *t != 0) {
            f.check(
                format!("{path}.targetPort"),
                names::check_port(target.into()),
            );
        }
        let protocol = p.protocol.as_deref().unwrap_or("");
        if spec.addresses.is_empty()
            && !auto_allocated
            && (protocol.is_empty() || protocol == "TCP")
        {
            f.warning(
                &path,
                "a TCP (or unset) protocol port without addresses and without address auto-allocation cannot be told apart from other services on the same port",
            );
        }
        if !names::is_dns1123_label(&p.name) {
            f.error(
                format!("{path}.name"),
                format!("{:?} is not a valid port name", p.name),
            );
        }
        if !protocol.is_empty() && !names::is_istio_protocol(protocol) {
            f.error(
                format!("{path}.protocol"),
                format!("{protocol:?} is not a protocol Istio knows (HTTP, HTTPS, GRPC, HTTP2, TCP, TLS, ...)"),
            );
        }
        f.check(format!("{path}.number"), names::check_port(p.number.into()));
    }

    match resolution {
        Resolution::None => {
            if !spec.endpoints.is_empty() {
                f.error(
                    "spec.endpoints",
                    "resolution NONE takes no endpoints (traffic goes to the address the client dialled)",
                );
            }
            if spec.workload_selector.is_some() {
                f.warning(
                    "spec.workloadSelector",
                    "a workloadSelector has no effect with resolution NONE",
                );
            }
        }
        Resolution::Static => {
            for (i, ep) in spec.endpoints.iter().enumerate() {
                static_endpoint(&mut f, &format!("spec.endpoints[{i}]"), ep, &port_names);
            }
        }
        Resolution::Dns | Resolution::DnsRoundRobin => {
            if spec.endpoints.is_empty()
                && let Some((i, reason)) = spec
                    .hosts
                    .iter()
                    .enumerate()
                    .find_map(|(i, h)| names::check_fqdn(h).err().map(|r| (i, r)))
            {
                f.error(
                    format!("spec.hosts[{i}]"),
                    format!("without endpoints, DNS resolution needs plain host names: {reason}"),
                );
            }
            if resolution == Resolution::DnsRoundRobin && spec.endpoints.len() > 1 {
                f.error(
                    "spec.endpoints",
                    "resolution DNS_ROUND_ROBIN takes at most one endpoint",
                );
            }
            for (i, ep) in spec.endpoints.iter().enumerate() {
                dns_endpoint(&mut f, &format!("spec.endpoints[{i}]"), ep, &port_names);
            }
            if !spec.addresses.is_empty()
                && spec.hosts.len() > 1
                && spec
                    .ports
                    .iter()
                    .any(|p| names::protocol_is_tcp(p.protocol.as_deref().unwrap_or("")))
            {
                f.warning(
                    "spec.hosts",
                    "with addresses and a TCP port, only one host can be told apart",
                );
            }
        }
        Resolution::DynamicDns => {
            for (i, host) in spec.hosts.iter().enumerate() {
                if !host.starts_with('*') {
                    f.error(
                        format!("spec.hosts[{i}]"),
                        "resolution DYNAMIC_DNS needs wildcard hosts",
                    );
                }
            }
            if !spec.addresses.is_empty() {
                f.error(
                    "spec.addresses",
                    "resolution DYNAMIC_DNS takes no addresses",
                );
            }
            if !spec.endpoints.is_empty() {
                f.error(
                    "spec.endpoints",
                    "resolution DYNAMIC_DNS takes no endpoints",
                );
            }
            for (i, p) in spec.ports.iter().enumerate() {
                let protocol = p.protocol.as_deref().unwrap_or("").to_ascii_lowercase();
                if !matches!(protocol.as_str(), "http" | "tls" | "grpc" | "http2") {
                    f.error(
                        format!("spec.ports[{i}].protocol"),
                        "resolution DYNAMIC_DNS supports only HTTP, TLS, GRPC and HTTP2 ports",
                    );
                }
            }
            let waypoint = se
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(USE_WAYPOINT_LABEL))
                .is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case("none"));
            if spec.location == Some(Location::MeshInternal) && waypoint {
                f.error(
                    "spec.location",
                    "MESH_INTERNAL with resolution DYNAMIC_DNS is not supported with a waypoint",
                );
            }
        }
    }
    if resolution != Resolution::None && spec.hosts.len() > 1 {
        let opaque = spec.ports.iter().any(|p| {
            let protocol = p.protocol.as_deref().unwrap_or("");
            !names::protocol_is_http(protocol) && !names::protocol_is_tls(protocol)
        });
        if opaque {
            f.error(
                "spec.hosts",
                "several hosts need HTTP or TLS ports (a plain TCP port cannot tell them apart)",
            );
        }
    }
    check_export_to(
        &mut f,
        "spec.exportTo",
        &namespace,
        &spec.export_to,
        ExportToOf::ServiceEntry,
    );
    Validated::new(resolved, f.list)
}

/// An endpoint of a STATIC entry: an IP address or a `unix://` socket.
fn static_endpoint(f: &mut Findings, path: &str, ep: &WorkloadEntry, ports: &BTreeSet<&str>) {
    let address = ep.address.as_deref().unwrap_or("");
    if address.is_empty() {
        match ep.network.as_deref().filter(|n| !n.is_empty()) {
            None => {
                f.error(format!("{path}.address"), "an endpoint needs an address");
                return;
            }
            Some(network) => f.warning(
                format!("{path}.address"),
                format!("the endpoint has no address (network {network:?})"),
            ),
        }
    }
    let unix = address.starts_with("unix://");
    if let Some(socket) = address.strip_prefix("unix://") {
        let absolute =
            socket.starts_with('@') || (socket.starts_with('/') && !socket.ends_with('/'));
        if !absolute {
            f.error(
                format!("{path}.address"),
                format!("{socket:?} is not an absolute path to a socket"),
            );
        }
        if !ep.ports.is_empty() {
            f.error(format!("{path}.ports"), "a unix:// endpoint takes no ports");
        }
    } else if !address.is_empty() && !names::is_ip(address) {
        f.error(
            format!("{path}.address"),
            format!("resolution STATIC needs IP addresses (got {address:?})"),
        );
    }
    endpoint_ports(f, path, ep, ports);
    check_labels(f, &format!("{path}.labels"), &ep.labels);
    if unix && ports.len() != 1 {
        f.error(
            format!("{path}.address"),
            "a unix:// endpoint needs exactly one service port",
        );
    }
}

/// An endpoint of a DNS entry: an IP address or a host name.
fn dns_endpoint(f: &mut Findings, path: &str, ep: &WorkloadEntry, ports: &BTreeSet<&str>) {
    let address = ep.address.as_deref().unwrap_or("");
    if !names::is_ip(address) && names::check_fqdn(address).is_err() {
        f.error(
            format!("{path}.address"),
            format!("{address:?} is neither an IP address nor a valid host name"),
        );
    }
    check_labels(f, &format!("{path}.labels"), &ep.labels);
    endpoint_ports(f, path, ep, ports);
}

fn endpoint_ports(f: &mut Findings, path: &str, ep: &WorkloadEntry, ports: &BTreeSet<&str>) {
    for (name, number) in &ep.ports {
        let pp = format!("{path}.ports[{name}]");
        if !ports.contains(name.as_str()) {
            f.error(
                &pp,
                format!("{name:?} is not the name of a port of this ServiceEntry"),
            );
        }
        if !names::is_dns1123_label(name) {
            f.error(&pp, format!("{name:?} is not a valid port name"));
        }
        f.check(&pp, names::check_port((*number).into()));
    }
}

/// The rules Istio's CRD schema adds (`x-kubernetes-validations`, sizes, unique port
/// names): the API server enforces them before the webhook runs.
fn schema_rules(f: &mut Findings, spec: &ServiceEntrySpec) {
    let too_many = |f: &mut Findings, path: &str, n: usize, max: usize| {
        if n > max {
            f.error(path, format!("at most {max} entries are allowed (got {n})"));
        }
    };
    let too_long = |f: &mut Findings, path: String, s: &str, max: usize| {
        if s.len() > max {
            f.error(path, format!("at most {max} characters are allowed"));
        }
    };
    too_many(f, "spec.hosts", spec.hosts.len(), MAX_HOSTS);
    too_many(f, "spec.addresses", spec.addresses.len(), MAX_ADDRESSES);
    for (i, a) in spec.addresses.iter().enumerate() {
        too_long(f, format!("spec.addresses[{i}]"), a, MAX_ADDRESS_LEN);
    }
    too_many(f, "spec.ports", spec.ports.len(), MAX_PORTS);
    for (i, p) in spec.ports.iter().enumerate() {
        too_long(
            f,
            format!("spec.ports[{i}].name"),
            &p.name,
            MAX_PORT_FIELD_LEN,
        );
        if let Some(protocol) = &p.protocol {
            too_long(
                f,
                format!("spec.ports[{i}].protocol"),
                protocol,
                MAX_PORT_FIELD_LEN,
            );
        }
        // The webhook skips targetPort 0; the schema does not.
        if p.target_port == Some(0) {
            f.error(
                format!("spec.ports[{i}].targetPort"),
                "port 0 is not in the range 1-65535",
            );
        }
    }
    too_many(f, "spec.endpoints", spec.endpoints.len(), MAX_ENDPOINTS);
    for (i, ep) in spec.endpoints.iter().enumerate() {
        let path = format!("spec.endpoints[{i}]");
        let address = ep.address.as_deref();
        if address.is_none() && ep.network.is_none() {
            f.error(&path, "an endpoint needs an address or a network");
        }
        if let Some(address) = address {
            too_long(
                f,
                format!("{path}.address"),
                address,
                MAX_ENDPOINT_ADDRESS_LEN,
            );
            if let Some(socket) = address.strip_prefix("unix://") {
                if !socket.starts_with('/') && !socket.starts_with('@') {
                    f.error(
                        format!("{path}.address"),
                        "a unix:// address must be an absolute path or an abstract socket (@name)",
                    );
                }
                if socket.ends_with('/') {
                    f.error(
                        format!("{path}.address"),
                        "a unix:// address cannot be a directory",
                    );
                }
                if !ep.ports.is_empty() {
                    f.error(format!("{path}.ports"), "a unix:// endpoint takes no ports");
                }
            }
        }
        too_many(
            f,
            &format!("{path}.labels"),
            ep.labels.len(),
            MAX_ENDPOINT_LABELS,
        );
        too_many(
            f,
            &format!("{path}.ports"),
            ep.ports.len(),
            MAX_ENDPOINT_PORTS,
        );
        for (name, number) in &ep.ports {
            // `size(key) < 63`: one character short of a DNS label.
            if name.len() >= 63 || !names::is_dns1123_label(name) {
                f.error(
                    format!("{path}.ports[{name}]"),
                    format!("{name:?} is not a valid port name"),
                );
            }
            if !(1..=65535).contains(number) {
                f.error(
                    format!("{path}.ports[{name}]"),
                    format!("port {number} is not in the range 1-65535"),
                );
            }
        }
        for (field, value, max) in [
            ("locality", &ep.locality, MAX_LOCALITY_LEN),
            ("network", &ep.network, MAX_LOCALITY_LEN),
            (
                "serviceAccount",
                &ep.service_account,
                MAX_SERVICE_ACCOUNT_LEN,
            ),
        ] {
            if let Some(value) = value {
                too_long(f, format!("{path}.{field}"), value, max);
            }
        }
    }
    if let Some(sel) = &spec.workload_selector {
        too_many(
            f,
            "spec.workloadSelector.labels",
            sel.labels.len(),
            MAX_SELECTOR_LABELS,
        );
        for (k, v) in &sel.labels {
            too_long(f, format!("spec.workloadSelector.labels[{k}]"), v, 63);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> Validated<ServiceEntrySpec> {
        let se: ServiceEntry = crate::api::parse_strict_yaml(yaml).unwrap();
        validate_service_entry(&se, "cluster.local")
    }

    const HEAD: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: default}\n";

    #[test]
    fn static_entries_need_ip_endpoints() {
        let out = check(&format!(
            "{HEAD}spec:\n  hosts: [db.internal]\n  addresses: [10.0.0.5]\n  ports: [{{number: 5432, name: tcp, protocol: TCP}}]\n  resolution: STATIC\n  endpoints:\n  - address: db.example.com\n"
        ));
        assert!(out.spec.is_none());
        assert_eq!(out.findings[0].path, "spec.endpoints[0].address");
    }

    #[test]
    fn dns_entry_is_accepted() {
        let out = check(&format!(
            "{HEAD}spec:\n  hosts: [api.example.com]\n  ports: [{{number: 443, name: https, protocol: HTTPS}}]\n  resolution: DNS\n  location: MESH_EXTERNAL\n"
        ));
        assert!(out.findings.is_empty(), "{:?}", out.findings);
    }

    #[test]
    fn istio_accepts_entries_without_ports_endpoints_or_protocol() {
        let out = check(&format!(
            "{HEAD}spec:\n  hosts: [api.example.com]\n  resolution: STATIC\n"
        ));
        assert!(out.findings.is_empty(), "{:?}", out.findings);
        let out = check(&format!(
            "{HEAD}spec:\n  hosts: ['*.example.com']\n  ports: [{{number: 8080, name: web, protocol: \"\"}}]\n  resolution: NONE\n"
        ));
        assert!(out.spec.is_some(), "{:?}", out.findings);
    }
}
