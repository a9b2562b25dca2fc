//! Pure decision logic of the bus, kept free of I/O so every rule is a unit test:
//! - [`FollowState::decide`]: what a follower does with an observed `latest` (fetch,
//!   keep, treat a regression as a reset).
//! - [`check_advance`]: the fencing rule (the Redis Lua script implements the same rule).
//! - [`needs_republish`]: when a publisher must re-seed and republish (store lost data).

use super::SnapshotRef;

/// What a follower saw when it read `latest`.
#[derive(Clone, Copy, Debug)]
pub enum Observation<'a> {
    /// `latest` does not exist (store empty: restarted without data, or nothing published).
    Missing,
    Present {
        latest: &'a SnapshotRef,
        /// Identity of the store instance (Redis `run_id`), when known. A change means
        /// the store restarted or failed over.
        server: Option<&'a str>,
    },
}

/// Why a follower keeps what it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepReason {
    /// `latest` is what we serve.
    UpToDate,
    /// `latest` is a blob we already rejected; wait for the next version.
    AlreadyRejected,
    /// `latest` is older than what we serve and nothing indicates a reset (same store,
    /// `latest` never seen missing): ignore it.
    Stale,
    /// `latest` is missing: keep serving until a publisher writes again.
    LatestMissing,
}

/// What a follower does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Keep(KeepReason),
    /// Fetch and decode the blob of `latest`. `reset` is true when it is older than (or
    /// as old as) what we serve but the store was reset, so the new sequence is accepted.
    Fetch {
        reset: bool,
    },
}

/// A follower's memory of what it serves, enough to tell progress from regression.
#[derive(Clone, Debug, Default)]
pub struct FollowState {
    held: Option<SnapshotRef>,
    /// Store instance the held snapshot was read from.
    held_server: Option<String>,
    /// `latest` was observed missing since the held snapshot was accepted.
    missing_seen: bool,
    /// The last blob rejected, so it is not fetched again and again.
    rejected: Option<SnapshotRef>,
}

impl FollowState {
    pub fn held(&self) -> Option<&SnapshotRef> {
        self.held.as_ref()
    }

    /// The rule. A version regression is a reset (accepted) when the store instance
    /// changed or `latest` was seen missing in between; otherwise it is stale and ignored.
    pub fn decide(&self, observation: Observation<'_>) -> Decision {
        let (latest, server) = match observation {
            Observation::Missing => return Decision::Keep(KeepReason::LatestMissing),
            Observation::Present { latest, server } => (latest, server),
        };
        if self
            .rejected
            .as_ref()
            .is_some_and(|r| r.version == latest.version && r.hash == latest.hash)
        {
            return Decision::Keep(KeepReason::AlreadyRejected);
        }
        let Some(held) = &self.held else {
            return Decision::Fetch { reset: false };
        };
        if held.version == latest.version && held.hash == latest.hash {
            return Decision::Keep(KeepReason::UpToDate);
        }
        if latest.version > held.version {
            return Decision::Fetch { reset: false };
        }
        let server_changed =
            matches!((self.held_server.as_deref(), server), (Some(a), Some(b)) if a != b);
        if server_changed || self.missing_seen {
            Decision::Fetch { reset: true }
        } else {
            Decision::Keep(KeepReason::Stale)
        }
    }

    /// Records that `latest` was missing (the store lost its data): the next sequence,
    /// whatever its numbers, is accepted.
    pub fn record_missing(&mut self) {
        if self.held.is_some() {
            self.missing_seen = true;
        }
    }

    /// Records that `reference`, read from store instance `server`, is now served.
    pub fn accept(&mut self, reference: SnapshotRef, server: Option<String>) {
        self.held = Some(reference);
        self.held_server = server;
        self.missing_seen = false;
        self.rejected = None;
    }

    /// Records a rejected blob so it is not fetched again; the next version is tried.
    pub fn reject(&mut self, reference: SnapshotRef) {
        self.rejected = Some(reference);
    }
}

/// The fencing rule: may a publisher with `epoch` move `latest` to `version`?
/// `epoch_counter` is the highest epoch taken so far: a new leader fences the old one as
/// soon as it takes its epoch, even before it publishes anything.
pub fn check_advance(
    latest: Option<&SnapshotRef>,
    epoch_counter: u64,
    version: u64,
    epoch: u64,
) -> bool {
    if epoch < epoch_counter {
        return false;
    }
    match latest {
        Some(l) => version > l.version && epoch >= l.epoch,
        None => true,
    }
}

