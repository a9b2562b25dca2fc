//! The Kubernetes mode's loop: the one owner of the [`Stores`], the pipeline and the
//! last build. It waits (`select!`) for a watch update, a Lease change, progress of the
//! seed read, the landing of the operation in flight or the [`Conductor`]'s next
//! deadline, tells the conductor, and performs what the conductor decides: builds (on
//! every replica, so a standby that takes over publishes at once), epochs, publishes and
//! resigns through the pipeline, status jobs for the
//! [`StatusWriter`](super::status::writer::StatusWriter), readiness and `/debug/leader`,
//! metrics and log lines. Every rule — when to build, publish, take an epoch, stand down,
//! retry — is the conductor's ([`super::conductor`]); nothing here decides.
//!
//! Builds, epochs and publishes run as a *flight*: a future polled beside the other
//! branches, whose result is fed back as an event when it lands. A slow or silent Redis
//! therefore never keeps the loop from ending a term when the claim expires or the Lease
//! changes hands; each Redis flight is also bounded ([`BUS_TIMEOUT`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::StreamExt;
use pilotfish_mesh::push_context::BuildInputs;
use pilotfish_shared::bus::{EpochGrant, PublishOutcome};
use pilotfish_shared::jwks::JwksLink;
use pilotfish_shared::pipeline::seed::{Seed, SeedEvent};
use pilotfish_shared::pipeline::{Built, Pipeline, snapshot_of};
use pilotfish_shared::retry::sleep_until_opt;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::conductor::{Action, Conductor, Event, Notice, PublishResult};
use super::discovery::Selection;
use super::lease::Leadership;
use super::status::plan::{BuildReport, StatusJob};
use super::store::{Stores, Summary, Update};
use crate::admin::AdminState;
use crate::metrics;
use pilotfish_mesh::mesh_config::MeshConfig;
use pilotfish_shared::pipeline::debounce::ChangeClass;

/// The longest an epoch or publish flight may take before it counts as failed (and is
/// retried with backoff). Above the bus's own per-command timeout, so its more specific
/// error normally comes first.
pub const BUS_TIMEOUT: Duration = Duration::from_secs(10);

/// Inputs of the loop.
pub struct ModeLoop {
    pub identity: String,
    pub lease_name: String,
    pub base: BuildInputs,
    pub debounce_after: Duration,
    pub debounce_max: Duration,
    pub updates: mpsc::Receiver<Update>,
    pub leadership: watch::Receiver<Leadership>,
    pub status_jobs: watch::Sender<Option<Arc<StatusJob>>>,
    pub admin: AdminState,
    /// The namespaces `discoverySelectors` select, for the namespaced watches; recomputed
    /// here when the Namespace store or the mesh config changes.
    pub selection: watch::Sender<Arc<Selection>>,
    /// New mesh configs from the `--mesh-config` file (`None`: it never changes).
    pub mesh_updates: Option<watch::Receiver<MeshConfig>>,
    /// The JWKS resolver: told the sources each build needs and whether this replica
    /// leads (only the leader fetches); its new outcomes rebuild.
    pub jwks: Option<JwksLink>,
}

/// What the loop owns besides the conductor.
struct State {
    /// Keeps the previous snapshot (last-good fallback, endpoint-only path).
    pipeline: Pipeline,
    stores: Stores,
    /// The last build, published (or retried) by the conductor's `Publish`.
    current: Option<Arc<Built>>,
    /// What the last full build said, for status jobs.
    report: Option<BuildReport>,
    last_published: Option<serde_json::Value>,
    /// The operation in flight.
    flight: Option<BoxFuture<'static, Landed>>,
    /// What `/debug/leader` last showed of the flight.
    shown_flight: Option<&'static str>,
}

/// What a flight brings back.
enum Landed {
    Built {
        built: Built,
        events: u64,
        generations: std::collections::BTreeMap<pilotfish_mesh::config::ConfigKey, i64>,
    },
    Published {
        built: Arc<Built>,
        result: Result<PublishOutcome, String>,
    },
    Event(Event),
}

