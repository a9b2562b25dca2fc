//! Standalone `pilotfish-xds` driven by gRPC's own xDS clients — Python grpcio (C-core)
//! and Node's `@grpc/grpc-js-xds`, a separate and in places stricter implementation —
//! through the same scenario: weighted subsets, a header route, fault injection and a live
//! edit of the VirtualService file, with real backend gRPC servers on 127.0.0.1 standing
//! in for reviews v1/v2/v3.

use std::path::Path;
use std::time::{Duration, Instant};

use pilotfish_testkit::grpc::{ClientRuntime, GrpcBackends, RpcTally, XdsClient, bootstrap};
use pilotfish_testkit::mesh::{
    reviews_destination_rule, reviews_target, reviews_virtual_service, reviews_workloads,
};
use pilotfish_testkit::process::{XdsServer, free_port};

/// Writes the reviews mesh into `dir` with the given split.
pub fn write_reviews_mesh(dir: &Path, ports: &[(&str, u16)], split: (u32, u32)) {
    std::fs::write(dir.join("workloads.yaml"), reviews_workloads(ports)).unwrap();
    std::fs::write(
        dir.join("destination-rule.yaml"),
        reviews_destination_rule(),
    )
    .unwrap();
    std::fs::write(
        dir.join("virtual-service.yaml"),
        reviews_virtual_service(split.0, split.1),
    )
    .unwrap();
}

/// Starts backends `reviews-v1..v3` on free ports.
pub fn reviews_backends() -> (GrpcBackends, Vec<(&'static str, u16)>) {
    let ports = vec![
        ("v1", free_port()),
        ("v2", free_port()),
        ("v3", free_port()),
    ];
    let named: Vec<(String, u16)> = ports
        .iter()
        .map(|(v, p)| (format!("reviews-{v}"), *p))
        .collect();
    let refs: Vec<(&str, u16)> = named.iter().map(|(n, p)| (n.as_str(), *p)).collect();
    (
        GrpcBackends::start(&refs).expect("start gRPC backends"),
        ports,
    )
}

/// A proxyless (Python) client in `default` talking to `xds`.
pub fn reviews_client(xds: std::net::SocketAddr, pod: &str) -> XdsClient {
    reviews_client_in(ClientRuntime::Python, xds, pod)
}

/// A proxyless client of the given implementation in `default` talking to `xds`.
pub fn reviews_client_in(
    runtime: ClientRuntime,
    xds: std::net::SocketAddr,
    pod: &str,
) -> XdsClient {
    let node = format!("sidecar~127.0.0.1~{pod}.default~default.svc.cluster.local");
    XdsClient::start_in(runtime, &bootstrap(&xds.to_string(), &node, "default"))
        .unwrap_or_else(|e| panic!("start the {runtime:?} gRPC xDS client: {e}"))
}

/// Asserts that `tally` splits between v1 and v2 as `expected` (percent of v1), within
/// ±5 points, with no failures.
pub fn assert_split(tally: &RpcTally, expected_v1: f64) {
    assert!(tally.errors.is_empty(), "RPCs failed: {tally:?}");
    let v1 = tally.percent("reviews-v1");
    let v2 = tally.percent("reviews-v2");
    assert!(
        (v1 - expected_v1).abs() <= 5.0,
        "v1 got {v1:.1}%, expected {expected_v1}% ±5: {tally:?}"
    );
    assert!(
        (v2 - (100.0 - expected_v1)).abs() <= 5.0,
        "v2 got {v2:.1}%: {tally:?}"
    );
    assert_eq!(
        tally.counts.get("reviews-v3"),
        None,
        "no split traffic goes to v3: {tally:?}"
    );
}

/// For batches too small to measure a split (the ±5% check needs 2,000 RPCs): every RPC
/// succeeded, only v1 and v2 answered, and v1 (80%) answered most of them.
pub fn assert_routed_80_20(tally: &RpcTally) {
    assert!(tally.errors.is_empty(), "RPCs failed: {tally:?}");
    assert!(
        tally
            .counts
            .keys()
            .all(|k| k == "reviews-v1" || k == "reviews-v2"),
        "{tally:?}"
    );
    let (v1, v2) = (
        tally.counts.get("reviews-v1"),
        tally.counts.get("reviews-v2"),
    );
    assert!(v1 > v2, "v1 must take most of an 80/20 split: {tally:?}");
}

/// Makes batches of RPCs until v1's share is within 5 points of `expected_v1`; returns
/// how long that took. Bounded by `max`.
pub fn wait_for_split(client: &mut XdsClient, expected_v1: f64, max: Duration) -> Duration {
    let start = Instant::now();
    while start.elapsed() < max {
        let t = client.rpcs(&reviews_target(), 100, &[]).unwrap();
        if t.errors.is_empty() && (t.percent("reviews-v1") - expected_v1).abs() <= 10.0 {
            return start.elapsed();
        }
    }
    panic!("the split did not reach {expected_v1}% v1 within {max:?}");
}

#[test]
fn grpc_xds_client_routes_through_standalone_mode() {
    routes_through_standalone_mode(ClientRuntime::Python);
}

/// The same scenario with Node's `@grpc/grpc-js-xds`, which parses and validates every
/// resource with its own code (not C-core's) — and must NACK nothing either.
#[test]
fn node_grpc_js_xds_client_routes_through_standalone_mode() {
    routes_through_standalone_mode(ClientRuntime::Node);
}

fn routes_through_standalone_mode(runtime: ClientRuntime) {
    let (_backends, ports) = reviews_backends();
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports, (80, 20));
    let server = XdsServer::standalone("xds-standalone", dir.path()).expect("start pilotfish-xds");
    let mut client = reviews_client_in(runtime, server.xds, "client-1");
    let target = reviews_target();

    // 80/20 between v1 and v2 (weighted subsets), measured over 2,000 RPCs.
    let tally = client.rpcs(&target, 2000, &[]).unwrap();
    assert_eq!(tally.total(), 2000);
    assert_split(&tally, 80.0);

    // A header match routes to v3.
    let jason = client.rpcs(&target, 50, &[("end-user", "jason")]).unwrap();
    assert_eq!(jason.counts.get("reviews-v3"), Some(&50), "{jason:?}");

    // A 100% fault abort surfaces the configured status code.
    let aborted = client.rpcs(&target, 20, &[("x-fault", "abort")]).unwrap();
    assert_eq!(
        aborted.errors.get("PERMISSION_DENIED"),
        Some(&20),
        "{aborted:?}"
    );
    assert!(aborted.counts.is_empty(), "{aborted:?}");

    // Editing the VirtualService file to 50/50 changes the split; the client keeps running.
    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        reviews_virtual_service(50, 50),
    )
    .unwrap();
    let took = wait_for_split(&mut client, 50.0, Duration::from_secs(30));
    eprintln!("file edit to new split observed by the client after {took:?}");
    let tally = client.rpcs(&target, 2000, &[]).unwrap();
    assert_split(&tally, 50.0);

    // A broken edit (a subset name Istio refuses) keeps the last good routing (and says
    // so on the admin page).
    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        reviews_virtual_service(50, 50).replace("subset: v3", "subset: v_3"),
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let jason = client.rpcs(&target, 20, &[("end-user", "jason")]).unwrap();
    assert_eq!(
        jason.counts.get("reviews-v3"),
        Some(&20),
        "last good version still routes: {jason:?}"
    );

    // The client never NACKed anything, and the replica answered with its name.
    assert_eq!(
        server.nacks().unwrap(),
        vec![],
        "the gRPC client NACKed a response"
    );
    let syncz = server.admin_json("/debug/syncz").unwrap();
    let rows = syncz.as_array().expect("syncz rows");
    assert!(!rows.is_empty());
    for row in rows {
        for (ty, state) in row["types"].as_object().unwrap() {
            assert_eq!(state["state"], "SYNCED", "{ty} not synced: {row}");
        }
    }
    let push_status = server.admin_json("/debug/push_status").unwrap();
    assert!(
        push_status["pushes"].as_array().unwrap().len() >= 2,
        "{push_status}"
    );
}

