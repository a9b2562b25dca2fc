//! Sidecar as Istio 1.30 judges it: the webhook's `ValidateSidecar` (pkg/config/validation/
//! validation.go: the workload selector, not empty, ingress ports/binds/default endpoints
//! and TLS, egress ports, binds, Unix sockets and `namespace/host` imports, the catch-all
//! listener last, connection pools, `outboundTrafficPolicy` with `egressProxy`) and the
//! CRD's rules (required `port`/`hosts`/`egressProxy.host`, selector label sizes, TLS
//! material sources exclusive).

use std::collections::{BTreeMap, BTreeSet};

use super::Validated;
use super::common::*;
use super::destination_rule::connection_pool;
use super::names;
use super::virtual_service::destination;
use crate::api::{
    CaptureMode, OutboundTrafficPolicy, OutboundTrafficPolicyMode, ServerTlsMode,
    ServerTlsSettings, Sidecar, SidecarPort, SidecarSpec, TlsProtocol,
};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;

/// Istio's CRD: `maxProperties: 256` on the selector's labels.
const MAX_SELECTOR_LABELS: usize = 256;

/// The prefix of a Unix domain socket address.
pub const UNIX_PREFIX: &str = "unix://";

/// The cipher suites Istio accepts (pkg/config/security `ValidCipherSuites`).
const VALID_CIPHER_SUITES: [&str; 15] = [
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
];

/// Whether Istio accepts a cipher suite name (`IsValidCipherSuite`): empty, `ALL`, an
/// OpenSSL operator expression, or a known suite.
pub fn is_valid_cipher_suite(suite: &str) -> bool {
    let operator = suite.chars().next().is_some_and(|c| !c.is_alphanumeric());
    suite.is_empty() || suite == "ALL" || operator || VALID_CIPHER_SUITES.contains(&suite)
}

