//! AuthorizationPolicy → Envoy RBAC, as Istio 1.30 translates it
//! (`pilot/pkg/security/authz/builder`, `…/authz/model`, `…/authz/matcher`), for a
//! sidecar's inbound chains and for a proxyless gRPC server's inbound listener
//! (`pilot/pkg/networking/grpcgen/lds.go`). Pure: policies in, filters out.
//!
//! - Evaluation order: Istio's CUSTOM filter first, then AUDIT (Envoy action LOG), DENY,
//!   ALLOW — one RBAC filter per action present, each with its policies named
//!   `ns[<ns>]-policy[<name>]-rule[<i>]`. A policy without rules is one policy that never
//!   matches (so an ALLOW `{}` allows nothing); dry-run policies (`istio.io/dry-run`) go to
//!   `shadow_rules`. CUSTOM (ext_authz) is not supported: like Istio when a CUSTOM
//!   provider cannot be used (`getBadCustomDenyRules`), its rules become a DENY filter
//!   whose policies are named `istio-ext-authz-<provider>-ns[…]-policy[…]-rule[i]` and
//!   end in `-deny-due-to-bad-CUSTOM-action`.
//! - A rule is one Envoy policy: each `from` is a principal, each `to` a permission, every
//!   `when` condition joins one or the other; within them every field is an AND of an OR
//!   of its values and a NOT of the OR of its `not` values.
//! - Untranslatable parts (an HTTP-only field — hosts, methods, paths, request
//!   principals, `request.*` conditions — on a TCP chain): in an ALLOW policy the whole rule
//!   is dropped (it allows nothing); in a DENY or AUDIT policy only that field is ignored
//!   (the rule matches more, so it denies more). Proxyless servers treat the matchers gRPC
//!   refuses (a path template, a `grpc-` or `:scheme` header: A41 NACKs them) the same way.
//! - Principals match the mTLS peer's SPIFFE URI SAN (`authenticated`), with names written
//!   for the default trust domain `cluster.local` rewritten to the mesh's; request
//!   principals, audiences, presenters and claims match the `payload` that
//!   `envoy.filters.http.jwt_authn` (RequestAuthentication) writes to dynamic metadata.

use envoy_types::pb::envoy::config::core::v3::{CidrRange, TypedExtensionConfig};
use envoy_types::pb::envoy::config::listener::v3::{Filter, filter};
use envoy_types::pb::envoy::config::rbac::v3::{
    Permission, Policy, Principal, Rbac, permission, principal, rbac,
};
use envoy_types::pb::envoy::config::route::v3::{HeaderMatcher, header_matcher};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, OrMatcher, PathMatcher, StringMatcher, ValueMatcher,
    list_matcher, metadata_matcher, path_matcher, string_matcher, value_matcher,
};
use pilotfish_mesh::api::Rule;
use pilotfish_mesh::push_context::authz::{
    MATCH_ANY_TEMPLATE, MATCH_ONE_TEMPLATE, contains_path_template, parse_ip_block, parse_port,
};
use pilotfish_mesh::push_context::{AuthorizationPolicyConfig, WorkloadAuthorization};

use super::route::http_filter;
use super::util::{any, regex_matcher, u32_value};

/// Envoy's HTTP RBAC filter (`wellknown.HTTPRoleBasedAccessControl`).
pub const HTTP_RBAC_FILTER: &str = "envoy.filters.http.rbac";
/// Envoy's network RBAC filter (`wellknown.RoleBasedAccessControl`).
pub const NETWORK_RBAC_FILTER: &str = "envoy.filters.network.rbac";
/// The proxyless DENY filter's name (`grpcgen.RBACHTTPFilterNameDeny`).
pub const PROXYLESS_DENY_FILTER: &str = "envoy.filters.http.rbac.DENY";
/// The network filter's stat prefix (`RBACTCPFilterStatPrefix`).
const TCP_STAT_PREFIX: &str = "tcp.";
const SHADOW_ALLOW_STAT_PREFIX: &str = "istio_dry_run_allow_";
const SHADOW_DENY_STAT_PREFIX: &str = "istio_dry_run_deny_";
/// Istio's prefix of CUSTOM policy names (`extAuthzMatchPrefix`).
const EXT_AUTHZ_PREFIX: &str = "istio-ext-authz";
/// Istio's suffix for the DENY rules of a CUSTOM policy it cannot hand to its provider.
const BAD_CUSTOM_SUFFIX: &str = "-deny-due-to-bad-CUSTOM-action";
/// Where `jwt_authn` writes the validated token's claims.
pub const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
const JWT_PAYLOAD: &str = "payload";
/// Istio's default trust domain: principals written with it follow the mesh's.
const DEFAULT_TRUST_DOMAIN: &str = "cluster.local";

/// Where an RBAC filter runs: which attributes the chain can see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// An Envoy sidecar's HTTP chain (HTTP RBAC filter).
    SidecarHttp,
    /// An Envoy sidecar's TCP chain (network RBAC filter): HTTP attributes are unknown.
    SidecarTcp,
    /// A proxyless gRPC server (HTTP RBAC, gRPC's subset; A41).
    Proxyless,
}

impl Target {
    fn for_tcp(self) -> bool {
        self == Target::SidecarTcp
    }
}

/// The RBAC filters of a sidecar's `virtualInbound`: HTTP filters for its HTTP chains
/// (before the router, after authentication), network filters for its TCP chains and the
/// passthrough (before `tcp_proxy`). Both empty when no policy applies.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct InboundRbac {
    pub http: Vec<HttpFilter>,
    pub network: Vec<Filter>,
}

impl InboundRbac {
    /// The filters for a workload under `authz`.
    pub fn new(authz: &WorkloadAuthorization, trust_domain: &str) -> Self {
        InboundRbac {
            http: sidecar_http_filters(authz, trust_domain),
            network: sidecar_network_filters(authz, trust_domain),
        }
    }
}

/// The RBAC HTTP filters of a sidecar's inbound HTTP chains, in Istio's order (CUSTOM's
/// DENY, then AUDIT, DENY, ALLOW); empty when no policy applies.
pub fn sidecar_http_filters(authz: &WorkloadAuthorization, trust_domain: &str) -> Vec<HttpFilter> {
    built_rbacs(authz, trust_domain, Target::SidecarHttp)
        .into_iter()
        .map(|b| {
            http_filter(
                HTTP_RBAC_FILTER,
                any(&HttpRbac {
                    rules: b.rules,
                    shadow_rules_stat_prefix: b.shadow_stat_prefix.to_string(),
                    shadow_rules: b.shadow_rules,
                    ..Default::default()
                }),
            )
        })
        .collect()
}

