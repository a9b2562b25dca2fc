//! Golden files of the generators: for each case under `tests/golden/<case>/` (input
//! `input.yaml`, optional `mesh.yaml` and `flags` (server switches, one a line), optional
//! `jwks.json` — the key sets the controller's resolver fetched, or why it could not; the
//! bookinfo case reads `examples/bookinfo/`), the
//! CDS, EDS, LDS and RDS a sidecar and a proxyless client receive, as proto JSON in
//! `<node>.<type>.json`. `UPDATE_GOLDEN=1` rewrites them; review the diff.
//!
//! Every generated resource of the corpus is then checked by Envoy's own
//! protoc-gen-validate rules, nested `Any`s included, and by the cross-reference checks
//! (`tests/pgv/validate_xds.py` in the `.venv-pgv` venv that `make test` installs), our
//! stand-in for Envoy's acceptance. A last test proves that checker can fail.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    Address, SocketAddress, TransportSocket, address, socket_address::PortSpecifier,
    transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, VirtualHost, route::Action,
    route_action::ClusterSpecifier,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SubjectAltNameMatcher, UpstreamTlsContext,
    common_tls_context::ValidationContextType, subject_alt_name_matcher::SanType,
};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};
use envoy_types::pb::google::protobuf::{Any, Duration};
use pilotfish_mesh::document::{MeshObject, parse_text, to_inputs};
use pilotfish_mesh::mesh_config::MeshConfig;
use pilotfish_mesh::model::{Proxy, ProxyGenerator};
use pilotfish_mesh::push_context::{BuildInputs, JwksOutcome, JwksSource, build};
use pilotfish_xds::ads::{ChangeKind, Resource, XdsSnapshot, XdsType};
use pilotfish_xds::generate::{GeneratedSnapshot, check_view, resources_json, view_of};
use prost::{Message, Name};

/// Every golden case: its folder, where its input lives (relative to the workspace; the
/// case folder's `input.yaml` when `None`), and the Pod the sidecar node impersonates.
const CASES: &[(&str, Option<&str>, &str)] = &[
    ("bookinfo", Some("examples/bookinfo"), "productpage-v1"),
    ("weighted-subsets", None, "client"),
    ("matches", None, "client"),
    ("retries-timeouts", None, "client"),
    ("fault", None, "client"),
    ("mirroring", None, "client"),
    ("rewrite-redirect-direct", None, "client"),
    ("cors-headers", None, "client"),
    ("consistent-hash", None, "client"),
    ("locality", None, "client"),
    ("connection-pool-outlier", None, "client"),
    ("tls-modes", None, "client"),
    ("port-level", None, "client"),
    ("tcp", None, "client"),
    ("service-entries", None, "client"),
    ("headless", None, "client"),
    ("registry-only", None, "client"),
    ("inbound", None, "client"),
    ("mtls-strict", None, "client"),
    ("mtls-disable", None, "client"),
    ("mtls-port-level", None, "client"),
    ("catch-all", None, "client"),
    ("istio-fields", None, "client"),
    ("default-retries", None, "client"),
    ("tls-system-roots", None, "client"),
    ("unready-endpoints", None, "client"),
    ("grpc-web", None, "client"),
    ("passthrough-target-port", None, "client"),
    ("auto-mtls", None, "client"),
    ("export-to", None, "client"),
    ("export-to-mesh-default", None, "client"),
    ("sidecar-egress-hosts", None, "client"),
    ("sidecar-import-nothing", None, "client"),
    ("sidecar-precedence", None, "client"),
    ("sidecar-root-default", None, "client"),
    ("sidecar-egress-port", None, "client"),
    ("sidecar-registry-only", None, "client"),
    ("sidecar-egress-proxy", None, "client"),
    ("sidecar-ingress", None, "client"),
    ("jwt-inline", None, "client"),
    ("jwt-jwks-uri", None, "client"),
    ("jwt-selection", None, "client"),
    ("jwt-authz", None, "client"),
    ("sidecar-inbound-pool", None, "client"),
    ("sidecar-ingress-bind", None, "client"),
    ("sidecar-egress-routes", None, "client"),
    ("sidecar-egress-bind", None, "client"),
    ("sidecar-ingress-tls", None, "client"),
    ("proxyless-server", None, "greeter"),
    ("authz-allow", None, "client"),
    ("authz-deny", None, "client"),
    ("authz-audit-dry-run", None, "client"),
    ("authz-scopes", None, "client"),
    ("authz-custom", None, "client"),
];

