//! The mutual TLS side of a sidecar's `virtualInbound`, as Istio 1.30 builds it from the
//! workload's PeerAuthentication mode (`pilot/pkg/networking/core/filterchain_options.go`,
//! `pilot/pkg/security/authn/utils`):
//!
//! - [`chain_options`]: which filter chains one port (or the passthrough) gets — STRICT: only
//!   TLS-terminating chains (`transport_protocol: tls`); PERMISSIVE: a chain terminating
//!   mTLS for Istio's ALPNs, TLS from other clients passed through untouched (TCP only),
//!   and plaintext (`raw_buffer`); DISABLE: plaintext only.
//! - [`downstream_tls`]: the terminating chains' `DownstreamTlsContext` — a client
//!   certificate required, the workload certificate and root from the sidecar's own SDS
//!   server (secrets `default` and `ROOTCA` over `sds-grpc`; Pilotfish never sees a key),
//!   peers accepted from the mesh's trust domain, Istio's ALPN, ciphers and TLS versions.
//! - [`tls_inspector`]: the listener filter that detects TLS and ALPN, enabled for exactly
//!   the ports whose chains match on them (Istio's per-port `filter_disabled` predicates),
//!   so a DISABLE port keeps its plaintext semantics even for TLS clients.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{
    FilterChain, ListenerFilter, ListenerFilterChainMatchPredicate, listener_filter,
    listener_filter_chain_match_predicate::{MatchSet, Rule},
};
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, TlsParameters,
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters::TlsProtocol,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::envoy::r#type::v3::Int32Range;
use pilotfish_mesh::api::MtlsMode;

use super::tls::{SDS_ROOT_SECRET, SDS_WORKLOAD_SECRET, TLS_TRANSPORT_SOCKET, sds_secret};
use super::util::{any, bool_value};

pub const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
/// Envoy's transport protocols as its listener filters name them.
pub const TRANSPORT_TLS: &str = "tls";
pub const TRANSPORT_RAW: &str = "raw_buffer";

/// Every ALPN an Istio client sidecar offers over mTLS (`allIstioMtlsALPNs`): a PERMISSIVE
/// port terminates TLS only for these, and passes other TLS through.
pub const ISTIO_MTLS_ALPNS: [&str; 5] = [
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];

/// The server's ALPN for HTTP chains (`ALPNHttp`) and for TCP chains with Istio's metadata
/// exchange (`ALPNDownstreamWithMxc`).
const HTTP_ALPN: [&str; 2] = ["h2", "http/1.1"];
const TCP_ALPN: [&str; 3] = ["istio-peer-exchange", "h2", "http/1.1"];

/// Istio's server cipher suites for sidecars (`SupportedCiphers`).
const CIPHER_SUITES: [&str; 6] = [
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-GCM-SHA256",
];

/// What a chain's filters speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainProtocol {
    Http,
    Tcp,
}

/// One filter chain of a port: what it matches and whether it terminates mTLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainOption {
    /// ALPN values the chain matches (empty: any).
    pub alpn: &'static [&'static str],
    pub transport: &'static str,
    /// The chain terminates mTLS ([`downstream_tls`]); otherwise bytes pass as they came.
    pub terminate_tls: bool,
}

const MTLS_ISTIO: ChainOption = ChainOption {
    alpn: &ISTIO_MTLS_ALPNS,
    transport: TRANSPORT_TLS,
    terminate_tls: true,
};
const MTLS_ANY: ChainOption = ChainOption {
    alpn: &[],
    transport: TRANSPORT_TLS,
    terminate_tls: true,
};
const TLS_PASSTHROUGH: ChainOption = ChainOption {
    alpn: &[],
    transport: TRANSPORT_TLS,
    terminate_tls: false,
};
const PLAINTEXT: ChainOption = ChainOption {
    alpn: &[],
    transport: TRANSPORT_RAW,
    terminate_tls: false,
};

