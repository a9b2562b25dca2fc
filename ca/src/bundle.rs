//! The CA's signing bundle in Istio's layouts, and a new self-signed root.
//!
//! Both Secrets use the same file names (`ca-cert.pem`, `ca-key.pem`, `cert-chain.pem`,
//! `root-cert.pem`):
//! - the self-signed `istio-ca-secret`: `ca-cert.pem` is the root that signs; the other
//!   files are empty or repeat it;
//! - a plugged-in `cacerts`: `ca-cert.pem`/`ca-key.pem` are an intermediate CA,
//!   `cert-chain.pem` its chain up to (and usually including) the root, and
//!   `root-cert.pem` the root(s) workloads trust — during a root rotation, old and new.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SerialNumber,
};
use rustls_pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::pem::{self, PemError};

/// File (and Secret key) names, as Istio's CA reads them.
pub const CA_CERT: &str = "ca-cert.pem";
pub const CA_KEY: &str = "ca-key.pem";
pub const CERT_CHAIN: &str = "cert-chain.pem";
pub const ROOT_CERT: &str = "root-cert.pem";
/// Istio's self-signed CA Secret and its type.
pub const SELF_SIGNED_SECRET: &str = "istio-ca-secret";
pub const SELF_SIGNED_SECRET_TYPE: &str = "istio.io/ca-root";
/// Istio's plugged-in CA Secret.
pub const PLUGGED_SECRET: &str = "cacerts";

/// The raw contents of a CA Secret or folder (missing files are empty).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct CaFiles {
    pub ca_cert: Vec<u8>,
    pub ca_key: Vec<u8>,
    pub cert_chain: Vec<u8>,
    pub root_cert: Vec<u8>,
}

impl std::fmt::Debug for CaFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaFiles")
            .field("ca_cert_bytes", &self.ca_cert.len())
            .field("ca_key", &"<redacted>")
            .field("cert_chain_bytes", &self.cert_chain.len())
            .field("root_cert_bytes", &self.root_cert.len())
            .finish()
    }
}

impl CaFiles {
    /// From a lookup by Istio's file name (a Secret's `data`, a mounted folder).
    pub fn from_lookup(mut get: impl FnMut(&str) -> Option<Vec<u8>>) -> Self {
        CaFiles {
            ca_cert: get(CA_CERT).unwrap_or_default(),
            ca_key: get(CA_KEY).unwrap_or_default(),
            cert_chain: get(CERT_CHAIN).unwrap_or_default(),
            root_cert: get(ROOT_CERT).unwrap_or_default(),
        }
    }

    /// Whether this holds a signing key at all (Istio treats a `cacerts` without
    /// `ca-key.pem` as "roots only", not as a signing CA).
    pub fn has_signing_key(&self) -> bool {
        !self.ca_key.iter().all(u8::is_ascii_whitespace)
    }

    /// The `istio-ca-secret` data Istio writes for a self-signed root: `ca-cert.pem`,
    /// `ca-key.pem`, `root-cert.pem` (the same root), empty `cert-chain.pem` and `key.pem`.
    pub fn self_signed_secret_data(&self) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([
            (CA_CERT.to_string(), self.ca_cert.clone()),
            (CA_KEY.to_string(), self.ca_key.clone()),
            (CERT_CHAIN.to_string(), Vec::new()),
            ("key.pem".to_string(), Vec::new()),
            (ROOT_CERT.to_string(), self.ca_cert.clone()),
        ])
    }
}

