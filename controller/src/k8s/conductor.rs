//! The Kubernetes mode's decisions, as a synchronous state machine. The [`Conductor`] is
//! fed [`Event`]s — applied watch updates, Lease changes, the progress of the seed read,
//! the results of builds, epochs and publishes, the passing of time — and returns the
//! [`Action`]s the loop ([`super::mode`]) performs: build, take an epoch, publish,
//! resign, send a status job, set readiness, refresh the admin pages, log a decision. It
//! reads no clock (`now` is an argument), awaits nothing and owns no I/O, so every rule is
//! a unit test with a hand-driven clock, like the Lease [`Elector`](super::lease::elector::Elector)
//! one level down.
//!
//! The rules, each one function (and each with its unit test below):
//! - [`may_build`](Conductor::may_build): nothing is built before every kind has
//!   completed its initial list and the published snapshot has been read back as the
//!   builder's "previous" (or is known not to exist) — a restart never publishes a
//!   partial mesh, and an object invalid at restart keeps its last accepted version, also
//!   when Redis does not answer at first (`on_seed_retrying`: not ready, with the reason);
//! - [`due_build`](Conductor::due_build): the debounce deadline drives builds;
//! - `on_leadership`: a term begins when the claim holds under a term number not seen
//!   before, and ends (`stop_leading`: retries stop, the epoch is resigned) when the
//!   claim no longer holds;
//! - `start_term`: a term that ended unnoticed between two looks is resigned first, then
//!   the term's epoch is taken — the floor the Lease acquisition gave
//!   ([`Leadership::epoch_floor`]) — before anything is published;
//! - `epoch_held` (the epoch rule): a term publishes only under the epoch it took;
//! - `publish`: only what is not published yet, only with the epoch, and only after the
//!   claim is re-checked right before the write (`take_epoch` re-checks it too);
//! - `stand_down` (the fencing rule): a publish fenced, or an epoch refused, while the
//!   claim holds means another writer has a newer epoch — this term publishes nothing
//!   more and takes no new epoch (two writers must not overwrite each other in turns);
//!   fenced without the claim, a newer leader exists: resign;
//! - [`claim_expired`](Conductor::claim_expired): the loop wakes when the claim would
//!   expire ([`wake_at`](Conductor::wake_at)), and the term ends then even if the Lease
//!   task is slow to say so — also while a publish is in flight;
//! - [`send_status_job`](Conductor::send_status_job): status work only while leading;
//! - `on_epoch_failed`, `on_publish_failed`: retries with backoff ([`RETRY`]);
//! - `start_due`: one operation in flight at a time; what became due meanwhile starts
//!   when it lands.
//!
//! The [`Debouncer`] lives inside: whether a due burst may be built depends on the sync and
//! seed gates, and the first complete sync itself schedules the first build through it.
//! Inside, "when is the next build" is one answer ([`Conductor::wake_at`]) instead of two
//! halves the loop would have to keep in step.
//!
//! The next deadline is a query ([`Conductor::wake_at`]), not an action: it is state,
//! recomputed after every event, so the loop can never sleep on a stale one.
//!
//! The Lease view is, like the clock, an argument of every call: the claim is re-checked
//! against the newest view even when the change that moved it has not been handled as an
//! event yet. [`Event::Leadership`] is what runs the term rule.
//!
//! Between conductor and loop: builds, epochs and publishes are *flights* — the loop
//! runs each as a future of its own and feeds its result back as an event when it lands,
//! while it goes on handling Lease changes, the claim's expiry and watch updates (a slow
//! Redis never holds up the end of a term). Each call returns at most one action that
//! starts a flight ([`Action::awaits_result`]), last, and none while one is in flight. A
//! result that lands after its term ended is not acted upon (an epoch taken for a term
//! that is over is resigned at once).

use std::time::Duration;

use pilotfish_shared::bus::SnapshotRef;
use pilotfish_shared::pipeline::debounce::{ChangeClass, Debouncer};
use pilotfish_shared::retry::{Backoff, Jitter, Retry};
use tokio::time::Instant;

use super::lease::Leadership;
use super::store::Summary;

/// Epoch and publish retries, from 200 ms up to 10 s.
pub const RETRY: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));

/// What happened, as the loop tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The loop started; `unsynced` names every kind not listed yet.
    Started {
        unsynced: Vec<&'static str>,
    },
    /// A watch update of a kind of `class` was applied to the stores; `unsynced` names the
    /// kinds whose initial list is still missing afterwards.
    Applied {
        class: ChangeClass,
        summary: Summary,
        unsynced: Vec<&'static str>,
    },
    /// The Lease task announced a new view (the view is the `lease` argument).
    Leadership,
    /// An attempt to read back the published snapshot failed; another follows.
    SeedRetrying {
        error: String,
    },
    /// The read of the published snapshot ended with an answer (found or known absent).
    SeedDone,
    /// The build asked for finished; `endpoints_only`: it took the endpoint path (its
    /// findings are those of the last full build).
    BuildDone {
        endpoints_only: bool,
    },
    /// The epoch asked for (`floor`) is ours.
    EpochTaken(u64),
    /// The bus knows an epoch above the floor: another writer is newer.
    EpochSuperseded {
        newer: u64,
    },
    EpochFailed {
        error: String,
    },
    PublishDone(PublishResult),
    /// Time passed: whatever is due at `now`.
    Tick,
}

/// How a publish ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishResult {
    Published,
    Unchanged,
    /// A publisher with a newer epoch owns `latest` (as found).
    Fenced {
        latest: Option<SnapshotRef>,
    },
    Failed {
        error: String,
    },
}

/// What the loop does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Build a snapshot from the stores: a debounced burst of `events` is due.
    Build {
        endpoints_only: bool,
        events: u64,
    },
    /// Take `floor` as the epoch on the bus.
    TakeEpoch {
        floor: u64,
    },
    /// Publish the last build.
    Publish,
    /// Give up the bus epoch (the publisher's watchdog stops republishing).
    Resign,
    /// Hand the status writer a job from the stores and the last full build's findings.
    SendStatusJob,
    SetReady {
        ready: bool,
        detail: String,
    },
    /// Refresh `/debug/leader` and the leader gauge from [`Conductor::view`].
    ShowLeader,
    /// A decision worth a log line.
    Notice(Notice),
}

impl Action {
    /// This action starts a flight: its result comes back as an event later.
    pub fn awaits_result(&self) -> bool {
        matches!(
            self,
            Action::Build { .. } | Action::TakeEpoch { .. } | Action::Publish
        )
    }
}

