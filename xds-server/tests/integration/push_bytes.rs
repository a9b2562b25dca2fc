//! What one configuration change costs on the wire, per sidecar, measured in-process with
//! the generators on the scale issue's mesh: 1,000 services in 20 namespaces, port 8080,
//! 2 Pods each, every 10th service with a DestinationRule (two subsets) and a
//! VirtualService (a header route and an 80/20 split); no Sidecar scoping.
//!
//! For each change — (a) one VirtualService edit, (b) one DestinationRule subset added,
//! (b') one subset's traffic policy changed, (c) one Service added, (d) one removed — a
//! sidecar's view is generated before and after, and the bytes a stream is sent for the
//! change are computed as the ADS engine sends them:
//! - **SotW**: LDS and CDS as whole responses when anything in them changed (the state of
//!   the world); RDS and EDS only the resources that are new or changed (Envoy's SotW RDS
//!   and EDS need not repeat unchanged resources), plus the endpoints of every new or
//!   changed cluster (Envoy finishes warming a cluster only on a fresh assignment);
//! - **delta**: every type's new or changed resources and the removed names, plus the same
//!   warming endpoints.
//!
//! Each response is encoded as the engine frames it (version, nonce, control plane), so
//! the figures are bytes of `DiscoveryResponse`/`DeltaDiscoveryResponse` messages. The
//! test bounds them (never time); run it with `--nocapture` to print the table:
//!
//! ```sh
//! cargo test -p pilotfish-xds --test integration push_bytes -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryResponse, Resource as WireResource,
};
use envoy_types::pb::google::protobuf::Any;
use pilotfish_mesh::api::{DestinationRule, Subset, VirtualService};
use pilotfish_mesh::model::Proxy;
use pilotfish_mesh::push_context::{BuildInputs, PushContext, build};
use pilotfish_mesh::synthetic::{MeshShape, mesh};
use pilotfish_xds::ads::{ChangeKind, Resource, XdsType};
use pilotfish_xds::generate::{GeneratedSnapshot, ResourceMap};
use prost::Message;

/// Sidecars of the issue's mesh: the per-edit budget is spread over this many.
const SIDECARS: u64 = 2_000;

/// The issue's mesh.
fn shape(services: usize) -> MeshShape {
    MeshShape {
        services,
        endpoints_per_service: 2,
        routed_every: 10,
        namespaces: 20,
    }
}

fn built(inputs: &BuildInputs) -> Arc<PushContext> {
    let out = build(inputs, None);
    let errors: Vec<_> = out.errors().collect();
    assert!(errors.is_empty(), "the synthetic mesh is valid: {errors:?}");
    Arc::new(out.context)
}

/// Whether object metadata names `name` in `ns`.
macro_rules! is {
    ($meta:expr, $name:expr, $ns:expr) => {
        $meta.name.as_deref() == Some($name) && $meta.namespace.as_deref() == Some($ns)
    };
}

/// Objects of one service (Service, EndpointSlice, Pods, routing) removed from `inputs`.
fn without_service(mut inputs: BuildInputs, name: &str, ns: &str) -> BuildInputs {
    let slice = format!("{name}-slice");
    let pod_prefix = format!("{name}-");
    inputs.services.retain(|s| !is!(s.metadata, name, ns));
    inputs
        .endpoint_slices
        .retain(|s| !is!(s.metadata, &*slice, ns));
    inputs
        .pods
        .retain(|p| !(p.namespace == ns && p.name.starts_with(&pod_prefix)));
    inputs
        .virtual_services
        .retain(|v| !is!(v.metadata, name, ns));
    inputs
        .destination_rules
        .retain(|d| !is!(d.metadata, name, ns));
    inputs
}

fn edit_vs(inputs: &mut BuildInputs, name: &str, f: impl FnOnce(&mut VirtualService)) {
    let vs = inputs
        .virtual_services
        .iter_mut()
        .find(|v| v.metadata.name.as_deref() == Some(name))
        .expect("the VirtualService exists");
    let mut edited = (**vs).clone();
    f(&mut edited);
    *vs = Arc::new(edited);
}

