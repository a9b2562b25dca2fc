//! The snapshot blob: how a [`PushContext`] travels from the controller to the xDS replicas.
//!
//! Layout: a fixed 52-byte header — magic `PFSN`, schema major and minor version (u16 LE
//! each), flags (u32 LE, reserved, 0), uncompressed length (u64 LE), SHA-256 of the
//! uncompressed payload — followed by one zstd frame holding the protobuf
//! `pilotfish.snapshot.v1.Snapshot` (see `mesh/proto/`).
//!
//! Encoding is deterministic: the same mesh gives byte-identical blobs and the same hash,
//! on every machine. Decoding checks everything before trusting anything: magic, major
//! version, declared and actual sizes against [`DecodeLimits`], the zstd frame, the hash,
//! then the protobuf and each config's JSON.

pub mod convert;
mod direct;

#[allow(clippy::all, missing_docs)] // generated code
pub mod pb;

use std::sync::Arc;

use prost::Message;
use sha2::{Digest, Sha256};

use crate::push_context::{Config, ConfigMeta, MeshData, PushContext};

pub const MAGIC: [u8; 4] = *b"PFSN";
/// Readers accept any minor version of their major version (fields are only added).
pub const SCHEMA_MAJOR: u16 = 1;
pub const SCHEMA_MINOR: u16 = 0;
pub const HEADER_LEN: usize = 52;
/// zstd level: 3 is zstd's default, a good speed/size balance for multi-MB blobs.
const ZSTD_LEVEL: i32 = 3;

/// Size limits a reader enforces before allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest blob accepted, in bytes (compressed, with header).
    pub max_blob_bytes: usize,
    /// Largest payload accepted after decompression, in bytes.
    pub max_payload_bytes: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_blob_bytes: 64 << 20,
            max_payload_bytes: 512 << 20,
        }
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
        "blob has schema version {major}.{minor}; this reader understands major version {SCHEMA_MAJOR} only"
    )]
    UnsupportedVersion { major: u16, minor: u16 },
    #[error("blob of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge { size: u64, limit: u64 },
    #[error("blob payload is corrupt: {0}")]
    Corrupt(String),
}

impl DecodeError {
    /// Short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::BadMagic { .. } => "bad_magic",
            DecodeError::UnsupportedVersion { .. } => "unsupported_version",
            DecodeError::TooLarge { .. } => "too_large",
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
    }
}

/// Encodes a snapshot into a blob.
pub fn encode(ctx: &PushContext) -> Encoded {
    let payload = direct::encode_payload(ctx);
    let hash: [u8; 32] = Sha256::digest(&payload).into();
    // Compressing an in-memory buffer only fails on allocation failure.
    let compressed = zstd::bulk::compress(&payload, ZSTD_LEVEL).unwrap_or_default();
    let header = Header {
        major: SCHEMA_MAJOR,
        minor: SCHEMA_MINOR,
        flags: 0,
        payload_len: payload.len() as u64,
        hash,
    };
    let mut bytes = Vec::with_capacity(HEADER_LEN + compressed.len());
    write_header(&header, &mut bytes);
    bytes.extend_from_slice(&compressed);
    Encoded { bytes, header }
}

fn write_header(h: &Header, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&h.major.to_le_bytes());
    out.extend_from_slice(&h.minor.to_le_bytes());
    out.extend_from_slice(&h.flags.to_le_bytes());
    out.extend_from_slice(&h.payload_len.to_le_bytes());
    out.extend_from_slice(&h.hash);
}

/// Reads and checks the header only (magic and major version).
pub fn read_header(blob: &[u8]) -> Result<Header, DecodeError> {
    if blob.len() < HEADER_LEN {
        return Err(DecodeError::Truncated { len: blob.len() });
    }
    let magic: [u8; 4] = blob[0..4].try_into().unwrap_or_default();
    if magic != MAGIC {
        return Err(DecodeError::BadMagic { found: magic });
    }
    let u16_at = |i: usize| u16::from_le_bytes([blob[i], blob[i + 1]]);
    let header = Header {
        major: u16_at(4),
        minor: u16_at(6),
        flags: u32::from_le_bytes(blob[8..12].try_into().unwrap_or_default()),
        payload_len: u64::from_le_bytes(blob[12..20].try_into().unwrap_or_default()),
        hash: blob[20..52].try_into().unwrap_or_default(),
    };
    if header.major != SCHEMA_MAJOR {
        return Err(DecodeError::UnsupportedVersion {
            major: header.major,
            minor: header.minor,
        });
    }
    Ok(header)
}

/// Decodes and verifies a blob into a [`PushContext`].
pub fn decode(blob: &[u8], limits: &DecodeLimits) -> Result<PushContext, DecodeError> {
    if blob.len() > limits.max_blob_bytes {
        return Err(DecodeError::TooLarge {
            size: blob.len() as u64,
            limit: limits.max_blob_bytes as u64,
        });
    }
    let header = read_header(blob)?;
    if header.payload_len > limits.max_payload_bytes as u64 {
        return Err(DecodeError::TooLarge {
            size: header.payload_len,
            limit: limits.max_payload_bytes as u64,
        });
    }
    // The capacity bound makes zstd refuse to expand beyond the declared length, so a
    // lying header cannot make us allocate more than the limit.
    let payload = zstd::bulk::decompress(&blob[HEADER_LEN..], header.payload_len as usize)
        .map_err(|e| DecodeError::Corrupt(format!("zstd: {e}")))?;
    if payload.len() as u64 != header.payload_len {
        return Err(DecodeError::Corrupt(format!(
            "payload is {} bytes, header says {}",
            payload.len(),
            header.payload_len
        )));
    }
    let hash: [u8; 32] = Sha256::digest(&payload).into();
    if hash != header.hash {
        return Err(DecodeError::Corrupt(
            "content hash does not match the header".to_string(),
        ));
    }
    let snapshot = pb::Snapshot::decode(payload.as_slice())
        .map_err(|e| DecodeError::Corrupt(format!("protobuf: {e}")))?;
    from_pb(snapshot)
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
            // A config kind added by a newer writer: this replica cannot serve it, but the
            // rest of the snapshot is still good.
            _ => {}
        }
    }
    Ok(PushContext::from_data(data))
}

#[cfg(test)]
mod tests;