/// Cases whose golden node also runs as a proxyless gRPC server: its listeners
/// (`xds.istio.io/grpc/lds/inbound/<ip>:<port>`, asked for by name) go to
/// `proxyless-server.lds.json`.
const SERVER_CASES: &[&str] = &[
    "mtls-strict",
    "mtls-disable",
    "mtls-port-level",
    "proxyless-server",
];

/// The case's sidecar node as a proxyless gRPC server: same workload (labels, IPs).
fn proxyless_server(sidecar: &Proxy) -> Proxy {
    Proxy {
        id: format!("proxyless-server~{}", sidecar.namespace),
        generator: ProxyGenerator::Grpc,
        ..sidecar.clone()
    }
}

/// The listeners `server` gets when it asks, as a gRPC server does, for each of its
/// inbound ports at its IP, for the first one at `[::]` as well, and for a port it does
/// not serve (which does not exist).
fn server_listeners(snapshot: &GeneratedSnapshot, server: &Proxy) -> Vec<Arc<Resource>> {
    let ip = server
        .ips
        .first()
        .map(|ip| ip.to_string())
        .unwrap_or_else(|| "0.0.0.0".into());
    let ports: Vec<u32> = snapshot
        .scope(server)
        .inbound
        .iter()
        .map(|p| p.port)
        .collect();
    let mut names: std::collections::BTreeSet<String> = ports
        .iter()
        .map(|p| format!("xds.istio.io/grpc/lds/inbound/{ip}:{p}"))
        .collect();
    if let Some(first) = ports.first() {
        names.insert(format!("xds.istio.io/grpc/lds/inbound/[::]:{first}"));
    }
    names.insert(format!("xds.istio.io/grpc/lds/inbound/{ip}:1"));
    let listeners = snapshot.resources(server, XdsType::Listener.type_url(), Some(&names));
    assert!(
        !listeners.iter().any(|l| l.name.ends_with(":1")),
        "a port the workload does not serve has no listener"
    );
    let wildcard = snapshot.all(server, XdsType::Listener);
    assert!(
        !wildcard.keys().any(|n| n.starts_with("xds.istio.io/")),
        "a wildcard never lists server listeners"
    );
    listeners
}

const TYPES: [(XdsType, &str); 4] = [
    (XdsType::Cluster, "cds"),
    (XdsType::Endpoint, "eds"),
    (XdsType::Listener, "lds"),
    (XdsType::Route, "rds"),
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate is inside the workspace")
        .to_path_buf()
}

fn golden_dir(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(case)
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// The case's objects and mesh config.
fn load(case: &str, source: Option<&str>) -> (Vec<MeshObject>, MeshConfig) {
    let files = match source {
        Some(dir) => yaml_files(&workspace().join(dir)),
        None => vec![golden_dir(case).join("input.yaml")],
    };
    let mut objects = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("read {}: {e}", f.display()));
        let parsed = parse_text(&f, &text);
        assert!(parsed.errors.is_empty(), "{case}: {:?}", parsed.errors);
        objects.extend(parsed.objects);
    }
    let mesh_file = golden_dir(case).join("mesh.yaml");
    let mesh = if mesh_file.exists() {
        let text = std::fs::read_to_string(&mesh_file).expect("read mesh.yaml");
        MeshConfig::from_yaml(&text).expect("mesh.yaml").config
    } else {
        MeshConfig::default()
    };
    (objects, mesh)
}