impl ModeLoop {
    /// Runs the loop. `seed` reads what is published (the last-good fallback for objects
    /// invalid at start); `None`: nothing to read.
    pub async fn run(mut self, pipeline: Pipeline, mut seed: Option<Seed>) -> Result<()> {
        let mut s = State {
            pipeline,
            stores: Stores::default(),
            current: None,
            report: None,
            last_published: None,
            flight: None,
            shown_flight: None,
        };
        let mut conductor = Conductor::new(
            self.identity.clone(),
            self.debounce_after,
            self.debounce_max,
            seed.is_some(),
            self.leadership.borrow().clone(),
        );
        let started = Event::Started {
            unsynced: s.stores.unsynced(),
        };
        self.drive(&mut s, &mut conductor, started).await;
        let mut key_sets = self.jwks.as_ref().map(|link| link.resolved.clone());
        loop {
            let event = tokio::select! {
                update = self.updates.recv() => {
                    let Some(update) = update else { bail!("every watch task is gone") };
                    let namespaces = update.kind == "Namespace";
                    let event = apply(&mut s.stores, update);
                    if namespaces {
                        self.reselect(&mut s.stores);
                    }
                    event
                }
                mesh = mesh_changed(&mut self.mesh_updates) => {
                    let Some(mesh) = mesh else { bail!("the mesh config reader is gone") };
                    self.base.mesh = mesh;
                    self.reselect(&mut s.stores);
                    // A new mesh config changes what every build makes.
                    Event::Applied {
                        class: ChangeClass::Config,
                        summary: Summary { updated: 1, ..Summary::default() },
                        unsynced: s.stores.unsynced(),
                    }
                }
                changed = self.leadership.changed() => {
                    if changed.is_err() {
                        bail!("the Lease task is gone");
                    }
                    self.want_key_sets(&s);
                    Event::Leadership
                }
                _ = pilotfish_shared::jwks::changed(&mut key_sets) => {
                    // Newly fetched key sets change what every build makes.
                    Event::Applied {
                        class: ChangeClass::Config,
                        summary: Summary { updated: 1, ..Summary::default() },
                        unsynced: s.stores.unsynced(),
                    }
                }
                _ = sleep_until_opt(conductor.wake_at()) => Event::Tick,
                progress = seed_opt(&mut seed) => match progress {
                    Some(SeedEvent::Retrying { error, .. }) => Event::SeedRetrying { error },
                    Some(SeedEvent::Done(found)) => {
                        seed = None;
                        if let Some(previous) = found {
                            s.pipeline.seed_previous(Arc::new(*previous));
                        }
                        Event::SeedDone
                    }
                    None => {
                        seed = None;
                        Event::SeedDone
                    }
                },
                landed = flight_opt(&mut s.flight) => {
                    s.flight = None;
                    match landed {
                        Landed::Built { built, events, generations } => {
                            self.built(&mut s, built, events, generations)
                        }
                        Landed::Published { built, result } => self.published(&mut s, &built, result),
                        Landed::Event(event) => event,
                    }
                }
            };
            self.drive(&mut s, &mut conductor, event).await;
        }
    }

    /// Recomputes the namespace selection; when it changed, drops what it leaves out of
    /// the stores at once and tells the namespaced watches (which list afresh, bringing
    /// the objects of newly selected namespaces).
    fn reselect(&self, stores: &mut Stores) {
        let next = stores.selection(&self.base.mesh.discovery_selectors);
        if **self.selection.borrow() == next {
            return;
        }
        let dropped = stores.retain_selected(&next);
        match &next {
            Selection::Only(set) => tracing::info!(
                selected = set.len(),
                dropped,
                "discoverySelectors select {} namespace(s); listing their objects",
                set.len()
            ),
            Selection::All => tracing::info!("no discoverySelectors: every namespace is read"),
            Selection::Pending => {}
        }
        self.selection.send_replace(Arc::new(next));
    }

    /// Feeds `event` and performs the actions.
    async fn drive(&self, s: &mut State, conductor: &mut Conductor, event: Event) {
        let actions = {
            // The newest Lease view, without marking it seen: the `changed` branch still
            // runs the term rule for it.
            let lease = self.leadership.borrow();
            conductor.handle(event, Instant::now(), &lease)
        };
        for action in actions {
            self.perform(s, conductor, action).await;
        }
        // A flight starting or landing is worth showing (is a publish hanging?).
        if conductor.view(Instant::now()).in_flight.map(|f| f.name()) != s.shown_flight {
            self.show_leader(s, conductor);
        }
    }

