//! The Kubernetes source of the controller (the default mode): watch the API, build,
//! publish while leading, and report on the Istio objects.
//!
//! Public surface: [`KubeMode`] (settings) and [`KubeMode::tasks`], the long-lived
//! tasks `main` supervises — one watcher per kind ([`watch`]), the Lease election
//! ([`lease`]), the status writer ([`status`]: conditions and Events) and the loop that
//! owns the stores ([`mode`], performing what the [`conductor`] decides), and, with a
//! mesh config file, its reader ([`mesh_file`]). Namespaced watches keep only the
//! namespaces MeshConfig's `discoverySelectors` select ([`discovery`]). Any of them
//! ending ends the process.
//!
//! ```text
//! watchers (12 kinds) ──Update──▶ mode loop: stores ─▶ build ─▶ publish (leader)
//!                                   ▲  ▲▼ events/actions              └──▶ StatusJob ─▶ status writer ─▶ /status, Events
//!                                   │  conductor (debounce, terms, epochs, retries)
//! Lease election ──Leadership──────┘ (and to the status writer: the claim check)
//! ```

pub mod ca_root;
pub mod conductor;
pub mod decode;
pub mod discovery;
pub mod lease;
pub mod mesh_file;
pub mod mode;
pub mod status;
pub mod store;
pub mod watch;

use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::Api;
use pilotfish_mesh::api::{
    AuthorizationPolicy, DestinationRule, PeerAuthentication, RequestAuthentication, ServiceEntry,
    Sidecar, VirtualService,
};
use pilotfish_mesh::push_context::BuildInputs;
use tokio::sync::{mpsc, watch as channel};
use tokio_util::sync::CancellationToken;

use crate::admin::AdminState;
use discovery::Selection;
use lease::{Leadership, LeaseConfig};
use mode::ModeLoop;
use pilotfish_shared::bus::Claim;
use pilotfish_shared::jwks::{Fetcher, JwksLink, ResolverSettings};
use pilotfish_shared::pipeline::Pipeline;
use pilotfish_shared::pipeline::seed::Seed;
use status::writer::{EventSink, StatusWriter};
use store::{Stores, Watched};

/// A named long-lived task for `main` to supervise.
pub type Task = (&'static str, BoxFuture<'static, anyhow::Result<()>>);

/// Settings of the Kubernetes mode.
#[derive(Clone)]
pub struct KubeMode {
    pub client: Client,
    /// Mesh config and cluster domain; the watched objects are added to it.
    pub base: BuildInputs,
    pub debounce_after: Duration,
    pub debounce_max: Duration,
    pub lease: LeaseConfig,
    /// The mesh CA's Secret and root ConfigMaps (leader only); `None`: not managed.
    pub ca_root: Option<ca_root::CaRootConfig>,
    /// The `--mesh-config` file, re-read when it changes (`None`: the defaults, fixed).
    pub mesh_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for KubeMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeMode")
            .field("lease", &self.lease)
            .field("debounce_after", &self.debounce_after)
            .field("debounce_max", &self.debounce_max)
            .finish_non_exhaustive()
    }
}

fn watch_task<K: Watched>(
    client: Client,
    tx: mpsc::Sender<store::Update>,
    selection: Option<channel::Receiver<std::sync::Arc<Selection>>>,
) -> Task
where
    decode::Decoded<K>: kube::Resource<DynamicType = ()>,
{
    let name: &'static str = match K::KIND {
        "VirtualService" => "VirtualService watch",
        "DestinationRule" => "DestinationRule watch",
        "ServiceEntry" => "ServiceEntry watch",
        "PeerAuthentication" => "PeerAuthentication watch",
        "Sidecar" => "Sidecar watch",
        "RequestAuthentication" => "RequestAuthentication watch",
        "AuthorizationPolicy" => "AuthorizationPolicy watch",
        "Service" => "Service watch",
        "EndpointSlice" => "EndpointSlice watch",
        "Pod" => "Pod watch",
        "Node" => "Node watch",
        _ => "Namespace watch",
    };
    (
        name,
        async move {
            watch::run::<K>(client, tx, selection)
                .await
                .map_err(Into::into)
        }
        .boxed(),
    )
}

/// Runs `task` until `shutdown` is cancelled (then ends it with success).
fn until_shutdown(
    shutdown: CancellationToken,
    task: BoxFuture<'static, anyhow::Result<()>>,
) -> BoxFuture<'static, anyhow::Result<()>> {
    async move {
        tokio::select! {
            r = task => r,
            () = shutdown.cancelled() => Ok(()),
        }
    }
    .boxed()
}

