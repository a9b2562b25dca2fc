//! The pure PushContext builder: Kubernetes objects and Istio configs in, an immutable
//! snapshot plus every finding out. An invalid object is left out; when the previous
//! snapshot holds an accepted version of it, that version keeps being served, so a bad
//! edit never loses the last good configuration. Deleted objects are simply gone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service as KubeService;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::authz::{AuthorizationPolicyEntry, DRY_RUN_ANNOTATION, parse_go_bool};
use super::notices::{service_entry_notices, sidecar_notices, virtual_service_notices};
use super::references::{KnownHosts, SubsetIndex, virtual_service_references};
use super::validate::{
    validate_authorization_policy, validate_destination_rule, validate_peer_authentication,
    validate_request_authentication, validate_service_entry, validate_sidecar,
    validate_virtual_service,
};
use super::{
    AuthorizationPolicyConfig, Config, ConfigMeta, DestinationRuleConfig, JwksOutcome, JwksSource,
    MeshData, PeerAuthenticationConfig, PushContext, RequestAuthenticationConfig, SidecarConfig,
    VirtualServiceConfig, config_age_order, delegate, visibility,
};
use crate::api::{
    AuthorizationPolicy, DestinationRule, PeerAuthentication, RequestAuthentication, ServiceEntry,
    Sidecar, VirtualService, VirtualServiceSpec,
};
use crate::config::{ConfigError, ConfigKey, ConfigKind};
use crate::mesh_config::MeshConfig;
use crate::model::kube::NodeInfo;
use crate::model::kube::{
    PodIndex, creation_ms, endpoints_from_slices, namespace_of, pod_index, service_from_k8s,
    slice_service,
};
use crate::model::{PodInfo, Service, ServiceEndpoints, ServiceOrigin};

/// Everything the builder reads. Shared `Arc`s so callers hand over their stores cheaply.
#[derive(Clone, Debug, Default)]
pub struct BuildInputs {
    pub mesh: MeshConfig,
    /// Kubernetes cluster domain (`cluster.local`).
    pub cluster_domain: String,
    pub services: Vec<Arc<KubeService>>,
    pub endpoint_slices: Vec<Arc<EndpointSlice>>,
    pub pods: Vec<Arc<PodInfo>>,
    /// Nodes, for their Pods' locality.
    pub nodes: Vec<Arc<NodeInfo>>,
    pub virtual_services: Vec<Arc<VirtualService>>,
    pub destination_rules: Vec<Arc<DestinationRule>>,
    pub service_entries: Vec<Arc<ServiceEntry>>,
    pub peer_authentications: Vec<Arc<PeerAuthentication>>,
    pub sidecars: Vec<Arc<Sidecar>>,
    pub request_authentications: Vec<Arc<RequestAuthentication>>,
    /// Key sets fetched for RequestAuthentications (the controller's resolver). A source
    /// an accepted policy needs and this lacks keeps its outcome from the previous
    /// snapshot (a new leader serves what the old one fetched until it fetches itself).
    pub jwks: BTreeMap<JwksSource, JwksOutcome>,
    pub authorization_policies: Vec<Arc<AuthorizationPolicy>>,
    /// Findings made while reading the inputs (fields of Istio objects that Pilotfish does
    /// not know), reported with the build's own.
    pub input_warnings: Vec<ConfigError>,
    /// Send every service's unready endpoints (Istio's `PILOT_SEND_UNHEALTHY_ENDPOINTS`,
    /// off by default); without it only services with a traffic distribution do.
    pub send_unhealthy_endpoints: bool,
    /// Terminate TLS on Sidecar ingress listeners that set `tls` (Istio's
    /// `ENABLE_TLS_ON_SIDECAR_INGRESS`, off by default); without it their `tls` is
    /// ignored with a warning and left out of the snapshot, as Istio ignores it.
    pub enable_tls_on_sidecar_ingress: bool,
}

/// What a build produces.
#[derive(Debug)]
pub struct BuildOutput {
    pub context: PushContext,
    /// Every finding (errors and warnings), sorted by object then path.
    pub findings: Vec<ConfigError>,
    /// Objects with errors whose previously accepted version is still served.
    pub kept_previous: Vec<ConfigKey>,
}

