//! TLS terminated by a Sidecar ingress listener's own `tls` settings (Istio's
//! `BuildListenerTLSContext` for a sidecar's inbound chain, with
//! `ENABLE_TLS_ON_SIDECAR_INGRESS`): one chain on the port matching TLS, whose
//! `DownstreamTlsContext` serves the listener's certificate files through the sidecar's
//! own SDS (`file-cert:<cert>~<key>`, else `default`), offers `h2`/`http/1.1`, and for
//! `MUTUAL` (and `OPTIONAL_MUTUAL`) verifies clients against `file-root:<ca>` (else
//! `ROOTCA`) with the CRL file, requiring a certificate for `MUTUAL` only. The protocol
//! versions and cipher suites set are applied for SIMPLE, MUTUAL and OPTIONAL_MUTUAL.
//! (`ISTIO_MUTUAL`, credential names and SANs are rejected on sidecars by validation.)

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, FilterChainMatch};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, TlsParameters,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters::TlsProtocol as EnvoyTlsProtocol,
};
use pilotfish_mesh::api::{ServerTlsMode, ServerTlsSettings, TlsProtocol};
use pilotfish_mesh::model::Protocol;
use pilotfish_mesh::push_context::is_valid_cipher_suite;

use super::tls::{SDS_ROOT_SECRET, SDS_WORKLOAD_SECRET, TLS_TRANSPORT_SOCKET, sds_secret};
use super::util::{any, bool_value, u32_value};

/// Istio's `ALPNHttp`.
const ALPN_HTTP: [&str; 2] = ["h2", "http/1.1"];

/// The protocol a chain sees once it has terminated TLS (Istio's `AfterTLSTermination`).
pub fn after_termination(protocol: Protocol) -> Protocol {
    match protocol {
        Protocol::Https => Protocol::Http,
        Protocol::Tls => Protocol::Tcp,
        other => other,
    }
}

/// The one chain of `port` terminating `tls` (Istio's `getTLSFilterChainMatchOptions`).
pub fn chain(name: &str, port: u32, tls: &ServerTlsSettings, filters: Vec<Filter>) -> FilterChain {
    FilterChain {
        name: name.to_string(),
        filter_chain_match: Some(FilterChainMatch {
            destination_port: u32_value(port),
            transport_protocol: "tls".to_string(),
            ..Default::default()
        }),
        filters,
        transport_socket: Some(TransportSocket {
            name: TLS_TRANSPORT_SOCKET.to_string(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(any(
                &downstream_context(tls),
            ))),
        }),
        ..Default::default()
    }
}

/// The `DownstreamTlsContext` of `tls` (see the module documentation).
pub fn downstream_context(tls: &ServerTlsSettings) -> DownstreamTlsContext {
    let mode = tls.mode.unwrap_or(ServerTlsMode::Passthrough);
    let require = mode == ServerTlsMode::Mutual;
    let validate_client = require || mode == ServerTlsMode::OptionalMutual;
    let set = |s: &Option<String>| s.as_deref().filter(|v| !v.is_empty()).map(str::to_string);
    let certificate = match (set(&tls.server_certificate), set(&tls.private_key)) {
        (Some(cert), Some(key)) => format!("file-cert:{cert}~{key}"),
        _ => SDS_WORKLOAD_SECRET.to_string(),
    };
    let mut common = CommonTlsContext {
        alpn_protocols: ALPN_HTTP.iter().map(|a| a.to_string()).collect(),
        tls_certificate_sds_secret_configs: vec![sds_secret(&certificate)],
        ..Default::default()
    };
    if validate_client {
        let root = set(&tls.ca_certificates).map_or_else(
            || SDS_ROOT_SECRET.to_string(),
            |ca| format!("file-root:{ca}"),
        );
        common.validation_context_type = Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(CertificateValidationContext {
                    crl: set(&tls.ca_crl).map(|file| DataSource {
                        specifier: Some(data_source::Specifier::Filename(file)),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                validation_context_sds_secret_config: Some(sds_secret(&root)),
                ..Default::default()
            },
        ));
    }
    if matches!(
        mode,
        ServerTlsMode::Simple | ServerTlsMode::Mutual | ServerTlsMode::OptionalMutual
    ) {
        let mut params = TlsParameters::default();
        let mut any_set = false;
        if let Some(v) = tls
            .min_protocol_version
            .filter(|v| *v != TlsProtocol::TlsAuto)
        {
            params.tls_minimum_protocol_version = envoy_version(v) as i32;
            any_set = true;
        }
        if let Some(v) = tls
            .max_protocol_version
            .filter(|v| *v != TlsProtocol::TlsAuto)
        {
            params.tls_maximum_protocol_version = envoy_version(v) as i32;
            any_set = true;
        }
        // Istio's FilterCipherSuites: unknown and repeated suites are left out (Envoy
        // would reject them).
        let mut suites: Vec<String> = Vec::new();
        for suite in &tls.cipher_suites {
            if is_valid_cipher_suite(suite) && !suites.contains(suite) {
                suites.push(suite.clone());
            }
        }
        if !suites.is_empty() {
            params.cipher_suites = suites;
            any_set = true;
        }
        if any_set {
            common.tls_params = Some(params);
        }
    }
    DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: bool_value(require),
        ..Default::default()
    }
}

