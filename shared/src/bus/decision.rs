//! Pure decision logic of the bus, kept free of I/O so every rule is a unit test:
//! - [`FollowState::decide`]: what a follower does with an observed `latest` (fetch or
//!   keep). Snapshots are ordered by `(epoch, version)`: a follower moves only forward in
//!   that order, whatever happened to the store — a Redis that restarted empty does not
//!   make a lower epoch acceptable, so a deposed writer's mesh is never served again.
//! - [`check_advance`]: the fencing rule (the Redis Lua script implements the same rule).
//! - [`needs_republish`]: when a publisher must write its snapshot again (the store lost
//!   it, or holds something a lower epoch wrote).

use std::cmp::Ordering;

use super::SnapshotRef;

/// What a follower saw when it read `latest`.
#[derive(Clone, Copy, Debug)]
pub enum Observation<'a> {
    /// `latest` does not exist (store empty: restarted without data, or nothing published).
    Missing,
    /// `latest` exists but cannot be read (a field missing or not a number).
    Malformed,
    Present {
        latest: &'a SnapshotRef,
    },
}

/// Why a follower keeps what it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepReason {
    /// `latest` is what we serve.
    UpToDate,
    /// `latest` is a blob we already rejected; wait for the next version.
    AlreadyRejected,
    /// `latest` is not after what we serve in `(epoch, version)` order: an older epoch
    /// (a deposed writer, even into a store that was reset), an older version of our
    /// epoch, or another blob under the version we serve. Refused.
    Stale,
    /// `latest` is missing: keep serving until a publisher writes again.
    LatestMissing,
    /// `latest` cannot be read: keep serving; a publisher overwrites it.
    LatestMalformed,
}

/// What a follower does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Keep(KeepReason),
    /// Fetch and decode the blob of `latest`.
    Fetch,
}

/// The order in which snapshots may follow one another: by epoch, then by version.
pub fn snapshot_order(a: &SnapshotRef, b: &SnapshotRef) -> Ordering {
    (a.epoch, a.version).cmp(&(b.epoch, b.version))
}

/// A follower's memory of what it serves, enough to tell progress from regression.
#[derive(Clone, Debug, Default)]
pub struct FollowState {
    held: Option<SnapshotRef>,
    /// The last blob rejected, so it is not fetched again and again.
    rejected: Option<SnapshotRef>,
}

impl FollowState {
    pub fn held(&self) -> Option<&SnapshotRef> {
        self.held.as_ref()
    }

    /// The rule: fetch only what comes after the held snapshot in `(epoch, version)`
    /// order, and never a blob already rejected.
    pub fn decide(&self, observation: Observation<'_>) -> Decision {
        let latest = match observation {
            Observation::Missing => return Decision::Keep(KeepReason::LatestMissing),
            Observation::Malformed => return Decision::Keep(KeepReason::LatestMalformed),
            Observation::Present { latest } => latest,
        };
        if self.rejected.as_ref() == Some(latest) {
            return Decision::Keep(KeepReason::AlreadyRejected);
        }
        let Some(held) = &self.held else {
            return Decision::Fetch;
        };
        if held.version == latest.version && held.hash == latest.hash && held.epoch == latest.epoch
        {
            return Decision::Keep(KeepReason::UpToDate);
        }
        match snapshot_order(latest, held) {
            Ordering::Greater => Decision::Fetch,
            Ordering::Equal | Ordering::Less => Decision::Keep(KeepReason::Stale),
        }
    }

    /// Whether `candidate` may be served now (a fallback found by the follower: nothing
    /// is held, or it comes after what is).
    pub fn may_serve(&self, candidate: &SnapshotRef) -> bool {
        self.held
            .as_ref()
            .is_none_or(|held| snapshot_order(candidate, held) == Ordering::Greater)
    }

