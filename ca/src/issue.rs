//! Issuing certificates from a [`CaBundle`].
//!
//! Workload certificates follow Istio's CA: the CSR's signature is checked and its public
//! key used, and the certificate gets the caller's authenticated identity as its one URI
//! SAN, an empty subject (so the SAN is critical), key usage digital signature + key
//! encipherment, extended key usage server and client auth. The CSR's SANs are
//! **checked, then replaced**: a CSR naming another SPIFFE identity (another namespace or
//! service account, in any trust domain) is refused — Istio silently ignores it; a clear
//! refusal tells the operator which workload asked for what — and everything else in it
//! (DNS names, other URIs, the subject) is ignored. The lifetime is the requested one (default when not positive),
//! refused above the maximum, and never beyond the signing certificate.

use std::time::{Duration, SystemTime};

use pilotfish_mesh::model::SpiffeId;
use rcgen::{
    CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, PKCS_RSA_SHA256, PublicKeyData, SanType,
    SignatureAlgorithm,
};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

use crate::bundle::{CLOCK_SKEW_GRACE, CaBundle, random_serial, unix};

/// Lifetimes of workload certificates (Istio: `DEFAULT_WORKLOAD_CERT_TTL` 24 h,
/// `MAX_WORKLOAD_CERT_TTL` 90 days).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IssuePolicy {
    pub default_ttl: Duration,
    pub max_ttl: Duration,
}

impl Default for IssuePolicy {
    fn default() -> Self {
        IssuePolicy {
            default_ttl: Duration::from_secs(24 * 3600),
            max_ttl: Duration::from_secs(90 * 24 * 3600),
        }
    }
}

/// Why a certificate was not issued. [`IssueError::is_caller_error`] tells the caller's
/// mistakes (`INVALID_ARGUMENT`) from the CA's (`INTERNAL`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    #[error("the CSR is not a PEM CERTIFICATE REQUEST: {0}")]
    CsrPem(String),
    #[error("the CSR does not parse: {0}")]
    CsrParse(String),
    #[error("the CSR's signature does not verify with its own public key")]
    CsrSignature,
    #[error(
        "the CSR's public key is {0}; the CA signs RSA (2048 to 8192 bits) and ECDSA P-256/P-384 keys"
    )]
    UnsupportedKey(String),
    #[error(
        "the CSR asks for identity {requested}, but the caller authenticated as {caller}; a workload can only obtain its own identity"
    )]
    OtherIdentity { requested: String, caller: String },
    #[error("requested TTL {requested}s is greater than the max allowed TTL {max}s")]
    TtlTooLong { requested: u64, max: u64 },
    #[error("the signing certificate expired (at unix {0}); rotate the CA")]
    SigningCertExpired(i64),
    #[error("cannot build the certificate: {0}")]
    Generate(String),
}

impl IssueError {
    pub fn is_caller_error(&self) -> bool {
        !matches!(
            self,
            IssueError::SigningCertExpired(_) | IssueError::Generate(_)
        )
    }
}

/// An issued certificate and what a client needs with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    /// The leaf, PEM.
    pub leaf_pem: String,
    /// `IstioCertificateResponse.cert_chain`: the leaf, each chain certificate, and the
    /// root bundle last (one string, as Istio sends it).
    pub response_chain: Vec<String>,
    /// Validity, unix seconds.
    pub not_before: i64,
    pub not_after: i64,
}

/// A CSR's public key, in the form rcgen writes into a certificate.
struct CsrKey {
    raw: Vec<u8>,
    alg: &'static SignatureAlgorithm,
}

impl PublicKeyData for CsrKey {
    fn der_bytes(&self) -> &[u8] {
        &self.raw
    }
    fn algorithm(&self) -> &'static SignatureAlgorithm {
        self.alg
    }
}

/// Parses and verifies a PEM CSR; returns its public key and the SPIFFE ids its SANs
/// name.
fn csr_key(csr_pem: &str) -> Result<(CsrKey, Vec<SpiffeId>), IssueError> {
    use rustls_pki_types::CertificateSigningRequestDer;
    use rustls_pki_types::pem::PemObject;
    let der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
        .map_err(|e| IssueError::CsrPem(e.to_string()))?;
    let (_, csr) = X509CertificationRequest::from_der(der.as_ref())
        .map_err(|e| IssueError::CsrParse(e.to_string()))?;
    let spki = &csr.certification_request_info.subject_pki;
    let algorithm = &spki.algorithm;
    let alg: &'static SignatureAlgorithm = if algorithm.algorithm == OID_PKCS1_RSAENCRYPTION {
        let bits = match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => rsa.key_size(),
            _ => 0,
        };
        if !(2048..=8192).contains(&bits) {
            return Err(IssueError::UnsupportedKey(format!("RSA of {bits} bits")));
        }
        &PKCS_RSA_SHA256
    } else if algorithm.algorithm == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = algorithm.parameters.as_ref().and_then(|p| p.as_oid().ok());
        match curve {
            Some(c) if c == OID_EC_P256 => &PKCS_ECDSA_P256_SHA256,
            Some(c) if c == OID_NIST_EC_P384 => &PKCS_ECDSA_P384_SHA384,
            other => {
                return Err(IssueError::UnsupportedKey(format!(
                    "EC on curve {}",
                    other.map_or_else(|| "(none)".to_string(), |c| c.to_id_string())
                )));
            }
        }
    } else {
        return Err(IssueError::UnsupportedKey(
            algorithm.algorithm.to_id_string(),
        ));
    };
    // After the key checks, so a weak key is named as such (ring refuses to verify
    // signatures of RSA keys under 2048 bits).
    csr.verify_signature()
        .map_err(|_| IssueError::CsrSignature)?;
    let requested = csr
        .requested_extensions()
        .into_iter()
        .flatten()
        .filter_map(|ext| match ext {
            ParsedExtension::SubjectAlternativeName(san) => Some(san),
            _ => None,
        })
        .flat_map(|san| san.general_names.iter())
        .filter_map(|name| match name {
            GeneralName::URI(uri) => uri.parse::<SpiffeId>().ok(),
            _ => None,
        })
        .collect();
    Ok((
        CsrKey {
            raw: spki.subject_public_key.data.to_vec(),
            alg,
        },
        requested,
    ))
}