    /// Performs one action; one that awaits a result becomes the flight.
    async fn perform(&self, s: &mut State, conductor: &Conductor, action: Action) {
        match action {
            Action::Build {
                endpoints_only,
                events,
            } => {
                let mut base = self.base.clone();
                if let Some(link) = &self.jwks {
                    base.jwks = link.current();
                }
                let inputs = s.stores.inputs(&base);
                let generations = BuildReport::generations(&inputs);
                let build = s.pipeline.start_build(inputs, endpoints_only);
                s.flight = Some(
                    async move {
                        Landed::Built {
                            built: build.await,
                            events,
                            generations,
                        }
                    }
                    .boxed(),
                );
            }
            Action::TakeEpoch { floor } => {
                let publisher = s.pipeline.publisher();
                s.flight = Some(
                    async move {
                        let result =
                            tokio::time::timeout(BUS_TIMEOUT, publisher.take_epoch(floor)).await;
                        Landed::Event(match result {
                            Ok(Ok(EpochGrant::Taken(epoch))) => {
                                tracing::info!(
                                    epoch,
                                    "took a new epoch; earlier leaders are fenced"
                                );
                                Event::EpochTaken(epoch)
                            }
                            Ok(Ok(EpochGrant::Superseded { newer })) => {
                                Event::EpochSuperseded { newer }
                            }
                            Ok(Err(e)) => Event::EpochFailed {
                                error: e.to_string(),
                            },
                            Err(_) => Event::EpochFailed {
                                error: format!("no answer from Redis within {BUS_TIMEOUT:?}"),
                            },
                        })
                    }
                    .boxed(),
                );
            }
            Action::Publish => {
                // The conductor asks for a publish only after a build; should it ever not,
                // the flight still lands (as a failure), or no other could start.
                let Some(built) = s.current.clone() else {
                    s.flight = Some(
                        futures::future::ready(Landed::Event(Event::PublishDone(
                            PublishResult::Failed {
                                error: "nothing built to publish".into(),
                            },
                        )))
                        .boxed(),
                    );
                    return;
                };
                let publisher = s.pipeline.publisher();
                s.flight = Some(
                    async move {
                        let result = match tokio::time::timeout(
                            BUS_TIMEOUT,
                            publisher.publish(snapshot_of(&built)),
                        )
                        .await
                        {
                            Ok(result) => result.map_err(|e| e.to_string()),
                            Err(_) => Err(format!("no answer from Redis within {BUS_TIMEOUT:?}")),
                        };
                        Landed::Published { built, result }
                    }
                    .boxed(),
                );
            }
            Action::Resign => s.pipeline.resign().await,
            Action::SendStatusJob => {
                if let Some(report) = &s.report {
                    let job = StatusJob::from_build(s.stores.config_objects(), report);
                    self.status_jobs.send_replace(Some(Arc::new(job)));
                }
            }
            Action::SetReady { ready, detail } => self.admin.set_ready(ready, detail),
            Action::ShowLeader => self.show_leader(s, conductor),
            Action::Notice(notice) => self.log(notice),
        }
    }

    /// A build landed: it becomes the previous snapshot and the one to publish.
    fn built(
        &self,
        s: &mut State,
        built: Built,
        events: u64,
        generations: std::collections::BTreeMap<pilotfish_mesh::config::ConfigKey, i64>,
    ) -> Event {
        pilotfish_shared::pipeline::metrics::DEBOUNCE_MERGED.inc_by(events.saturating_sub(1));
        s.pipeline.finish_build(&built);
        tracing::debug!(events, endpoints_only = built.endpoints_only, build_ms = built.took.as_millis() as u64, hash = %built.encoded.hash_hex(), "built snapshot");
        if !built.endpoints_only {
            s.report = Some(BuildReport::new(
                &built.findings,
                &built.kept_previous,
                generations,
            ));
        }
        self.admin.set_snapshot(&built, None);
        let endpoints_only = built.endpoints_only;
        s.current = Some(Arc::new(built));
        self.want_key_sets(s);
        Event::BuildDone { endpoints_only }
    }

    /// Tells the JWKS resolver what the last build needs, and whether to fetch: only the
    /// Lease holder reaches out to key servers (a standby's builds are not published).
    fn want_key_sets(&self, s: &State) {
        if let (Some(link), Some(current)) = (&self.jwks, &s.current) {
            let leader = self.leadership.borrow().leader;
            link.want(current.context.jwks_sources(), leader);
        }
    }

    /// A publish landed: what the admin pages and the log say, and the result for the
    /// conductor.
    fn published(
        &self,
        s: &mut State,
        built: &Built,
        result: Result<PublishOutcome, String>,
    ) -> Event {
        let result = match result {
            Ok(outcome) => {
                if let PublishOutcome::Published(r) = &outcome {
                    tracing::info!(version = r.version, epoch = r.epoch, hash = %built.encoded.hash_hex(), path = if built.endpoints_only { "endpoints" } else { "full" }, build_ms = built.took.as_millis() as u64, "published snapshot");
                    s.last_published =
                        Some(json!({"version": r.version, "epoch": r.epoch, "hash": r.hash}));
                }
                self.admin.set_snapshot(built, Some(&outcome));
                match outcome {
                    PublishOutcome::Published(_) => PublishResult::Published,
                    PublishOutcome::Unchanged(_) => PublishResult::Unchanged,
                    PublishOutcome::Fenced { current } => PublishResult::Fenced { latest: current },
                }
            }
            Err(error) => {
                self.admin.set_snapshot(built, None);
                PublishResult::Failed { error }
            }
        };
        Event::PublishDone(result)
    }

