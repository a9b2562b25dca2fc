//! What Pilotfish accepts but does differently from Istio 1.30 (or, like Istio, ignores):
//! each such field that an accepted object sets is reported as a warning naming the field,
//! so `validate`, the object's status condition (`AcceptedWithWarnings`) and the log all
//! say so. DestinationRules have none: every field of theirs is translated. Every field of the networking v1 API that Istio translates is translated by
//! the generators; a field added here says why it is not (the README's "not supported"
//! list follows this file).

use crate::api::{Resolution, ServiceEntrySpec, SidecarSpec, VirtualServiceSpec};
use crate::config::{ConfigError, ConfigKey};

/// Collects the notices about one object.
struct Notices<'k> {
    key: &'k ConfigKey,
    list: Vec<ConfigError>,
}

impl Notices<'_> {
    fn behaviour(&mut self, path: &str, message: &str) {
        self.list
            .push(ConfigError::warning(self.key, path, message));
    }
}

/// Notices about an accepted VirtualService.
pub fn virtual_service_notices(key: &ConfigKey, spec: &VirtualServiceSpec) -> Vec<ConfigError> {
    let mut n = Notices {
        key,
        list: Vec::new(),
    };
    for (i, route) in spec.tcp.iter().enumerate() {
        for (j, m) in route.r#match.iter().enumerate() {
            if m.source_subnet.as_deref().is_some_and(|s| !s.is_empty()) {
                n.behaviour(
                    &format!("spec.tcp[{i}].match[{j}].sourceSubnet"),
                    "ignored: Istio 1.30 does not translate sourceSubnet either, so the match does not test the source address",
                );
            }
        }
    }
    n.list
}

/// Notices about an accepted Sidecar when Sidecar ingress TLS is off (the default). Every
/// field is translated as Istio 1.30 translates it, so only ingress `tls` is noted: Istio
/// ignores it unless `ENABLE_TLS_ON_SIDECAR_INGRESS` is set (Pilotfish:
/// `--enable-tls-on-sidecar-ingress`).
pub fn sidecar_notices(key: &ConfigKey, spec: &SidecarSpec) -> Vec<ConfigError> {
    let mut n = Notices {
        key,
        list: Vec::new(),
    };
    for (i, listener) in spec.ingress.iter().enumerate() {
        if listener.tls.is_some() {
            n.behaviour(
                &format!("spec.ingress[{i}].tls"),
                "ignored, as Istio 1.30 ignores it unless ENABLE_TLS_ON_SIDECAR_INGRESS is set (Pilotfish: --enable-tls-on-sidecar-ingress, chart value controller.enableTlsOnSidecarIngress); the port's chain follows the workload's PeerAuthentication",
            );
        }
    }
    n.list
}

/// Notices about an accepted ServiceEntry.
pub fn service_entry_notices(key: &ConfigKey, spec: &ServiceEntrySpec) -> Vec<ConfigError> {
    let mut n = Notices {
        key,
        list: Vec::new(),
    };
    if spec.resolution == Some(Resolution::DynamicDns) {
        n.behaviour(
            "spec.resolution",
            "DYNAMIC_DNS is served as DNS by Pilotfish (no dynamic forward proxy)",
        );
    }
    n.list
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ConfigKind;
    use serde_json::json;

    fn paths(list: &[ConfigError]) -> Vec<&str> {
        list.iter().map(|e| e.path.as_str()).collect()
    }

    #[test]
    fn translated_fields_get_no_notice_and_behaviours_are_named() {
        let vs: VirtualServiceSpec = serde_json::from_value(json!({
            "hosts": ["a"],
            "tcp": [{"match": [{"destinationSubnets": ["10.0.0.0/8"], "sourceSubnet": "10.1.0.0/16"}], "route": [{"destination": {"host": "a"}}]}],
            "tls": [{"match": [{"sniHosts": ["a"]}], "route": [{"destination": {"host": "a"}}]}]
        }))
        .unwrap();
        let key = ConfigKey::new(ConfigKind::VirtualService, "ns", "n");
        let found = virtual_service_notices(&key, &vs);
        assert_eq!(
            paths(&found),
            ["spec.tcp[0].match[0].sourceSubnet"],
            "destinationSubnets and tls routes are translated; sourceSubnet is ignored as Istio ignores it"
        );
        assert!(found.iter().all(|f| !f.is_error()));
        assert!(found[0].message.contains("Istio 1.30 does not translate"));

        let sidecar: SidecarSpec = serde_json::from_value(json!({
            "egress": [
                {"port": {"number": 9080, "protocol": "HTTP", "name": "h"}, "bind": "127.0.0.1", "captureMode": "NONE", "hosts": ["./*"]},
                {"port": {"number": 0, "protocol": "HTTP", "name": "u"}, "bind": "unix:///var/run/a.sock", "hosts": ["./*"]},
                {"hosts": ["*/*"]}
            ],
            "ingress": [
                {"port": {"number": 9443, "protocol": "HTTPS", "name": "s"}, "bind": "10.0.0.1", "captureMode": "NONE",
                 "connectionPool": {"tcp": {"maxConnections": 1}},
                 "tls": {"mode": "SIMPLE", "serverCertificate": "/c", "privateKey": "/k"}}
            ],
            "inboundConnectionPool": {"tcp": {"maxConnections": 2}}
        }))
        .unwrap();
        let key = ConfigKey::new(ConfigKind::Sidecar, "ns", "n");
        let found = sidecar_notices(&key, &sidecar);
        assert_eq!(
            paths(&found),
            ["spec.ingress[0].tls"],
            "binds, capture modes, Unix sockets and pools are translated; ingress TLS is ignored as Istio ignores it by default"
        );
        assert!(found[0].message.contains("ENABLE_TLS_ON_SIDECAR_INGRESS"));

        let se: ServiceEntrySpec = serde_json::from_value(json!({
            "hosts": ["a.example"],
            "subjectAltNames": ["spiffe://x"],
            "resolution": "DYNAMIC_DNS",
            "endpoints": [{"address": "10.0.0.1", "network": "n1", "serviceAccount": "sa"}]
        }))
        .unwrap();
        let key = ConfigKey::new(ConfigKind::ServiceEntry, "ns", "n");
        assert_eq!(
            paths(&service_entry_notices(&key, &se)),
            ["spec.resolution"],
            "subjectAltNames and the endpoints' network and serviceAccount are translated"
        );
    }
}