impl BuildOutput {
    pub fn errors(&self) -> impl Iterator<Item = &ConfigError> {
        self.findings.iter().filter(|e| e.is_error())
    }
}

fn meta_of(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ConfigMeta {
    ConfigMeta {
        name: m.name.clone().unwrap_or_default(),
        namespace: namespace_of(m),
        creation_ms: creation_ms(m),
        generation: m.generation.unwrap_or(0),
    }
}

/// Builds a snapshot. `previous` is the last snapshot built from these sources (its
/// accepted configs stand in for objects that became invalid).
pub fn build(inputs: &BuildInputs, previous: Option<&PushContext>) -> BuildOutput {
    let mut findings = inputs.input_warnings.clone();
    let mut kept_previous = Vec::new();
    let domain = inputs.cluster_domain.as_str();

    // Services from Kubernetes.
    let mut services: Vec<Service> = Vec::new();
    for svc in &inputs.services {
        match service_from_k8s(svc, domain) {
            Ok(s) => services.push(s),
            Err(errs) => findings.extend(errs),
        }
    }
    let k8s_hosts: HashSet<(String, String)> = services
        .iter()
        .map(|s| (s.hostname.clone(), s.namespace.clone()))
        .collect();
    // Every (hostname, namespace) declared so far, Kubernetes Services first.
    let mut declared = k8s_hosts.clone();

    // Endpoints for Kubernetes services.
    let pod_index = pod_index(
        inputs.pods.iter().map(|p| &**p),
        inputs.nodes.iter().map(|n| &**n),
    );
    let mut endpoints = kube_endpoints(&services, &inputs.endpoint_slices, &pod_index);

    // ServiceEntries → services and endpoints.
    let mut entries: Vec<&Arc<ServiceEntry>> = inputs.service_entries.iter().collect();
    entries.sort_by_key(|se| {
        (
            creation_ms(&se.metadata),
            namespace_of(&se.metadata),
            se.metadata.name.clone(),
        )
    });
    for se in entries {
        let meta = meta_of(&se.metadata);
        let key = ConfigKey::new(ConfigKind::ServiceEntry, &meta.namespace, &meta.name);
        let validated = validate_service_entry(se, domain);
        findings.extend(validated.findings);
        let (mut svcs, mut eps) = match validated.spec {
            Some(spec) => {
                findings.extend(service_entry_notices(&key, &spec));
                super::service_entry::services_from_entry(
                    &meta.name,
                    &meta.namespace,
                    meta.creation_ms,
                    &spec,
                    &pod_index,
                )
            }
            None => match previous.map(|p| previous_entry(p, &meta)) {
                Some((s, e)) if !s.is_empty() => {
                    kept_previous.push(key.clone());
                    (s, e)
                }
                _ => continue,
            },
        };
        // A Kubernetes Service owns its host name in its namespace; an entry repeating it
        // is ignored for that host.
        let before = svcs.len();
        svcs.retain(|s| !k8s_hosts.contains(&(s.hostname.clone(), s.namespace.clone())));
        eps.retain(|e| !k8s_hosts.contains(&(e.hostname.clone(), e.namespace.clone())));
        if svcs.len() < before {
            findings.push(ConfigError::warning(
                &key,
                "spec.hosts",
                "a host of this entry is a Kubernetes Service of the same namespace; the Service wins",
            ));
        }
        // Two entries declaring one host in one namespace: the oldest wins (entries are
        // visited oldest first).
        for s in svcs {
            if !declared.insert((s.hostname.clone(), s.namespace.clone())) {
                findings.push(ConfigError::warning(
                    &key,
                    "spec.hosts",
                    format!(
                        "host {:?} is already declared by an older ServiceEntry in this namespace",
                        s.hostname
                    ),
                ));
                eps.retain(|e| e.hostname != s.hostname);
                continue;
            }
            services.push(s);
        }
        endpoints.extend(eps);
    }
    if inputs.send_unhealthy_endpoints {
        for s in &mut services {
            s.send_unhealthy_endpoints = true;
        }
    }
    let known_hosts = KnownHosts::new(services.iter().map(|s| s.hostname.as_str()));

    // DestinationRules.
    let mut destination_rules: Vec<Arc<DestinationRuleConfig>> = Vec::new();
    for dr in &inputs.destination_rules {
        let meta = meta_of(&dr.metadata);
        let validated = validate_destination_rule(dr, domain);
        findings.extend(validated.findings);
        match validated.spec {
            Some(spec) => {
                destination_rules.push(Arc::new(Config { meta, spec }));
            }
            None => {
                if let Some(prev) = previous.and_then(|p| find(p.destination_rules(), &meta)) {
                    kept_previous.push(ConfigKey::new(
                        ConfigKind::DestinationRule,
                        &meta.namespace,
                        &meta.name,
                    ));
                    destination_rules.push(prev.clone());
                }
            }
        }
    }
    report_destination_rule_conflicts(&destination_rules, &mut findings);
    let mut subsets = SubsetIndex::default();
    for dr in &destination_rules {
        subsets.add(
            &dr.spec.host,
            &dr.meta.namespace,
            visibility::Exported::resolve(
                &dr.spec.export_to,
                &inputs.mesh.default_destination_rule_export_to,
                &dr.meta.namespace,
            ),
            dr.spec.subsets.iter().map(|s| s.name.clone()),
        );
    }

    // VirtualServices: validate each alone, report what its destinations name that does
    // not exist (served anyway: Istio answers 503 on such a route), then expand delegates.
    let mut accepted: Vec<(ConfigMeta, VirtualServiceSpec)> = Vec::new();
    let mut rejected: Vec<ConfigMeta> = Vec::new();
    for vs in &inputs.virtual_services {
        let meta = meta_of(&vs.metadata);
        let validated = validate_virtual_service(vs, domain);
        findings.extend(validated.findings);
        match validated.spec {
            Some(spec) => {
                let key = ConfigKey::new(ConfigKind::VirtualService, &meta.namespace, &meta.name);
                findings.extend(virtual_service_notices(&key, &spec));
                findings.extend(virtual_service_references(
                    &key,
                    &spec,
                    &subsets,
                    Some(&known_hosts),
                ));
                accepted.push((meta, spec));
            }
            None => rejected.push(meta),
        }
    }
    let delegates: HashMap<(String, String), &VirtualServiceSpec> = accepted
        .iter()
        .filter(|(_, spec)| spec.hosts.is_empty())
        .map(|(m, spec)| ((m.namespace.clone(), m.name.clone()), spec))
        .collect();
    let mesh = &inputs.mesh;
    let mut used_delegates = HashSet::new();
    let mut virtual_services: Vec<Arc<VirtualServiceConfig>> = Vec::new();
    for (meta, spec) in accepted.iter().filter(|(_, spec)| !spec.hosts.is_empty()) {
        let key = ConfigKey::new(ConfigKind::VirtualService, &meta.namespace, &meta.name);
        let expanded = delegate::expand(spec, |ns, name| {
            used_delegates.insert((ns.to_string(), name.to_string()));
            match delegates.get(&(ns.to_string(), name.to_string())) {
                None => delegate::Found::Missing,
                Some(d)
                    if visibility::delegate_visible(mesh, ns, &d.export_to, &meta.namespace) =>
                {
                    delegate::Found::Usable(d)
                }
                Some(_) => delegate::Found::NotExported,
            }
        });
        match expanded {
            Ok((spec, warnings)) => {
                for (path, reason) in warnings {
                    findings.push(ConfigError::warning(&key, path, reason));
                }
                virtual_services.push(Arc::new(Config {
                    meta: meta.clone(),
                    spec,
                }));
            }
            Err((path, reason)) => {
                findings.push(ConfigError::error(&key, path, reason));
                rejected.push(meta.clone());
            }
        }
    }
    for (meta, _) in accepted.iter().filter(|(_, spec)| spec.hosts.is_empty()) {
        if !used_delegates.contains(&(meta.namespace.clone(), meta.name.clone())) {
            let key = ConfigKey::new(ConfigKind::VirtualService, &meta.namespace, &meta.name);
            findings.push(ConfigError::warning(
                &key,
                "spec.hosts",
                "this VirtualService has no hosts and no VirtualService delegates to it, so it routes nothing",
            ));
        }
    }
    for meta in rejected {
        if let Some(prev) = previous.and_then(|p| find(p.virtual_services(), &meta)) {
            kept_previous.push(ConfigKey::new(
                ConfigKind::VirtualService,
                &meta.namespace,
                &meta.name,
            ));
            virtual_services.push(prev.clone());
        }
    }
    report_virtual_service_conflicts(&virtual_services, &mut findings);

    // PeerAuthentications: each judged alone; precedence among them is a query
    // (`PushContext::mtls_for_workload`), so several of one level are all kept.
    let mut peer_authentications: Vec<Arc<PeerAuthenticationConfig>> = Vec::new();
    for pa in &inputs.peer_authentications {
        let meta = meta_of(&pa.metadata);
        let validated = validate_peer_authentication(pa);
        findings.extend(validated.findings);
        match validated.spec {
            Some(spec) => peer_authentications.push(Arc::new(Config { meta, spec })),
            None => {
                if let Some(prev) = previous.and_then(|p| find(p.peer_authentications(), &meta)) {
                    kept_previous.push(ConfigKey::new(
                        ConfigKind::PeerAuthentication,
                        &meta.namespace,
                        &meta.name,
                    ));
                    peer_authentications.push(prev.clone());
                }
            }
        }
    }

    // Sidecars: each judged alone; which one applies to a proxy is a query
    // (`PushContext::sidecar_for`).
    let mut sidecars: Vec<Arc<SidecarConfig>> = Vec::new();
    for sc in &inputs.sidecars {
        let meta = meta_of(&sc.metadata);
        let key = ConfigKey::new(ConfigKind::Sidecar, &meta.namespace, &meta.name);
        let validated = validate_sidecar(sc);
        findings.extend(validated.findings);
        match validated.spec {
            Some(mut spec) => {
                if !inputs.enable_tls_on_sidecar_ingress {
                    findings.extend(sidecar_notices(&key, &spec));
                    for listener in &mut spec.ingress {
                        listener.tls = None;
                    }
                }
                sidecars.push(Arc::new(Config { meta, spec }));
            }
            None => {
                if let Some(prev) = previous.and_then(|p| find(p.sidecars(), &meta)) {
                    kept_previous.push(key);
                    sidecars.push(prev.clone());
                }
            }
        }
    }

    // RequestAuthentications: each judged alone; which apply to a workload is a query
    // (`PushContext::jwt_rules_for_workload`).
    let mut request_authentications: Vec<Arc<RequestAuthenticationConfig>> = Vec::new();
    for ra in &inputs.request_authentications {
        let meta = meta_of(&ra.metadata);
        let validated = validate_request_authentication(ra);
        findings.extend(validated.findings);
        match validated.spec {
            Some(spec) => request_authentications.push(Arc::new(Config { meta, spec })),
            None => {
                if let Some(prev) = previous.and_then(|p| find(p.request_authentications(), &meta))
                {
                    kept_previous.push(ConfigKey::new(
                        ConfigKind::RequestAuthentication,
                        &meta.namespace,
                        &meta.name,
                    ));
                    request_authentications.push(prev.clone());
                }
            }
        }
    }

    // AuthorizationPolicies: each judged alone; which ones apply to a workload is a query
    // (`PushContext::authorization_for_workload`). A CUSTOM policy is an error but kept:
    // the generators render it as DENY rules.
    let mut authorization_policies: Vec<Arc<AuthorizationPolicyConfig>> = Vec::new();
    for ap in &inputs.authorization_policies {
        let meta = meta_of(&ap.metadata);
        let key = ConfigKey::new(ConfigKind::AuthorizationPolicy, &meta.namespace, &meta.name);
        let validated = validate_authorization_policy(ap);
        findings.extend(validated.findings);
        match validated.spec {
            Some(policy) => {
                if !policy.effective_target_refs().is_empty() {
                    findings.push(ConfigError::warning(
                        &key,
                        "spec.targetRefs",
                        "Istio applies a policy with targetRefs only to gateways and waypoints, never to sidecars or proxyless servers; Pilotfish serves neither, so this policy applies to no workload",
                    ));
                }
                let dry_run = ap
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DRY_RUN_ANNOTATION))
                    .and_then(|v| parse_go_bool(v))
                    .unwrap_or(false);
                let spec = AuthorizationPolicyEntry { policy, dry_run };
                authorization_policies.push(Arc::new(Config { meta, spec }));
            }
            None => {
                if let Some(prev) = previous.and_then(|p| find(p.authorization_policies(), &meta)) {
                    kept_previous.push(key);
                    authorization_policies.push(prev.clone());
                }
            }
        }
    }
    let jwks = resolved_jwks(&request_authentications, &inputs.jwks, previous);
    findings.extend(unfetched_key_sets(&request_authentications, &jwks));

    findings.sort();
    findings.dedup();
    kept_previous.sort();
    let mut data = assemble(
        inputs,
        services,
        endpoints,
        virtual_services,
        destination_rules,
        peer_authentications,
        sidecars,
    );
    request_authentications
        .sort_by(|a, b| (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name)));
    data.request_authentications = request_authentications;
    data.jwks = jwks;
    authorization_policies
        .sort_by(|a, b| (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name)));
    data.authorization_policies = authorization_policies;
    BuildOutput {
        context: PushContext::from_data(data),
        findings,
        kept_previous,
    }
}

