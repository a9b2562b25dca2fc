//! RDS: route configurations.
//!
//! Sidecars get, per outbound HTTP port (see [`outbound_ports`]):
//! - for each service with listeners of its own (`<ip>_<port>`), a route configuration
//!   of its own, `<fqdn>:<port>` (Istio's name for a service's own route): the service's
//!   virtual host (domains as Istio lists them) and the fallback below. One
//!   VirtualService edit changes one of these; SotW and delta streams get that one only;
//! - the port's catch-all, named by the port (`"9080"`), used by `0.0.0.0_<port>` and
//!   routing by Host: one virtual host per shared service (headless, ServiceEntry,
//!   ExternalName, wildcard hosts), one per VirtualService host that is not a service, and
//!   the fallback.
//!
//! The fallback is `allow_any` to `PassthroughCluster` (mesh `ALLOW_ANY`) or `block_all`
//! answering 502 (`REGISTRY_ONLY`).
//!
//! Proxyless clients get one per service port, named `<fqdn>:<port>`, with a single
//! virtual host whose domains include `<fqdn>:<port>` (what gRPC matches) and the bare
//! names. Routes come from the VirtualService for the host (`http[]` in order), or the
//! default route when none applies.

use std::collections::{BTreeMap, HashSet};

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use pilotfish_mesh::api::HttpRoute;
use pilotfish_mesh::mesh_config::OutboundTrafficPolicy;
use pilotfish_mesh::model::{Proxy, Service};
use pilotfish_mesh::push_context::sidecar::EgressScope;
use pilotfish_mesh::push_context::{PushContext, VirtualServiceConfig};

use super::findings::Finding;
use super::lds::unknown_destination_cluster;
use super::names;
use super::plan::{ClusterPlan, OutboundPlan, bound_listeners, outbound_ports};
use super::route::{RouteEnv, catch_all_route, default_route, http_route};
use super::scope::Flavor;
use super::util::bool_value;

/// A sidecar's route configurations; what translation noticed goes to `findings`. A
/// service's own route configuration whose name `reused` accepts is not generated: the
/// caller already holds it (the snapshot's incremental generation, `generate/snapshot.rs`).
pub fn sidecar_route_configs(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    reused: &dyn Fn(&str) -> bool,
    findings: &mut Vec<Finding>,
) -> Vec<RouteConfiguration> {
    let mut out = Vec::new();
    for (port, services) in outbound_ports(plan) {
        if !services.has_http() {
            continue;
        }
        let egress = plan.sidecar.listener_for_port(port);
        let vs_only_hosts = virtual_service_only_hosts(push, plan, egress);
        let env = RouteEnv {
            push,
            proxy,
            plan,
            port,
            egress,
        };
        for (c, _) in services
            .own_listeners
            .iter()
            .filter(|(c, _)| c.port.protocol.is_http())
        {
            let name = names::host_port(&c.service.hostname, port);
            if reused(&name) {
                continue;
            }
            let mut vhosts = Vec::new();
            let mut claimed = HashSet::new();
            push_service_vhost(&env, c, &mut vhosts, &mut claimed, findings);
            vhosts.push(fallback_vhost(plan));
            out.push(route_configuration(name, vhosts));
        }
        let mut claimed = HashSet::new();
        let mut vhosts = Vec::new();
        for c in services.shared.iter().filter(|c| c.port.protocol.is_http()) {
            push_service_vhost(&env, c, &mut vhosts, &mut claimed, findings);
        }
        for (host, vs) in &vs_only_hosts {
            let routes = http_routes(&env, &vs.spec.http, Flavor::Sidecar, findings);
            let domains = vec![names::host_port(host, port), host.clone()];
            push_vhost(
                &mut vhosts,
                &mut claimed,
                names::host_port(host, port),
                domains,
                routes,
                findings,
            );
        }
        vhosts.push(fallback_vhost(plan));
        out.push(route_configuration(names::sidecar_route(port), vhosts));
    }
    for bound in bound_listeners(plan) {
        let services = bound.services();
        if !services.has_http() || reused(&bound.route_name) {
            continue;
        }
        let egress = Some(bound.listener);
        let vs_only_hosts = virtual_service_only_hosts(push, plan, egress);
        let mut claimed = HashSet::new();
        let mut vhosts = Vec::new();
        for c in services.shared.iter().filter(|c| c.port.protocol.is_http()) {
            // A Unix socket listener routes every port of its services (Istio: listener
            // port 0), each virtual host named and matched by the service's own port.
            let port = if bound.port == 0 {
                c.port.port
            } else {
                bound.port
            };
            let env = RouteEnv {
                push,
                proxy,
                plan,
                port,
                egress,
            };
            push_service_vhost(&env, c, &mut vhosts, &mut claimed, findings);
        }
        let env = RouteEnv {
            push,
            proxy,
            plan,
            port: bound.port,
            egress,
        };
        for (host, vs) in &vs_only_hosts {
            let routes = http_routes(&env, &vs.spec.http, Flavor::Sidecar, findings);
            let mut domains = vec![host.clone()];
            if bound.port != 0 {
                domains.insert(0, names::host_port(host, bound.port));
            }
            push_vhost(
                &mut vhosts,
                &mut claimed,
                names::host_port(host, bound.port),
                domains,
                routes,
                findings,
            );
        }
        vhosts.push(fallback_vhost(plan));
        out.push(route_configuration(bound.route_name.clone(), vhosts));
    }
    out
}

