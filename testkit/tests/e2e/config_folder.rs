//! A config folder as users write one, served by standalone `pilotfish-xds`: Istio's
//! sample layout (a Gateway and its VirtualService in one file) beside a Sidecar and
//! security policies — every supported object served, each unsupported kind counted, none
//! blocking the rest — and a quiet folder that costs nothing (no reads, no rebuilds).
//!
//! Issue 12, defect 7 (docs/RELIABILITY.md): a folder with entries that cannot be read
//! (`lost+found` under the chart's non-root uid, looping links, a FIFO) and folders
//! vanishing while scanned, served by a real unprivileged `pilotfish-xds`; a file written in
//! two halves, and a ConfigMap volume's `..data` swaps, published by a real
//! `pilotfish-controller --config-dir --redis-url`, with every snapshot it ever published
//! read back from Redis.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

use pilotfish_mesh::push_context::PushContext;
use pilotfish_testkit::process::{ControllerProcess, XdsServer};
use pilotfish_testkit::redis::RedisServer;

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
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: tokens, namespace: bookinfo}
spec:
  jwtRules:
  - issuer: https://issuer.example.com
    jwks: '{\"keys\":[{\"kty\":\"EC\",\"crv\":\"P-256\",\"x\":\"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU\",\"y\":\"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0\"}]}'
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
    // PeerAuthentication and Sidecar are read (the policies file's mesh-wide STRICT and
    // bookinfo's Sidecar), not ignored.
    assert_eq!(
        snapshot["peer_authentications"],
        serde_json::json!(["istio-system/default"]),
        "{snapshot}"
    );
    assert_eq!(
        snapshot["sidecars"],
        serde_json::json!(["bookinfo/default"]),
        "{snapshot}"
    );
    assert_eq!(
        snapshot["request_authentications"],
        serde_json::json!(["bookinfo/tokens"]),
        "{snapshot}"
    );
    // AuthorizationPolicy is read too (bookinfo's allow-nothing policy).
    assert_eq!(
        snapshot["authorization_policies"],
        serde_json::json!(["bookinfo/deny-all"]),
        "{snapshot}"
    );
    for kind in [
        "security.istio.io/v1/PeerAuthentication",
        "networking.istio.io/v1/Sidecar",
        "security.istio.io/v1/RequestAuthentication",
        "security.istio.io/v1/AuthorizationPolicy",
    ] {
        assert_eq!(
            server
                .metric(
                    "pilotfish_source_ignored_objects",
                    &format!("kind=\"{kind}\"")
                )
                .unwrap_or(0.0),
            0.0,
            "{kind}"
        );
    }
    // Each unsupported kind is counted; nothing failed to parse.
    let gateways = server
        .metric(
            "pilotfish_source_ignored_objects",
            "kind=\"networking.istio.io/v1/Gateway\"",
        )
        .unwrap();
    assert_eq!(gateways, 2.0);
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

fn plain_service(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: default}}\nspec: {{ports: [{{name: http, port: 9080}}]}}\n"
    )
}

/// A VirtualService `name` routing to the Service `to`.
fn route_to(name: &str, to: &str) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  hosts: [{to}]\n  http: [{{route: [{{destination: {{host: {to}}}}}]}}]\n"
    )
}