/// The cheap path for changes that touch only EndpointSlices and Pods: services and
/// configs are taken from `previous` as they are, only endpoints are recomputed.
pub fn build_endpoints_only(inputs: &BuildInputs, previous: &PushContext) -> PushContext {
    let data = previous.data();
    let pod_index = pod_index(
        inputs.pods.iter().map(|p| &**p),
        inputs.nodes.iter().map(|n| &**n),
    );
    let k8s: Vec<Service> = data
        .services
        .iter()
        .filter(|s| s.origin == ServiceOrigin::Kubernetes)
        .map(|s| (**s).clone())
        .collect();
    let mut endpoints = kube_endpoints(&k8s, &inputs.endpoint_slices, &pod_index);
    // Entry endpoints depend on pods only through workload selectors; recompute those from
    // the accepted entries in `inputs` (a rejected entry keeps its previous endpoints).
    for svc in data
        .services
        .iter()
        .filter(|s| s.origin != ServiceOrigin::Kubernetes)
    {
        let ServiceOrigin::ServiceEntry { name } = &svc.origin else {
            continue;
        };
        let from_input = inputs.service_entries.iter().find(|se| {
            se.metadata.name.as_deref() == Some(name) && namespace_of(&se.metadata) == svc.namespace
        });
        let recomputed = from_input.and_then(|se| {
            let spec = validate_service_entry(se, &inputs.cluster_domain).spec?;
            let (_, eps) = super::service_entry::services_from_entry(
                name,
                &svc.namespace,
                svc.creation_ms,
                &spec,
                &pod_index,
            );
            eps.into_iter().find(|e| e.hostname == svc.hostname)
        });
        match recomputed {
            Some(e) => endpoints.push(e),
            None => endpoints.extend(previous.endpoints(svc).map(|e| (**e).clone())),
        }
    }
    let mut next = data.clone();
    endpoints.sort_by(|a, b| (&a.hostname, &a.namespace).cmp(&(&b.hostname, &b.namespace)));
    next.endpoints = endpoints.into_iter().map(Arc::new).collect();
    PushContext::from_data(next)
}

