//! The election as a pure state machine. The [`Elector`] is fed what the Lease looks like
//! ([`Elector::observe`]) and how our writes went ([`Elector::on_written`]), is asked what
//! to do next at a given instant ([`Elector::tick`]: wait, write, re-read), and reports
//! [`Transition`]s; [`desired_spec`] is the Lease a write sends. Every rule is a plain
//! unit test with a hand-driven clock.
//!
//! Every acquisition also yields an epoch floor ([`LeaseRecord::epoch_floor`]) for the
//! snapshot bus: a number above the floor of every earlier acquisition of this Lease, by
//! any process, derived only from what the API server persists (the Lease's creation time
//! and `leaseTransitions`), so it survives a Redis that restarted empty. For that, unlike
//! client-go, every acquisition counts as a transition — also re-taking a claim that still
//! names us — and identities are unique per process (`cli::unique_identity`), so no two
//! processes ever take the same claim for theirs.
//!
//! The rules follow client-go's leader election. Expiry is judged on our monotonic
//! clock from the moment we *observed* a record change, never from the `renewTime` a
//! holder wrote (clocks of two machines differ). A leader renews every retry period and
//! gives up as soon as it has not renewed for the renew deadline, which is shorter than
//! the lease duration, so it stops before anyone else may take over. The claim a
//! publisher re-checks before every write is exactly that: [`Leadership::holds`].

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// Timings of the election (client-go's names and meaning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimings {
    /// How long a standby waits, after it last saw the Lease change, before taking it.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal.
    pub renew_deadline: Duration,
    /// Interval between renewals, and between attempts after a failure.
    pub retry_period: Duration,
}

/// Timings that cannot work.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LeaseTimingsError {
    #[error("--{0} must be greater than zero")]
    Zero(&'static str),
    #[error(
        "--lease-duration ({lease_duration:?}) must be greater than --renew-deadline ({renew_deadline:?}): a leader must give up before a standby may take over"
    )]
    DeadlineNotBelowDuration {
        lease_duration: Duration,
        renew_deadline: Duration,
    },
    #[error(
        "--renew-deadline ({renew_deadline:?}) must be greater than --retry-period ({retry_period:?}): the leader needs at least one retry before it gives up"
    )]
    RetryNotBelowDeadline {
        renew_deadline: Duration,
        retry_period: Duration,
    },
}

impl LeaseTimings {
    pub fn validate(&self) -> Result<(), LeaseTimingsError> {
        for (value, name) in [
            (self.lease_duration, "lease-duration"),
            (self.renew_deadline, "renew-deadline"),
            (self.retry_period, "retry-period"),
        ] {
            if value.is_zero() {
                return Err(LeaseTimingsError::Zero(name));
            }
        }
        if self.lease_duration <= self.renew_deadline {
            return Err(LeaseTimingsError::DeadlineNotBelowDuration {
                lease_duration: self.lease_duration,
                renew_deadline: self.renew_deadline,
            });
        }
        if self.renew_deadline <= self.retry_period {
            return Err(LeaseTimingsError::RetryNotBelowDeadline {
                renew_deadline: self.renew_deadline,
                retry_period: self.retry_period,
            });
        }
        Ok(())
    }

    /// `leaseDurationSeconds` as written into the Lease (whole seconds, at least 1).
    pub fn lease_duration_seconds(&self) -> i32 {
        let secs = self.lease_duration.as_millis().div_ceil(1000).max(1);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }
}

/// The part of a Lease the election reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `None` (or empty in the object) when nobody holds it, e.g. after a release.
    pub holder: Option<String>,
    pub lease_duration: Duration,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub transitions: i32,
    /// When the API server created the Lease object (a recreated Lease starts its
    /// transitions again at 0, under a later creation time).
    pub created: Option<Timestamp>,
    /// For the optimistic-concurrency precondition of our next write.
    pub resource_version: Option<String>,
}

/// How many acquisitions of one Lease object the epoch floor tells apart: 2^21. With the
/// creation time in seconds above them, floors stay below 2^53 (exact in Redis' Lua
/// numbers) until the year 2106.
const TRANSITIONS_PER_SECOND_OF_CREATION: u64 = 1 << 21;

