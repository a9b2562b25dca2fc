//! PEM and DER plumbing: certificates in and out of PEM, private keys in the three
//! encodings CA Secrets carry (PKCS#8, PKCS#1 `RSA PRIVATE KEY`, SEC1 `EC PRIVATE KEY`)
//! turned into the PKCS#8 the signer takes, and the URI SANs of a certificate.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Why PEM input is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PemError {
    #[error("no PEM CERTIFICATE block")]
    NoCertificate,
    #[error("a CERTIFICATE block is not a valid PEM block: {0}")]
    BadCertificate(String),
    #[error(
        "no private key (PEM PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block) could be read: {0}"
    )]
    BadKey(String),
    #[error("the EC private key names no curve, or one other than P-256 and P-384")]
    UnsupportedCurve,
}

/// Every CERTIFICATE block of `pem`, in order (other blocks are skipped).
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PemError::BadCertificate(e.to_string()))?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate);
    }
    Ok(certs)
}

/// One certificate as PEM (64-column base64, trailing newline).
pub fn certificate_pem(der: &[u8]) -> String {
    encode_pem("CERTIFICATE", der)
}

pub(crate) fn encode_pem(label: &str, der: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut b64 = String::with_capacity(der.len().div_ceil(3) * 4);
    for chunk in der.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                b64.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                b64.push('=');
            }
        }
    }
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The first private key in `pem`, as PKCS#8 DER. PKCS#1 RSA and SEC1 EC keys (what
/// `openssl genrsa` / `openssl ecparam -genkey` write, and what many `cacerts` Secrets
/// hold) are wrapped into PKCS#8, the only form the ring signer reads.
pub fn private_key_pkcs8(pem: &[u8]) -> Result<Vec<u8>, PemError> {
    let key = PrivateKeyDer::from_pem_slice(pem).map_err(|e| PemError::BadKey(e.to_string()))?;
    match key {
        PrivateKeyDer::Pkcs8(k) => Ok(k.secret_pkcs8_der().to_vec()),
        PrivateKeyDer::Pkcs1(k) => Ok(pkcs8_wrap(&RSA_ALGORITHM, k.secret_pkcs1_der())),
        PrivateKeyDer::Sec1(k) => {
            let curve = sec1_curve(k.secret_sec1_der()).ok_or(PemError::UnsupportedCurve)?;
            let mut algorithm = der(0x06, &EC_PUBLIC_KEY_OID);
            algorithm.extend(der(0x06, curve));
            Ok(pkcs8_wrap(&der(0x30, &algorithm), k.secret_sec1_der()))
        }
        _ => Err(PemError::BadKey("unknown key encoding".into())),
    }
}

/// Contents of the OIDs id-ecPublicKey, prime256v1 (P-256) and secp384r1 (P-384).
const EC_PUBLIC_KEY_OID: [u8; 7] = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
const P256_OID: [u8; 8] = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
const P384_OID: [u8; 5] = [0x2b, 0x81, 0x04, 0x00, 0x22];

/// `AlgorithmIdentifier { rsaEncryption, NULL }`.
const RSA_ALGORITHM: [u8; 15] = [
    0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00,
];

/// `PrivateKeyInfo { version 0, algorithm, OCTET STRING key }` (RFC 5208).
fn pkcs8_wrap(algorithm: &[u8], key: &[u8]) -> Vec<u8> {
    let mut body = vec![0x02, 0x01, 0x00];
    body.extend_from_slice(algorithm);
    body.extend(der(0x04, key));
    der(0x30, &body)
}

/// A DER TLV with a definite length.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// The named curve in a SEC1 `ECPrivateKey`'s `[0] parameters`, if P-256 or P-384.
fn sec1_curve(sec1: &[u8]) -> Option<&'static [u8]> {
    let (p256, p384): (&'static [u8], &'static [u8]) = (&P256_OID, &P384_OID);
    // The parameters are small and come right after the private key octets; look for
    // the OID TLV anywhere in the structure rather than parsing all of it.
    let contains = |oid: &[u8]| {
        let tlv = der(0x06, oid);
        sec1.windows(tlv.len()).any(|w| w == tlv.as_slice())
    };
    if contains(p256) {
        Some(p256)
    } else if contains(p384) {
        Some(p384)
    } else {
        None
    }
}

/// The URI SANs of a DER certificate (where SPIFFE ids live); empty if it has none or
/// does not parse.
pub fn uri_sans(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => Some(uri.to_string()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_encoding_round_trips() {
        for len in [0usize, 1, 2, 3, 47, 48, 49, 100] {
            let der: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let pem = encode_pem("CERTIFICATE", &der);
            if len > 0 {
                let back = certificates(pem.as_bytes()).unwrap();
                assert_eq!(back[0].as_ref(), der.as_slice(), "length {len}");
            }
            assert!(pem.lines().all(|l| l.len() <= 64));
        }
    }

    #[test]
    fn long_der_lengths() {
        assert_eq!(der(0x04, &[0; 200])[..3], [0x04, 0x81, 200]);
        assert_eq!(der(0x04, &[0; 300])[..4], [0x04, 0x82, 0x01, 0x2c]);
    }
}
