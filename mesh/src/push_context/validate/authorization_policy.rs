//! AuthorizationPolicy as Istio 1.30 judges it: the webhook's `ValidateAuthorizationPolicy`
//! (`pkg/config/validation/validation.go`: one of selector/targetRef/targetRefs, the
//! selector's labels, target references, CUSTOM's rules, `provider` only with CUSTOM, DENY
//! needs `rules`, no empty `from`/`to`/`source`/`operation`, the value checks of
//! `pkg/config/security` for every field and `when` key, and the warning that a DENY rule
//! of HTTP attributes only denies all TCP traffic) plus the CRD's rules (sizes, the
//! serviceAccounts exclusion, the target reference formats).
//!
//! One rule is Pilotfish's own: CUSTOM (ext_authz) is not supported, so a CUSTOM policy is
//! an error — but, unlike other errors, the policy is kept in the snapshot, because Istio
//! turns a CUSTOM policy whose provider it cannot use into DENY rules
//! (`getBadCustomDenyRules`): what it matches is denied, never allowed.

use std::collections::BTreeMap;

use super::Validated;
use super::common::*;
use crate::api::{
    AuthorizationAction, AuthorizationPolicy, AuthorizationPolicySpec, PolicyTargetReference,
};
use crate::config::{ConfigKey, ConfigKind};
use crate::model::kube::namespace_of;
use crate::push_context::authz::{
    DRY_RUN_ANNOTATION, MATCH_ANY_TEMPLATE, MATCH_ONE_TEMPLATE, contains_path_template,
    parse_go_bool, parse_ip_block, parse_port,
};

/// Istio's CRD: `maxProperties: 4096` on the selector's labels.
const MAX_SELECTOR_LABELS: usize = 4096;

/// The message of the CUSTOM refusal (also used by the generators' finding).
pub const CUSTOM_UNSUPPORTED: &str = "CUSTOM (ext_authz) is not supported by Pilotfish: the policy is untranslatable, so, as Istio does with a CUSTOM policy whose provider it cannot use, the requests its rules match are denied (never allowed)";

/// Validates one AuthorizationPolicy.
pub fn validate_authorization_policy(
    ap: &AuthorizationPolicy,
) -> Validated<AuthorizationPolicySpec> {
    let namespace = namespace_of(&ap.metadata);
    let key = ConfigKey::new(
        ConfigKind::AuthorizationPolicy,
        &namespace,
        ap.metadata.name.clone().unwrap_or_default(),
    );
    let mut f = Findings::new(&key);
    // `istio.io/dry-run` is the one annotation of Istio's reserved set an
    // AuthorizationPolicy may carry (`checkDryRunAnnotation`): only on ALLOW and DENY
    // policies, and a value Go's ParseBool reads.
    let mut annotations: Option<BTreeMap<String, String>> = ap.metadata.annotations.clone();
    if let Some(value) = annotations
        .as_mut()
        .and_then(|a| a.remove(DRY_RUN_ANNOTATION))
    {
        let path = format!("metadata.annotations[{DRY_RUN_ANNOTATION}]");
        match ap.spec.action() {
            AuthorizationAction::Allow | AuthorizationAction::Deny => {
                if parse_go_bool(&value).is_none() {
                    f.error(path, format!("invalid value {value:?}: not a boolean"));
                }
            }
            other => f.error(
                path,
                format!(
                    "supported with the ALLOW and DENY actions only, found {}",
                    action_name(other)
                ),
            ),
        }
    }
    check_annotations(&mut f, annotations.as_ref());
    let spec = &ap.spec;
    check_spec(&mut f, spec);
    let custom = spec.action() == AuthorizationAction::Custom;
    if custom {
        f.error("spec.action", CUSTOM_UNSUPPORTED);
    }
    let findings = f.list;
    // A CUSTOM policy otherwise valid is kept: it is rendered as DENY rules.
    let keep_custom = custom
        && findings
            .iter()
            .filter(|e| e.is_error())
            .all(|e| e.message == CUSTOM_UNSUPPORTED);
    if keep_custom {
        Validated {
            spec: Some(spec.clone()),
            findings,
        }
    } else {
        Validated::new(spec.clone(), findings)
    }
}

