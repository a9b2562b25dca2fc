//! Authorization questions answered with Kubernetes' RBAC authorizer
//! (`plugin/pkg/auth/authorizer/rbac`) over the stored Roles, ClusterRoles, RoleBindings
//! and ClusterRoleBindings — the server itself still authorizes nothing it serves:
//!
//! - **SubjectAccessReview** (`POST /apis/authorization.k8s.io/v1/subjectaccessreviews`):
//!   may `spec.user` with `spec.groups` do `spec.resourceAttributes` (namespace, verb,
//!   group, resource, subresource, name) or `spec.nonResourceAttributes` (path, verb)?
//! - **SelfSubjectAccessReview** (`.../selfsubjectaccessreviews`, what `kubectl auth
//!   can-i` sends): the same for the requester. This server authenticates no one, so the
//!   requester is whoever the impersonation headers name (`kubectl --as`, `--as-group`:
//!   `Impersonate-User`, `Impersonate-Group`), with the groups upstream's impersonation
//!   adds (a service account's `system:serviceaccounts` and
//!   `system:serviceaccounts:<namespace>` when no group is given; `system:authenticated`);
//!   without those headers the requester may do anything, which is what this server lets
//!   every client do.
//!
//! The evaluation is upstream's: ClusterRoleBindings, then (for a namespaced request) the
//! RoleBindings of the request's namespace; a binding applies when a subject names the
//! user (`User`), one of its groups (`Group`), or is the service account the user is
//! (`ServiceAccount`, `system:serviceaccount:<ns>:<name>`; a RoleBinding's subject without
//! a namespace means the binding's). A rule allows when its verbs, API groups, resources
//! (`*`, `<resource>/<subresource>`, `*/<subresource>`) and resource names (none: all)
//! match, or for a non-resource request its verbs and `nonResourceURLs` (`*`, exact,
//! `prefix*`). ClusterRoles with an `aggregationRule` take the rules of the ClusterRoles
//! their selectors match (the aggregation controller's work, done at evaluation here).
//! The group `system:masters` is allowed everything (kube-apiserver's privileged-group
//! authorizer). There are no denials, only "not allowed" (RBAC has no deny rules).

use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::error::{ApiError, Cause};
use super::scale::selector_string;
use super::selector::LabelSelector;
use super::store::{ListOptions, Store};

const SYSTEM_MASTERS: &str = "system:masters";
const AUTHENTICATED: &str = "system:authenticated";
const UNAUTHENTICATED: &str = "system:unauthenticated";
const ANONYMOUS: &str = "system:anonymous";
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// Who asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub groups: Vec<String>,
}

/// What is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attributes {
    Resource {
        namespace: String,
        verb: String,
        group: String,
        resource: String,
        subresource: String,
        name: String,
    },
    NonResource {
        path: String,
        verb: String,
    },
}

impl Attributes {
    fn verb(&self) -> &str {
        match self {
            Attributes::Resource { verb, .. } | Attributes::NonResource { verb, .. } => verb,
        }
    }
}

/// The RBAC objects a decision reads.
#[derive(Debug, Default)]
pub struct RbacObjects {
    pub cluster_roles: Vec<Value>,
    pub cluster_role_bindings: Vec<Value>,
    pub roles: Vec<Value>,
    pub role_bindings: Vec<Value>,
}

impl RbacObjects {
    /// Everything RBAC the store holds (Roles and RoleBindings of `namespace` only).
    pub fn from_store(store: &Store, namespace: Option<&str>) -> Result<Self, ApiError> {
        let list = |plural: &str, namespace: Option<&str>| -> Result<Vec<Value>, ApiError> {
            let rt = store
                .registry
                .lookup("rbac.authorization.k8s.io", "v1", plural)
                .ok_or_else(|| ApiError::internal(format!("{plural} are not served")))?;
            let listed = store.list(&rt, namespace, &ListOptions::default())?;
            Ok(listed["items"].as_array().cloned().unwrap_or_default())
        };
        let (roles, role_bindings) = match namespace.filter(|n| !n.is_empty()) {
            Some(ns) => (list("roles", Some(ns))?, list("rolebindings", Some(ns))?),
            None => (Vec::new(), Vec::new()),
        };
        Ok(RbacObjects {
            cluster_roles: list("clusterroles", None)?,
            cluster_role_bindings: list("clusterrolebindings", None)?,
            roles,
            role_bindings,
        })
    }
}