    /// Records that `reference` is now served.
    pub fn accept(&mut self, reference: SnapshotRef) {
        self.held = Some(reference);
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

/// Must a publisher write its last snapshot again? True when `latest` is missing or
/// unreadable, was written under a lower epoch (a deposed writer, typically into a Redis
/// that restarted empty), is an older version of our own epoch (failover to a lagging
/// replica), or carries our version with other content. False when `latest` has a higher
/// epoch: a newer leader owns it, and this publisher is deposed.
pub fn needs_republish(
    latest: Option<&SnapshotRef>,
    last_published: Option<&SnapshotRef>,
    latest_malformed: bool,
) -> bool {
    let Some(mine) = last_published else {
        return false;
    };
    if latest_malformed {
        return true;
    }
    let Some(latest) = latest else {
        return true;
    };
    match latest.epoch.cmp(&mine.epoch) {
        Ordering::Less => true,
        Ordering::Greater => false,
        Ordering::Equal => {
            latest.version < mine.version
                || (latest.version == mine.version && latest.hash != mine.hash)
        }
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

    fn present(latest: &SnapshotRef) -> Observation<'_> {
        Observation::Present { latest }
    }

    fn holding(r: SnapshotRef) -> FollowState {
        let mut s = FollowState::default();
        s.accept(r);
        s
    }

    #[test]
    fn empty_follower_fetches_whatever_is_latest() {
        let l = mk_ref(3, "aa", 1);
        assert_eq!(FollowState::default().decide(present(&l)), Decision::Fetch);
    }

    #[test]
    fn missing_or_malformed_latest_keeps_what_is_served() {
        let s = holding(mk_ref(3, "aa", 1));
        assert_eq!(
            s.decide(Observation::Missing),
            Decision::Keep(KeepReason::LatestMissing)
        );
        assert_eq!(
            s.decide(Observation::Malformed),
            Decision::Keep(KeepReason::LatestMalformed)
        );
    }

    #[test]
    fn same_reference_is_up_to_date() {
        let s = holding(mk_ref(3, "aa", 1));
        assert_eq!(
            s.decide(present(&mk_ref(3, "aa", 1))),
            Decision::Keep(KeepReason::UpToDate)
        );
    }

    #[test]
    fn a_newer_version_or_a_newer_epoch_is_fetched() {
        let s = holding(mk_ref(3, "aa", 1));
        assert_eq!(s.decide(present(&mk_ref(4, "bb", 1))), Decision::Fetch);
        // A new leader after Redis restarted empty: a lower version, a higher epoch.
        assert_eq!(s.decide(present(&mk_ref(1, "bb", 2))), Decision::Fetch);
    }

    #[test]
    fn a_lower_epoch_is_refused_whatever_happened_to_the_store() {
        let s = holding(mk_ref(5, "new-leader", 8));
        // The deposed writer republished into a Redis that restarted empty: any version.
        for version in [1, 5, 6, 500] {
            assert_eq!(
                s.decide(present(&mk_ref(version, "deposed", 7))),
                Decision::Keep(KeepReason::Stale),
                "v{version}"
            );
        }
        // Missing in between changes nothing.
        let mut s = s;
        assert_eq!(
            s.decide(Observation::Missing),
            Decision::Keep(KeepReason::LatestMissing)
        );
        s.reject(mk_ref(9, "x", 8));
        assert_eq!(
            s.decide(present(&mk_ref(1, "deposed", 7))),
            Decision::Keep(KeepReason::Stale)
        );
    }

    #[test]
    fn an_older_version_or_another_blob_under_our_version_is_stale() {
        let s = holding(mk_ref(5, "aa", 1));
        assert_eq!(
            s.decide(present(&mk_ref(2, "bb", 1))),
            Decision::Keep(KeepReason::Stale)
        );
        assert_eq!(
            s.decide(present(&mk_ref(5, "cc", 1))),
            Decision::Keep(KeepReason::Stale)
        );
    }

    #[test]
    fn rejected_blob_is_not_fetched_again_but_the_next_one_is() {
        let mut s = holding(mk_ref(5, "aa", 1));
        let bad = mk_ref(6, "bad", 1);
        s.reject(bad.clone());
        assert_eq!(
            s.decide(present(&bad)),
            Decision::Keep(KeepReason::AlreadyRejected)
        );
        assert_eq!(s.decide(present(&mk_ref(7, "good", 1))), Decision::Fetch);
        assert_eq!(s.held().map(|h| h.version), Some(5));
        // An empty follower does not fetch a rejected blob again either.
        let mut empty = FollowState::default();
        empty.reject(bad.clone());
        assert_eq!(
            empty.decide(present(&bad)),
            Decision::Keep(KeepReason::AlreadyRejected)
        );
    }

    #[test]
    fn a_fallback_is_served_only_when_it_moves_forward() {
        assert!(FollowState::default().may_serve(&mk_ref(3, "a", 1)));
        let s = holding(mk_ref(5, "aa", 2));
        assert!(!s.may_serve(&mk_ref(4, "old", 2)));
        assert!(!s.may_serve(&mk_ref(9, "deposed", 1)));
        assert!(s.may_serve(&mk_ref(6, "next", 2)));
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
    fn republish_when_the_store_lost_or_overwrote_what_we_published() {
        let mine = mk_ref(10, "aa", 3);
        assert!(!needs_republish(None, None, false), "nothing published yet");
        assert!(needs_republish(None, Some(&mine), false), "latest missing");
        assert!(
            needs_republish(None, Some(&mine), true),
            "latest unreadable"
        );
        assert!(
            needs_republish(Some(&mk_ref(7, "x", 3)), Some(&mine), false),
            "lagging replica"
        );
        assert!(
            needs_republish(Some(&mk_ref(40, "deposed", 2)), Some(&mine), false),
            "a lower epoch wrote into a reset store, even with a higher version"
        );
        assert!(
            needs_republish(Some(&mk_ref(10, "other", 3)), Some(&mine), false),
            "our version, other content"
        );
        assert!(!needs_republish(Some(&mine), Some(&mine), false));
        assert!(
            !needs_republish(Some(&mk_ref(12, "y", 3)), Some(&mine), false),
            "a newer version of our epoch (we published it since)"
        );
        assert!(
            !needs_republish(Some(&mk_ref(2, "y", 4)), Some(&mine), false),
            "someone newer: we are deposed"
        );
    }
}