/// Why a CA bundle cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaError {
    #[error("{file}: {source}")]
    Pem {
        file: &'static str,
        #[source]
        source: PemError,
    },
    #[error("{file}: certificate {index} does not parse as X.509: {reason}")]
    Certificate {
        file: &'static str,
        index: usize,
        reason: String,
    },
    #[error("{CA_KEY}: not a usable signing key (ECDSA P-256/P-384 or RSA 2048-8192): {0}")]
    Key(String),
    #[error("{CA_KEY} does not belong to {CA_CERT} (their public keys differ)")]
    KeyMismatch,
    #[error("{CA_CERT} is not a CA certificate (basicConstraints CA:TRUE is required)")]
    NotCa,
    #[error("{CA_CERT} is not valid now (valid from {not_before} to {not_after}, unix seconds)")]
    NotValidNow { not_before: i64, not_after: i64 },
    #[error(
        "{CA_CERT} (issuer {issuer}) is not signed by any certificate of {CERT_CHAIN} or {ROOT_CERT}"
    )]
    Unchained { issuer: String },
    #[error("{ROOT_CERT} is empty and {CA_CERT} is not self-signed: give the root in {ROOT_CERT}")]
    NoRoot,
    #[error("cannot generate the CA: {0}")]
    Generate(String),
}

/// A verified signing bundle: the key and certificate that sign, the chain sent after
/// each leaf, and the roots workloads trust.
pub struct CaBundle {
    pub(crate) issuer: Issuer<'static, KeyPair>,
    pub(crate) signing_not_after: i64,
    /// When the first root expires (unix seconds).
    root_not_after: i64,
    /// One PEM per certificate of the chain between a leaf and the root bundle.
    chain: Vec<String>,
    /// The root bundle as one PEM string (several roots during a rotation).
    roots_pem: String,
    roots_der: Vec<CertificateDer<'static>>,
}

impl std::fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaBundle")
            .field("chain", &self.chain.len())
            .field("roots", &self.roots_der.len())
            .field("signing_not_after", &self.signing_not_after)
            .finish_non_exhaustive()
    }
}

pub(crate) fn unix(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

fn parse_all(file: &'static str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, CaError> {
    if pem.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    let certs = pem::certificates(pem).map_err(|source| CaError::Pem { file, source })?;
    for (index, der) in certs.iter().enumerate() {
        X509Certificate::from_der(der).map_err(|e| CaError::Certificate {
            file,
            index,
            reason: e.to_string(),
        })?;
    }
    Ok(certs)
}

fn parsed(der: &[u8]) -> X509Certificate<'_> {
    // Only called on certificates `parse_all` accepted.
    X509Certificate::from_der(der)
        .map(|(_, c)| c)
        .expect("checked by parse_all")
}

impl CaBundle {
    /// Verifies and loads a bundle: the key matches `ca-cert.pem`, which is a CA, valid
    /// at `now`, and signed by a certificate of the chain or the roots (or is a root).
    pub fn load(files: &CaFiles, now: SystemTime) -> Result<Self, CaError> {
        let ca_certs = parse_all(CA_CERT, &files.ca_cert)?;
        let ca_der = ca_certs.first().cloned().ok_or(CaError::Pem {
            file: CA_CERT,
            source: PemError::NoCertificate,
        })?;
        let chain_der = parse_all(CERT_CHAIN, &files.cert_chain)?;
        let mut roots_der = parse_all(ROOT_CERT, &files.root_cert)?;
        let pkcs8 = pem::private_key_pkcs8(&files.ca_key).map_err(|source| CaError::Pem {
            file: CA_KEY,
            source,
        })?;
        let key = KeyPair::try_from(pkcs8.as_slice()).map_err(|e| CaError::Key(e.to_string()))?;

        let ca = parsed(&ca_der);
        if key.public_key_raw() != ca.public_key().subject_public_key.data.as_ref() {
            return Err(CaError::KeyMismatch);
        }
        if !ca.is_ca() {
            return Err(CaError::NotCa);
        }
        let validity = ca.validity();
        let (not_before, not_after) = (
            validity.not_before.timestamp(),
            validity.not_after.timestamp(),
        );
        if !(not_before..not_after).contains(&unix(now)) {
            return Err(CaError::NotValidNow {
                not_before,
                not_after,
            });
        }
        let self_signed = ca.subject() == ca.issuer() && ca.verify_signature(None).is_ok();
        if roots_der.is_empty() {
            if !self_signed {
                return Err(CaError::NoRoot);
            }
            roots_der.push(ca_der.clone());
        }
        let is_root = roots_der.iter().any(|r| r.as_ref() == ca_der.as_ref());
        if !is_root {
            let signed_by_known = chain_der.iter().chain(&roots_der).any(|candidate| {
                let c = parsed(candidate);
                c.subject() == ca.issuer() && ca.verify_signature(Some(c.public_key())).is_ok()
            });
            if !signed_by_known {
                return Err(CaError::Unchained {
                    issuer: ca.issuer().to_string(),
                });
            }
        }
        // What follows a leaf: the given chain; or, for an intermediate given without
        // one, the intermediate itself; a self-signed root adds nothing (it ends the
        // response as the root bundle).
        let chain: Vec<String> = if !chain_der.is_empty() {
            chain_der.iter().map(|c| pem::certificate_pem(c)).collect()
        } else if is_root {
            Vec::new()
        } else {
            vec![pem::certificate_pem(&ca_der)]
        };
        let roots_pem: String = roots_der.iter().map(|c| pem::certificate_pem(c)).collect();
        let root_not_after = parsed(&roots_der[0]).validity().not_after.timestamp();
        let issuer = Issuer::from_ca_cert_der(&ca_der, key).map_err(|e| CaError::Certificate {
            file: CA_CERT,
            index: 0,
            reason: e.to_string(),
        })?;
        Ok(CaBundle {
            issuer,
            signing_not_after: not_after,
            root_not_after,
            chain,
            roots_pem,
            roots_der,
        })
    }