/// A decision and upstream's wording of why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn name_of(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or("")
}

/// Whether `user` may do `attributes`, by the RBAC objects in `rbac`.
pub fn authorize(rbac: &RbacObjects, user: &UserInfo, attributes: &Attributes) -> Decision {
    if user.groups.iter().any(|g| g == SYSTEM_MASTERS) {
        return Decision {
            allowed: true,
            reason: format!("allowed by the group {SYSTEM_MASTERS}"),
        };
    }
    for binding in &rbac.cluster_role_bindings {
        if binding["roleRef"]["kind"] != "ClusterRole" {
            continue;
        }
        let Some(subject) = applying_subject(binding, user, "") else {
            continue;
        };
        let role = binding["roleRef"]["name"].as_str().unwrap_or("");
        if cluster_role_rules(rbac, role)
            .iter()
            .any(|rule| rule_allows(rule, attributes))
        {
            return allowed(
                format!("ClusterRoleBinding \"{}\"", name_of(binding)),
                format!("ClusterRole \"{role}\""),
                &subject,
            );
        }
    }
    let Attributes::Resource { namespace, .. } = attributes else {
        return denied();
    };
    if namespace.is_empty() {
        return denied();
    }
    for binding in rbac
        .role_bindings
        .iter()
        .filter(|b| b["metadata"]["namespace"] == namespace.as_str())
    {
        let Some(subject) = applying_subject(binding, user, namespace) else {
            continue;
        };
        let role = binding["roleRef"]["name"].as_str().unwrap_or("");
        let (rules, role_text) = match binding["roleRef"]["kind"].as_str() {
            Some("ClusterRole") => (
                cluster_role_rules(rbac, role),
                format!("ClusterRole \"{role}\""),
            ),
            Some("Role") => (
                rbac.roles
                    .iter()
                    .filter(|r| {
                        name_of(r) == role && r["metadata"]["namespace"] == namespace.as_str()
                    })
                    .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
                    .collect(),
                format!("Role \"{role}/{namespace}\""),
            ),
            _ => continue,
        };
        if rules.iter().any(|rule| rule_allows(rule, attributes)) {
            return allowed(
                format!("RoleBinding \"{}/{namespace}\"", name_of(binding)),
                role_text,
                &subject,
            );
        }
    }
    denied()
}

fn allowed(binding: String, role: String, subject: &str) -> Decision {
    Decision {
        allowed: true,
        reason: format!("RBAC: allowed by {binding} of {role} to {subject}"),
    }
}

fn denied() -> Decision {
    Decision {
        allowed: false,
        reason: String::new(),
    }
}

/// The first subject of `binding` that applies to `user`, described as upstream does
/// (`User "alice"`, `Group "devs"`, `ServiceAccount "sa/ns"`). `namespace` is the
/// binding's for a RoleBinding, empty for a ClusterRoleBinding.
fn applying_subject(binding: &Value, user: &UserInfo, namespace: &str) -> Option<String> {
    binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|subject| {
            let name = subject["name"].as_str().unwrap_or("");
            match subject["kind"].as_str()? {
                "User" if user.name == name => Some(format!("User \"{name}\"")),
                "Group" if user.groups.iter().any(|g| g == name) => {
                    Some(format!("Group \"{name}\""))
                }
                "ServiceAccount" => {
                    let sa_namespace = subject["namespace"]
                        .as_str()
                        .filter(|n| !n.is_empty())
                        .unwrap_or(namespace);
                    (!sa_namespace.is_empty()
                        && user.name == format!("{SERVICE_ACCOUNT_PREFIX}{sa_namespace}:{name}"))
                    .then(|| format!("ServiceAccount \"{name}/{sa_namespace}\""))
                }
                _ => None,
            }
        })
}