fn check_spec(f: &mut Findings, spec: &AuthorizationPolicySpec) {
    let set = usize::from(spec.selector.is_some())
        + usize::from(spec.target_ref.is_some())
        + usize::from(!spec.target_refs.is_empty());
    if set > 1 {
        f.error(
            "spec",
            "only one of selector, targetRef or targetRefs can be set",
        );
    }
    if let Some(sel) = &spec.selector {
        check_workload_selector(
            f,
            "spec.selector.matchLabels",
            &sel.match_labels,
            MAX_SELECTOR_LABELS,
            "workload selector specified without labels: the policy applies to every workload of the namespace (of the mesh, in the root namespace)",
        );
    }
    if let Some(r) = &spec.target_ref {
        check_target_ref(f, "spec.targetRef", r);
    }
    if spec.target_refs.len() > 16 {
        f.error(
            "spec.targetRefs",
            "at most 16 target references are allowed",
        );
    }
    for (i, r) in spec.target_refs.iter().enumerate() {
        check_target_ref(f, &format!("spec.targetRefs[{i}]"), r);
    }
    let action = spec.action();
    if action == AuthorizationAction::Custom {
        check_custom(f, spec);
    }
    if spec.provider.is_some() && action != AuthorizationAction::Custom {
        f.error(
            "spec.provider",
            format!(
                "provider is only allowed with the CUSTOM action, found {}",
                action_name(action)
            ),
        );
    }
    if action == AuthorizationAction::Deny && spec.rules.is_none() {
        f.error(
            "spec.rules",
            "a DENY policy without rules would never be triggered; add an empty rule {} to deny every request",
        );
    }
    if spec.rules().len() > 512 {
        f.error("spec.rules", "at most 512 rules are allowed");
    }
    for (i, rule) in spec.rules().iter().enumerate() {
        check_rule(f, i, rule, action);
    }
}

/// The action's name as Istio prints it.
pub fn action_name(action: AuthorizationAction) -> &'static str {
    match action {
        AuthorizationAction::Allow => "ALLOW",
        AuthorizationAction::Deny => "DENY",
        AuthorizationAction::Audit => "AUDIT",
        AuthorizationAction::Custom => "CUSTOM",
    }
}

/// Istio's `validatePolicyTargetReference` and the CRD's formats.
fn check_target_ref(f: &mut Findings, path: &str, r: &PolicyTargetReference) {
    if r.name.is_empty() {
        f.error(format!("{path}.name"), "targetRef name must be set");
    }
    if r.name.len() > 253 {
        f.error(format!("{path}.name"), "at most 253 characters");
    }
    if r.kind.is_empty() || r.kind.len() > 63 {
        f.error(format!("{path}.kind"), "kind must have 1 to 63 characters");
    }
    if r.namespace.as_deref().is_some_and(|n| !n.is_empty()) {
        f.error(
            format!("{path}.namespace"),
            "targetRef namespace must not be set: cross-namespace references are not supported",
        );
    }
    let group = match r.group.as_deref() {
        None | Some("") => "core",
        Some(g) => g,
    };
    let allowed = matches!(
        (group, r.kind.as_str()),
        ("core", "Service")
            | ("networking.istio.io", "ServiceEntry")
            | ("gateway.networking.k8s.io", "Gateway" | "GatewayClass")
    );
    if !allowed {
        f.error(
            path,
            format!(
                "targetRef must be to a core Service, a networking.istio.io ServiceEntry, or a gateway.networking.k8s.io Gateway or GatewayClass, but was {}/{}",
                r.group.as_deref().unwrap_or(""), r.kind
            ),
        );
    }
}

