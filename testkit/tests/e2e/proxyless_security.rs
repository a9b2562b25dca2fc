//! Proxyless gRPC security end to end, with gRPC's own xDS implementation (Python grpcio):
//! two proxyless workloads on loopback addresses standing in for Pod IPs — a server
//! (`grpc.server(..., xds=True)`, `grpc.xds_server_credentials`, 127.0.0.2) and a client
//! (`grpc.xds_channel_credentials`) of distinct service accounts — get their certificates
//! from Pilotfish's CA (`CreateCertificate` with a token from the test API server) and
//! their configuration from the secure port, each with a bootstrap carrying the
//! certificate provider `default` (file watcher) and, for the server, Istio's server
//! listener template. Then, editing the mesh folder of a standalone `pilotfish-xds`:
//!
//! 1. no PeerAuthentication (PERMISSIVE, served as plaintext to a proxyless server): a
//!    plaintext client is answered, and the server sees no peer identity;
//! 2. PeerAuthentication STRICT: the plaintext client is refused, and so is the client
//!    with xDS credentials, since no DestinationRule tells it to use mTLS;
//! 3. a DestinationRule `ISTIO_MUTUAL`: the client with xDS credentials talks mTLS and the
//!    server sees its SPIFFE identity; the plaintext client is still refused;
//! 4. AuthorizationPolicies on the server (gRPC's RBAC filters, gRFC A41): DENY one method
//!    — it fails with `PERMISSION_DENIED` — and ALLOW the client's principal, so the other
//!    method still works.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use pilotfish_ca::bundle;
use pilotfish_testkit::grpc::{ChannelCreds, GrpcXdsServer, XdsClient, istio_ca_client};
use pilotfish_testkit::process::{XdsServer, free_port};
use pilotfish_testkit::secure;
use serde_json::{Value, json};

use crate::apiserver_tokens::{token, workload};
use crate::support::Cluster;

const SERVER_IP: &str = "127.0.0.2";
const CLIENT_IDENTITY: &str = "spiffe://cluster.local/ns/default/sa/greeter-client";
const WHO: &str = "/pilotfish.test.Echo/Who";
const PEER: &str = "/pilotfish.test.Echo/Peer";
const TARGET: &str = "xds:///greeter.default.svc.cluster.local:7070";
const WAIT: Duration = Duration::from_secs(30);