/// A ClusterRole's rules, with those of the ClusterRoles its `aggregationRule` selects.
fn cluster_role_rules(rbac: &RbacObjects, name: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut seen = Vec::new();
    collect_cluster_role_rules(rbac, name, &mut seen, &mut out);
    out
}

fn collect_cluster_role_rules<'a>(
    rbac: &'a RbacObjects,
    name: &'a str,
    seen: &mut Vec<&'a str>,
    out: &mut Vec<Value>,
) {
    if seen.contains(&name) {
        return;
    }
    seen.push(name);
    let Some(role) = rbac.cluster_roles.iter().find(|r| name_of(r) == name) else {
        return;
    };
    out.extend(role["rules"].as_array().cloned().unwrap_or_default());
    let selectors = role["aggregationRule"]["clusterRoleSelectors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for selector in selectors {
        // An empty selector selects every ClusterRole, as upstream's.
        let text = selector_string(&selector).unwrap_or_default();
        let Ok(selector) = LabelSelector::parse(&text) else {
            continue;
        };
        for other in &rbac.cluster_roles {
            if name_of(other) != name && selector.matches(other) {
                collect_cluster_role_rules(rbac, name_of(other), seen, out);
            }
        }
    }
}

/// Upstream's `RuleAllows`.
fn rule_allows(rule: &Value, attributes: &Attributes) -> bool {
    let verbs = strings(&rule["verbs"]);
    if !verbs.iter().any(|v| *v == "*" || *v == attributes.verb()) {
        return false;
    }
    match attributes {
        Attributes::Resource {
            group,
            resource,
            subresource,
            name,
            ..
        } => {
            let combined = if subresource.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{subresource}")
            };
            let groups = strings(&rule["apiGroups"]);
            let resources = strings(&rule["resources"]);
            let names = strings(&rule["resourceNames"]);
            groups.iter().any(|g| *g == "*" || *g == group)
                && resources.iter().any(|r| {
                    *r == "*"
                        || *r == combined
                        || (!subresource.is_empty()
                            && r.strip_prefix("*/") == Some(subresource.as_str()))
                })
                && (names.is_empty() || names.iter().any(|n| *n == name))
        }
        Attributes::NonResource { path, .. } => {
            strings(&rule["nonResourceURLs"]).iter().any(|url| {
                *url == "*"
                    || *url == path
                    || url
                        .strip_suffix('*')
                        .is_some_and(|prefix| path.starts_with(prefix))
            })
        }
    }
}

/// The attributes of a review's spec; 422 as upstream when neither or both are given.
fn attributes_of(kind: &str, spec: &Value) -> Result<Attributes, ApiError> {
    let text = |v: &Value, field: &str| v[field].as_str().unwrap_or("").to_string();
    let resource = spec.get("resourceAttributes").filter(|v| v.is_object());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| v.is_object());
    match (resource, non_resource) {
        (Some(r), None) => Ok(Attributes::Resource {
            namespace: text(r, "namespace"),
            verb: text(r, "verb"),
            group: text(r, "group"),
            resource: text(r, "resource"),
            subresource: text(r, "subresource"),
            name: text(r, "name"),
        }),
        (None, Some(n)) => Ok(Attributes::NonResource {
            path: text(n, "path"),
            verb: text(n, "verb"),
        }),
        (r, _) => Err(ApiError::invalid(
            "authorization.k8s.io",
            kind,
            "",
            vec![Cause::new(
                "FieldValueInvalid",
                if r.is_some() {
                    "spec.resourceAttributes"
                } else {
                    "spec.nonResourceAttributes"
                },
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )],
        )),
    }
}

fn namespace_of(attributes: &Attributes) -> Option<&str> {
    match attributes {
        Attributes::Resource { namespace, .. } => Some(namespace),
        Attributes::NonResource { .. } => None,
    }
}

fn review_response(kind: &str, spec: Value, decision: &Decision) -> Value {
    let mut status = json!({"allowed": decision.allowed});
    if !decision.reason.is_empty() {
        status["reason"] = json!(decision.reason);
    }
    json!({
        "kind": kind,
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    })
}

/// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`.
pub fn subject_access_review(store: &Store, body: &Value) -> Result<Value, ApiError> {
    const KIND: &str = "SubjectAccessReview";
    let spec = body["spec"].clone();
    let attributes = attributes_of(KIND, &spec)?;
    let user = UserInfo {
        name: spec["user"].as_str().unwrap_or("").to_string(),
        groups: strings(&spec["groups"])
            .into_iter()
            .map(str::to_string)
            .collect(),
    };
    if user.name.is_empty() && user.groups.is_empty() {
        return Err(ApiError::invalid(
            "authorization.k8s.io",
            KIND,
            "",
            vec![Cause::new(
                "FieldValueInvalid",
                "spec.user",
                "at least one of user or group must be specified",
            )],
        ));
    }
    let rbac = RbacObjects::from_store(store, namespace_of(&attributes))?;
    let decision = authorize(&rbac, &user, &attributes);
    Ok(review_response(KIND, spec, &decision))
}

/// `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`, for the user the
/// impersonation `headers` name (see the module doc).
pub fn self_subject_access_review(
    store: &Store,
    headers: &HeaderMap,
    body: &Value,
) -> Result<Value, ApiError> {
    const KIND: &str = "SelfSubjectAccessReview";
    let spec = body["spec"].clone();
    let attributes = attributes_of(KIND, &spec)?;
    let decision = match impersonated(headers) {
        None => Decision {
            allowed: true,
            reason: "the test API server does not authenticate or authorize its clients: \
                     every request is allowed (impersonate a user to evaluate RBAC)"
                .into(),
        },
        Some(user) => {
            let rbac = RbacObjects::from_store(store, namespace_of(&attributes))?;
            authorize(&rbac, &user, &attributes)
        }
    };
    Ok(review_response(KIND, spec, &decision))
}

