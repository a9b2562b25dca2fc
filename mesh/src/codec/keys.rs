//! The keys that sign and verify snapshot blobs: Ed25519, so that whoever can write Redis
//! (or reads a replica's files) still cannot make a blob a replica accepts — replicas face
//! unauthenticated clients and hold only public keys.
//!
//! - [`SnapshotSigner`]: the controller's private key (PKCS#8 PEM, `-----BEGIN PRIVATE
//!   KEY-----`, what `openssl genpkey -algorithm ed25519` writes and Helm's
//!   `genPrivateKey "ed25519"` renders), or a fresh in-process one (standalone mode).
//! - [`VerifyKeys`]: the public keys a reader accepts, several at once so a key can be
//!   rotated without a window where replicas refuse the controller. Read from PEM
//!   `PUBLIC KEY` blocks (`openssl pkey -pubout`) or `CERTIFICATE` blocks (only the key is
//!   used; the chart carries the public key in a self-signed certificate because Helm can
//!   derive one from a private key but cannot print the bare public key).
//! - [`KeyId`]: the first 8 bytes of SHA-256 of the 32-byte public key, written into every
//!   blob's header so a reader picks the right key without trying them all.
//!
//! Parsing only: no file is read here (the binaries read the files and hand over text).

use std::collections::BTreeMap;
use std::fmt;

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha256};
use x509_cert::der::{DecodePem, Encode};

/// Identifies a verify key inside a blob header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(pub [u8; 8]);

impl KeyId {
    fn of(key: &VerifyingKey) -> KeyId {
        let digest = Sha256::digest(key.as_bytes());
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        KeyId(id)
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

/// Why a key could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("no PEM block found (expected -----BEGIN {expected}-----)")]
    NoPem { expected: &'static str },
    #[error("PEM block {index} ({label}) is not an Ed25519 key: {reason}")]
    NotEd25519 {
        index: usize,
        label: String,
        reason: String,
    },
    #[error("PEM block {index} has label {label:?}; expected {expected}")]
    UnexpectedLabel {
        index: usize,
        label: String,
        expected: &'static str,
    },
    #[error("a PEM block starting at line {line} has no matching END line")]
    Unterminated { line: usize },
}

/// The private key that signs blobs. `Debug` never shows it.
#[derive(Clone)]
pub struct SnapshotSigner {
    key: SigningKey,
    id: KeyId,
}

impl fmt::Debug for SnapshotSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotSigner")
            .field("key_id", &self.id)
            .finish_non_exhaustive()
    }
}

impl SnapshotSigner {
    /// A signer from a 32-byte Ed25519 seed (a fresh random one for standalone mode).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let key = SigningKey::from_bytes(&seed);
        let id = KeyId::of(&key.verifying_key());
        SnapshotSigner { key, id }
    }

    /// Reads an Ed25519 private key from PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`).
    pub fn from_pkcs8_pem(text: &str) -> Result<Self, KeyError> {
        let blocks = pem_blocks(text)?;
        let Some((index, label, block)) = blocks.into_iter().next() else {
            return Err(KeyError::NoPem {
                expected: "PRIVATE KEY",
            });
        };
        if label != "PRIVATE KEY" {
            return Err(KeyError::UnexpectedLabel {
                index,
                label,
                expected: "PRIVATE KEY (PKCS#8)",
            });
        }
        let key = SigningKey::from_pkcs8_pem(block).map_err(|e| KeyError::NotEd25519 {
            index,
            label,
            reason: e.to_string(),
        })?;
        let id = KeyId::of(&key.verifying_key());
        Ok(SnapshotSigner { key, id })
    }

    pub fn key_id(&self) -> KeyId {
        self.id
    }

    /// The private key as PKCS#8 PEM, for tools and tests that write key files.
    pub fn to_pkcs8_pem(&self) -> String {
        self.key
            .to_pkcs8_pem(LineEnding::LF)
            .map(|pem| pem.to_string())
            .unwrap_or_default()
    }

    /// The public half, for the verify set of whoever reads what this signer writes.
    pub fn verify_key(&self) -> VerifyKey {
        VerifyKey {
            key: self.key.verifying_key(),
            id: self.id,
        }
    }

    pub(super) fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.key.sign(message).to_bytes()
    }
}

