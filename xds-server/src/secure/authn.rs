//! Authenticating a secure-port request before any of its messages is read, as istiod
//! does for xDS and CSRs alike: first the client certificate (verified against the mesh
//! roots in the handshake; its SPIFFE URI SANs are the identities), then the
//! `authorization: Bearer` service-account token (reviewed by the API server for our
//! audiences; the identity is `spiffe://<trust domain>/ns/<ns>/sa/<sa>`).

use std::sync::Arc;
use std::time::Instant;

use pilotfish_ca::pem;
use pilotfish_mesh::model::SpiffeId;
use tracing::debug;

use super::review::{ReviewCache, ReviewedToken, TokenReviewer};
use super::tls::PeerCertificates;
use crate::identity::{AuthSource, Caller};

/// Why a request was not authenticated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthnError {
    #[error(
        "no credentials: send the workload's Kubernetes service-account token (audience {audiences}) as `authorization: Bearer <token>`, or a client certificate issued by this mesh's CA"
    )]
    NoCredentials { audiences: String },
    #[error(
        "the client certificate carries no SPIFFE identity (spiffe://<trust domain>/ns/<namespace>/sa/<service account>); its URI SANs: {0:?}"
    )]
    CertificateWithoutIdentity(Vec<String>),
    #[error("the `authorization` header is not `Bearer <token>`")]
    MalformedHeader,
    #[error("the service-account token was refused: {0}")]
    TokenRefused(String),
    #[error(
        "tokens cannot be reviewed: this replica has no Kubernetes API access; authenticate with a client certificate"
    )]
    NoReviewer,
    #[error("cannot review the token now ({0}); retry")]
    ReviewUnavailable(String),
}

impl AuthnError {
    /// `UNAVAILABLE` when the API server could not be asked (the client should retry,
    /// perhaps on another replica), `UNAUTHENTICATED` otherwise.
    pub fn into_status(self) -> tonic::Status {
        match self {
            AuthnError::ReviewUnavailable(_) => tonic::Status::unavailable(self.to_string()),
            _ => tonic::Status::unauthenticated(self.to_string()),
        }
    }

    /// Label for `pilotfish_secure_requests_total{result}`.
    pub fn result(&self) -> &'static str {
        match self {
            AuthnError::ReviewUnavailable(_) => "unavailable",
            _ => "refused",
        }
    }
}

/// Authenticates requests; shared by every connection of the secure port.
pub struct Authenticator {
    trust_domain: String,
    audiences: Vec<String>,
    reviewer: Option<Arc<dyn TokenReviewer>>,
    cache: ReviewCache,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("trust_domain", &self.trust_domain)
            .field("audiences", &self.audiences)
            .field("token_review", &self.reviewer.is_some())
            .field("cache", &self.cache)
            .finish()
    }
}

fn bearer(headers: &http::HeaderMap) -> Result<Option<&str>, AuthnError> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| AuthnError::MalformedHeader)?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthnError::MalformedHeader)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(AuthnError::MalformedHeader);
    }
    Ok(Some(token.trim()))
}

impl Authenticator {
    /// `reviewer`: `None` when this replica has no Kubernetes API (tokens are refused).
    pub fn new(
        trust_domain: String,
        audiences: Vec<String>,
        reviewer: Option<Arc<dyn TokenReviewer>>,
    ) -> Self {
        Authenticator {
            trust_domain,
            audiences,
            reviewer,
            cache: ReviewCache::default(),
        }
    }

    /// Who sent a request with these headers over a connection with these client
    /// certificates.
    pub async fn authenticate(
        &self,
        headers: &http::HeaderMap,
        peer: Option<&PeerCertificates>,
    ) -> Result<Caller, AuthnError> {
        let certificate_error = match peer.and_then(|p| p.0.first()) {
            Some(leaf) => {
                let sans = pem::uri_sans(leaf);
                let identities: Vec<SpiffeId> =
                    sans.iter().filter_map(|s| s.parse().ok()).collect();
                if !identities.is_empty() {
                    return Ok(Caller {
                        identities,
                        source: AuthSource::Certificate,
                    });
                }
                Some(AuthnError::CertificateWithoutIdentity(sans))
            }
            None => None,
        };
        match bearer(headers)? {
            Some(token) => self.token(token).await,
            None => Err(
                certificate_error.unwrap_or_else(|| AuthnError::NoCredentials {
                    audiences: self.audiences.join(", "),
                }),
            ),
        }
    }