/// The validity window for a certificate of `ttl` from `now`, clamped to the signer.
fn window(bundle: &CaBundle, ttl: Duration, now: SystemTime) -> Result<(i64, i64), IssueError> {
    if unix(now) >= bundle.signing_not_after {
        return Err(IssueError::SigningCertExpired(bundle.signing_not_after));
    }
    let not_before = unix(now - CLOCK_SKEW_GRACE);
    let not_after = unix(now + ttl).min(bundle.signing_not_after);
    Ok((not_before, not_after))
}

fn leaf_params(
    sans: Vec<SanType>,
    not_before: i64,
    not_after: i64,
) -> Result<CertificateParams, IssueError> {
    let to_time = |secs: i64| {
        time::OffsetDateTime::from_unix_timestamp(secs)
            .map_err(|e| IssueError::Generate(e.to_string()))
    };
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = sans;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.serial_number = Some(random_serial());
    params.use_authority_key_identifier_extension = true;
    params.not_before = to_time(not_before)?;
    params.not_after = to_time(not_after)?;
    Ok(params)
}

fn response_chain(bundle: &CaBundle, leaf_pem: &str) -> Vec<String> {
    std::iter::once(leaf_pem.to_string())
        .chain(bundle.chain().iter().cloned())
        .chain(std::iter::once(bundle.roots_pem().to_string()))
        .collect()
}

/// Signs `csr_pem` for `identity`. `requested_ttl_seconds` is the request's
/// `validity_duration`: not positive means the default.
pub fn issue_workload(
    bundle: &CaBundle,
    csr_pem: &str,
    identity: &SpiffeId,
    requested_ttl_seconds: i64,
    policy: &IssuePolicy,
    now: SystemTime,
) -> Result<Issued, IssueError> {
    let (key, requested) = csr_key(csr_pem)?;
    if let Some(other) = requested.iter().find(|r| {
        r.namespace != identity.namespace || r.service_account != identity.service_account
    }) {
        return Err(IssueError::OtherIdentity {
            requested: other.to_string(),
            caller: identity.to_string(),
        });
    }
    let ttl = if requested_ttl_seconds <= 0 {
        policy.default_ttl
    } else {
        let requested = Duration::from_secs(requested_ttl_seconds as u64);
        if requested > policy.max_ttl {
            return Err(IssueError::TtlTooLong {
                requested: requested.as_secs(),
                max: policy.max_ttl.as_secs(),
            });
        }
        requested
    };
    let (not_before, not_after) = window(bundle, ttl, now)?;
    let uri = identity
        .to_string()
        .try_into()
        .map_err(|e: rcgen::Error| IssueError::Generate(e.to_string()))?;
    let params = leaf_params(vec![SanType::URI(uri)], not_before, not_after)?;
    let cert = params
        .signed_by(&key, &bundle.issuer)
        .map_err(|e| IssueError::Generate(e.to_string()))?;
    let leaf_pem = cert.pem();
    Ok(Issued {
        response_chain: response_chain(bundle, &leaf_pem),
        leaf_pem,
        not_before,
        not_after,
    })
}

/// A serving certificate with a new ECDSA P-256 key, for `dns_names`.
#[derive(Clone, PartialEq, Eq)]
pub struct ServingCert {
    /// The leaf followed by the chain (not the roots), PEM.
    pub chain_pem: String,
    /// PKCS#8 PEM.
    pub key_pem: String,
    pub not_after: i64,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

/// Issues the secure xDS port's own certificate (DNS SANs, as istiod issues its own).
pub fn issue_serving(
    bundle: &CaBundle,
    dns_names: &[String],
    ttl: Duration,
    now: SystemTime,
) -> Result<ServingCert, IssueError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|e| IssueError::Generate(e.to_string()))?;
    let sans = dns_names
        .iter()
        .map(|n| {
            n.clone()
                .try_into()
                .map(SanType::DnsName)
                .map_err(|e: rcgen::Error| IssueError::Generate(format!("DNS name {n:?}: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (not_before, not_after) = window(bundle, ttl, now)?;
    let params = leaf_params(sans, not_before, not_after)?;
    let cert = params
        .signed_by(&key, &bundle.issuer)
        .map_err(|e| IssueError::Generate(e.to_string()))?;
    let mut chain_pem = cert.pem();
    for c in bundle.chain() {
        chain_pem.push_str(c);
    }
    Ok(ServingCert {
        chain_pem,
        key_pem: key.serialize_pem(),
        not_after,
    })
}
