//! A config folder as users write one, served by standalone `pilotfish-xds`: Istio's
//! sample layout (a Gateway and its VirtualService in one file) beside Sidecars and
//! security policies — every supported object served, each unsupported kind counted, none
//! blocking the rest — and a quiet folder that costs nothing (no reads, no rebuilds).

use std::path::Path;
use std::time::{Duration, Instant};

use pilotfish_testkit::process::XdsServer;

/// Istio's bookinfo gateway sample layout: the Gateway and the VirtualService bound to it
/// (and to the mesh) in one file.
const GATEWAY_AND_ROUTE: &str = "\
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: bookinfo-gateway, namespace: bookinfo}
spec:
  selector: {istio: ingressgateway}
  servers: [{port: {number: 80, name: http, protocol: HTTP}, hosts: ['*']}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bookinfo, namespace: bookinfo}
spec:
  hosts: [productpage.bookinfo.svc.cluster.local]
  gateways: [bookinfo-gateway, mesh]
  http:
  - match: [{uri: {prefix: /productpage}}]
    route: [{destination: {host: productpage, port: {number: 9080}}}]
";

const POLICIES: &str = "\
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: bookinfo}
spec: {egress: [{hosts: ['./*', 'istio-system/*']}]}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-all, namespace: bookinfo}
spec: {}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system}
spec: {mtls: {mode: STRICT}}
";

fn service(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: bookinfo}}\nspec:\n  clusterIP: 10.96.1.{n}\n  selector: {{app: {name}}}\n  ports: [{{name: http, port: 9080}}]\n",
        n = name.len()
    )
}

/// The folder: 40 files, one of them Istio's gateway sample, one the policies, one a
/// second Gateway (its kind must still be counted once per object, reported once), the
/// rest services with a DestinationRule each.
fn write_folder(dir: &Path) {
    std::fs::write(dir.join("bookinfo-gateway.yaml"), GATEWAY_AND_ROUTE).unwrap();
    std::fs::write(dir.join("policies.yaml"), POLICIES).unwrap();
    std::fs::write(
        dir.join("other-gateway.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: internal, namespace: bookinfo}\nspec: {servers: []}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("external.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: httpbin, namespace: bookinfo}\nspec:\n  hosts: [httpbin.org]\n  ports: [{number: 443, name: https, protocol: HTTPS}]\n  resolution: DNS\n",
    )
    .unwrap();
    for i in 0..36 {
        let name = if i == 0 {
            "productpage".to_string()
        } else {
            format!("svc-{i:02}")
        };
        std::fs::write(
            dir.join(format!("{name}.yaml")),
            format!(
                "{}---\napiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: {name}, namespace: bookinfo}}\nspec:\n  host: {name}\n  subsets: [{{name: v1, labels: {{version: v1}}}}]\n",
                service(&name)
            ),
        )
        .unwrap();
    }
    assert_eq!(std::fs::read_dir(dir).unwrap().count(), 40);
}

/// Polls `check` every 50 ms for at most 30 s.
fn eventually<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_mixed_folder_is_served_and_a_quiet_folder_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_folder(dir.path());
    let server =
        XdsServer::standalone("xds-mixed-folder", dir.path()).expect("start pilotfish-xds");

    // Every supported object is served, the VirtualService that shares a file with a
    // Gateway included.
    let snapshot = server.admin_json("/debug/snapshot").unwrap();
    assert_eq!(snapshot["services"], 37, "{snapshot}");
    assert_eq!(
        snapshot["virtual_services"],
        serde_json::json!(["bookinfo/bookinfo"]),
        "{snapshot}"
    );
    assert_eq!(
        snapshot["destination_rules"].as_array().map(Vec::len),
        Some(36),
        "{snapshot}"
    );
    // Each unsupported kind is counted; nothing failed to parse.
    for (kind, n) in [
        ("networking.istio.io/v1/Gateway", 2.0),
        ("networking.istio.io/v1/Sidecar", 1.0),
        ("security.istio.io/v1/AuthorizationPolicy", 1.0),
        ("security.istio.io/v1/PeerAuthentication", 1.0),
    ] {
        let found = server
            .metric(
                "pilotfish_source_ignored_objects",
                &format!("kind=\"{kind}\""),
            )
            .unwrap();
        assert_eq!(found, n, "{kind}");
    }
    assert_eq!(
        server
            .metric("pilotfish_source_invalid_documents", "")
            .unwrap(),
        0.0
    );

    // Quiet: over two seconds nothing is read and nothing rebuilt (the watcher ignores the
    // server's own reads; the periodic resync compares file stamps without reading).
    let reads = || {
        server
            .metric("pilotfish_source_file_reads_total", "")
            .unwrap()
    };
    let rebuilds = || {
        server
            .metric("pilotfish_rebuilds_total", "path=\"full\"")
            .unwrap()
    };
    let (reads_before, rebuilds_before) = (reads(), rebuilds());
    assert_eq!(reads_before, 40.0, "the first scan reads each file once");
    assert_eq!(rebuilds_before, 1.0);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(reads(), reads_before, "a quiet folder was read again");
    assert_eq!(rebuilds(), rebuilds_before, "a quiet folder was rebuilt");

    // An edit is still seen: one file read, one rebuild.
    std::fs::write(
        dir.path().join("external.yaml"),
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: httpbin, namespace: bookinfo}\nspec:\n  hosts: [httpbin.org, api.example.com]\n  ports: [{number: 443, name: https, protocol: HTTPS}]\n  resolution: DNS\n",
    )
    .unwrap();
    eventually("the edit to be served", || {
        let s = server.admin_json("/debug/snapshot").ok()?;
        (s["services"] == 38).then_some(())
    });
    assert_eq!(reads(), reads_before + 1.0, "only the edited file is read");
    assert_eq!(rebuilds(), rebuilds_before + 1.0);
}
