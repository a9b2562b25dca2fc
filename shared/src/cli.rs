//! Command-line pieces both binaries share: the Redis flags (each also readable from its
//! `PILOTFISH_*` environment variable), the snapshot blob flags (size limit, verify keys)
//! and reading the key files, the replica name and the process's unique identity, and
//! reading the `--mesh-config` file.

use std::path::{Path, PathBuf};

use pilotfish_mesh::codec::{DecodeLimits, KeyError, SnapshotSigner, VerifyKey, VerifyKeys};
use pilotfish_mesh::mesh_config::{MeshConfig, MeshConfigError};

use crate::bus::BusError;
use crate::bus::redis::RedisConfig;

/// How to reach Redis.
#[derive(clap::Args, Clone, Debug)]
pub struct RedisArgs {
    /// Redis: redis://user@host:port/db (user@ and /db optional), rediss://... (TLS) or unix:///path.
    #[arg(long, env = "PILOTFISH_REDIS_URL")]
    pub redis_url: Option<String>,
    /// Key prefix in Redis (one writer per prefix).
    #[arg(long, env = "PILOTFISH_REDIS_PREFIX", default_value = RedisConfig::DEFAULT_PREFIX)]
    pub redis_prefix: String,
    /// File holding the Redis password (else PILOTFISH_REDIS_PASSWORD; never a flag).
    #[arg(long, env = "PILOTFISH_REDIS_PASSWORD_FILE")]
    pub redis_password_file: Option<PathBuf>,
    /// PEM CA certificate(s) to trust for rediss:// (a private CA).
    #[arg(long, env = "PILOTFISH_REDIS_CA_FILE")]
    pub redis_ca_file: Option<PathBuf>,
}

impl RedisArgs {
    /// The Redis configuration these flags describe; `None` without `--redis-url`.
    pub fn config(&self) -> Result<Option<RedisConfig>, BusError> {
        let Some(url) = &self.redis_url else {
            return Ok(None);
        };
        let config = RedisConfig::new(url)?
            .with_prefix(&self.redis_prefix)
            .with_password_from(self.redis_password_file.as_deref())?;
        match &self.redis_ca_file {
            Some(ca) => config.with_tls_ca_file(ca).map(Some),
            None => Ok(Some(config)),
        }
    }
}

/// What both binaries know about snapshot blobs.
#[derive(clap::Args, Clone, Debug)]
pub struct BlobArgs {
    /// Largest snapshot blob published or accepted, in bytes; a blob's decompressed payload
    /// may be 32 times larger.
    #[arg(long, env = "PILOTFISH_MAX_BLOB_BYTES", default_value_t = DecodeLimits::DEFAULT_MAX_BLOB_BYTES)]
    pub max_blob_bytes: usize,
    /// PEM files, or folders of them, with the public keys that verify snapshot blobs
    /// (`PUBLIC KEY` or `CERTIFICATE` blocks). Several keys are accepted at once, for a
    /// rotation. Comma-separated in the environment variable.
    #[arg(long, env = "PILOTFISH_VERIFY_KEYS", value_delimiter = ',')]
    pub verify_keys: Vec<PathBuf>,
}

impl BlobArgs {
    pub fn limits(&self) -> DecodeLimits {
        DecodeLimits::for_max_blob(self.max_blob_bytes)
    }
}

/// A key file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Key {
        path: PathBuf,
        #[source]
        source: KeyError,
    },
    #[error("{0} holds no key file")]
    EmptyFolder(PathBuf),
}

/// Reads the verify keys of `paths`: each file, or each file of each folder (names
/// starting with `.` skipped: the `..data` links of a mounted Secret or ConfigMap).
pub fn load_verify_keys(paths: &[PathBuf]) -> Result<VerifyKeys, KeyFileError> {
    let mut keys = VerifyKeys::default();
    for path in paths {
        let files = if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|source| KeyFileError::Read {
                    path: path.clone(),
                    source,
                })?
                .filter_map(Result::ok)
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            if files.is_empty() {
                return Err(KeyFileError::EmptyFolder(path.clone()));
            }
            files
        } else {
            vec![path.clone()]
        };
        for file in files {
            let text = read(&file)?;
            for key in VerifyKey::from_pem(&text).map_err(|source| KeyFileError::Key {
                path: file.clone(),
                source,
            })? {
                keys.insert(key);
            }
        }
    }
    Ok(keys)
}

/// Reads the controller's signing key (PKCS#8 PEM).
pub fn load_signing_key(path: &Path) -> Result<SnapshotSigner, KeyFileError> {
    SnapshotSigner::from_pkcs8_pem(&read(path)?).map_err(|source| KeyFileError::Key {
        path: path.to_owned(),
        source,
    })
}