/// Validates one Sidecar.
pub fn validate_sidecar(sc: &Sidecar) -> Validated<SidecarSpec> {
    let namespace = namespace_of(&sc.metadata);
    let key = ConfigKey::new(
        ConfigKind::Sidecar,
        &namespace,
        sc.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    check_annotations(&mut f, sc.metadata.annotations.as_ref());
    let spec = &sc.spec;
    if let Some(sel) = &spec.workload_selector {
        check_workload_selector(
            &mut f,
            "spec.workloadSelector.labels",
            &sel.labels,
            MAX_SELECTOR_LABELS,
            "workload selector specified without labels: the Sidecar applies to every workload of the namespace",
        );
    }
    if spec.egress.is_empty()
        && spec.ingress.is_empty()
        && spec.outbound_traffic_policy.is_none()
        && spec.inbound_connection_pool.is_none()
    {
        f.error(
            "spec",
            "empty configuration: set egress, ingress, outboundTrafficPolicy or inboundConnectionPool",
        );
    }
    let mut ingress_ports = BTreeSet::new();
    for (i, listener) in spec.ingress.iter().enumerate() {
        let path = format!("spec.ingress[{i}]");
        let port = &listener.port;
        if port.target_port.is_some_and(|t| t > 0) {
            f.error(
                format!("{path}.port.targetPort"),
                "targetPort has no effect on Sidecars",
            );
        }
        port_name_and_protocol(&mut f, &path, port);
        f.check(
            format!("{path}.port.number"),
            names::check_port(port.number.into()),
        );
        if let Some(bind) = listener.bind.as_deref().filter(|b| !b.is_empty()) {
            check_ip(&mut f, &format!("{path}.bind"), bind);
        }
        if !ingress_ports.insert(port.number) {
            f.error(
                format!("{path}.port.number"),
                "ports on IP bound listeners must be unique",
            );
        }
        if let Some(endpoint) = listener
            .default_endpoint
            .as_deref()
            .filter(|e| !e.is_empty())
        {
            default_endpoint(&mut f, &format!("{path}.defaultEndpoint"), endpoint);
        }
        if let Some(tls) = &listener.tls {
            ingress_tls(&mut f, &format!("{path}.tls"), tls, port);
        }
        if let Some(cp) = &listener.connection_pool {
            connection_pool(&mut f, &format!("{path}.connectionPool"), cp);
            let protocol = port.protocol.as_deref().unwrap_or("");
            if cp.http.is_some() && !names::protocol_is_http(protocol) {
                f.warning(
                    format!("{path}.connectionPool.http"),
                    format!(
                        "HTTP connection pool settings on port {} whose protocol ({protocol:?}) is not HTTP: only the TCP settings apply",
                        port.number
                    ),
                );
            }
        }
    }
    if let Some(cp) = &spec.inbound_connection_pool {
        connection_pool(&mut f, "spec.inboundConnectionPool", cp);
    }
    egress(&mut f, &namespace, spec);
    if let Some(policy) = &spec.outbound_traffic_policy {
        outbound_traffic_policy(&mut f, policy);
    }
    Validated::new(spec.clone(), f.list)
}

fn egress(f: &mut Findings, namespace: &str, spec: &SidecarSpec) {
    let mut ports = BTreeSet::new();
    let mut sockets = BTreeSet::new();
    let mut catch_all_seen = false;
    let last = spec.egress.len().saturating_sub(1);
    for (i, listener) in spec.egress.iter().enumerate() {
        let path = format!("spec.egress[{i}]");
        match &listener.port {
            None if catch_all_seen => {
                f.error(
                    format!("{path}.port"),
                    "only one egress listener may leave out the port",
                );
                continue;
            }
            None if i != last => {
                f.error(
                    format!("{path}.port"),
                    "the egress listener without a port (the catch-all) must be the last one",
                );
            }
            None => catch_all_seen = true,
            Some(port) => {
                if port.target_port.is_some_and(|t| t > 0) {
                    f.error(
                        format!("{path}.port.targetPort"),
                        "targetPort has no effect on Sidecars",
                    );
                }
                port_name_and_protocol(f, &path, port);
                let bind = listener.bind.as_deref().unwrap_or("");
                if port.number == 0 {
                    match bind.strip_prefix(UNIX_PREFIX) {
                        None => f.error(
                            format!("{path}.bind"),
                            "a listener on port 0 must bind a Unix domain socket (unix://path)",
                        ),
                        Some(socket) => f.check(format!("{path}.bind"), unix_address(socket)),
                    }
                    if !matches!(
                        listener.capture_mode,
                        None | Some(CaptureMode::Default) | Some(CaptureMode::None)
                    ) {
                        f.error(
                            format!("{path}.captureMode"),
                            "captureMode must be DEFAULT or NONE on Unix domain socket listeners",
                        );
                    }
                    if !sockets.insert(bind.to_string()) {
                        f.error(
                            format!("{path}.bind"),
                            "Unix domain socket listeners must be unique",
                        );
                    }
                } else {
                    f.check(
                        format!("{path}.port.number"),
                        names::check_port(port.number.into()),
                    );
                    if !bind.is_empty() {
                        check_ip(f, &format!("{path}.bind"), bind);
                    }
                    if !ports.insert(port.number) {
                        f.error(
                            format!("{path}.port.number"),
                            "ports on IP bound listeners must be unique",
                        );
                    }
                }
            }
        }
        egress_hosts(f, namespace, &path, &listener.hosts);
    }
}

/// The `namespace/dnsName` imports of one egress listener.
fn egress_hosts(f: &mut Findings, namespace: &str, path: &str, hosts: &[String]) {
    if hosts.is_empty() {
        f.error(
            format!("{path}.hosts"),
            "an egress listener must import at least one host",
        );
        return;
    }
    let mut by_namespace: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (j, host) in hosts.iter().enumerate() {
        let hp = format!("{path}.hosts[{j}]");
        if let Some((ns, name)) = host.split_once('/') {
            let ns = if ns == "." { namespace } else { ns };
            let seen = by_namespace.entry(ns).or_default();
            let duplicate = if name == "*" {
                !seen.is_empty()
            } else {
                seen.contains(name) || seen.contains("*")
            };
            if duplicate {
                f.warning(&hp, format!("duplicated egress host {host:?}"));
            }
            seen.insert(name);
        }
        if let Err(reason) = namespace_slash_host(host) {
            f.error(&hp, reason);
        }
    }
    if by_namespace.get("*").is_some_and(|s| s.contains("*")) && by_namespace.len() != 1 {
        f.warning(
            format!("{path}.hosts"),
            "`*/*` imports everything: the other hosts add nothing",
        );
    }
}

/// Istio's `ValidateNamespaceSlashWildcardHostname` for sidecars.
fn namespace_slash_host(host: &str) -> Result<(), String> {
    let Some((ns, name)) = host.split_once('/') else {
        return Err(format!(
            "host {host:?} must be of the form namespace/dnsName"
        ));
    };
    if ns.is_empty() || name.is_empty() {
        return Err(format!(
            "host {host:?}: the namespace and the dnsName must not be empty"
        ));
    }
    if !matches!(ns, "*" | "." | "~") && !names::is_dns1123_label(ns) {
        return Err(format!("host {host:?}: invalid namespace {ns:?}"));
    }
    if name != "*" && !name.contains('.') {
        return Err(format!(
            "host {host:?}: short names (not fully qualified) are not allowed"
        ));
    }
    names::check_wildcard_domain(name)?;
    names::check_no_partial_wildcard(name)
}

fn port_name_and_protocol(f: &mut Findings, path: &str, port: &SidecarPort) {
    if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty())
        && !names::is_dns1123_label(name)
    {
        f.error(
            format!("{path}.port.name"),
            format!("{name:?} is not a valid port name"),
        );
    }
    if let Some(protocol) = port.protocol.as_deref().filter(|p| !p.is_empty())
        && !names::is_istio_protocol(protocol)
    {
        f.error(
            format!("{path}.port.protocol"),
            format!("unsupported protocol {protocol:?}"),
        );
    }
}

