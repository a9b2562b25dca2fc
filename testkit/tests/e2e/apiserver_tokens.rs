//! Service-account tokens on the test API server, as the real one issues and reviews
//! them: TokenRequest through kube-rs and `kubectl create token`, TokenReview of good,
//! foreign, expired, wrong-audience and orphaned tokens.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
    TokenReviewStatus,
};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use pilotfish_testkit::apiserver::TestApiServer;
use serde_json::json;

use crate::support::Cluster;

async fn create<K>(api: &Api<K>, object: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

/// Namespace `ns`, service account `sa` and a Pod `pod` running as it.
pub async fn workload(client: &kube::Client, ns: &str, sa: &str, pod: &str) -> Pod {
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("create namespace {ns}: {e}"),
    }
    create(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": sa}}),
    )
    .await;
    create(
        &Api::<Pod>::namespaced(client.clone(), ns),
        json!({"metadata": {"name": pod}, "spec": {"serviceAccountName": sa, "containers": [{"name": "app", "image": "app"}]}}),
    )
    .await
}

/// A token for `sa` with `audiences`, bound to `pod` when given.
pub async fn token(
    client: &kube::Client,
    ns: &str,
    sa: &str,
    audiences: &[&str],
    pod: Option<&Pod>,
) -> String {
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: audiences.iter().map(|a| a.to_string()).collect(),
            expiration_seconds: Some(3600),
            bound_object_ref: pod.map(|p| BoundObjectReference {
                kind: Some("Pod".into()),
                api_version: Some("v1".into()),
                name: p.metadata.name.clone(),
                uid: p.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

async fn review(client: &kube::Client, token: &str, audiences: &[&str]) -> TokenReviewStatus {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
        },
        ..Default::default()
    };
    Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_request_and_review_as_the_api_server_does() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let pod = workload(&client, "bookinfo", "reviews", "reviews-v1").await;
    let bound = token(&client, "bookinfo", "reviews", &["istio-ca"], Some(&pod)).await;

    let ok = review(&client, &bound, &["istio-ca"]).await;
    assert_eq!(ok.authenticated, Some(true), "{ok:?}");
    let user = ok.user.clone().unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:bookinfo:reviews")
    );
    assert!(
        user.groups
            .unwrap()
            .contains(&"system:serviceaccounts".to_string())
    );
    assert_eq!(
        user.extra.unwrap()["authentication.kubernetes.io/pod-name"],
        ["reviews-v1"]
    );
    assert_eq!(ok.audiences, Some(vec!["istio-ca".to_string()]));

    // Another audience: refused, naming both.
    let wrong = review(&client, &bound, &["vault"]).await;
    assert_ne!(wrong.authenticated, Some(true));
    let error = wrong.error.unwrap();
    assert!(
        error.contains("token audiences [\"istio-ca\"] is invalid"),
        "{error}"
    );
    // No audience in the review: the API server's own, which this token lacks.
    assert_ne!(review(&client, &bound, &[]).await.authenticated, Some(true));
    let default = token(&client, "bookinfo", "reviews", &[], None).await;
    assert_eq!(
        review(&client, &default, &[]).await.authenticated,
        Some(true)
    );

    // Signed by another API server: refused.
    let other = Cluster::start().await;
    let other_client = other.client();
    workload(&other_client, "bookinfo", "reviews", "reviews-v1").await;
    let foreign = token(&other_client, "bookinfo", "reviews", &["istio-ca"], None).await;
    let refused = review(&client, &foreign, &["istio-ca"]).await;
    assert_ne!(refused.authenticated, Some(true));
    assert!(refused.error.unwrap().contains("signature"));
    // Tampered claims: refused.
    let mut parts: Vec<&str> = bound.split('.').collect();
    let forged = {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut claims: serde_json::Value =
            serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap();
        claims["sub"] = json!("system:serviceaccount:kube-system:admin");
        b64.encode(claims.to_string())
    };
    parts[1] = &forged;
    assert_ne!(
        review(&client, &parts.join("."), &["istio-ca"])
            .await
            .authenticated,
        Some(true)
    );

    // The bound Pod is deleted: its tokens stop working at once.
    Api::<Pod>::namespaced(client.clone(), "bookinfo")
        .delete("reviews-v1", &DeleteParams::default())
        .await
        .unwrap();
    let orphaned = review(&client, &bound, &["istio-ca"]).await;
    assert!(
        orphaned
            .error
            .unwrap()
            .contains("pods \"reviews-v1\" not found")
    );

    // Expiry: an hour and a bit later (beyond the 60 s leeway).
    let fresh = token(&client, "bookinfo", "reviews", &["istio-ca"], None).await;
    cluster
        .server
        .advance_token_clock(Duration::from_secs(3600 + 61));
    let expired = review(&client, &fresh, &["istio-ca"]).await;
    assert!(expired.error.unwrap().contains("has expired"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_requests_are_checked_and_kubectl_creates_tokens() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    workload(&client, "bookinfo", "reviews", "reviews-v1").await;
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), "bookinfo");
    let mut request = TokenRequest::default();
    let missing = accounts
        .create_token_request("nobody", &PostParams::default(), &request)
        .await
        .unwrap_err();
    assert!(
        missing
            .to_string()
            .contains("serviceaccounts \"nobody\" not found"),
        "{missing}"
    );
    request.spec.expiration_seconds = Some(60);
    let short = accounts
        .create_token_request("reviews", &PostParams::default(), &request)
        .await
        .unwrap_err();
    assert!(
        short.to_string().contains("less than 10 minutes"),
        "{short}"
    );
    request.spec.expiration_seconds = None;
    request.spec.bound_object_ref = Some(BoundObjectReference {
        kind: Some("Pod".into()),
        api_version: Some("v1".into()),
        name: Some("reviews-v1".into()),
        uid: Some("not-the-uid".into()),
    });
    let stale = accounts
        .create_token_request("reviews", &PostParams::default(), &request)
        .await
        .unwrap_err();
    assert!(
        stale
            .to_string()
            .contains("does not match the UID in record"),
        "{stale}"
    );

    let token = cluster
        .kubectl_ok(&[
            "create",
            "token",
            "reviews",
            "-n",
            "bookinfo",
            "--audience",
            "istio-ca",
        ])
        .await;
    let status = review(&client, token.trim(), &["istio-ca"]).await;
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(
        TestApiServer::TOKEN_ISSUER,
        "https://kubernetes.default.svc.cluster.local"
    );
}