/// The server workload: Service `greeter` (7070 → `port`), its Pod on [`SERVER_IP`] running
/// as service account `greeter`, and its endpoint.
fn workloads(port: u16) -> String {
    format!(
        "apiVersion: v1
kind: Service
metadata: {{name: greeter, namespace: default}}
spec:
  clusterIP: 10.96.0.70
  selector: {{app: greeter}}
  ports: [{{name: grpc, port: 7070, targetPort: {port}}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: greeter, namespace: default, labels: {{app: greeter}}}}
spec:
  serviceAccountName: greeter
  containers: [{{name: greeter, image: example/greeter}}]
status:
  podIP: {SERVER_IP}
  podIPs: [{{ip: {SERVER_IP}}}]
  conditions: [{{type: Ready, status: \"True\"}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: greeter-1
  namespace: default
  labels: {{kubernetes.io/service-name: greeter}}
addressType: IPv4
ports: [{{name: grpc, port: {port}, protocol: TCP}}]
endpoints:
- addresses: [{SERVER_IP}]
  conditions: {{ready: true}}
  targetRef: {{kind: Pod, name: greeter, namespace: default}}
"
    )
}

const STRICT: &str = "apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: default}
spec:
  mtls: {mode: STRICT}
";

const ISTIO_MUTUAL: &str = "apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: default}
spec:
  host: greeter.default.svc.cluster.local
  trafficPolicy:
    tls: {mode: ISTIO_MUTUAL}
";

const AUTHORIZATION: &str = "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-who, namespace: default}
spec:
  selector: {matchLabels: {app: greeter}}
  action: DENY
  rules:
  - to: [{operation: {paths: [/pilotfish.test.Echo/Who]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-client, namespace: default}
spec:
  selector: {matchLabels: {app: greeter}}
  action: ALLOW
  rules:
  - from: [{source: {principals: [cluster.local/ns/default/sa/greeter-client]}}]
";

/// Writes `file` into the mesh folder atomically (the folder source reads a file its
/// writer finished).
fn write_config(dir: &Path, file: &str, content: &str) {
    let partial = dir.join(format!(".{file}.partial"));
    std::fs::write(&partial, content).unwrap();
    std::fs::rename(&partial, dir.join(file)).unwrap();
}

/// A proxyless bootstrap as Istio's agent writes it (`grpcxds.GenerateBootstrap`): the
/// secure port with the workload's certificate, the node, the certificate provider
/// `default` reading the files the CA client wrote, and the server listener template.
fn bootstrap(xds: &str, certs: &Path, pod: &str, sa: &str, ip: &str, app: &str) -> Value {
    let file = |name: &str| certs.join(name).display().to_string();
    json!({
        "xds_servers": [{
            "server_uri": xds,
            "channel_creds": [{"type": "tls", "config": {
                "ca_certificate_file": file("root-cert.pem"),
                "certificate_file": file("cert-chain.pem"),
                "private_key_file": file("key.pem"),
            }}],
            "server_features": ["xds_v3"]
        }],
        "node": {
            "id": format!("sidecar~{ip}~{pod}.default~default.svc.cluster.local"),
            "locality": {},
            "metadata": {
                "GENERATOR": "grpc",
                "NAMESPACE": "default",
                "SERVICE_ACCOUNT": sa,
                "INSTANCE_IPS": ip,
                "LABELS": {"app": app}
            }
        },
        "certificate_providers": {"default": {"plugin_name": "file_watcher", "config": {
            "certificate_file": file("cert-chain.pem"),
            "private_key_file": file("key.pem"),
            "ca_certificate_file": file("root-cert.pem"),
            "refresh_interval": "900s"
        }}},
        "server_listener_resource_name_template": "xds.istio.io/grpc/lds/inbound/%s"
    })
}

/// Waits until RPCs of `method` with `creds` are answered `expect`; panics with the last
/// outcome otherwise.
fn until(client: &mut XdsClient, method: &str, creds: ChannelCreds, expect: &str) {
    let u = client
        .until_of(TARGET, method, creds, expect, WAIT)
        .unwrap();
    assert!(u.ok, "{method} ({creds:?}) never answered {expect}: {u:?}");
}

/// `count` RPCs of `method` with `creds` all end with the status `code`.
fn assert_refused(client: &mut XdsClient, method: &str, creds: ChannelCreds, code: &str) {
    let tally = client.rpcs_of(TARGET, method, creds, 3).unwrap();
    assert_eq!(
        tally.errors.get(code),
        Some(&3),
        "{method} ({creds:?}) must fail with {code}: {tally:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxyless_mtls_from_peer_authentication_and_istio_mutual() {
    let started = Instant::now();
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let greeter_pod = workload(&client, "default", "greeter", "greeter").await;
    let client_pod = workload(&client, "default", "greeter-client", "greeter-client").await;
    let server_token = token(
        &client,
        "default",
        "greeter",
        &["istio-ca"],
        Some(&greeter_pod),
    )
    .await;
    let client_token = token(
        &client,
        "default",
        "greeter-client",
        &["istio-ca"],
        Some(&client_pod),
    )
    .await;

    let ca_dir = tempfile::tempdir().unwrap();
    let ca = bundle::generate_self_signed(
        "cluster.local",
        Duration::from_secs(86400 * 365),
        SystemTime::now(),
    )
    .unwrap();
    for (name, bytes) in ca.self_signed_secret_data() {
        std::fs::write(ca_dir.path().join(name), bytes).unwrap();
    }
    let port = free_port();
    let mesh = tempfile::tempdir().unwrap();
    write_config(mesh.path(), "workloads.yaml", &workloads(port));
    let kubeconfig = cluster.server.kubeconfig_path();
    let (_xds, secure_addr) = tokio::task::block_in_place(|| {
        XdsServer::standalone_secure("xds-proxyless", mesh.path(), ca_dir.path(), &kubeconfig)
    })
    .unwrap();
    let xds_uri = format!("{}:{}", secure::SERVER_NAME, secure_addr.port());

    // Each workload obtains its certificate from the CA with its own token.
    let certs = tempfile::tempdir().unwrap();
    let root_file = certs.path().join("mesh-root.pem");
    std::fs::write(&root_file, &ca.ca_cert).unwrap();
    let obtain = |who: &str, token: &str| {
        let token_file = certs.path().join(format!("{who}-token"));
        std::fs::write(&token_file, token).unwrap();
        let out = certs.path().join(who);
        let answer = istio_ca_client(
            &secure_addr.to_string(),
            secure::SERVER_NAME,
            &root_file,
            &token_file,
            &out,
            3600,
        )
        .unwrap();
        (answer, out)
    };
    let (server_cert, server_dir) =
        tokio::task::block_in_place(|| obtain("greeter", &server_token));
    assert_eq!(
        server_cert["identity"], "spiffe://cluster.local/ns/default/sa/greeter",
        "{server_cert}"
    );
    let (client_cert, client_dir) =
        tokio::task::block_in_place(|| obtain("greeter-client", &client_token));
    assert_eq!(client_cert["identity"], CLIENT_IDENTITY, "{client_cert}");

    tokio::task::block_in_place(|| {
        let server_bootstrap = bootstrap(
            &xds_uri,
            &server_dir,
            "greeter",
            "greeter",
            SERVER_IP,
            "greeter",
        );
        let _server =
            GrpcXdsServer::start(&server_bootstrap, "greeter", &format!("{SERVER_IP}:{port}"))
                .expect("start the xDS gRPC server");
        let client_bootstrap = bootstrap(
            &xds_uri,
            &client_dir,
            "greeter-client",
            "greeter-client",
            "127.0.0.3",
            "greeter-client",
        );
        let mut client = XdsClient::start(&client_bootstrap).expect("start the gRPC xDS client");

        // 1. PERMISSIVE (no policy): the proxyless server serves plaintext.
        until(&mut client, WHO, ChannelCreds::Insecure, "greeter");
        until(&mut client, PEER, ChannelCreds::Xds, "plaintext");

        // 2. STRICT: plaintext is refused; without ISTIO_MUTUAL the client does not use
        // mTLS even with xDS credentials (no auto-mTLS for proxyless clients, as in Istio).
        write_config(mesh.path(), "peer-authentication.yaml", STRICT);
        until(&mut client, WHO, ChannelCreds::Insecure, "UNAVAILABLE");
        assert_refused(&mut client, WHO, ChannelCreds::Insecure, "UNAVAILABLE");
        assert_refused(&mut client, PEER, ChannelCreds::Xds, "UNAVAILABLE");

        // 3. ISTIO_MUTUAL: mTLS with the CA's certificates; the server sees the caller.
        write_config(mesh.path(), "destination-rule.yaml", ISTIO_MUTUAL);
        until(&mut client, PEER, ChannelCreds::Xds, CLIENT_IDENTITY);
        let tally = client.rpcs_of(TARGET, PEER, ChannelCreds::Xds, 20).unwrap();
        assert_eq!(tally.counts.get(CLIENT_IDENTITY), Some(&20), "{tally:?}");
        assert_refused(&mut client, WHO, ChannelCreds::Insecure, "UNAVAILABLE");
        assert_eq!(
            client
                .rpcs_of(TARGET, WHO, ChannelCreds::Xds, 3)
                .unwrap()
                .counts
                .get("greeter"),
            Some(&3),
            "no policy yet: every method works"
        );

        // 4. AuthorizationPolicy: Who is denied, Peer is allowed for the client.
        write_config(mesh.path(), "authorization.yaml", AUTHORIZATION);
        until(&mut client, WHO, ChannelCreds::Xds, "PERMISSION_DENIED");
        assert_refused(&mut client, WHO, ChannelCreds::Xds, "PERMISSION_DENIED");
        let tally = client.rpcs_of(TARGET, PEER, ChannelCreds::Xds, 5).unwrap();
        assert_eq!(tally.counts.get(CLIENT_IDENTITY), Some(&5), "{tally:?}");
    });
    eprintln!(
        "proxyless_security: {:.1} s",
        started.elapsed().as_secs_f64()
    );
}