/// The RBAC network filters of a sidecar's inbound TCP chains, in Istio's order; empty
/// when no policy applies.
pub fn sidecar_network_filters(authz: &WorkloadAuthorization, trust_domain: &str) -> Vec<Filter> {
    built_rbacs(authz, trust_domain, Target::SidecarTcp)
        .into_iter()
        .map(|b| Filter {
            name: NETWORK_RBAC_FILTER.to_string(),
            config_type: Some(filter::ConfigType::TypedConfig(any(&NetworkRbac {
                rules: b.rules,
                stat_prefix: TCP_STAT_PREFIX.to_string(),
                shadow_rules_stat_prefix: b.shadow_stat_prefix.to_string(),
                shadow_rules: b.shadow_rules,
                ..Default::default()
            }))),
        })
        .collect()
}

/// The RBAC HTTP filters a proxyless gRPC server's inbound listener carries, before its
/// router (Istio's `grpcgen` `buildInboundFilterChain`): gRPC supports ALLOW and DENY
/// only, so AUDIT policies are left out (`envoy.filters.http.rbac.DENY`, then
/// `envoy.filters.http.rbac`); policies are named `<ns>-<name>-<i>`; no dry-run. Two
/// deliberate differences from Istio 1.30.3, both so that what cannot be enforced never
/// allows: an ALLOW policy without rules (`{}`, allow nothing) gets the never-matching
/// policy, as on sidecars (Istio's proxyless generator emits no ALLOW filter for it, which
/// allows everything), and a CUSTOM policy's rules join the DENY filter (Istio's ignores
/// CUSTOM). Empty when no ALLOW, DENY or CUSTOM policy applies. The caller selects the
/// policies (`PushContext::authorization_for_workload`, or a scope's `authz`).
pub fn proxyless_http_filters(
    authz: &WorkloadAuthorization,
    trust_domain: &str,
) -> Vec<HttpFilter> {
    if authz.allow.is_empty() && authz.deny.is_empty() && authz.custom.is_empty() {
        return Vec::new();
    }
    let td = TrustDomains::new(trust_domain);
    let mut out = Vec::new();
    let deny = proxyless_rules(
        authz.custom.iter().chain(&authz.deny),
        rbac::Action::Deny,
        &td,
    );
    if !deny.policies.is_empty() {
        out.push(http_filter(
            PROXYLESS_DENY_FILTER,
            any(&HttpRbac {
                rules: Some(deny),
                ..Default::default()
            }),
        ));
    }
    let allow = proxyless_rules(authz.allow.iter(), rbac::Action::Allow, &td);
    if !allow.policies.is_empty() {
        out.push(http_filter(
            HTTP_RBAC_FILTER,
            any(&HttpRbac {
                rules: Some(allow),
                ..Default::default()
            }),
        ));
    }
    out
}

fn proxyless_rules<'a>(
    policies: impl Iterator<Item = &'a std::sync::Arc<AuthorizationPolicyConfig>>,
    action: rbac::Action,
    td: &TrustDomains,
) -> Rbac {
    let mut rules = Rbac {
        action: action as i32,
        ..Default::default()
    };
    for p in policies {
        let rule_list = p.spec.policy.rules();
        if rule_list.is_empty() {
            let name = format!("{}-{}-0", p.meta.namespace, p.meta.name);
            rules.policies.insert(name, match_never());
            continue;
        }
        for (i, rule) in rule_list.iter().enumerate() {
            let name = format!("{}-{}-{i}", p.meta.namespace, p.meta.name);
            if let Some(policy) = generate(rule, &p.meta.namespace, td, Target::Proxyless, action) {
                rules.policies.insert(name, policy);
            }
        }
    }
    rules
}

/// One RBAC filter's configuration before it is wrapped for HTTP or TCP.
struct BuiltRbac {
    rules: Option<Rbac>,
    shadow_rules: Option<Rbac>,
    shadow_stat_prefix: &'static str,
}

fn built_rbacs(
    authz: &WorkloadAuthorization,
    trust_domain: &str,
    target: Target,
) -> Vec<BuiltRbac> {
    let td = TrustDomains::new(trust_domain);
    let mut out = Vec::new();
    if !authz.custom.is_empty() {
        // Istio's CUSTOM builder with a provider it cannot use: the policies' rules,
        // enforced as DENY under suffixed names, dry-run or not.
        let mut rules = Rbac {
            action: rbac::Action::Deny as i32,
            ..Default::default()
        };
        for p in &authz.custom {
            // Istio's CUSTOM policy names: `istio-ext-authz-<provider>-` before the usual.
            let prefix = match p.spec.policy.provider.as_ref().map(|x| x.name.as_str()) {
                Some(provider) if !provider.is_empty() => {
                    format!("{EXT_AUTHZ_PREFIX}-{provider}-")
                }
                _ => format!("{EXT_AUTHZ_PREFIX}-"),
            };
            for (name, policy) in policy_rules(p, target, rbac::Action::Deny, &td) {
                rules
                    .policies
                    .insert(format!("{prefix}{name}{BAD_CUSTOM_SUFFIX}"), policy);
            }
        }
        out.push(BuiltRbac {
            rules: Some(rules),
            shadow_rules: None,
            shadow_stat_prefix: "",
        });
    }
    for (policies, action) in [
        (&authz.audit, rbac::Action::Log),
        (&authz.deny, rbac::Action::Deny),
        (&authz.allow, rbac::Action::Allow),
    ] {
        if policies.is_empty() {
            continue;
        }
        let mut enforced: Option<Rbac> = None;
        let mut shadow: Option<Rbac> = None;
        for p in policies {
            let slot = if p.spec.dry_run {
                &mut shadow
            } else {
                &mut enforced
            };
            let rules = slot.get_or_insert_with(|| Rbac {
                action: action as i32,
                ..Default::default()
            });
            rules.policies.extend(policy_rules(p, target, action, &td));
        }
        // Istio's `shadowRuleStatPrefix` reads the action of possibly-absent shadow
        // rules, whose default is ALLOW: only DENY shadow rules get the deny prefix.
        let shadow_stat_prefix = match shadow.as_ref().map(|s| s.action) {
            Some(a) if a == rbac::Action::Deny as i32 => SHADOW_DENY_STAT_PREFIX,
            Some(a) if a == rbac::Action::Log as i32 => "",
            _ => SHADOW_ALLOW_STAT_PREFIX,
        };
        out.push(BuiltRbac {
            rules: enforced,
            shadow_rules: shadow,
            shadow_stat_prefix,
        });
    }
    out
}