fn edit_dr(inputs: &mut BuildInputs, name: &str, f: impl FnOnce(&mut DestinationRule)) {
    let dr = inputs
        .destination_rules
        .iter_mut()
        .find(|d| d.metadata.name.as_deref() == Some(name))
        .expect("the DestinationRule exists");
    let mut edited = (**dr).clone();
    f(&mut edited);
    *dr = Arc::new(edited);
}

/// The sidecar of the first Pod of service `svc-<i>`.
fn sidecar_of(inputs: &BuildInputs, i: usize) -> Proxy {
    let pod = inputs
        .pods
        .iter()
        .find(|p| p.name == format!("svc-{i}-0"))
        .expect("the pod exists");
    Proxy {
        namespace: pod.namespace.clone(),
        labels: pod.labels.clone(),
        ips: pod.ips.iter().filter_map(|ip| ip.parse().ok()).collect(),
        pod_name: Some(pod.name.clone()),
        ..Proxy::with_defaults(format!(
            "sidecar~{}~{}.{}~{}.svc.cluster.local",
            pod.ips[0], pod.name, pod.namespace, pod.namespace
        ))
    }
}

type View = BTreeMap<XdsType, ResourceMap>;

fn view(snapshot: &GeneratedSnapshot, proxy: &Proxy) -> View {
    XdsType::ALL
        .iter()
        .map(|t| (*t, snapshot.all(proxy, *t)))
        .collect()
}

/// Resources of `after` that are new or changed against `before`.
fn changed<'a>(before: &ResourceMap, after: &'a ResourceMap) -> Vec<&'a Arc<Resource>> {
    after
        .iter()
        .filter(|(name, r)| before.get(*name).map(|b| &b.version) != Some(&r.version))
        .map(|(_, r)| r)
        .collect()
}

/// What one change sends per type, in bytes, for both protocols.
#[derive(Debug, Default, Clone, Copy)]
struct Cost {
    sotw: [usize; 4],
    delta: [usize; 4],
}

impl Cost {
    fn sotw_total(&self) -> usize {
        self.sotw.iter().sum()
    }
    fn delta_total(&self) -> usize {
        self.delta.iter().sum()
    }
}

const ORDER: [XdsType; 4] = [
    XdsType::Cluster,
    XdsType::Endpoint,
    XdsType::Listener,
    XdsType::Route,
];

fn control_plane() -> Option<ControlPlane> {
    Some(ControlPlane {
        identifier: "pilotfish-xds-0".into(),
    })
}

fn sotw_response(kind: XdsType, resources: &[&Arc<Resource>]) -> usize {
    DiscoveryResponse {
        version_info: "0".repeat(32),
        resources: resources
            .iter()
            .map(|r| Any {
                type_url: r.body.type_url.clone(),
                value: r.body.value.clone(),
            })
            .collect(),
        type_url: kind.type_url().to_string(),
        nonce: "0".repeat(16),
        control_plane: control_plane(),
        ..Default::default()
    }
    .encoded_len()
}

fn delta_response(kind: XdsType, resources: &[&Arc<Resource>], removed: Vec<String>) -> usize {
    DeltaDiscoveryResponse {
        resources: resources
            .iter()
            .map(|r| WireResource {
                name: r.name.clone(),
                version: r.version.clone(),
                resource: Some(Any {
                    type_url: r.body.type_url.clone(),
                    value: r.body.value.clone(),
                }),
                ..Default::default()
            })
            .collect(),
        type_url: kind.type_url().to_string(),
        removed_resources: removed,
        nonce: "0".repeat(16),
        control_plane: control_plane(),
        ..Default::default()
    }
    .encoded_len()
}

/// The bytes a stream holding `before` is sent to reach `after`.
fn cost(before: &View, after: &View) -> Cost {
    let mut out = Cost::default();
    let changed_clusters: Vec<String> =
        changed(&before[&XdsType::Cluster], &after[&XdsType::Cluster])
            .iter()
            .map(|r| r.name.clone())
            .collect();
    for (i, kind) in ORDER.iter().enumerate() {
        let (b, a) = (&before[kind], &after[kind]);
        let mut sent = changed(b, a);
        if *kind == XdsType::Endpoint {
            // Warming: a new or changed cluster gets its assignment again, even unchanged.
            for name in &changed_clusters {
                if let Some(r) = a.get(name)
                    && !sent.iter().any(|s| s.name == *name)
                {
                    sent.push(r);
                }
            }
        }
        let removed: Vec<String> = b.keys().filter(|n| !a.contains_key(*n)).cloned().collect();
        out.sotw[i] = match kind {
            XdsType::Cluster | XdsType::Listener if !sent.is_empty() || !removed.is_empty() => {
                sotw_response(*kind, &a.values().collect::<Vec<_>>())
            }
            XdsType::Cluster | XdsType::Listener => 0,
            _ if sent.is_empty() => 0,
            _ => sotw_response(*kind, &sent),
        };
        out.delta[i] = if sent.is_empty() && removed.is_empty() {
            0
        } else {
            delta_response(*kind, &sent, removed)
        };
    }
    out
}