fn check_ip(f: &mut Findings, path: &str, address: &str) {
    if !names::is_ip(address) {
        f.error(path, format!("{address:?} is not a valid IP address"));
    }
}

/// Istio's `ValidateUnixAddress`: an absolute file path, or an abstract socket (`@name`).
fn unix_address(address: &str) -> Result<(), String> {
    if address.is_empty() {
        return Err("the Unix socket address must not be empty".into());
    }
    if address.starts_with('@') {
        return Ok(());
    }
    if !address.starts_with('/') || address.ends_with('/') {
        return Err(format!("{address:?} is not an absolute path to a file"));
    }
    Ok(())
}

/// `defaultEndpoint`: `unix://path`, or `HOST:PORT` with a loopback or unspecified host.
fn default_endpoint(f: &mut Findings, path: &str, endpoint: &str) {
    if let Some(socket) = endpoint.strip_prefix(UNIX_PREFIX) {
        f.check(path, unix_address(socket));
        return;
    }
    let Some((host, port)) = split_host_port(endpoint) else {
        f.error(
            path,
            format!("{endpoint:?} is not of the form HOST:PORT (e.g. 127.0.0.1:8080)"),
        );
        return;
    };
    if !matches!(host, "" | "127.0.0.1" | "0.0.0.0" | "::1" | "::") {
        f.error(
            path,
            "defaultEndpoint must be 127.0.0.1:<port>, 0.0.0.0:<port>, [::1]:<port>, [::]:<port>, unix://path or unset",
        );
    }
    match port.parse::<i64>() {
        Ok(n) => f.check(path, names::check_port(n)),
        Err(_) => f.error(path, format!("port {port:?} is not a number")),
    }
}

/// Go's `net.SplitHostPort`: `host:port` or `[v6]:port`.
fn split_host_port(address: &str) -> Option<(&str, &str)> {
    if let Some(rest) = address.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        return Some((host, port));
    }
    let (host, port) = address.rsplit_once(':')?;
    if host.contains(':') {
        return None;
    }
    Some((host, port))
}

/// An ingress listener's `tls`: what sidecars cannot do, then Istio's `validateTLSOptions`.
fn ingress_tls(f: &mut Findings, path: &str, tls: &ServerTlsSettings, port: &SidecarPort) {
    if !tls.subject_alt_names.is_empty() {
        f.error(
            format!("{path}.subjectAltNames"),
            "subjectAltNames is not supported in sidecar ingress TLS",
        );
    }
    if tls.https_redirect == Some(true) {
        f.error(
            format!("{path}.httpsRedirect"),
            "httpsRedirect is not supported on sidecars",
        );
    }
    if tls
        .credential_name
        .as_deref()
        .is_some_and(|c| !c.is_empty())
    {
        f.error(
            format!("{path}.credentialName"),
            "credentialName is not supported on sidecars",
        );
    }
    if !tls.credential_names.is_empty() {
        f.error(
            format!("{path}.credentialNames"),
            "credentialNames is not supported on sidecars",
        );
    }
    if !tls.tls_certificates.is_empty() {
        f.error(
            format!("{path}.tlsCertificates"),
            "tlsCertificates is not supported on sidecars",
        );
    }
    if let Some(mode @ (ServerTlsMode::IstioMutual | ServerTlsMode::AutoPassthrough)) = tls.mode {
        f.error(
            format!("{path}.mode"),
            format!("mode {mode:?} cannot be used in sidecar ingress TLS"),
        );
    }
    if !names::protocol_is_tls(port.protocol.as_deref().unwrap_or("")) {
        f.error(path, "TLS settings need an HTTPS or TLS port protocol");
    }
    tls_options(f, path, tls);
}