/// The JWKS resolver (see [`pilotfish_shared::jwks`]) as a task of the mode, and its link
/// for the loop; `None` (rules needing a fetched key set fail closed) only if no TLS
/// client can be set up.
fn key_set_resolver(tasks: &mut Vec<Task>, shutdown: &CancellationToken) -> Option<JwksLink> {
    let settings = ResolverSettings::default();
    let fetcher = match Fetcher::new(None, settings.max_body_bytes) {
        Ok(f) => f,
        Err(e) => {
            tracing::error!(error = %e, "no HTTP client for JWKS: RequestAuthentication rules with jwksUri or issuer discovery fail closed");
            return None;
        }
    };
    let (link, task) = pilotfish_shared::jwks::resolver(settings, fetcher);
    tasks.push((
        "JWKS resolver",
        until_shutdown(
            shutdown.clone(),
            async move {
                task.await;
                Ok(())
            }
            .boxed(),
        ),
    ));
    Some(link)
}

impl KubeMode {
    /// Builds every task of the mode, and the claim check for the publisher's watchdog
    /// (whether this process holds the Lease now). `seed` reads what is already published
    /// (see [`pilotfish_shared::pipeline::seed`]). `shutdown` being cancelled ends every
    /// task; the Lease task first releases the Lease (if held).
    pub fn tasks(
        self,
        pipeline: Pipeline,
        seed: Option<Seed>,
        admin: AdminState,
        shutdown: CancellationToken,
    ) -> (Vec<Task>, Claim) {
        // Bounded: a flood of events applies back-pressure to the watchers instead of
        // growing memory while a build runs.
        let (updates_tx, updates_rx) = mpsc::channel(1024);
        let (leadership_tx, leadership_rx) =
            channel::channel(Leadership::standby(self.lease.identity.clone()));
        let claim_view = leadership_rx.clone();
        let claim: Claim =
            std::sync::Arc::new(move || claim_view.borrow().holds(tokio::time::Instant::now()));
        let (jobs_tx, jobs_rx) = channel::channel(None);
        let client = self.client.clone();
        // Before the namespaces are listed, selectors select nothing yet (`Pending`).
        let (selection_tx, selection_rx) = channel::channel(std::sync::Arc::new(
            Stores::default().selection(&self.base.mesh.discovery_selectors),
        ));
        let sel = || Some(selection_rx.clone());
        let mut tasks = vec![
            watch_task::<VirtualService>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<DestinationRule>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<ServiceEntry>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<PeerAuthentication>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<Sidecar>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<RequestAuthentication>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<AuthorizationPolicy>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<Service>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<EndpointSlice>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<Pod>(client.clone(), updates_tx.clone(), sel()),
            watch_task::<Node>(client.clone(), updates_tx.clone(), None),
            watch_task::<Namespace>(client.clone(), updates_tx, None),
        ];
        let mesh_updates = self.mesh_file.clone().map(|path| {
            let (tx, rx) = channel::channel(self.base.mesh.clone());
            tasks.push(mesh_file::task(path, tx));
            rx
        });
        // On shutdown every task but the election simply ends; the election first
        // releases the Lease (a standby then takes over without waiting for expiry).
        let mut tasks: Vec<Task> = tasks
            .into_iter()
            .map(|(name, task)| (name, until_shutdown(shutdown.clone(), task)))
            .collect();
        let lease_api: Api<Lease> = Api::namespaced(client.clone(), &self.lease.namespace);
        let lease_config = self.lease.clone();
        let lease_shutdown = shutdown.clone();
        tasks.push((
            "Lease election",
            async move {
                lease::run(lease_api, lease_config, leadership_tx, lease_shutdown)
                    .await
                    .map_err(Into::into)
            }
            .boxed(),
        ));
        let writer = StatusWriter::new(
            client.clone(),
            EventSink::new(client.clone(), &self.lease.identity),
            leadership_rx.clone(),
            jobs_rx,
        );
        tasks.push((
            "status writer",
            until_shutdown(
                shutdown.clone(),
                async move { writer.run().await.map_err(Into::into) }.boxed(),
            ),
        ));
        if let Some(config) = self.ca_root.clone() {
            let (client, leadership) = (client.clone(), leadership_rx.clone());
            tasks.push((
                "CA root publisher",
                until_shutdown(
                    shutdown.clone(),
                    ca_root::run(client, config, leadership).boxed(),
                ),
            ));
        }
        let jwks = key_set_resolver(&mut tasks, &shutdown);
        let mode_loop = ModeLoop {
            identity: self.lease.identity.clone(),
            lease_name: format!("{}/{}", self.lease.namespace, self.lease.name),
            base: self.base,
            debounce_after: self.debounce_after,
            debounce_max: self.debounce_max,
            updates: updates_rx,
            leadership: leadership_rx,
            status_jobs: jobs_tx,
            admin,
            selection: selection_tx,
            mesh_updates,
            jwks,
        };
        tasks.push((
            "controller loop",
            until_shutdown(shutdown, mode_loop.run(pipeline, seed).boxed()),
        ));
        (tasks, claim)
    }
}
