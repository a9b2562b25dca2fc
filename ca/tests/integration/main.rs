//! The CA's behaviour end to end on bytes: bundles as Istio lays them out, workload
//! certificates that carry exactly the caller's identity, lifetimes, and refusals.

use std::time::{Duration, SystemTime};

use pilotfish_ca::bundle::{self, CaFiles};
use pilotfish_ca::issue::{self, IssueError, IssuePolicy};
use pilotfish_ca::{CaBundle, CaError, pem};
use pilotfish_mesh::model::SpiffeId;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ECDSA_P384_SHA384, SanType,
};
use x509_parser::prelude::{FromDer, X509Certificate};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

fn now() -> SystemTime {
    SystemTime::now()
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn self_signed() -> (CaFiles, CaBundle) {
    let files = bundle::generate_self_signed("cluster.local", 3650 * DAY, now()).unwrap();
    let ca = CaBundle::load(&files, now()).unwrap();
    (files, ca)
}

/// A CSR of a new key asking for `sans` (what a caller controls).
fn csr(alg: &'static rcgen::SignatureAlgorithm, sans: &[&str]) -> String {
    let key = KeyPair::generate_for(alg).unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans
        .iter()
        .map(|s| SanType::URI((*s).try_into().unwrap()))
        .collect();
    params.serialize_request(&key).unwrap().pem().unwrap()
}

fn leaf(issued: &issue::Issued) -> Vec<u8> {
    pem::certificates(issued.leaf_pem.as_bytes()).unwrap()[0].to_vec()
}

fn reviews() -> SpiffeId {
    SpiffeId::new("cluster.local", "bookinfo", "reviews")
}

#[test]
fn self_signed_bundle_is_its_own_root() {
    let (files, ca) = self_signed();
    assert!(ca.chain().is_empty());
    assert_eq!(ca.roots_der().len(), 1);
    assert_eq!(ca.roots_pem().as_bytes(), files.ca_cert.as_slice());
    let data = files.self_signed_secret_data();
    assert_eq!(data["root-cert.pem"], files.ca_cert);
    assert!(data["cert-chain.pem"].is_empty());
    let der = pem::certificates(&files.ca_cert).unwrap();
    let (_, root) = X509Certificate::from_der(&der[0]).unwrap();
    assert!(root.is_ca());
    assert_eq!(root.subject().to_string(), "O=cluster.local");
}

#[test]
fn workload_certificate_carries_exactly_the_callers_identity() {
    let (_, ca) = self_signed();
    // The CSR names the caller's own identity (as istio-agent's do) plus a DNS name and a
    // common name: the certificate carries the identity alone.
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = CertificateParams::new(vec!["reviews.bookinfo.svc".to_string()]).unwrap();
    params.subject_alt_names.push(SanType::URI(
        "spiffe://cluster.local/ns/bookinfo/sa/reviews"
            .try_into()
            .unwrap(),
    ));
    params.distinguished_name.push(DnType::CommonName, "admin");
    let request = params.serialize_request(&key).unwrap().pem().unwrap();
    let issued =
        issue::issue_workload(&ca, &request, &reviews(), 0, &IssuePolicy::default(), now())
            .unwrap();
    let der = leaf(&issued);
    assert_eq!(
        pem::uri_sans(&der),
        ["spiffe://cluster.local/ns/bookinfo/sa/reviews"]
    );
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    assert!(
        cert.subject().iter().next().is_none(),
        "empty subject: {}",
        cert.subject()
    );
    let san = cert.subject_alternative_name().unwrap().unwrap();
    assert!(san.critical, "SAN is critical with an empty subject");
    assert_eq!(san.value.general_names.len(), 1, "no DNS name from the CSR");
    assert!(!cert.is_ca());
    let eku = cert.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    // Signed by the root, which ends the response.
    let root = pem::certificates(ca.roots_pem().as_bytes()).unwrap();
    let (_, root) = X509Certificate::from_der(&root[0]).unwrap();
    cert.verify_signature(Some(root.public_key())).unwrap();
    assert_eq!(issued.response_chain.len(), 2);
    assert_eq!(issued.response_chain[0], issued.leaf_pem);
    assert_eq!(issued.response_chain[1], ca.roots_pem());
    // A CSR without SANs (what a plain client sends) gets the identity too.
    let bare = issue::issue_workload(
        &ca,
        &csr(&PKCS_ECDSA_P256_SHA256, &[]),
        &reviews(),
        0,
        &IssuePolicy::default(),
        now(),
    )
    .unwrap();
    assert_eq!(
        pem::uri_sans(&leaf(&bare)),
        ["spiffe://cluster.local/ns/bookinfo/sa/reviews"]
    );
}

#[test]
fn a_csr_for_another_identity_is_refused() {
    let (_, ca) = self_signed();
    for request in [
        fixture("csr-rsa2048-other-identity.pem"),
        csr(
            &PKCS_ECDSA_P256_SHA256,
            &[
                "spiffe://cluster.local/ns/bookinfo/sa/reviews",
                "spiffe://cluster.local/ns/bookinfo/sa/ratings",
            ],
        ),
        // Another account is another workload, whatever the trust domain.
        csr(
            &PKCS_ECDSA_P256_SHA256,
            &["spiffe://other.domain/ns/bookinfo/sa/admin"],
        ),
    ] {
        let err =
            issue::issue_workload(&ca, &request, &reviews(), 0, &IssuePolicy::default(), now())
                .unwrap_err();
        assert!(matches!(err, IssueError::OtherIdentity { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("spiffe://cluster.local/ns/bookinfo/sa/reviews")
        );
        assert!(err.is_caller_error());
    }
    // The same namespace and account under another trust domain (an alias) is the same
    // workload: issued, in this CA's trust domain.
    let alias = csr(
        &PKCS_ECDSA_P256_SHA256,
        &["spiffe://old.domain/ns/bookinfo/sa/reviews"],
    );
    let issued =
        issue::issue_workload(&ca, &alias, &reviews(), 0, &IssuePolicy::default(), now()).unwrap();
    assert_eq!(
        pem::uri_sans(&leaf(&issued)),
        ["spiffe://cluster.local/ns/bookinfo/sa/reviews"]
    );
}

#[test]
fn lifetimes_default_requested_refused_and_clamped() {
    let (_, ca) = self_signed();
    let policy = IssuePolicy::default();
    let t = now();
    let request = csr(&PKCS_ECDSA_P384_SHA384, &[]);
    let default = issue::issue_workload(&ca, &request, &reviews(), 0, &policy, t).unwrap();
    assert_eq!(default.not_after - unix(t), 24 * 3600, "default 24 h");
    assert_eq!(
        unix(t) - default.not_before,
        120,
        "backdated by the clock skew grace"
    );
    let hour = issue::issue_workload(&ca, &request, &reviews(), 3600, &policy, t).unwrap();
    let hour_der = leaf(&hour);
    let (_, cert) = X509Certificate::from_der(&hour_der).unwrap();
    assert_eq!(cert.validity().not_after.timestamp() - unix(t), 3600);
    assert_eq!(
        issue::issue_workload(&ca, &request, &reviews(), 91 * 24 * 3600, &policy, t),
        Err(IssueError::TtlTooLong {
            requested: 91 * 24 * 3600,
            max: 90 * 24 * 3600
        })
    );
    // A root about to expire: certificates end with it; an expired one issues nothing.
    let short = bundle::generate_self_signed("cluster.local", Duration::from_secs(600), t).unwrap();
    let short = CaBundle::load(&short, t).unwrap();
    let clamped = issue::issue_workload(&short, &request, &reviews(), 3600, &policy, t).unwrap();
    assert_eq!(clamped.not_after, short.signing_not_after());
    assert!(matches!(
        issue::issue_workload(
            &short,
            &request,
            &reviews(),
            0,
            &policy,
            t + Duration::from_secs(601)
        ),
        Err(IssueError::SigningCertExpired(_))
    ));
}

#[test]
fn bad_csrs_are_refused_as_caller_errors() {
    let (_, ca) = self_signed();
    let policy = IssuePolicy::default();
    let check = |csr: &str, want: fn(&IssueError) -> bool| {
        let err = issue::issue_workload(&ca, csr, &reviews(), 0, &policy, now()).unwrap_err();
        assert!(want(&err), "{err}");
        assert!(err.is_caller_error());
    };
    check("not a pem", |e| matches!(e, IssueError::CsrPem(_)));
    check(
        &fixture("csr-rsa1024.pem"),
        |e| matches!(e, IssueError::UnsupportedKey(k) if k.contains("1024")),
    );
    // Flip one byte of the signed content: the signature no longer verifies.
    let good = csr(&PKCS_ECDSA_P256_SHA256, &[]);
    let der = {
        use rustls_pki_types::pem::PemObject;
        rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(good.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec()
    };
    let mut tampered = der.clone();
    // Inside the subject public key, well past the headers.
    let at = tampered.len() / 2;
    tampered[at] ^= 0x01;
    let tampered_pem = pilotfish_ca_test_pem("CERTIFICATE REQUEST", &tampered);
    check(&tampered_pem, |e| {
        matches!(e, IssueError::CsrSignature | IssueError::CsrParse(_))
    });
}

/// PEM of `der` under `label` (the crate's encoder is for certificates only).
fn pilotfish_ca_test_pem(label: &str, der: &[u8]) -> String {
    pem::certificate_pem(der).replace("CERTIFICATE", label)
}

/// A root, an intermediate signed by it, as an operator would plug them in (`cacerts`).
fn plugged(key_pem: &str) -> (CaFiles, String) {
    let t = now();
    let root_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut root_params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Example Root");
    root_params.distinguished_name = dn;
    root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    root_params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let root = root_params.self_signed(&root_key).unwrap();
    let root_issuer = Issuer::new(root_params, root_key);
    let key = KeyPair::from_pem(&pem_to_pkcs8(key_pem)).unwrap();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Example Intermediate");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    params.not_before = time::OffsetDateTime::from_unix_timestamp(unix(t) - 60).unwrap();
    params.not_after = time::OffsetDateTime::from_unix_timestamp(unix(t) + 365 * 86400).unwrap();
    let intermediate = params.signed_by(&key, &root_issuer).unwrap();
    let files = CaFiles {
        ca_cert: intermediate.pem().into_bytes(),
        ca_key: key_pem.as_bytes().to_vec(),
        cert_chain: format!("{}{}", intermediate.pem(), root.pem()).into_bytes(),
        root_cert: root.pem().into_bytes(),
    };
    (files, root.pem())
}

fn pem_to_pkcs8(key_pem: &str) -> String {
    let pkcs8 = pem::private_key_pkcs8(key_pem.as_bytes()).unwrap();
    pilotfish_ca_test_pem("PRIVATE KEY", &pkcs8)
}

#[test]
fn plugged_intermediate_with_sec1_and_pkcs1_keys() {
    for key in ["ec-sec1.pem", "rsa-pkcs1.pem"] {
        let (files, root_pem) = plugged(&fixture(key));
        let ca = CaBundle::load(&files, now()).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(ca.roots_pem(), root_pem);
        assert_eq!(ca.chain().len(), 2, "cert-chain.pem as given");
        let issued = issue::issue_workload(
            &ca,
            &csr(&PKCS_ECDSA_P256_SHA256, &[]),
            &reviews(),
            0,
            &IssuePolicy::default(),
            now(),
        )
        .unwrap();
        // leaf, intermediate, root (from the chain), root bundle: Istio's response shape.
        assert_eq!(issued.response_chain.len(), 4);
        assert_eq!(issued.response_chain.last().unwrap(), &root_pem);
        let inter = pem::certificates(&files.ca_cert).unwrap();
        let (_, inter) = X509Certificate::from_der(&inter[0]).unwrap();
        let leaf_der = leaf(&issued);
        let (_, cert) = X509Certificate::from_der(&leaf_der).unwrap();
        cert.verify_signature(Some(inter.public_key()))
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(cert.issuer(), inter.subject());
    }
}

#[test]
fn unusable_bundles_say_why() {
    let t = now();
    let (files, _) = self_signed();
    let (other, _) = self_signed();
    let mismatched = CaFiles {
        ca_key: other.ca_key.clone(),
        ..files.clone()
    };
    assert_eq!(
        CaBundle::load(&mismatched, t).unwrap_err(),
        CaError::KeyMismatch
    );
    assert!(matches!(
        CaBundle::load(&files, t + 3651 * DAY).unwrap_err(),
        CaError::NotValidNow { .. }
    ));
    // An intermediate whose root is not given.
    let (plugged_files, _) = plugged(&fixture("ec-sec1.pem"));
    let rootless = CaFiles {
        cert_chain: Vec::new(),
        root_cert: Vec::new(),
        ..plugged_files.clone()
    };
    assert_eq!(CaBundle::load(&rootless, t).unwrap_err(), CaError::NoRoot);
    let foreign_root = CaFiles {
        cert_chain: Vec::new(),
        root_cert: other.ca_cert.clone(),
        ..plugged_files
    };
    assert!(matches!(
        CaBundle::load(&foreign_root, t).unwrap_err(),
        CaError::Unchained { .. }
    ));
    // A leaf is not a CA.
    let ca = CaBundle::load(&files, t).unwrap();
    let serving = issue::issue_serving(&ca, &["a.example".into()], DAY, t).unwrap();
    let not_ca = CaFiles {
        ca_cert: serving.chain_pem.clone().into_bytes(),
        ca_key: serving.key_pem.clone().into_bytes(),
        cert_chain: Vec::new(),
        root_cert: files.ca_cert.clone(),
    };
    assert_eq!(CaBundle::load(&not_ca, t).unwrap_err(), CaError::NotCa);
    let empty = CaFiles::default();
    assert!(matches!(
        CaBundle::load(&empty, t).unwrap_err(),
        CaError::Pem {
            file: "ca-cert.pem",
            ..
        }
    ));
    assert!(!empty.has_signing_key());
}

#[test]
fn serving_certificate_names_the_service() {
    let (_, ca) = self_signed();
    let names = vec![
        "pilotfish-xds.pilotfish-system.svc".to_string(),
        "istiod.istio-system.svc".to_string(),
    ];
    let serving = issue::issue_serving(&ca, &names, DAY, now()).unwrap();
    let der = pem::certificates(serving.chain_pem.as_bytes()).unwrap();
    assert_eq!(der.len(), 1, "self-signed root: the leaf alone");
    let (_, cert) = X509Certificate::from_der(&der[0]).unwrap();
    let dns: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(
        dns,
        [
            "DNSName(pilotfish-xds.pilotfish-system.svc)",
            "DNSName(istiod.istio-system.svc)"
        ]
    );
    assert!(pem::private_key_pkcs8(serving.key_pem.as_bytes()).is_ok());
}