/// A case's fetched key sets (`jwks.json`: a list of `issuer`, `jwksUri` and either
/// `keys` or `error`), standing in for the controller's resolver.
fn resolved_jwks(case: &str) -> BTreeMap<JwksSource, JwksOutcome> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Entry {
        issuer: String,
        #[serde(default)]
        jwks_uri: String,
        keys: Option<String>,
        error: Option<String>,
    }
    let file = golden_dir(case).join("jwks.json");
    let Ok(text) = std::fs::read_to_string(&file) else {
        return BTreeMap::new();
    };
    let entries: Vec<Entry> = serde_json::from_str(&text).expect("jwks.json");
    entries
        .into_iter()
        .map(|e| {
            let outcome = match (e.keys, e.error) {
                (Some(keys), None) => JwksOutcome::Keys(keys),
                (None, Some(error)) => JwksOutcome::Failed(error),
                _ => panic!("{case}: a jwks.json entry has keys or an error"),
            };
            (
                JwksSource {
                    issuer: e.issuer,
                    jwks_uri: e.jwks_uri,
                },
                outcome,
            )
        })
        .collect()
}

/// A case's snapshot and its two nodes.
pub fn case_snapshot(
    case: &str,
    source: Option<&str>,
    node_pod: &str,
) -> (GeneratedSnapshot, Proxy, Proxy) {
    let (objects, mesh) = load(case, source);
    // A case's `flags` file names the server switches it runs with, one a line.
    let flags = std::fs::read_to_string(golden_dir(case).join("flags")).unwrap_or_default();
    let flag = |name: &str| flags.lines().any(|l| l.trim() == name);
    let inputs = to_inputs(
        &objects,
        BuildInputs {
            mesh,
            cluster_domain: "cluster.local".into(),
            jwks: resolved_jwks(case),
            enable_tls_on_sidecar_ingress: flag("enable-tls-on-sidecar-ingress"),
            ..Default::default()
        },
    );
    let built = build(&inputs, None);
    // Pilotfish's refusal of CUSTOM AuthorizationPolicies is the one error a case may show
    // (the authz-custom case: the policy stays, rendered as DENY rules).
    let errors: Vec<_> = built
        .errors()
        .filter(|e| !e.message.starts_with("CUSTOM (ext_authz) is not supported"))
        .collect();
    assert!(
        errors.is_empty(),
        "{case}: the input must be valid: {errors:?}"
    );
    let pod = inputs.pods.iter().find(|p| p.name == node_pod).cloned();
    let sidecar = match pod {
        Some(p) => Proxy {
            namespace: p.namespace.clone(),
            labels: p.labels.clone(),
            ips: p.ips.iter().filter_map(|ip| ip.parse().ok()).collect(),
            pod_name: Some(p.name.clone()),
            ..Proxy::with_defaults(format!(
                "sidecar~{}~{}.{}~{}.svc.cluster.local",
                p.ips.first().map(String::as_str).unwrap_or("0.0.0.0"),
                p.name,
                p.namespace,
                p.namespace
            ))
        },
        None => Proxy::with_defaults("sidecar~10.9.9.9~client.default~default.svc.cluster.local"),
    };
    let proxyless = Proxy {
        id: format!("proxyless~{}", sidecar.namespace),
        generator: ProxyGenerator::Grpc,
        labels: Default::default(),
        ips: Vec::new(),
        ..sidecar.clone()
    };
    let snapshot = GeneratedSnapshot::new(Arc::new(built.context), 1, ChangeKind::Full);
    (snapshot, sidecar, proxyless)
}

fn pretty(v: &serde_json::Value) -> String {
    let mut s = serde_json::to_string_pretty(v).expect("JSON prints");
    s.push('\n');
    s
}

/// Writes one node's responses as encoded DiscoveryResponses for the PGV checker.
fn write_responses(dir: &Path, snapshot: &GeneratedSnapshot, proxy: &Proxy) {
    std::fs::create_dir_all(dir.parent().expect("parent")).expect("mkdir");
    for (kind, suffix) in TYPES {
        let response = DiscoveryResponse {
            type_url: kind.type_url().to_string(),
            resources: snapshot
                .all(proxy, kind)
                .values()
                .map(|r| Any {
                    type_url: r.body.type_url.clone(),
                    value: r.body.value.clone(),
                })
                .collect(),
            ..Default::default()
        };
        let file = PathBuf::from(format!("{}.{suffix}.pb", dir.display()));
        std::fs::write(&file, response.encode_to_vec()).expect("write response");
    }
}