impl LeaseRecord {
    /// Reads a Lease; `default_duration` stands in for a missing `leaseDurationSeconds`.
    pub fn from_lease(lease: &Lease, default_duration: Duration) -> LeaseRecord {
        let spec = lease.spec.clone().unwrap_or_default();
        LeaseRecord {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            lease_duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0)
                .map(Duration::from_secs)
                .unwrap_or(default_duration),
            acquire_time: spec.acquire_time.map(|t| t.0),
            renew_time: spec.renew_time.map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
            created: lease.metadata.creation_timestamp.as_ref().map(|t| t.0),
            resource_version: lease.metadata.resource_version.clone(),
        }
    }

    /// The epoch floor of the acquisition this record shows: `created (s) · 2^21 +
    /// leaseTransitions`. Later acquisitions of the same Lease have more transitions; a
    /// Lease deleted and created again has a later creation time, which outweighs any
    /// count of transitions (only a re-creation within the same second as the original
    /// creation could go lower; the Redis counter still fences that case while Redis
    /// keeps its data).
    pub fn epoch_floor(&self) -> u64 {
        let created = self
            .created
            .map_or(0, |t| u64::try_from(t.as_second()).unwrap_or(0));
        let transitions = u64::try_from(self.transitions)
            .unwrap_or(0)
            .min(TRANSITIONS_PER_SECOND_OF_CREATION - 1);
        created
            .saturating_mul(TRANSITIONS_PER_SECOND_OF_CREATION)
            .saturating_add(transitions)
    }

    /// Whether `other` is the same claim as `self`: a standby restarts its expiry clock
    /// only when the claim changes (a renewal, a new holder), not on every re-read.
    fn same_claim(&self, other: &LeaseRecord) -> bool {
        self.holder == other.holder
            && self.renew_time == other.renew_time
            && self.transitions == other.transitions
            && self.lease_duration == other.lease_duration
    }
}

/// What we know of the Lease object.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    /// Nothing observed yet (start, or after a conflict until the re-read).
    Unknown,
    /// It does not exist.
    Absent,
    /// Its last observed content, and when its claim last changed.
    Present {
        record: LeaseRecord,
        changed_at: Instant,
    },
}

/// Our role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Follower,
    Leader {
        since: Instant,
        /// When the last successful write was *sent*: our claim is counted from then,
        /// which is never later than when others observed it.
        renewed_at: Instant,
    },
}

/// A write the elector asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// No Lease exists: create it, holding it.
    Create,
    /// The Lease is free, expired or already ours from a previous run: take it.
    Acquire,
    /// We lead: move `renewTime` forward.
    Renew,
    /// Shutting down while leading: give it up so a standby need not wait for expiry.
    Release,
}

/// One write: what to send and the resourceVersion it is conditional on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub kind: WriteKind,
    /// `None` only for [`WriteKind::Create`].
    pub resource_version: Option<String>,
    /// The record the write starts from (for transitions and acquire time).
    pub base: Option<LeaseRecord>,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing until `Instant` (or until something is observed).
    Wait(Instant),
    /// Send this write now.
    Write(Write),
    /// Our view is stale (a write conflicted): read the Lease before deciding.
    Refresh,
}

/// A change of role.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transition {
    Acquired,
    Lost(LostReason),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LostReason {
    /// No successful renewal within the renew deadline.
    RenewDeadline,
    /// The Lease names another holder.
    TakenBy(String),
    /// We released it (shutdown).
    Released,
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LostReason::RenewDeadline => {
                f.write_str("no successful renewal within the renew deadline")
            }
            LostReason::TakenBy(h) => write!(f, "the Lease is now held by {h}"),
            LostReason::Released => f.write_str("released on shutdown"),
        }
    }
}

/// How a write ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteResult {
    /// The API server stored it; the Lease as returned.
    Written(LeaseRecord),
    /// The precondition failed (409) or the Lease was created/deleted meanwhile.
    Conflict,
    /// Anything else (network, 5xx, timeout).
    Failed,
}

/// Leadership as the rest of the controller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    pub identity: String,
    pub leader: bool,
    /// Our claim is valid until then (last renewal sent + renew deadline).
    pub valid_until: Option<Instant>,
    /// Counts our acquisitions in this process: a new value is a new term, even if the
    /// observer missed the loss in between.
    pub term: u64,
    /// The holder as last observed.
    pub holder: Option<String>,
    pub transitions: i32,
    /// While leading: the epoch floor of our acquisition ([`LeaseRecord::epoch_floor`]),
    /// the epoch the publisher takes for this term. 0 otherwise.
    pub epoch_floor: u64,
}

