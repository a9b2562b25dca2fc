//! The Kubernetes mode's loop: the one owner of the [`Stores`]. It applies watched
//! changes, debounces them, builds snapshots (on every replica, so a standby that takes
//! over publishes at once), publishes while it holds the Lease, and hands status work to
//! the [`StatusWriter`](super::status::StatusWriter).
//!
//! Ordering rules, each for a reason:
//! - nothing is built before every store has completed its initial list (a restart must
//!   never publish a partial mesh) and before the published snapshot has been read back as
//!   the builder's "previous" (bounded): an object that is invalid at restart keeps its
//!   last accepted version instead of dropping out;
//! - on acquiring the Lease, a new epoch is taken from the bus *before* the first
//!   publish, which fences any earlier leader still trying to write;
//! - the claim ([`Leadership::holds`]) is re-checked right before every publish, and the
//!   loop also wakes when the claim would expire, so losing it stops publishing at once
//!   even if the Lease task is slow to say so;
//! - a fenced publish while our claim still holds means a stale writer took an epoch:
//!   the epoch is taken again (with backoff); without the claim, we resign.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail};
use pilotfish_shared::bus::PublishOutcome;
use pilotfish_shared::push_context::BuildInputs;
use pilotfish_shared::push_context::PushContext;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::lease::Leadership;
use super::status::{BuildReport, StatusJob};
use super::store::{Stores, Update};
use crate::admin::AdminState;
use crate::metrics;
use pilotfish_shared::pipeline::debounce::{ChangeClass, Debouncer};
use pilotfish_shared::pipeline::seed::Seed;
use pilotfish_shared::pipeline::{Built, Pipeline};
use pilotfish_shared::retry::{Backoff, random_unit, sleep_until_opt};

/// Retries from 200 ms up to 10 s.
const RETRY: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));

fn retry_delay(attempt: u32) -> Duration {
    RETRY.delay(attempt, random_unit())
}

/// One leadership term as the loop tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Term {
    term: u64,
    epoch: Option<u64>,
    /// Times this term's epoch was taken again after a fenced publish.
    refenced: u32,
}

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

struct State {
    /// Keeps the previous snapshot (last-good fallback, endpoint-only path).
    pipeline: Pipeline,
    stores: Stores,
    debounce: Debouncer,
    current: Option<Built>,
    report: Option<BuildReport>,
    publish_needed: bool,
    publish_retry_at: Option<Instant>,
    publish_attempt: u32,
    epoch_retry_at: Option<Instant>,
    epoch_attempt: u32,
    term: Option<Term>,
    last_published: Option<serde_json::Value>,
}

impl ModeLoop {
    /// Runs the loop. `seed` reads what is published (the last-good fallback for objects
    /// invalid at start); `None`: nothing to read.
    pub async fn run(mut self, pipeline: Pipeline, mut seed: Option<Seed>) -> Result<()> {
        let mut s = State {
            pipeline,
            stores: Stores::default(),
            debounce: Debouncer::new(self.debounce_after, self.debounce_max),
            current: None,
            report: None,
            publish_needed: false,
            publish_retry_at: None,
            publish_attempt: 0,
            epoch_retry_at: None,
            epoch_attempt: 0,
            term: None,
            last_published: None,
        };
        metrics::LEADER.set(0);
        self.admin.set_ready(
            false,
            format!(
                "waiting for the initial list of: {}",
                s.stores.unsynced().join(", ")
            ),
        );
        self.show_leader(&s);
        loop {
            let due = if s.stores.all_synced() && seed.is_none() {
                s.debounce.deadline().map(Instant::from_std)
            } else {
                None
            };
            let claim_expires = s.term.and_then(|_| self.leadership.borrow().valid_until);
            tokio::select! {
                update = self.updates.recv() => {
                    let Some(update) = update else { bail!("every watch task is gone") };
                    self.on_update(&mut s, update);
                }
                changed = self.leadership.changed() => {
                    if changed.is_err() {
                        bail!("the Lease task is gone");
                    }
                    self.on_leadership(&mut s).await;
                }
                _ = sleep_until_opt(claim_expires) => self.on_leadership(&mut s).await,
                _ = sleep_until_opt(due) => self.rebuild(&mut s).await,
                _ = sleep_until_opt(s.epoch_retry_at) => self.take_epoch(&mut s).await,
                _ = sleep_until_opt(s.publish_retry_at) => self.publish(&mut s).await,
                seeded = seed_opt(&mut seed) => {
                    seed = None;
                    if let Some(previous) = seeded {
                        s.pipeline.seed_previous(Arc::new(previous));
                    }
                }
            }
        }
    }