fn python() -> PathBuf {
    let python = workspace().join(".venv-pgv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/deps/python-pgv.sh (make test installs it)",
        python.display()
    );
    python
}

/// Runs the PGV + cross-reference checker over `dir`: (passed, output).
fn run_checker(dir: &Path) -> (bool, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pgv/validate_xds.py");
    let out = Command::new(python())
        .arg(&script)
        .arg(dir)
        .output()
        .expect("run validate_xds.py");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn golden_files_match_and_pass_envoy_validation() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let pb_dir = tempfile::tempdir().expect("tempdir");
    let mut mismatches = Vec::new();
    for (case, source, node_pod) in CASES {
        let (snapshot, sidecar, proxyless) = case_snapshot(case, *source, node_pod);
        for (node_name, proxy) in [("sidecar", &sidecar), ("proxyless", &proxyless)] {
            let broken = check_view(node_name, &view_of(&snapshot, proxy));
            assert!(broken.is_empty(), "{case}/{node_name}: {broken:?}");
            for (kind, suffix) in TYPES {
                let json = resources_json(&snapshot, proxy, kind)
                    .unwrap_or_else(|e| panic!("{case}/{node_name}.{suffix}: {e}"));
                let file = golden_dir(case).join(format!("{node_name}.{suffix}.json"));
                let actual = pretty(&json);
                if update {
                    std::fs::write(&file, &actual).expect("write golden");
                } else {
                    let expected = std::fs::read_to_string(&file).unwrap_or_default();
                    if expected != actual {
                        mismatches.push(file.display().to_string());
                    }
                }
            }
            write_responses(&pb_dir.path().join(case).join(node_name), &snapshot, proxy);
        }
        if SERVER_CASES.contains(case) {
            let server = proxyless_server(&sidecar);
            let listeners = server_listeners(&snapshot, &server);
            let json = serde_json::Value::Array(
                listeners
                    .iter()
                    .map(|r| pilotfish_xds::generate::resource_json(r).expect("proto JSON"))
                    .collect(),
            );
            let file = golden_dir(case).join("proxyless-server.lds.json");
            let actual = pretty(&json);
            if update {
                std::fs::write(&file, &actual).expect("write golden");
            } else if std::fs::read_to_string(&file).unwrap_or_default() != actual {
                mismatches.push(file.display().to_string());
            }
            let response = DiscoveryResponse {
                type_url: XdsType::Listener.type_url().to_string(),
                resources: listeners
                    .iter()
                    .map(|r| Any {
                        type_url: r.body.type_url.clone(),
                        value: r.body.value.clone(),
                    })
                    .collect(),
                ..Default::default()
            };
            let pb = pb_dir.path().join(case).join("proxyless-server.lds.pb");
            std::fs::write(&pb, response.encode_to_vec()).expect("write response");
        }
    }
    assert!(
        mismatches.is_empty(),
        "generated output differs from the golden files (run with UPDATE_GOLDEN=1 and review the diff):\n{}",
        mismatches.join("\n")
    );
    let (ok, output) = run_checker(pb_dir.path());
    assert!(
        ok,
        "Envoy's validation rules reject generated resources:\n{output}"
    );
    assert!(output.contains(" 0 problems"), "{output}");
}

#[test]
fn every_golden_case_has_a_folder_and_no_stray_ones() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let on_disk: Vec<String> = std::fs::read_dir(&root)
        .expect("tests/golden")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let mut on_disk = on_disk;
    on_disk.sort();
    let mut listed: Vec<String> = CASES.iter().map(|(c, _, _)| c.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "tests/golden folders and CASES must agree");
}

