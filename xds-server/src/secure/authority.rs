//! The CA the secure port signs with and the TLS identity it serves, from Istio's files:
//! the first `--ca-dir` folder holding a `ca-key.pem` (in the chart: the plugged-in
//! `cacerts`, else the self-signed `istio-ca-secret`), verified ([`CaBundle::load`]),
//! plus a serving certificate for `--serving-dns-names` issued from it and the rustls
//! configuration that presents it and verifies client certificates against the roots
//! ([`server_config`]: client certificates optional, ALPN `h2`).
//!
//! [`run`] re-reads the folders every `reload_every`: a changed Secret (kubelet swaps the
//! mounted files) or a serving certificate past half its life gives a new [`Authority`];
//! a load that fails is logged and counted, and the last good one stays in use.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use pilotfish_ca::bundle::{CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT};
use pilotfish_ca::issue::{self, ServingCert};
use pilotfish_ca::{CaBundle, CaError, CaFiles, IssueError};
use tokio::sync::watch;
use tracing::{error, info, warn};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use super::metrics;

/// What the secure port currently signs and serves with.
pub struct Authority {
    pub bundle: CaBundle,
    /// The folder the CA came from.
    pub source: PathBuf,
    pub tls: Arc<rustls::ServerConfig>,
    /// When the serving certificate expires (unix seconds).
    pub serving_not_after: i64,
    serving_not_before: i64,
    files: CaFiles,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority")
            .field("source", &self.source)
            .field("bundle", &self.bundle)
            .field("serving_not_after", &self.serving_not_after)
            .finish_non_exhaustive()
    }
}

/// The current authority (`None` until the first good load).
pub type AuthorityReceiver = watch::Receiver<Option<Arc<Authority>>>;

/// Where the CA comes from and what the serving certificate names.
#[derive(Clone, Debug)]
pub struct AuthorityConfig {
    /// Folders in Istio's layout, in order of preference.
    pub ca_dirs: Vec<PathBuf>,
    /// DNS SANs of the serving certificate (the Service names proxies dial).
    pub dns_names: Vec<String>,
    pub serving_ttl: Duration,
    pub reload_every: Duration,
}

/// Why no authority could be built.
#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error(
        "no CA: none of {dirs} holds a non-empty {CA_KEY} (mount the plugged-in `cacerts` Secret or `istio-ca-secret`; the controller creates the latter)"
    )]
    NoCa { dirs: String },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the CA in {dir} is unusable: {source}")]
    Ca {
        dir: PathBuf,
        #[source]
        source: CaError,
    },
    #[error("cannot issue the serving certificate: {0}")]
    Serving(#[from] IssueError),
    #[error("cannot build the TLS configuration: {0}")]
    Tls(String),
}

fn read_optional(dir: &Path, name: &str) -> Result<Vec<u8>, AuthorityError> {
    let path = dir.join(name);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(AuthorityError::Read { path, source }),
    }
}

/// The CA files of the first folder that holds a signing key.
pub fn read_ca_files(dirs: &[PathBuf]) -> Result<(PathBuf, CaFiles), AuthorityError> {
    for dir in dirs {
        let files = CaFiles {
            ca_cert: read_optional(dir, CA_CERT)?,
            ca_key: read_optional(dir, CA_KEY)?,
            cert_chain: read_optional(dir, CERT_CHAIN)?,
            root_cert: read_optional(dir, ROOT_CERT)?,
        };
        if files.has_signing_key() {
            return Ok((dir.clone(), files));
        }
    }
    Err(AuthorityError::NoCa {
        dirs: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// Verifies `files`, issues a serving certificate and builds the TLS configuration.
pub fn build(
    config: &AuthorityConfig,
    source: PathBuf,
    files: CaFiles,
    now: SystemTime,
) -> Result<Authority, AuthorityError> {
    let bundle = CaBundle::load(&files, now).map_err(|e| AuthorityError::Ca {
        dir: source.clone(),
        source: e,
    })?;
    let serving: ServingCert =
        issue::issue_serving(&bundle, &config.dns_names, config.serving_ttl, now)?;
    let tls = server_config(&bundle, &serving).map_err(AuthorityError::Tls)?;
    let serving_not_before = pilotfish_ca_unix(now);
    Ok(Authority {
        bundle,
        source,
        tls: Arc::new(tls),
        serving_not_after: serving.not_after,
        serving_not_before,
        files,
    })
}

fn pilotfish_ca_unix(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Whether `current` must be rebuilt: new files, or its serving certificate is past
/// half of its life.
fn stale(current: Option<&Authority>, files: &CaFiles, source: &Path, now: i64) -> bool {
    match current {
        None => true,
        Some(a) => {
            a.files != *files
                || a.source != source
                || now >= a.serving_not_before + (a.serving_not_after - a.serving_not_before) / 2
        }
    }
}

/// One load attempt; publishes a new authority when something changed.
pub fn reload(
    config: &AuthorityConfig,
    tx: &watch::Sender<Option<Arc<Authority>>>,
) -> Result<bool, AuthorityError> {
    let (source, files) = read_ca_files(&config.ca_dirs)?;
    let now = SystemTime::now();
    if !stale(
        tx.borrow().as_deref(),
        &files,
        &source,
        pilotfish_ca_unix(now),
    ) {
        return Ok(false);
    }
    let authority = build(config, source, files, now)?;
    metrics::ROOT_EXPIRY.set(authority.bundle.root_not_after());
    info!(
        ca = %authority.source.display(),
        roots = authority.bundle.roots_der().len(),
        serving_names = ?config.dns_names,
        serving_not_after = authority.serving_not_after,
        "secure port: CA loaded, serving certificate issued"
    );
    tx.send_replace(Some(Arc::new(authority)));
    Ok(true)
}

/// Keeps `tx` current forever (a background task).
pub async fn run(
    config: AuthorityConfig,
    tx: watch::Sender<Option<Arc<Authority>>>,
) -> anyhow::Result<()> {
    let mut failing = false;
    loop {
        match reload(&config, &tx) {
            Ok(_) => failing = false,
            Err(e) => {
                metrics::CA_LOAD_ERRORS.inc();
                if tx.borrow().is_some() {
                    warn!(error = %e, "secure port: cannot reload the CA; the last good one stays in use");
                } else if !failing {
                    error!(error = %e, "secure port: no usable CA yet; TLS connections are refused until one loads");
                }
                failing = true;
            }
        }
        tokio::time::sleep(config.reload_every).await;
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server configuration for one authority.
pub fn server_config(
    bundle: &CaBundle,
    serving: &ServingCert,
) -> Result<rustls::ServerConfig, String> {
    let mut roots = RootCertStore::empty();
    for root in bundle.roots_der() {
        roots
            .add(root.clone())
            .map_err(|e| format!("root certificate: {e}"))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| format!("client verifier: {e}"))?;
    let chain = CertificateDer::pem_slice_iter(serving.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("serving chain: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
        .map_err(|e| format!("serving key: {e}"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("serving certificate: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}