fn kube_endpoints(
    services: &[Service],
    slices: &[Arc<EndpointSlice>],
    pods: &PodIndex,
) -> Vec<ServiceEndpoints> {
    let mut by_service: HashMap<(String, String), Vec<&EndpointSlice>> = HashMap::new();
    for slice in slices {
        if let Some(key) = slice_service(slice) {
            by_service.entry(key).or_default().push(slice);
        }
    }
    services
        .iter()
        .filter(|s| s.origin == ServiceOrigin::Kubernetes)
        .map(|s| {
            let slices = by_service
                .get(&(s.namespace.clone(), s.name.clone()))
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            ServiceEndpoints {
                hostname: s.hostname.clone(),
                namespace: s.namespace.clone(),
                ports: endpoints_from_slices(s, slices.iter().copied(), pods),
            }
        })
        .collect()
}

fn assemble(
    inputs: &BuildInputs,
    mut services: Vec<Service>,
    mut endpoints: Vec<ServiceEndpoints>,
    mut virtual_services: Vec<Arc<VirtualServiceConfig>>,
    mut destination_rules: Vec<Arc<DestinationRuleConfig>>,
    mut peer_authentications: Vec<Arc<PeerAuthenticationConfig>>,
    mut sidecars: Vec<Arc<SidecarConfig>>,
) -> MeshData {
    services.sort_by(|a, b| (&a.hostname, &a.namespace).cmp(&(&b.hostname, &b.namespace)));
    endpoints.sort_by(|a, b| (&a.hostname, &a.namespace).cmp(&(&b.hostname, &b.namespace)));
    virtual_services
        .sort_by(|a, b| (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name)));
    destination_rules
        .sort_by(|a, b| (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name)));
    peer_authentications
        .sort_by(|a, b| (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name)));
    sidecars
        .sort_by(|a, b| (&a.meta.namespace, &a.meta.name).cmp(&(&b.meta.namespace, &b.meta.name)));
    MeshData {
        mesh: inputs.mesh.clone(),
        cluster_domain: inputs.cluster_domain.clone(),
        services: services.into_iter().map(Arc::new).collect(),
        endpoints: endpoints.into_iter().map(Arc::new).collect(),
        virtual_services,
        destination_rules,
        peer_authentications,
        sidecars,
        request_authentications: Vec::new(),
        jwks: BTreeMap::new(),
        authorization_policies: Vec::new(),
    }
}

