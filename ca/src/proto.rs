//! `istio.v1.auth.IstioCertificateService` (istio/api `security/v1alpha1/ca.proto`):
//! the two messages, written out with prost (three fields do not warrant a code
//! generator), and the method's gRPC path.

/// `/istio.v1.auth.IstioCertificateService/CreateCertificate`.
pub const CREATE_CERTIFICATE_PATH: &str =
    "/istio.v1.auth.IstioCertificateService/CreateCertificate";

#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateRequest {
    /// PEM-encoded certificate request.
    #[prost(string, tag = "1")]
    pub csr: String,
    /// Requested validity, in seconds; not positive: the CA's default.
    #[prost(int64, tag = "3")]
    pub validity_duration: i64,
    /// Opaque metadata (Istio: impersonation, cert signer); Pilotfish reads none of it.
    #[prost(message, optional, tag = "4")]
    pub metadata: Option<prost_types::Struct>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct IstioCertificateResponse {
    /// The leaf first, the root (bundle) last.
    #[prost(string, repeated, tag = "1")]
    pub cert_chain: Vec<String>,
}
