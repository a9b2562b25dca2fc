//! DestinationRule client TLS → the cluster's transport socket, as Istio renders it.
//!
//! Sidecars get every secret from their local SDS server (the `sds-grpc` cluster of the
//! Istio bootstrap): `ISTIO_MUTUAL` uses the secrets `default` (workload certificate) and
//! `ROOTCA`; certificate files become `file-cert:<cert>~<key>` and `file-root:<ca>`;
//! `credentialName` becomes `kubernetes://<name>`. `SIMPLE`/`MUTUAL` without
//! `caCertificates` verify the server against the OS roots (`file-root:system`, which
//! Istio's agent serves), with automatic SNI and SAN validation when `sni` is unset: Istio's
//! defaults since 1.21. For `ISTIO_MUTUAL` the sidecar's agent obtains `default` from the
//! CA on the secure port (Pilotfish's, see `pilotfish-ca`) and serves it with `ROOTCA`.
//!
//! Proxyless gRPC reads certificates through certificate-provider instances of its
//! bootstrap and rejects SDS, so `ISTIO_MUTUAL` becomes provider instance `default`
//! (certificates `default` and `ROOTCA`, [`proxyless_common_tls`], also the context of a
//! proxyless server's mTLS chain) with the destination's identities in
//! `match_subject_alt_names`; `SIMPLE`/`MUTUAL` get no TLS (plaintext, as Istio's grpcgen
//! leaves them), with a downgrade finding.

use envoy_types::pb::envoy::config::core::v3::{
    ApiConfigSource, ApiVersion, ConfigSource, DataSource, GrpcService, TransportSocket,
    api_config_source::ApiType, config_source::ConfigSourceSpecifier, data_source, grpc_service,
    transport_socket,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateProviderPluginInstance, CertificateValidationContext, CommonTlsContext,
    SdsSecretConfig, SubjectAltNameMatcher, TlsParameters, UpstreamTlsContext, common_tls_context,
    subject_alt_name_matcher::SanType, tls_parameters::TlsProtocol,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use pilotfish_mesh::api::{ClientTlsSettings, TlsMode};
use prost::Message;

use super::findings::{Downgrade, Finding};
use super::names;
use super::scope::Flavor;
use super::util::any;

/// The transport socket name Envoy registers TLS under.
pub const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";
/// The sidecar bootstrap's cluster for its local SDS server.
pub const SDS_CLUSTER: &str = "sds-grpc";
/// The SDS secrets of the workload's own certificate and of the mesh root.
pub const SDS_WORKLOAD_SECRET: &str = "default";
pub const SDS_ROOT_SECRET: &str = "ROOTCA";

/// The transport socket for a cluster, `None` for plaintext; what a proxyless client
/// cannot use is noted in `findings`. `sni_parts` (port, subset, host) make a sidecar's
/// default in-mesh SNI; `http2` (the cluster's upstream protocol is explicitly HTTP/2,
/// Istio's `isHttp2Cluster`) adds `h2` to its in-mesh ALPN.
pub fn transport_socket(
    tls: Option<&ClientTlsSettings>,
    flavor: Flavor,
    cluster: &str,
    sni_parts: (u32, &str, &str),
    http2: bool,
    findings: &mut Vec<Finding>,
) -> Option<TransportSocket> {
    let tls = tls?;
    let context = match flavor {
        Flavor::Sidecar => sidecar_context(tls, sni_parts, http2)?,
        Flavor::Proxyless => proxyless_context(tls, cluster, findings)?,
    };
    Some(TransportSocket {
        name: TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any(&context))),
    })
}

/// The ALPN an Istio sidecar offers on an in-mesh (ISTIO_MUTUAL) connection
/// (`ALPNInMeshWithMxc`); an HTTP/2 cluster adds `h2` (`ALPNInMeshH2WithMxc`).
const IN_MESH_ALPN: [&str; 2] = ["istio-peer-exchange", "istio"];