    /// The root bundle as PEM (`root-cert.pem` of `istio-ca-root-cert`).
    pub fn roots_pem(&self) -> &str {
        &self.roots_pem
    }

    /// The roots as DER (trust anchors for client certificates).
    pub fn roots_der(&self) -> &[CertificateDer<'static>] {
        &self.roots_der
    }

    /// The certificates sent between a leaf and the roots, one PEM each.
    pub fn chain(&self) -> &[String] {
        &self.chain
    }

    /// When the first root of the bundle expires (unix seconds).
    pub fn root_not_after(&self) -> i64 {
        self.root_not_after
    }

    /// When the signing certificate expires (unix seconds); issued certificates never
    /// outlive it.
    pub fn signing_not_after(&self) -> i64 {
        self.signing_not_after
    }
}

/// Certificates are dated this much before `now`, for clocks that run behind (Istio's
/// `ClockSkewGracePeriod`).
pub const CLOCK_SKEW_GRACE: Duration = Duration::from_secs(2 * 60);

pub(crate) fn offset(t: SystemTime) -> Result<time::OffsetDateTime, String> {
    time::OffsetDateTime::from_unix_timestamp(unix(t)).map_err(|e| e.to_string())
}

pub(crate) fn random_serial() -> SerialNumber {
    // 127 random bits, positive (RFC 5280: at most 20 octets, non-negative).
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

/// A new self-signed root (ECDSA P-256, organization `org`, valid for `ttl` from `now`),
/// as the files of `istio-ca-secret`. Istio's own self-signed root is RSA 2048 with
/// organization = trust domain and a ten-year lifetime; only the key type differs.
pub fn generate_self_signed(org: &str, ttl: Duration, now: SystemTime) -> Result<CaFiles, CaError> {
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
        .map_err(|e| CaError::Generate(e.to_string()))?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, org);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(random_serial());
    params.not_before = offset(now - CLOCK_SKEW_GRACE).map_err(CaError::Generate)?;
    params.not_after = offset(now + ttl).map_err(CaError::Generate)?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| CaError::Generate(e.to_string()))?;
    Ok(CaFiles {
        ca_cert: cert.pem().into_bytes(),
        ca_key: key.serialize_pem().into_bytes(),
        cert_chain: Vec::new(),
        root_cert: cert.pem().into_bytes(),
    })
}
