//! The snapshot blob: how a [`PushContext`] travels from the controller to the xDS replicas.
//!
//! Layout (schema 2): a fixed 124-byte header, then one zstd frame holding the protobuf
//! `pilotfish.snapshot.v1.Snapshot` (see `mesh/proto/`).
//!
//! | offset | bytes | field |
//! | --- | --- | --- |
//! | 0 | 4 | magic `PFSN` |
//! | 4 | 2 + 2 | schema major (2), minor (0), u16 LE |
//! | 8 | 4 | flags (u32 LE, reserved, 0) |
//! | 12 | 8 | payload length after decompression (u64 LE) |
//! | 20 | 32 | SHA-256 of the payload: the snapshot's content hash |
//! | 52 | 8 | key id of the signing key ([`KeyId`]) |
//! | 60 | 64 | Ed25519 signature over bytes 0..60 followed by SHA-256 of the zstd frame |
//!
//! The signature covers the header and, through its hash, every byte of the frame: a
//! reader verifies it before it decompresses anything, so a blob from anyone but the
//! holder of a signing key ([`SnapshotSigner`]) costs a reader one hash of at most
//! `max_blob_bytes` and no memory. Then the frame is decompressed as a stream, bounded by
//! the signed length and by [`DecodeLimits::max_payload_bytes`] (nothing of the declared
//! size is allocated up front), and the payload's hash is checked.
//!
//! Encoding is deterministic: the same mesh and key give byte-identical blobs (Ed25519
//! signatures are deterministic) and, with any key, the same content hash. Decoding checks
//! everything before trusting anything, with typed errors ([`DecodeError::reason`] is the
//! metric label). Schema 1 blobs (unsigned) are refused as `unsigned`.

pub mod convert;
mod direct;
pub mod keys;

#[allow(clippy::all, missing_docs)] // generated code
pub mod pb;

use std::io::Read;
use std::sync::Arc;

use prost::Message;
use sha2::{Digest, Sha256};

pub use keys::{KeyError, KeyId, SnapshotSigner, VerifyKey, VerifyKeys};

use crate::push_context::{Config, ConfigMeta, MeshData, PushContext};

pub const MAGIC: [u8; 4] = *b"PFSN";
/// Readers accept any minor version of their major version (fields are only added).
pub const SCHEMA_MAJOR: u16 = 2;
pub const SCHEMA_MINOR: u16 = 0;
pub const HEADER_LEN: usize = 124;
/// The header bytes the signature covers directly (everything before the signature).
const SIGNED_LEN: usize = 60;
/// zstd level: 3 is zstd's default, a good speed/size balance for multi-MB blobs.
const ZSTD_LEVEL: i32 = 3;
/// Largest zstd window a reader sets up (16 MiB). The encoder's level 3 uses 2 MiB; the
/// limit keeps a frame from making the decoder reserve zstd's default maximum (128 MiB).
const ZSTD_WINDOW_LOG_MAX: u32 = 24;
/// The payload limit as a multiple of the blob limit. Real meshes compress 10–16 times
/// (10,000 services: 386 KB → 5.9 MB); the margin is for meshes more repetitive still.
pub const PAYLOAD_PER_BLOB_BYTE: usize = 32;

/// Size limits a reader enforces before allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest blob accepted, in bytes (compressed, with header).
    pub max_blob_bytes: usize,
    /// Largest payload accepted after decompression, in bytes.
    pub max_payload_bytes: usize,
}

impl DecodeLimits {
    /// The default `--max-blob-bytes`: 8 MiB, twenty times the blob of a
    /// 10,000-service mesh.
    pub const DEFAULT_MAX_BLOB_BYTES: usize = 8 << 20;

    /// Limits derived from the largest blob (`--max-blob-bytes`): the payload may be
    /// [`PAYLOAD_PER_BLOB_BYTE`] times larger.
    pub fn for_max_blob(max_blob_bytes: usize) -> Self {
        DecodeLimits {
            max_blob_bytes,
            max_payload_bytes: max_blob_bytes.saturating_mul(PAYLOAD_PER_BLOB_BYTE),
        }
    }
}

impl Default for DecodeLimits {
    fn default() -> Self {
        Self::for_max_blob(Self::DEFAULT_MAX_BLOB_BYTES)
    }
}

/// The header of a blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub major: u16,
    pub minor: u16,
    pub flags: u32,
    pub payload_len: u64,
    pub hash: [u8; 32],
    pub key_id: KeyId,
    pub signature: [u8; 64],
}