/// The named Envoy policies of one AuthorizationPolicy: one per translatable rule, or the
/// never-matching one when it has no rules.
fn policy_rules(
    p: &AuthorizationPolicyConfig,
    target: Target,
    action: rbac::Action,
    td: &TrustDomains,
) -> Vec<(String, Policy)> {
    let name = |i: usize| format!("ns[{}]-policy[{}]-rule[{i}]", p.meta.namespace, p.meta.name);
    let rules = p.spec.policy.rules();
    if rules.is_empty() {
        return vec![(name(0), match_never())];
    }
    rules
        .iter()
        .enumerate()
        .filter_map(|(i, rule)| {
            generate(rule, &p.meta.namespace, td, target, action).map(|policy| (name(i), policy))
        })
        .collect()
}

/// Istio's `rbacPolicyMatchNever`.
fn match_never() -> Policy {
    Policy {
        permissions: vec![Permission {
            rule: Some(permission::Rule::NotRule(Box::new(permission_any()))),
        }],
        principals: vec![Principal {
            identifier: Some(principal::Identifier::NotId(Box::new(principal_any()))),
        }],
        ..Default::default()
    }
}

/// The mesh's trust domain bundle (Istio's `trustdomain.Bundle`; Pilotfish has no trust
/// domain aliases, so it holds the trust domain alone).
struct TrustDomains {
    domains: Vec<String>,
}

impl TrustDomains {
    fn new(trust_domain: &str) -> Self {
        TrustDomains {
            domains: vec![trust_domain.to_string()],
        }
    }

    /// Istio's `ReplaceTrustDomainAliases` for `principals`/`source.principal` values.
    fn replace_aliases(&self, values: &[String]) -> Vec<String> {
        let mut out = Vec::new();
        for v in values {
            let parts: Vec<&str> = v.split('/').collect();
            if parts.len() != 5 || parts[0] == "*" {
                out.push(v.clone());
                continue;
            }
            let from = parts[0];
            if self.domains.iter().any(|d| td_match(from, d)) || from == DEFAULT_TRUST_DOMAIN {
                let mut mine: Vec<String> = Vec::new();
                for d in &self.domains {
                    let replaced = if suffix_match(d, from) {
                        v.clone()
                    } else {
                        format!("{d}/{}", parts[1..].join("/"))
                    };
                    if !mine.contains(&replaced) {
                        mine.push(replaced);
                    }
                }
                out.extend(mine);
            } else {
                out.push(v.clone());
            }
        }
        out
    }

    /// Istio's `ExpandTrustDomainAliases` for `trustDomains`/`source.trustDomain` values.
    fn expand_aliases(&self, values: &[String]) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for v in values {
            let add: Vec<String> = if self.domains.contains(v) {
                self.domains.clone()
            } else {
                vec![v.clone()]
            };
            for a in add {
                if !out.contains(&a) {
                    out.push(a);
                }
            }
        }
        out
    }
}

/// Istio's `stringMatch` of the trust domain utilities (one side may be a `*` pattern).
fn td_match(a: &str, s: &str) -> bool {
    a == s
        || s == "*"
        || prefix_match(a, s)
        || prefix_match(s, a)
        || suffix_match(a, s)
        || suffix_match(s, a)
}

fn prefix_match(a: &str, pattern: &str) -> bool {
    pattern.strip_suffix('*').is_some_and(|p| a.starts_with(p))
}

fn suffix_match(a: &str, pattern: &str) -> bool {
    pattern.strip_prefix('*').is_some_and(|p| a.ends_with(p))
}

/// What an attribute translates to (Istio's generators).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attr {
    DestIp,
    DestPort,
    ConnSni,
    EnvoyFilter,
    SrcIp,
    RemoteIp,
    SrcNamespace,
    SrcTrustDomain,
    SrcServiceAccount,
    SrcPrincipal,
    RequestPrincipal,
    RequestAudiences,
    RequestPresenter,
    RequestHeader,
    RequestClaims,
    Host,
    Path,
    Method,
}

impl Attr {
    /// Extended generators take all values at once (one matcher for the list).
    fn extended(self) -> bool {
        matches!(
            self,
            Attr::EnvoyFilter
                | Attr::RequestPrincipal
                | Attr::RequestAudiences
                | Attr::RequestPresenter
                | Attr::RequestClaims
        )
    }

    /// HTTP-only attributes cannot be checked on a TCP chain.
    fn http_only(self) -> bool {
        matches!(
            self,
            Attr::RequestPrincipal
                | Attr::RequestAudiences
                | Attr::RequestPresenter
                | Attr::RequestHeader
                | Attr::RequestClaims
                | Attr::Host
                | Attr::Path
                | Attr::Method
        )
    }
}

/// One field of a rule: an attribute and its values.
#[derive(Clone)]
struct Field<'a> {
    attr: Attr,
    key: &'a str,
    values: Vec<String>,
    not_values: Vec<String>,
}

/// Why a field could not be translated for the target.
struct Untranslatable;

/// A rule as one Envoy policy (Istio's `authzmodel.New` + `Generate`); `None` when the
/// rule is dropped (an ALLOW rule with an untranslatable field).
fn generate(
    rule: &Rule,
    policy_namespace: &str,
    td: &TrustDomains,
    target: Target,
    action: rbac::Action,
) -> Option<Policy> {
    // An unknown `when` key (validation keeps these out): Istio skips the rule.
    let (base_permission, base_principal) = conditions(rule, td)?;
    let mut principals_lists: Vec<Vec<Field>> = Vec::new();
    for from in rule.from() {
        let mut fields: Vec<Field> = Vec::new();
        if let Some(s) = &from.source {
            // Istio inserts each at the front, so the last inserted comes first.
            let front = [
                (
                    Attr::SrcPrincipal,
                    "source.principal",
                    td.replace_aliases(&s.principals),
                    td.replace_aliases(&s.not_principals),
                ),
                (
                    Attr::RequestPrincipal,
                    "request.auth.principal",
                    s.request_principals.clone(),
                    s.not_request_principals.clone(),
                ),
                (
                    Attr::SrcServiceAccount,
                    "source.serviceAccount",
                    s.service_accounts.clone(),
                    s.not_service_accounts.clone(),
                ),
                (
                    Attr::SrcTrustDomain,
                    "source.trustDomain",
                    td.expand_aliases(&s.trust_domains),
                    td.expand_aliases(&s.not_trust_domains),
                ),
                (
                    Attr::SrcNamespace,
                    "source.namespace",
                    s.namespaces.clone(),
                    s.not_namespaces.clone(),
                ),
                (
                    Attr::RemoteIp,
                    "remote.ip",
                    s.remote_ip_blocks.clone(),
                    s.not_remote_ip_blocks.clone(),
                ),
                (
                    Attr::SrcIp,
                    "source.ip",
                    s.ip_blocks.clone(),
                    s.not_ip_blocks.clone(),
                ),
            ];
            fields.extend(present_fields(front));
        }
        fields.extend(base_principal.iter().cloned());
        principals_lists.push(fields);
    }
    if rule.from().is_empty() {
        principals_lists.push(base_principal.to_vec());
    }
    let mut permission_lists: Vec<Vec<Field>> = Vec::new();
    for to in rule.to() {
        let mut fields: Vec<Field> = Vec::new();
        if let Some(o) = &to.operation {
            let front = [
                (
                    Attr::Host,
                    ":authority",
                    o.hosts.clone(),
                    o.not_hosts.clone(),
                ),
                (
                    Attr::Method,
                    ":method",
                    o.methods.clone(),
                    o.not_methods.clone(),
                ),
                (
                    Attr::Path,
                    "path-matcher",
                    o.paths.clone(),
                    o.not_paths.clone(),
                ),
                (
                    Attr::DestPort,
                    "destination.port",
                    o.ports.clone(),
                    o.not_ports.clone(),
                ),
            ];
            fields.extend(present_fields(front));
        }
        fields.extend(base_permission.iter().cloned());
        permission_lists.push(fields);
    }
    if rule.to().is_empty() {
        permission_lists.push(base_permission.to_vec());
    }
    let ctx = Ctx {
        target,
        action,
        policy_namespace,
    };
    let mut permissions = Vec::new();
    for list in &permission_lists {
        let mut and = Vec::new();
        for f in list {
            and.extend(ctx.permissions(f).ok()?);
        }
        if and.is_empty() {
            and.push(permission_any());
        }
        permissions.push(Permission {
            rule: Some(permission::Rule::AndRules(permission::Set { rules: and })),
        });
    }
    let mut principals = Vec::new();
    for list in &principals_lists {
        let mut and = Vec::new();
        for f in list {
            and.extend(ctx.principals(f).ok()?);
        }
        if and.is_empty() {
            and.push(principal_any());
        }
        principals.push(Principal {
            identifier: Some(principal::Identifier::AndIds(principal::Set { ids: and })),
        });
    }
    Some(Policy {
        permissions,
        principals,
        ..Default::default()
    })
}

