//! The seam between the snapshot codec (`pilotfish_mesh::codec`) and the bus: an encoded
//! blob becomes an [`EncodedSnapshot`] to publish, a blob is decoded into a verified
//! [`PushContext`] for followers ([`snapshot_decoder`]), and the codec's decode errors
//! report their metric reason. The domain crate knows nothing of the bus; these adapters
//! live on the bus side.

use pilotfish_mesh::codec::{self, DecodeLimits, Encoded, VerifyKeys};
use pilotfish_mesh::push_context::PushContext;

use super::{DecodeError, EncodedSnapshot, Verified};

impl From<Encoded> for EncodedSnapshot {
    fn from(e: Encoded) -> Self {
        let hash = e.hash_hex();
        EncodedSnapshot {
            bytes: e.bytes.into(),
            hash,
        }
    }
}

impl DecodeError for codec::DecodeError {
    fn reason(&self) -> &'static str {
        codec::DecodeError::reason(self)
    }
}

/// The decode function a follower of real snapshots is given: size limits, signature
/// (one of `keys`), decompression, content hash, protobuf — the value with the content
/// hash it verified.
pub fn snapshot_decoder(
    limits: DecodeLimits,
    keys: VerifyKeys,
) -> impl Fn(&[u8]) -> Result<Verified<PushContext>, codec::DecodeError> + Send + Sync + 'static {
    move |blob| {
        let (header, context) = codec::decode_with_header(blob, &limits, &keys)?;
        Ok(Verified {
            value: context,
            hash: header.hash_hex(),
        })
    }
}