impl Header {
    pub fn hash_hex(&self) -> String {
        hex::encode(self.hash)
    }
}

/// An encoded snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub header: Header,
}

impl Encoded {
    /// Hex SHA-256 of the payload: the snapshot's content hash.
    pub fn hash_hex(&self) -> String {
        self.header.hash_hex()
    }
}

/// Why a blob was rejected. Each variant maps to a metric reason label.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("blob is {len} bytes, shorter than the {HEADER_LEN}-byte header")]
    Truncated { len: usize },
    #[error("blob does not start with the snapshot magic (found {found:02x?})")]
    BadMagic { found: [u8; 4] },
    #[error(
        "blob has schema version 1.{minor}, which carries no signature (written by an older controller); refused"
    )]
    Unsigned { minor: u16 },
    #[error(
        "blob has schema version {major}.{minor}; this reader understands major version {SCHEMA_MAJOR} only"
    )]
    UnsupportedVersion { major: u16, minor: u16 },
    #[error("blob of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    #[error(
        "blob is signed by key {key_id}, which is not among the {known} verify key(s) of this reader"
    )]
    UnknownKey { key_id: KeyId, known: usize },
    #[error("blob signature (key {key_id}) does not verify: the blob was altered or forged")]
    BadSignature { key_id: KeyId },
    #[error("blob payload is corrupt: {0}")]
    Corrupt(String),
}

impl DecodeError {
    /// Short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::BadMagic { .. } => "bad_magic",
            DecodeError::Unsigned { .. } => "unsigned",
            DecodeError::UnsupportedVersion { .. } => "unsupported_version",
            DecodeError::TooLarge { .. } => "too_large",
            DecodeError::UnknownKey { .. } => "unknown_key",
            DecodeError::BadSignature { .. } => "bad_signature",
            DecodeError::Corrupt(_) => "corrupt",
        }
    }
}

/// The protobuf form of a snapshot (what [`encode`] writes, as generated structs).
pub fn to_pb(ctx: &PushContext) -> pb::Snapshot {
    let data = ctx.data();
    let configs = convert::configs_to_pb(ctx);
    pb::Snapshot {
        mesh: Some(convert::mesh_to_pb(&data.mesh)),
        cluster_domain: data.cluster_domain.clone(),
        services: data
            .services
            .iter()
            .map(|s| convert::service_to_pb(s))
            .collect(),
        endpoints: data
            .endpoints
            .iter()
            .map(|e| convert::endpoints_to_pb(e))
            .collect(),
        configs,
        jwks: convert::jwks_to_pb(ctx),
    }
}

/// Encodes and signs a snapshot into a blob.
pub fn encode(ctx: &PushContext, signer: &SnapshotSigner) -> Encoded {
    seal(&direct::encode_payload(ctx), signer)
}

/// Compresses, hashes and signs `payload` (an encoded `pilotfish.snapshot.v1.Snapshot`).
pub fn seal(payload: &[u8], signer: &SnapshotSigner) -> Encoded {
    let hash: [u8; 32] = Sha256::digest(payload).into();
    // Compressing an in-memory buffer only fails on allocation failure.
    let frame = zstd::bulk::compress(payload, ZSTD_LEVEL).unwrap_or_default();
    seal_frame(frame, payload.len() as u64, hash, signer)
}

/// Signs a blob around a zstd `frame` the caller made, declaring `payload_len` and the
/// payload's `hash` without checking either. For tools and tests that must produce blobs
/// `encode` never would (a frame that expands beyond its declared length, a lying hash);
/// readers check both.
pub fn seal_frame(
    frame: Vec<u8>,
    payload_len: u64,
    hash: [u8; 32],
    signer: &SnapshotSigner,
) -> Encoded {
    let mut header = Header {
        major: SCHEMA_MAJOR,
        minor: SCHEMA_MINOR,
        flags: 0,
        payload_len,
        hash,
        key_id: signer.key_id(),
        signature: [0; 64],
    };
    let mut bytes = Vec::with_capacity(HEADER_LEN + frame.len());
    write_signed_fields(&header, &mut bytes);
    header.signature = signer.sign(&signed_message(&bytes, &frame));
    bytes.extend_from_slice(&header.signature);
    bytes.extend_from_slice(&frame);
    Encoded { bytes, header }
}

/// Header bytes 0..60 (everything the signature covers directly).
fn write_signed_fields(h: &Header, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&h.major.to_le_bytes());
    out.extend_from_slice(&h.minor.to_le_bytes());
    out.extend_from_slice(&h.flags.to_le_bytes());
    out.extend_from_slice(&h.payload_len.to_le_bytes());
    out.extend_from_slice(&h.hash);
    out.extend_from_slice(&h.key_id.0);
}

