//! The identities a host's servers present, as Istio's `PushContext.ServiceAccounts`: a
//! ServiceEntry's `subjectAltNames` and the SPIFFE ids of the host's endpoints' service
//! accounts (`spiffe://<trust domain>/ns/<namespace>/sa/<account>`: Pods' service
//! accounts, ServiceEntry `endpoints[].serviceAccount`), sorted and deduplicated.
//!
//! Istio verifies them where a DestinationRule names no `subjectAltNames` of its own:
//! `ISTIO_MUTUAL` origination to any host, and `SIMPLE`/`MUTUAL` origination to
//! ServiceEntry hosts ([`with_default_sans`]).

use std::borrow::Cow;
use std::collections::BTreeSet;

use pilotfish_mesh::api::{ClientTlsSettings, TlsMode};
use pilotfish_mesh::model::{Service, ServiceEndpoints, ServiceOrigin, SpiffeId};
use pilotfish_mesh::push_context::PushContext;

/// The identities of `service`'s servers.
pub fn service_accounts(push: &PushContext, service: &Service) -> Vec<String> {
    let mut out: BTreeSet<String> = service.subject_alt_names.iter().cloned().collect();
    if let Some(eps) = push.endpoints(service) {
        out.extend(endpoint_identities(
            eps,
            &service.namespace,
            &push.mesh().trust_domain,
        ));
    }
    out.into_iter().collect()
}

/// The SPIFFE ids of the endpoints' service accounts (in `namespace`, the service's).
pub fn endpoint_identities(
    eps: &ServiceEndpoints,
    namespace: &str,
    trust_domain: &str,
) -> BTreeSet<String> {
    eps.ports
        .iter()
        .flat_map(|p| &p.endpoints)
        .filter_map(|e| e.service_account.as_deref())
        .filter(|sa| !sa.is_empty())
        .map(|sa| SpiffeId::new(trust_domain, namespace, sa).to_string())
        .collect()
}

/// The TLS settings a cluster of `service` is built from: the DestinationRule's, with the
/// host's identities as `subjectAltNames` where Istio puts them — `ISTIO_MUTUAL`, and
/// `SIMPLE`/`MUTUAL` to a ServiceEntry host — when the rule names none. For `SIMPLE`/
/// `MUTUAL` there is always a root to verify against (the rule's, else the OS roots as
/// `file-root:system`), so SANs never come without a CA.
pub fn with_default_sans<'a>(
    tls: Option<&'a ClientTlsSettings>,
    push: &PushContext,
    service: &Service,
) -> Option<Cow<'a, ClientTlsSettings>> {
    let tls = tls?;
    if !tls.subject_alt_names.is_empty() {
        return Some(Cow::Borrowed(tls));
    }
    let applies = match tls.mode {
        Some(TlsMode::IstioMutual) => true,
        Some(TlsMode::Simple | TlsMode::Mutual) => {
            matches!(service.origin, ServiceOrigin::ServiceEntry { .. })
        }
        _ => false,
    };
    if !applies {
        return Some(Cow::Borrowed(tls));
    }
    let sans = service_accounts(push, service);
    if sans.is_empty() {
        return Some(Cow::Borrowed(tls));
    }
    Some(Cow::Owned(ClientTlsSettings {
        subject_alt_names: sans,
        ..tls.clone()
    }))
}
