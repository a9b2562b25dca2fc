//! Service-account tokens reviewed by the Kubernetes API (`TokenReview`, the only call
//! this tier makes to it), behind a small cache.
//!
//! The API server answers whether the token is still valid *now*: signed by the cluster,
//! not expired, for one of our audiences, and its service account and bound Pod still
//! exist (deleting a Pod revokes its tokens). Verifying tokens offline against the
//! issuer's keys would save these calls but could not see a deleted Pod until the token
//! expired (Istio's projected tokens live 12 h); see docs/SECURITY.md. The cache keeps
//! each answer briefly — [`ReviewCache::AUTHENTICATED_FOR`] for accepted tokens,
//! [`ReviewCache::REFUSED_FOR`] for refused ones — keyed by the token's SHA-256 (tokens
//! themselves are not kept), and holds at most [`ReviewCache::CAPACITY`] entries.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};

use super::metrics;

/// The service account a token belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReviewedToken {
    pub namespace: String,
    pub service_account: String,
    /// `authentication.kubernetes.io/pod-name` of a Pod-bound token.
    pub pod_name: Option<String>,
}

/// The API server could not be asked (as opposed to: it refused the token).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("TokenReview failed: {0}")]
pub struct ReviewError(pub String);

/// Reviews tokens: `Ok(Ok(_))` accepted, `Ok(Err(why))` refused, `Err(_)` not asked.
pub trait TokenReviewer: Send + Sync {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audiences: &'a [String],
    ) -> BoxFuture<'a, Result<Result<ReviewedToken, String>, ReviewError>>;
}

/// Istio's reading of a TokenReview status (`security/pkg/k8s/tokenreview`): accepted
/// only when authenticated, in the `system:serviceaccounts` group, with a username
/// `system:serviceaccount:<namespace>:<name>`.
pub fn read_status(
    status: Option<&k8s_openapi::api::authentication::v1::TokenReviewStatus>,
) -> Result<ReviewedToken, String> {
    let Some(status) = status else {
        return Err("the TokenReview has no status".into());
    };
    if let Some(error) = status.error.as_deref().filter(|e| !e.is_empty()) {
        return Err(format!(
            "the service account authentication returns an error: {error}"
        ));
    }
    if status.authenticated != Some(true) {
        return Err("the token is not authenticated".into());
    }
    let user = status.user.clone().unwrap_or_default();
    if !user
        .groups
        .iter()
        .flatten()
        .any(|g| g == "system:serviceaccounts")
    {
        return Err("the token is not a service account's".into());
    }
    let username = user.username.unwrap_or_default();
    let parts: Vec<&str> = username.split(':').collect();
    let ["system", "serviceaccount", namespace, name] = parts[..] else {
        return Err(format!(
            "unexpected username {username:?} (want system:serviceaccount:<namespace>:<name>)"
        ));
    };
    if namespace.is_empty() || name.is_empty() {
        return Err(format!(
            "username {username:?} names no namespace or account"
        ));
    }
    let pod_name = user
        .extra
        .as_ref()
        .and_then(|e| e.get("authentication.kubernetes.io/pod-name"))
        .and_then(|v| v.first().cloned());
    Ok(ReviewedToken {
        namespace: namespace.to_string(),
        service_account: name.to_string(),
        pod_name,
    })
}

/// TokenReview through a Kubernetes client (RBAC: `create` on `tokenreviews`, nothing
/// else).
pub struct KubeTokenReviewer {
    api: Api<TokenReview>,
}

impl KubeTokenReviewer {
    pub fn new(client: kube::Client) -> Self {
        KubeTokenReviewer {
            api: Api::all(client),
        }
    }
}

impl TokenReviewer for KubeTokenReviewer {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audiences: &'a [String],
    ) -> BoxFuture<'a, Result<Result<ReviewedToken, String>, ReviewError>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: Some(token.to_string()),
                    audiences: Some(audiences.to_vec()),
                },
                ..TokenReview::default()
            };
            let answer = self
                .api
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| ReviewError(e.to_string()));
            let result = answer.map(|r| read_status(r.status.as_ref()));
            let label = match &result {
                Ok(Ok(_)) => "authenticated",
                Ok(Err(_)) => "refused",
                Err(_) => "error",
            };
            metrics::TOKEN_REVIEWS.with_label_values(&[label]).inc();
            result
        })
    }
}

type Answer = Result<ReviewedToken, String>;

/// Recent TokenReview answers by token hash; bounded in time and count.
#[derive(Default)]
pub struct ReviewCache {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_token: HashMap<[u8; 32], (Answer, Instant)>,
    /// Insertion order, for evicting the oldest when full.
    order: VecDeque<[u8; 32]>,
}