/// A signing key made up for this process (standalone mode: it signs and verifies its
/// own snapshots, and nothing outside the process sees either key).
pub fn ephemeral_signer() -> SnapshotSigner {
    SnapshotSigner::from_seed(rand::random())
}

fn read(path: &Path) -> Result<String, KeyFileError> {
    std::fs::read_to_string(path).map_err(|source| KeyFileError::Read {
        path: path.to_owned(),
        source,
    })
}

/// `--replica-name`, else the host name (`HOSTNAME`, `/etc/hostname`), else `fallback`.
pub fn replica_name(flag: Option<String>, fallback: &str) -> String {
    flag.or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| fallback.to_string())
}

/// The identity this process uses in the Lease: the replica name plus a random suffix,
/// as client-go advises, so two processes never share one (two controllers given the same
/// name, or a restarted one whose predecessor's claim is still in the Lease, never both
/// count as the holder).
pub fn unique_identity(replica: &str) -> String {
    format!("{replica}_{:08x}", rand::random::<u32>())
}

/// Reads a `--mesh-config` file (Istio MeshConfig YAML); `None` gives the defaults. Fields
/// Pilotfish does not implement are logged once.
pub fn load_mesh_config(path: Option<&Path>) -> Result<MeshConfig, MeshConfigError> {
    let Some(path) = path else {
        return Ok(MeshConfig::default());
    };
    let text = std::fs::read_to_string(path).map_err(|e| MeshConfigError::Field {
        field: "(file)".into(),
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    let loaded = MeshConfig::from_yaml(&text)?;
    if !loaded.ignored_fields.is_empty() {
        tracing::info!(fields = ?loaded.ignored_fields, "mesh config fields Pilotfish does not use are ignored");
    }
    Ok(loaded.config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        redis: RedisArgs,
    }

    #[test]
    fn redis_flags_build_a_config() {
        let cli = Cli::try_parse_from([
            "t",
            "--redis-url",
            "redis://127.0.0.1:6379/3",
            "--redis-prefix",
            "mesh",
        ])
        .unwrap();
        let config = cli.redis.config().unwrap().unwrap();
        assert_eq!(config.db(), 3);
        assert_eq!(config.keys().snapshot(7), "mesh:snapshot:7");
        let none = Cli::try_parse_from(["t"]).unwrap();
        assert!(none.redis.config().unwrap().is_none());
        let bad = Cli::try_parse_from(["t", "--redis-url", "http://x"]).unwrap();
        assert!(bad.redis.config().is_err());
    }

    #[test]
    fn identities_are_unique_per_process() {
        let (a, b) = (unique_identity("controller"), unique_identity("controller"));
        assert!(a.starts_with("controller_") && b.starts_with("controller_"));
        assert_ne!(a, b);
    }

    #[test]
    fn verify_keys_come_from_files_and_folders() {
        let dir = tempfile::tempdir().unwrap();
        let one = SnapshotSigner::from_seed([1; 32]);
        let two = SnapshotSigner::from_seed([2; 32]);
        // What `openssl pkey -pubout` prints, for two keys (a rotation).
        let spki = |s: &SnapshotSigner| s.verify_key().to_pem();
        std::fs::write(dir.path().join("current.pem"), spki(&one)).unwrap();
        std::fs::write(dir.path().join("next.pem"), spki(&two)).unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        let keys = load_verify_keys(&[dir.path().to_owned()]).unwrap();
        assert_eq!(keys.len(), 2);
        let single = load_verify_keys(&[dir.path().join("next.pem")]).unwrap();
        assert_eq!(single.ids(), vec![two.key_id()]);
        std::fs::write(dir.path().join("broken.pem"), "not a key").unwrap();
        let err = load_verify_keys(&[dir.path().to_owned()]).unwrap_err();
        assert!(err.to_string().contains("broken.pem"), "{err}");
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            load_verify_keys(&[empty.path().to_owned()]),
            Err(KeyFileError::EmptyFolder(_))
        ));
        assert!(load_signing_key(&dir.path().join("next.pem")).is_err());
        std::fs::write(dir.path().join("signing.pem"), one.to_pkcs8_pem()).unwrap();
        let signer = load_signing_key(&dir.path().join("signing.pem")).unwrap();
        assert_eq!(signer.key_id(), one.key_id());
    }

    #[test]
    fn replica_name_prefers_the_flag() {
        assert_eq!(replica_name(Some("xds-7".into()), "x"), "xds-7");
        assert!(!replica_name(None, "fallback").is_empty());
    }
}