/// The fields of a `source` or `operation` that have values or `not` values, in order.
fn present_fields<'a>(
    fields: impl IntoIterator<Item = (Attr, &'a str, Vec<String>, Vec<String>)>,
) -> impl Iterator<Item = Field<'a>> {
    fields
        .into_iter()
        .filter(|(_, _, values, not_values)| !values.is_empty() || !not_values.is_empty())
        .map(|(attr, key, values, not_values)| Field {
            attr,
            key,
            values,
            not_values,
        })
}

/// The `when` conditions split into permission and principal fields, in order; `None`
/// for an unknown key.
fn conditions<'r>(rule: &'r Rule, td: &TrustDomains) -> Option<(Vec<Field<'r>>, Vec<Field<'r>>)> {
    let mut permission = Vec::new();
    let mut principal = Vec::new();
    for c in &rule.when {
        let k = c.key.as_str();
        let (attr, to_permission) = match k {
            "destination.ip" => (Attr::DestIp, true),
            "destination.port" => (Attr::DestPort, true),
            "connection.sni" => (Attr::ConnSni, true),
            _ if k.starts_with("experimental.envoy.filters.") => (Attr::EnvoyFilter, true),
            "source.ip" => (Attr::SrcIp, false),
            "remote.ip" => (Attr::RemoteIp, false),
            "source.namespace" => (Attr::SrcNamespace, false),
            "source.trustDomain" => (Attr::SrcTrustDomain, false),
            "source.serviceAccount" => (Attr::SrcServiceAccount, false),
            "source.principal" => (Attr::SrcPrincipal, false),
            "request.auth.principal" => (Attr::RequestPrincipal, false),
            "request.auth.audiences" => (Attr::RequestAudiences, false),
            "request.auth.presenter" => (Attr::RequestPresenter, false),
            _ if k.starts_with("request.headers") => (Attr::RequestHeader, false),
            _ if k.starts_with("request.auth.claims") => (Attr::RequestClaims, false),
            _ => return None,
        };
        let (values, not_values) = match attr {
            Attr::SrcPrincipal => (
                td.replace_aliases(&c.values),
                td.replace_aliases(&c.not_values),
            ),
            Attr::SrcTrustDomain => (
                td.expand_aliases(&c.values),
                td.expand_aliases(&c.not_values),
            ),
            _ => (c.values.clone(), c.not_values.clone()),
        };
        let field = Field {
            attr,
            key: k,
            values,
            not_values,
        };
        if to_permission {
            permission.push(field);
        } else {
            principal.push(field);
        }
    }
    Some((permission, principal))
}

/// What one field's translation needs to know.
struct Ctx<'a> {
    target: Target,
    action: rbac::Action,
    policy_namespace: &'a str,
}