impl std::fmt::Debug for ReviewCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReviewCache")
            .field("entries", &self.len())
            .finish()
    }
}

impl ReviewCache {
    /// How long an accepted token is trusted without asking again: also the longest a
    /// revoked token (deleted Pod or service account) keeps working.
    pub const AUTHENTICATED_FOR: Duration = Duration::from_secs(30);
    /// How long a refusal is remembered (a client retrying a bad token in a loop costs
    /// the API server one review per this period).
    pub const REFUSED_FOR: Duration = Duration::from_secs(5);
    pub const CAPACITY: usize = 10_000;

    pub fn key(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    pub fn get(&self, key: &[u8; 32], now: Instant) -> Option<Answer> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .by_token
            .get(key)
            .filter(|(_, until)| *until > now)
            .map(|(answer, _)| answer.clone())
    }

    pub fn put(&self, key: [u8; 32], answer: Answer, now: Instant) {
        let ttl = if answer.is_ok() {
            Self::AUTHENTICATED_FOR
        } else {
            Self::REFUSED_FOR
        };
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let Entries { by_token, order } = &mut *entries;
        if by_token.len() >= Self::CAPACITY {
            by_token.retain(|_, (_, until)| *until > now);
            order.retain(|k| by_token.contains_key(k));
        }
        while by_token.len() >= Self::CAPACITY {
            let Some(oldest) = order.pop_front() else {
                break;
            };
            by_token.remove(&oldest);
        }
        if by_token.insert(key, (answer, now + ttl)).is_none() {
            order.push_back(key);
        }
    }

    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_token
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};

    fn status(authenticated: bool, username: &str, groups: &[&str]) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(authenticated),
            user: Some(UserInfo {
                username: Some(username.into()),
                groups: Some(groups.iter().map(|g| g.to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn reads_service_account_reviews_as_istio_does() {
        let ok = read_status(Some(&status(
            true,
            "system:serviceaccount:bookinfo:reviews",
            &["system:serviceaccounts", "system:authenticated"],
        )))
        .unwrap();
        assert_eq!(
            (ok.namespace.as_str(), ok.service_account.as_str()),
            ("bookinfo", "reviews")
        );
        assert!(read_status(Some(&status(false, "", &[]))).is_err());
        let user =
            read_status(Some(&status(true, "alice", &["system:authenticated"]))).unwrap_err();
        assert!(user.contains("not a service account"), "{user}");
        let odd = read_status(Some(&status(
            true,
            "system:serviceaccount:bookinfo",
            &["system:serviceaccounts"],
        )))
        .unwrap_err();
        assert!(odd.contains("unexpected username"), "{odd}");
        let refused = TokenReviewStatus {
            error: Some("[invalid bearer token, service account token has expired]".into()),
            ..Default::default()
        };
        assert!(
            read_status(Some(&refused))
                .unwrap_err()
                .contains("has expired")
        );
        assert!(read_status(None).is_err());
    }

    #[test]
    fn cache_expires_and_stays_bounded() {
        let cache = ReviewCache::default();
        let t0 = Instant::now();
        let ok = ReviewedToken {
            namespace: "ns".into(),
            service_account: "sa".into(),
            pod_name: None,
        };
        cache.put(ReviewCache::key("good"), Ok(ok.clone()), t0);
        cache.put(ReviewCache::key("bad"), Err("no".into()), t0);
        assert_eq!(cache.get(&ReviewCache::key("good"), t0), Some(Ok(ok)));
        let later = t0 + ReviewCache::REFUSED_FOR + Duration::from_millis(1);
        assert_eq!(
            cache.get(&ReviewCache::key("bad"), later),
            None,
            "refusals expire first"
        );
        assert!(cache.get(&ReviewCache::key("good"), later).is_some());
        assert_eq!(
            cache.get(
                &ReviewCache::key("good"),
                t0 + ReviewCache::AUTHENTICATED_FOR
            ),
            None
        );
        for i in 0..ReviewCache::CAPACITY + 50 {
            cache.put(ReviewCache::key(&i.to_string()), Err("x".into()), t0);
        }
        assert_eq!(cache.len(), ReviewCache::CAPACITY, "bounded");
        assert_eq!(
            cache.get(&ReviewCache::key("0"), t0),
            None,
            "oldest evicted"
        );
        assert!(
            cache
                .get(
                    &ReviewCache::key(&(ReviewCache::CAPACITY + 49).to_string()),
                    t0
                )
                .is_some()
        );
    }
}