fn sidecar_context(
    tls: &ClientTlsSettings,
    (port, subset, host): (u32, &str, &str),
    http2: bool,
) -> Option<UpstreamTlsContext> {
    let sans = san_matchers(&tls.subject_alt_names);
    let mut common = CommonTlsContext {
        tls_params: Some(TlsParameters {
            tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
            tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    let sni;
    match tls.mode? {
        TlsMode::Disable => return None,
        TlsMode::IstioMutual => {
            common.alpn_protocols = IN_MESH_ALPN.iter().map(|a| a.to_string()).collect();
            if http2 {
                common.alpn_protocols.push("h2".into());
            }
            common.tls_certificate_sds_secret_configs = vec![sds_secret("default")];
            common.validation_context_type = Some(combined_validation(sans, "ROOTCA"));
            sni = tls
                .sni
                .clone()
                .unwrap_or_else(|| names::outbound_sni(port, subset, host));
        }
        mode @ (TlsMode::Simple | TlsMode::Mutual) => {
            if mode == TlsMode::Mutual {
                if let Some(credential) = &tls.credential_name {
                    common.tls_certificate_sds_secret_configs =
                        vec![sds_secret(&format!("kubernetes://{credential}"))];
                } else if let (Some(cert), Some(key)) = (&tls.client_certificate, &tls.private_key)
                {
                    common.tls_certificate_sds_secret_configs =
                        vec![sds_secret(&format!("file-cert:{cert}~{key}"))];
                }
            }
            // Istio >= 1.21 (VERIFY_CERTIFICATE_AT_CLIENT): without `caCertificates` the
            // server is verified against the OS roots, which Istio's agent serves as
            // `file-root:system`; so there is always a CA to go with the SANs.
            let root = match &tls.credential_name {
                Some(credential) => format!("kubernetes://{credential}-cacert"),
                None => format!("file-root:{}", ca_certificates_or_system(tls)),
            };
            common.validation_context_type = Some(if tls.insecure_skip_verify.unwrap_or(false) {
                // Istio's rendering: an empty context (no CA, no SANs) verifies nothing.
                common_tls_context::ValidationContextType::ValidationContext(
                    CertificateValidationContext::default(),
                )
            } else {
                combined_validation(sans, &root)
            });
            // The CRL goes with file-based roots only (not a credential's, not the OS roots).
            if tls.credential_name.is_none()
                && tls
                    .ca_certificates
                    .as_deref()
                    .is_some_and(|ca| !ca.is_empty())
            {
                set_crl(&mut common, tls.ca_crl.as_deref());
            }
            // No `sni`: Envoy takes it from the request's Host (`auto_sni`, see
            // [`auto_sni_and_san`]), as Istio >= 1.21 (ENABLE_AUTO_SNI) does.
            sni = tls.sni.clone().unwrap_or_default();
        }
    }
    Some(UpstreamTlsContext {
        common_tls_context: Some(common),
        sni,
        ..Default::default()
    })
}

/// Whether an upstream TLS socket matches subject alt names with no CA to verify the chain
/// with: Envoy rejects such a cluster ("SAN-based verification of peer certificates
/// without trusted CA is insecure and not allowed"). For the consistency audit.
// The deprecated fields are read on purpose: gRPC uses `match_subject_alt_names`, and a CA
// may come from the older provider field of a combined context.
#[allow(deprecated)]
pub fn matches_sans_without_a_ca(socket: &TransportSocket) -> bool {
    let Some(transport_socket::ConfigType::TypedConfig(config)) = &socket.config_type else {
        return false;
    };
    let Ok(context) = UpstreamTlsContext::decode(config.value.as_slice()) else {
        return false;
    };
    let has_sans = |v: &CertificateValidationContext| {
        !v.match_typed_subject_alt_names.is_empty() || !v.match_subject_alt_names.is_empty()
    };
    let own_ca = |v: &CertificateValidationContext| {
        v.trusted_ca.is_some() || v.ca_certificate_provider_instance.is_some()
    };
    match context
        .common_tls_context
        .and_then(|c| c.validation_context_type)
    {
        Some(common_tls_context::ValidationContextType::ValidationContext(v)) => {
            has_sans(&v) && !own_ca(&v)
        }
        Some(common_tls_context::ValidationContextType::CombinedValidationContext(c)) => {
            let from_elsewhere = c.validation_context_sds_secret_config.is_some()
                || c.validation_context_certificate_provider_instance.is_some();
            c.default_validation_context
                .is_some_and(|v| has_sans(&v) && !own_ca(&v) && !from_elsewhere)
        }
        _ => false,
    }
}

/// `caCertificates`, or `system` (the OS roots) when it is unset or empty, as Istio reads it.
fn ca_certificates_or_system(tls: &ClientTlsSettings) -> &str {
    tls.ca_certificates
        .as_deref()
        .filter(|ca| !ca.is_empty())
        .unwrap_or("system")
}

/// Istio's automatic SNI and SAN validation for a sidecar's `SIMPLE`/`MUTUAL` origination
/// (defaults since 1.21: ENABLE_AUTO_SNI, VERIFY_CERTIFICATE_AT_CLIENT): without `sni`
/// Envoy sends the request's Host as SNI (`auto_sni`), and when no `subjectAltNames` are
/// given either (and verification is not skipped) it checks that name against the server
/// certificate (`auto_san_validation`). Returns `(auto_sni, auto_san_validation)`, `None`
/// when neither applies. They are HTTP upstream options: Envoy's TCP proxy ignores them.
pub fn auto_sni_and_san(tls: Option<&ClientTlsSettings>, flavor: Flavor) -> Option<(bool, bool)> {
    let tls = tls?;
    if flavor != Flavor::Sidecar || !matches!(tls.mode, Some(TlsMode::Simple | TlsMode::Mutual)) {
        return None;
    }
    let auto_sni = tls.sni.as_deref().is_none_or(str::is_empty);
    let auto_san =
        auto_sni && tls.subject_alt_names.is_empty() && !tls.insecure_skip_verify.unwrap_or(false);
    (auto_sni || auto_san).then_some((auto_sni, auto_san))
}

fn proxyless_context(
    tls: &ClientTlsSettings,
    cluster: &str,
    findings: &mut Vec<Finding>,
) -> Option<UpstreamTlsContext> {
    match tls.mode? {
        TlsMode::Disable => None,
        TlsMode::IstioMutual => Some(UpstreamTlsContext {
            common_tls_context: Some(proxyless_common_tls(&tls.subject_alt_names)),
            ..Default::default()
        }),
        TlsMode::Simple | TlsMode::Mutual => {
            findings.push(Finding::Downgrade(Downgrade::new(
                "tls_files",
                cluster,
                "TLS from certificate files or credentialName (only ISTIO_MUTUAL via certificate providers)",
            )));
            None
        }
    }
}

/// The TLS context of a proxyless client's `ISTIO_MUTUAL` cluster and of a proxyless
/// server's mTLS filter chain (Istio's `buildCommonTLSContext`): the workload certificate
/// and the root from the bootstrap's certificate-provider instance `default`
/// (certificates `default` and `ROOTCA`), peers verified against `sans` (a server passes
/// none: gRPC refuses SAN matching on servers). Only the current provider fields (gRPC ≥
/// 1.66): Istio also sends the deprecated ones in a combined validation context without
/// an SDS secret, which Envoy's own validation rejects.
pub fn proxyless_common_tls(sans: &[String]) -> CommonTlsContext {
    CommonTlsContext {
        tls_certificate_provider_instance: Some(provider_instance("default")),
        validation_context_type: Some(
            common_tls_context::ValidationContextType::ValidationContext(proxyless_validation(
                sans,
            )),
        ),
        ..Default::default()
    }
}

/// gRPC's xDS client reads SANs from the older `match_subject_alt_names` field (gRFC A29),
/// not from the typed matchers Envoy prefers.
// The field is deprecated in Envoy's API; it is the one gRPC implements.
#[allow(deprecated)]
fn proxyless_validation(sans: &[String]) -> CertificateValidationContext {
    CertificateValidationContext {
        ca_certificate_provider_instance: Some(provider_instance("ROOTCA")),
        match_subject_alt_names: sans
            .iter()
            .map(|s| StringMatcher {
                match_pattern: Some(MatchPattern::Exact(s.clone())),
                ignore_case: false,
            })
            .collect(),
        ..Default::default()
    }
}

fn provider_instance(certificate: &str) -> CertificateProviderPluginInstance {
    CertificateProviderPluginInstance {
        instance_name: "default".to_string(),
        certificate_name: certificate.to_string(),
    }
}

/// Exact SAN matchers: SPIFFE identities are URI SANs, anything else a DNS name.
fn san_matchers(sans: &[String]) -> Vec<SubjectAltNameMatcher> {
    sans.iter()
        .map(|s| SubjectAltNameMatcher {
            san_type: if s.starts_with("spiffe://") {
                SanType::Uri
            } else {
                SanType::Dns
            } as i32,
            matcher: Some(StringMatcher {
                match_pattern: Some(MatchPattern::Exact(s.clone())),
                ignore_case: false,
            }),
            ..Default::default()
        })
        .collect()
}

/// `caCrl` as the file Envoy reads the revocation list from, in the validation context of
/// a file-based root (Istio reads it only there: not with `credentialName`, not for
/// `ISTIO_MUTUAL`).
fn set_crl(common: &mut CommonTlsContext, crl: Option<&str>) {
    let Some(crl) = crl.filter(|c| !c.is_empty()) else {
        return;
    };
    if let Some(common_tls_context::ValidationContextType::CombinedValidationContext(combined)) =
        &mut common.validation_context_type
        && let Some(validation) = &mut combined.default_validation_context
    {
        validation.crl = Some(DataSource {
            specifier: Some(data_source::Specifier::Filename(crl.to_string())),
            ..Default::default()
        });
    }
}

fn combined_validation(
    sans: Vec<SubjectAltNameMatcher>,
    root_secret: &str,
) -> common_tls_context::ValidationContextType {
    common_tls_context::ValidationContextType::CombinedValidationContext(
        common_tls_context::CombinedCertificateValidationContext {
            default_validation_context: Some(CertificateValidationContext {
                match_typed_subject_alt_names: sans,
                ..Default::default()
            }),
            validation_context_sds_secret_config: Some(sds_secret(root_secret)),
            ..Default::default()
        },
    )
}

/// A secret from the sidecar's local SDS server, configured as Istio's bootstrap expects.
pub(super) fn sds_secret(name: &str) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            resource_api_version: ApiVersion::V3 as i32,
            config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: ApiType::Grpc as i32,
                    transport_api_version: ApiVersion::V3 as i32,
                    set_node_on_first_message_only: true,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: SDS_CLUSTER.to_string(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(mode: TlsMode) -> ClientTlsSettings {
        ClientTlsSettings {
            mode: Some(mode),
            ..Default::default()
        }
    }

    fn context(socket: TransportSocket) -> UpstreamTlsContext {
        let Some(transport_socket::ConfigType::TypedConfig(a)) = socket.config_type else {
            panic!("no typed config");
        };
        UpstreamTlsContext::decode(a.value.as_slice()).unwrap()
    }

    #[test]
    fn istio_mutual_uses_sds_default_and_rootca_with_istio_sni() {
        let s = settings(TlsMode::IstioMutual);
        let ctx = context(
            transport_socket(
                Some(&s),
                Flavor::Sidecar,
                "c",
                (9080, "v1", "r.ns.svc.cluster.local"),
                false,
                &mut Vec::new(),
            )
            .unwrap(),
        );
        assert_eq!(ctx.sni, "outbound_.9080_.v1_.r.ns.svc.cluster.local");
        let common = ctx.common_tls_context.unwrap();
        assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
        let Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) =
            common.validation_context_type
        else {
            panic!("combined validation expected");
        };
        assert_eq!(
            v.validation_context_sds_secret_config.unwrap().name,
            "ROOTCA"
        );
    }

    #[test]
    fn proxyless_gets_certificate_providers_and_no_file_tls() {
        let s = settings(TlsMode::IstioMutual);
        let ctx = context(
            transport_socket(
                Some(&s),
                Flavor::Proxyless,
                "c",
                (1, "", "h"),
                false,
                &mut Vec::new(),
            )
            .unwrap(),
        );
        let common = ctx.common_tls_context.unwrap();
        assert!(common.tls_certificate_sds_secret_configs.is_empty());
        assert_eq!(
            common
                .tls_certificate_provider_instance
                .unwrap()
                .instance_name,
            "default"
        );
        let simple = ClientTlsSettings {
            ca_certificates: Some("/etc/ca.pem".into()),
            ..settings(TlsMode::Simple)
        };
        assert!(
            transport_socket(
                Some(&simple),
                Flavor::Proxyless,
                "c",
                (1, "", "h"),
                false,
                &mut Vec::new()
            )
            .is_none()
        );
    }

    #[test]
    fn simple_and_mutual_map_files_and_credentials_to_sds_names() {
        let simple = ClientTlsSettings {
            ca_certificates: Some("/etc/ca.pem".into()),
            ca_crl: Some("/etc/crl.pem".into()),
            subject_alt_names: vec!["api.example.com".into()],
            ..settings(TlsMode::Simple)
        };
        let ctx = context(
            transport_socket(
                Some(&simple),
                Flavor::Sidecar,
                "c",
                (443, "", "api.example.com"),
                false,
                &mut Vec::new(),
            )
            .unwrap(),
        );
        assert_eq!(ctx.sni, "", "no `sni`: Envoy's auto_sni takes the Host");
        let common = ctx.common_tls_context.unwrap();
        assert!(common.tls_certificate_sds_secret_configs.is_empty());
        let Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) =
            common.validation_context_type
        else {
            panic!("combined validation expected");
        };
        assert_eq!(
            v.validation_context_sds_secret_config.unwrap().name,
            "file-root:/etc/ca.pem"
        );
        assert_eq!(
            v.default_validation_context.unwrap().crl.unwrap().specifier,
            Some(data_source::Specifier::Filename("/etc/crl.pem".into())),
            "caCrl: the CRL file of the validation context"
        );
        let mutual = ClientTlsSettings {
            credential_name: Some("client".into()),
            ..settings(TlsMode::Mutual)
        };
        let ctx = context(
            transport_socket(
                Some(&mutual),
                Flavor::Sidecar,
                "c",
                (443, "", "h"),
                false,
                &mut Vec::new(),
            )
            .unwrap(),
        );
        let common = ctx.common_tls_context.unwrap();
        assert_eq!(
            common.tls_certificate_sds_secret_configs[0].name,
            "kubernetes://client"
        );
        assert!(
            transport_socket(
                Some(&settings(TlsMode::Disable)),
                Flavor::Sidecar,
                "c",
                (1, "", "h"),
                false,
                &mut Vec::new()
            )
            .is_none()
        );
    }

    /// The combined validation context's (SAN matchers, root secret), or `None` when the
    /// context is a plain one.
    fn validation(settings: &ClientTlsSettings) -> Option<(Vec<String>, String)> {
        let ctx = context(
            transport_socket(
                Some(settings),
                Flavor::Sidecar,
                "c",
                (443, "", "h"),
                false,
                &mut Vec::new(),
            )
            .unwrap(),
        );
        match ctx.common_tls_context.unwrap().validation_context_type {
            Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) => {
                let sans = v
                    .default_validation_context
                    .unwrap()
                    .match_typed_subject_alt_names
                    .into_iter()
                    .filter_map(|m| match m.matcher?.match_pattern? {
                        MatchPattern::Exact(s) => Some(s),
                        _ => None,
                    })
                    .collect();
                Some((sans, v.validation_context_sds_secret_config.unwrap().name))
            }
            Some(common_tls_context::ValidationContextType::ValidationContext(v)) => {
                assert_eq!(v, CertificateValidationContext::default(), "empty context");
                None
            }
            other => panic!("unexpected validation: {other:?}"),
        }
    }

    #[test]
    fn origination_without_a_ca_verifies_against_the_os_roots() {
        for mode in [TlsMode::Simple, TlsMode::Mutual] {
            let tls = ClientTlsSettings {
                client_certificate: Some("/etc/c.pem".into()),
                private_key: Some("/etc/k.pem".into()),
                ..settings(mode)
            };
            assert_eq!(validation(&tls), Some((vec![], "file-root:system".into())));
            // An empty `caCertificates` is unset to Istio too.
            let empty = ClientTlsSettings {
                ca_certificates: Some(String::new()),
                ..tls.clone()
            };
            assert_eq!(
                validation(&empty),
                Some((vec![], "file-root:system".into()))
            );
            // SANs always come with a CA: never a SAN-only context (Envoy rejects it).
            let sans = ClientTlsSettings {
                subject_alt_names: vec!["api.example.com".into()],
                ..tls.clone()
            };
            assert_eq!(
                validation(&sans),
                Some((vec!["api.example.com".into()], "file-root:system".into()))
            );
            let skip = ClientTlsSettings {
                insecure_skip_verify: Some(true),
                ..sans
            };
            assert_eq!(validation(&skip), None);
        }
        let credential = ClientTlsSettings {
            credential_name: Some("egress".into()),
            ..settings(TlsMode::Simple)
        };
        assert_eq!(
            validation(&credential),
            Some((vec![], "kubernetes://egress-cacert".into()))
        );
    }

    #[test]
    fn the_audit_spots_san_matching_without_a_ca() {
        for mode in [TlsMode::Simple, TlsMode::Mutual, TlsMode::IstioMutual] {
            let tls = ClientTlsSettings {
                subject_alt_names: vec!["a.example.com".into()],
                client_certificate: Some("/c.pem".into()),
                private_key: Some("/k.pem".into()),
                ..settings(mode)
            };
            for flavor in [Flavor::Sidecar, Flavor::Proxyless] {
                if let Some(socket) = transport_socket(
                    Some(&tls),
                    flavor,
                    "c",
                    (1, "", "h"),
                    false,
                    &mut Vec::new(),
                ) {
                    assert!(!matches_sans_without_a_ca(&socket), "{mode:?} {flavor:?}");
                }
            }
        }
        let san_only = UpstreamTlsContext {
            common_tls_context: Some(CommonTlsContext {
                validation_context_type: Some(
                    common_tls_context::ValidationContextType::ValidationContext(
                        CertificateValidationContext {
                            match_typed_subject_alt_names: san_matchers(&["a".into()]),
                            ..Default::default()
                        },
                    ),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let socket = TransportSocket {
            name: TLS_TRANSPORT_SOCKET.into(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(any(&san_only))),
        };
        assert!(matches_sans_without_a_ca(&socket));
    }

    #[test]
    fn auto_sni_and_san_validation_follow_istio() {
        let simple = settings(TlsMode::Simple);
        assert_eq!(
            auto_sni_and_san(Some(&simple), Flavor::Sidecar),
            Some((true, true))
        );
        assert_eq!(auto_sni_and_san(Some(&simple), Flavor::Proxyless), None);
        let with_sans = ClientTlsSettings {
            subject_alt_names: vec!["a".into()],
            ..simple.clone()
        };
        assert_eq!(
            auto_sni_and_san(Some(&with_sans), Flavor::Sidecar),
            Some((true, false))
        );
        let skip = ClientTlsSettings {
            insecure_skip_verify: Some(true),
            ..simple.clone()
        };
        assert_eq!(
            auto_sni_and_san(Some(&skip), Flavor::Sidecar),
            Some((true, false))
        );
        let with_sni = ClientTlsSettings {
            sni: Some("api.example.com".into()),
            ..simple
        };
        assert_eq!(auto_sni_and_san(Some(&with_sni), Flavor::Sidecar), None);
        for mode in [TlsMode::IstioMutual, TlsMode::Disable] {
            assert_eq!(
                auto_sni_and_san(Some(&settings(mode)), Flavor::Sidecar),
                None
            );
        }
        assert_eq!(auto_sni_and_san(None, Flavor::Sidecar), None);
    }
}
