//! SubjectAccessReview and SelfSubjectAccessReview in the test API server: RBAC evaluated
//! over the Roles, ClusterRoles and their bindings stored in it, asked by kube-rs and by
//! the real `kubectl auth can-i --as ...`.

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Api;
use kube::api::PostParams;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::support::Cluster;

async fn create<K>(api: &Api<K>, object: serde_json::Value)
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// Service account `shop/app` may read pods and their logs in every namespace through
/// its group `system:serviceaccounts:shop`, and get ConfigMap `one` of `shop`; user
/// `alice` may update `*/scale` in `apps` through an aggregated ClusterRole; everyone
/// authenticated may get `/metrics`.
async fn rbac_objects(client: &kube::Client) {
    for ns in ["shop", "web"] {
        create(
            &Api::<Namespace>::all(client.clone()),
            json!({"metadata": {"name": ns}}),
        )
        .await;
    }
    create(
        &Api::<ServiceAccount>::namespaced(client.clone(), "shop"),
        json!({"metadata": {"name": "app"}}),
    )
    .await;
    let cluster_roles = Api::<ClusterRole>::all(client.clone());
    for role in [
        json!({"metadata": {"name": "pod-reader"}, "rules": [
            {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}]}),
        json!({"metadata": {"name": "metrics"}, "rules": [
            {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
        json!({"metadata": {"name": "aggregate"}, "aggregationRule": {"clusterRoleSelectors": [
            {"matchLabels": {"example.com/aggregate-to-scale": "true"}}]}}),
        json!({"metadata": {"name": "scaler", "labels": {"example.com/aggregate-to-scale": "true"}},
               "rules": [{"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["update"]}]}),
    ] {
        create(&cluster_roles, role).await;
    }
    let cluster_bindings = Api::<ClusterRoleBinding>::all(client.clone());
    for binding in [
        json!({"metadata": {"name": "shop-sa-read"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "pod-reader"},
               "subjects": [{"kind": "Group", "name": "system:serviceaccounts:shop", "apiGroup": "rbac.authorization.k8s.io"}]}),
        json!({"metadata": {"name": "metrics"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "metrics"},
               "subjects": [{"kind": "Group", "name": "system:authenticated", "apiGroup": "rbac.authorization.k8s.io"}]}),
        json!({"metadata": {"name": "alice-scale"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "aggregate"},
               "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]}),
    ] {
        create(&cluster_bindings, binding).await;
    }
    create(
        &Api::<Role>::namespaced(client.clone(), "shop"),
        json!({"metadata": {"name": "cm-one"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["one"], "verbs": ["get"]}]}),
    )
    .await;
    create(
        &Api::<RoleBinding>::namespaced(client.clone(), "shop"),
        json!({"metadata": {"name": "cm"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-one"},
               "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": "shop"}]}),
    )
    .await;
}

async fn review(
    client: &kube::Client,
    user: &str,
    groups: &[&str],
    resource: Option<ResourceAttributes>,
    path: Option<&str>,
) -> (bool, String) {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            groups: Some(groups.iter().map(|g| g.to_string()).collect()),
            resource_attributes: resource,
            non_resource_attributes: path.map(|p| NonResourceAttributes {
                path: Some(p.into()),
                verb: Some("get".into()),
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let status = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap();
    (status.allowed, status.reason.unwrap_or_default())
}

fn attrs(
    ns: &str,
    verb: &str,
    group: &str,
    resource: &str,
    sub: &str,
    name: &str,
) -> Option<ResourceAttributes> {
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Some(ResourceAttributes {
        namespace: opt(ns),
        verb: opt(verb),
        group: opt(group),
        resource: opt(resource),
        subresource: opt(sub),
        name: opt(name),
        ..Default::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subject_access_reviews_evaluate_rbac() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    rbac_objects(&client).await;
    let sa = "system:serviceaccount:shop:app";
    let sa_groups = [
        "system:serviceaccounts",
        "system:serviceaccounts:shop",
        "system:authenticated",
    ];

    // --- kube-rs: SubjectAccessReview.
    let (allowed, reason) = review(
        &client,
        sa,
        &sa_groups,
        attrs("web", "list", "", "pods", "", ""),
        None,
    )
    .await;
    assert!(allowed, "{reason}");
    assert_eq!(
        reason,
        "RBAC: allowed by ClusterRoleBinding \"shop-sa-read\" of ClusterRole \"pod-reader\" to Group \"system:serviceaccounts:shop\""
    );
    let (allowed, _) = review(
        &client,
        sa,
        &[],
        attrs("web", "list", "", "pods", "", ""),
        None,
    )
    .await;
    assert!(!allowed, "the groups of the review are the ones that count");
    let (allowed, reason) = review(
        &client,
        sa,
        &[],
        attrs("shop", "get", "", "configmaps", "", "one"),
        None,
    )
    .await;
    assert!(allowed, "{reason}");
    assert!(reason.contains("RoleBinding \"cm/shop\""), "{reason}");
    let (allowed, _) = review(
        &client,
        sa,
        &[],
        attrs("shop", "get", "", "configmaps", "", "two"),
        None,
    )
    .await;
    assert!(!allowed, "resourceNames");
    let (allowed, _) = review(
        &client,
        sa,
        &sa_groups,
        attrs("shop", "get", "", "pods", "exec", "p"),
        None,
    )
    .await;
    assert!(!allowed, "subresources are resources of their own");
    let (allowed, _) = review(
        &client,
        "alice",
        &[],
        attrs("shop", "update", "apps", "deployments", "scale", "d"),
        None,
    )
    .await;
    assert!(allowed, "aggregated ClusterRole, */scale");
    let (allowed, _) = review(
        &client,
        "bob",
        &["system:authenticated"],
        None,
        Some("/metrics"),
    )
    .await;
    assert!(allowed, "nonResourceURLs");
    let (allowed, _) = review(&client, "bob", &[], None, Some("/metrics")).await;
    assert!(!allowed);
    let bad = Api::<SubjectAccessReview>::all(client.clone())
        .create(
            &PostParams::default(),
            &SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some("bob".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&bad, kube::Error::Api(e) if e.code == 422 && e.message.contains("exactly one of nonResourceAttributes or resourceAttributes")),
        "{bad:?}"
    );

    // --- kubectl auth can-i: SelfSubjectAccessReview for the impersonated user.
    let can = |args: &'static [&'static str]| {
        let cluster = &cluster;
        async move {
            let out = cluster.kubectl(args).await;
            (out.stdout.trim().to_string(), out.code, out.stderr)
        }
    };
    let (answer, code, stderr) = can(&[
        "auth",
        "can-i",
        "list",
        "pods",
        "-n",
        "web",
        "--as",
        "system:serviceaccount:shop:app",
    ])
    .await;
    assert_eq!((answer.as_str(), code), ("yes", Some(0)), "{stderr}");
    let (answer, code, stderr) = can(&[
        "auth",
        "can-i",
        "delete",
        "pods",
        "-n",
        "web",
        "--as",
        "system:serviceaccount:shop:app",
    ])
    .await;
    assert_eq!((answer.as_str(), code), ("no", Some(1)), "{stderr}");
    let (answer, _, stderr) = can(&[
        "auth",
        "can-i",
        "get",
        "configmaps/one",
        "-n",
        "shop",
        "--as",
        "system:serviceaccount:shop:app",
    ])
    .await;
    assert_eq!(answer, "yes", "{stderr}");
    let (answer, _, stderr) = can(&[
        "auth",
        "can-i",
        "get",
        "pods",
        "--subresource",
        "log",
        "-n",
        "shop",
        "--as",
        "system:serviceaccount:shop:app",
    ])
    .await;
    assert_eq!(answer, "yes", "{stderr}");
    let (answer, _, stderr) = can(&["auth", "can-i", "get", "/metrics", "--as", "bob"]).await;
    assert_eq!(answer, "yes", "system:authenticated is added: {stderr}");
    let (answer, _, stderr) = can(&[
        "auth",
        "can-i",
        "list",
        "pods",
        "-n",
        "web",
        "--as",
        "carol",
        "--as-group",
        "system:serviceaccounts:shop",
    ])
    .await;
    assert_eq!(answer, "yes", "--as-group: {stderr}");
    let (answer, _, stderr) = can(&[
        "auth", "can-i", "list", "pods", "-n", "web", "--as", "carol",
    ])
    .await;
    assert_eq!(answer, "no", "{stderr}");
}
