//! The snapshot signing key of the tests: one fixed Ed25519 key pair, made for tests and
//! used nowhere else, as values (for in-process publishers and followers) and as the PEM
//! files the binaries read (`--signing-key-file`, `--verify-keys`), plus the decode
//! function a test follower of real snapshots uses.

use std::path::PathBuf;
use std::sync::OnceLock;

use pilotfish_mesh::codec::{self, DecodeLimits, SnapshotSigner, VerifyKeys};
use pilotfish_mesh::push_context::PushContext;
use pilotfish_shared::bus::{Verified, snapshot_decoder};

use crate::tools::target_dir;

/// The seed of the test key (not a secret: it signs test snapshots only).
const TEST_SEED: [u8; 32] = *b"pilotfish test signing key seed!";

/// The controller's key in tests.
pub fn signer() -> SnapshotSigner {
    SnapshotSigner::from_seed(TEST_SEED)
}

/// The replicas' verify keys in tests (the public half of [`signer`]).
pub fn verify_keys() -> VerifyKeys {
    VerifyKeys::new([signer().verify_key()])
}

/// Decodes and verifies real snapshots signed by [`signer`], with the default limits.
pub fn decoder()
-> impl Fn(&[u8]) -> Result<Verified<PushContext>, codec::DecodeError> + Send + Sync + 'static {
    snapshot_decoder(DecodeLimits::default(), verify_keys())
}

/// The key pair as files.
#[derive(Debug)]
pub struct KeyFiles {
    /// PKCS#8 PEM private key, for `--signing-key-file`.
    pub signing: PathBuf,
    /// PEM public key, for `--verify-keys`.
    pub verify: PathBuf,
}

/// The key files, written once per process under the target directory (same content
/// every time; written to a temporary name and renamed, so concurrent test processes
/// never read half a file).
pub fn files() -> &'static KeyFiles {
    static FILES: OnceLock<KeyFiles> = OnceLock::new();
    FILES.get_or_init(|| {
        let dir = target_dir().join("pilotfish-test-keys");
        std::fs::create_dir_all(&dir).expect("create the test key folder");
        let write = |name: &str, content: String| {
            let path = dir.join(name);
            let tmp = dir.join(format!(".{name}.{}", std::process::id()));
            std::fs::write(&tmp, content).expect("write a test key");
            std::fs::rename(&tmp, &path).expect("rename a test key");
            path
        };
        KeyFiles {
            signing: write("signing-key.pem", signer().to_pkcs8_pem()),
            verify: write("verify-key.pem", signer().verify_key().to_pem()),
        }
    })
}