/// What is signed: the first 60 header bytes, then SHA-256 of the frame.
fn signed_message(signed_fields: &[u8], frame: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(SIGNED_LEN + 32);
    message.extend_from_slice(&signed_fields[..SIGNED_LEN]);
    message.extend_from_slice(&Sha256::digest(frame));
    message
}

/// Reads the header only (magic and major version); verifies nothing.
pub fn read_header(blob: &[u8]) -> Result<Header, DecodeError> {
    let found: [u8; 4] = blob
        .get(0..4)
        .and_then(|m| m.try_into().ok())
        .unwrap_or_default();
    if blob.len() >= 4 && found != MAGIC {
        return Err(DecodeError::BadMagic { found });
    }
    let u16_at = |i: usize| blob.get(i..i + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    // A schema-1 header is shorter; say "unsigned" rather than "truncated" for it.
    if let (Some(1), Some(minor)) = (u16_at(4), u16_at(6)) {
        return Err(DecodeError::Unsigned { minor });
    }
    if blob.len() < HEADER_LEN {
        return Err(DecodeError::Truncated { len: blob.len() });
    }
    let header = Header {
        major: u16_at(4).unwrap_or_default(),
        minor: u16_at(6).unwrap_or_default(),
        flags: u32::from_le_bytes(array_at(blob, 8)),
        payload_len: u64::from_le_bytes(array_at(blob, 12)),
        hash: array_at(blob, 20),
        key_id: KeyId(array_at(blob, 52)),
        signature: array_at(blob, 60),
    };
    if header.major != SCHEMA_MAJOR {
        return Err(DecodeError::UnsupportedVersion {
            major: header.major,
            minor: header.minor,
        });
    }
    Ok(header)
}

/// `N` bytes of `blob` from `at` (zeros past its end; callers check the length first).
fn array_at<const N: usize>(blob: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(bytes) = blob.get(at..at + N) {
        out.copy_from_slice(bytes);
    }
    out
}

/// Checks a blob's size, header and signature, then decompresses it (bounded, streaming)
/// and checks its content hash. Returns the header and the protobuf payload.
pub fn open(
    blob: &[u8],
    limits: &DecodeLimits,
    keys: &VerifyKeys,
) -> Result<(Header, Vec<u8>), DecodeError> {
    if blob.len() > limits.max_blob_bytes {
        return Err(DecodeError::TooLarge {
            size: blob.len() as u64,
            limit: limits.max_blob_bytes as u64,
        });
    }
    let header = read_header(blob)?;
    let frame = &blob[HEADER_LEN..];
    match keys.verify(
        header.key_id,
        &signed_message(blob, frame),
        &header.signature,
    ) {
        None => {
            return Err(DecodeError::UnknownKey {
                key_id: header.key_id,
                known: keys.len(),
            });
        }
        Some(false) => {
            return Err(DecodeError::BadSignature {
                key_id: header.key_id,
            });
        }
        Some(true) => {}
    }
    if header.payload_len > limits.max_payload_bytes as u64 {
        return Err(DecodeError::TooLarge {
            size: header.payload_len,
            limit: limits.max_payload_bytes as u64,
        });
    }
    let payload = decompress(frame, header.payload_len)?;
    let hash: [u8; 32] = Sha256::digest(&payload).into();
    if hash != header.hash {
        return Err(DecodeError::Corrupt(
            "content hash does not match the header".to_string(),
        ));
    }
    Ok((header, payload))
}

/// Decompresses `frame` as a stream into a buffer that grows with what actually comes
/// out, reading at most one byte more than `expected` (which the caller has bounded).
fn decompress(frame: &[u8], expected: u64) -> Result<Vec<u8>, DecodeError> {
    let corrupt = |e: std::io::Error| DecodeError::Corrupt(format!("zstd: {e}"));
    let mut decoder = zstd::stream::read::Decoder::with_buffer(frame).map_err(corrupt)?;
    decoder
        .window_log_max(ZSTD_WINDOW_LOG_MAX)
        .map_err(corrupt)?;
    let mut payload = Vec::new();
    decoder
        .single_frame()
        .take(expected.saturating_add(1))
        .read_to_end(&mut payload)
        .map_err(corrupt)?;
    if payload.len() as u64 > expected {
        return Err(DecodeError::Corrupt(format!(
            "payload is longer than the {expected} bytes the header says (decompression stopped there)"
        )));
    }
    if (payload.len() as u64) < expected {
        return Err(DecodeError::Corrupt(format!(
            "payload is {} bytes, the header says {expected}",
            payload.len()
        )));
    }
    Ok(payload)
}

/// Decodes and verifies a blob into a [`PushContext`].
pub fn decode(
    blob: &[u8],
    limits: &DecodeLimits,
    keys: &VerifyKeys,
) -> Result<PushContext, DecodeError> {
    decode_with_header(blob, limits, keys).map(|(_, ctx)| ctx)
}

/// [`decode`], also returning the verified header (its content hash, its key id).
pub fn decode_with_header(
    blob: &[u8],
    limits: &DecodeLimits,
    keys: &VerifyKeys,
) -> Result<(Header, PushContext), DecodeError> {
    let (header, payload) = open(blob, limits, keys)?;
    let snapshot = pb::Snapshot::decode(payload.as_slice())
        .map_err(|e| DecodeError::Corrupt(format!("protobuf: {e}")))?;
    Ok((header, from_pb(snapshot)?))
}

/// Rebuilds a [`PushContext`] from its protobuf form.
pub fn from_pb(s: pb::Snapshot) -> Result<PushContext, DecodeError> {
    let mut data = MeshData {
        mesh: s.mesh.map(convert::mesh_from_pb).unwrap_or_default(),
        cluster_domain: s.cluster_domain,
        services: s
            .services
            .into_iter()
            .map(|p| Arc::new(convert::service_from_pb(p)))
            .collect(),
        endpoints: s
            .endpoints
            .into_iter()
            .map(|p| Arc::new(convert::endpoints_from_pb(p)))
            .collect(),
        virtual_services: Vec::new(),
        destination_rules: Vec::new(),
        peer_authentications: Vec::new(),
        sidecars: Vec::new(),
        request_authentications: Vec::new(),
        jwks: s.jwks.into_iter().map(convert::jwks_from_pb).collect(),
        authorization_policies: Vec::new(),
    };
    for c in s.configs {
        let meta = ConfigMeta {
            name: c.name,
            namespace: c.namespace,
            creation_ms: c.creation_ms,
            generation: c.generation,
        };
        let what = || format!("{}/{}", meta.namespace, meta.name);
        match pb::Kind::try_from(c.kind) {
            Ok(pb::Kind::VirtualService) => {
                let spec = serde_json::from_slice(&c.spec_json)
                    .map_err(|e| DecodeError::Corrupt(format!("VirtualService {}: {e}", what())))?;
                data.virtual_services.push(Arc::new(Config { meta, spec }));
            }
            Ok(pb::Kind::DestinationRule) => {
                let spec = serde_json::from_slice(&c.spec_json).map_err(|e| {
                    DecodeError::Corrupt(format!("DestinationRule {}: {e}", what()))
                })?;
                data.destination_rules.push(Arc::new(Config { meta, spec }));
            }
            Ok(pb::Kind::PeerAuthentication) => {
                let spec = serde_json::from_slice(&c.spec_json).map_err(|e| {
                    DecodeError::Corrupt(format!("PeerAuthentication {}: {e}", what()))
                })?;
                data.peer_authentications
                    .push(Arc::new(Config { meta, spec }));
            }
            Ok(pb::Kind::Sidecar) => {
                let spec = serde_json::from_slice(&c.spec_json)
                    .map_err(|e| DecodeError::Corrupt(format!("Sidecar {}: {e}", what())))?;
                data.sidecars.push(Arc::new(Config { meta, spec }));
            }
            Ok(pb::Kind::RequestAuthentication) => {
                let spec = serde_json::from_slice(&c.spec_json).map_err(|e| {
                    DecodeError::Corrupt(format!("RequestAuthentication {}: {e}", what()))
                })?;
                data.request_authentications
                    .push(Arc::new(Config { meta, spec }));
            }
            Ok(pb::Kind::AuthorizationPolicy) => {
                let spec = serde_json::from_slice(&c.spec_json).map_err(|e| {
                    DecodeError::Corrupt(format!("AuthorizationPolicy {}: {e}", what()))
                })?;
                data.authorization_policies
                    .push(Arc::new(Config { meta, spec }));
            }
            // A config kind added by a newer writer: this replica cannot serve it, but the
            // rest of the snapshot is still good.
            _ => {}
        }
    }
    Ok(PushContext::from_data(data))
}

#[cfg(test)]
mod tests;