/// A warning on each JWT rule whose key set could not be fetched, naming the rule, the
/// URI and why: its tokens are rejected (fail closed) until a fetch succeeds.
fn unfetched_key_sets(
    policies: &[Arc<RequestAuthenticationConfig>],
    jwks: &BTreeMap<JwksSource, JwksOutcome>,
) -> Vec<ConfigError> {
    let mut out = Vec::new();
    for ra in policies {
        let key = ConfigKey::new(
            ConfigKind::RequestAuthentication,
            &ra.meta.namespace,
            &ra.meta.name,
        );
        for (i, rule) in ra.spec.jwt_rules.iter().enumerate() {
            let Some(source) = JwksSource::of_rule(rule) else {
                continue;
            };
            if let Some(JwksOutcome::Failed(why)) = jwks.get(&source) {
                let field = if rule.jwks_uri.is_empty() {
                    "issuer"
                } else {
                    "jwksUri"
                };
                out.push(ConfigError::warning(
                    &key,
                    format!("spec.jwtRules[{i}].{field}"),
                    format!(
                        "the key set of {} could not be fetched ({why}): tokens of issuer {:?} are rejected until it is",
                        source.first_url(),
                        rule.issuer
                    ),
                ));
            }
        }
    }
    out
}

/// The key-set outcome of every source the accepted policies need: the resolver's, else
/// the previous snapshot's; sources no policy needs any more are dropped.
fn resolved_jwks(
    policies: &[Arc<RequestAuthenticationConfig>],
    fetched: &BTreeMap<JwksSource, JwksOutcome>,
    previous: Option<&PushContext>,
) -> BTreeMap<JwksSource, JwksOutcome> {
    policies
        .iter()
        .flat_map(|ra| ra.spec.jwt_rules.iter())
        .filter_map(JwksSource::of_rule)
        .filter_map(|source| {
            let outcome = fetched
                .get(&source)
                .or_else(|| previous.and_then(|p| p.jwks().get(&source)))?
                .clone();
            Some((source, outcome))
        })
        .collect()
}