/// One public key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyKey {
    key: VerifyingKey,
    id: KeyId,
}

impl VerifyKey {
    pub fn key_id(&self) -> KeyId {
        self.id
    }

    /// The key as a PEM `PUBLIC KEY` block (what `openssl pkey -pubout` prints).
    pub fn to_pem(&self) -> String {
        self.key
            .to_public_key_pem(LineEnding::LF)
            .unwrap_or_default()
    }

    /// Every key in `text`: `PUBLIC KEY` (SPKI) and `CERTIFICATE` blocks (the certificate's
    /// subject key; nothing else of the certificate is checked or used). At least one.
    pub fn from_pem(text: &str) -> Result<Vec<VerifyKey>, KeyError> {
        let blocks = pem_blocks(text)?;
        if blocks.is_empty() {
            return Err(KeyError::NoPem {
                expected: "PUBLIC KEY or CERTIFICATE",
            });
        }
        let mut keys = Vec::new();
        for (index, label, block) in blocks {
            let not_ed25519 = |reason: String| KeyError::NotEd25519 {
                index,
                label: label.clone(),
                reason,
            };
            let key = match label.as_str() {
                "PUBLIC KEY" => VerifyingKey::from_public_key_pem(block)
                    .map_err(|e| not_ed25519(e.to_string()))?,
                "CERTIFICATE" => {
                    let cert = x509_cert::Certificate::from_pem(block)
                        .map_err(|e| not_ed25519(e.to_string()))?;
                    let spki = cert
                        .tbs_certificate
                        .subject_public_key_info
                        .to_der()
                        .map_err(|e| not_ed25519(e.to_string()))?;
                    VerifyingKey::from_public_key_der(&spki)
                        .map_err(|e| not_ed25519(e.to_string()))?
                }
                _ => {
                    return Err(KeyError::UnexpectedLabel {
                        index,
                        label,
                        expected: "PUBLIC KEY or CERTIFICATE",
                    });
                }
            };
            keys.push(VerifyKey {
                id: KeyId::of(&key),
                key,
            });
        }
        Ok(keys)
    }
}

/// The public keys a reader accepts, by key id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyKeys {
    keys: BTreeMap<KeyId, VerifyingKey>,
}

impl VerifyKeys {
    pub fn new(keys: impl IntoIterator<Item = VerifyKey>) -> Self {
        let mut set = VerifyKeys::default();
        for key in keys {
            set.insert(key);
        }
        set
    }

