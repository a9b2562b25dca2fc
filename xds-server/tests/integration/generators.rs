//! Behaviour of the generators through [`GeneratedSnapshot`], beyond the golden files:
//! parts shared between proxies, proxyless wildcard CDS and lookups by name, unresolved
//! destinations, determinism across "replicas", config_dump, change kinds and the
//! snapshot-wide consistency check.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{
    RouteConfiguration, route::Action, route_action::ClusterSpecifier,
};
use pilotfish_mesh::document::{parse_text, to_inputs};
use pilotfish_mesh::model::{Proxy, ProxyGenerator};
use pilotfish_mesh::push_context::{BuildInputs, PushContext, build};
use pilotfish_xds::ads::{
    CLUSTER_TYPE, ChangeKind, LISTENER_TYPE, ROUTE_TYPE, XdsSnapshot, XdsType,
};
use pilotfish_xds::generate::{GeneratedSnapshot, change_kind, check_snapshot, config_dump};
use prost::Message;

use super::golden::case_snapshot;

fn push(yaml: &str) -> PushContext {
    let parsed = parse_text(Path::new("test.yaml"), yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let inputs = to_inputs(
        &parsed.objects,
        BuildInputs {
            cluster_domain: "cluster.local".into(),
            ..Default::default()
        },
    );
    let built = build(&inputs, None);
    assert!(built.errors().next().is_none(), "{:?}", built.findings);
    built.context
}

fn sidecar(ns: &str, labels: &[(&str, &str)]) -> Proxy {
    Proxy {
        namespace: ns.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Proxy::with_defaults(format!("sidecar~10.0.0.1~p.{ns}~{ns}.svc.cluster.local"))
    }
}

fn proxyless(ns: &str) -> Proxy {
    Proxy {
        generator: ProxyGenerator::Grpc,
        ..sidecar(ns, &[])
    }
}

fn names(
    snapshot: &GeneratedSnapshot,
    proxy: &Proxy,
    type_url: &str,
    wanted: Option<&[&str]>,
) -> Vec<String> {
    let set: Option<BTreeSet<String>> = wanted.map(|w| w.iter().map(|s| s.to_string()).collect());
    snapshot
        .resources(proxy, type_url, set.as_ref())
        .iter()
        .map(|r| r.name.clone())
        .collect()
}

const SHOP: &str = "\
apiVersion: v1
kind: Service
metadata: {name: cart, namespace: shop}
spec:
  clusterIP: 10.96.0.1
  selector: {app: cart}
  ports: [{name: http, port: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: pay, namespace: shop}
spec:
  clusterIP: 10.96.0.2
  selector: {app: pay}
  ports: [{name: grpc, port: 9090}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: cart, namespace: shop}
spec:
  hosts: [cart]
  http:
  - route:
    - destination: {host: cart}
      weight: 90
    - destination: {host: nowhere.example.com, port: {number: 80}}
      weight: 10
";

#[test]
fn a_thousand_identical_sidecars_cost_one_generation() {
    let snapshot = GeneratedSnapshot::new(Arc::new(push(SHOP)), 7, ChangeKind::Full);
    let first = sidecar("shop", &[("app", "cart")]);
    for kind in XdsType::ALL {
        snapshot.resources(&first, kind.type_url(), None);
    }
    let after_first = snapshot.generations();
    assert!(after_first > 0);
    for i in 0..1000 {
        let twin = Proxy {
            id: format!(
                "sidecar~10.0.{}.{}~cart-{i}.shop~shop.svc.cluster.local",
                i / 250,
                i % 250
            ),
            ..first.clone()
        };
        for kind in XdsType::ALL {
            snapshot.resources(&twin, kind.type_url(), None);
        }
    }
    assert_eq!(
        snapshot.generations(),
        after_first,
        "identical proxies must share every part"
    );

    // A sidecar of another workload in the same namespace shares the outbound parts and
    // only generates its own inbound ones.
    let other = sidecar("shop", &[("app", "pay")]);
    snapshot.resources(&other, CLUSTER_TYPE, None);
    assert_eq!(
        snapshot.generations(),
        after_first + 1,
        "only inbound clusters are new"
    );
    let inbound: Vec<String> = names(&snapshot, &other, CLUSTER_TYPE, None)
        .into_iter()
        .filter(|n| n.starts_with("inbound|"))
        .collect();
    assert_eq!(inbound, ["inbound|9090||"]);
}

#[test]
fn proxyless_wildcard_cds_is_outbound_eds_clusters_only() {
    let snapshot = GeneratedSnapshot::new(Arc::new(push(SHOP)), 1, ChangeKind::Full);
    let client = proxyless("shop");
    let all = names(&snapshot, &client, CLUSTER_TYPE, None);
    assert_eq!(
        all,
        [
            "outbound|8080||cart.shop.svc.cluster.local",
            "outbound|9090||pay.shop.svc.cluster.local"
        ]
    );
    let some = names(
        &snapshot,
        &client,
        CLUSTER_TYPE,
        Some(&[
            "outbound|9090||pay.shop.svc.cluster.local",
            "outbound|1||unknown",
        ]),
    );
    assert_eq!(some, ["outbound|9090||pay.shop.svc.cluster.local"]);
    let listeners = names(
        &snapshot,
        &client,
        LISTENER_TYPE,
        Some(&["pay.shop.svc.cluster.local:9090"]),
    );
    assert_eq!(listeners, ["pay.shop.svc.cluster.local:9090"]);
    // A sidecar sees the same outbound clusters plus its own infrastructure clusters.
    let sidecar_all = names(&snapshot, &sidecar("shop", &[]), CLUSTER_TYPE, None);
    for infra in [
        "PassthroughCluster",
        "BlackHoleCluster",
        "InboundPassthroughCluster",
    ] {
        assert!(sidecar_all.iter().any(|n| n == infra), "{infra} missing");
    }
}

fn route_config(snapshot: &GeneratedSnapshot, proxy: &Proxy, name: &str) -> RouteConfiguration {
    let set: BTreeSet<String> = [name.to_string()].into();
    let found = snapshot.resources(proxy, ROUTE_TYPE, Some(&set));
    assert_eq!(found.len(), 1, "route config {name}");
    RouteConfiguration::decode(found[0].body.value.as_slice()).expect("decodes")
}

/// The weighted clusters of the first route of `cart`'s virtual host, as a sidecar in
/// `shop` gets them in cart's own route configuration (cart has a virtual IP).
fn sidecar_cart_split(snapshot: &GeneratedSnapshot) -> Vec<(String, u32)> {
    let rc = route_config(
        snapshot,
        &sidecar("shop", &[]),
        "cart.shop.svc.cluster.local:8080",
    );
    let vh = rc
        .virtual_hosts
        .iter()
        .find(|v| v.name.starts_with("cart."))
        .expect("cart vhost");
    let Some(Action::Route(action)) = &vh.routes[0].action else {
        panic!("route action expected")
    };
    let Some(ClusterSpecifier::WeightedClusters(w)) = &action.cluster_specifier else {
        panic!("weighted clusters expected")
    };
    w.clusters
        .iter()
        .map(|c| (c.name.clone(), c.weight.as_ref().map_or(0, |w| w.value)))
        .collect()
}

#[test]
fn destinations_without_a_cluster_never_reach_the_output() {
    let snapshot = GeneratedSnapshot::new(Arc::new(push(SHOP)), 1, ChangeKind::Full);
    // Sidecars keep the split and send the unknown share to BlackHoleCluster (in cart's
    // own route configuration: it has a virtual IP).
    assert_eq!(
        sidecar_cart_split(&snapshot),
        [
            ("outbound|8080||cart.shop.svc.cluster.local".to_string(), 90),
            ("BlackHoleCluster".to_string(), 10)
        ]
    );
    // Proxyless clients have no BlackHoleCluster: the unknown destination is dropped.
    let rc = route_config(
        &snapshot,
        &proxyless("shop"),
        "cart.shop.svc.cluster.local:8080",
    );
    let Some(Action::Route(action)) = &rc.virtual_hosts[0].routes[0].action else {
        panic!("route action expected")
    };
    assert_eq!(
        action.cluster_specifier,
        Some(ClusterSpecifier::Cluster(
            "outbound|8080||cart.shop.svc.cluster.local".into()
        ))
    );
}

/// Log lines written on this thread while `f` runs.
fn logs_of(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = lines.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn findings_are_reported_once_per_generated_part() {
    // Generators return what they noticed; the snapshot logs it when it generates a part.
    // Proxies of one scope share the part, so the second and third log nothing.
    let snapshot = GeneratedSnapshot::new(Arc::new(push(SHOP)), 1, ChangeKind::Full);
    let logs = logs_of(|| {
        for pod in ["a", "b", "c"] {
            let client = Proxy {
                generator: ProxyGenerator::Grpc,
                ..sidecar("shop", &[])
            };
            let client = Proxy {
                id: format!("{}-{pod}", client.id),
                ..client
            };
            assert!(!names(&snapshot, &client, ROUTE_TYPE, None).is_empty());
        }
    });
    let unresolved: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("route destination has no cluster for this proxy"))
        .collect();
    assert_eq!(unresolved.len(), 1, "{logs}");
    assert!(
        unresolved[0].contains("cluster=outbound|80||nowhere.example.com"),
        "{logs}"
    );

    // The next snapshots regenerate the part (a new push), meet the same finding and
    // count it, but do not log it again within the window; an unrelated snapshot does.
    let snapshot = Arc::new(snapshot);
    // A Service added elsewhere each time: every part is generated again (none reused).
    let grown = |name: &str, ip: &str| {
        format!(
            "{SHOP}---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: other}}\nspec:\n  clusterIP: {ip}\n  ports: [{{name: http, port: 80}}]\n"
        )
    };
    let next = Arc::new(GeneratedSnapshot::following(
        &snapshot,
        Arc::new(push(&grown("extra", "10.96.0.9"))),
        2,
    ));
    let unrelated = GeneratedSnapshot::new(Arc::new(push(SHOP)), 1, ChangeKind::Full);
    let client = Proxy {
        generator: ProxyGenerator::Grpc,
        ..sidecar("shop", &[])
    };
    let logs = logs_of(|| {
        assert!(!names(&next, &client, ROUTE_TYPE, None).is_empty());
        let third =
            GeneratedSnapshot::following(&next, Arc::new(push(&grown("more", "10.96.0.10"))), 3);
        assert!(!names(&third, &client, ROUTE_TYPE, None).is_empty());
        assert!(next.generations() > 0 && third.generations() > 0);
    });
    assert!(
        !logs.contains("route destination has no cluster for this proxy"),
        "{logs}"
    );
    let logs = logs_of(|| assert!(!names(&unrelated, &client, ROUTE_TYPE, None).is_empty()));
    assert!(
        logs.contains("route destination has no cluster for this proxy"),
        "{logs}"
    );
}

#[test]
fn two_replicas_generate_identical_versions() {
    for case in ["bookinfo", "cors-headers", "consistent-hash", "tls-modes"] {
        let source = (case == "bookinfo").then_some("examples/bookinfo");
        let node = if case == "bookinfo" {
            "productpage-v1"
        } else {
            "client"
        };
        let (a, sidecar_a, proxyless_a) = case_snapshot(case, source, node);
        let (b, _, _) = case_snapshot(case, source, node);
        for proxy in [&sidecar_a, &proxyless_a] {
            for kind in XdsType::ALL {
                let va: Vec<(String, String)> = a
                    .all(proxy, kind)
                    .values()
                    .map(|r| (r.name.clone(), r.version.clone()))
                    .collect();
                let vb: Vec<(String, String)> = b
                    .all(proxy, kind)
                    .values()
                    .map(|r| (r.name.clone(), r.version.clone()))
                    .collect();
                assert_eq!(
                    va, vb,
                    "{case} {kind}: versions differ between two generations"
                );
            }
        }
    }
}

#[test]
fn config_dump_shows_what_a_proxy_receives() {
    let (snapshot, sidecar, _) =
        case_snapshot("bookinfo", Some("examples/bookinfo"), "productpage-v1");
    let dump = config_dump(&snapshot, &sidecar).expect("config dump");
    let configs = dump["configs"].as_array().expect("configs");
    let types: Vec<&str> = configs
        .iter()
        .map(|c| c["@type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        types,
        [
            "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
            "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
            "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
            "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
        ]
    );
    let clusters: Vec<&str> = configs[0]["dynamic_active_clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .map(|c| c["cluster"]["name"].as_str().unwrap_or(""))
        .collect();
    assert!(
        clusters.contains(&"outbound|9080|v2|reviews.default.svc.cluster.local"),
        "{clusters:?}"
    );
    assert!(
        configs[0]["dynamic_active_clusters"][0]["version_info"]
            .as_str()
            .is_some_and(|v| v.len() == 32)
    );
    let listeners = configs[1]["dynamic_listeners"]
        .as_array()
        .expect("listeners");
    assert!(listeners.iter().any(|l| l["name"] == "virtualInbound"));
}

#[test]
fn consistency_check_of_a_whole_snapshot_is_clean() {
    for (case, source, node) in [
        ("bookinfo", Some("examples/bookinfo"), "productpage-v1"),
        ("tcp", None, "client"),
        ("service-entries", None, "client"),
        ("inbound", None, "client"),
    ] {
        let (snapshot, _, _) = case_snapshot(case, source, node);
        assert_eq!(check_snapshot(&snapshot), Vec::new(), "{case}");
    }
}

#[test]
fn change_kinds_know_what_endpoints_shape() {
    let base = |ip: &str| {
        format!(
            "{SHOP}---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: cart-1, namespace: shop, labels: {{kubernetes.io/service-name: cart}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints: [{{addresses: [{ip}]}}]
"
        )
    };
    let old = push(&base("10.1.0.1"));
    let moved = push(&base("10.1.0.2"));
    assert_eq!(change_kind(&old, &moved), ChangeKind::EndpointsOnly);
    let reconfigured = push(&base("10.1.0.1").replace("weight: 90", "weight: 80"));
    assert_eq!(change_kind(&old, &reconfigured), ChangeKind::Full);

    // A named target port decides a sidecar's inbound ports: its endpoints are not EDS-only.
    let named = |ip: &str| {
        base(ip).replace("ports: [{name: http, port: 8080}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: pay", "ports: [{name: http, port: 8080, targetPort: web}]\n---\napiVersion: v1\nkind: Service\nmetadata: {name: pay")
    };
    assert_eq!(
        change_kind(&push(&named("10.1.0.1")), &push(&named("10.1.0.2"))),
        ChangeKind::Full
    );

    let snapshot = GeneratedSnapshot::new(Arc::new(moved), 8, ChangeKind::EndpointsOnly);
    assert_eq!(snapshot.change_since(7), ChangeKind::EndpointsOnly);
    assert_eq!(
        snapshot.change_since(6),
        ChangeKind::Full,
        "a stream that missed a snapshot recomputes all"
    );
}

/// A subset no DestinationRule defines does not reject its VirtualService (Istio judges
/// each object alone): the route is served, and only the share sent to the missing
/// subset fails — its cluster does not exist, so it goes to BlackHoleCluster (503), as
/// Istio's missing cluster does.
#[test]
fn a_route_to_an_undefined_subset_answers_503_for_its_share_only() {
    let yaml = format!(
        "{}---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: cart, namespace: shop}}
spec:
  host: cart
  subsets: [{{name: v1, labels: {{version: v1}}}}]
",
        SHOP.replace(
            "    - destination: {host: cart}\n      weight: 90\n    - destination: {host: nowhere.example.com, port: {number: 80}}\n      weight: 10\n",
            "    - destination: {host: cart, subset: v1}\n      weight: 80\n    - destination: {host: cart, subset: v9}\n      weight: 20\n",
        )
    );
    let snapshot = GeneratedSnapshot::new(Arc::new(push(&yaml)), 1, ChangeKind::Full);
    assert_eq!(
        sidecar_cart_split(&snapshot),
        [
            (
                "outbound|8080|v1|cart.shop.svc.cluster.local".to_string(),
                80
            ),
            ("BlackHoleCluster".to_string(), 20)
        ]
    );
}

#[test]
fn gateways_get_no_sidecar_output() {
    use pilotfish_mesh::model::ProxyType;
    let snapshot = GeneratedSnapshot::new(Arc::new(push(SHOP)), 1, ChangeKind::Full);
    let gateway = Proxy {
        proxy_type: ProxyType::Router,
        ..sidecar("shop", &[("app", "cart")])
    };
    for kind in XdsType::ALL {
        assert!(
            snapshot
                .resources(&gateway, kind.type_url(), None)
                .is_empty(),
            "{kind:?}"
        );
        let named: BTreeSet<String> =
            ["outbound|8080||cart.shop.svc.cluster.local".to_string()].into();
        assert!(
            snapshot
                .resources(&gateway, kind.type_url(), Some(&named))
                .is_empty()
        );
    }
    assert_eq!(
        snapshot.generations(),
        0,
        "nothing is generated for a gateway"
    );
    assert!(
        !snapshot
            .resources(&sidecar("shop", &[]), LISTENER_TYPE, None)
            .is_empty()
    );
}

/// Endpoints' service accounts are the identities ISTIO_MUTUAL verifies (CDS): a change of
/// them is not EDS-only.
#[test]
fn a_new_endpoint_identity_is_a_full_change() {
    let mesh = |ip: &str, pod: &str| {
        format!(
            "{SHOP}---
apiVersion: v1
kind: Pod
metadata: {{name: cart-1, namespace: shop, labels: {{app: cart}}}}
spec: {{serviceAccountName: cart}}
status: {{podIPs: [{{ip: 10.1.0.1}}], conditions: [{{type: Ready, status: 'True'}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: cart-2, namespace: shop, labels: {{app: cart}}}}
spec: {{serviceAccountName: cart}}
status: {{podIPs: [{{ip: 10.1.0.2}}], conditions: [{{type: Ready, status: 'True'}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: cart-3, namespace: shop, labels: {{app: cart}}}}
spec: {{serviceAccountName: cart-canary}}
status: {{podIPs: [{{ip: 10.1.0.3}}], conditions: [{{type: Ready, status: 'True'}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: cart-1, namespace: shop, labels: {{kubernetes.io/service-name: cart}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints: [{{addresses: [{ip}], targetRef: {{kind: Pod, namespace: shop, name: {pod}}}}}]
"
        )
    };
    let old = push(&mesh("10.1.0.1", "cart-1"));
    assert_eq!(
        change_kind(&old, &push(&mesh("10.1.0.2", "cart-2"))),
        ChangeKind::EndpointsOnly,
        "same identity"
    );
    assert_eq!(
        change_kind(&old, &push(&mesh("10.1.0.3", "cart-3"))),
        ChangeKind::Full,
        "a new service account changes the SANs CDS verifies"
    );
}

/// A headless service's cluster gets auto mTLS only while every endpoint runs a sidecar:
/// an endpoint change that flips that is a full change; one that keeps it is EDS-only.
#[test]
fn a_headless_service_losing_its_all_sidecar_endpoints_is_a_full_change() {
    let mesh = |pods: &[(&str, &str, bool)]| {
        let mut out = String::from(
            "apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec: {clusterIP: None, selector: {app: db}, ports: [{name: tcp, port: 5432}]}
",
        );
        let mut endpoints = Vec::new();
        for (name, ip, meshed) in pods {
            let label = if *meshed {
                ", security.istio.io/tlsMode: istio"
            } else {
                ""
            };
            out.push_str(&format!(
                "---
apiVersion: v1
kind: Pod
metadata: {{name: {name}, namespace: shop, labels: {{app: db{label}}}}}
spec: {{serviceAccountName: db}}
status: {{podIPs: [{{ip: {ip}}}], conditions: [{{type: Ready, status: 'True'}}]}}
"
            ));
            endpoints.push(format!(
                "{{addresses: [{ip}], targetRef: {{kind: Pod, namespace: shop, name: {name}}}}}"
            ));
        }
        out.push_str(&format!(
            "---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: db-1, namespace: shop, labels: {{kubernetes.io/service-name: db}}}}
addressType: IPv4
ports: [{{name: tcp, port: 5432}}]
endpoints: [{}]
",
            endpoints.join(", ")
        ));
        push(&out)
    };
    let meshed = mesh(&[("db-0", "10.1.0.1", true)]);
    assert_eq!(
        change_kind(
            &meshed,
            &mesh(&[("db-0", "10.1.0.1", true), ("db-1", "10.1.0.2", true)])
        ),
        ChangeKind::EndpointsOnly,
        "still every endpoint runs a sidecar"
    );
    assert_eq!(
        change_kind(
            &meshed,
            &mesh(&[("db-0", "10.1.0.1", true), ("db-1", "10.1.0.2", false)])
        ),
        ChangeKind::Full,
        "an endpoint without a sidecar turns the cluster's mTLS off"
    );
}

/// A PeerAuthentication changes a sidecar's `virtualInbound` and nothing else: STRICT for
/// the selected workload leaves no chain a plaintext connection can match, its neighbour
/// stays PERMISSIVE, and proxyless clients and outbound listeners are byte-identical.
#[test]
fn peer_authentication_shapes_only_the_selected_workloads_inbound_listener() {
    const STRICT_CART: &str = "
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: cart-strict, namespace: shop}
spec:
  selector: {matchLabels: {app: cart}}
  mtls: {mode: STRICT}
";
    let plain = GeneratedSnapshot::new(Arc::new(push(SHOP)), 1, ChangeKind::Full);
    let strict = GeneratedSnapshot::new(
        Arc::new(push(&format!("{SHOP}{STRICT_CART}"))),
        2,
        ChangeKind::Full,
    );
    // (transport protocol, terminates TLS) of every chain but the 15006 blackhole.
    let shape = |l: &Listener| -> Vec<(String, bool)> {
        l.filter_chains
            .iter()
            .filter(|c| c.name != "virtualInbound-blackhole")
            .map(|c| {
                (
                    c.filter_chain_match
                        .as_ref()
                        .map(|m| m.transport_protocol.clone())
                        .unwrap_or_default(),
                    c.transport_socket.is_some(),
                )
            })
            .collect()
    };
    let cart = sidecar("shop", &[("app", "cart")]);
    let pay = sidecar("shop", &[("app", "pay")]);

    let cart_strict = inbound(&strict, &cart);
    assert!(cart_strict.default_filter_chain.is_none());
    let chains = shape(&cart_strict);
    assert!(!chains.is_empty());
    assert!(
        chains.iter().all(|(t, tls)| t == "tls" && *tls),
        "STRICT: every chain terminates mTLS: {chains:?}"
    );
    // Without a policy (and for the workload the selector misses): PERMISSIVE.
    for l in [inbound(&plain, &cart), inbound(&strict, &pay)] {
        let chains = shape(&l);
        assert!(chains.contains(&("raw_buffer".into(), false)), "{chains:?}");
        assert!(chains.contains(&("tls".into(), true)), "{chains:?}");
    }
    assert_eq!(inbound(&plain, &pay), inbound(&strict, &pay));
    let outbound = |s: &GeneratedSnapshot| -> Vec<Listener> {
        listeners(s, &cart)
            .into_iter()
            .filter(|l| l.name != "virtualInbound")
            .collect()
    };
    assert_eq!(outbound(&plain), outbound(&strict));
    let grpc = proxyless("shop");
    assert_eq!(listeners(&plain, &grpc), listeners(&strict, &grpc));
}

/// An AuthorizationPolicy changes only the selected workload's `virtualInbound`: every
/// chain of it (but the blackhole) gets an RBAC filter — HTTP before the router, network
/// before `tcp_proxy` — its neighbour's listener, every outbound listener and the
/// proxyless client's listeners are byte-identical to those without the policy.
#[test]
fn authorization_policy_shapes_only_the_selected_workloads_inbound_listener() {
    use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    const DENY_CART: &str = "
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: cart-deny, namespace: shop}
spec:
  selector: {matchLabels: {app: cart}}
  action: DENY
  rules: [{to: [{operation: {methods: [DELETE]}}]}]
";
    let plain = GeneratedSnapshot::new(Arc::new(push(SHOP)), 1, ChangeKind::Full);
    let denied = GeneratedSnapshot::new(
        Arc::new(push(&format!("{SHOP}{DENY_CART}"))),
        2,
        ChangeKind::Full,
    );
    // Per chain but the blackhole: its network filters and, for HTTP, its HTTP filters.
    let filters = |l: &Listener| -> Vec<(Vec<String>, Vec<String>)> {
        l.filter_chains
            .iter()
            .filter(|c| c.name != "virtualInbound-blackhole")
            .map(|c| {
                let network: Vec<String> = c.filters.iter().map(|f| f.name.clone()).collect();
                let http = c
                    .filters
                    .iter()
                    .filter_map(|f| match &f.config_type {
                        Some(filter::ConfigType::TypedConfig(a))
                            if a.type_url.ends_with("HttpConnectionManager") =>
                        {
                            HttpConnectionManager::decode(a.value.as_slice()).ok()
                        }
                        _ => None,
                    })
                    .flat_map(|h| h.http_filters.into_iter().map(|f| f.name))
                    .collect();
                (network, http)
            })
            .collect()
    };
    let cart = sidecar("shop", &[("app", "cart")]);
    let pay = sidecar("shop", &[("app", "pay")]);
    let chains = filters(&inbound(&denied, &cart));
    assert!(!chains.is_empty());
    for (network, http) in &chains {
        if http.is_empty() {
            assert_eq!(
                network,
                &[
                    "envoy.filters.network.rbac",
                    "envoy.filters.network.tcp_proxy"
                ],
                "{chains:?}"
            );
        } else {
            assert_eq!(
                http,
                &["envoy.filters.http.rbac", "envoy.filters.http.router"],
                "{chains:?}"
            );
        }
    }
    assert!(
        chains.iter().any(|(_, http)| !http.is_empty()),
        "cart's HTTP port is there: {chains:?}"
    );
    assert!(
        filters(&inbound(&plain, &cart))
            .iter()
            .flat_map(|(n, h)| n.iter().chain(h))
            .all(|f| !f.contains("rbac"))
    );
    assert_eq!(inbound(&plain, &pay), inbound(&denied, &pay));
    let outbound = |s: &GeneratedSnapshot| -> Vec<Listener> {
        listeners(s, &cart)
            .into_iter()
            .filter(|l| l.name != "virtualInbound")
            .collect()
    };
    assert_eq!(outbound(&plain), outbound(&denied));
    let grpc = proxyless("shop");
    assert_eq!(listeners(&plain, &grpc), listeners(&denied, &grpc));
}

/// Every listener `snapshot` has for `proxy`, decoded.
fn listeners(snapshot: &GeneratedSnapshot, proxy: &Proxy) -> Vec<Listener> {
    snapshot
        .resources(proxy, LISTENER_TYPE, None)
        .iter()
        .map(|r| Listener::decode(r.body.value.as_slice()).expect("a listener"))
        .collect()
}

/// The proxy's `virtualInbound` listener.
fn inbound(snapshot: &GeneratedSnapshot, proxy: &Proxy) -> Listener {
    listeners(snapshot, proxy)
        .into_iter()
        .find(|l| l.name == "virtualInbound")
        .expect("virtualInbound")
}
