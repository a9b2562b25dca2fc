//! `pilotfish-controller`: builds mesh snapshots from configuration and publishes them to
//! Redis for the xDS replicas. Sources: a folder of YAML (`--config-dir`) or, by default,
//! the Kubernetes API. `validate` checks configs offline.
//!
//! `main` supervises every long-lived task (watchers, Lease election, status writer,
//! source loop, admin server, Redis watchdog): if any of them ends, the process exits
//! non-zero, so a dead task never hides behind a healthy-looking pod.
//!
//! Snapshots are signed with `--signing-key-file` (Ed25519, PKCS#8 PEM); replicas verify
//! them with the public key. The controller verifies what it reads back at start with its
//! own public key and any `--verify-keys` (a previous key, during a rotation).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use pilotfish_controller::k8s::lease::{LeaseConfig, LeaseTimings};
use pilotfish_controller::{admin, k8s, metrics, validate_cmd};
use pilotfish_mesh::api;
use pilotfish_mesh::push_context::BuildInputs;
use pilotfish_shared::admin::AdminArgs;
use pilotfish_shared::bus::redis::RedisPublisher;
use pilotfish_shared::bus::{BusError, Claim, PublishOutcome};
use pilotfish_shared::cli::{
    BlobArgs, RedisArgs, load_mesh_config, load_signing_key, load_verify_keys, replica_name,
    unique_identity,
};
use pilotfish_shared::pipeline::folder::{FolderLoop, FolderObserver};
use pilotfish_shared::pipeline::{self, Built, Pipeline};
use pilotfish_shared::supervise::{Supervisor, run_main};
use pilotfish_shared::telemetry::{self, LogFormat};

#[derive(Parser, Debug)]
#[command(
    name = "pilotfish-controller",
    version,
    about = "Pilotfish controller: builds mesh snapshots and publishes them to Redis"
)]
struct Cli {
    /// Kubernetes cluster domain used to resolve short host names.
    #[arg(
        long,
        env = "PILOTFISH_CLUSTER_DOMAIN",
        default_value = "cluster.local",
        global = true
    )]
    cluster_domain: String,
    /// Istio MeshConfig YAML (the subset Pilotfish honours: rootNamespace, outboundTrafficPolicy, ...).
    #[arg(long, env = "PILOTFISH_MESH_CONFIG", global = true)]
    mesh_config: Option<PathBuf>,
    /// Log format.
    #[arg(
        long,
        env = "PILOTFISH_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate Istio configs offline (like `istioctl validate`); exit 1 on errors.
    Validate {
        /// Files or folders of YAML (multi-document, `kind: List` allowed).
        #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
        files: Vec<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
        output: validate_cmd::OutputFormat,
    },
}

