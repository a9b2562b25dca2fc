//! A test Kubernetes API server: plain HTTP on loopback, no auth, every built-in kind
//! our flows touch plus CRD-defined kinds, served from one in-memory store. Proven
//! against the real kube-rs, kubectl 1.33 and helm 4 (see `testkit/README.md` for what
//! is faithful, approximated and missing).
//!
//! Public surface: [`TestApiServer`] (start in-process on a free port, URL, kubeconfig,
//! shutdown on drop, the service-account token clock) and [`Config`]. The binary `pilotfish-test-apiserver` wraps it.

mod controllers;
mod convert;
mod defaults;
mod discovery;
mod error;
mod http;
mod meta;
mod openapi;
mod patch;
mod proto;
mod rbac;
mod registry;
mod scale;
mod schema;
mod selector;
mod store;
mod tokens;
mod watch;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::TcpListener;
use tokio::sync::watch as latest;
use tokio::task::JoinHandle;

use store::Store;

/// How to start a server.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listen address; port 0 picks a free port.
    pub addr: SocketAddr,
    /// How many changes the watch history keeps; older resource versions get 410 Gone.
    pub history_limit: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            history_limit: 10_000,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// State every request handler shares.
#[derive(Debug)]
pub(crate) struct Shared {
    store: Mutex<Store>,
    /// The latest committed revision; watches wake when it moves.
    revisions: latest::Receiver<u64>,
    /// Becomes `true` when the server shuts down, ending watch streams.
    shutdown: latest::Receiver<bool>,
    /// `host:port` for the `/api` document.
    server_address: String,
    /// Signs and reviews service-account tokens.
    tokens: tokens::TokenIssuer,
}

impl Shared {
    /// The store lock. A panic while holding it cannot leave the store half-written in
    /// a way later requests care about more than a dead server would, so poisoning is
    /// ignored.
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running test API server. Dropping it stops the server and removes its kubeconfig.
#[derive(Debug)]
pub struct TestApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: latest::Sender<bool>,
    task: Option<JoinHandle<()>>,
    kubeconfig_dir: PathBuf,
}

impl TestApiServer {
    /// Starts a server on a free loopback port.
    pub async fn start() -> Result<Self, StartError> {
        Self::start_with(Config::default()).await
    }

    pub async fn start_with(config: Config) -> Result<Self, StartError> {
        let listener = TcpListener::bind(config.addr)
            .await
            .map_err(|source| StartError::Bind {
                addr: config.addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.addr,
            source,
        })?;
        let (revision_tx, revisions) = latest::channel(0);
        let (shutdown, shutdown_rx) = latest::channel(false);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(config.history_limit, revision_tx)),
            revisions,
            shutdown: shutdown_rx.clone(),
            server_address: addr.to_string(),
            tokens: tokens::TokenIssuer::new(),
        });
        let router = axum::Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        let mut stop = shutdown_rx;
        let task = tokio::spawn(async move {
            let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
                let _ = stop.wait_for(|stopped| *stopped).await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "test API server stopped");
            }
        });
        let kubeconfig_dir = std::env::temp_dir().join(format!(
            "pilotfish-test-apiserver-{}-{}",
            std::process::id(),
            addr.port()
        ));
        let server = TestApiServer {
            addr,
            shared,
            shutdown,
            task: Some(task),
            kubeconfig_dir,
        };
        std::fs::create_dir_all(&server.kubeconfig_dir).map_err(|source| {
            StartError::Kubeconfig {
                path: server.kubeconfig_dir.clone(),
                source,
            }
        })?;
        let path = server.kubeconfig_path();
        server
            .write_kubeconfig(&path)
            .map_err(|source| StartError::Kubeconfig { path, source })?;
        tracing::info!(url = %server.url(), "test API server listening");
        Ok(server)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig pointing at this server (context `pilotfish-test`, namespace `default`).
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: pilotfish-test\n  cluster:\n    server: {url}\ncontexts:\n- name: pilotfish-test\n  context:\n    cluster: pilotfish-test\n    user: pilotfish-test\n    namespace: default\ncurrent-context: pilotfish-test\nusers:\n- name: pilotfish-test\n  user: {{}}\n",
            url = self.url()
        )
    }

    /// Writes the kubeconfig atomically (a reader polling for the file never sees half).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        let partial = path.with_extension("partial");
        std::fs::write(&partial, self.kubeconfig_yaml())?;
        std::fs::rename(&partial, path)
    }

    /// A kubeconfig file written at start, removed when the server is dropped.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.kubeconfig_dir.join("kubeconfig")
    }

    /// Forgets the watch history: open watches get an in-stream `410 Gone` and every
    /// older `resourceVersion` or continue token is refused (like an etcd compaction).
    pub fn expire_watch_history(&self) {
        self.shared.lock().expire_history();
    }

    /// Moves the clock service-account tokens are issued and reviewed by forward, so a
    /// test can see a token expire (TokenRequest refuses lifetimes under ten minutes).
    pub fn advance_token_clock(&self, by: std::time::Duration) {
        self.shared.tokens.advance(by.as_secs() as i64);
    }

    /// The issuer (`iss`) of this server's service-account tokens and its default audience.
    pub const TOKEN_ISSUER: &'static str = tokens::ISSUER;

    /// The current global resource version.
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().revision()
    }

    /// Stops accepting, ends watches, and waits for the server task.
    pub async fn shutdown(mut self) {
        self.shutdown.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        let _ = std::fs::remove_dir_all(&self.kubeconfig_dir);
    }
}