    fn holds(&self) -> bool {
        self.leadership.borrow().holds(Instant::now())
    }

    fn on_update(&self, s: &mut State, update: Update) {
        let (kind, class) = (update.kind, update.class);
        let summary = update.apply(&mut s.stores);
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
        if summary.mesh_changed() {
            s.debounce.event(std::time::Instant::now(), class);
        }
        if summary.first_sync {
            let unsynced = s.stores.unsynced();
            tracing::info!(kind, remaining = ?unsynced, "initial list complete");
            if unsynced.is_empty() {
                tracing::info!(objects = ?s.stores.counts(), "every store is synced; building the first snapshot");
                // The first build: a full one, due after the usual quiet period.
                s.debounce
                    .event(std::time::Instant::now(), ChangeClass::Config);
                self.set_ready(s);
            } else {
                self.admin.set_ready(
                    false,
                    format!("waiting for the initial list of: {}", unsynced.join(", ")),
                );
            }
            self.show_leader(s);
        }
        if summary.status_changed() && !summary.mesh_changed() {
            // Statuses changed under us (our own echo, or someone else's write): compare
            // again, without a rebuild. Equal statuses write nothing, so this cannot loop.
            self.send_status_job(s);
        }
    }

    fn set_ready(&self, s: &State) {
        if !s.stores.all_synced() {
            return;
        }
        let role = if s.term.is_some() {
            "leader"
        } else {
            "standby"
        };
        self.admin
            .set_ready(true, format!("stores synced; {role} ({})", self.identity));
    }

    async fn rebuild(&self, s: &mut State) {
        let Some(burst) = s.debounce.take_if_due(std::time::Instant::now()) else {
            return;
        };
        pilotfish_shared::pipeline::metrics::DEBOUNCE_MERGED.inc_by(burst.events.saturating_sub(1));
        let inputs = s.stores.inputs(&self.base);
        let generations = BuildReport::generations(&inputs);
        let built = s.pipeline.build(inputs, burst.endpoints_only).await;
        tracing::debug!(events = burst.events, endpoints_only = built.endpoints_only, build_ms = built.took.as_millis() as u64, hash = %built.encoded.hash_hex(), "built snapshot");
        if !built.endpoints_only {
            s.report = Some(BuildReport::new(
                &built.findings,
                &built.kept_previous,
                generations,
            ));
        }
        self.admin.set_snapshot(&built, None);
        s.current = Some(built);
        s.publish_needed = true;
        s.publish_attempt = 0;
        self.publish(s).await;
        if s.report.is_some() {
            self.send_status_job(s);
        }
    }

    fn send_status_job(&self, s: &State) {
        if s.term.is_none() || !self.holds() {
            return;
        }
        let Some(report) = &s.report else { return };
        let job = StatusJob::from_build(s.stores.config_objects(), report);
        self.status_jobs.send_replace(Some(Arc::new(job)));
    }

    async fn on_leadership(&self, s: &mut State) {
        let leadership = self.leadership.borrow().clone();
        let holds = leadership.holds(Instant::now());
        match (holds, s.term) {
            (true, Some(t)) if t.term == leadership.term => return,
            (true, previous) => {
                if previous.is_some() {
                    // A term ended unnoticed between two looks: close it first.
                    s.pipeline.resign().await;
                }
                tracing::info!(identity = %self.identity, term = leadership.term, "leading: taking a new epoch before publishing");
                s.term = Some(Term {
                    term: leadership.term,
                    epoch: None,
                    refenced: 0,
                });
                metrics::LEADER.set(1);
                s.epoch_attempt = 0;
                self.take_epoch(s).await;
            }
            (false, Some(t)) => {
                tracing::warn!(identity = %self.identity, term = t.term, epoch = ?t.epoch, holder = ?leadership.holder, "no longer leading: publishing stopped");
                s.term = None;
                s.epoch_retry_at = None;
                s.publish_retry_at = None;
                metrics::LEADER.set(0);
                s.pipeline.resign().await;
            }
            (false, None) => {}
        }
        self.set_ready(s);
        self.show_leader(s);
    }