/// Istio's checks of a CUSTOM policy (kept so `validate` reports what Istio would).
fn check_custom(f: &mut Findings, spec: &AuthorizationPolicySpec) {
    match &spec.rules {
        None => f.error(
            "spec.rules",
            "a CUSTOM policy without rules would never be triggered; add an empty rule {} to trigger it for every request",
        ),
        Some(_) => {
            if spec.provider.as_ref().is_none_or(|p| p.name.is_empty()) {
                f.error("spec.provider.name", "provider.name must not be empty");
            }
        }
    }
    for (i, rule) in spec.rules().iter().enumerate() {
        for (j, from) in rule.from().iter().enumerate() {
            let Some(s) = &from.source else { continue };
            for (name, set) in [
                ("namespaces", !s.namespaces.is_empty()),
                ("notNamespaces", !s.not_namespaces.is_empty()),
                ("serviceAccounts", !s.service_accounts.is_empty()),
                ("notServiceAccounts", !s.not_service_accounts.is_empty()),
                ("trustDomains", !s.trust_domains.is_empty()),
                ("notTrustDomains", !s.not_trust_domains.is_empty()),
                ("principals", !s.principals.is_empty()),
                ("notPrincipals", !s.not_principals.is_empty()),
                ("requestPrincipals", !s.request_principals.is_empty()),
                ("notRequestPrincipals", !s.not_request_principals.is_empty()),
            ] {
                if set {
                    f.error(
                        format!("spec.rules[{i}].from[{j}].source.{name}"),
                        "not supported with the CUSTOM action",
                    );
                }
            }
        }
        for (j, c) in rule.when.iter().enumerate() {
            let k = c.key.as_str();
            if matches!(
                k,
                "source.namespace"
                    | "source.serviceAccount"
                    | "source.trustDomain"
                    | "source.principal"
            ) || k.starts_with("request.auth.")
            {
                f.error(
                    format!("spec.rules[{i}].when[{j}].key"),
                    format!("{k} is not supported with the CUSTOM action"),
                );
            }
        }
    }
}

fn check_rule(f: &mut Findings, i: usize, rule: &crate::api::Rule, action: AuthorizationAction) {
    let at = format!("spec.rules[{i}]");
    if rule.from.as_ref().is_some_and(Vec::is_empty) {
        f.error(format!("{at}.from"), "from must not be empty when present");
    }
    if rule.from().len() > 512 {
        f.error(format!("{at}.from"), "at most 512 sources are allowed");
    }
    let mut tcp_in_from = false;
    let mut tcp_in_to = false;
    let mut from_exists = false;
    let mut to_exists = false;
    for (j, from) in rule.from().iter().enumerate() {
        let path = format!("{at}.from[{j}].source");
        let Some(s) = &from.source else {
            f.error(path, "from.source must be set");
            continue;
        };
        from_exists = true;
        let identities = !(s.principals.is_empty()
            && s.not_principals.is_empty()
            && s.namespaces.is_empty()
            && s.not_namespaces.is_empty());
        let service_accounts =
            !(s.service_accounts.is_empty() && s.not_service_accounts.is_empty());
        if identities && service_accounts {
            f.error(
                &path,
                "serviceAccounts cannot be set with namespaces or principals",
            );
        }
        let lists: [(&str, &Vec<String>); 14] = [
            ("principals", &s.principals),
            ("requestPrincipals", &s.request_principals),
            ("namespaces", &s.namespaces),
            ("ipBlocks", &s.ip_blocks),
            ("remoteIpBlocks", &s.remote_ip_blocks),
            ("notPrincipals", &s.not_principals),
            ("notRequestPrincipals", &s.not_request_principals),
            ("notNamespaces", &s.not_namespaces),
            ("notIpBlocks", &s.not_ip_blocks),
            ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
            ("serviceAccounts", &s.service_accounts),
            ("notServiceAccounts", &s.not_service_accounts),
            ("trustDomains", &s.trust_domains),
            ("notTrustDomains", &s.not_trust_domains),
        ];
        if lists.iter().all(|(_, l)| l.is_empty()) {
            f.error(&path, "from.source must not be empty");
        }
        for (name, values) in lists {
            let field = format!("{path}.{name}");
            match name {
                "ipBlocks" | "notIpBlocks" | "remoteIpBlocks" | "notRemoteIpBlocks" => {
                    f.check(&field, check_empty(values));
                    f.check(&field, check_ips(values));
                }
                "serviceAccounts" | "notServiceAccounts" => {
                    f.check(&field, check_service_accounts(values));
                }
                "trustDomains" | "notTrustDomains" => {
                    f.check(&field, check_trust_domains(values));
                }
                _ => f.check(&field, check_empty(values)),
            }
        }
        tcp_in_from |= !(s.principals.is_empty()
            && s.not_principals.is_empty()
            && s.ip_blocks.is_empty()
            && s.not_ip_blocks.is_empty()
            && s.namespaces.is_empty()
            && s.not_namespaces.is_empty()
            && s.remote_ip_blocks.is_empty()
            && s.not_remote_ip_blocks.is_empty()
            && s.service_accounts.is_empty()
            && s.not_service_accounts.is_empty());
    }
    if rule.to.as_ref().is_some_and(Vec::is_empty) {
        f.error(format!("{at}.to"), "to must not be empty when present");
    }
    for (j, to) in rule.to().iter().enumerate() {
        let path = format!("{at}.to[{j}].operation");
        let Some(op) = &to.operation else {
            f.error(path, "to.operation must be set");
            continue;
        };
        to_exists = true;
        let lists: [(&str, &Vec<String>); 8] = [
            ("ports", &op.ports),
            ("methods", &op.methods),
            ("paths", &op.paths),
            ("hosts", &op.hosts),
            ("notPorts", &op.not_ports),
            ("notMethods", &op.not_methods),
            ("notPaths", &op.not_paths),
            ("notHosts", &op.not_hosts),
        ];
        if lists.iter().all(|(_, l)| l.is_empty()) {
            f.error(&path, "to.operation must not be empty");
        }
        for (name, values) in lists {
            let field = format!("{path}.{name}");
            f.check(&field, check_empty(values));
            match name {
                "ports" | "notPorts" => f.check(&field, check_ports(values)),
                "paths" | "notPaths" => f.check(&field, check_path_templates(values)),
                _ => {}
            }
        }
        tcp_in_to |= !(op.ports.is_empty() && op.not_ports.is_empty());
    }
    for (j, c) in rule.when.iter().enumerate() {
        let path = format!("{at}.when[{j}]");
        if c.key.is_empty() {
            f.error(format!("{path}.key"), "key must not be empty");
            continue;
        }
        if c.values.is_empty() && c.not_values.is_empty() {
            f.error(
                &path,
                format!(
                    "at least one of values or notValues must be set for key {}",
                    c.key
                ),
            );
            continue;
        }
        if let Err(e) = check_attribute(&c.key, &c.values) {
            f.error(
                format!("{path}.values"),
                format!("invalid value for key {}: {e}", c.key),
            );
        }
        if let Err(e) = check_attribute(&c.key, &c.not_values) {
            f.error(
                format!("{path}.notValues"),
                format!("invalid notValue for key {}: {e}", c.key),
            );
        }
    }
    if ((from_exists && !to_exists && !tcp_in_from) || (to_exists && !tcp_in_to))
        && action == AuthorizationAction::Deny
    {
        f.warning(
            &at,
            "this DENY rule uses only HTTP attributes, so it denies all traffic to the TCP ports under the policy's scope; specify the ports explicitly",
        );
    }
}