/// Decisions the loop logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A new term: an epoch is taken before anything is published.
    Leading {
        term: u64,
        floor: u64,
    },
    /// The Lease view says the claim no longer holds.
    NotLeading {
        term: u64,
        epoch: Option<u64>,
        holder: Option<String>,
    },
    /// The claim expired before a step that needs it.
    ClaimExpired,
    EpochRetry {
        error: String,
        retry_in: Duration,
    },
    /// Fenced, or the epoch refused, while holding the claim: another writer has a newer
    /// epoch. This term publishes nothing more.
    StoodDown {
        latest: Option<SnapshotRef>,
        newer_epoch: Option<u64>,
    },
    /// Fenced without the claim: a newer leader owns `latest`.
    Deposed {
        latest: Option<SnapshotRef>,
    },
    PublishRetry {
        error: String,
        retry_in: Duration,
    },
}

/// Leadership as the admin pages show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// In a term and the claim holds.
    pub leader: bool,
    pub term: Option<u64>,
    pub epoch: Option<u64>,
    /// The term stood down: another writer has a newer epoch.
    pub stood_down: bool,
    /// The operation in flight, if any.
    pub in_flight: Option<Flight>,
}

/// An operation whose result the conductor waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flight {
    Build,
    /// Taking `floor` for `term`.
    Epoch {
        term: u64,
        floor: u64,
    },
    Publish,
}

impl Flight {
    pub fn name(&self) -> &'static str {
        match self {
            Flight::Build => "build",
            Flight::Epoch { .. } => "take_epoch",
            Flight::Publish => "publish",
        }
    }
}

/// One leadership term as the conductor tracks it.
#[derive(Clone, Debug)]
struct Term {
    term: u64,
    /// The epoch this term takes: the floor of the Lease acquisition that began it.
    floor: u64,
    /// This term's bus epoch; `None` until taken.
    epoch: Option<u64>,
    /// Another writer has a newer epoch: nothing more is published in this term.
    stood_down: bool,
}

/// The Kubernetes mode's state machine; see the module documentation.
#[derive(Clone, Debug)]
pub struct Conductor {
    identity: String,
    /// The newest Lease view given.
    lease: Leadership,
    debounce: Debouncer,
    /// Every kind has completed its initial list.
    synced: bool,
    /// The published snapshot has been read back (or there is nothing to read).
    seeded: bool,
    /// Why the seed read has not answered yet (its last failure).
    seed_error: Option<String>,
    /// A snapshot has been built (the loop holds it).
    built: bool,
    /// A full build's findings exist (status jobs need them).
    reported: bool,
    /// The last build has not been published (or confirmed unchanged) yet.
    publish_needed: bool,
    /// A status job is decided once the pending publish's result is known.
    status_after_publish: bool,
    publish: Retry,
    epoch: Retry,
    term: Option<Term>,
    in_flight: Option<Flight>,
}

impl Conductor {
    /// A conductor for replica `identity`. `wait_for_seed`: a read of the published
    /// snapshot is under way, and nothing is built until [`Event::SeedDone`].
    pub fn new(
        identity: impl Into<String>,
        debounce_after: Duration,
        debounce_max: Duration,
        wait_for_seed: bool,
        lease: Leadership,
    ) -> Self {
        Conductor {
            identity: identity.into(),
            lease,
            debounce: Debouncer::new(debounce_after, debounce_max),
            synced: false,
            seeded: !wait_for_seed,
            seed_error: None,
            built: false,
            reported: false,
            publish_needed: false,
            status_after_publish: false,
            publish: Retry::new(RETRY),
            epoch: Retry::new(RETRY),
            term: None,
            in_flight: None,
        }
    }