    async fn take_epoch(&self, s: &mut State) {
        s.epoch_retry_at = None;
        if s.term.is_none() {
            return;
        }
        if !self.holds() {
            self.on_leadership_lost(s).await;
            return;
        }
        match s.pipeline.take_epoch().await {
            Ok(epoch) => {
                if let Some(t) = s.term.as_mut() {
                    t.epoch = Some(epoch);
                }
                tracing::info!(epoch, "took a new epoch; earlier leaders are fenced");
                self.show_leader(s);
                s.publish_needed = s.current.is_some();
                s.publish_attempt = 0;
                self.publish(s).await;
                self.send_status_job(s);
            }
            Err(e) => {
                let delay = retry_delay(s.epoch_attempt);
                s.epoch_attempt += 1;
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot take an epoch yet; not publishing");
                s.epoch_retry_at = Some(Instant::now() + delay);
            }
        }
    }

    async fn on_leadership_lost(&self, s: &mut State) {
        if s.term.take().is_some() {
            tracing::warn!(identity = %self.identity, "the Lease claim expired: publishing stopped");
            metrics::LEADER.set(0);
            s.epoch_retry_at = None;
            s.publish_retry_at = None;
            s.pipeline.resign().await;
            self.set_ready(s);
            self.show_leader(s);
        }
    }

    async fn publish(&self, s: &mut State) {
        s.publish_retry_at = None;
        if !s.publish_needed {
            return;
        }
        let Some(built) = s.current.as_ref() else {
            return;
        };
        let Some(Term { epoch: Some(_), .. }) = s.term else {
            return;
        };
        // The claim check, as late as possible before the write.
        if !self.holds() {
            self.on_leadership_lost(s).await;
            return;
        }
        match s.pipeline.publish(built).await {
            Ok(outcome @ (PublishOutcome::Published(_) | PublishOutcome::Unchanged(_))) => {
                if let PublishOutcome::Published(r) = &outcome {
                    tracing::info!(version = r.version, epoch = r.epoch, hash = %built.encoded.hash_hex(), path = if built.endpoints_only { "endpoints" } else { "full" }, build_ms = built.took.as_millis() as u64, "published snapshot");
                    s.last_published =
                        Some(json!({"version": r.version, "epoch": r.epoch, "hash": r.hash}));
                }
                self.admin.set_snapshot(built, Some(&outcome));
                s.publish_needed = false;
                s.publish_attempt = 0;
                self.show_leader(s);
            }
            Ok(PublishOutcome::Fenced { current }) => {
                self.admin.set_snapshot(
                    built,
                    Some(&PublishOutcome::Fenced {
                        current: current.clone(),
                    }),
                );
                let found = current
                    .map(|r| r.to_string())
                    .unwrap_or_else(|| "none".into());
                if self.holds() {
                    // We hold the Lease, so no legitimate leader can have taken a newer
                    // epoch: a stale writer did. Take the epoch again, with backoff in case
                    // a misconfigured second writer keeps fighting.
                    let refenced = s.term.map(|t| t.refenced).unwrap_or(0);
                    let delay = retry_delay(refenced);
                    tracing::error!(latest = %found, retry_in_ms = delay.as_millis() as u64, "publish fenced although this replica holds the Lease: another writer took a newer epoch; taking a new one");
                    if let Some(t) = s.term.as_mut() {
                        t.epoch = None;
                        t.refenced += 1;
                    }
                    s.epoch_retry_at = Some(Instant::now() + delay);
                } else {
                    tracing::warn!(latest = %found, "publish fenced: a newer leader owns `latest`; stepping down");
                    self.on_leadership_lost(s).await;
                }
            }
            Err(e) => {
                let delay = retry_delay(s.publish_attempt);
                s.publish_attempt += 1;
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "publish failed; retrying");
                self.admin.set_snapshot(built, None);
                s.publish_retry_at = Some(Instant::now() + delay);
            }
        }
    }

    fn show_leader(&self, s: &State) {
        let l = self.leadership.borrow().clone();
        let unsynced = s.stores.unsynced();
        self.admin.set_leader(json!({
            "mode": "kubernetes",
            "identity": self.identity,
            "lease": self.lease_name,
            "leader": s.term.is_some() && l.holds(Instant::now()),
            "holder": l.holder,
            "lease_transitions": l.transitions,
            "term": s.term.map(|t| t.term),
            "epoch": s.term.and_then(|t| t.epoch),
            "last_published": s.last_published,
            "synced": unsynced.is_empty(),
            "unsynced": unsynced,
            "objects": s.stores.counts(),
        }));
    }
}

/// Awaits the seed, or forever when there is none (a disabled `select!` branch).
async fn seed_opt(seed: &mut Option<Seed>) -> Option<PushContext> {
    match seed {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}