/// The checker is only worth something if it can fail: feed it resources Envoy rejects.
#[test]
fn the_envoy_validation_checker_rejects_broken_resources() {
    let dir = tempfile::tempdir().expect("tempdir");
    let any = |m: &dyn Fn() -> (String, Vec<u8>)| {
        let (type_url, value) = m();
        Any { type_url, value }
    };
    // PGV reports the first violation of a message, so each cluster breaks one rule.
    let nameless = Cluster {
        name: String::new(),
        ..Default::default()
    };
    let no_timeout = Cluster {
        name: "outbound|80||a".into(),
        connect_timeout: Some(Duration {
            seconds: 0,
            nanos: 0,
        }),
        ..Default::default()
    };
    // Subject alt names to match and no CA to verify the chain with.
    let san_only = Cluster {
        name: "outbound|443||api.example.com".into(),
        transport_socket: Some(TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(Any {
                type_url: UpstreamTlsContext::type_url(),
                value: UpstreamTlsContext {
                    common_tls_context: Some(CommonTlsContext {
                        validation_context_type: Some(ValidationContextType::ValidationContext(
                            CertificateValidationContext {
                                match_typed_subject_alt_names: vec![SubjectAltNameMatcher {
                                    san_type: SanType::Dns as i32,
                                    matcher: Some(StringMatcher {
                                        match_pattern: Some(MatchPattern::Exact(
                                            "api.example.com".into(),
                                        )),
                                        ignore_case: false,
                                    }),
                                    ..Default::default()
                                }],
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }),
                    ..Default::default()
                }
                .encode_to_vec(),
            })),
        }),
        ..Default::default()
    };
    let dangling = RouteConfiguration {
        name: "80".into(),
        virtual_hosts: vec![VirtualHost {
            name: "a:80".into(),
            domains: vec!["a".into()],
            routes: vec![Route {
                name: "r".into(),
                r#match: Some(Default::default()),
                action: Some(Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::Cluster(
                        "outbound|80||missing".into(),
                    )),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    // Two virtual hosts listing one domain; no listener asks for the configuration.
    let mut dangling = dangling;
    let mut again = dangling.virtual_hosts[0].clone();
    again.name = "b:80".into();
    dangling.virtual_hosts.push(again);
    // Two listeners on one address.
    let on = |name: &str| Listener {
        name: name.into(),
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: "10.0.0.1".into(),
                port_specifier: Some(PortSpecifier::PortValue(80)),
                ..Default::default()
            })),
        }),
        ..Default::default()
    };
    let responses: BTreeMap<&str, DiscoveryResponse> = [
        (
            "lds",
            DiscoveryResponse {
                type_url: Listener::type_url(),
                resources: [on("10.0.0.1_80"), on("twin")]
                    .iter()
                    .map(|l| any(&|| (Listener::type_url(), l.encode_to_vec())))
                    .collect(),
                ..Default::default()
            },
        ),
        (
            "cds",
            DiscoveryResponse {
                type_url: Cluster::type_url(),
                resources: vec![
                    any(&|| (Cluster::type_url(), nameless.encode_to_vec())),
                    any(&|| (Cluster::type_url(), no_timeout.encode_to_vec())),
                    any(&|| (Cluster::type_url(), san_only.encode_to_vec())),
                ],
                ..Default::default()
            },
        ),
        (
            "rds",
            DiscoveryResponse {
                type_url: RouteConfiguration::type_url(),
                resources: vec![any(&|| {
                    (RouteConfiguration::type_url(), dangling.encode_to_vec())
                })],
                ..Default::default()
            },
        ),
    ]
    .into();
    for (suffix, response) in responses {
        std::fs::write(
            dir.path().join(format!("broken.{suffix}.pb")),
            response.encode_to_vec(),
        )
        .expect("write");
    }
    let (ok, output) = run_checker(dir.path());
    assert!(!ok, "the checker accepted broken resources:\n{output}");
    for expected in [
        "name length is less than 1",
        "connect_timeout is not greater than",
        "names cluster 'outbound|80||missing', which CDS does not send",
        "Oneof path_specifier is required",
        "listeners 10.0.0.1_80 and twin share the address 10.0.0.1:80",
        "no listener asks RDS for route configuration '80'",
        "route configuration '80' lists domain 'a' twice",
        "cluster outbound|443||api.example.com: SAN-based verification of peer certificates without trusted CA",
    ] {
        assert!(
            output.contains(expected),
            "missing {expected:?} in:\n{output}"
        );
    }
}