/// The user `Impersonate-User` / `Impersonate-Group` name, with the groups upstream's
/// impersonation filter adds.
fn impersonated(headers: &HeaderMap) -> Option<UserInfo> {
    let name = headers.get("impersonate-user")?.to_str().ok()?.to_string();
    let mut groups: Vec<String> = headers
        .get_all("impersonate-group")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    if groups.is_empty()
        && let Some((namespace, _)) = name
            .strip_prefix(SERVICE_ACCOUNT_PREFIX)
            .and_then(|rest| rest.split_once(':'))
    {
        groups = vec![
            "system:serviceaccounts".to_string(),
            format!("system:serviceaccounts:{namespace}"),
        ];
    }
    if name != ANONYMOUS
        && !groups
            .iter()
            .any(|g| g == AUTHENTICATED || g == UNAUTHENTICATED)
    {
        groups.push(AUTHENTICATED.to_string());
    }
    Some(UserInfo { name, groups })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects() -> RbacObjects {
        RbacObjects {
            cluster_roles: vec![
                json!({"metadata": {"name": "pod-reader"}, "rules": [
                    {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]}
                ]}),
                json!({"metadata": {"name": "metrics"}, "rules": [
                    {"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]}
                ]}),
                json!({"metadata": {"name": "aggregate"}, "aggregationRule": {"clusterRoleSelectors": [
                    {"matchLabels": {"aggregate-to-x": "true"}}
                ]}}),
                json!({"metadata": {"name": "scaler", "labels": {"aggregate-to-x": "true"}}, "rules": [
                    {"apiGroups": ["apps"], "resources": ["*/scale"], "verbs": ["update"]}
                ]}),
            ],
            cluster_role_bindings: vec![
                json!({"metadata": {"name": "all-sa-read"}, "roleRef": {"kind": "ClusterRole", "name": "pod-reader"},
                       "subjects": [{"kind": "Group", "name": "system:serviceaccounts:shop"}]}),
                json!({"metadata": {"name": "metrics"}, "roleRef": {"kind": "ClusterRole", "name": "metrics"},
                       "subjects": [{"kind": "Group", "name": "system:authenticated"}]}),
                json!({"metadata": {"name": "scalers"}, "roleRef": {"kind": "ClusterRole", "name": "aggregate"},
                       "subjects": [{"kind": "User", "name": "alice"}]}),
            ],
            roles: vec![
                json!({"metadata": {"name": "cm-one", "namespace": "shop"}, "rules": [
                    {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["one"], "verbs": ["get"]}
                ]}),
            ],
            role_bindings: vec![
                json!({"metadata": {"name": "cm", "namespace": "shop"}, "roleRef": {"kind": "Role", "name": "cm-one"},
                       "subjects": [{"kind": "ServiceAccount", "name": "app"}]}),
            ],
        }
    }

    fn res(ns: &str, verb: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes::Resource {
            namespace: ns.into(),
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
        }
    }

    fn user(name: &str, groups: &[&str]) -> UserInfo {
        UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn rules_match_as_upstream() {
        let rbac = objects();
        let sa = user(
            "system:serviceaccount:shop:app",
            &[
                "system:serviceaccounts",
                "system:serviceaccounts:shop",
                AUTHENTICATED,
            ],
        );
        let d = authorize(&rbac, &sa, &res("shop", "get", "", "pods", "", "p"));
        assert!(d.allowed);
        assert_eq!(
            d.reason,
            "RBAC: allowed by ClusterRoleBinding \"all-sa-read\" of ClusterRole \"pod-reader\" to Group \"system:serviceaccounts:shop\""
        );
        assert!(authorize(&rbac, &sa, &res("shop", "get", "", "pods", "log", "p")).allowed);
        assert!(!authorize(&rbac, &sa, &res("shop", "get", "", "pods", "exec", "p")).allowed);
        assert!(!authorize(&rbac, &sa, &res("shop", "delete", "", "pods", "", "p")).allowed);
        assert!(!authorize(&rbac, &sa, &res("shop", "get", "apps", "pods", "", "p")).allowed);
        // resourceNames: only the named object, never a list.
        let one = authorize(&rbac, &sa, &res("shop", "get", "", "configmaps", "", "one"));
        assert!(one.allowed);
        assert_eq!(
            one.reason,
            "RBAC: allowed by RoleBinding \"cm/shop\" of Role \"cm-one/shop\" to ServiceAccount \"app/shop\""
        );
        assert!(!authorize(&rbac, &sa, &res("shop", "get", "", "configmaps", "", "two")).allowed);
        assert!(!authorize(&rbac, &sa, &res("shop", "get", "", "configmaps", "", "")).allowed);
        // A RoleBinding works only in its namespace.
        let other = user(
            "system:serviceaccount:web:app",
            &["system:serviceaccounts:web"],
        );
        assert!(
            !authorize(
                &rbac,
                &other,
                &res("web", "get", "", "configmaps", "", "one")
            )
            .allowed
        );
        // Non-resource URLs: exact and prefix*.
        let bob = user("bob", &[AUTHENTICATED]);
        let url = |path: &str| Attributes::NonResource {
            path: path.into(),
            verb: "get".into(),
        };
        assert!(authorize(&rbac, &bob, &url("/metrics")).allowed);
        assert!(authorize(&rbac, &bob, &url("/debug/pprof")).allowed);
        assert!(!authorize(&rbac, &bob, &url("/healthz")).allowed);
        assert!(!authorize(&rbac, &user("bob", &[]), &url("/metrics")).allowed);
        // Aggregation and */subresource.
        let alice = user("alice", &[]);
        assert!(
            authorize(
                &rbac,
                &alice,
                &res("x", "update", "apps", "deployments", "scale", "d")
            )
            .allowed
        );
        assert!(
            !authorize(
                &rbac,
                &alice,
                &res("x", "update", "apps", "deployments", "", "d")
            )
            .allowed
        );
        assert!(authorize(&rbac, &user("root", &[SYSTEM_MASTERS]), &url("/anything")).allowed);
    }

    #[test]
    fn impersonation_adds_upstreams_groups() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "impersonate-user",
            "system:serviceaccount:shop:app".parse().unwrap(),
        );
        assert_eq!(
            impersonated(&headers).unwrap().groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:shop",
                AUTHENTICATED
            ]
        );
        headers.insert("impersonate-group", "devs".parse().unwrap());
        assert_eq!(
            impersonated(&headers).unwrap().groups,
            ["devs", AUTHENTICATED]
        );
        assert_eq!(impersonated(&HeaderMap::new()), None);
    }
}