    fn log(&self, notice: Notice) {
        let shown = |latest: &Option<pilotfish_shared::bus::SnapshotRef>| {
            latest
                .as_ref()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "none".into())
        };
        match notice {
            Notice::Leading { term, floor } => {
                tracing::info!(identity = %self.identity, term, epoch = floor, "leading: taking the epoch of this Lease acquisition before publishing");
            }
            Notice::NotLeading {
                term,
                epoch,
                holder,
            } => {
                tracing::warn!(identity = %self.identity, term, epoch = ?epoch, holder = ?holder, "no longer leading: publishing stopped");
            }
            Notice::ClaimExpired => {
                tracing::warn!(identity = %self.identity, "the Lease claim expired: publishing stopped");
            }
            Notice::EpochRetry { error, retry_in } => {
                tracing::warn!(error = %error, retry_in_ms = retry_in.as_millis() as u64, "cannot take an epoch yet; not publishing");
            }
            Notice::StoodDown {
                latest,
                newer_epoch,
            } => {
                metrics::STOOD_DOWN.inc();
                tracing::error!(latest = %shown(&latest), newer_epoch = ?newer_epoch, "another writer has a newer epoch although this replica holds the Lease (its view is stale, or a second controller writes this Redis prefix): standing down, publishing nothing more in this term");
            }
            Notice::Deposed { latest } => {
                tracing::warn!(latest = %shown(&latest), "publish fenced: a newer leader owns `latest`; stepping down");
            }
            Notice::PublishRetry { error, retry_in } => {
                tracing::warn!(error = %error, retry_in_ms = retry_in.as_millis() as u64, "publish failed; retrying");
            }
        }
    }

    fn show_leader(&self, s: &mut State, conductor: &Conductor) {
        let view = conductor.view(Instant::now());
        s.shown_flight = view.in_flight.map(|f| f.name());
        metrics::LEADER.set(i64::from(view.term.is_some()));
        let lease = conductor.lease();
        let unsynced = s.stores.unsynced();
        self.admin.set_leader(json!({
            "mode": "kubernetes",
            "identity": self.identity,
            "lease": self.lease_name,
            "leader": view.leader,
            "holder": lease.holder,
            "lease_transitions": lease.transitions,
            "term": view.term,
            "epoch": view.epoch,
            "epoch_floor": (lease.epoch_floor > 0).then_some(lease.epoch_floor),
            "stood_down": view.stood_down,
            "in_flight": view.in_flight.map(|f| f.name()),
            "last_published": s.last_published,
            "synced": unsynced.is_empty(),
            "unsynced": unsynced,
            "objects": s.stores.counts(),
        }));
    }
}

/// Applies one watch update to the stores, counts it, and says what it did.
fn apply(stores: &mut Stores, update: Update) -> Event {
    let (kind, class) = (update.kind, update.class);
    let summary = update.apply(stores);
    for (event, n) in [
        ("add", summary.added),
        ("update", summary.updated),
        ("delete", summary.deleted),
    ] {
        if n > 0 {
            metrics::K8S_CFG_EVENTS
                .with_label_values(&[kind, event])
                .inc_by(n);
        }
    }
    for (reason, n) in [
        ("unchanged", summary.unchanged),
        ("status", summary.status_only),
    ] {
        if n > 0 {
            metrics::K8S_IGNORED_UPDATES
                .with_label_values(&[kind, reason])
                .inc_by(n);
        }
    }
    let unsynced = stores.unsynced();
    if summary.first_sync {
        tracing::info!(kind, remaining = ?unsynced, "initial list complete");
        if unsynced.is_empty() {
            tracing::info!(objects = ?stores.counts(), "every store is synced; building the first snapshot");
        }
    }
    Event::Applied {
        class,
        summary,
        unsynced,
    }
}

/// The next progress of the seed read, or nothing ever when there is none (a disabled
/// `select!` branch).
async fn seed_opt(seed: &mut Option<Seed>) -> Option<SeedEvent> {
    match seed {
        Some(stream) => stream.next().await,
        None => std::future::pending().await,
    }
}

/// The next mesh config, or nothing ever without a file to follow (`None`: the reader
/// is gone).
async fn mesh_changed(rx: &mut Option<watch::Receiver<MeshConfig>>) -> Option<MeshConfig> {
    match rx {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(rx.borrow_and_update().clone()),
            Err(_) => None,
        },
        None => std::future::pending().await,
    }
}

/// The landing of the flight, or nothing ever when none is in the air.
async fn flight_opt(flight: &mut Option<BoxFuture<'static, Landed>>) -> Landed {
    match flight {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}