impl Ctx<'_> {
    /// Istio's `checkError`: an error fails an ALLOW rule; a DENY or AUDIT rule ignores
    /// the failed part.
    fn check<T>(&self, r: Result<T, Untranslatable>) -> Result<Option<T>, Untranslatable> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(e) if self.action == rbac::Action::Allow => Err(e),
            Err(_) => Ok(None),
        }
    }

    /// Whether the target can check `attr` with `value` at all.
    fn supported(&self, attr: Attr, key: &str, value: &str) -> Result<(), Untranslatable> {
        if attr.http_only() && self.target.for_tcp() {
            return Err(Untranslatable);
        }
        if self.target == Target::Proxyless {
            // gRPC (A41) NACKs a listener whose RBAC matches a `grpc-` or `:scheme`
            // header, and knows no URI templates.
            if attr == Attr::Path && contains_path_template(value) {
                return Err(Untranslatable);
            }
            if attr == Attr::RequestHeader
                && let Some(name) = bracketed(&key["request.headers".len()..])
            {
                let lower = name.to_ascii_lowercase();
                if lower.starts_with("grpc-") || lower == ":scheme" {
                    return Err(Untranslatable);
                }
            }
        }
        Ok(())
    }

    fn permissions(&self, f: &Field) -> Result<Vec<Permission>, Untranslatable> {
        self.matchers(
            f,
            |values| self.extended_permission(f, values),
            |value| self.permission(f, value),
            permission_not,
            permission_or,
        )
    }

    fn principals(&self, f: &Field) -> Result<Vec<Principal>, Untranslatable> {
        self.matchers(
            f,
            |values| self.extended_principal(f, values),
            |value| self.principal(f, value),
            principal_not,
            principal_or,
        )
    }

    /// One field's matchers (permissions or principals alike): an extended attribute is one
    /// matcher for its values and one negated for its `not` values; any other is an OR of
    /// its values and a negated OR of its `not` values. What cannot be translated is
    /// dropped or fails the rule as [`check`](Self::check) decides for the action.
    fn matchers<T>(
        &self,
        f: &Field,
        extended: impl Fn(&[String]) -> Result<T, Untranslatable>,
        single: impl Fn(&str) -> Result<T, Untranslatable>,
        not: fn(T) -> T,
        or: fn(Vec<T>) -> T,
    ) -> Result<Vec<T>, Untranslatable> {
        let mut out = Vec::new();
        if f.attr.extended() {
            if !f.values.is_empty()
                && let Some(m) = self.check(extended(&f.values))?
            {
                out.push(m);
            }
            if !f.not_values.is_empty()
                && let Some(m) = self.check(extended(&f.not_values))?
            {
                out.push(not(m));
            }
            return Ok(out);
        }
        let mut any = Vec::new();
        for v in &f.values {
            if let Some(m) = self.check(single(v))? {
                any.push(m);
            }
        }
        if !any.is_empty() {
            out.push(or(any));
        }
        let mut any = Vec::new();
        for v in &f.not_values {
            if let Some(m) = self.check(single(v))? {
                any.push(m);
            }
        }
        if !any.is_empty() {
            out.push(not(or(any)));
        }
        Ok(out)
    }

    fn permission(&self, f: &Field, value: &str) -> Result<Permission, Untranslatable> {
        self.supported(f.attr, f.key, value)?;
        let rule = match f.attr {
            Attr::DestIp => permission::Rule::DestinationIp(cidr(value)?),
            Attr::DestPort => {
                permission::Rule::DestinationPort(parse_port(value).ok_or(Untranslatable)?)
            }
            Attr::ConnSni => {
                permission::Rule::RequestedServerName(string_matcher_with_prefix(value, ""))
            }
            Attr::EnvoyFilter => {
                let (filter, key) = envoy_filter_key(f.key)?;
                #[allow(deprecated)]
                permission::Rule::Metadata(
                    match value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
                        Some(inner) => metadata_list(
                            &filter,
                            &[key],
                            string_value(string_matcher_with_prefix(inner, "")),
                            false,
                        ),
                        None => metadata_value(
                            &filter,
                            &[key],
                            string_value(string_matcher_with_prefix(value, "")),
                        ),
                    },
                )
            }
            Attr::Host => permission::Rule::Header(header_matcher(":authority", value, true)),
            Attr::Method => permission::Rule::Header(header_matcher(":method", value, false)),
            Attr::Path => {
                if contains_path_template(value) {
                    permission::Rule::UriTemplate(TypedExtensionConfig {
                        name: "uri-template".to_string(),
                        typed_config: Some(any(&UriTemplateMatchConfig {
                            path_template: value
                                .replace(MATCH_ANY_TEMPLATE, "**")
                                .replace(MATCH_ONE_TEMPLATE, "*"),
                        })),
                    })
                } else {
                    permission::Rule::UrlPath(PathMatcher {
                        rule: Some(path_matcher::Rule::Path(string_matcher_with_prefix(
                            value, "",
                        ))),
                    })
                }
            }
            _ => return Err(Untranslatable),
        };
        Ok(Permission { rule: Some(rule) })
    }

    fn extended_permission(
        &self,
        f: &Field,
        values: &[String],
    ) -> Result<Permission, Untranslatable> {
        if f.attr != Attr::EnvoyFilter {
            return Err(Untranslatable);
        }
        let (filter, key) = envoy_filter_key(f.key)?;
        let matchers: Vec<ValueMatcher> = values
            .iter()
            .map(
                |v| match v.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
                    Some(inner) => ValueMatcher {
                        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
                            ListMatcher {
                                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(
                                    string_value(string_matcher_with_prefix(inner, "")),
                                ))),
                            },
                        ))),
                    },
                    None => string_value(string_matcher_with_prefix(v, "")),
                },
            )
            .collect();
        #[allow(deprecated)]
        Ok(Permission {
            rule: Some(permission::Rule::Metadata(metadata_value(
                &filter,
                &[key],
                or_matcher(matchers),
            ))),
        })
    }

    fn principal(&self, f: &Field, value: &str) -> Result<Principal, Untranslatable> {
        self.supported(f.attr, f.key, value)?;
        let id = match f.attr {
            Attr::SrcIp => principal::Identifier::DirectRemoteIp(cidr(value)?),
            Attr::RemoteIp => principal::Identifier::RemoteIp(cidr(value)?),
            Attr::SrcNamespace => {
                let regex = value
                    .split('*')
                    .map(quote_meta)
                    .collect::<Vec<_>>()
                    .join(".*");
                authenticated(regex_string(&format!(".*/ns/{regex}/.*")))
            }
            Attr::SrcTrustDomain => authenticated(if value == "*" {
                prefix_string("spiffe://")
            } else if !value.contains('*') {
                prefix_string(&format!("spiffe://{value}/"))
            } else {
                let (a, b) = value.split_once('*').unwrap_or((value, ""));
                regex_string(&format!(
                    "spiffe://{}[^/]*{}/.*",
                    quote_meta(a),
                    quote_meta(b)
                ))
            }),
            Attr::SrcServiceAccount => {
                let (ns, sa) = value
                    .split_once('/')
                    .unwrap_or((self.policy_namespace, value));
                authenticated(regex_string(&format!(
                    "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
                    quote_meta(ns),
                    quote_meta(sa)
                )))
            }
            Attr::SrcPrincipal => authenticated(string_matcher_with_prefix(value, "spiffe://")),
            Attr::RequestHeader => {
                let name = bracketed(&f.key["request.headers".len()..]).ok_or(Untranslatable)?;
                principal::Identifier::Header(header_matcher(name, value, false))
            }
            _ => return Err(Untranslatable),
        };
        Ok(Principal {
            identifier: Some(id),
        })
    }

    fn extended_principal(
        &self,
        f: &Field,
        values: &[String],
    ) -> Result<Principal, Untranslatable> {
        if f.attr.http_only() && self.target.for_tcp() {
            return Err(Untranslatable);
        }
        #[allow(deprecated)]
        let metadata = |m: MetadataMatcher| Principal {
            identifier: Some(principal::Identifier::Metadata(m)),
        };
        match f.attr {
            Attr::RequestPrincipal => {
                let mut or = Vec::new();
                for value in values {
                    let (iss, sub) = request_principal_matchers(value);
                    or.push(principal_and(vec![
                        metadata(metadata_value(
                            JWT_FILTER,
                            &[JWT_PAYLOAD.to_string(), "iss".to_string()],
                            string_value(iss),
                        )),
                        metadata(metadata_value(
                            JWT_FILTER,
                            &[JWT_PAYLOAD.to_string(), "sub".to_string()],
                            string_value(sub),
                        )),
                    ]));
                }
                Ok(if or.len() == 1 {
                    or.remove(0)
                } else {
                    principal_or(or)
                })
            }
            Attr::RequestAudiences | Attr::RequestPresenter => {
                let claim = if f.attr == Attr::RequestAudiences {
                    "aud"
                } else {
                    "azp"
                };
                Ok(metadata(metadata_list(
                    JWT_FILTER,
                    &[JWT_PAYLOAD.to_string(), claim.to_string()],
                    string_or(values),
                    true,
                )))
            }
            Attr::RequestClaims => {
                let claims = nested_bracketed(&f.key["request.auth.claims".len()..])
                    .ok_or(Untranslatable)?;
                let mut path = vec![JWT_PAYLOAD.to_string()];
                path.extend(claims);
                Ok(metadata(metadata_list(
                    JWT_FILTER,
                    &path,
                    string_or(values),
                    true,
                )))
            }
            _ => Err(Untranslatable),
        }
    }
}

