//! PeerAuthentication as Istio 1.30 judges it: the webhook's `ValidatePeerAuthentication`
//! (port-level settings only with a selector, at least one of them when the field is
//! present, ports 1..65535, the workload selector's label rules) and the CRD's rules
//! (`portLevelMtls requires selector`, `minProperties: 1`, the port range, at most 4096
//! selector labels of at most 63 characters each).

use super::Validated;
use super::common::*;
use crate::api::{PeerAuthentication, PeerAuthenticationSpec};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;

/// Istio's CRD: `maxProperties: 4096` on the selector's labels.
const MAX_SELECTOR_LABELS: usize = 4096;

/// Validates one PeerAuthentication.
pub fn validate_peer_authentication(pa: &PeerAuthentication) -> Validated<PeerAuthenticationSpec> {
    let namespace = namespace_of(&pa.metadata);
    let key = ConfigKey::new(
        ConfigKind::PeerAuthentication,
        &namespace,
        pa.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    check_annotations(&mut f, pa.metadata.annotations.as_ref());
    let spec = &pa.spec;
    if let Some(ports) = &spec.port_level_mtls {
        if !spec.has_workload_selector() {
            f.error(
                "spec.portLevelMtls",
                "port-level mTLS needs a workload selector with labels (a mesh or namespace policy cannot have it)",
            );
        }
        if ports.is_empty() {
            f.error(
                "spec.portLevelMtls",
                "port-level mTLS, when present, must have at least one port",
            );
        }
        for port in ports.keys() {
            if *port == 0 || *port > 65535 {
                f.error(
                    format!("spec.portLevelMtls[{port}]"),
                    format!("port {port} is not in 1..65535"),
                );
            }
        }
    }
    if let Some(sel) = &spec.selector {
        check_workload_selector(
            &mut f,
            "spec.selector.matchLabels",
            &sel.match_labels,
            MAX_SELECTOR_LABELS,
            "the selector has no labels, so the policy applies to the whole namespace (the mesh, in the root namespace)",
        );
    }
    Validated::new(spec.clone(), f.list)
}