fn envoy_version(v: TlsProtocol) -> EnvoyTlsProtocol {
    match v {
        TlsProtocol::TlsAuto => EnvoyTlsProtocol::TlsAuto,
        TlsProtocol::Tlsv1_0 => EnvoyTlsProtocol::TlSv10,
        TlsProtocol::Tlsv1_1 => EnvoyTlsProtocol::TlSv11,
        TlsProtocol::Tlsv1_2 => EnvoyTlsProtocol::TlSv12,
        TlsProtocol::Tlsv1_3 => EnvoyTlsProtocol::TlSv13,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn settings(v: serde_json::Value) -> ServerTlsSettings {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn simple_serves_the_files_and_verifies_no_client() {
        let ctx = downstream_context(&settings(json!({
            "mode": "SIMPLE", "serverCertificate": "/c.pem", "privateKey": "/k.pem",
            "caCertificates": "/ca.pem"
        })));
        assert_eq!(ctx.require_client_certificate, bool_value(false));
        let common = ctx.common_tls_context.unwrap();
        assert_eq!(
            common.tls_certificate_sds_secret_configs[0].name,
            "file-cert:/c.pem~/k.pem"
        );
        assert!(common.validation_context_type.is_none());
        assert!(common.tls_params.is_none(), "no versions or suites set");
    }

    #[test]
    fn mutual_requires_and_verifies_clients_with_the_crl() {
        let ctx = downstream_context(&settings(json!({
            "mode": "MUTUAL", "serverCertificate": "/c.pem", "privateKey": "/k.pem",
            "caCertificates": "/ca.pem", "caCrl": "/crl.pem",
            "minProtocolVersion": "TLSV1_3",
            "cipherSuites": ["ECDHE-RSA-AES128-GCM-SHA256", "NOT-A-SUITE", "ECDHE-RSA-AES128-GCM-SHA256"]
        })));
        assert_eq!(ctx.require_client_certificate, bool_value(true));
        let common = ctx.common_tls_context.unwrap();
        let Some(ValidationContextType::CombinedValidationContext(v)) =
            common.validation_context_type
        else {
            panic!("combined validation context");
        };
        assert_eq!(
            v.validation_context_sds_secret_config.unwrap().name,
            "file-root:/ca.pem"
        );
        assert!(v.default_validation_context.unwrap().crl.is_some());
        let params = common.tls_params.unwrap();
        assert_eq!(
            params.tls_minimum_protocol_version,
            EnvoyTlsProtocol::TlSv13 as i32
        );
        assert_eq!(params.cipher_suites, ["ECDHE-RSA-AES128-GCM-SHA256"]);
    }

    #[test]
    fn tls_terminated_protocols() {
        assert_eq!(after_termination(Protocol::Https), Protocol::Http);
        assert_eq!(after_termination(Protocol::Tls), Protocol::Tcp);
        assert_eq!(after_termination(Protocol::Grpc), Protocol::Grpc);
    }
}
