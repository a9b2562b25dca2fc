//! `pilotfish-xds`: serves ADS (state-of-the-world and delta) to Envoy sidecars and
//! proxyless gRPC clients — on the plaintext port 15010 and, with a CA, on the secure
//! port 15012 (TLS, authenticated streams, Istio's CA API) — from one of two sources:
//!
//! - `--redis-url URL`: follow the snapshots the controller publishes (the scaled-out tier),
//!   serving only blobs signed by a key in `--verify-keys`;
//! - `--config-dir DIR`: standalone — read Kubernetes-style YAML from a folder, build
//!   snapshots in-process through an in-memory bus (the same decode path as a replica,
//!   signed with a key made up for this process).
//!
//! `main` supervises every long-lived task (ADS server, admin server, source, feed) and
//! exits non-zero when one of them ends.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use pilotfish_ca::IssuePolicy;
use pilotfish_mesh::api;
use pilotfish_mesh::codec::{self, VerifyKeys};
use pilotfish_mesh::push_context::{BuildInputs, PushContext};
use pilotfish_shared::admin::AdminArgs;
use pilotfish_shared::bus::memory::MemoryBus;
use pilotfish_shared::bus::{BusError, Follower, PublishOutcome, Verified, snapshot_decoder};
use pilotfish_shared::cli::{
    BlobArgs, RedisArgs, ephemeral_signer, load_mesh_config, load_verify_keys, replica_name,
};
use pilotfish_shared::pipeline::folder::{FolderLoop, FolderObserver};
use pilotfish_shared::pipeline::{Built, Pipeline};
use pilotfish_shared::supervise::{Supervisor, run_main};
use pilotfish_shared::telemetry::{self, LogFormat};
use pilotfish_xds::admin::{self, AdminContext};
use pilotfish_xds::ads::ConnectionRegistry;
use pilotfish_xds::ads::{self, AdsConfig, AdsServer, ConnectionPolicy};
use pilotfish_xds::feed::{self, FeedState};
use pilotfish_xds::metrics;
use pilotfish_xds::secure::authn::Authenticator;
use pilotfish_xds::secure::authority::AuthorityConfig;
use pilotfish_xds::secure::ca_service::CaService;
use pilotfish_xds::secure::review::{KubeTokenReviewer, TokenReviewer};
use pilotfish_xds::secure::{self, authority};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// jemalloc rather than glibc's malloc: thousands of streams allocating and freeing small
/// objects on every push spent about a third of the server's CPU in glibc's allocator
/// (`_int_malloc`, `malloc_consolidate`); with glibc a VirtualService edit at 2,000 streams
/// cost a third more CPU (docs/PERFORMANCE.md, run 7, "jemalloc").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser, Debug)]
#[command(
    name = "pilotfish-xds",
    version,
    about = "Pilotfish xDS server (ADS for Envoy and proxyless gRPC)"
)]
struct Cli {
    /// Plaintext ADS gRPC address: unauthenticated (any client may claim any namespace),
    /// for standalone and local use — so only loopback by default; give `0.0.0.0:15010`
    /// to serve the network. `off` disables it.
    #[arg(long, env = "PILOTFISH_XDS_ADDR", default_value = "127.0.0.1:15010")]
    xds_addr: ListenAddr,
    /// Secure port (istiod's 15012): TLS with a serving certificate from the CA, every
    /// stream authenticated (service-account token or mesh client certificate), ADS and
    /// Istio's CA API `CreateCertificate`. `off` disables it; needs --ca-dir.
    #[arg(long, env = "PILOTFISH_SECURE_XDS_ADDR", default_value = "off")]
    secure_xds_addr: ListenAddr,
    /// Folders with the CA in Istio's layout (ca-cert.pem, ca-key.pem, cert-chain.pem,
    /// root-cert.pem), in order of preference: the first holding a ca-key.pem signs
    /// (e.g. the plugged-in `cacerts`, then `istio-ca-secret`). Re-read every 10 s.
    #[arg(long, env = "PILOTFISH_CA_DIR", value_delimiter = ',')]
    ca_dir: Vec<PathBuf>,
    /// Trust domain of issued identities (spiffe://<trust domain>/ns/<ns>/sa/<sa>):
    /// meshConfig.trustDomain.
    #[arg(long, env = "PILOTFISH_TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    /// DNS names of the secure port's serving certificate: the Service names proxies dial
    /// (e.g. pilotfish-xds.pilotfish-system.svc, istiod.istio-system.svc).
    #[arg(
        long,
        env = "PILOTFISH_SERVING_DNS_NAMES",
        value_delimiter = ',',
        default_value = "localhost"
    )]
    serving_dns_names: Vec<String>,
    /// Lifetime of workload certificates when the CSR asks for none (Istio's
    /// DEFAULT_WORKLOAD_CERT_TTL).
    #[arg(long, env = "PILOTFISH_WORKLOAD_CERT_TTL", default_value = "24h")]
    workload_cert_ttl: api::Duration,
    /// Longest lifetime a CSR may ask for (Istio's MAX_WORKLOAD_CERT_TTL).
    #[arg(long, env = "PILOTFISH_MAX_WORKLOAD_CERT_TTL", default_value = "2160h")]
    max_workload_cert_ttl: api::Duration,
    /// Audiences a service-account token must carry (Istio's TOKEN_AUDIENCES).
    #[arg(
        long,
        env = "PILOTFISH_TOKEN_AUDIENCES",
        value_delimiter = ',',
        default_value = "istio-ca"
    )]
    token_audiences: Vec<String>,
    #[command(flatten)]
    admin: AdminArgs,
    /// Standalone: serve the Kubernetes-style YAML in this folder (no cluster, no Redis).
    #[arg(
        long,
        env = "PILOTFISH_CONFIG_DIR",
        conflicts_with = "redis_url",
        required_unless_present = "redis_url"
    )]
    config_dir: Option<PathBuf>,
    /// Follow snapshots in Redis.
    #[command(flatten)]
    redis: RedisArgs,
    /// How often to re-read `latest` without a notification (heals lost messages).
    #[arg(long, env = "PILOTFISH_REDIS_RESYNC", default_value = "10s")]
    redis_resync: api::Duration,
    /// Snapshot blob size limit and the keys that verify blobs (required with --redis-url).
    #[command(flatten)]
    blob: BlobArgs,
    /// Not ready (so the Service sends no *new* streams; open ones keep their
    /// configuration) once `latest` has not been read from Redis for this long. `0s`:
    /// ready as long as a snapshot is held.
    #[arg(long, env = "PILOTFISH_STALE_AFTER", default_value = "10m")]
    stale_after: api::Duration,
    /// Kubernetes cluster domain (standalone mode: resolves short host names).
    #[arg(
        long,
        env = "PILOTFISH_CLUSTER_DOMAIN",
        default_value = "cluster.local"
    )]
    cluster_domain: String,
    /// Istio MeshConfig YAML (standalone mode; replicas get mesh settings in the snapshot).
    #[arg(long, env = "PILOTFISH_MESH_CONFIG")]
    mesh_config: Option<PathBuf>,
    /// Standalone: quiet period before a rebuild.
    #[arg(long, env = "PILOTFISH_DEBOUNCE_AFTER", default_value = "100ms")]
    debounce_after: api::Duration,
    /// Standalone: longest a burst of changes may delay a rebuild.
    #[arg(long, env = "PILOTFISH_DEBOUNCE_MAX", default_value = "1s")]
    debounce_max: api::Duration,
    /// Standalone: send unready (not terminating) endpoints of every service, marked UNHEALTHY, with
    /// the panic threshold off (Istio's PILOT_SEND_UNHEALTHY_ENDPOINTS). Without it only
    /// Services with a traffic distribution get them.
    #[arg(long, env = "PILOTFISH_SEND_UNHEALTHY_ENDPOINTS")]
    send_unhealthy_endpoints: bool,
    /// Standalone: terminate TLS on Sidecar ingress listeners that set `tls` (Istio's
    /// ENABLE_TLS_ON_SIDECAR_INGRESS, off by default: their `tls` is ignored with a warning).
    #[arg(long, env = "PILOTFISH_ENABLE_TLS_ON_SIDECAR_INGRESS")]
    enable_tls_on_sidecar_ingress: bool,
    /// `control_plane.identifier` of every response and the name in logs (default: host name).
    #[arg(long, env = "PILOTFISH_REPLICA_NAME")]
    replica_name: Option<String>,
    /// Client connections are ended (GOAWAY) after this age, ±10% per connection, so load
    /// spreads to new replicas after a scale-up. `0s` keeps connections forever.
    #[arg(long, env = "PILOTFISH_MAX_CONNECTION_AGE", default_value = "30m")]
    max_connection_age: api::Duration,
    /// On SIGTERM: stop accepting, then end connections at random moments within this
    /// grace so clients reconnect to other replicas spread over time; then exit.
    #[arg(long, env = "PILOTFISH_DRAIN_GRACE", default_value = "20s")]
    drain_grace: api::Duration,
    /// New ADS streams accepted per second (bursts of twice that), a quarter of it per
    /// peer address; a stream waits up to 1 s for its turn, else it is refused with
    /// RESOURCE_EXHAUSTED and the client retries with backoff. 0: no limit.
    #[arg(
        long,
        env = "PILOTFISH_MAX_NEW_STREAMS_PER_SECOND",
        default_value_t = 100.0
    )]
    max_new_streams_per_second: f64,
    /// Most ADS connections open at once per port; one beyond is closed at once. 0: no cap.
    #[arg(long, env = "PILOTFISH_MAX_CONNECTIONS", default_value_t = ads::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// An ADS connection that has not finished its TLS handshake (secure port) and sent the
    /// HTTP/2 preface and SETTINGS within this is closed.
    #[arg(long, env = "PILOTFISH_HANDSHAKE_TIMEOUT", default_value = "10s")]
    handshake_timeout: api::Duration,
    /// Log format.
    #[arg(long, env = "PILOTFISH_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

