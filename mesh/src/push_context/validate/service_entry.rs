//! ServiceEntry validation and resolution (Istio's rules).

use std::collections::BTreeSet;

use super::common::*;
use super::{Validated, ValidationContext};
use crate::api::{Resolution as SeResolution, ServiceEntry, ServiceEntrySpec};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::Protocol;
use crate::model::kube::namespace_of;
use crate::push_context::hosts::{check_host, resolve_short_name};

/// Validates one ServiceEntry and returns its spec with hosts resolved to FQDNs.
pub fn validate_service_entry(
    se: &ServiceEntry,
    ctx: &ValidationContext,
) -> Validated<ServiceEntrySpec> {
    let namespace = namespace_of(&se.metadata);
    let key = ConfigKey::new(
        ConfigKind::ServiceEntry,
        &namespace,
        se.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    let mut spec = se.spec.clone();
    let resolution = spec.resolution.unwrap_or(SeResolution::None);

    if spec.hosts.is_empty() {
        f.error("spec.hosts", "a ServiceEntry needs at least one host");
    }
    let mut seen = BTreeSet::new();
    for (i, host) in spec.hosts.iter_mut().enumerate() {
        let path = format!("spec.hosts[{i}]");
        if let Err(r) = check_host(host, true) {
            f.error(&path, r);
            continue;
        }
        if host == "*" {
            f.error(&path, "`*` is not a valid ServiceEntry host");
        }
        if host.starts_with('*')
            && matches!(resolution, SeResolution::Dns | SeResolution::DnsRoundRobin)
        {
            f.error(
                &path,
                "wildcard hosts cannot use DNS resolution (use resolution NONE)",
            );
        }
        *host = resolve_short_name(host, &namespace, ctx.cluster_domain);
        if !seen.insert(host.clone()) {
            f.error(&path, format!("duplicate host {host:?}"));
        }
    }
    for (i, a) in spec.addresses.iter().enumerate() {
        if let Err(r) = check_ip_or_cidr(a) {
            f.error(format!("spec.addresses[{i}]"), r);
        }
    }
    if spec.ports.is_empty() {
        f.error("spec.ports", "a ServiceEntry needs at least one port");
    }
    let mut numbers = BTreeSet::new();
    let mut names = BTreeSet::new();
    for (i, p) in spec.ports.iter().enumerate() {
        let path = format!("spec.ports[{i}]");
        check_port(&mut f, &format!("{path}.number"), p.number);
        if !numbers.insert(p.number) {
            f.error(
                format!("{path}.number"),
                format!("port {} is declared twice", p.number),
            );
        }
        if p.name.is_empty() {
            f.error(format!("{path}.name"), "port name is required");
        } else if !names.insert(p.name.clone()) {
            f.error(
                format!("{path}.name"),
                format!("port name {:?} is declared twice", p.name),
            );
        }
        if let Some(proto) = &p.protocol
            && Protocol::from_istio_name(proto).is_none()
        {
            f.error(format!("{path}.protocol"), format!("{proto:?} is not a protocol Istio knows (HTTP, HTTPS, GRPC, HTTP2, TCP, TLS, ...)"));
        }
        if let Some(t) = p.target_port {
            check_port(&mut f, &format!("{path}.targetPort"), t);
        }
    }
    check_export_to(&mut f, "spec.exportTo", &spec.export_to);
    if !spec.endpoints.is_empty() && spec.workload_selector.is_some() {
        f.error(
            "spec.workloadSelector",
            "endpoints and workloadSelector cannot both be set",
        );
    }
    if let Some(sel) = &spec.workload_selector {
        check_labels(&mut f, "spec.workloadSelector.labels", &sel.labels);
    }
    match resolution {
        SeResolution::None if !spec.endpoints.is_empty() => {
            f.error("spec.endpoints", "resolution NONE takes no endpoints (traffic goes to the address the client dialled)");
        }
        SeResolution::Static if spec.endpoints.is_empty() && spec.workload_selector.is_none() => {
            f.error(
                "spec.endpoints",
                "resolution STATIC needs endpoints or a workloadSelector",
            );
        }
        SeResolution::DnsRoundRobin if spec.endpoints.len() > 1 => {
            f.error(
                "spec.endpoints",
                "resolution DNS_ROUND_ROBIN takes at most one endpoint",
            );
        }
        SeResolution::DynamicDns => {
            f.warning(
                "spec.resolution",
                "DYNAMIC_DNS is served as DNS by Pilotfish",
            );
        }
        _ => {}
    }
    for (i, ep) in spec.endpoints.iter().enumerate() {
        let path = format!("spec.endpoints[{i}]");
        match ep.address.as_deref() {
            None | Some("") => f.error(format!("{path}.address"), "endpoint address is required"),
            Some(addr) => {
                let is_ip = addr.parse::<std::net::IpAddr>().is_ok() || addr.starts_with("unix://");
                if resolution == SeResolution::Static && !is_ip {
                    f.error(
                        format!("{path}.address"),
                        format!("resolution STATIC needs IP addresses (got {addr:?})"),
                    );
                } else if !is_ip && let Err(r) = check_host(addr, false) {
                    f.error(format!("{path}.address"), r);
                }
            }
        }
        for (name, number) in &ep.ports {
            if !names.contains(name) {
                f.error(
                    format!("{path}.ports[{name}]"),
                    format!("{name:?} is not the name of a port of this ServiceEntry"),
                );
            }
            check_port(&mut f, &format!("{path}.ports[{name}]"), *number);
        }
        check_labels(&mut f, &format!("{path}.labels"), &ep.labels);
        if let Some(w) = ep.weight
            && w == 0
        {
            f.warning(format!("{path}.weight"), "weight 0 is treated as 1");
        }
    }
    Validated::new(spec, f.list)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::push_context::validate::SubsetIndex;

    fn check(yaml: &str) -> Validated<ServiceEntrySpec> {
        let se: ServiceEntry = crate::api::parse_strict_yaml(yaml).unwrap();
        let subsets = SubsetIndex::default();
        let ctx = ValidationContext {
            cluster_domain: "cluster.local",
            subsets: &subsets,
            known_hosts: None,
        };
        validate_service_entry(&se, &ctx)
    }

    const HEAD: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: default}\n";

    #[test]
    fn static_entries_need_ip_endpoints() {
        let out = check(&format!(
            "{HEAD}spec:\n  hosts: [db.internal]\n  ports: [{{number: 5432, name: tcp, protocol: TCP}}]\n  resolution: STATIC\n  endpoints:\n  - address: db.example.com\n"
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
    fn wildcard_with_dns_and_unknown_protocol_are_errors() {
        let out = check(&format!(
            "{HEAD}spec:\n  hosts: ['*.example.com']\n  ports: [{{number: 443, name: https, protocol: QUIC}}]\n  resolution: DNS\n"
        ));
        let paths: Vec<_> = out.findings.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["spec.hosts[0]", "spec.ports[0].protocol"]);
    }
}