impl Leadership {
    /// A standby's view before anything is known.
    pub fn standby(identity: impl Into<String>) -> Self {
        Leadership {
            identity: identity.into(),
            leader: false,
            valid_until: None,
            term: 0,
            holder: None,
            transitions: 0,
            epoch_floor: 0,
        }
    }

    /// The claim check made before every publish and every status write.
    pub fn holds(&self, now: Instant) -> bool {
        self.leader && self.valid_until.is_some_and(|until| now < until)
    }
}

/// The election state machine of one candidate.
#[derive(Clone, Debug)]
pub struct Elector {
    identity: String,
    timings: LeaseTimings,
    seen: Seen,
    role: Role,
    /// No write before this (retry period after the last attempt).
    next_attempt: Option<Instant>,
    term: u64,
}

impl Elector {
    pub fn new(identity: impl Into<String>, timings: LeaseTimings) -> Self {
        Elector {
            identity: identity.into(),
            timings,
            seen: Seen::Unknown,
            role: Role::Follower,
            next_attempt: None,
            term: 0,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn is_leader(&self) -> bool {
        matches!(self.role, Role::Leader { .. })
    }

    pub fn leadership(&self) -> Leadership {
        let (leader, valid_until) = match self.role {
            Role::Leader { renewed_at, .. } => {
                (true, Some(renewed_at + self.timings.renew_deadline))
            }
            Role::Follower => (false, None),
        };
        let (holder, transitions, floor) = match &self.seen {
            Seen::Present { record, .. } => (
                record.holder.clone(),
                record.transitions,
                record.epoch_floor(),
            ),
            _ => (None, 0, 0),
        };
        Leadership {
            identity: self.identity.clone(),
            leader,
            valid_until,
            term: self.term,
            holder,
            transitions,
            epoch_floor: if leader { floor } else { 0 },
        }
    }

    /// Records what the Lease looks like now (`None`: it does not exist).
    pub fn observe(&mut self, lease: Option<LeaseRecord>, now: Instant) -> Option<Transition> {
        self.seen = match lease {
            None => Seen::Absent,
            Some(record) => {
                let changed_at = match &self.seen {
                    Seen::Present {
                        record: old,
                        changed_at,
                    } if old.same_claim(&record) => *changed_at,
                    _ => now,
                };
                Seen::Present { record, changed_at }
            }
        };
        // Someone else wrote their name: whatever our clock says, we no longer lead.
        if let (
            Role::Leader { .. },
            Seen::Present {
                record:
                    LeaseRecord {
                        holder: Some(holder),
                        ..
                    },
                ..
            },
        ) = (self.role, &self.seen)
            && holder != &self.identity
        {
            let holder = holder.clone();
            self.role = Role::Follower;
            return Some(Transition::Lost(LostReason::TakenBy(holder)));
        }
        None
    }

    /// What to do at `now`; may first give up leadership (renew deadline passed).
    pub fn tick(&mut self, now: Instant) -> (Option<Transition>, Step) {
        let mut transition = None;
        if let Role::Leader { renewed_at, .. } = self.role
            && now >= renewed_at + self.timings.renew_deadline
        {
            self.role = Role::Follower;
            transition = Some(Transition::Lost(LostReason::RenewDeadline));
        }
        (transition, self.step(now))
    }

    fn step(&self, now: Instant) -> Step {
        let retry_ok = self.next_attempt.is_none_or(|t| now >= t);
        let not_before = self.next_attempt.unwrap_or(now);
        match (&self.role, &self.seen) {
            (_, Seen::Unknown) => Step::Refresh,
            (Role::Leader { renewed_at, .. }, seen) => {
                let due = self
                    .next_attempt
                    .unwrap_or(*renewed_at + self.timings.retry_period);
                if now < due {
                    return Step::Wait(due.min(*renewed_at + self.timings.renew_deadline));
                }
                match seen {
                    Seen::Present { record, .. } => Step::Write(Write {
                        kind: WriteKind::Renew,
                        resource_version: record.resource_version.clone(),
                        base: Some(record.clone()),
                    }),
                    // Deleted under us: put it back, still ours.
                    _ => Step::Write(Write {
                        kind: WriteKind::Create,
                        resource_version: None,
                        base: None,
                    }),
                }
            }
            (Role::Follower, Seen::Absent) => {
                if retry_ok {
                    Step::Write(Write {
                        kind: WriteKind::Create,
                        resource_version: None,
                        base: None,
                    })
                } else {
                    Step::Wait(not_before)
                }
            }
            (Role::Follower, Seen::Present { record, changed_at }) => {
                let free_at = match &record.holder {
                    None => now,
                    Some(h) if h == &self.identity => now,
                    Some(_) => *changed_at + record.lease_duration,
                };
                let at = free_at.max(not_before);
                if now >= at {
                    Step::Write(Write {
                        kind: WriteKind::Acquire,
                        resource_version: record.resource_version.clone(),
                        base: Some(record.clone()),
                    })
                } else {
                    Step::Wait(at)
                }
            }
        }
    }

    /// The write to give the Lease up, if we lead.
    pub fn release(&self) -> Option<Write> {
        match (&self.role, &self.seen) {
            (Role::Leader { .. }, Seen::Present { record, .. }) => Some(Write {
                kind: WriteKind::Release,
                resource_version: record.resource_version.clone(),
                base: Some(record.clone()),
            }),
            _ => None,
        }
    }

    /// Records how `write` (sent at `sent_at`) ended, at `now`.
    pub fn on_written(
        &mut self,
        write: &Write,
        result: WriteResult,
        sent_at: Instant,
        now: Instant,
    ) -> Option<Transition> {
        self.next_attempt = Some(now + self.timings.retry_period);
        match result {
            WriteResult::Written(record) => {
                let ours = record.holder.as_deref() == Some(self.identity.as_str());
                self.observe(Some(record), now);
                match (self.role, ours, &write.kind) {
                    (_, _, WriteKind::Release) => {
                        let was_leader = self.is_leader();
                        self.role = Role::Follower;
                        was_leader.then_some(Transition::Lost(LostReason::Released))
                    }
                    (Role::Follower, true, _) => {
                        self.term += 1;
                        self.role = Role::Leader {
                            since: sent_at,
                            renewed_at: sent_at,
                        };
                        // The first renewal is one retry period after the acquisition.
                        self.next_attempt = Some(sent_at + self.timings.retry_period);
                        Some(Transition::Acquired)
                    }
                    (Role::Leader { since, .. }, true, _) => {
                        self.role = Role::Leader {
                            since,
                            renewed_at: sent_at,
                        };
                        self.next_attempt = Some(sent_at + self.timings.retry_period);
                        None
                    }
                    // The write landed but names someone else: cannot happen with our own
                    // writes; treat as taken.
                    (Role::Leader { .. }, false, _) => {
                        self.role = Role::Follower;
                        Some(Transition::Lost(LostReason::TakenBy(
                            self.leadership().holder.unwrap_or_default(),
                        )))
                    }
                    (Role::Follower, false, _) => None,
                }
            }
            WriteResult::Conflict => {
                // Someone wrote first: our resourceVersion is stale. Re-read before
                // deciding anything (a leader keeps its role until the re-read shows
                // another holder or the renew deadline passes).
                self.seen = Seen::Unknown;
                None
            }
            WriteResult::Failed => None,
        }
    }

    /// How long leading has lasted, for logs.
    pub fn leading_for(&self, now: Instant) -> Option<Duration> {
        match self.role {
            Role::Leader { since, .. } => Some(now.saturating_duration_since(since)),
            Role::Follower => None,
        }
    }
}

/// The Lease spec a write sends. `now` is the wall clock (written for humans and other
/// implementations; the election itself never compares it with another clock).
pub fn desired_spec(
    write: &Write,
    identity: &str,
    timings: &LeaseTimings,
    now: Timestamp,
) -> LeaseSpec {
    let base = write.base.as_ref();
    let transitions = base.map(|b| b.transitions).unwrap_or(0);
    match write.kind {
        WriteKind::Create => LeaseSpec {
            holder_identity: Some(identity.to_string()),
            lease_duration_seconds: Some(timings.lease_duration_seconds()),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        },
        WriteKind::Acquire => {
            // Every acquisition is a transition, re-taking a claim that still names us
            // too: each acquisition must have an epoch floor of its own.
            let transitions = transitions.saturating_add(1);
            LeaseSpec {
                holder_identity: Some(identity.to_string()),
                lease_duration_seconds: Some(timings.lease_duration_seconds()),
                acquire_time: Some(MicroTime(now)),
                renew_time: Some(MicroTime(now)),
                lease_transitions: Some(transitions),
                ..Default::default()
            }
        }
        WriteKind::Renew => LeaseSpec {
            holder_identity: Some(identity.to_string()),
            lease_duration_seconds: Some(timings.lease_duration_seconds()),
            acquire_time: Some(MicroTime(base.and_then(|b| b.acquire_time).unwrap_or(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        },
        // As client-go releases: no holder, a 1 s duration, so whoever watches may take it.
        WriteKind::Release => LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn timings() -> LeaseTimings {
        LeaseTimings {
            lease_duration: 15 * S,
            renew_deadline: 10 * S,
            retry_period: 2 * S,
        }
    }

    fn mk_record(holder: Option<&str>, rv: &str, renew_secs: i64) -> LeaseRecord {
        LeaseRecord {
            holder: holder.map(str::to_string),
            lease_duration: 15 * S,
            acquire_time: None,
            renew_time: Some(Timestamp::from_second(renew_secs).unwrap()),
            transitions: 0,
            created: Some(Timestamp::from_second(1_000).unwrap()),
            resource_version: Some(rv.to_string()),
        }
    }

    fn written_by(e: &Elector, rv: &str, renew_secs: i64) -> WriteResult {
        WriteResult::Written(mk_record(Some(e.identity()), rv, renew_secs))
    }

    fn expect_write(step: Step) -> Write {
        match step {
            Step::Write(w) => w,
            other => panic!("expected a write, got {other:?}"),
        }
    }

    #[test]
    fn a_candidate_creates_a_missing_lease_and_leads() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        assert_eq!(
            e.tick(t0).1,
            Step::Refresh,
            "nothing is known before a read"
        );
        e.observe(None, t0);
        let w = expect_write(e.tick(t0).1);
        assert_eq!(w.kind, WriteKind::Create);
        let t = e.on_written(&w, written_by(&e, "1", 0), t0, t0);
        assert_eq!(t, Some(Transition::Acquired));
        let l = e.leadership();
        assert!(l.leader && l.holds(t0));
        assert_eq!(l.term, 1);
        assert_eq!(l.valid_until, Some(t0 + 10 * S));
    }

    #[test]
    fn a_standby_waits_a_full_lease_duration_after_the_last_renewal_it_saw() {
        let t0 = Instant::now();
        let mut e = Elector::new("b", timings());
        e.observe(Some(mk_record(Some("a"), "5", 100)), t0);
        assert_eq!(e.tick(t0).1, Step::Wait(t0 + 15 * S));
        // A renewal seen at t0+10s restarts the clock.
        e.observe(Some(mk_record(Some("a"), "6", 110)), t0 + 10 * S);
        assert_eq!(e.tick(t0 + 14 * S).1, Step::Wait(t0 + 25 * S));
        // Re-reading the same claim does not.
        e.observe(Some(mk_record(Some("a"), "6", 110)), t0 + 20 * S);
        let w = expect_write(e.tick(t0 + 25 * S).1);
        assert_eq!(w.kind, WriteKind::Acquire);
        assert_eq!(w.resource_version.as_deref(), Some("6"));
        let spec = desired_spec(&w, "b", &timings(), Timestamp::UNIX_EPOCH);
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(
            spec.lease_transitions,
            Some(1),
            "a takeover is a transition"
        );
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert!(!e.leadership().holds(t0 + 25 * S));
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let t0 = Instant::now();
        let mut e = Elector::new("b", timings());
        e.observe(Some(mk_record(None, "9", 100)), t0);
        let w = expect_write(e.tick(t0).1);
        assert_eq!(w.kind, WriteKind::Acquire);
    }

    #[test]
    fn our_own_claim_is_retaken_at_once_as_a_transition_of_its_own() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        let mut record = mk_record(Some("a"), "3", 100);
        record.transitions = 4;
        e.observe(Some(record), t0);
        let w = expect_write(e.tick(t0).1);
        assert_eq!(w.kind, WriteKind::Acquire);
        let spec = desired_spec(&w, "a", &timings(), Timestamp::UNIX_EPOCH);
        assert_eq!(
            spec.lease_transitions,
            Some(5),
            "a new term needs a floor above the last one"
        );
    }

    #[test]
    fn every_acquisition_has_a_higher_epoch_floor_even_of_a_recreated_lease() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        assert_eq!(e.leadership().epoch_floor, 0, "a standby has none");
        let mut record = mk_record(Some("b"), "3", 100);
        record.transitions = 6;
        let before = record.epoch_floor();
        assert_eq!(before, 1_000 * (1 << 21) + 6);
        e.observe(Some(record.clone()), t0);
        let w = expect_write(e.tick(t0 + 15 * S).1);
        let mut taken = record.clone();
        taken.holder = Some("a".into());
        taken.transitions = desired_spec(&w, "a", &timings(), Timestamp::UNIX_EPOCH)
            .lease_transitions
            .unwrap();
        e.on_written(&w, WriteResult::Written(taken), t0 + 15 * S, t0 + 15 * S);
        let floor = e.leadership().epoch_floor;
        assert!(floor > before, "{floor} after {before}");
        // The Lease was deleted and created again (later), transitions back to 0.
        let mut recreated = mk_record(Some("c"), "1", 100);
        recreated.created = Some(Timestamp::from_second(1_001).unwrap());
        recreated.transitions = 0;
        assert!(recreated.epoch_floor() > floor);
        // Floors stay exact in Redis' Lua numbers (below 2^53) until 2106.
        recreated.created = Some(Timestamp::from_second(u32::MAX as i64).unwrap());
        recreated.transitions = i32::MAX;
        assert!(recreated.epoch_floor() < 1 << 53);
    }

    #[test]
    fn losing_the_race_for_a_free_lease_rereads_and_stays_standby() {
        let t0 = Instant::now();
        let mut e = Elector::new("b", timings());
        e.observe(None, t0);
        let w = expect_write(e.tick(t0).1);
        assert_eq!(e.on_written(&w, WriteResult::Conflict, t0, t0), None);
        assert_eq!(e.tick(t0).1, Step::Refresh);
        e.observe(Some(mk_record(Some("a"), "2", 100)), t0);
        assert_eq!(e.tick(t0 + S).1, Step::Wait(t0 + 15 * S));
        assert!(!e.is_leader());
    }

    #[test]
    fn the_leader_renews_every_retry_period() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        e.observe(None, t0);
        let w = expect_write(e.tick(t0).1);
        e.on_written(&w, written_by(&e, "1", 0), t0, t0);
        assert_eq!(e.tick(t0 + S).1, Step::Wait(t0 + 2 * S));
        let w = expect_write(e.tick(t0 + 2 * S).1);
        assert_eq!(w.kind, WriteKind::Renew);
        assert_eq!(w.resource_version.as_deref(), Some("1"));
        let t = e.on_written(&w, written_by(&e, "2", 2), t0 + 2 * S, t0 + 2 * S);
        assert_eq!(t, None, "a renewal is no transition");
        assert_eq!(e.leadership().valid_until, Some(t0 + 12 * S));
        assert_eq!(e.leadership().term, 1);
    }

    #[test]
    fn the_leader_steps_down_when_renewals_fail_until_the_deadline() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        e.observe(None, t0);
        let w = expect_write(e.tick(t0).1);
        e.on_written(&w, written_by(&e, "1", 0), t0, t0);
        let mut now = t0 + 2 * S;
        while now < t0 + 10 * S {
            let (t, step) = e.tick(now);
            assert_eq!(t, None);
            let w = expect_write(step);
            e.on_written(&w, WriteResult::Failed, now, now);
            assert!(e.leadership().holds(now));
            now += 2 * S;
        }
        let (t, _) = e.tick(t0 + 10 * S);
        assert_eq!(t, Some(Transition::Lost(LostReason::RenewDeadline)));
        assert!(!e.leadership().holds(t0 + 10 * S));
    }

    #[test]
    fn a_stalled_leader_sees_its_claim_expired_before_anyone_else_may_take_it() {
        // SIGSTOP for longer than the lease duration: on waking, the claim check fails
        // before any write, and the renewal deadline ends leadership.
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        e.observe(None, t0);
        let w = expect_write(e.tick(t0).1);
        e.on_written(&w, written_by(&e, "1", 0), t0, t0);
        let woke = t0 + 20 * S;
        assert!(!e.leadership().holds(woke), "claim expired while stopped");
        let (t, step) = e.tick(woke);
        assert_eq!(t, Some(Transition::Lost(LostReason::RenewDeadline)));
        // Now a standby: the Lease it last saw is its own, so it may try to retake it
        // (with the old resourceVersion; a takeover by someone else makes that a 409).
        let w = expect_write(step);
        assert_eq!(w.kind, WriteKind::Acquire);
        assert_eq!(e.on_written(&w, WriteResult::Conflict, woke, woke), None);
        e.observe(Some(mk_record(Some("b"), "7", 120)), woke);
        assert!(matches!(e.tick(woke).1, Step::Wait(_)));
        assert!(!e.is_leader());
    }

    #[test]
    fn observing_another_holder_ends_leadership_at_once() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        e.observe(None, t0);
        let w = expect_write(e.tick(t0).1);
        e.on_written(&w, written_by(&e, "1", 0), t0, t0);
        let t = e.observe(Some(mk_record(Some("b"), "4", 5)), t0 + S);
        assert_eq!(t, Some(Transition::Lost(LostReason::TakenBy("b".into()))));
        assert!(!e.leadership().leader);
    }

