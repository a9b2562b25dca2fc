//! The secure port (15012) of a `pilotfish-xds` process, with tokens from the test API
//! server: Istio's CA refuses callers without credentials, with a foreign, expired or
//! wrong-audience token, and a CSR for another identity; it issues a chain whose leaf
//! carries exactly the caller's SPIFFE identity for the requested lifetime, and renews
//! with the certificate alone. ADS on the same port refuses an unauthenticated stream
//! and a node claiming another namespace, serves an authenticated one (token or
//! certificate), and gRPC's own xDS client (Python) routes RPCs through it with the
//! certificate the CA issued.

use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use pilotfish_ca::bundle;
use pilotfish_ca::pem;
use pilotfish_testkit::grpc::{XdsClient, istio_ca_client};
use pilotfish_testkit::mesh::reviews_target;
use pilotfish_testkit::process::XdsServer;
use pilotfish_testkit::secure::{self, channel, create_certificate, key_and_csr, with_token};
use serde_json::json;
use tokio_stream::StreamExt;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::apiserver_tokens::{token, workload};
use crate::support::Cluster;
use crate::xds_grpc::{assert_routed_80_20, reviews_backends, write_reviews_mesh};

const IDENTITY: &str = "spiffe://cluster.local/ns/default/sa/reviews-client";
const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

fn node(namespace: &str) -> Node {
    let s = |v: &str| Value {
        kind: Some(Kind::StringValue(v.into())),
    };
    Node {
        id: format!("sidecar~127.0.0.1~client.{namespace}~{namespace}.svc.cluster.local"),
        metadata: Some(Struct {
            fields: [
                ("NAMESPACE".to_string(), s(namespace)),
                ("GENERATOR".to_string(), s("grpc")),
            ]
            .into(),
        }),
        ..Default::default()
    }
}

/// Opens an ADS stream claiming `namespace` and returns its first response's type, or
/// the status the stream ended with.
async fn ads(
    ch: tonic::transport::Channel,
    token: Option<&str>,
    namespace: &str,
) -> Result<String, tonic::Status> {
    let first = DiscoveryRequest {
        node: Some(node(namespace)),
        type_url: LISTENER_TYPE.into(),
        resource_names: vec!["reviews.default.svc.cluster.local:9080".into()],
        ..Default::default()
    };
    let requests = tokio_stream::iter(vec![first]).chain(tokio_stream::pending());
    let mut client = AggregatedDiscoveryServiceClient::new(ch);
    let mut responses = client
        .stream_aggregated_resources(with_token(requests, token))
        .await?
        .into_inner();
    let response = tokio::time::timeout(Duration::from_secs(20), responses.message())
        .await
        .map_err(|_| tonic::Status::deadline_exceeded("no response within 20 s"))??
        .ok_or_else(|| tonic::Status::aborted("stream ended without a response"))?;
    Ok(response.type_url)
}