fn route_configuration(name: String, virtual_hosts: Vec<VirtualHost>) -> RouteConfiguration {
    RouteConfiguration {
        name,
        virtual_hosts,
        // Istio's choice: a route to a cluster that is not (yet) there must not reject the
        // whole configuration.
        validate_clusters: bool_value(false),
        ..Default::default()
    }
}

/// The virtual host of one service on the environment's port.
fn push_service_vhost(
    env: &RouteEnv<'_>,
    c: &ClusterPlan,
    vhosts: &mut Vec<VirtualHost>,
    claimed: &mut HashSet<String>,
    findings: &mut Vec<Finding>,
) {
    let domains = names::service_domains(
        &c.service,
        env.port,
        &env.proxy.namespace,
        env.push.cluster_domain(),
    );
    let routes = service_routes(env, &c.service, &c.name, Flavor::Sidecar, findings);
    push_vhost(
        vhosts,
        claimed,
        names::host_port(&c.service.hostname, env.port),
        domains,
        routes,
        findings,
    );
}

/// What a request no virtual host claims gets, per the scope's `outboundTrafficPolicy`
/// (the Sidecar's, else the mesh's): `ALLOW_ANY` passes it through (or to the Sidecar's
/// `egressProxy`), `REGISTRY_ONLY` answers 502.
fn fallback_vhost(plan: &OutboundPlan) -> VirtualHost {
    match plan.sidecar.outbound.mode {
        OutboundTrafficPolicy::AllowAny => VirtualHost {
            name: "allow_any".to_string(),
            domains: vec!["*".to_string()],
            routes: vec![catch_all_route(
                "allow_any",
                Some(&unknown_destination_cluster(plan)),
                0,
            )],
            ..Default::default()
        },
        OutboundTrafficPolicy::RegistryOnly => VirtualHost {
            name: "block_all".to_string(),
            domains: vec!["*".to_string()],
            routes: vec![catch_all_route("block_all", None, 502)],
            ..Default::default()
        },
    }
}