/// The chains of one port in `mode` (Istio's `getFilterChainMatchOptions` for HTTP and TCP
/// listener protocols), in Istio's order.
pub fn chain_options(mode: MtlsMode, protocol: ChainProtocol) -> &'static [ChainOption] {
    match (mode, protocol) {
        (MtlsMode::Strict, _) => &[MTLS_ANY],
        (MtlsMode::Permissive, ChainProtocol::Http) => &[MTLS_ISTIO, PLAINTEXT],
        (MtlsMode::Permissive, ChainProtocol::Tcp) => &[MTLS_ISTIO, TLS_PASSTHROUGH, PLAINTEXT],
        // UNSET never reaches here (the composed mode has none); treat it as DISABLE.
        (MtlsMode::Disable | MtlsMode::Unset, _) => &[PLAINTEXT],
    }
}

/// The transport socket of a chain terminating mTLS (Istio's `BuildInboundTLS`).
pub fn downstream_tls(protocol: ChainProtocol, trust_domain: &str) -> TransportSocket {
    let alpn: &[&str] = match protocol {
        ChainProtocol::Http => &HTTP_ALPN,
        ChainProtocol::Tcp => &TCP_ALPN,
    };
    // Peers are accepted from the mesh's trust domain (Istio: TrustDomainsForValidation).
    let san = (!trust_domain.is_empty()).then(|| StringMatcher {
        match_pattern: Some(MatchPattern::Prefix(format!("spiffe://{trust_domain}/"))),
        ..Default::default()
    });
    #[allow(deprecated)] // Istio sets the (deprecated) plain SAN matcher list.
    let validation = CertificateValidationContext {
        match_subject_alt_names: san.into_iter().collect(),
        ..Default::default()
    };
    let context = DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: Some(TlsParameters {
                tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
                tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
                cipher_suites: CIPHER_SUITES.iter().map(|c| c.to_string()).collect(),
                ..Default::default()
            }),
            alpn_protocols: alpn.iter().map(|a| a.to_string()).collect(),
            tls_certificate_sds_secret_configs: vec![sds_secret(SDS_WORKLOAD_SECRET)],
            validation_context_type: Some(ValidationContextType::CombinedValidationContext(
                CombinedCertificateValidationContext {
                    default_validation_context: Some(validation),
                    validation_context_sds_secret_config: Some(sds_secret(SDS_ROOT_SECRET)),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        require_client_certificate: bool_value(true),
        ..Default::default()
    };
    TransportSocket {
        name: TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any(&context))),
    }
}

/// The TLS inspector for `chains` (Istio's `buildTLSInspector`): `None` when no chain
/// matches on TLS; otherwise enabled where needed. Port 0 stands for chains without a
/// destination port (the passthrough): when those need it, it is disabled only on the
/// ports whose chains do not; else it is enabled only on the ports that need it.
pub fn tls_inspector(chains: &[FilterChain]) -> Option<ListenerFilter> {
    let mut needs: BTreeMap<u32, bool> = BTreeMap::new();
    for chain in chains {
        let m = chain.filter_chain_match.as_ref();
        let port = m
            .and_then(|m| m.destination_port.as_ref())
            .map_or(0, |p| p.value);
        let tls = m.is_some_and(|m| m.transport_protocol == TRANSPORT_TLS);
        *needs.entry(port).or_default() |= tls;
    }
    if !needs.values().any(|n| *n) {
        return None;
    }
    let default_enabled = needs.get(&0).copied().unwrap_or(false);
    let ports: Vec<u32> = needs
        .iter()
        .filter(|(port, need)| **port != 0 && **need != default_enabled)
        .map(|(port, _)| *port)
        .collect();
    let filter_disabled = (!ports.is_empty()).then(|| {
        let listed = ports_predicate(&ports);
        if default_enabled {
            listed
        } else {
            ListenerFilterChainMatchPredicate {
                rule: Some(Rule::NotMatch(Box::new(listed))),
            }
        }
    });
    Some(ListenerFilter {
        name: TLS_INSPECTOR.to_string(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any(
            &TlsInspector::default(),
        ))),
        filter_disabled,
    })
}

