//! Clients of the secure port (15012) for tests: a TLS channel that trusts the mesh root
//! (optionally presenting a mesh certificate), Istio's `CreateCertificate` with or
//! without a service-account token, and a CSR with a fresh key. (gRPC's Python client
//! obtains certificate files with `grpc::istio_ca_client`.)

use std::net::SocketAddr;
use std::time::Duration;

use pilotfish_ca::proto::{
    CREATE_CERTIFICATE_PATH, IstioCertificateRequest, IstioCertificateResponse,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// Name the secure port's serving certificate carries in tests (`--serving-dns-names`).
pub const SERVER_NAME: &str = "localhost";

/// A TLS channel to `addr` verifying the server against `root_pem` as [`SERVER_NAME`],
/// presenting `identity` (certificate chain PEM, key PEM) when given.
pub async fn channel(
    addr: SocketAddr,
    root_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(root_pem))
        .domain_name(SERVER_NAME);
    if let Some((chain, key)) = identity {
        tls = tls.identity(Identity::from_pem(chain, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .expect("valid URI")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(20))
        .connect()
        .await
}

/// A request carrying `authorization: Bearer <token>` when a token is given.
pub fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ASCII token"),
        );
    }
    request
}

/// `CreateCertificate` for `csr_pem`, asking for `ttl_seconds` (0: the CA's default).
pub async fn create_certificate(
    channel: Channel,
    token: Option<&str>,
    csr_pem: &str,
    ttl_seconds: i64,
) -> Result<IstioCertificateResponse, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let request = with_token(
        IstioCertificateRequest {
            csr: csr_pem.to_string(),
            validity_duration: ttl_seconds,
            metadata: None,
        },
        token,
    );
    grpc.unary(
        request,
        http::uri::PathAndQuery::from_static(CREATE_CERTIFICATE_PATH),
        tonic_prost::ProstCodec::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

/// A new ECDSA P-256 key (PKCS#8 PEM) and a CSR for it naming `uri_sans`.
pub fn key_and_csr(uri_sans: &[&str]) -> (String, String) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("generate key");
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.subject_alt_names = uri_sans
        .iter()
        .map(|s| rcgen::SanType::URI((*s).try_into().expect("URI SAN")))
        .collect();
    let csr = params
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .expect("serialize CSR");
    (key.serialize_pem(), csr)
}