/// The bytes of a whole view (a stream's initial configuration), SotW.
fn initial(view: &View) -> [usize; 4] {
    let mut out = [0; 4];
    for (i, kind) in ORDER.iter().enumerate() {
        out[i] = sotw_response(*kind, &view[kind].values().collect::<Vec<_>>());
    }
    out
}

fn kb(bytes: usize) -> String {
    format!("{:.1}", bytes as f64 / 1024.0)
}

fn mb_total(bytes: usize) -> String {
    format!("{:.2}", bytes as f64 * SIDECARS as f64 / 1_000_000.0)
}

/// One measured change.
struct Measured {
    change: &'static str,
    /// Per observing sidecar (its service), the cost.
    costs: Vec<(usize, Cost)>,
}

impl Measured {
    fn worst(&self) -> Cost {
        let mut w = Cost::default();
        for (_, c) in &self.costs {
            for i in 0..4 {
                w.sotw[i] = w.sotw[i].max(c.sotw[i]);
                w.delta[i] = w.delta[i].max(c.delta[i]);
            }
        }
        w
    }
}

/// Sidecars that observe each change: one in the namespace of the edited service (`ns-0`,
/// where its short name is a domain too) and one in another namespace.
const OBSERVERS: [usize; 2] = [20, 21];

#[test]
fn push_bytes_per_change_stay_within_the_issue_budget() {
    let base_inputs = mesh(shape(1_000));
    let base = GeneratedSnapshot::new(built(&base_inputs), 1, ChangeKind::Full);
    let observers: Vec<Proxy> = OBSERVERS
        .iter()
        .map(|i| sidecar_of(&base_inputs, *i))
        .collect();
    let base_views: Vec<View> = observers.iter().map(|p| view(&base, p)).collect();

    // (a) svc-0's VirtualService: the split goes from 80/20 to 70/30.
    let mut vs_edit = base_inputs.clone();
    edit_vs(&mut vs_edit, "svc-0", |vs| {
        let split = &mut vs.spec.http[1].route;
        split[0].weight = Some(70);
        split[1].weight = Some(30);
    });
    // (b) svc-0's DestinationRule gains a subset.
    let mut dr_add = base_inputs.clone();
    edit_dr(&mut dr_add, "svc-0", |dr| {
        dr.spec.subsets.push(Subset {
            name: "v3".into(),
            labels: [("version".to_string(), "v3".to_string())].into(),
            traffic_policy: None,
        });
    });
    // (b') one of svc-0's subsets gets its own load-balancing policy.
    let mut dr_policy = base_inputs.clone();
    edit_dr(&mut dr_policy, "svc-0", |dr| {
        dr.spec.subsets[1].traffic_policy = Some(
            serde_json::from_value(serde_json::json!({"loadBalancer": {"simple": "ROUND_ROBIN"}}))
                .expect("a traffic policy"),
        );
    });
    // (c) one Service added (with its Pods and EndpointSlice, no routing of its own).
    let mut added = mesh(shape(1_001));
    added
        .virtual_services
        .retain(|v| !is!(v.metadata, "svc-1000", "ns-0"));
    added
        .destination_rules
        .retain(|d| !is!(d.metadata, "svc-1000", "ns-0"));
    // (d) one Service removed.
    let removed = without_service(base_inputs.clone(), "svc-999", "ns-19");

    let changes: Vec<(&'static str, BuildInputs)> = vec![
        ("(a) one VirtualService edited", vs_edit),
        ("(b) one DestinationRule subset added", dr_add),
        ("(b') one subset's policy changed", dr_policy),
        ("(c) one Service added", added),
        ("(d) one Service removed", removed),
    ];
    let mut measured = Vec::new();
    for (version, (change, inputs)) in (2..).zip(changes) {
        let snapshot = GeneratedSnapshot::new(built(&inputs), version, ChangeKind::Full);
        let costs = observers
            .iter()
            .zip(&base_views)
            .zip(OBSERVERS)
            .map(|((p, before), i)| (i, cost(before, &view(&snapshot, p))))
            .collect();
        measured.push(Measured { change, costs });
    }

    let init = initial(&base_views[0]);
    println!(
        "\ninitial configuration of one sidecar (SotW, KB): CDS {} EDS {} LDS {} RDS {} — total {}",
        kb(init[0]),
        kb(init[1]),
        kb(init[2]),
        kb(init[3]),
        kb(init.iter().sum())
    );
    println!(
        "\n| change | SotW KB per sidecar (CDS/EDS/LDS/RDS) | SotW MB for {SIDECARS} | delta KB per sidecar (CDS/EDS/LDS/RDS) | delta MB for {SIDECARS} |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for m in &measured {
        let w = m.worst();
        println!(
            "| {} | {} ({}) | {} | {} ({}) | {} |",
            m.change,
            kb(w.sotw_total()),
            w.sotw.map(kb).join("/"),
            mb_total(w.sotw_total()),
            kb(w.delta_total()),
            w.delta.map(kb).join("/"),
            mb_total(w.delta_total()),
        );
    }

    let by_change = |prefix: &str| {
        measured
            .iter()
            .find(|m| m.change.starts_with(prefix))
            .expect("measured")
            .worst()
    };
    let vs = by_change("(a)");
    assert!(
        vs.delta_total() > 0 && vs.sotw_total() > 0,
        "the edit reaches the sidecars"
    );
    assert!(
        vs.sotw_total() <= 2_500 && vs.delta_total() <= 2_500,
        "one VirtualService edit must cost at most 2.5 KB per sidecar (issue budget: 5 MB for 2,000): {vs:?}"
    );
    for prefix in ["(c)", "(d)"] {
        let c = by_change(prefix);
        assert!(c.delta_total() > 0, "{prefix} reaches the sidecars");
        assert!(
            c.delta_total() <= 5_000,
            "{prefix}: adding or removing one Service must cost a delta stream at most 5 KB (issue budget: 10 MB for 2,000): {c:?}"
        );
    }
    for prefix in ["(b)", "(b')"] {
        let c = by_change(prefix);
        assert!(c.delta_total() > 0, "{prefix} reaches the sidecars");
        assert!(
            c.delta_total() <= 5_000,
            "{prefix}: a DestinationRule subset edit must cost a delta stream at most 5 KB: {c:?}"
        );
    }
}