/// Flags of the run mode (no subcommand).
#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    admin: AdminArgs,
    /// Redis to publish snapshots to.
    #[command(flatten)]
    redis: RedisArgs,
    /// Snapshot blob size limit and extra verify keys (for reading back what a previous
    /// signing key published, during a rotation).
    #[command(flatten)]
    blob: BlobArgs,
    /// The Ed25519 private key (PKCS#8 PEM: `openssl genpkey -algorithm ed25519`) that
    /// signs every snapshot; replicas hold its public key.
    #[arg(long, env = "PILOTFISH_SIGNING_KEY_FILE")]
    signing_key_file: Option<PathBuf>,
    /// Read configuration from this folder instead of the Kubernetes API.
    #[arg(long, env = "PILOTFISH_CONFIG_DIR")]
    config_dir: Option<PathBuf>,
    /// Quiet period before a rebuild (Istio/Go duration: 100ms, 1s).
    #[arg(long, env = "PILOTFISH_DEBOUNCE_AFTER", default_value = "100ms")]
    debounce_after: api::Duration,
    /// Longest a burst of changes may delay a rebuild.
    #[arg(long, env = "PILOTFISH_DEBOUNCE_MAX", default_value = "1s")]
    debounce_max: api::Duration,
    /// Send unready (not terminating) endpoints of every service, marked UNHEALTHY, with
    /// the panic threshold off (Istio's PILOT_SEND_UNHEALTHY_ENDPOINTS). Without it only
    /// Services with a traffic distribution get them.
    #[arg(long, env = "PILOTFISH_SEND_UNHEALTHY_ENDPOINTS")]
    send_unhealthy_endpoints: bool,
    /// Terminate TLS on Sidecar ingress listeners that set `tls` (Istio's
    /// ENABLE_TLS_ON_SIDECAR_INGRESS, off by default: their `tls` is ignored with a warning).
    #[arg(long, env = "PILOTFISH_ENABLE_TLS_ON_SIDECAR_INGRESS")]
    enable_tls_on_sidecar_ingress: bool,
    /// Name of this replica in logs and the Lease (default: the host name).
    #[arg(long, env = "PILOTFISH_REPLICA_NAME")]
    replica_name: Option<String>,
    /// Name of the coordination.k8s.io/v1 Lease used for leader election.
    #[arg(
        long,
        env = "PILOTFISH_LEASE_NAME",
        default_value = "pilotfish-controller"
    )]
    lease_name: String,
    /// Namespace of the Lease (default: $POD_NAMESPACE, else istio-system).
    #[arg(long, env = "PILOTFISH_LEASE_NAMESPACE")]
    lease_namespace: Option<String>,
    /// How long a standby waits after the Lease last changed before taking it.
    #[arg(long, env = "PILOTFISH_LEASE_DURATION", default_value = "15s")]
    lease_duration: api::Duration,
    /// How long the leader keeps leading without a successful renewal.
    #[arg(long, env = "PILOTFISH_RENEW_DEADLINE", default_value = "10s")]
    renew_deadline: api::Duration,
    /// Manage the mesh CA (leader only): use the plugged-in `cacerts` Secret of the
    /// Lease namespace, else create `istio-ca-secret` with a self-signed root when
    /// missing, and publish the root as ConfigMap `istio-ca-root-cert` in every namespace.
    #[arg(long, env = "PILOTFISH_MANAGE_CA")]
    manage_ca: bool,
    /// Trust domain (meshConfig.trustDomain): the organization of a self-signed root.
    #[arg(long, env = "PILOTFISH_TRUST_DOMAIN", default_value = "cluster.local")]
    trust_domain: String,
    /// Interval between Lease renewals and between attempts.
    #[arg(long, env = "PILOTFISH_RETRY_PERIOD", default_value = "2s")]
    retry_period: api::Duration,
}

/// Shows the `--config-dir` loop's progress on the admin pages.
struct FolderAdmin(admin::AdminState);

impl FolderObserver for FolderAdmin {
    fn epoch_taken(&self, epoch: u64) {
        self.0
            .set_leader(serde_json::json!({"mode": "config-dir", "leader": true, "epoch": epoch}));
    }

    fn seed_retrying(&self, error: &str) {
        self.0.set_ready(
            false,
            format!("waiting to read back the published snapshot (it keeps the last good version of objects invalid now); Redis: {error}"),
        );
    }

