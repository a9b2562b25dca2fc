//! The snapshot blob decoder (`pilotfish_mesh::codec::decode`), which every replica runs on
//! bytes from Redis. The first input byte picks what the rest is, so that the fuzzer gets
//! past the signature to what lies behind it:
//!
//! - 0: a whole blob as found in Redis (magic, header, key id, signature checks);
//! - 1: a zstd frame, signed with the key the decoder trusts, declaring the payload length
//!   in the next 4 bytes (decompression bounds, truncated and over-long frames);
//! - 2: a protobuf payload, compressed and signed properly (protobuf decoding and the
//!   conversion to the mesh model).
//!
//! Any panic, or memory beyond libFuzzer's `-rss_limit_mb`, is a bug: bad blobs must be
//! refused with a `DecodeError`.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use pilotfish_mesh::codec::{self, DecodeLimits, SnapshotSigner, VerifyKeys};
use sha2::{Digest, Sha256};

/// The key `seed-corpora` signs the seed blobs with.
static SIGNER: LazyLock<SnapshotSigner> = LazyLock::new(|| SnapshotSigner::from_seed([7; 32]));
static KEYS: LazyLock<VerifyKeys> = LazyLock::new(|| VerifyKeys::new([SIGNER.verify_key()]));
/// 1 MiB blobs, 32 MiB payloads: well inside libFuzzer's default 2 GiB RSS limit.
static LIMITS: LazyLock<DecodeLimits> = LazyLock::new(|| DecodeLimits::for_max_blob(1 << 20));

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let blob = match mode % 3 {
        0 => rest.to_vec(),
        1 => {
            let Some((len, frame)) = rest.split_first_chunk::<4>() else {
                return;
            };
            let payload_len = u64::from(u32::from_le_bytes(*len));
            let hash: [u8; 32] = Sha256::digest(frame).into();
            codec::seal_frame(frame.to_vec(), payload_len, hash, &SIGNER).bytes
        }
        _ => codec::seal(rest, &SIGNER).bytes,
    };
    let _ = codec::decode(&blob, &LIMITS, &KEYS);
});