/// Istio's `requestPrincipalGenerator`: `<iss>/<sub>` split at the last `/`, with `*`
/// prefix/suffix forms.
fn request_principal_matchers(value: &str) -> (StringMatcher, StringMatcher) {
    let any = || regex_string(".+");
    let (iss, sub, found) = match value.rfind('/') {
        Some(i) => (&value[..i], &value[i + 1..], true),
        None => (value, "", false),
    };
    if value == "*" {
        (any(), any())
    } else if let Some(rest) = value.strip_prefix('*') {
        if found {
            let iss_m = if iss == "*" {
                any()
            } else {
                suffix_string(iss.trim_start_matches('*'))
            };
            (iss_m, exact_string(sub))
        } else {
            (any(), suffix_string(rest))
        }
    } else if let Some(rest) = value.strip_suffix('*') {
        if found {
            let sub_m = if sub == "*" {
                any()
            } else {
                prefix_string(sub.strip_suffix('*').unwrap_or(sub))
            };
            (exact_string(iss), sub_m)
        } else {
            (prefix_string(rest), any())
        }
    } else {
        (exact_string(iss), exact_string(sub))
    }
}

/// `experimental.envoy.filters.a.b[c]` → (`envoy.filters.a.b`, `c`).
fn envoy_filter_key(key: &str) -> Result<(String, String), Untranslatable> {
    let trimmed = key.strip_prefix("experimental.").unwrap_or(key);
    let trimmed = trimmed.strip_suffix(']').unwrap_or(trimmed);
    match trimmed.split_once('[') {
        Some((filter, k)) => Ok((filter.to_string(), k.to_string())),
        None => Err(Untranslatable),
    }
}

/// Istio's `extractNameInBrackets`: `[name]` → `name`.
fn bracketed(s: &str) -> Option<&str> {
    s.strip_prefix('[')?.strip_suffix(']')
}

/// Istio's `extractNameInNestedBrackets`: `[a][b]` → `[a, b]`, or `[a.b]` → `[a.b]`.
fn nested_bracketed(s: &str) -> Option<Vec<String>> {
    let bytes = s.as_bytes();
    let mut claims = Vec::new();
    let mut begin = 0;
    while begin < bytes.len() {
        let end = if bytes[begin] == b'[' {
            (begin + 1..bytes.len())
                .find(|&i| bytes[i] == b'[' || bytes[i] == b']')
                .filter(|&i| bytes[i] == b']')
        } else {
            None
        };
        match end {
            Some(end) => {
                claims.push(s[begin + 1..end].to_string());
                begin = end + 1;
            }
            None => return bracketed(s).map(|n| vec![n.to_string()]),
        }
    }
    Some(claims)
}

/// Go's `regexp.QuoteMeta`.
fn quote_meta(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn cidr(value: &str) -> Result<CidrRange, Untranslatable> {
    let (addr, len) = parse_ip_block(value).ok_or(Untranslatable)?;
    Ok(CidrRange {
        address_prefix: addr.to_string(),
        prefix_len: u32_value(u32::from(len)),
    })
}

fn exact_string(v: &str) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Exact(v.to_string())),
        ..Default::default()
    }
}

fn prefix_string(v: &str) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Prefix(v.to_string())),
        ..Default::default()
    }
}

fn suffix_string(v: &str) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Suffix(v.to_string())),
        ..Default::default()
    }
}

fn regex_string(v: &str) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::SafeRegex(regex_matcher(v))),
        ..Default::default()
    }
}

/// Istio's `StringMatcherWithPrefix`: `*` is presence (`.+`), `*x` a suffix (a regex when
/// there is a prefix), `x*` a prefix, else exact; `prefix` is prepended.
fn string_matcher_with_prefix(v: &str, prefix: &str) -> StringMatcher {
    if v == "*" {
        regex_string(".+")
    } else if let Some(rest) = v.strip_prefix('*') {
        if prefix.is_empty() {
            suffix_string(rest)
        } else {
            regex_string(&format!("{prefix}.*{}", quote_meta(rest)))
        }
    } else if let Some(rest) = v.strip_suffix('*') {
        prefix_string(&format!("{prefix}{rest}"))
    } else {
        exact_string(&format!("{prefix}{v}"))
    }
}

/// Istio's `HeaderMatcher`/`HostMatcher` (the latter case-insensitive): `*` is presence,
/// `*x` a suffix, `x*` a prefix, else exact.
fn header_matcher(name: &str, v: &str, ignore_case: bool) -> HeaderMatcher {
    let specifier = if v == "*" {
        header_matcher::HeaderMatchSpecifier::PresentMatch(true)
    } else {
        let pattern = if let Some(rest) = v.strip_prefix('*') {
            string_matcher::MatchPattern::Suffix(rest.to_string())
        } else if let Some(rest) = v.strip_suffix('*') {
            string_matcher::MatchPattern::Prefix(rest.to_string())
        } else {
            string_matcher::MatchPattern::Exact(v.to_string())
        };
        header_matcher::HeaderMatchSpecifier::StringMatch(StringMatcher {
            match_pattern: Some(pattern),
            ignore_case,
        })
    };
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

fn authenticated(name: StringMatcher) -> principal::Identifier {
    principal::Identifier::Authenticated(principal::Authenticated {
        principal_name: Some(name),
    })
}

fn string_value(m: StringMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
    }
}

/// Istio's `OrMatcher`: one matcher alone, else an `or_match`.
fn or_matcher(mut matchers: Vec<ValueMatcher>) -> ValueMatcher {
    if matchers.len() == 1 {
        return matchers.remove(0);
    }
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: matchers,
        })),
    }
}

/// Istio's `StringOrMatcher`.
fn string_or(values: &[String]) -> ValueMatcher {
    or_matcher(
        values
            .iter()
            .map(|v| string_value(string_matcher_with_prefix(v, "")))
            .collect(),
    )
}