/// Istio's `CheckEmptyValues`.
fn check_empty(values: &[String]) -> Result<(), String> {
    if values.iter().any(String::is_empty) {
        Err("empty values are not allowed".into())
    } else {
        Ok(())
    }
}

fn check_ips(values: &[String]) -> Result<(), String> {
    for v in values {
        if parse_ip_block(v).is_none() {
            return Err(if v.contains('/') {
                format!("bad CIDR range ({v})")
            } else {
                format!("bad IP address ({v})")
            });
        }
    }
    Ok(())
}

fn check_ports(values: &[String]) -> Result<(), String> {
    match values.iter().find(|v| parse_port(v).is_none()) {
        Some(v) => Err(format!("bad port ({v})")),
        None => Ok(()),
    }
}

/// Istio's `CheckWildcardValues`: one `*` at most, at the start or the end.
fn check_wildcards(values: &[String]) -> Result<(), String> {
    check_empty(values)?;
    for v in values {
        let count = v.matches('*').count();
        if count > 1 {
            return Err(format!("at most one wildcard is allowed: {v:?}"));
        }
        if count == 1 && v != "*" && !v.starts_with('*') && !v.ends_with('*') {
            return Err(format!(
                "wildcard is only allowed at the start or end: {v:?}"
            ));
        }
    }
    Ok(())
}

/// Istio's `CheckTrustDomainValues`.
fn check_trust_domains(values: &[String]) -> Result<(), String> {
    check_wildcards(values)?;
    match values.iter().find(|v| v.contains('/')) {
        Some(v) => Err(format!("a trust domain must not contain '/': {v:?}")),
        None => Ok(()),
    }
}