fn make_readable_by_all(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Defect 7: entries the server cannot use — a `lost+found` it may not list (mode 000,
/// the server running unprivileged as the chart runs it), a link that loops, a link back
/// to a parent folder, a FIFO named `*.yaml` — and folders appearing and vanishing (and a
/// file replaced by a folder) while it scans: the process keeps running, serves every
/// other file, counts what it skips, and still follows edits.
#[test]
fn unreadable_and_vanishing_entries_never_stop_the_folder() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    make_readable_by_all(root);
    std::fs::write(root.join("a.yaml"), plain_service("a")).unwrap();
    std::fs::create_dir(root.join("team")).unwrap();
    make_readable_by_all(&root.join("team"));
    std::fs::write(root.join("team/b.yaml"), plain_service("b")).unwrap();
    symlink("..", root.join("team/up")).unwrap();
    symlink("self.yaml", root.join("self.yaml")).unwrap();
    let fifo = std::process::Command::new("mkfifo")
        .arg(root.join("pipe.yaml"))
        .status();
    assert!(fifo.is_ok_and(|s| s.success()), "mkfifo");
    std::fs::create_dir(root.join("lost+found")).unwrap();
    std::fs::set_permissions(
        root.join("lost+found"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();

    let server = XdsServer::standalone_unprivileged("xds-unreadable", root)
        .expect("pilotfish-xds starts and becomes ready");
    let services = |server: &XdsServer| {
        server
            .admin_json("/debug/snapshot")
            .ok()
            .and_then(|s| s["services"].as_u64())
    };
    assert_eq!(services(&server), Some(2));
    assert_eq!(
        server.metric("pilotfish_source_skipped_paths", "").unwrap(),
        4.0,
        "lost+found, pipe.yaml, self.yaml and team/up are skipped"
    );

    // Folders (with a Service each) created and removed, a file replaced by a folder and
    // back, as fast as possible for 3 s, while the server rescans on every event.
    let churn = root.join("churn");
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut rounds = 0;
    while Instant::now() < deadline {
        let sub = churn.join(format!("x-{}", rounds % 4));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("s.yaml"), plain_service(&format!("c-{rounds}"))).unwrap();
        let flip = root.join("flip.yaml");
        if rounds % 2 == 0 {
            let _ = std::fs::remove_dir_all(&flip);
            std::fs::write(&flip, plain_service("flip")).unwrap();
        } else {
            let _ = std::fs::remove_file(&flip);
            std::fs::create_dir_all(flip.join("inner")).unwrap();
        }
        std::fs::remove_dir_all(&sub).unwrap();
        rounds += 1;
    }
    std::fs::remove_dir_all(&churn).unwrap();
    let _ = std::fs::remove_dir_all(root.join("flip.yaml"));
    let _ = std::fs::remove_file(root.join("flip.yaml"));
    assert!(rounds > 50, "only {rounds} rounds of churn");

    std::fs::write(root.join("d.yaml"), plain_service("d")).unwrap();
    eventually("the edit after the churn to be served", || {
        (services(&server) == Some(3)).then_some(())
    });
    let mut server = server;
    assert!(server.process.try_wait().is_none(), "pilotfish-xds exited");
    // So that the temporary folder can be removed by a non-root user too.
    make_readable_by_all(&root.join("lost+found"));
}

/// Every snapshot the controller published (versions 1..=latest, all still in Redis),
/// decoded with the tests' key.
fn published_snapshots(redis: &RedisServer) -> Vec<(u64, PushContext)> {
    let mut conn = redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let latest: u64 = redis::cmd("HGET")
        .arg("pilotfish:latest")
        .arg("version")
        .query(&mut conn)
        .expect("a snapshot is published");
    (1..=latest)
        .map(|version| {
            let blob: Vec<u8> = redis::cmd("GET")
                .arg(format!("pilotfish:snapshot:{version}"))
                .query(&mut conn)
                .unwrap_or_else(|e| panic!("version {version} is not in Redis: {e}"));
            let verified = crate::controller_k8s::decode(&blob).expect("a valid blob");
            (version, verified.value)
        })
        .collect()
}

fn service_names(ctx: &PushContext) -> BTreeSet<String> {
    ctx.services().iter().map(|s| s.name.clone()).collect()
}

fn route_names(ctx: &PushContext) -> BTreeSet<String> {
    ctx.virtual_services()
        .iter()
        .map(|v| v.meta.name.clone())
        .collect()
}

/// Polls `check` until `what` holds, for at most 30 s.
fn wait_for_version(redis: &RedisServer, what: &str, check: impl Fn(&PushContext) -> bool) {
    eventually(what, || {
        let history = published_snapshots(redis);
        history.last().filter(|(_, ctx)| check(ctx)).map(|_| ())
    });
}

/// Defect 7: a multi-document file written in two halves with a pause between them (as a
/// slow copy or a script does) is never published half: the first half's Service never
/// appears without the second half's Service and VirtualService — neither for a new file
/// nor for a file rewritten in place, whose old objects stay until the new content is
/// whole. Every snapshot the controller published is checked.
#[test]
fn a_file_written_in_two_halves_is_never_published_half() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("base.yaml"), plain_service("base")).unwrap();
    let _controller = ControllerProcess::config_dir("controller-halves", dir.path(), &redis.url())
        .expect("start the controller");
    wait_for_version(&redis, "the first snapshot", |ctx| {
        service_names(ctx).contains("base")
    });

    let file = dir.path().join("reviews.yaml");
    let write_in_two_halves = |suffix: &str| {
        let mut f = std::fs::File::create(&file).unwrap();
        f.write_all(format!("{}---\n", plain_service(&format!("ratings{suffix}"))).as_bytes())
            .unwrap();
        f.sync_all().unwrap();
        // Longer than the controller's debounce (50 ms), shorter than the settle window.
        std::thread::sleep(Duration::from_millis(400));
        f.write_all(
            format!(
                "{}---\n{}",
                plain_service(&format!("reviews{suffix}")),
                route_to(&format!("reviews{suffix}"), &format!("reviews{suffix}"))
            )
            .as_bytes(),
        )
        .unwrap();
    };
    write_in_two_halves("");
    wait_for_version(&redis, "the whole new file", |ctx| {
        route_names(ctx).contains("reviews")
    });
    // Rewritten in place (truncated, then two halves).
    write_in_two_halves("-2");
    wait_for_version(&redis, "the whole rewritten file", |ctx| {
        route_names(ctx).contains("reviews-2")
    });

    let history = published_snapshots(&redis);
    for (version, ctx) in &history {
        let (services, routes) = (service_names(ctx), route_names(ctx));
        for suffix in ["", "-2"] {
            if services.contains(&format!("ratings{suffix}")) {
                assert!(
                    services.contains(&format!("reviews{suffix}"))
                        && routes.contains(&format!("reviews{suffix}")),
                    "version {version} has the first half of the file only: {services:?} {routes:?}"
                );
            }
        }
        assert!(services.contains("base"), "version {version}: {services:?}");
        if *version > 2 {
            assert!(
                services.contains("ratings") || services.contains("ratings-2"),
                "version {version} lost the file's objects while it was rewritten: {services:?}"
            );
        }
    }
    assert_eq!(history.len(), 3, "one publish per whole edit");
}