fn find<'a, T>(list: &'a [Arc<Config<T>>], meta: &ConfigMeta) -> Option<&'a Arc<Config<T>>> {
    list.iter()
        .find(|c| c.meta.namespace == meta.namespace && c.meta.name == meta.name)
}

/// Services and endpoints a ServiceEntry contributed to `previous`.
fn previous_entry(
    previous: &PushContext,
    meta: &ConfigMeta,
) -> (Vec<Service>, Vec<ServiceEndpoints>) {
    let services: Vec<Service> = previous
        .services()
        .iter()
        .filter(|s| {
            s.namespace == meta.namespace
                && s.origin
                    == ServiceOrigin::ServiceEntry {
                        name: meta.name.clone(),
                    }
        })
        .map(|s| (**s).clone())
        .collect();
    let endpoints = services
        .iter()
        .filter_map(|s| previous.endpoints(s).map(|e| (**e).clone()))
        .collect();
    (services, endpoints)
}

/// Istio serves one VirtualService per host to sidecars: when two in one namespace claim
/// the same host, the older wins and the newer is reported.
fn report_virtual_service_conflicts(
    list: &[Arc<VirtualServiceConfig>],
    findings: &mut Vec<ConfigError>,
) {
    let mut owners: BTreeMap<(&str, &str), &ConfigMeta> = BTreeMap::new();
    let mut sorted: Vec<&Arc<VirtualServiceConfig>> = list.iter().collect();
    sorted.sort_by(|a, b| config_age_order(&a.meta, &b.meta));
    for vs in sorted {
        let mesh_bound =
            vs.spec.gateways.is_empty() || vs.spec.gateways.iter().any(|g| g == "mesh");
        if !mesh_bound {
            continue;
        }
        for (i, host) in vs.spec.hosts.iter().enumerate() {
            match owners.get(&(vs.meta.namespace.as_str(), host.as_str())) {
                Some(older) => findings.push(ConfigError::warning(
                    &ConfigKey::new(ConfigKind::VirtualService, &vs.meta.namespace, &vs.meta.name),
                    format!("spec.hosts[{i}]"),
                    format!(
                        "host {host:?} is also routed by the older VirtualService {}/{}, which wins for sidecars",
                        older.namespace, older.name
                    ),
                )),
                None => {
                    owners.insert((vs.meta.namespace.as_str(), host.as_str()), &vs.meta);
                }
            }
        }
    }
}