fn metadata_path(keys: &[String]) -> Vec<metadata_matcher::PathSegment> {
    keys.iter()
        .map(|k| metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key(k.clone())),
        })
        .collect()
}

/// Istio's `MetadataValueMatcher` (a path of keys, one value).
fn metadata_value(filter: &str, keys: &[String], value: ValueMatcher) -> MetadataMatcher {
    MetadataMatcher {
        filter: filter.to_string(),
        path: metadata_path(keys),
        value: Some(value),
        ..Default::default()
    }
}

/// Istio's `MetadataListValueMatcher`: the value as a list element, and with
/// `or_scalar` (the JWT claims' "extended" form) also as a scalar.
fn metadata_list(
    filter: &str,
    keys: &[String],
    value: ValueMatcher,
    or_scalar: bool,
) -> MetadataMatcher {
    let list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(value.clone()))),
            },
        ))),
    };
    let value = if or_scalar {
        ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
                value_matchers: vec![list, value],
            })),
        }
    } else {
        list
    };
    MetadataMatcher {
        filter: filter.to_string(),
        path: metadata_path(keys),
        value: Some(value),
        ..Default::default()
    }
}

fn permission_any() -> Permission {
    Permission {
        rule: Some(permission::Rule::Any(true)),
    }
}

fn permission_or(rules: Vec<Permission>) -> Permission {
    Permission {
        rule: Some(permission::Rule::OrRules(permission::Set { rules })),
    }
}

fn permission_not(p: Permission) -> Permission {
    Permission {
        rule: Some(permission::Rule::NotRule(Box::new(p))),
    }
}

fn principal_any() -> Principal {
    Principal {
        identifier: Some(principal::Identifier::Any(true)),
    }
}

fn principal_or(ids: Vec<Principal>) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::OrIds(principal::Set { ids })),
    }
}

fn principal_and(ids: Vec<Principal>) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::AndIds(principal::Set { ids })),
    }
}