    /// The same, with the retries jittered by `jitter` (a constant in tests).
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.publish = self.publish.with_jitter(jitter);
        self.epoch = self.epoch.with_jitter(jitter);
        self
    }

    /// Handles one event at `now`, with `lease` the Lease task's newest view.
    pub fn handle(&mut self, event: Event, now: Instant, lease: &Leadership) -> Vec<Action> {
        if self.lease != *lease {
            self.lease = lease.clone();
        }
        let mut out = Vec::new();
        match event {
            Event::Started { unsynced } => {
                out.push(waiting_for(&unsynced));
                out.push(Action::ShowLeader);
            }
            Event::Applied {
                class,
                summary,
                unsynced,
            } => self.on_applied(class, summary, &unsynced, now, &mut out),
            Event::Leadership => self.on_leadership(now, &mut out),
            Event::SeedRetrying { error } => self.on_seed_retrying(error, &mut out),
            Event::SeedDone => self.on_seed_done(&mut out),
            Event::BuildDone { endpoints_only } => {
                self.land(Flight::Build);
                self.on_built(endpoints_only, now, &mut out)
            }
            Event::EpochTaken(epoch) => self.on_epoch_taken(epoch, now, &mut out),
            Event::EpochSuperseded { newer } => self.on_epoch_superseded(newer, now, &mut out),
            Event::EpochFailed { error } => self.on_epoch_failed(error, now, &mut out),
            Event::PublishDone(result) => {
                self.land(Flight::Publish);
                self.on_publish_done(result, now, &mut out)
            }
            Event::Tick => self.on_tick(now, &mut out),
        }
        self.start_due(now, &mut out);
        debug_assert!(
            out.iter().rev().skip(1).all(|a| !a.awaits_result()),
            "an awaited action must come last, and alone: {out:?}"
        );
        out
    }

    /// When the loop must wake next (and feed [`Event::Tick`]); `None`: only for events.
    /// While an operation is in flight only the claim's expiry wakes it: what is due
    /// starts when the flight lands.
    pub fn wake_at(&self) -> Option<Instant> {
        let claim = self.term.as_ref().and(self.lease.valid_until);
        if self.in_flight.is_some() {
            return claim;
        }
        let build = self
            .may_build()
            .then(|| self.debounce.deadline().map(Instant::from_std))
            .flatten();
        [build, self.epoch.deadline(), self.publish.deadline(), claim]
            .into_iter()
            .flatten()
            .min()
    }

    /// Leadership for the admin pages.
    pub fn view(&self, now: Instant) -> View {
        View {
            leader: self.term.is_some() && self.lease.holds(now),
            term: self.term.as_ref().map(|t| t.term),
            epoch: self.term.as_ref().and_then(|t| t.epoch),
            stood_down: self.term.as_ref().is_some_and(|t| t.stood_down),
            in_flight: self.in_flight,
        }
    }

    /// The Lease view the last decision was made with.
    pub fn lease(&self) -> &Leadership {
        &self.lease
    }

    // ---- the rules ---------------------------------------------------------------------

    /// The build gate: every kind listed and the published snapshot read back.
    pub fn may_build(&self) -> bool {
        self.synced && self.seeded
    }

    /// The term rule, run when the Lease view changes and when the claim expires.
    fn on_leadership(&mut self, now: Instant, out: &mut Vec<Action>) {
        let holds = self.lease.holds(now);
        match (holds, &self.term) {
            (true, Some(t)) if t.term == self.lease.term => {}
            (true, previous) => {
                let unnoticed = previous.is_some();
                self.start_term(unnoticed, now, out);
            }
            (false, Some(t)) => {
                let notice = Notice::NotLeading {
                    term: t.term,
                    epoch: t.epoch,
                    holder: self.lease.holder.clone(),
                };
                self.stop_leading(notice, out);
            }
            (false, None) => {}
        }
    }

    /// A new term: resign a previous one that ended unnoticed, then take the epoch this
    /// acquisition's floor gives before anything is published.
    fn start_term(&mut self, previous_unnoticed: bool, now: Instant, out: &mut Vec<Action>) {
        if previous_unnoticed {
            out.push(Action::Resign);
        }
        let floor = self.lease.epoch_floor;
        out.push(Action::Notice(Notice::Leading {
            term: self.lease.term,
            floor,
        }));
        self.term = Some(Term {
            term: self.lease.term,
            floor,
            epoch: None,
            stood_down: false,
        });
        self.epoch.reset();
        self.publish.cancel();
        self.set_ready(out);
        out.push(Action::ShowLeader);
        self.take_epoch(now, out);
    }

    /// Ends the term (if any): retries stop, the epoch is given up.
    fn stop_leading(&mut self, notice: Notice, out: &mut Vec<Action>) {
        if self.term.take().is_none() {
            return;
        }
        out.push(Action::Notice(notice));
        self.epoch.cancel();
        self.publish.cancel();
        out.push(Action::Resign);
        self.set_ready(out);
        out.push(Action::ShowLeader);
    }

    /// The claim, re-checked before a step that needs it, no longer holds.
    fn claim_lost(&mut self, out: &mut Vec<Action>) {
        self.stop_leading(Notice::ClaimExpired, out);
    }

    /// The claim's expiry has come while in a term.
    pub fn claim_expired(&self, now: Instant) -> bool {
        self.term.is_some() && self.lease.valid_until.is_some_and(|until| now >= until)
    }

    /// Takes this term's epoch, if the claim still holds (now, or when the operation in
    /// flight lands).
    fn take_epoch(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.epoch.cancel();
        let Some(t) = &self.term else { return };
        if t.stood_down || t.epoch.is_some() {
            return;
        }
        if !self.lease.holds(now) {
            self.claim_lost(out);
            return;
        }
        if self.in_flight.is_some() {
            self.epoch.schedule_at(now);
            return;
        }
        let (term, floor) = (t.term, t.floor);
        out.push(Action::TakeEpoch { floor });
        self.in_flight = Some(Flight::Epoch { term, floor });
    }

    /// The epoch flight landed: whether it was for the current term (else the result is
    /// stale and must not be used).
    fn land_epoch(&mut self) -> bool {
        let flight = self.in_flight.take();
        let current = self.term.as_ref().map(|t| (t.term, t.floor));
        matches!(flight, Some(Flight::Epoch { term, floor }) if Some((term, floor)) == current)
    }

    fn on_epoch_taken(&mut self, epoch: u64, now: Instant, out: &mut Vec<Action>) {
        if !self.land_epoch() {
            // Taken for a term that is over: the bus must not keep it.
            out.push(Action::Resign);
            return;
        }
        if let Some(t) = self.term.as_mut() {
            t.epoch = Some(epoch);
        }
        out.push(Action::ShowLeader);
        self.publish_needed = self.built;
        self.publish.reset();
        self.publish_then_status(now, out);
    }

    /// The bus refused the floor: stand down (see `stand_down`).
    fn on_epoch_superseded(&mut self, newer: u64, now: Instant, out: &mut Vec<Action>) {
        if !self.land_epoch() {
            return;
        }
        self.stand_down(None, Some(newer), now, out);
    }

    /// A failed epoch is retried with backoff.
    fn on_epoch_failed(&mut self, error: String, now: Instant, out: &mut Vec<Action>) {
        if !self.land_epoch() {
            return;
        }
        let retry_in = self.epoch.schedule(now);
        out.push(Action::Notice(Notice::EpochRetry { error, retry_in }));
    }

    /// Publishes the last build if it is not published yet, this term holds its epoch and
    /// the claim still holds (checked as late as possible: right before the write).
    fn publish(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.publish.cancel();
        if !self.publish_needed || !self.built {
            return;
        }
        if !self.epoch_held() {
            return;
        }
        if !self.lease.holds(now) {
            self.claim_lost(out);
            return;
        }
        if self.in_flight.is_some() {
            self.publish.schedule_at(now);
            return;
        }
        out.push(Action::Publish);
        self.in_flight = Some(Flight::Publish);
    }

    /// The epoch rule: a term publishes only under the epoch it took (and not after it
    /// stood down).
    fn epoch_held(&self) -> bool {
        self.term
            .as_ref()
            .is_some_and(|t| t.epoch.is_some() && !t.stood_down)
    }

    /// Publishes, then decides a status job once the publish's result is known (or at
    /// once when nothing is published).
    fn publish_then_status(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.publish(now, out);
        if out.last() == Some(&Action::Publish) || self.publish.deadline().is_some() {
            self.status_after_publish = true;
        } else {
            self.send_status_job(now, out);
        }
    }

    fn on_publish_done(&mut self, result: PublishResult, now: Instant, out: &mut Vec<Action>) {
        match result {
            PublishResult::Published | PublishResult::Unchanged => {
                self.publish_needed = false;
                self.publish.reset();
                out.push(Action::ShowLeader);
            }
            PublishResult::Fenced { latest } => self.on_fenced(latest, now, out),
            PublishResult::Failed { error } => self.on_publish_failed(error, now, out),
        }
        if std::mem::take(&mut self.status_after_publish) {
            self.send_status_job(now, out);
        }
    }

    /// The fencing rule for a fenced publish: with the claim, stand down; without it, a
    /// newer leader owns `latest` — the term ends.
    fn on_fenced(&mut self, latest: Option<SnapshotRef>, now: Instant, out: &mut Vec<Action>) {
        if self.term.is_none() {
            return;
        }
        if self.lease.holds(now) {
            self.stand_down(latest, None, now, out);
        } else {
            out.push(Action::Notice(Notice::Deposed { latest }));
            self.claim_lost(out);
        }
    }

    /// Another writer has a newer epoch while we hold the claim. Within one Lease that
    /// means our view of the claim is stale (a newer acquisition exists and the Lease task
    /// will tell us); otherwise a second writer family shares the key prefix (a
    /// misconfiguration). Either way, taking a newer epoch would only start two writers
    /// overwriting each other in turns: this term publishes nothing more; the next term
    /// (after the Lease changes hands) tries again with its own, higher floor.
    fn stand_down(
        &mut self,
        latest: Option<SnapshotRef>,
        newer_epoch: Option<u64>,
        _now: Instant,
        out: &mut Vec<Action>,
    ) {
        let Some(t) = self.term.as_mut() else { return };
        t.stood_down = true;
        t.epoch = None;
        self.epoch.cancel();
        self.publish.cancel();
        out.push(Action::Notice(Notice::StoodDown {
            latest,
            newer_epoch,
        }));
        out.push(Action::Resign);
        out.push(Action::ShowLeader);
    }

    /// A failed publish is retried with backoff.
    fn on_publish_failed(&mut self, error: String, now: Instant, out: &mut Vec<Action>) {
        if !self.epoch_held() {
            return;
        }
        let retry_in = self.publish.schedule(now);
        out.push(Action::Notice(Notice::PublishRetry { error, retry_in }));
    }

    /// Status work only while leading (the writer re-checks the claim before each write),
    /// not after standing down, and only once a full build said what each object's status
    /// is.
    pub fn send_status_job(&self, now: Instant, out: &mut Vec<Action>) {
        let leading = self.term.as_ref().is_some_and(|t| !t.stood_down);
        if !leading || !self.lease.holds(now) || !self.reported {
            return;
        }
        out.push(Action::SendStatusJob);
    }

    /// The build a due debounce burst asks for, once builds are allowed.
    pub fn due_build(&mut self, now: Instant) -> Option<Action> {
        if !self.may_build() {
            return None;
        }
        let burst = self.debounce.take_if_due(now.into_std())?;
        Some(Action::Build {
            endpoints_only: burst.endpoints_only,
            events: burst.events,
        })
    }

    /// Starts what is due, one flight at a time: an epoch first, then a publish, then a
    /// build. What stays due is started when this flight lands.
    fn start_due(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.in_flight.is_some() || out.last().is_some_and(Action::awaits_result) {
            return;
        }
        if self.epoch.is_due(now) {
            self.take_epoch(now, out);
            if self.in_flight.is_some() {
                return;
            }
        }
        if self.publish.is_due(now) {
            self.publish(now, out);
            if self.in_flight.is_some() {
                return;
            }
        }
        if let Some(build) = self.due_build(now) {
            out.push(build);
            self.in_flight = Some(Flight::Build);
        }
    }

    /// A build or publish flight landed.
    fn land(&mut self, flight: Flight) {
        debug_assert_eq!(self.in_flight, Some(flight), "a result without its flight");
        self.in_flight = None;
    }

    // ---- events ------------------------------------------------------------------------

    fn on_applied(
        &mut self,
        class: ChangeClass,
        summary: Summary,
        unsynced: &[&'static str],
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        self.synced = unsynced.is_empty();
        if summary.mesh_changed() {
            self.debounce.event(now.into_std(), class);
        }
        if summary.first_sync {
            if self.synced {
                // The first build: a full one, due after the usual quiet period.
                self.debounce.event(now.into_std(), ChangeClass::Config);
                self.set_ready(out);
            } else {
                out.push(waiting_for(unsynced));
            }
            out.push(Action::ShowLeader);
        }
        if summary.status_changed() && !summary.mesh_changed() {
            // Statuses changed under us (our own echo, or someone else's write): compare
            // again, without a rebuild. Equal statuses write nothing, so this cannot loop.
            self.send_status_job(now, out);
        }
    }

    /// The seed read failed an attempt: not ready, saying why (once synced; before, the
    /// missing lists are the reason).
    fn on_seed_retrying(&mut self, error: String, out: &mut Vec<Action>) {
        self.seed_error = Some(error);
        self.set_ready(out);
    }

    fn on_seed_done(&mut self, out: &mut Vec<Action>) {
        self.seeded = true;
        self.seed_error = None;
        self.set_ready(out);
    }

    fn on_built(&mut self, endpoints_only: bool, now: Instant, out: &mut Vec<Action>) {
        self.built = true;
        if !endpoints_only {
            self.reported = true;
        }
        self.publish_needed = true;
        self.publish.reset();
        self.publish_then_status(now, out);
    }

    /// The claim's expiry; what else is due starts in `start_due`.
    fn on_tick(&mut self, now: Instant, out: &mut Vec<Action>) {
        if self.claim_expired(now) {
            self.on_leadership(now, out);
        }
    }

    /// Ready once every kind is listed and the published snapshot read back, naming the
    /// role; not ready while the read fails, naming the failure.
    fn set_ready(&self, out: &mut Vec<Action>) {
        if !self.synced {
            return;
        }
        if !self.seeded {
            let why = match &self.seed_error {
                Some(error) => format!("; Redis: {error}"),
                None => String::new(),
            };
            out.push(Action::SetReady {
                ready: false,
                detail: format!(
                    "stores synced; waiting to read back the published snapshot (it keeps the last good version of objects invalid now){why}"
                ),
            });
            return;
        }
        let role = if self.term.is_some() {
            "leader"
        } else {
            "standby"
        };
        out.push(Action::SetReady {
            ready: true,
            detail: format!("stores synced; {role} ({})", self.identity),
        });
    }
}