/// A listen address, or `off`.
#[derive(Clone, Copy, Debug)]
struct ListenAddr(Option<SocketAddr>);

impl std::str::FromStr for ListenAddr {
    type Err = std::net::AddrParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("off") {
            Ok(ListenAddr(None))
        } else {
            s.parse().map(|a| ListenAddr(Some(a)))
        }
    }
}

/// Logs the standalone folder's publishes (the in-memory bus never fails or fences).
struct StandaloneLog;

impl FolderObserver for StandaloneLog {
    fn published(&self, built: &Built, outcome: Result<&PublishOutcome, &BusError>) {
        if let Err(e) = outcome {
            tracing::error!(error = %e, "in-memory publish failed");
        } else if !built.kept_previous.is_empty() {
            tracing::warn!(objects = ?built.kept_previous.iter().map(ToString::to_string).collect::<Vec<_>>(), "invalid edits: the last accepted versions stay in use");
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let replica = replica_name(cli.replica_name.clone(), "pilotfish-xds");
    metrics::register_all();
    let limits = cli.blob.limits();
    let mut tasks = Supervisor::new();

    let follower: Follower<Arc<PushContext>> = match (&cli.config_dir, cli.redis.config()?) {
        (Some(dir), _) => {
            let mesh =
                load_mesh_config(cli.mesh_config.as_deref()).context("invalid --mesh-config")?;
            if !dir.is_dir() {
                bail!("--config-dir {}: not a folder", dir.display());
            }
            // Standalone signs and verifies in-process: a key made up for this run.
            let signer = ephemeral_signer();
            let decode = arc_decoder(limits, VerifyKeys::new([signer.verify_key()]));
            let bus = MemoryBus::new();
            let (follower, follow_task) = bus.follow(decode);
            tasks.spawn_background("snapshot follower", follow_task.join());
            let folder = FolderLoop {
                dir: dir.clone(),
                base: BuildInputs {
                    mesh,
                    cluster_domain: cli.cluster_domain.clone(),
                    send_unhealthy_endpoints: cli.send_unhealthy_endpoints,
                    enable_tls_on_sidecar_ingress: cli.enable_tls_on_sidecar_ingress,
                    ..Default::default()
                },
                debounce_after: cli.debounce_after.as_std(),
                debounce_max: cli.debounce_max.as_std(),
                resync_every: Duration::from_secs(30),
                // Standalone, this process is its own control plane: it fetches key sets.
                jwks: Some(
                    pilotfish_shared::jwks::spawn_default(&mut tasks)
                        .map_err(anyhow::Error::msg)
                        .context("the JWKS resolver's HTTP client")?,
                ),
            };
            let pipeline = Pipeline::new(Arc::new(bus.publisher()), signer);
            tasks.spawn_background("config folder", async move {
                folder.run(pipeline, None, &StandaloneLog).await
            });
            follower
        }
        (None, Some(config)) => {
            if cli.blob.verify_keys.is_empty() {
                bail!(
                    "a replica serves only snapshots it can verify: give --verify-keys (the controller's public key, PEM)"
                );
            }
            let keys = load_verify_keys(&cli.blob.verify_keys).context("invalid --verify-keys")?;
            let stale_after = Some(cli.stale_after.as_std()).filter(|d| !d.is_zero());
            let config = config
                .with_resync_interval(cli.redis_resync.as_std())
                .with_max_blob_bytes(cli.blob.max_blob_bytes as u64)
                .with_stale_after(stale_after);
            tracing::info!(redis = %config, verify_keys = ?keys.ids().iter().map(ToString::to_string).collect::<Vec<_>>(), ?stale_after, "following snapshots in Redis");
            let (follower, follow_task) =
                pilotfish_shared::bus::redis::follow(config, arc_decoder(limits, keys))?;
            tasks.spawn_background("snapshot follower", follow_task.join());
            follower
        }
        (None, None) => bail!("give --config-dir DIR (standalone) or --redis-url URL"),
    };

    let registry = ConnectionRegistry::new();
    let feed_state = Arc::new(FeedState::default());
    let (engine_tx, engine_rx) = tokio::sync::watch::channel(None);
    let snapshots = follower.subscribe();
    let (state, reg) = (feed_state.clone(), registry.clone());
    tasks.spawn_background("snapshot feed", async move {
        feed::run(snapshots, engine_tx, state, reg).await;
        Ok::<(), anyhow::Error>(())
    });

    // The ADS ports take a long accept backlog (ads::listen): a dead replica's proxies
    // arrive at once.
    let listen =
        |addr: SocketAddr| ads::listen(addr).with_context(|| format!("cannot listen on {addr}"));
    let xds_listener = match cli.xds_addr.0 {
        Some(addr) => Some(listen(addr)?),
        None => None,
    };
    let secure_listener = match cli.secure_xds_addr.0 {
        Some(_) if cli.ca_dir.is_empty() => {
            bail!("--secure-xds-addr needs --ca-dir (the CA that signs and serves)")
        }
        Some(addr) => Some(listen(addr)?),
        None => None,
    };
    if xds_listener.is_none() && secure_listener.is_none() {
        bail!("both ADS ports are off: give --xds-addr or --secure-xds-addr");
    }
    let admin_addr = cli.admin.admin_addr;
    let admin_listener = TcpListener::bind(admin_addr)
        .await
        .with_context(|| format!("cannot listen on {admin_addr}"))?;
    let local = |l: &Option<TcpListener>| l.as_ref().and_then(|l| l.local_addr().ok());
    let (xds_at, secure_at) = (local(&xds_listener), local(&secure_listener));
    let admin_at = admin_listener.local_addr()?;
    let config = AdsConfig {
        replica_name: replica.clone(),
        connections: ConnectionPolicy {
            max_age: Some(cli.max_connection_age.as_std()).filter(|age| !age.is_zero()),
            max_connections: Some(cli.max_connections).filter(|n| *n > 0),
            handshake_timeout: cli.handshake_timeout.as_std(),
            ..ConnectionPolicy::default()
        },
        drain_grace: cli.drain_grace.as_std(),
        new_streams_per_second: Some(cli.max_new_streams_per_second).filter(|r| *r > 0.0),
        ..AdsConfig::default()
    };
    let shutdown_budget =
        config.drain_grace + config.connections.close_grace + Duration::from_secs(5);
    // Shutdown order: the ADS drain (a child of the process's root token) first, the
    // admin server (the root) last, so /readyz reports the drain while it runs.
    let ads_drain = tasks.shutdown_token().child_token();
    let mut drained = Vec::new();
    if let Some(listener) = xds_listener {
        let done = CancellationToken::new();
        drained.push(done.clone());
        let (reg, drain, config) = (registry.clone(), ads_drain.clone(), config.clone());
        let snapshots = engine_rx.clone();
        tasks.spawn("ADS server", async move {
            let _drained_on_exit = done.drop_guard();
            ads::serve(listener, snapshots, reg, config, drain).await
        });
    }
    if let Some(listener) = secure_listener {
        let (authorities_tx, authorities) = tokio::sync::watch::channel(None);
        let authority = AuthorityConfig {
            ca_dirs: cli.ca_dir.clone(),
            dns_names: cli.serving_dns_names.clone(),
            serving_ttl: Duration::from_secs(24 * 3600),
            reload_every: Duration::from_secs(10),
        };
        tasks.spawn_background("CA loader", authority::run(authority, authorities_tx));
        let reviewer = token_reviewer().await;
        let authn = Arc::new(Authenticator::new(
            cli.trust_domain.clone(),
            cli.token_audiences.clone(),
            reviewer,
        ));
        let ca = CaService {
            authorities,
            policy: IssuePolicy {
                default_ttl: cli.workload_cert_ttl.as_std(),
                max_ttl: cli.max_workload_cert_ttl.as_std(),
            },
        };
        let done = CancellationToken::new();
        drained.push(done.clone());
        let server = AdsServer::new(
            engine_rx.clone(),
            registry.clone(),
            config.clone(),
            ads_drain.clone(),
        );
        let (drain, policy, grace) = (
            ads_drain.clone(),
            config.connections.clone(),
            config.drain_grace,
        );
        tasks.spawn("secure ADS and CA server", async move {
            let _drained_on_exit = done.drop_guard();
            secure::serve(listener, server, ca, authn, policy, drain, grace).await;
            Ok::<(), anyhow::Error>(())
        });
    }
    let follower_for_admin = follower.clone();
    let admin_ctx = AdminContext {
        registry,
        feed: feed_state,
        follower: Arc::new(move || follower_for_admin.status()),
        replica_name: replica.clone(),
        draining: ads_drain.clone(),
    };
    let admin_stop = tasks.shutdown_token();
    tasks.spawn("admin server", async move {
        admin::serve(
            admin_listener,
            admin_ctx,
            cli.admin.expose_debug_pages,
            admin_stop,
        )
        .await
    });

    tracing::info!(replica = %replica, xds = ?xds_at, secure = ?secure_at, admin = %admin_at, "pilotfish-xds listening");
    if let Some(dir) = &cli.config_dir {
        eprintln!(
            "\npilotfish-xds (standalone) is serving {dir}\n  ADS (gRPC):  {xds_at}\n  admin HTTP:  http://{admin_at}/debug/adsz  (also /readyz, /metrics, /debug/syncz, /debug/config_dump?proxyID=...)\n  Envoy:       envoy -c docs/envoy-bootstrap.yaml\n  gRPC client: GRPC_XDS_BOOTSTRAP=docs/grpc-xds-bootstrap.json, dial xds:///reviews.default.svc.cluster.local:9080\n",
            dir = dir.display(),
            xds_at = xds_at.map_or_else(|| "off".to_string(), |a| a.to_string()),
        );
    }

    let code = tasks.wait().await;
    // Drain: not ready any more, stop accepting, end connections spread over the grace
    // so clients reconnect to other replicas; the admin server stays up meanwhile.
    ads_drain.cancel();
    let _ = tokio::time::timeout(shutdown_budget, async {
        for done in &drained {
            done.cancelled().await;
        }
    })
    .await;
    // Then everything else, the admin server last.
    tasks.shutdown(Duration::from_secs(2)).await;
    Ok(code)
}

/// The follower's decode function: verified snapshots, shared by the feed as `Arc`s.
fn arc_decoder(
    limits: pilotfish_mesh::codec::DecodeLimits,
    keys: VerifyKeys,
) -> impl Fn(&[u8]) -> Result<Verified<Arc<PushContext>>, codec::DecodeError> + Send + Sync + 'static
{
    let decode = snapshot_decoder(limits, keys);
    move |blob: &[u8]| {
        decode(blob).map(|v| Verified {
            value: Arc::new(v.value),
            hash: v.hash,
        })
    }
}

/// TokenReview through the cluster the process runs in (or KUBECONFIG); `None` — and
/// tokens refused, certificates still accepted — when there is none.
async fn token_reviewer() -> Option<Arc<dyn TokenReviewer>> {
    match kube::Config::infer().await {
        Ok(config) => match kube::Client::try_from(config) {
            Ok(client) => Some(Arc::new(KubeTokenReviewer::new(client))),
            Err(e) => {
                tracing::warn!(error = %e, "secure port: cannot build a Kubernetes client; service-account tokens will be refused");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "secure port: no Kubernetes API (in-cluster or KUBECONFIG); service-account tokens will be refused, client certificates still authenticate");
            None
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init_logging(cli.log_format);
    run_main(run(cli))
}