/// Istio's `CheckServiceAccount`: `<sa>` or `<ns>/<sa>`, no wildcard, at most 320
/// characters, at most 16 values.
fn check_service_accounts(values: &[String]) -> Result<(), String> {
    if values.len() > 16 {
        return Err("may not have more than 16 values".into());
    }
    for v in values {
        if v.is_empty() {
            return Err("empty values are not allowed".into());
        }
        if v.contains('*') {
            return Err("wildcards are not allowed".into());
        }
        let format = "expected format 'serviceAccount' or 'namespace/serviceAccount'";
        if v.matches('/').count() > 1 {
            return Err(format!("{format}, found {v:?}"));
        }
        if v.len() > 320 {
            return Err(format!("a value cannot exceed 320 characters: {v:?}"));
        }
        if let Some((ns, sa)) = v.split_once('/') {
            if ns.is_empty() {
                return Err(format!("{format}, found an empty namespace in {v:?}"));
            }
            if sa.is_empty() {
                return Err(format!("{format}, found an empty serviceAccount in {v:?}"));
            }
        }
    }
    Ok(())
}

/// Istio's `CheckValidPathTemplate`.
fn check_path_templates(paths: &[String]) -> Result<(), String> {
    let literal = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()+,;:@=".contains(&b))
    };
    for path in paths {
        let template = contains_path_template(path);
        let mut any_seen = false;
        for glob in path.trim_matches('/').split('/') {
            if glob == MATCH_ONE_TEMPLATE && !any_seen {
                continue;
            }
            if glob == MATCH_ANY_TEMPLATE && !any_seen {
                any_seen = true;
                continue;
            }
            if (glob == MATCH_ANY_TEMPLATE || glob == MATCH_ONE_TEMPLATE) && any_seen {
                return Err(format!(
                    "invalid path template {path:?}: {{**}} is not the last operator"
                ));
            }
            if glob.contains('{') || glob.contains('}') {
                return Err(format!(
                    "invalid path template {path:?}: '{{' or '}}' beyond a supported operator"
                ));
            }
            if template && !literal(glob) {
                return Err(format!(
                    "invalid path template {path:?}: segment {glob:?} is not a valid literal"
                ));
            }
        }
    }
    Ok(())
}

/// Istio's `validateMapKey`: `a[b]` with a non-empty `b`.
fn check_map_key(key: &str) -> Result<(), String> {
    let open = key.find('[');
    match open {
        Some(open) if key.ends_with(']') && open > 0 && open + 2 < key.len() => Ok(()),
        _ => Err(format!("bad key ({key}): should have format a[b]")),
    }
}

/// Istio's `ValidateAttribute`: the `when` keys it knows and their values.
pub fn check_attribute(key: &str, values: &[String]) -> Result<(), String> {
    check_empty(values)?;
    match key {
        k if k.starts_with("request.headers") => check_map_key(k),
        "source.ip" | "remote.ip" | "destination.ip" => check_ips(values),
        "source.namespace"
        | "source.principal"
        | "request.auth.principal"
        | "request.auth.audiences"
        | "request.auth.presenter"
        | "connection.sni" => Ok(()),
        "source.serviceAccount" => check_service_accounts(values),
        "source.trustDomain" => check_wildcards(values),
        k if k.starts_with("request.auth.claims") => check_map_key(k),
        "destination.port" => check_ports(values),
        k if k.starts_with("experimental.envoy.filters.") => check_map_key(k),
        "destination.namespace" => Err(format!(
            "attribute {key} is replaced by the metadata.namespace"
        )),
        k if k.starts_with("destination.labels") => Err(format!(
            "attribute {k} is replaced by the workload selector"
        )),
        "destination.name" | "destination.user" => Err(format!(
            "deprecated attribute {key}: only supported in v1alpha1"
        )),
        _ => Err(format!("unknown attribute: {key}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_templates_as_istio() {
        let ok = |p: &str| check_path_templates(&[p.to_string()]).is_ok();
        assert!(ok("/foo/{*}"));
        assert!(ok("/foo/{**}/"));
        assert!(ok("/foo/{*}/bar/{**}"));
        assert!(ok("/admin*"));
        assert!(!ok("/*/baz/{*}"));
        assert!(!ok("/{**}/foo/{*}"));
        assert!(!ok("/foo/{*}.txt"));
    }

    #[test]
    fn attribute_keys_as_istio() {
        let v = vec!["x".to_string()];
        assert!(check_attribute("request.headers[User-Agent]", &v).is_ok());
        assert!(check_attribute("request.headers[]", &v).is_err());
        assert!(check_attribute("destination.namespace", &v).is_err());
        assert!(check_attribute("destination.labels[app]", &v).is_err());
        assert!(check_attribute("foo", &v).is_err());
        assert!(check_attribute("destination.port", &["70000".to_string()]).is_err());
        assert!(check_attribute("experimental.envoy.filters.a.b[c]", &v).is_ok());
    }
}