/// The measurement is only worth something if it sees the edit: the VirtualService edit
/// changes exactly the edited service's routing, and it routes 70/30 afterwards.
#[test]
fn push_bytes_sees_the_edited_route() {
    let base_inputs = mesh(MeshShape {
        services: 40,
        ..shape(40)
    });
    let mut edited = base_inputs.clone();
    edit_vs(&mut edited, "svc-0", |vs| {
        let split = &mut vs.spec.http[1].route;
        split[0].weight = Some(70);
        split[1].weight = Some(30);
    });
    let proxy = sidecar_of(&base_inputs, 20);
    let before = view(
        &GeneratedSnapshot::new(built(&base_inputs), 1, ChangeKind::Full),
        &proxy,
    );
    let after = view(
        &GeneratedSnapshot::new(built(&edited), 2, ChangeKind::Full),
        &proxy,
    );
    let routes = changed(&before[&XdsType::Route], &after[&XdsType::Route]);
    assert_eq!(routes.len(), 1, "one route configuration changes");
    let rc = RouteConfiguration::decode(routes[0].body.value.as_slice()).expect("decodes");
    let text = format!("{rc:?}");
    assert!(
        text.contains("svc-0.ns-0.svc.cluster.local") && text.contains("value: 70"),
        "{text}"
    );
    for kind in [XdsType::Cluster, XdsType::Listener, XdsType::Endpoint] {
        assert!(
            changed(&before[&kind], &after[&kind]).is_empty(),
            "{kind:?} is untouched by a VirtualService edit"
        );
    }
}