    fn published(&self, built: &Built, outcome: Result<&PublishOutcome, &BusError>) {
        match outcome {
            Ok(o @ (PublishOutcome::Published(_) | PublishOutcome::Unchanged(_))) => {
                self.0.set_snapshot(built, Some(o));
                self.0.set_ready(true, "published the folder's snapshot");
            }
            Ok(fenced) => self.0.set_snapshot(built, Some(fenced)),
            Err(_) => self.0.set_snapshot(built, None),
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    let mesh = load_mesh_config(cli.mesh_config.as_deref()).context("invalid --mesh-config")?;
    if let Some(Command::Validate { files, output }) = cli.command {
        let report = validate_cmd::validate_paths(&files, mesh, &cli.cluster_domain)?;
        let code = validate_cmd::print(&report, output, &mut std::io::stdout().lock())?;
        return Ok(ExitCode::from(code as u8));
    }
    let args = cli.run;
    let replica = replica_name(args.replica_name.clone(), "pilotfish-controller");
    let Some(redis) = args.redis.config()? else {
        bail!("the controller publishes snapshots to Redis: give --redis-url (or use `validate`)");
    };
    let Some(key_file) = &args.signing_key_file else {
        bail!(
            "the controller signs snapshots: give --signing-key-file (an Ed25519 private key in PKCS#8 PEM, e.g. from `openssl genpkey -algorithm ed25519`)"
        );
    };
    let signer = load_signing_key(key_file).context("invalid --signing-key-file")?;
    let mut verify_keys =
        load_verify_keys(&args.blob.verify_keys).context("invalid --verify-keys")?;
    verify_keys.insert(signer.verify_key());
    let limits = args.blob.limits();
    let redis = redis.with_max_blob_bytes(args.blob.max_blob_bytes as u64);
    let publisher = RedisPublisher::new(redis.clone())?;
    let timings = LeaseTimings {
        lease_duration: args.lease_duration.as_std(),
        renew_deadline: args.renew_deadline.as_std(),
        retry_period: args.retry_period.as_std(),
    };
    if args.config_dir.is_none() {
        timings.validate()?;
    }
    let admin_state = admin::AdminState::default();
    let admin_listener = admin::bind(args.admin.admin_addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.admin.admin_addr))?;
    tracing::info!(replica = %replica, admin = %admin_listener.local_addr()?, redis = %redis, key_id = %signer.key_id(), "pilotfish-controller starting");

    let mut tasks = Supervisor::new();
    let (state, admin_stop) = (admin_state.clone(), tasks.shutdown_token());
    tasks.spawn("admin server", async move {
        admin::serve(
            admin_listener,
            state,
            args.admin.expose_debug_pages,
            admin_stop,
        )
        .await
    });
    let base = BuildInputs {
        mesh,
        cluster_domain: cli.cluster_domain.clone(),
        send_unhealthy_endpoints: args.send_unhealthy_endpoints,
        enable_tls_on_sidecar_ingress: args.enable_tls_on_sidecar_ingress,
        ..Default::default()
    };
    let pipeline = Pipeline::new(Arc::new(publisher.clone()), signer);
    let seed = pipeline::seed::read_published(Arc::new(publisher.clone()), limits, verify_keys);
    let claim: Claim = match args.config_dir {
        Some(dir) => {
            let folder = FolderLoop {
                dir,
                base,
                debounce_after: args.debounce_after.as_std(),
                debounce_max: args.debounce_max.as_std(),
                resync_every: Duration::from_secs(30),
                jwks: Some(
                    pilotfish_shared::jwks::spawn_default(&mut tasks)
                        .map_err(anyhow::Error::msg)
                        .context("the JWKS resolver's HTTP client")?,
                ),
            };
            metrics::LEADER.set(1);
            admin_state.set_leader(serde_json::json!({"mode": "config-dir", "leader": true, "note": "one writer per key prefix; no Lease"}));
            let observer = FolderAdmin(admin_state.clone());
            tasks.spawn_background("config-dir source", async move {
                folder.run(pipeline, Some(seed), &observer).await
            });
            // No Lease: one writer per prefix; a fenced writer stops by itself.
            Arc::new(|| true)
        }
        None => {
            let client = kube::Client::try_default().await.context(
                "cannot configure the Kubernetes client (in-cluster, or KUBECONFIG / ~/.kube/config)",
            )?;
            let lease_namespace = args
                .lease_namespace
                .clone()
                .or_else(|| {
                    std::env::var("POD_NAMESPACE")
                        .ok()
                        .filter(|n| !n.is_empty())
                })
                .unwrap_or_else(|| "istio-system".to_string());
            let identity = unique_identity(&replica);
            let ca_root = args.manage_ca.then(|| k8s::ca_root::CaRootConfig {
                namespace: lease_namespace.clone(),
                trust_domain: args.trust_domain.clone(),
                recheck_every: k8s::ca_root::RECHECK_CA_EVERY,
            });
            let mode = k8s::KubeMode {
                ca_root,
                client,
                base,
                mesh_file: cli.mesh_config.clone(),
                debounce_after: args.debounce_after.as_std(),
                debounce_max: args.debounce_max.as_std(),
                lease: LeaseConfig {
                    name: args.lease_name.clone(),
                    namespace: lease_namespace,
                    identity: identity.clone(),
                    timings,
                },
            };
            tracing::info!(lease = %format!("{}/{}", mode.lease.namespace, mode.lease.name), identity = %identity, ?timings, "Kubernetes source: watching the API, electing a leader");
            let (mode_tasks, claim) = mode.tasks(
                pipeline,
                Some(seed),
                admin_state.clone(),
                tasks.shutdown_token(),
            );
            for (name, task) in mode_tasks {
                tasks.spawn(name, task);
            }
            claim
        }
    };
    tasks.spawn_background("Redis watchdog", publisher.spawn_watchdog(claim).join());

    let code = tasks.wait().await;
    // Cancels the root token: every task ends; the Lease task first releases the Lease
    // (bounded by the grace period, so an unreachable API server cannot hold up exit).
    tasks.shutdown(Duration::from_secs(5)).await;
    Ok(code)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init_logging(cli.log_format);
    run_main(run(cli))
}
