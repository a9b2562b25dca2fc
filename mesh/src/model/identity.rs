//! Workload identity as Istio names it: the SPIFFE id
//! `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`, which the CA writes into
//! a workload certificate's URI SAN and which an authenticated xDS stream carries.

use std::fmt;
use std::str::FromStr;

/// A SPIFFE identity in Istio's Kubernetes form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpiffeId {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

/// Why a string is not an Istio SPIFFE id.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpiffeIdError {
    #[error("{0:?} does not start with spiffe://")]
    Scheme(String),
    #[error("{0:?} is not spiffe://<trust domain>/ns/<namespace>/sa/<service account>")]
    Shape(String),
}

impl SpiffeId {
    pub fn new(
        trust_domain: impl Into<String>,
        namespace: impl Into<String>,
        service_account: impl Into<String>,
    ) -> Self {
        SpiffeId {
            trust_domain: trust_domain.into(),
            namespace: namespace.into(),
            service_account: service_account.into(),
        }
    }
}

impl fmt::Display for SpiffeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl FromStr for SpiffeId {
    type Err = SpiffeIdError;

    /// Parses Istio's form only (as `spiffe.ParseIdentity` does): exactly the segments
    /// `ns/<namespace>/sa/<service account>` after a non-empty trust domain.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rest = s
            .strip_prefix("spiffe://")
            .ok_or_else(|| SpiffeIdError::Scheme(s.to_string()))?;
        let parts: Vec<&str> = rest.split('/').collect();
        match parts[..] {
            [td, "ns", ns, "sa", sa] if !td.is_empty() && !ns.is_empty() && !sa.is_empty() => {
                Ok(SpiffeId::new(td, ns, sa))
            }
            _ => Err(SpiffeIdError::Shape(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_istio_form() {
        let id: SpiffeId = "spiffe://cluster.local/ns/bookinfo/sa/reviews"
            .parse()
            .unwrap();
        assert_eq!(id, SpiffeId::new("cluster.local", "bookinfo", "reviews"));
        assert_eq!(
            id.to_string(),
            "spiffe://cluster.local/ns/bookinfo/sa/reviews"
        );
    }

    #[test]
    fn refuses_other_shapes() {
        for bad in [
            "spiffe://cluster.local/ns/a",
            "spiffe:///ns/a/sa/b",
            "spiffe://td/ns/a/sa/b/extra",
            "spiffe://td/sa/b/ns/a",
            "spiffe://td/ns//sa/b",
        ] {
            assert!(
                matches!(bad.parse::<SpiffeId>(), Err(SpiffeIdError::Shape(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            "https://td/ns/a/sa/b".parse::<SpiffeId>(),
            Err(SpiffeIdError::Scheme(_))
        ));
    }
}
