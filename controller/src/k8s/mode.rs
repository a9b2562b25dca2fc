//! The Kubernetes mode's loop: the one owner of the [`Stores`], the pipeline and the
//! last build. It waits (`select!`) for a watch update, a Lease change, the end of the
//! seed read or the [`Conductor`]'s next deadline, tells the conductor, and performs
//! what the conductor decides: builds (on every replica, so a standby that takes over
//! publishes at once), epochs, publishes and resigns through the pipeline, status jobs
//! for the [`StatusWriter`](super::status::writer::StatusWriter), readiness and
//! `/debug/leader`, metrics and log lines. Every rule — when to build, publish, take an
//! epoch, step down, retry — is the conductor's ([`super::conductor`]); nothing here
//! decides.
//!
//! A result the conductor waits for (a build, an epoch, a publish) is fed back at once,
//! before the loop waits again: awaits run inline, one at a time, as they always have.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use pilotfish_mesh::push_context::{BuildInputs, PushContext};
use pilotfish_shared::bus::PublishOutcome;
use pilotfish_shared::pipeline::seed::Seed;
use pilotfish_shared::pipeline::{Built, Pipeline};
use pilotfish_shared::retry::sleep_until_opt;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::conductor::{Action, Conductor, Event, Notice, PublishResult};
use super::lease::Leadership;
use super::status::plan::{BuildReport, StatusJob};
use super::store::{Stores, Update};
use crate::admin::AdminState;
use crate::metrics;

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
}

/// What the loop owns besides the conductor.
struct State {
    /// Keeps the previous snapshot (last-good fallback, endpoint-only path).
    pipeline: Pipeline,
    stores: Stores,
    /// The last build, published (or retried) by the conductor's `Publish`.
    current: Option<Built>,
    /// What the last full build said, for status jobs.
    report: Option<BuildReport>,
    last_published: Option<serde_json::Value>,
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
        loop {
            let event = tokio::select! {
                update = self.updates.recv() => {
                    let Some(update) = update else { bail!("every watch task is gone") };
                    apply(&mut s.stores, update)
                }
                changed = self.leadership.changed() => {
                    if changed.is_err() {
                        bail!("the Lease task is gone");
                    }
                    Event::Leadership
                }
                _ = sleep_until_opt(conductor.wake_at()) => Event::Tick,
                seeded = seed_opt(&mut seed) => {
                    seed = None;
                    if let Some(previous) = seeded {
                        s.pipeline.seed_previous(Arc::new(previous));
                    }
                    Event::SeedDone
                }
            };
            self.drive(&mut s, &mut conductor, event).await;
        }
    }

    /// Feeds `event`, performs the actions, and feeds back the result of the one the
    /// conductor waits for, until there is none.
    async fn drive(&self, s: &mut State, conductor: &mut Conductor, event: Event) {
        let mut next = Some(event);
        while let Some(event) = next.take() {
            let actions = {
                // The newest Lease view, without marking it seen: the `changed` branch
                // still runs the term rule for it.
                let lease = self.leadership.borrow();
                conductor.handle(event, Instant::now(), &lease)
            };
            for action in actions {
                if let Some(result) = self.perform(s, conductor, action).await {
                    next = Some(result);
                }
            }
        }
    }

    /// Performs one action; returns the result event of an awaited one.
    async fn perform(&self, s: &mut State, conductor: &Conductor, action: Action) -> Option<Event> {
        match action {
            Action::Build {
                endpoints_only,
                events,
            } => Some(self.build(s, endpoints_only, events).await),
            Action::TakeEpoch => Some(match s.pipeline.take_epoch().await {
                Ok(epoch) => {
                    tracing::info!(epoch, "took a new epoch; earlier leaders are fenced");
                    Event::EpochTaken(epoch)
                }
                Err(e) => Event::EpochFailed {
                    error: e.to_string(),
                },
            }),
            Action::Publish => self.publish(s).await.map(Event::PublishDone),
            Action::Resign => {
                s.pipeline.resign().await;
                None
            }
            Action::SendStatusJob => {
                if let Some(report) = &s.report {
                    let job = StatusJob::from_build(s.stores.config_objects(), report);
                    self.status_jobs.send_replace(Some(Arc::new(job)));
                }
                None
            }
            Action::SetReady { ready, detail } => {
                self.admin.set_ready(ready, detail);
                None
            }
            Action::ShowLeader => {
                self.show_leader(s, conductor);
                None
            }
            Action::Notice(notice) => {
                self.log(notice);
                None
            }
        }
    }

    async fn build(&self, s: &mut State, endpoints_only: bool, events: u64) -> Event {
        pilotfish_shared::pipeline::metrics::DEBOUNCE_MERGED.inc_by(events.saturating_sub(1));
        let inputs = s.stores.inputs(&self.base);
        let generations = BuildReport::generations(&inputs);
        let built = s.pipeline.build(inputs, endpoints_only).await;
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
        s.current = Some(built);
        Event::BuildDone { endpoints_only }
    }

    async fn publish(&self, s: &mut State) -> Option<PublishResult> {
        // The conductor asks for a publish only after a build.
        let built = s.current.as_ref()?;
        let result = match s.pipeline.publish(built).await {
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
            Err(e) => {
                self.admin.set_snapshot(built, None);
                PublishResult::Failed {
                    error: e.to_string(),
                }
            }
        };
        Some(result)
    }

    fn log(&self, notice: Notice) {
        let shown = |latest: &Option<pilotfish_shared::bus::SnapshotRef>| {
            latest
                .as_ref()
                .map(|r| r.to_string())
                .unwrap_or_else(|| "none".into())
        };
        match notice {
            Notice::Leading { term } => {
                tracing::info!(identity = %self.identity, term, "leading: taking a new epoch before publishing");
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
            Notice::Refenced { latest, retry_in } => {
                tracing::error!(latest = %shown(&latest), retry_in_ms = retry_in.as_millis() as u64, "publish fenced although this replica holds the Lease: another writer took a newer epoch; taking a new one");
            }
            Notice::Deposed { latest } => {
                tracing::warn!(latest = %shown(&latest), "publish fenced: a newer leader owns `latest`; stepping down");
            }
            Notice::PublishRetry { error, retry_in } => {
                tracing::warn!(error = %error, retry_in_ms = retry_in.as_millis() as u64, "publish failed; retrying");
            }
        }
    }

    fn show_leader(&self, s: &State, conductor: &Conductor) {
        let view = conductor.view(Instant::now());
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

/// Awaits the seed, or forever when there is none (a disabled `select!` branch).
async fn seed_opt(seed: &mut Option<Seed>) -> Option<PushContext> {
    match seed {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}