    pub fn insert(&mut self, key: VerifyKey) {
        self.keys.insert(key.id, key.key);
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The ids accepted, for logs.
    pub fn ids(&self) -> Vec<KeyId> {
        self.keys.keys().copied().collect()
    }

    /// Whether `signature` is `id`'s over `message`: `None` when `id` is not in the set.
    pub(super) fn verify(&self, id: KeyId, message: &[u8], signature: &[u8; 64]) -> Option<bool> {
        let key = self.keys.get(&id)?;
        Some(
            key.verify(message, &Signature::from_bytes(signature))
                .is_ok(),
        )
    }
}

/// The PEM blocks of `text` as `(index, label, block text)`; text outside blocks (comments,
/// `openssl` headers) is ignored.
fn pem_blocks(text: &str) -> Result<Vec<(usize, String, &str)>, KeyError> {
    let mut blocks = Vec::new();
    let mut rest = text;
    let mut consumed = 0usize;
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + "-----BEGIN ".len()..];
        let line = text[..consumed + start].lines().count() + 1;
        let Some(label_end) = after.find("-----") else {
            return Err(KeyError::Unterminated { line });
        };
        let label = after[..label_end].to_owned();
        let end_marker = format!("-----END {label}-----");
        let Some(end) = rest[start..].find(&end_marker) else {
            return Err(KeyError::Unterminated { line });
        };
        let block_end = start + end + end_marker.len();
        blocks.push((blocks.len(), label, &rest[start..block_end]));
        consumed += block_end;
        rest = &rest[block_end..];
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `helm template` renders with `genPrivateKey "ed25519"` and
    /// `genSelfSignedCertWithKey` (the chart's default key distribution).
    const HELM_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIOmxtO3owTk+hxpQlL8ETfIuhn5kLpsZSAzPWpd70ft0
-----END PRIVATE KEY-----
";
    const HELM_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBSDCB+6ADAgECAhB8JjAglHzONaYusuNcrdpJMAUGAytlcDAlMSMwIQYDVQQD
ExpwaWxvdGZpc2gtc25hcHNob3Qtc2lnbmluZzAgFw0yNjExMjUwNDA0MzhaGA8y
MTI2MTEwMTA0MDQzOFowJTEjMCEGA1UEAxMacGlsb3RmaXNoLXNuYXBzaG90LXNp
Z25pbmcwKjAFBgMrZXADIQAwCIl08Qs04OtU+yeTPkmk5Md9vuxDwaK7UZoHZqDx
v6M/MD0wDgYDVR0PAQH/BAQDAgWgMB0GA1UdJQQWMBQGCCsGAQUFBwMBBggrBgEF
BQcDAjAMBgNVHRMBAf8EAjAAMAUGAytlcANBALKk0n7ZIYlYIJt6JgLHPC7sHYyq
C+yPOf2TZE7gi8UVZQ2emhpwiYJEdU7Y08YWWMWiHKfwTHtApfui9Bqh9w4=
-----END CERTIFICATE-----
";
    /// The same public key as `openssl pkey -pubout` prints it.
    const SPKI: &str = "-----BEGIN PUBLIC KEY-----
MCowBQYDK2VwAyEAMAiJdPELNODrVPsnkz5JpOTHfb7sQ8Giu1GaB2ag8b8=
-----END PUBLIC KEY-----
";

    #[test]
    fn the_charts_key_and_certificate_are_one_pair() {
        let signer = SnapshotSigner::from_pkcs8_pem(HELM_KEY).unwrap();
        let from_cert = VerifyKey::from_pem(HELM_CERT).unwrap();
        let from_spki = VerifyKey::from_pem(SPKI).unwrap();
        assert_eq!(from_cert, vec![signer.verify_key()]);
        assert_eq!(from_spki, from_cert);
        assert_eq!(signer.verify_key().to_pem(), SPKI);
        let again = SnapshotSigner::from_pkcs8_pem(&signer.to_pkcs8_pem()).unwrap();
        assert_eq!(again.key_id(), signer.key_id());
        let keys = VerifyKeys::new(from_cert);
        let signature = signer.sign(b"message");
        assert_eq!(
            keys.verify(signer.key_id(), b"message", &signature),
            Some(true)
        );
        assert_eq!(
            keys.verify(signer.key_id(), b"other", &signature),
            Some(false)
        );
        assert_eq!(keys.verify(KeyId([0; 8]), b"message", &signature), None);
        assert!(!format!("{signer:?}").contains("PRIVATE"));
    }

    #[test]
    fn several_keys_in_one_file_and_clear_errors() {
        let two = format!("# current\n{SPKI}\n# next\n{HELM_CERT}");
        assert_eq!(VerifyKey::from_pem(&two).unwrap().len(), 2);
        let other = SnapshotSigner::from_seed([7; 32]);
        assert_ne!(
            other.key_id(),
            VerifyKey::from_pem(SPKI).unwrap()[0].key_id()
        );
        assert_eq!(
            VerifyKey::from_pem("nothing here"),
            Err(KeyError::NoPem {
                expected: "PUBLIC KEY or CERTIFICATE"
            })
        );
        assert!(matches!(
            VerifyKey::from_pem(HELM_KEY),
            Err(KeyError::UnexpectedLabel { .. })
        ));
        assert!(matches!(
            SnapshotSigner::from_pkcs8_pem(SPKI),
            Err(KeyError::UnexpectedLabel { .. })
        ));
        assert!(matches!(
            VerifyKey::from_pem("-----BEGIN PUBLIC KEY-----\nAAAA\n"),
            Err(KeyError::Unterminated { line: 1 })
        ));
        let garbage = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        let err = VerifyKey::from_pem(garbage).unwrap_err();
        assert!(matches!(err, KeyError::NotEd25519 { .. }), "{err}");
    }
}