/// Sidecar scoping with gRPC's own xDS client: a proxyless client in a namespace whose
/// Sidecar does not import `reviews` gets no listener for it (the RPCs fail, nothing
/// reaches a backend), one in a namespace whose Sidecar imports `default/*` reaches it;
/// editing the first Sidecar to import `default/*` makes `reviews` reachable there too.
#[test]
fn a_sidecar_decides_what_a_proxyless_client_can_reach() {
    let (_backends, ports) = reviews_backends();
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports, (100, 0));
    let sidecars = |hidden_hosts: &str| {
        format!(
            "apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: hidden}}
spec:
  egress: [{{hosts: [{hidden_hosts}]}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: default, namespace: importer}}
spec:
  egress: [{{hosts: [\"./*\", \"default/*\"]}}]
"
        )
    };
    std::fs::write(dir.path().join("sidecars.yaml"), sidecars("\"./*\"")).unwrap();
    let server = XdsServer::standalone("xds-sidecar", dir.path()).expect("start pilotfish-xds");
    let client_in = |ns: &str| {
        let node = format!("sidecar~127.0.0.1~client.{ns}~{ns}.svc.cluster.local");
        XdsClient::start(&bootstrap(&server.xds.to_string(), &node, ns))
            .expect("start the gRPC xDS client")
    };
    let target = reviews_target();

    let mut importer = client_in("importer");
    let reached = importer.rpcs(&target, 20, &[]).unwrap();
    assert_eq!(
        reached.counts.get("reviews-v1"),
        Some(&20),
        "a Sidecar importing default/* reaches reviews: {reached:?}"
    );

    // gRPC reports the listener as not existing (UNAVAILABLE) once its does-not-exist
    // timer has run; from then on every RPC fails at once, and none reaches a backend.
    let mut hidden = client_in("hidden");
    let refused = hidden
        .until(&target, "UNAVAILABLE", &[], Duration::from_secs(40))
        .unwrap();
    assert!(refused.ok, "{refused:?}");
    let refused = hidden.rpcs(&target, 5, &[]).unwrap();
    assert_eq!(
        refused.errors.get("UNAVAILABLE"),
        Some(&5),
        "a Sidecar importing only its own namespace must not reach reviews: {refused:?}"
    );
    let listeners = server
        .admin_json(
            "/debug/config_dump?proxyID=sidecar~127.0.0.1~client.hidden~hidden.svc.cluster.local",
        )
        .unwrap()
        .to_string();
    assert!(
        !listeners.contains("reviews.default.svc.cluster.local"),
        "no listener, route or cluster names reviews for the hidden namespace"
    );

    // Importing default/* into the hidden namespace makes reviews reachable there.
    std::fs::write(
        dir.path().join("sidecars.yaml"),
        sidecars("\"./*\", \"default/*\""),
    )
    .unwrap();
    let until = hidden
        .until(&target, "reviews-v1", &[], Duration::from_secs(30))
        .unwrap();
    assert!(until.ok, "reviews never became reachable: {until:?}");
    assert_eq!(
        server.nacks().unwrap(),
        vec![],
        "the gRPC client NACKed a response"
    );
}
