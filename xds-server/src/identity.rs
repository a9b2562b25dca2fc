//! Who is on the other end of a request on the secure port ([`Caller`]: the identities
//! its token or client certificate proved), and Istio's rule for which xDS node such a
//! caller may claim ([`authorize_node`]). Authentication itself lives in `secure`; this
//! module is what the ADS engine and the CA read, so neither depends on how a caller
//! was authenticated.

use pilotfish_mesh::model::{Proxy, SpiffeId};

/// How a caller proved its identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthSource {
    /// A Kubernetes service-account token (`authorization: Bearer`), reviewed by the API
    /// server.
    Token,
    /// A client certificate issued by this mesh's CA (its URI SANs).
    Certificate,
}

impl AuthSource {
    pub fn as_str(self) -> &'static str {
        match self {
            AuthSource::Token => "token",
            AuthSource::Certificate => "certificate",
        }
    }
}

/// An authenticated caller, attached to each request (HTTP extension) on the secure
/// port before any message is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Never empty.
    pub identities: Vec<SpiffeId>,
    pub source: AuthSource,
}

impl Caller {
    pub fn names(&self) -> String {
        self.identities
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A node claiming what its caller's identity does not allow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "authorization failed: no identity of this stream ({identities}) is in namespace {namespace:?}{account}; \
     the node's NAMESPACE (or the namespace in its id) and SERVICE_ACCOUNT metadata must match the service account \
     the stream authenticated as"
)]
pub struct NodeAuthzError {
    pub identities: String,
    pub namespace: String,
    pub account: String,
}

impl NodeAuthzError {
    /// `PERMISSION_DENIED`, as istiod answers.
    pub fn into_status(self) -> tonic::Status {
        tonic::Status::permission_denied(self.to_string())
    }
}

/// Istio's `checkConnectionIdentity`: the first identity in the node's namespace (and
/// of its `SERVICE_ACCOUNT`, when the node names one) is the stream's verified identity;
/// none: the stream is refused.
pub fn authorize_node(caller: &Caller, proxy: &Proxy) -> Result<SpiffeId, NodeAuthzError> {
    caller
        .identities
        .iter()
        .find(|id| {
            id.namespace == proxy.namespace
                && proxy
                    .service_account
                    .as_ref()
                    .is_none_or(|sa| *sa == id.service_account)
        })
        .cloned()
        .ok_or_else(|| NodeAuthzError {
            identities: caller.names(),
            namespace: proxy.namespace.clone(),
            account: proxy
                .service_account
                .as_ref()
                .map(|sa| format!(" with service account {sa:?}"))
                .unwrap_or_default(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(ids: &[(&str, &str)]) -> Caller {
        Caller {
            identities: ids
                .iter()
                .map(|(ns, sa)| SpiffeId::new("cluster.local", *ns, *sa))
                .collect(),
            source: AuthSource::Token,
        }
    }

    fn proxy(ns: &str, sa: Option<&str>) -> Proxy {
        Proxy {
            namespace: ns.into(),
            service_account: sa.map(Into::into),
            ..Proxy::with_defaults("sidecar~10.0.0.1~a.b~b.svc.cluster.local")
        }
    }

    #[test]
    fn namespace_must_match() {
        let c = caller(&[("bookinfo", "reviews")]);
        assert_eq!(
            authorize_node(&c, &proxy("bookinfo", None)).unwrap(),
            SpiffeId::new("cluster.local", "bookinfo", "reviews")
        );
        let err = authorize_node(&c, &proxy("kube-system", None)).unwrap_err();
        assert!(
            err.to_string().contains("namespace \"kube-system\""),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("spiffe://cluster.local/ns/bookinfo/sa/reviews")
        );
        assert_eq!(err.into_status().code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn service_account_must_match_when_the_node_names_one() {
        let c = caller(&[("bookinfo", "reviews"), ("bookinfo", "ratings")]);
        assert_eq!(
            authorize_node(&c, &proxy("bookinfo", Some("ratings")))
                .unwrap()
                .service_account,
            "ratings"
        );
        assert!(authorize_node(&c, &proxy("bookinfo", Some("details"))).is_err());
    }
}