    #[test]
    fn a_renewal_conflict_rereads_and_keeps_leading_if_still_ours() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        e.observe(None, t0);
        let w = expect_write(e.tick(t0).1);
        e.on_written(&w, written_by(&e, "1", 0), t0, t0);
        let w = expect_write(e.tick(t0 + 2 * S).1);
        e.on_written(&w, WriteResult::Conflict, t0 + 2 * S, t0 + 2 * S);
        assert!(e.is_leader(), "a conflict alone does not end leadership");
        assert_eq!(e.tick(t0 + 2 * S).1, Step::Refresh);
        assert_eq!(
            e.observe(Some(mk_record(Some("a"), "3", 1)), t0 + 2 * S),
            None
        );
        let w = expect_write(e.tick(t0 + 4 * S).1);
        assert_eq!(w.resource_version.as_deref(), Some("3"));
    }

    #[test]
    fn release_gives_the_lease_up_with_a_short_duration() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        assert_eq!(e.release(), None, "a standby has nothing to release");
        e.observe(None, t0);
        let w = expect_write(e.tick(t0).1);
        e.on_written(&w, written_by(&e, "1", 0), t0, t0);
        let w = e.release().unwrap();
        let spec = desired_spec(&w, "a", &timings(), Timestamp::UNIX_EPOCH);
        assert_eq!(spec.holder_identity, None);
        assert_eq!(spec.lease_duration_seconds, Some(1));
        let t = e.on_written(
            &w,
            WriteResult::Written(mk_record(None, "2", 3)),
            t0 + S,
            t0 + S,
        );
        assert_eq!(t, Some(Transition::Lost(LostReason::Released)));
    }

    #[test]
    fn a_second_term_is_a_new_term() {
        let t0 = Instant::now();
        let mut e = Elector::new("a", timings());
        e.observe(None, t0);
        let w = expect_write(e.tick(t0).1);
        e.on_written(&w, written_by(&e, "1", 0), t0, t0);
        e.observe(Some(mk_record(Some("b"), "2", 1)), t0 + S);
        e.observe(Some(mk_record(None, "3", 2)), t0 + 2 * S);
        let w = expect_write(e.tick(t0 + 3 * S).1);
        let t = e.on_written(&w, written_by(&e, "4", 3), t0 + 3 * S, t0 + 3 * S);
        assert_eq!(t, Some(Transition::Acquired));
        assert_eq!(e.leadership().term, 2);
    }

    #[test]
    fn timings_must_nest() {
        let ok = timings();
        assert_eq!(ok.validate(), Ok(()));
        let bad = LeaseTimings {
            renew_deadline: 15 * S,
            ..ok
        };
        assert!(matches!(
            bad.validate(),
            Err(LeaseTimingsError::DeadlineNotBelowDuration { .. })
        ));
        let bad = LeaseTimings {
            retry_period: 10 * S,
            ..ok
        };
        assert!(matches!(
            bad.validate(),
            Err(LeaseTimingsError::RetryNotBelowDeadline { .. })
        ));
        let short = LeaseTimings {
            lease_duration: Duration::from_millis(2500),
            renew_deadline: 2 * S,
            retry_period: Duration::from_millis(500),
        };
        assert_eq!(short.lease_duration_seconds(), 3);
    }
}