    async fn token(&self, token: &str) -> Result<Caller, AuthnError> {
        let reviewer = self.reviewer.as_ref().ok_or(AuthnError::NoReviewer)?;
        let key = ReviewCache::key(token);
        let now = Instant::now();
        let answer = match self.cache.get(&key, now) {
            Some(answer) => answer,
            None => {
                let answer = reviewer
                    .review(token, &self.audiences)
                    .await
                    .map_err(|e| AuthnError::ReviewUnavailable(e.to_string()))?;
                self.cache.put(key, answer.clone(), Instant::now());
                answer
            }
        };
        let ReviewedToken {
            namespace,
            service_account,
            pod_name,
        } = answer.map_err(AuthnError::TokenRefused)?;
        debug!(%namespace, %service_account, pod = ?pod_name, "token authenticated");
        Ok(Caller {
            identities: vec![SpiffeId::new(
                self.trust_domain.clone(),
                namespace,
                service_account,
            )],
            source: AuthSource::Token,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::BoxFuture;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::super::review::ReviewError;

    /// Accepts `good` as bookinfo/reviews, refuses everything else; counts calls.
    struct Fixed(AtomicUsize);

    impl TokenReviewer for Fixed {
        fn review<'a>(
            &'a self,
            token: &'a str,
            audiences: &'a [String],
        ) -> BoxFuture<'a, Result<Result<ReviewedToken, String>, ReviewError>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            let answer = match token {
                "good" if audiences == ["istio-ca"] => Ok(Ok(ReviewedToken {
                    namespace: "bookinfo".into(),
                    service_account: "reviews".into(),
                    pod_name: None,
                })),
                "down" => Err(ReviewError("connection refused".into())),
                _ => Ok(Err("token audiences [\"other\"] is invalid".into())),
            };
            Box::pin(async move { answer })
        }
    }

    fn headers(value: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[tokio::test]
    async fn tokens_are_reviewed_once_then_cached() {
        let reviewer = Arc::new(Fixed(AtomicUsize::new(0)));
        let authn = Authenticator::new(
            "cluster.local".into(),
            vec!["istio-ca".into()],
            Some(reviewer.clone()),
        );
        for _ in 0..3 {
            let caller = authn
                .authenticate(&headers("Bearer good"), None)
                .await
                .unwrap();
            assert_eq!(
                caller.identities,
                [SpiffeId::new("cluster.local", "bookinfo", "reviews")]
            );
            assert_eq!(caller.source, AuthSource::Token);
        }
        assert_eq!(reviewer.0.load(Ordering::Relaxed), 1);
        let refused = authn
            .authenticate(&headers("Bearer other"), None)
            .await
            .unwrap_err();
        assert!(matches!(refused, AuthnError::TokenRefused(_)));
        assert_eq!(
            refused.clone().into_status().code(),
            tonic::Code::Unauthenticated
        );
        let down = authn
            .authenticate(&headers("Bearer down"), None)
            .await
            .unwrap_err();
        assert_eq!(down.into_status().code(), tonic::Code::Unavailable);
        assert_eq!(
            authn.authenticate(&headers("Basic abc"), None).await,
            Err(AuthnError::MalformedHeader)
        );
        let none = authn
            .authenticate(&http::HeaderMap::new(), None)
            .await
            .unwrap_err();
        assert!(none.to_string().contains("audience istio-ca"), "{none}");
    }

    #[tokio::test]
    async fn without_a_reviewer_tokens_are_refused() {
        let authn = Authenticator::new("cluster.local".into(), vec!["istio-ca".into()], None);
        assert_eq!(
            authn.authenticate(&headers("Bearer good"), None).await,
            Err(AuthnError::NoReviewer)
        );
    }
}