/// Istio's `validateTLSOptions` (`ServerTLSSettings`).
fn tls_options(f: &mut Findings, path: &str, tls: &ServerTlsSettings) {
    let set = |s: &Option<String>| s.as_deref().is_some_and(|v| !v.is_empty());
    if matches!(
        tls.min_protocol_version,
        Some(TlsProtocol::Tlsv1_0 | TlsProtocol::Tlsv1_1)
    ) && tls.cipher_suites.is_empty()
    {
        f.warning(
            format!("{path}.minProtocolVersion"),
            "TLS versions below TLSV1_2 need compatible cipherSuites: the defaults no longer include any",
        );
    }
    let mut valid = BTreeSet::new();
    for (i, suite) in tls.cipher_suites.iter().enumerate() {
        let cp = format!("{path}.cipherSuites[{i}]");
        if !is_valid_cipher_suite(suite) {
            f.warning(&cp, format!("invalid cipher suite {suite:?} is ignored"));
        } else if !valid.insert(suite.as_str()) {
            f.warning(&cp, format!("duplicate cipher suite {suite:?} is ignored"));
        }
    }
    let mode = tls.mode.unwrap_or(ServerTlsMode::Passthrough);
    if mode == ServerTlsMode::IstioMutual {
        for (field, present) in [
            ("serverCertificate", set(&tls.server_certificate)),
            ("privateKey", set(&tls.private_key)),
            ("caCertificates", set(&tls.ca_certificates)),
            ("tlsCertificates", !tls.tls_certificates.is_empty()),
            ("credentialName", set(&tls.credential_name)),
            ("credentialNames", !tls.credential_names.is_empty()),
        ] {
            if present {
                f.error(
                    format!("{path}.{field}"),
                    "ISTIO_MUTUAL uses the workload's own certificate: this field cannot be set",
                );
            }
        }
        return;
    }
    if matches!(
        mode,
        ServerTlsMode::Passthrough | ServerTlsMode::AutoPassthrough
    ) && (set(&tls.ca_crl)
        || set(&tls.server_certificate)
        || set(&tls.private_key)
        || set(&tls.ca_certificates)
        || !tls.tls_certificates.is_empty()
        || set(&tls.credential_name)
        || !tls.credential_names.is_empty())
    {
        f.warning(
            format!("{path}.mode"),
            format!("{mode:?} does not use certificates: they are ignored"),
        );
    }
    let sources = [
        set(&tls.server_certificate) && set(&tls.private_key),
        set(&tls.credential_name),
        !tls.credential_names.is_empty(),
        !tls.tls_certificates.is_empty(),
    ];
    if sources.iter().filter(|s| **s).count() > 1 {
        f.error(
            path,
            "only one of credentialName, credentialNames, serverCertificate/privateKey, tlsCertificates may be set",
        );
    }
    let terminating = matches!(
        mode,
        ServerTlsMode::Simple | ServerTlsMode::Mutual | ServerTlsMode::OptionalMutual
    );
    if terminating && (set(&tls.credential_name) || !tls.credential_names.is_empty()) {
        return;
    }
    if terminating {
        if mode != ServerTlsMode::Simple && !set(&tls.ca_certificates) {
            f.error(
                format!("{path}.caCertificates"),
                "MUTUAL TLS requires a client CA bundle",
            );
        }
        let certs: Vec<(bool, bool)> = if tls.tls_certificates.is_empty() {
            vec![(set(&tls.server_certificate), set(&tls.private_key))]
        } else {
            tls.tls_certificates
                .iter()
                .map(|c| (set(&c.server_certificate), set(&c.private_key)))
                .collect()
        };
        for (cert, key) in certs {
            if !cert {
                f.error(
                    format!("{path}.serverCertificate"),
                    "terminating TLS requires a server certificate",
                );
            }
            if !key {
                f.error(
                    format!("{path}.privateKey"),
                    "terminating TLS requires a private key",
                );
            }
        }
    }
    if set(&tls.ca_crl) {
        if set(&tls.credential_name) {
            f.error(
                format!("{path}.caCrl"),
                "a CRL is not supported with credentialName (it belongs in the credential)",
            );
        }
        if mode == ServerTlsMode::Simple {
            f.error(
                format!("{path}.caCrl"),
                "a CRL is not supported with SIMPLE TLS",
            );
        }
    }
}

/// `outboundTrafficPolicy`: `egressProxy` only with `ALLOW_ANY`, a fully qualified host and
/// a port.
fn outbound_traffic_policy(f: &mut Findings, policy: &OutboundTrafficPolicy) {
    let Some(proxy) = &policy.egress_proxy else {
        return;
    };
    let path = "spec.outboundTrafficPolicy.egressProxy";
    if policy.effective_mode() != OutboundTrafficPolicyMode::AllowAny {
        f.error(path, "egressProxy can only be set with mode ALLOW_ANY");
        return;
    }
    f.check(format!("{path}.host"), names::check_fqdn(&proxy.host));
    if proxy.port.is_none() {
        f.error(format!("{path}.port"), "egressProxy needs a port");
        return;
    }
    destination(f, path, proxy);
}