/// Did the store lose what this publisher last published? True when `latest` is missing
/// or older than it (Redis restarted empty, or failed over to a replica that lagged).
pub fn needs_republish(latest: Option<&SnapshotRef>, last_published: Option<&SnapshotRef>) -> bool {
    match (latest, last_published) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(l), Some(p)) => l.version < p.version,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_ref(version: u64, hash: &str, epoch: u64) -> SnapshotRef {
        SnapshotRef {
            version,
            hash: hash.to_owned(),
            epoch,
            published_at_ms: 0,
        }
    }

    fn present<'a>(latest: &'a SnapshotRef, server: &'a str) -> Observation<'a> {
        Observation::Present {
            latest,
            server: Some(server),
        }
    }

    fn holding(r: SnapshotRef, server: &str) -> FollowState {
        let mut s = FollowState::default();
        s.accept(r, Some(server.to_owned()));
        s
    }

    #[test]
    fn empty_follower_fetches_whatever_is_latest() {
        let l = mk_ref(3, "aa", 1);
        assert_eq!(
            FollowState::default().decide(present(&l, "r1")),
            Decision::Fetch { reset: false }
        );
    }

    #[test]
    fn missing_latest_keeps_what_is_served() {
        let s = holding(mk_ref(3, "aa", 1), "r1");
        assert_eq!(
            s.decide(Observation::Missing),
            Decision::Keep(KeepReason::LatestMissing)
        );
    }

    #[test]
    fn same_version_and_hash_is_up_to_date() {
        let s = holding(mk_ref(3, "aa", 1), "r1");
        let l = mk_ref(3, "aa", 1);
        assert_eq!(
            s.decide(present(&l, "r1")),
            Decision::Keep(KeepReason::UpToDate)
        );
        // Even across a store change: same content, nothing to do.
        assert_eq!(
            s.decide(present(&l, "r2")),
            Decision::Keep(KeepReason::UpToDate)
        );
    }

    #[test]
    fn newer_version_is_fetched() {
        let s = holding(mk_ref(3, "aa", 1), "r1");
        let l = mk_ref(4, "bb", 1);
        assert_eq!(
            s.decide(present(&l, "r1")),
            Decision::Fetch { reset: false }
        );
    }

    #[test]
    fn regression_on_the_same_store_is_stale() {
        let s = holding(mk_ref(5, "aa", 1), "r1");
        let l = mk_ref(2, "bb", 1);
        assert_eq!(
            s.decide(present(&l, "r1")),
            Decision::Keep(KeepReason::Stale)
        );
        let same_version_other_hash = mk_ref(5, "cc", 1);
        assert_eq!(
            s.decide(present(&same_version_other_hash, "r1")),
            Decision::Keep(KeepReason::Stale)
        );
    }

    #[test]
    fn regression_after_a_store_change_is_a_reset() {
        let s = holding(mk_ref(5, "aa", 1), "r1");
        let l = mk_ref(1, "bb", 1);
        assert_eq!(s.decide(present(&l, "r2")), Decision::Fetch { reset: true });
    }

    #[test]
    fn regression_after_latest_was_missing_is_a_reset() {
        let mut s = holding(mk_ref(5, "aa", 1), "r1");
        s.record_missing();
        let l = mk_ref(1, "bb", 1);
        assert_eq!(s.decide(present(&l, "r1")), Decision::Fetch { reset: true });
        // Without a known server identity the missing `latest` alone is enough.
        let unknown = Observation::Present {
            latest: &l,
            server: None,
        };
        assert_eq!(s.decide(unknown), Decision::Fetch { reset: true });
    }

    #[test]
    fn unknown_server_identity_does_not_count_as_a_change() {
        let mut s = FollowState::default();
        s.accept(mk_ref(5, "aa", 1), None);
        let l = mk_ref(1, "bb", 1);
        assert_eq!(
            s.decide(present(&l, "r2")),
            Decision::Keep(KeepReason::Stale)
        );
    }

    #[test]
    fn accepting_clears_the_reset_marker() {
        let mut s = holding(mk_ref(5, "aa", 1), "r1");
        s.record_missing();
        s.accept(mk_ref(1, "bb", 1), Some("r1".into()));
        // A later regression on the same store is stale again.
        let older = mk_ref(0, "cc", 1);
        assert_eq!(
            s.decide(present(&older, "r1")),
            Decision::Keep(KeepReason::Stale)
        );
    }

    #[test]
    fn rejected_blob_is_not_fetched_again_but_the_next_one_is() {
        let mut s = holding(mk_ref(5, "aa", 1), "r1");
        let bad = mk_ref(6, "bad", 1);
        s.reject(bad.clone());
        assert_eq!(
            s.decide(present(&bad, "r1")),
            Decision::Keep(KeepReason::AlreadyRejected)
        );
        let next = mk_ref(7, "good", 1);
        assert_eq!(
            s.decide(present(&next, "r1")),
            Decision::Fetch { reset: false }
        );
        assert_eq!(s.held().map(|h| h.version), Some(5));
    }

    #[test]
    fn fencing_refuses_older_epochs_and_non_newer_versions() {
        let l = mk_ref(10, "aa", 3);
        assert!(check_advance(Some(&l), 3, 11, 3));
        assert!(check_advance(Some(&l), 3, 11, 4));
        assert!(!check_advance(Some(&l), 3, 10, 3), "same version");
        assert!(
            !check_advance(Some(&l), 3, 9, 5),
            "older version, newer epoch"
        );
        assert!(
            !check_advance(Some(&l), 3, 50, 2),
            "older epoch, higher version"
        );
        assert!(
            !check_advance(Some(&l), 4, 11, 3),
            "a newer epoch was taken"
        );
        assert!(check_advance(None, 0, 1, 0));
        assert!(!check_advance(None, 2, 1, 1));
    }

    #[test]
    fn republish_when_the_store_lost_what_we_published() {
        let mine = mk_ref(10, "aa", 3);
        assert!(!needs_republish(None, None), "nothing published yet");
        assert!(needs_republish(None, Some(&mine)), "latest missing");
        assert!(
            needs_republish(Some(&mk_ref(7, "x", 3)), Some(&mine)),
            "lagging replica"
        );
        assert!(!needs_republish(Some(&mine), Some(&mine)));
        assert!(
            !needs_republish(Some(&mk_ref(12, "y", 4)), Some(&mine)),
            "someone newer"
        );
    }
}