fn principal_not(p: Principal) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::NotId(Box::new(p))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pilotfish_mesh::api::AuthorizationPolicySpec;
    use pilotfish_mesh::push_context::{AuthorizationPolicyEntry, Config, ConfigMeta};
    use serde_json::{Value, json};

    use super::*;
    use crate::generate::json::to_json;

    fn policy(name: &str, spec: Value, dry_run: bool) -> Arc<AuthorizationPolicyConfig> {
        let policy: AuthorizationPolicySpec = serde_json::from_value(spec).unwrap();
        Arc::new(Config {
            meta: ConfigMeta {
                name: name.into(),
                namespace: "foo".into(),
                creation_ms: 0,
                generation: 1,
            },
            spec: AuthorizationPolicyEntry { policy, dry_run },
        })
    }

    fn authz(policies: Vec<Arc<AuthorizationPolicyConfig>>) -> WorkloadAuthorization {
        pilotfish_mesh::push_context::authz::select(&policies, &Default::default())
    }

    fn http_json(a: &WorkloadAuthorization) -> Vec<Value> {
        sidecar_http_filters(a, "cluster.local")
            .iter()
            .map(|f| {
                let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(c)) = &f.config_type else { panic!() };
                json!({"name": f.name, "config": to_json(&c.type_url, &c.value).unwrap()})
            })
            .collect()
    }

    fn tcp_json(a: &WorkloadAuthorization) -> Vec<Value> {
        sidecar_network_filters(a, "cluster.local")
            .iter()
            .map(|f| {
                let Some(filter::ConfigType::TypedConfig(c)) = &f.config_type else {
                    panic!()
                };
                json!({"name": f.name, "config": to_json(&c.type_url, &c.value).unwrap()})
            })
            .collect()
    }

    /// Istio's builder testdata/http/allow-empty-rule-out.yaml and allow-nil-rule: an
    /// empty rule allows everything, no rules allows nothing.
    #[test]
    fn empty_rule_matches_all_and_no_rules_match_never() {
        let got = http_json(&authz(vec![policy(
            "allow-all",
            json!({"rules": [{}]}),
            false,
        )]));
        assert_eq!(got[0]["name"], HTTP_RBAC_FILTER);
        assert_eq!(
            got[0]["config"]["rules"]["policies"]["ns[foo]-policy[allow-all]-rule[0]"],
            json!({"permissions": [{"and_rules": {"rules": [{"any": true}]}}],
                   "principals": [{"and_ids": {"ids": [{"any": true}]}}]})
        );
        assert_eq!(
            got[0]["config"]["shadow_rules_stat_prefix"],
            SHADOW_ALLOW_STAT_PREFIX
        );
        let got = http_json(&authz(vec![policy("allow-nothing", json!({}), false)]));
        assert_eq!(
            got[0]["config"]["rules"]["policies"]["ns[foo]-policy[allow-nothing]-rule[0]"],
            json!({"permissions": [{"not_rule": {"any": true}}],
                   "principals": [{"not_id": {"any": true}}]})
        );
    }

    /// testdata/tcp/allow-only-http: every ALLOW rule uses an HTTP field, so the TCP
    /// filter allows nothing (`rules: {}`); testdata/tcp/deny-both-http-tcp: a DENY rule
    /// keeps its TCP fields and ignores the HTTP ones.
    #[test]
    fn http_only_rules_on_tcp_allow_nothing_but_deny_wider() {
        let allow = authz(vec![policy(
            "p",
            json!({"rules": [
                {"from": [{"source": {"requestPrincipals": ["id-1"]}}], "to": [{"operation": {"methods": ["GET"]}}]},
                {"from": [{"source": {"namespaces": ["ns-1"]}}], "to": [{"operation": {"hosts": ["example.com"]}}]}
            ]}),
            false,
        )]);
        let got = tcp_json(&allow);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["name"], NETWORK_RBAC_FILTER);
        assert_eq!(got[0]["config"]["rules"], json!({}));
        assert_eq!(got[0]["config"]["stat_prefix"], "tcp.");
        // On HTTP the same policy has both rules.
        let http = http_json(&allow);
        assert_eq!(
            http[0]["config"]["rules"]["policies"]
                .as_object()
                .unwrap()
                .len(),
            2
        );

        let deny = authz(vec![policy(
            "p",
            json!({"action": "DENY", "rules": [
                {"from": [{"source": {"namespaces": ["ns-1"]}}], "to": [{"operation": {"methods": ["GET"]}}]}
            ]}),
            false,
        )]);
        let got = tcp_json(&deny);
        let p = &got[0]["config"]["rules"]["policies"]["ns[foo]-policy[p]-rule[0]"];
        assert_eq!(got[0]["config"]["rules"]["action"], "DENY");
        // The method is ignored: any permission; the namespace stays.
        assert_eq!(
            p["permissions"],
            json!([{"and_rules": {"rules": [{"any": true}]}}])
        );
        assert_eq!(
            p["principals"][0]["and_ids"]["ids"][0]["or_ids"]["ids"][0]["authenticated"]["principal_name"]
                ["safe_regex"]["regex"],
            ".*/ns/ns-1/.*"
        );
    }

    /// Istio's order: CUSTOM (as DENY), AUDIT, DENY, ALLOW; dry-run goes to shadow rules.
    #[test]
    fn actions_in_istios_order_and_dry_run_as_shadow() {
        let a = authz(vec![
            policy("allow", json!({"rules": [{}]}), false),
            policy("deny-dry", json!({"action": "DENY", "rules": [{}]}), true),
            policy("audit", json!({"action": "AUDIT", "rules": [{}]}), false),
            policy(
                "custom",
                json!({"action": "CUSTOM", "provider": {"name": "x"}, "rules": [{}]}),
                false,
            ),
        ]);
        let got = http_json(&a);
        assert_eq!(got.len(), 4);
        assert_eq!(got[0]["config"]["rules"]["action"], "DENY");
        assert!(
            got[0]["config"]["rules"]["policies"]
                .get(
                    "istio-ext-authz-x-ns[foo]-policy[custom]-rule[0]-deny-due-to-bad-CUSTOM-action"
                )
                .is_some()
        );
        assert_eq!(got[1]["config"]["rules"]["action"], "LOG");
        assert!(got[2]["config"].get("rules").is_none());
        assert_eq!(got[2]["config"]["shadow_rules"]["action"], "DENY");
        assert_eq!(
            got[2]["config"]["shadow_rules_stat_prefix"],
            SHADOW_DENY_STAT_PREFIX
        );
        assert!(
            got[3]["config"]["rules"]["action"].is_null(),
            "ALLOW is the default"
        );
    }

    #[test]
    fn principals_request_principals_and_service_accounts_as_istio() {
        let a = authz(vec![policy(
            "p",
            json!({"rules": [{"from": [
                {"source": {"principals": ["cluster.local/ns/a/sa/b", "*", "*-suffix", "prefix-*"]}},
                {"source": {"requestPrincipals": ["iss/sub"]}},
                {"source": {"serviceAccounts": ["sa", "ns/sa.x"]}}
            ]}]}),
            false,
        )]);
        let got = http_json(&a);
        let p = &got[0]["config"]["rules"]["policies"]["ns[foo]-policy[p]-rule[0]"]["principals"];
        let names: Vec<&Value> = p[0]["and_ids"]["ids"][0]["or_ids"]["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| &i["authenticated"]["principal_name"])
            .collect();
        assert_eq!(
            names,
            [
                &json!({"exact": "spiffe://cluster.local/ns/a/sa/b"}),
                &json!({"safe_regex": {"regex": ".+"}}),
                &json!({"safe_regex": {"regex": "spiffe://.*-suffix"}}),
                &json!({"prefix": "spiffe://prefix-"}),
            ]
        );
        let jwt = &p[1]["and_ids"]["ids"][0]["and_ids"]["ids"];
        assert_eq!(jwt[0]["metadata"]["filter"], JWT_FILTER);
        assert_eq!(
            jwt[0]["metadata"]["path"],
            json!([{"key": "payload"}, {"key": "iss"}])
        );
        assert_eq!(
            jwt[0]["metadata"]["value"],
            json!({"string_match": {"exact": "iss"}})
        );
        assert_eq!(
            jwt[1]["metadata"]["value"],
            json!({"string_match": {"exact": "sub"}})
        );
        let sa = &p[2]["and_ids"]["ids"][0]["or_ids"]["ids"];
        assert_eq!(
            sa[0]["authenticated"]["principal_name"]["safe_regex"]["regex"],
            "spiffe://.+/ns/foo/(.+/|)sa/sa(/.+)?"
        );
        assert_eq!(
            sa[1]["authenticated"]["principal_name"]["safe_regex"]["regex"],
            "spiffe://.+/ns/ns/(.+/|)sa/sa\\.x(/.+)?"
        );
    }

    #[test]
    fn principals_follow_the_mesh_trust_domain() {
        let td = TrustDomains::new("example.org");
        assert_eq!(
            td.replace_aliases(&[
                "cluster.local/ns/a/sa/b".into(),
                "other.td/ns/a/sa/b".into(),
                "*/ns/a/sa/b".into()
            ]),
            ["example.org/ns/a/sa/b", "other.td/ns/a/sa/b", "*/ns/a/sa/b"]
        );
    }

    #[test]
    fn proxyless_gets_allow_and_deny_only_and_drops_what_grpc_refuses() {
        let a = authz(vec![
            policy(
                "deny",
                json!({"action": "DENY", "rules": [{"to": [{"operation": {"paths": ["/pkg.Svc/Deny"]}}]}]}),
                false,
            ),
            policy("audit", json!({"action": "AUDIT", "rules": [{}]}), false),
            policy(
                "allow",
                json!({"rules": [
                    {"to": [{"operation": {"paths": ["/pkg.Svc/{*}"]}}]},
                    {"when": [{"key": "request.headers[grpc-timeout]", "values": ["1s"]}]},
                    {"from": [{"source": {"principals": ["cluster.local/ns/a/sa/b"]}}]}
                ]}),
                false,
            ),
            policy("nothing", json!({}), false),
        ]);
        let filters = proxyless_http_filters(&a, "cluster.local");
        let names: Vec<&str> = filters.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, [PROXYLESS_DENY_FILTER, HTTP_RBAC_FILTER]);
        let json_of = |f: &HttpFilter| {
            let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(c)) = &f.config_type else { panic!() };
            to_json(&c.type_url, &c.value).unwrap()
        };
        let deny = json_of(&filters[0]);
        assert_eq!(deny["rules"]["action"], "DENY");
        assert!(deny["rules"]["policies"].get("foo-deny-0").is_some());
        let allow = json_of(&filters[1]);
        let policies = allow["rules"]["policies"].as_object().unwrap();
        let mut keys: Vec<&String> = policies.keys().collect();
        keys.sort();
        // The template path and the grpc- header rules are dropped; allow-nothing stays.
        assert_eq!(keys, ["foo-allow-2", "foo-nothing-0"]);
        assert!(allow.get("shadow_rules_stat_prefix").is_none());
    }

    #[test]
    fn no_policy_no_filter() {
        let empty = WorkloadAuthorization::default();
        assert!(sidecar_http_filters(&empty, "cluster.local").is_empty());
        assert!(sidecar_network_filters(&empty, "cluster.local").is_empty());
        assert!(proxyless_http_filters(&empty, "cluster.local").is_empty());
    }
}