fn leaf_of(chain: &[String]) -> Vec<u8> {
    pem::certificates(chain[0].as_bytes()).unwrap()[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_and_ads_on_the_secure_port() {
    let cluster = Cluster::start().await;
    let client = cluster.client();
    let pod = workload(&client, "default", "reviews-client", "client").await;
    let token_for = |audiences: &'static [&'static str]| {
        let (client, pod) = (client.clone(), pod.clone());
        async move { token(&client, "default", "reviews-client", audiences, Some(&pod)).await }
    };
    let good = token_for(&["istio-ca"]).await;

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
    let root = String::from_utf8(ca.ca_cert.clone()).unwrap();
    let (_backends, ports) = reviews_backends();
    let mesh_dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(mesh_dir.path(), &ports, (80, 20));
    let kubeconfig = cluster.server.kubeconfig_path();
    let (server, secure_addr) = tokio::task::block_in_place(|| {
        XdsServer::standalone_secure("xds-secure", mesh_dir.path(), ca_dir.path(), &kubeconfig)
    })
    .unwrap();
    let ch = channel(secure_addr, &root, None).await.unwrap();

    // --- CreateCertificate refusals.
    let (key, csr) = key_and_csr(&[]);
    let none = create_certificate(ch.clone(), None, &csr, 0)
        .await
        .unwrap_err();
    assert_eq!(none.code(), tonic::Code::Unauthenticated, "{none:?}");
    assert!(
        none.message().contains("audience istio-ca"),
        "{}",
        none.message()
    );
    let wrong_audience = token_for(&["vault"]).await;
    let refused = create_certificate(ch.clone(), Some(&wrong_audience), &csr, 0)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(
        refused
            .message()
            .contains("is invalid for the target audiences"),
        "{}",
        refused.message()
    );
    let other = Cluster::start().await;
    workload(&other.client(), "default", "reviews-client", "client").await;
    let foreign = token(
        &other.client(),
        "default",
        "reviews-client",
        &["istio-ca"],
        None,
    )
    .await;
    let refused = create_certificate(ch.clone(), Some(&foreign), &csr, 0)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    assert!(
        refused.message().contains("signature"),
        "{}",
        refused.message()
    );
    let (_, other_csr) = key_and_csr(&["spiffe://cluster.local/ns/kube-system/sa/admin"]);
    let denied = create_certificate(ch.clone(), Some(&good), &other_csr, 0)
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(denied.message().contains(IDENTITY), "{}", denied.message());

    // --- A certificate for exactly the caller's identity, for the lifetime asked.
    let issued = create_certificate(ch.clone(), Some(&good), &csr, 3600)
        .await
        .unwrap();
    assert_eq!(
        issued.cert_chain.last().unwrap(),
        &root,
        "the root ends the chain"
    );
    let leaf_der = leaf_of(&issued.cert_chain);
    assert_eq!(pem::uri_sans(&leaf_der), [IDENTITY]);
    let (_, leaf) = X509Certificate::from_der(&leaf_der).unwrap();
    let validity = leaf.validity();
    assert_eq!(
        validity.not_after.timestamp() - validity.not_before.timestamp(),
        3600 + 120
    );
    let too_long = create_certificate(ch.clone(), Some(&good), &csr, 91 * 86400)
        .await
        .unwrap_err();
    assert_eq!(too_long.code(), tonic::Code::InvalidArgument);

    // --- Renewal with the certificate alone.
    let chain_pem = issued.cert_chain[..issued.cert_chain.len() - 1].concat();
    let with_cert = channel(secure_addr, &root, Some((&chain_pem, &key)))
        .await
        .unwrap();
    let (_, renewal_csr) = key_and_csr(&[IDENTITY]);
    let renewed = create_certificate(with_cert.clone(), None, &renewal_csr, 0)
        .await
        .unwrap();
    assert_eq!(pem::uri_sans(&leaf_of(&renewed.cert_chain)), [IDENTITY]);

    // --- ADS: refused without credentials and for another namespace; served otherwise.
    let unauthenticated = ads(ch.clone(), None, "default").await.unwrap_err();
    assert_eq!(
        unauthenticated.code(),
        tonic::Code::Unauthenticated,
        "{unauthenticated:?}"
    );
    let other_ns = ads(ch.clone(), Some(&good), "kube-system")
        .await
        .unwrap_err();
    assert_eq!(
        other_ns.code(),
        tonic::Code::PermissionDenied,
        "{other_ns:?}"
    );
    assert!(
        other_ns.message().contains("kube-system"),
        "{}",
        other_ns.message()
    );
    assert_eq!(
        ads(ch.clone(), Some(&good), "default").await.unwrap(),
        LISTENER_TYPE
    );
    assert_eq!(
        ads(with_cert.clone(), None, "default").await.unwrap(),
        LISTENER_TYPE
    );
    let refused_streams = tokio::task::block_in_place(|| {
        server.metric(
            "pilotfish_xds_streams_refused_total",
            "reason=\"unauthorized_node\"",
        )
    })
    .unwrap();
    assert_eq!(refused_streams, 1.0);

    // --- gRPC's Python client obtains a certificate with a token (ssl channel
    // credentials + call credentials), then gRPC's own xDS client uses those files over
    // the secure port.
    let certs = tempfile::tempdir().unwrap();
    let token_file = certs.path().join("istio-token");
    std::fs::write(&token_file, token_for(&["istio-ca"]).await).unwrap();
    let root_file = certs.path().join("mesh-root.pem");
    std::fs::write(&root_file, &root).unwrap();
    let out = certs.path().join("workload");
    let obtained = tokio::task::block_in_place(|| {
        istio_ca_client(
            &secure_addr.to_string(),
            secure::SERVER_NAME,
            &root_file,
            &token_file,
            &out,
            7200,
        )
    })
    .unwrap();
    assert_eq!(obtained["identity"], IDENTITY, "{obtained}");
    let file = |name: &str| out.join(name).display().to_string();
    let bootstrap = json!({
        "xds_servers": [{
            "server_uri": format!("{}:{}", secure::SERVER_NAME, secure_addr.port()),
            "channel_creds": [{"type": "tls", "config": {
                "ca_certificate_file": file("root-cert.pem"),
                "certificate_file": file("cert-chain.pem"),
                "private_key_file": file("key.pem"),
            }}],
            "server_features": ["xds_v3"]
        }],
        "node": {
            "id": "sidecar~127.0.0.1~proxyless.default~default.svc.cluster.local",
            "metadata": {"GENERATOR": "grpc", "NAMESPACE": "default"}
        }
    });
    tokio::task::block_in_place(|| {
        let mut grpc = XdsClient::start(&bootstrap).expect("start the gRPC xDS client");
        assert_routed_80_20(&grpc.rpcs(&reviews_target(), 200, &[]).unwrap());
        let adsz = server.admin_json("/debug/adsz").unwrap();
        let identities: Vec<&str> = adsz["clients"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["identity"].as_str())
            .collect();
        assert!(identities.contains(&IDENTITY), "{adsz}");
    });
    // --- Expiry: a fresh token an hour and a minute later (the API server's clock).
    let fresh = token_for(&["istio-ca"]).await;
    cluster
        .server
        .advance_token_clock(Duration::from_secs(3600 + 61));
    let expired = create_certificate(ch.clone(), Some(&fresh), &csr, 0)
        .await
        .unwrap_err();
    assert_eq!(expired.code(), tonic::Code::Unauthenticated);
    assert!(
        expired.message().contains("has expired"),
        "{}",
        expired.message()
    );
}