fn waiting_for(unsynced: &[&'static str]) -> Action {
    Action::SetReady {
        ready: false,
        detail: format!("waiting for the initial list of: {}", unsynced.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);
    const S: Duration = Duration::from_secs(1);
    const AFTER: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(1);
    const KINDS: [&str; 2] = ["VirtualService", "Pod"];

    /// The epoch floor the Lease gives term `term` in these tests.
    fn floor(term: u64) -> u64 {
        4_000_000 + term
    }

    /// A conductor, the Lease view it is given, and a hand-driven clock.
    struct Harness {
        c: Conductor,
        lease: Leadership,
        t0: Instant,
    }

    fn standby() -> Leadership {
        Leadership {
            holder: Some("b".into()),
            ..Leadership::standby("a")
        }
    }

    impl Harness {
        fn new(wait_for_seed: bool) -> Self {
            let c = Conductor::new("a", AFTER, MAX, wait_for_seed, standby()).with_jitter(|| 1.0);
            Harness {
                c,
                lease: standby(),
                t0: Instant::now(),
            }
        }

        /// Feeds `event` at `t0 + at`, checking the protocol: an awaited action comes last.
        fn on(&mut self, event: Event, at: Duration) -> Vec<Action> {
            let out = self.c.handle(event, self.t0 + at, &self.lease);
            assert!(
                out.iter().rev().skip(1).all(|a| !a.awaits_result()),
                "{out:?}"
            );
            out
        }

        fn applied(
            &mut self,
            class: ChangeClass,
            summary: Summary,
            unsynced: &[&'static str],
            at: Duration,
        ) -> Vec<Action> {
            self.on(
                Event::Applied {
                    class,
                    summary,
                    unsynced: unsynced.to_vec(),
                },
                at,
            )
        }

        fn built(&mut self, at: Duration) -> Vec<Action> {
            self.on(
                Event::BuildDone {
                    endpoints_only: false,
                },
                at,
            )
        }

        /// Every kind listed (the last one now), nothing pending to read.
        fn synced(at: Duration) -> Self {
            let mut h = Harness::new(false);
            h.applied(ChangeClass::Config, first_sync(), &[], at);
            h
        }

        /// Leads `term` with a claim valid until `t0 + until`.
        fn lead(&mut self, term: u64, until: Duration) {
            self.lease = Leadership {
                identity: "a".into(),
                leader: true,
                valid_until: Some(self.t0 + until),
                term,
                holder: Some("a".into()),
                transitions: 0,
                epoch_floor: floor(term),
            };
        }

        fn lose(&mut self) {
            self.lease = Leadership {
                term: self.lease.term,
                ..standby()
            };
        }

        /// Synced, built once (full), leading term 1 with epoch 7 (claim until 60 s).
        fn leading_with_a_build() -> Self {
            let mut h = Harness::synced(Duration::ZERO);
            assert!(matches!(
                h.on(Event::Tick, AFTER)[..],
                [Action::Build { .. }]
            ));
            h.built(AFTER);
            h.lead(1, 60 * S);
            assert_eq!(
                h.on(Event::Leadership, AFTER).last(),
                Some(&Action::TakeEpoch { floor: floor(1) })
            );
            assert_eq!(
                h.on(Event::EpochTaken(7), AFTER).last(),
                Some(&Action::Publish)
            );
            assert_eq!(
                h.on(Event::PublishDone(PublishResult::Published), AFTER),
                [Action::ShowLeader, Action::SendStatusJob]
            );
            h
        }

        /// [`leading_with_a_build`](Self::leading_with_a_build), then a change built
        /// at 1.1 s and its publish in flight.
        fn publishing_a_change() -> (Self, Duration) {
            let mut h = Harness::leading_with_a_build();
            h.applied(ChangeClass::Config, added(), &[], S);
            let at = S + AFTER;
            assert!(matches!(h.on(Event::Tick, at)[..], [Action::Build { .. }]));
            assert_eq!(h.built(at).last(), Some(&Action::Publish));
            (h, at)
        }
    }

    fn first_sync() -> Summary {
        Summary {
            first_sync: true,
            ..Default::default()
        }
    }

    fn added() -> Summary {
        Summary {
            added: 1,
            ..Default::default()
        }
    }

    fn status_only() -> Summary {
        Summary {
            status_only: 1,
            ..Default::default()
        }
    }

    fn notices(actions: &[Action]) -> Vec<&Notice> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Notice(n) => Some(n),
                _ => None,
            })
            .collect()
    }

    fn fenced() -> Event {
        Event::PublishDone(PublishResult::Fenced { latest: None })
    }

    fn standby_ready() -> Action {
        Action::SetReady {
            ready: true,
            detail: "stores synced; standby (a)".into(),
        }
    }

    #[test]
    fn nothing_is_built_before_every_kind_is_listed() {
        let mut h = Harness::new(false);
        assert_eq!(
            h.on(
                Event::Started {
                    unsynced: KINDS.to_vec()
                },
                Duration::ZERO
            ),
            [
                Action::SetReady {
                    ready: false,
                    detail: "waiting for the initial list of: VirtualService, Pod".into()
                },
                Action::ShowLeader
            ]
        );
        // Changes arrive while one kind is still listing: nothing is due.
        h.applied(ChangeClass::Config, first_sync(), &["Pod"], Duration::ZERO);
        h.applied(ChangeClass::Config, added(), &["Pod"], 10 * MS);
        assert!(!h.c.may_build());
        assert_eq!(h.c.wake_at(), None);
        assert_eq!(h.on(Event::Tick, 10 * S), []);
        // The last kind completes its list: ready, and the first (full) build is due: the
        // change made while listing started the burst, which has waited its maximum.
        let out = h.applied(ChangeClass::Endpoints, first_sync(), &[], 20 * S);
        assert_eq!(
            out,
            [
                standby_ready(),
                Action::ShowLeader,
                Action::Build {
                    endpoints_only: false,
                    events: 2
                }
            ]
        );
    }

    #[test]
    fn nothing_is_built_before_the_published_snapshot_is_read_and_readiness_says_why() {
        let mut h = Harness::new(true);
        let waiting = "stores synced; waiting to read back the published snapshot (it keeps the last good version of objects invalid now)";
        assert_eq!(
            h.applied(ChangeClass::Config, first_sync(), &[], Duration::ZERO),
            [
                Action::SetReady {
                    ready: false,
                    detail: waiting.into()
                },
                Action::ShowLeader
            ]
        );
        assert!(!h.c.may_build());
        assert_eq!(h.c.wake_at(), None);
        assert_eq!(h.on(Event::Tick, 5 * S), []);
        // Redis does not answer: still nothing built, and readiness names the failure.
        let out = h.on(
            Event::SeedRetrying {
                error: "connection refused".into(),
            },
            6 * S,
        );
        assert_eq!(
            out,
            [Action::SetReady {
                ready: false,
                detail: format!("{waiting}; Redis: connection refused")
            }]
        );
        assert!(!h.c.may_build());
        // The answer: ready, and the burst that waited is built at once.
        let out = h.on(Event::SeedDone, 9 * S);
        assert_eq!(
            out,
            [
                standby_ready(),
                Action::Build {
                    endpoints_only: false,
                    events: 1
                }
            ]
        );
    }

    #[test]
    fn the_debounce_deadline_drives_builds() {
        let mut h = Harness::synced(Duration::ZERO);
        assert!(matches!(
            h.on(Event::Tick, AFTER)[..],
            [Action::Build { .. }]
        ));
        h.built(AFTER);
        assert_eq!(h.c.wake_at(), None, "nothing pending");
        // A burst of endpoint changes: one endpoint-only build after the quiet period.
        h.applied(ChangeClass::Endpoints, added(), &[], S);
        h.applied(ChangeClass::Endpoints, added(), &[], S + 50 * MS);
        // A no-op update is not an event.
        h.applied(ChangeClass::Config, Summary::default(), &[], S + 60 * MS);
        assert_eq!(h.c.wake_at(), Some(h.t0 + S + 150 * MS));
        assert_eq!(h.on(Event::Tick, S + 149 * MS), []);
        assert_eq!(
            h.on(Event::Tick, S + 150 * MS),
            [Action::Build {
                endpoints_only: true,
                events: 2
            }]
        );
        // A steady trickle is cut at the maximum delay (counted from the first change, once
        // the build in flight has landed).
        h.on(
            Event::BuildDone {
                endpoints_only: true,
            },
            S + 150 * MS,
        );
        for i in 0..20u32 {
            h.applied(ChangeClass::Config, added(), &[], 2 * S + i * 50 * MS);
        }
        assert_eq!(h.c.wake_at(), Some(h.t0 + 2 * S + MAX));
        assert!(matches!(
            h.applied(ChangeClass::Config, added(), &[], 2 * S + MAX)[..],
            [Action::Build { events: 21, .. }]
        ));
    }

    #[test]
    fn one_flight_at_a_time_and_what_became_due_starts_when_it_lands() {
        let mut h = Harness::synced(Duration::ZERO);
        assert!(matches!(
            h.on(Event::Tick, AFTER)[..],
            [Action::Build { .. }]
        ));
        assert_eq!(h.c.view(h.t0 + AFTER).in_flight, Some(Flight::Build));
        // A change is due while the build is in flight: nothing starts, nothing wakes.
        h.applied(ChangeClass::Config, added(), &[], 200 * MS);
        assert_eq!(h.c.wake_at(), None);
        assert_eq!(h.on(Event::Tick, S), []);
        // The build lands: the due one starts at once.
        assert_eq!(
            h.built(S),
            [Action::Build {
                endpoints_only: false,
                events: 1
            }]
        );
    }

    #[test]
    fn readiness_names_the_role() {
        let mut h = Harness::synced(Duration::ZERO);
        h.lead(1, 10 * S);
        let out = h.on(Event::Leadership, Duration::ZERO);
        assert!(
            out.contains(&Action::SetReady {
                ready: true,
                detail: "stores synced; leader (a)".into()
            }),
            "{out:?}"
        );
        // Not ready before the stores are: a term alone says nothing about readiness.
        let mut h = Harness::new(false);
        h.lead(1, 10 * S);
        let out = h.on(Event::Leadership, Duration::ZERO);
        assert!(
            !out.iter().any(|a| matches!(a, Action::SetReady { .. })),
            "{out:?}"
        );
    }

    #[test]
    fn a_new_term_takes_the_epoch_of_its_acquisition_before_anything_is_published() {
        let mut h = Harness::synced(Duration::ZERO);
        assert!(matches!(
            h.on(Event::Tick, AFTER)[..],
            [Action::Build { .. }]
        ));
        // A standby builds but does not publish.
        assert_eq!(h.built(AFTER), []);
        h.lead(1, 10 * S);
        let out = h.on(Event::Leadership, S);
        assert_eq!(
            notices(&out),
            [&Notice::Leading {
                term: 1,
                floor: floor(1)
            }]
        );
        assert_eq!(out.last(), Some(&Action::TakeEpoch { floor: floor(1) }));
        assert!(!out.contains(&Action::Publish));
        assert_eq!(
            h.c.view(h.t0 + S),
            View {
                leader: true,
                term: Some(1),
                epoch: None,
                stood_down: false,
                in_flight: Some(Flight::Epoch {
                    term: 1,
                    floor: floor(1)
                })
            }
        );
        // A change while the epoch is in flight: only the claim's expiry may wake the loop.
        h.applied(ChangeClass::Config, added(), &[], S);
        assert_eq!(h.c.wake_at(), Some(h.t0 + 10 * S));
        assert_eq!(h.on(Event::Tick, 2 * S), []);
        // The epoch lands: the last build is published first.
        let out = h.on(Event::EpochTaken(floor(1)), 2 * S);
        assert_eq!(out, [Action::ShowLeader, Action::Publish]);
        assert_eq!(h.c.view(h.t0 + 2 * S).epoch, Some(floor(1)));
        // The status job follows the publish's result; then the due build starts.
        assert_eq!(
            h.on(Event::PublishDone(PublishResult::Unchanged), 2 * S),
            [
                Action::ShowLeader,
                Action::SendStatusJob,
                Action::Build {
                    endpoints_only: false,
                    events: 1
                }
            ]
        );
    }

    #[test]
    fn an_epoch_with_nothing_built_publishes_nothing() {
        let mut h = Harness::synced(Duration::ZERO);
        h.lead(1, 10 * S);
        assert_eq!(
            h.on(Event::Leadership, Duration::ZERO).last(),
            Some(&Action::TakeEpoch { floor: floor(1) })
        );
        // The first build became due meanwhile: it starts when the epoch lands.
        assert_eq!(
            h.on(Event::EpochTaken(3), AFTER),
            [
                Action::ShowLeader,
                Action::Build {
                    endpoints_only: false,
                    events: 1
                }
            ]
        );
        assert_eq!(h.built(AFTER), [Action::Publish]);
    }

    #[test]
    fn a_renewal_of_the_same_term_changes_nothing() {
        let mut h = Harness::leading_with_a_build();
        h.lead(1, 70 * S);
        assert_eq!(h.on(Event::Leadership, S), []);
    }

    #[test]
    fn a_new_term_resigns_a_previous_unnoticed_one_first() {
        let mut h = Harness::leading_with_a_build();
        // Lost and re-acquired between two looks: the view shows term 2, still holding.
        h.lead(2, 60 * S);
        let out = h.on(Event::Leadership, S);
        assert_eq!(out.first(), Some(&Action::Resign));
        assert_eq!(out.iter().filter(|a| **a == Action::Resign).count(), 1);
        assert_eq!(
            notices(&out),
            [&Notice::Leading {
                term: 2,
                floor: floor(2)
            }]
        );
        assert_eq!(out.last(), Some(&Action::TakeEpoch { floor: floor(2) }));
        assert_eq!(h.c.view(h.t0 + S).term, Some(2));
        assert_eq!(h.c.view(h.t0 + S).epoch, None);
    }

    #[test]
    fn losing_the_lease_ends_the_term_and_resigns() {
        let mut h = Harness::leading_with_a_build();
        h.lose();
        let out = h.on(Event::Leadership, S);
        assert_eq!(
            out,
            [
                Action::Notice(Notice::NotLeading {
                    term: 1,
                    epoch: Some(7),
                    holder: Some("b".into())
                }),
                Action::Resign,
                standby_ready(),
                Action::ShowLeader
            ]
        );
        assert_eq!(
            h.c.view(h.t0 + S),
            View {
                leader: false,
                term: None,
                epoch: None,
                stood_down: false,
                in_flight: None
            }
        );
        // A standby again: builds are not published.
        h.applied(ChangeClass::Config, added(), &[], 2 * S);
        assert!(matches!(
            h.on(Event::Tick, 3 * S)[..],
            [Action::Build { .. }]
        ));
        assert_eq!(h.built(3 * S), []);
    }

    #[test]
    fn claim_expiry_wakes_the_loop_and_ends_the_term() {
        let mut h = Harness::leading_with_a_build();
        // The Lease task says nothing more; the claim runs out at 60 s.
        assert_eq!(h.c.wake_at(), Some(h.t0 + 60 * S));
        assert!(!h.c.claim_expired(h.t0 + 60 * S - MS));
        assert_eq!(h.on(Event::Tick, 60 * S - MS), []);
        assert!(h.c.claim_expired(h.t0 + 60 * S));
        let out = h.on(Event::Tick, 60 * S);
        assert!(
            matches!(notices(&out)[..], [Notice::NotLeading { term: 1, .. }]),
            "{out:?}"
        );
        assert!(out.contains(&Action::Resign));
        assert_eq!(h.c.wake_at(), None, "no term, no claim to watch");
    }

    #[test]
    fn a_slow_publish_does_not_hold_up_the_end_of_the_term() {
        let (mut h, at) = Harness::publishing_a_change();
        // Redis does not answer; the claim expires while the publish is in flight.
        assert_eq!(
            h.c.wake_at(),
            Some(h.t0 + 60 * S),
            "the claim wakes the loop"
        );
        let out = h.on(Event::Tick, 60 * S);
        assert!(out.contains(&Action::Resign), "{out:?}");
        assert!(
            matches!(notices(&out)[..], [Notice::NotLeading { term: 1, .. }]),
            "{out:?}"
        );
        assert_eq!(h.c.view(h.t0 + 60 * S).in_flight, Some(Flight::Publish));
        // When the publish finally lands, nothing follows from it: the term is over.
        for result in [
            fenced(),
            Event::PublishDone(PublishResult::Failed {
                error: "timeout".into(),
            }),
        ] {
            let mut h2 = Harness::publishing_a_change().0;
            h2.on(Event::Tick, 60 * S);
            assert_eq!(h2.on(result, 75 * S), [], "{at:?}");
            assert_eq!(h2.c.wake_at(), None);
        }
        assert_eq!(
            h.on(Event::PublishDone(PublishResult::Published), 75 * S),
            [Action::ShowLeader]
        );
    }

    #[test]
    fn an_epoch_that_lands_after_its_term_ended_is_resigned() {
        let mut h = Harness::synced(Duration::ZERO);
        h.lead(1, 10 * S);
        h.on(Event::Leadership, Duration::ZERO);
        h.lose();
        let out = h.on(Event::Leadership, S);
        assert!(out.contains(&Action::Resign));
        // The bus took the epoch after all: give it up again, publish nothing (the first
        // build, due meanwhile, starts).
        let out = h.on(Event::EpochTaken(floor(1)), 2 * S);
        assert!(
            matches!(out[..], [Action::Resign, Action::Build { .. }]),
            "{out:?}"
        );
        // A new term meanwhile: its epoch waits for the old flight, then is taken.
        let mut h = Harness::synced(Duration::ZERO);
        h.lead(1, 10 * S);
        h.on(Event::Leadership, Duration::ZERO);
        h.lead(2, 20 * S);
        let out = h.on(Event::Leadership, S);
        assert!(
            !out.iter().any(Action::awaits_result),
            "one flight at a time: {out:?}"
        );
        assert_eq!(
            h.on(Event::EpochTaken(floor(1)), 2 * S),
            [Action::Resign, Action::TakeEpoch { floor: floor(2) }]
        );
        let out = h.on(Event::EpochTaken(floor(2)), 2 * S);
        assert_eq!(out.first(), Some(&Action::ShowLeader));
        assert_eq!(h.c.view(h.t0 + 2 * S).epoch, Some(floor(2)));
    }

    #[test]
    fn the_claim_is_rechecked_right_before_a_publish() {
        let mut h = Harness::leading_with_a_build();
        h.applied(ChangeClass::Config, added(), &[], 59 * S);
        assert!(matches!(
            h.on(Event::Tick, 59 * S + AFTER)[..],
            [Action::Build { .. }]
        ));
        // The build took long: the claim expired meanwhile, unannounced.
        let out = h.built(61 * S);
        assert!(!out.contains(&Action::Publish), "{out:?}");
        assert_eq!(notices(&out), [&Notice::ClaimExpired]);
        assert!(out.contains(&Action::Resign));
        assert!(!out.contains(&Action::SendStatusJob));
        // The same check guards a retried epoch.
        let mut h = Harness::synced(Duration::ZERO);
        h.lead(1, 10 * S);
        h.on(Event::Leadership, Duration::ZERO);
        h.on(
            Event::EpochFailed {
                error: "down".into(),
            },
            Duration::ZERO,
        );
        // The Lease task withdrew the claim; the conductor has not handled that yet.
        h.lease.leader = false;
        let out = h.on(Event::Tick, 200 * MS);
        assert!(
            !out.iter().any(|a| matches!(a, Action::TakeEpoch { .. })),
            "{out:?}"
        );
        assert_eq!(notices(&out), [&Notice::ClaimExpired]);
        assert!(out.contains(&Action::Resign));
    }

    #[test]
    fn fenced_while_holding_the_claim_stands_down_for_the_term() {
        let (mut h, at) = Harness::publishing_a_change();
        let out = h.on(fenced(), at);
        assert_eq!(
            out,
            [
                Action::Notice(Notice::StoodDown {
                    latest: None,
                    newer_epoch: None
                }),
                Action::Resign,
                Action::ShowLeader
            ],
            "no new epoch, no status job"
        );
        let view = h.c.view(h.t0 + at);
        assert!(view.stood_down && view.leader && view.epoch.is_none());
        // Nothing is retried, and later builds are not published in this term.
        assert_eq!(h.c.wake_at(), Some(h.t0 + 60 * S), "only the claim");
        h.applied(ChangeClass::Config, added(), &[], 2 * S);
        assert!(matches!(
            h.on(Event::Tick, 3 * S)[..],
            [Action::Build { .. }]
        ));
        assert_eq!(h.built(3 * S), []);
        assert_eq!(
            h.applied(ChangeClass::Config, status_only(), &[], 4 * S),
            []
        );
        // The next term (the Lease changed hands and came back) tries again.
        h.lead(2, 90 * S);
        let out = h.on(Event::Leadership, 5 * S);
        assert_eq!(out.last(), Some(&Action::TakeEpoch { floor: floor(2) }));
        assert!(!h.c.view(h.t0 + 5 * S).stood_down);
    }

    #[test]
    fn an_epoch_refused_while_holding_the_claim_stands_down_too() {
        let mut h = Harness::synced(Duration::ZERO);
        h.lead(1, 10 * S);
        h.on(Event::Leadership, Duration::ZERO);
        let out = h.on(Event::EpochSuperseded { newer: floor(9) }, Duration::ZERO);
        assert_eq!(
            notices(&out),
            [&Notice::StoodDown {
                latest: None,
                newer_epoch: Some(floor(9))
            }]
        );
        assert!(out.contains(&Action::Resign));
        // The first build is due: built, not published, no epoch taken again.
        let out = h.on(Event::Tick, AFTER);
        assert!(matches!(out[..], [Action::Build { .. }]), "{out:?}");
        assert_eq!(h.built(AFTER), []);
        assert_eq!(h.c.wake_at(), Some(h.t0 + 10 * S));
    }

    #[test]
    fn fenced_without_the_claim_resigns() {
        let (mut h, at) = Harness::publishing_a_change();
        // The claim lapsed while the publish was under way.
        h.lease.valid_until = Some(h.t0 + S);
        let latest = SnapshotRef {
            version: 5,
            hash: "h".into(),
            epoch: 8,
            published_at_ms: 0,
        };
        let out = h.on(
            Event::PublishDone(PublishResult::Fenced {
                latest: Some(latest.clone()),
            }),
            at + S,
        );
        assert_eq!(
            notices(&out),
            [
                &Notice::Deposed {
                    latest: Some(latest)
                },
                &Notice::ClaimExpired
            ]
        );
        assert!(out.contains(&Action::Resign));
        assert!(!out.iter().any(|a| matches!(a, Action::TakeEpoch { .. })));
        assert!(!out.contains(&Action::SendStatusJob));
        assert_eq!(h.c.wake_at(), None, "no retry scheduled");
    }

    #[test]
    fn a_failed_epoch_is_retried_with_backoff() {
        let mut h = Harness::synced(Duration::ZERO);
        h.lead(1, 60 * S);
        h.on(Event::Leadership, Duration::ZERO);
        let out = h.on(
            Event::EpochFailed {
                error: "down".into(),
            },
            Duration::ZERO,
        );
        assert_eq!(
            out,
            [Action::Notice(Notice::EpochRetry {
                error: "down".into(),
                retry_in: 200 * MS
            })]
        );
        // The first build is due at 100 ms; the epoch retry at 200 ms.
        assert_eq!(h.c.wake_at(), Some(h.t0 + AFTER));
        assert!(matches!(
            h.on(Event::Tick, AFTER)[..],
            [Action::Build { .. }]
        ));
        assert_eq!(h.built(AFTER), [Action::SendStatusJob]);
        assert_eq!(h.c.wake_at(), Some(h.t0 + 200 * MS));
        assert_eq!(
            h.on(Event::Tick, 200 * MS),
            [Action::TakeEpoch { floor: floor(1) }]
        );
        let out = h.on(
            Event::EpochFailed {
                error: "down".into(),
            },
            200 * MS,
        );
        assert!(
            matches!(notices(&out)[..], [Notice::EpochRetry { retry_in, .. }] if *retry_in == 400 * MS),
            "{out:?}"
        );
        assert_eq!(
            h.on(Event::Tick, 600 * MS),
            [Action::TakeEpoch { floor: floor(1) }]
        );
        assert_eq!(
            h.on(Event::EpochTaken(floor(1)), 600 * MS),
            [Action::ShowLeader, Action::Publish]
        );
    }

    #[test]
    fn a_failed_publish_is_retried_with_backoff_until_a_new_build_starts_over() {
        let (mut h, at) = Harness::publishing_a_change();
        let failed = || {
            Event::PublishDone(PublishResult::Failed {
                error: "timeout".into(),
            })
        };
        let out = h.on(failed(), at);
        assert_eq!(
            out,
            [
                Action::Notice(Notice::PublishRetry {
                    error: "timeout".into(),
                    retry_in: 200 * MS
                }),
                Action::SendStatusJob
            ]
        );
        assert_eq!(h.c.wake_at(), Some(h.t0 + at + 200 * MS));
        assert_eq!(h.on(Event::Tick, at + 200 * MS), [Action::Publish]);
        let out = h.on(failed(), at + 200 * MS);
        assert!(
            matches!(notices(&out)[..], [Notice::PublishRetry { retry_in, .. }] if *retry_in == 400 * MS),
            "{out:?}"
        );
        // A new build publishes at once and starts the count over.
        h.applied(ChangeClass::Endpoints, added(), &[], at + 300 * MS);
        assert!(matches!(
            h.on(Event::Tick, at + 400 * MS)[..],
            [Action::Build {
                endpoints_only: true,
                ..
            }]
        ));
        assert_eq!(
            h.on(
                Event::BuildDone {
                    endpoints_only: true
                },
                at + 400 * MS
            ),
            [Action::Publish]
        );
        let out = h.on(failed(), at + 400 * MS);
        assert!(
            matches!(notices(&out)[..], [Notice::PublishRetry { retry_in, .. }] if *retry_in == 200 * MS),
            "{out:?}"
        );
    }

    #[test]
    fn retries_stop_when_the_term_ends() {
        let (mut h, at) = Harness::publishing_a_change();
        h.on(
            Event::PublishDone(PublishResult::Failed {
                error: "timeout".into(),
            }),
            at,
        );
        assert!(h.c.wake_at().is_some());
        h.lose();
        h.on(Event::Leadership, at);
        assert_eq!(h.c.wake_at(), None);
        assert_eq!(h.on(Event::Tick, 5 * S), []);
    }

    #[test]
    fn status_jobs_are_sent_only_while_leading() {
        let mut h = Harness::synced(Duration::ZERO);
        // Before any full build there is nothing to report.
        h.lead(1, 60 * S);
        h.on(Event::Leadership, Duration::ZERO);
        assert_eq!(
            h.on(Event::EpochTaken(1), Duration::ZERO),
            [Action::ShowLeader]
        );
        assert_eq!(
            h.applied(ChangeClass::Config, status_only(), &[], Duration::ZERO),
            []
        );
        assert!(matches!(
            h.on(Event::Tick, AFTER)[..],
            [Action::Build { .. }]
        ));
        h.built(AFTER);
        h.on(Event::PublishDone(PublishResult::Published), AFTER);
        // Leading: a status-only change compares statuses again, without a build.
        assert_eq!(
            h.applied(ChangeClass::Config, status_only(), &[], S),
            [Action::SendStatusJob]
        );
        assert_eq!(h.c.wake_at(), Some(h.t0 + 60 * S), "no build scheduled");
        // A standby sends none.
        h.lose();
        h.on(Event::Leadership, 2 * S);
        assert_eq!(
            h.applied(ChangeClass::Config, status_only(), &[], 2 * S),
            []
        );
        h.applied(ChangeClass::Config, added(), &[], 3 * S);
        assert!(matches!(
            h.on(Event::Tick, 4 * S)[..],
            [Action::Build { .. }]
        ));
        assert_eq!(h.built(4 * S), []);
        // Nor does a term whose claim has lapsed, before the Lease task says so.
        let mut h = Harness::leading_with_a_build();
        h.lease.valid_until = Some(h.t0 + S);
        assert_eq!(
            h.applied(ChangeClass::Config, status_only(), &[], 2 * S),
            []
        );
    }
}