/// A proxyless client's route configurations, one per whole-service cluster, but for
/// those whose name `reused` accepts (the caller holds them); what translation and the
/// proxyless pass noticed goes to `findings`. Under a Sidecar, as Istio's gRPC generator
/// builds them from the egress listener claiming the port, a service that listener does
/// not import itself (one a listener with that port leaves out, or a VirtualService
/// destination only) gets a configuration without virtual hosts: its calls fail.
pub fn proxyless_route_configs(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    reused: &dyn Fn(&str) -> bool,
    findings: &mut Vec<Finding>,
) -> Vec<RouteConfiguration> {
    plan.clusters()
        .iter()
        .filter(|c| c.subset.is_empty())
        .filter(|c| !reused(&names::host_port(&c.service.hostname, c.port.port)))
        .map(|c| {
            let port = c.port.port;
            let env = RouteEnv {
                push,
                proxy,
                plan,
                port,
                egress: plan.sidecar.listener_for_port(port),
            };
            let name = names::host_port(&c.service.hostname, port);
            let domains =
                names::service_domains(&c.service, port, &proxy.namespace, push.cluster_domain());
            let routed = !plan.sidecar.is_scoped()
                || env
                    .egress
                    .is_some_and(|l| l.imports_service(&c.service.hostname));
            if !routed {
                return RouteConfiguration {
                    name,
                    ..Default::default()
                };
            }
            RouteConfiguration {
                name: name.clone(),
                virtual_hosts: vec![VirtualHost {
                    name,
                    domains,
                    routes: service_routes(&env, &c.service, &c.name, Flavor::Proxyless, findings),
                    ..Default::default()
                }],
                ..Default::default()
            }
        })
        .collect()
}

/// Routes of one service: its VirtualService's HTTP routes, or the default route.
fn service_routes(
    env: &RouteEnv<'_>,
    service: &Service,
    cluster: &str,
    flavor: Flavor,
    findings: &mut Vec<Finding>,
) -> Vec<Route> {
    match env
        .plan
        .sidecar
        .virtual_service_of(env.push, env.egress, &service.hostname)
        .filter(|vs| !vs.spec.http.is_empty())
    {
        Some(vs) => http_routes(env, &vs.spec.http, flavor, findings),
        None => {
            let (route, downgrades) =
                default_route(env, cluster, &service.hostname, env.port, flavor);
            findings.extend(downgrades.into_iter().map(Finding::Downgrade));
            vec![route]
        }
    }
}

/// The routes of a VirtualService's `http` list, in order.
fn http_routes(
    env: &RouteEnv<'_>,
    http: &[HttpRoute],
    flavor: Flavor,
    findings: &mut Vec<Finding>,
) -> Vec<Route> {
    let mut out = Vec::new();
    for r in http {
        let (routes, found) = http_route(env, r, flavor);
        out.extend(routes);
        findings.extend(found);
    }
    out
}

/// VirtualService hosts that are not service host names (e.g. `*.example.com`, or a name
/// only a VirtualService gives), with the VirtualService that routes each.
fn virtual_service_only_hosts<'a>(
    push: &'a PushContext,
    plan: &OutboundPlan,
    egress: Option<&EgressScope>,
) -> Vec<(String, &'a VirtualServiceConfig)> {
    let sidecar = &plan.sidecar;
    let mut out: BTreeMap<String, &VirtualServiceConfig> = BTreeMap::new();
    for vs in sidecar.virtual_services_of(push, egress) {
        if vs.spec.http.is_empty() {
            continue;
        }
        for host in &vs.spec.hosts {
            if out.contains_key(host) || sidecar.service_for(push, host).is_some() {
                continue;
            }
            if let Some(chosen) = sidecar.virtual_service_of(push, egress, host) {
                out.insert(host.clone(), chosen);
            }
        }
    }
    out.into_iter().collect()
}

/// Adds a virtual host with the domains no earlier one claimed (Envoy rejects a route
/// configuration that lists one domain twice); a host left without domains is dropped.
fn push_vhost(
    vhosts: &mut Vec<VirtualHost>,
    claimed: &mut HashSet<String>,
    name: String,
    domains: Vec<String>,
    routes: Vec<Route>,
    findings: &mut Vec<Finding>,
) {
    // Virtual host names must be unique too; `claimed` holds them under a prefix that no
    // domain can carry.
    if !claimed.insert(format!("\u{0}{name}")) {
        findings.push(Finding::VirtualHostSkipped {
            vhost: name,
            reason: "virtual host generated twice; keeping the first",
        });
        return;
    }
    let domains: Vec<String> = domains
        .into_iter()
        .filter(|d| claimed.insert(d.clone()))
        .collect();
    if domains.is_empty() {
        findings.push(Finding::VirtualHostSkipped {
            vhost: name,
            reason: "every domain already claimed by another virtual host; skipped",
        });
        return;
    }
    vhosts.push(VirtualHost {
        name,
        domains,
        routes,
        ..Default::default()
    });
}
