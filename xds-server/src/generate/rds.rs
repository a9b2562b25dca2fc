//! RDS: route configurations.
//!
//! Sidecars get one per outbound HTTP port, named by the port (`"9080"`), with one virtual
//! host per visible service on that port (domains as Istio lists them, each claimed once),
//! one per VirtualService host that is not a service, and a catch-all: `allow_any` to
//! `PassthroughCluster` (mesh `ALLOW_ANY`) or `block_all` answering 502 (`REGISTRY_ONLY`).
//! Proxyless clients get one per service port, named `<fqdn>:<port>`, with a single
//! virtual host whose domains include `<fqdn>:<port>` (what gRPC matches) and the bare
//! names. Routes come from the VirtualService for the host (`http[]` in order), or the
//! default route when none applies.

use std::collections::{BTreeMap, HashSet};

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use pilotfish_mesh::api::HttpRoute;
use pilotfish_mesh::mesh_config::OutboundTrafficPolicy;
use pilotfish_mesh::model::{Proxy, Service};
use pilotfish_mesh::push_context::{PushContext, VirtualServiceConfig};

use super::findings::Finding;
use super::names;
use super::plan::{ClusterPlan, OutboundPlan};
use super::route::{RouteEnv, catch_all_route, default_route, http_route};
use super::scope::Flavor;
use super::util::bool_value;

/// The whole-service clusters of HTTP ports, by port: the services that get a virtual
/// host in that port's route configuration (and an HTTP connection manager in LDS).
pub fn http_ports(plan: &OutboundPlan) -> BTreeMap<u32, Vec<&ClusterPlan>> {
    let mut out: BTreeMap<u32, Vec<&ClusterPlan>> = BTreeMap::new();
    for c in plan
        .clusters
        .iter()
        .filter(|c| c.subset.is_empty() && c.port.protocol.is_http())
    {
        out.entry(c.port.port).or_default().push(c);
    }
    for list in out.values_mut() {
        list.sort_by(|a, b| a.service.hostname.cmp(&b.service.hostname));
    }
    out
}

/// A sidecar's route configurations; what translation noticed goes to `findings`.
pub fn sidecar_route_configs(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    findings: &mut Vec<Finding>,
) -> Vec<RouteConfiguration> {
    let vs_only_hosts = virtual_service_only_hosts(push, proxy);
    http_ports(plan)
        .into_iter()
        .map(|(port, services)| {
            let env = RouteEnv {
                push,
                proxy,
                plan,
                port,
            };
            let mut claimed = HashSet::new();
            let mut vhosts = Vec::new();
            for c in services {
                let domains = names::service_domains(
                    &c.service,
                    port,
                    &proxy.namespace,
                    push.cluster_domain(),
                );
                let routes = service_routes(&env, &c.service, &c.name, Flavor::Sidecar, findings);
                push_vhost(
                    &mut vhosts,
                    &mut claimed,
                    names::host_port(&c.service.hostname, port),
                    domains,
                    routes,
                    findings,
                );
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
            vhosts.push(match push.mesh().outbound_traffic_policy {
                OutboundTrafficPolicy::AllowAny => VirtualHost {
                    name: "allow_any".to_string(),
                    domains: vec!["*".to_string()],
                    routes: vec![catch_all_route(
                        "allow_any",
                        Some(names::PASSTHROUGH_CLUSTER),
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
            });
            RouteConfiguration {
                name: names::sidecar_route(port),
                virtual_hosts: vhosts,
                // Istio's choice: a route to a cluster that is not (yet) there must not
                // reject the whole configuration.
                validate_clusters: bool_value(false),
                ..Default::default()
            }
        })
        .collect()
}

/// A proxyless client's route configurations, one per whole-service cluster; what
/// translation and the proxyless pass noticed goes to `findings`.
pub fn proxyless_route_configs(
    push: &PushContext,
    proxy: &Proxy,
    plan: &OutboundPlan,
    findings: &mut Vec<Finding>,
) -> Vec<RouteConfiguration> {
    plan.clusters
        .iter()
        .filter(|c| c.subset.is_empty())
        .map(|c| {
            let port = c.port.port;
            let env = RouteEnv {
                push,
                proxy,
                plan,
                port,
            };
            let name = names::host_port(&c.service.hostname, port);
            let domains =
                names::service_domains(&c.service, port, &proxy.namespace, push.cluster_domain());
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
        .push
        .virtual_service_for_host(&service.hostname, &env.proxy.namespace)
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
    proxy: &Proxy,
) -> Vec<(String, &'a VirtualServiceConfig)> {
    let mut out: BTreeMap<String, &VirtualServiceConfig> = BTreeMap::new();
    for vs in push.virtual_services_for(&proxy.namespace) {
        if vs.spec.http.is_empty() {
            continue;
        }
        for host in &vs.spec.hosts {
            if out.contains_key(host) || push.service_for(host, &proxy.namespace).is_some() {
                continue;
            }
            if let Some(chosen) = push.virtual_service_for_host(host, &proxy.namespace) {
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
