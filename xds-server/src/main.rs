//! `pilotfish-xds`: serves ADS (state-of-the-world and delta) to Envoy sidecars and
//! proxyless gRPC clients on port 15010, from one of two sources:
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
use pilotfish_mesh::api;
use pilotfish_mesh::codec::{self, VerifyKeys};
use pilotfish_mesh::push_context::{BuildInputs, PushContext};
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
use pilotfish_xds::ads::{self, AdsConfig, ConnectionPolicy};
use pilotfish_xds::feed::{self, FeedState};
use pilotfish_xds::metrics;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(
    name = "pilotfish-xds",
    version,
    about = "Pilotfish xDS server (ADS for Envoy and proxyless gRPC)"
)]
struct Cli {
    /// ADS gRPC address.
    #[arg(long, env = "PILOTFISH_XDS_ADDR", default_value = "0.0.0.0:15010")]
    xds_addr: SocketAddr,
    /// Admin HTTP address (/metrics, /healthz, /readyz, /debug/*).
    #[arg(long, env = "PILOTFISH_ADMIN_ADDR", default_value = "0.0.0.0:15014")]
    admin_addr: SocketAddr,
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
    /// New ADS streams accepted per second (bursts of twice that); beyond it they are
    /// refused at once with UNAVAILABLE so clients retry another replica. 0: no limit.
    #[arg(
        long,
        env = "PILOTFISH_MAX_NEW_STREAMS_PER_SECOND",
        default_value_t = 100.0
    )]
    max_new_streams_per_second: f64,
    /// Log format.
    #[arg(long, env = "PILOTFISH_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
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
                    ..Default::default()
                },
                debounce_after: cli.debounce_after.as_std(),
                debounce_max: cli.debounce_max.as_std(),
                resync_every: Duration::from_secs(30),
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

    let xds_listener =
        ads::listen(cli.xds_addr).with_context(|| format!("cannot listen on {}", cli.xds_addr))?;
    let admin_listener = TcpListener::bind(cli.admin_addr)
        .await
        .with_context(|| format!("cannot listen on {}", cli.admin_addr))?;
    let (xds_at, admin_at) = (xds_listener.local_addr()?, admin_listener.local_addr()?);
    let config = AdsConfig {
        replica_name: replica.clone(),
        connections: ConnectionPolicy {
            max_age: Some(cli.max_connection_age.as_std()).filter(|age| !age.is_zero()),
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
    let ads_drained = CancellationToken::new();
    let (reg, drain, drained) = (registry.clone(), ads_drain.clone(), ads_drained.clone());
    tasks.spawn("ADS server", async move {
        let _drained_on_exit = drained.drop_guard();
        ads::serve(xds_listener, engine_rx, reg, config, drain).await
    });
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
        admin::serve(admin_listener, admin_ctx, admin_stop).await
    });

    tracing::info!(replica = %replica, xds = %xds_at, admin = %admin_at, "pilotfish-xds listening");
    if let Some(dir) = &cli.config_dir {
        eprintln!(
            "\npilotfish-xds (standalone) is serving {dir}\n  ADS (gRPC):  {xds_at}\n  admin HTTP:  http://{admin_at}/debug/adsz  (also /readyz, /metrics, /debug/syncz, /debug/config_dump?proxyID=...)\n  Envoy:       envoy -c docs/envoy-bootstrap.yaml\n  gRPC client: GRPC_XDS_BOOTSTRAP=docs/grpc-xds-bootstrap.json, dial xds:///reviews.default.svc.cluster.local:9080\n",
            dir = dir.display()
        );
    }

    let code = tasks.wait().await;
    // Drain: not ready any more, stop accepting, end connections spread over the grace
    // so clients reconnect to other replicas; the admin server stays up meanwhile.
    ads_drain.cancel();
    let _ = tokio::time::timeout(shutdown_budget, ads_drained.cancelled()).await;
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init_logging(cli.log_format);
    run_main(run(cli))
}