/// Defect 7: a ConfigMap volume as kubelet lays it out (`key -> ..data/key`,
/// `..data -> ..<timestamp>`), updated by kubelet's atomic swap three times: each version
/// is picked up whole — the Service and the VirtualService routing to it, from two keys,
/// always from the same version — and the old version's removal removes nothing.
#[test]
fn a_configmap_volume_swap_is_picked_up_whole() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let write_version = |n: usize| -> String {
        let name = format!("..2026_11_25_06_0{n}_00.{n}");
        std::fs::create_dir(root.join(&name)).unwrap();
        let service = format!("reviews-v{n}");
        std::fs::write(
            root.join(&name).join("services.yaml"),
            plain_service(&service),
        )
        .unwrap();
        std::fs::write(
            root.join(&name).join("routes.yaml"),
            route_to("reviews", &service),
        )
        .unwrap();
        name
    };
    let swap_to = |name: &str| {
        symlink(name, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
    };
    let mut current = write_version(1);
    swap_to(&current);
    symlink("..data/services.yaml", root.join("services.yaml")).unwrap();
    symlink("..data/routes.yaml", root.join("routes.yaml")).unwrap();
    let _controller = ControllerProcess::config_dir("controller-configmap", root, &redis.url())
        .expect("start the controller");
    wait_for_version(&redis, "version 1", |ctx| {
        service_names(ctx).contains("reviews-v1")
    });
    for n in 2..=4 {
        let next = write_version(n);
        swap_to(&next);
        std::fs::remove_dir_all(root.join(&current)).unwrap();
        current = next;
        wait_for_version(&redis, &format!("version {n}"), |ctx| {
            service_names(ctx).contains(&format!("reviews-v{n}"))
        });
    }

    let history = published_snapshots(&redis);
    for (version, ctx) in &history {
        let services: BTreeSet<String> = service_names(ctx)
            .into_iter()
            .filter(|s| s.starts_with("reviews-v"))
            .collect();
        assert_eq!(services.len(), 1, "version {version}: {services:?}");
        let vs = ctx
            .virtual_services()
            .iter()
            .find(|v| v.meta.name == "reviews")
            .unwrap_or_else(|| panic!("version {version} has no route"));
        let host = vs.spec.hosts[0].split('.').next().unwrap_or_default();
        assert!(
            services.contains(host),
            "version {version} mixes two versions of the volume: services {services:?}, route to {host}"
        );
    }
    assert_eq!(history.len(), 4, "one publish per version of the volume");
}

/// Standalone, the xDS process publishes its folder itself, so it is what fetches the key
/// sets (from a real HTTP server on 127.0.0.1 here): the RequestAuthentication's jwksUri is
/// fetched once and served, an unreachable one is recorded as failed.
#[test]
fn standalone_fetches_the_key_sets_its_folder_names() {
    use std::io::{Read, Write};
    const KEYS: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"standalone","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{KEYS}",
                KEYS.len()
            );
        }
    });
    let unreachable = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokens.yaml"),
        format!(
            "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: tokens, namespace: default}}\nspec:\n  jwtRules:\n  - {{issuer: 'https://a.example.com', jwksUri: 'http://{addr}/jwks.json'}}\n  - {{issuer: 'https://b.example.com', jwksUri: 'http://{unreachable}/jwks.json', timeout: 500ms}}\n"
        ),
    )
    .unwrap();
    let server = XdsServer::standalone("xds-jwks", dir.path()).expect("start pilotfish-xds");
    let jwks = eventually("both key sets resolved in the served snapshot", || {
        let snapshot = server.admin_json("/debug/snapshot").ok()?;
        let jwks = snapshot["jwks"].as_array()?.clone();
        (jwks.len() == 2).then_some(jwks)
    });
    let fetched: Vec<bool> = jwks
        .iter()
        .map(|j| j["fetched"].as_bool().unwrap())
        .collect();
    assert_eq!(fetched, [true, false], "{jwks:?}");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(
        server
            .metric("pilotfish_jwks_fetches_total", "result=\"success\"")
            .unwrap_or(0.0)
            >= 1.0
    );
}
