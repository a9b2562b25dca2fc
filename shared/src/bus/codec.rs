//! The seam between the snapshot codec (`pilotfish_mesh::codec`) and the bus: an encoded
//! blob becomes an [`EncodedSnapshot`] to publish, and the codec's decode errors report
//! their metric reason to followers. The domain crate knows nothing of the bus; these
//! adapters live on the bus side.

use pilotfish_mesh::codec::{self, Encoded};

use super::{DecodeError, EncodedSnapshot};

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