/// A predicate matching connections to any of `ports` (one range each, or-ed).
fn ports_predicate(ports: &[u32]) -> ListenerFilterChainMatchPredicate {
    let mut rules: Vec<ListenerFilterChainMatchPredicate> = ports
        .iter()
        .map(|p| ListenerFilterChainMatchPredicate {
            rule: Some(Rule::DestinationPortRange(Int32Range {
                start: *p as i32,
                end: *p as i32 + 1,
            })),
        })
        .collect();
    if rules.len() == 1 {
        return rules.remove(0);
    }
    ListenerFilterChainMatchPredicate {
        rule: Some(Rule::OrMatch(MatchSet { rules })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::listener::v3::FilterChainMatch;
    use prost::Message;

    fn chain(port: Option<u32>, transport: &str) -> FilterChain {
        FilterChain {
            filter_chain_match: Some(FilterChainMatch {
                destination_port: port.and_then(super::super::util::u32_value),
                transport_protocol: transport.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn modes_give_istios_chains() {
        use ChainProtocol::*;
        assert_eq!(chain_options(MtlsMode::Strict, Http), &[MTLS_ANY]);
        assert_eq!(chain_options(MtlsMode::Strict, Tcp), &[MTLS_ANY]);
        assert_eq!(
            chain_options(MtlsMode::Permissive, Http),
            &[MTLS_ISTIO, PLAINTEXT]
        );
        assert_eq!(
            chain_options(MtlsMode::Permissive, Tcp),
            &[MTLS_ISTIO, TLS_PASSTHROUGH, PLAINTEXT]
        );
        assert_eq!(chain_options(MtlsMode::Disable, Tcp), &[PLAINTEXT]);
        // No mode lets plaintext reach a STRICT port.
        assert!(
            chain_options(MtlsMode::Strict, Tcp)
                .iter()
                .all(|o| o.transport == TRANSPORT_TLS && o.terminate_tls)
        );
    }

    #[test]
    fn downstream_tls_requires_a_client_certificate_from_the_trust_domain() {
        let socket = downstream_tls(ChainProtocol::Tcp, "cluster.local");
        let Some(transport_socket::ConfigType::TypedConfig(any)) = socket.config_type else {
            panic!("typed config")
        };
        let ctx = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
        assert_eq!(ctx.require_client_certificate, bool_value(true));
        let common = ctx.common_tls_context.unwrap();
        assert_eq!(common.alpn_protocols, TCP_ALPN);
        assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
        let Some(ValidationContextType::CombinedValidationContext(v)) =
            common.validation_context_type
        else {
            panic!("combined validation")
        };
        assert_eq!(
            v.validation_context_sds_secret_config.unwrap().name,
            "ROOTCA"
        );
        #[allow(deprecated)]
        let sans = v
            .default_validation_context
            .unwrap()
            .match_subject_alt_names;
        assert_eq!(
            sans[0].match_pattern,
            Some(MatchPattern::Prefix("spiffe://cluster.local/".into()))
        );
    }

    #[test]
    fn tls_inspector_follows_the_ports_that_need_it() {
        // Nothing matches on TLS: no inspector.
        assert_eq!(tls_inspector(&[chain(Some(80), TRANSPORT_RAW)]), None);
        // Passthrough needs it, port 80 does not: disabled on 80 only.
        let f = tls_inspector(&[
            chain(None, TRANSPORT_TLS),
            chain(Some(80), TRANSPORT_RAW),
            chain(Some(81), TRANSPORT_TLS),
        ])
        .unwrap();
        assert_eq!(
            f.filter_disabled.unwrap().rule,
            Some(Rule::DestinationPortRange(Int32Range {
                start: 80,
                end: 81
            }))
        );
        // Passthrough does not, 80 and 81 do: disabled everywhere but on them.
        let f = tls_inspector(&[
            chain(None, TRANSPORT_RAW),
            chain(Some(80), TRANSPORT_TLS),
            chain(Some(81), TRANSPORT_TLS),
            chain(Some(82), TRANSPORT_RAW),
        ])
        .unwrap();
        let Some(Rule::NotMatch(inner)) = f.filter_disabled.unwrap().rule else {
            panic!("not match")
        };
        let Some(Rule::OrMatch(set)) = inner.rule else {
            panic!("or match")
        };
        assert_eq!(set.rules.len(), 2);
        // Everyone needs it: enabled without a predicate.
        let f = tls_inspector(&[chain(None, TRANSPORT_TLS), chain(Some(80), TRANSPORT_TLS)]);
        assert_eq!(f.unwrap().filter_disabled, None);
    }
}