/// Same-host DestinationRules of one namespace are merged (oldest first); report what the
/// merge drops from the newer ones.
fn report_destination_rule_conflicts(
    list: &[Arc<DestinationRuleConfig>],
    findings: &mut Vec<ConfigError>,
) {
    let mut groups: BTreeMap<(&str, &str, bool), Vec<&Arc<DestinationRuleConfig>>> =
        BTreeMap::new();
    for dr in list {
        groups
            .entry((
                dr.meta.namespace.as_str(),
                dr.spec.host.as_str(),
                dr.spec.workload_selector.is_some(),
            ))
            .or_default()
            .push(dr);
    }
    for rules in groups.values_mut().filter(|g| g.len() > 1) {
        rules.sort_by(|a, b| config_age_order(&a.meta, &b.meta));
        let oldest = rules[0];
        let mut subset_names: HashSet<&str> = oldest
            .spec
            .subsets
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        for dr in &rules[1..] {
            let key = ConfigKey::new(
                ConfigKind::DestinationRule,
                &dr.meta.namespace,
                &dr.meta.name,
            );
            if dr.spec.traffic_policy.is_some() && oldest.spec.traffic_policy.is_some() {
                findings.push(ConfigError::warning(
                    &key,
                    "spec.trafficPolicy",
                    format!(
                        "ignored: merged with the older DestinationRule {}/{} for the same host, whose traffic policy wins",
                        oldest.meta.namespace, oldest.meta.name
                    ),
                ));
            }
            for (i, s) in dr.spec.subsets.iter().enumerate() {
                if !subset_names.insert(s.name.as_str()) {
                    findings.push(ConfigError::warning(
                        &key,
                        format!("spec.subsets[{i}].name"),
                        format!("ignored: subset {:?} is already defined by an older DestinationRule for this host", s.name),
                    ));
                }
            }
        }
    }
}
