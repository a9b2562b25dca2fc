//! Command-line pieces both binaries share: the Redis flags (each also readable from its
//! `PILOTFISH_*` environment variable), the replica name, and reading the `--mesh-config`
//! file.

use std::path::{Path, PathBuf};

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

/// `--replica-name`, else the host name (`HOSTNAME`, `/etc/hostname`), else `fallback`.
pub fn replica_name(flag: Option<String>, fallback: &str) -> String {
    flag.or_else(|| std::env::var("HOSTNAME").ok())
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| fallback.to_string())
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
    fn replica_name_prefers_the_flag() {
        assert_eq!(replica_name(Some("xds-7".into()), "x"), "xds-7");
        assert!(!replica_name(None, "fallback").is_empty());
    }
}
