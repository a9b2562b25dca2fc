//! The snapshot bus: how the controller's encoded snapshots reach every xDS replica.
//!
//! Public surface:
//! - [`SnapshotPublisher`] (trait, dyn-compatible): [`take_epoch`](SnapshotPublisher::take_epoch)
//!   on winning leadership, with a floor from what outlives the store (the Lease, or the
//!   wall clock) → [`EpochGrant`]; then [`publish`](SnapshotPublisher::publish) of an
//!   [`EncodedSnapshot`] → [`PublishOutcome`] (`Published` / `Unchanged` / `Fenced`);
//!   [`resign`](SnapshotPublisher::resign) when leadership ends;
//!   [`fetch_latest`](SnapshotPublisher::fetch_latest) reads back what is published.
//! - [`Follower`]: the consumer side of a follow loop. It yields the latest *good* decoded
//!   snapshot through a `watch` channel of `Option<Arc<Followed<T>>>` and a cheap
//!   [`FollowerStatus`] for `/readyz` detail. The loop itself is a [`BusTask`] the caller
//!   supervises.
//! - Two implementations of the same contract: [`memory`] (standalone mode, in-process)
//!   and [`redis`] (controller → Redis → N replicas; the key layout is documented there).
//!
//! The bus never looks inside a blob: the codec's header carries the content hash
//! ([`EncodedSnapshot::hash`]), and followers are given a decode function that returns
//! the value and the content hash it verified, which must be the hash `latest` names.
//! Versions are allocated by the bus and stamped beside the blob, so identical content
//! always has identical bytes. Both implementations go through the encoded bytes and the
//! decode function, so standalone mode serves exactly what a replica would.
//!
//! Epochs order writers: every acquisition of the right to publish takes an epoch above
//! every earlier one, anchored in something the store does not hold (the Lease the API
//! server persists, or the wall clock in `--config-dir` mode), so a store that restarted
//! empty cannot make a deposed writer current again. Followers serve snapshots in
//! `(epoch, version)` order only ([`FollowState`]).

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod codec;
mod decision;
mod follow;
pub mod memory;
pub mod metrics;
pub mod redis;

pub use codec::snapshot_decoder;
pub use decision::{
    Decision, FollowState, KeepReason, Observation, check_advance, needs_republish, snapshot_order,
};

/// Identifies one published snapshot. Stored beside the blob (in Redis: the `latest` hash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRef {
    /// Allocated by the bus; strictly increasing within an epoch, and across epochs while
    /// the store keeps its data. A new epoch after the store lost its data may start lower.
    pub version: u64,
    /// Hex content hash from the codec header; equal hashes mean equal content.
    pub hash: String,
    /// Leadership epoch of the publisher that wrote it (fencing): snapshots are ordered by
    /// `(epoch, version)`.
    pub epoch: u64,
    /// Publisher's wall clock at publish time, for the publish-to-follow latency metric.
    pub published_at_ms: u64,
}

impl fmt::Display for SnapshotRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let short = self.hash.get(..12).unwrap_or(&self.hash);
        write!(f, "v{} ({short}, epoch {})", self.version, self.epoch)
    }
}

/// An encoded snapshot as produced by the codec: opaque bytes plus the content hash the
/// codec wrote into its header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedSnapshot {
    pub bytes: Bytes,
    pub hash: String,
}

/// What [`SnapshotPublisher::publish`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishOutcome {
    /// `latest` now points at this new version.
    Published(SnapshotRef),
    /// `latest` already carried the same content hash; nothing was written.
    Unchanged(SnapshotRef),
    /// A publisher with a newer epoch (or a newer version) owns `latest`: this publisher is
    /// deposed and must stop publishing until it takes a new epoch. `current` is `latest`
    /// as found (absent when the newer leader has not published yet).
    Fenced { current: Option<SnapshotRef> },
}

/// What [`SnapshotPublisher::take_epoch`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochGrant {
    /// The epoch is ours: every publisher with a lower one is fenced from now on.
    Taken(u64),
    /// The store already knows an epoch above the floor: a newer writer exists (or this
    /// one's view of its right to publish is stale). Nothing was changed; stand down.
    Superseded { newer: u64 },
}

/// Errors of the bus. Each variant maps to a metric label via [`BusError::label`].
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("invalid Redis configuration: {0}")]
    Config(String),
    #[error("cannot read the Redis password file {path}: {source}")]
    PasswordFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Redis {operation} failed: {source}{}", redis_hint(source))]
    Redis {
        operation: &'static str,
        #[source]
        source: ::redis::RedisError,
    },
    #[error("Redis {operation} timed out after {after:?}")]
    Timeout {
        operation: &'static str,
        after: Duration,
    },
    #[error("Redis connection closed (notification stream ended)")]
    Disconnected,
    #[error("no epoch taken: call take_epoch() after winning leadership before publishing")]
    NoEpoch,
    #[error("`latest` in Redis is malformed: {0}")]
    MalformedLatest(String),
    #[error("blob of {0} is missing from Redis (expired or never written)")]
    BlobMissing(SnapshotRef),
    #[error("unexpected reply from a Redis script: {0}")]
    Script(String),
    #[error(
        "the snapshot blob is {size} bytes, above --max-blob-bytes ({limit}); replicas would refuse it, so it is not published"
    )]
    BlobTooLarge { size: u64, limit: u64 },
}

impl BusError {
    /// Short, stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            BusError::Config(_) | BusError::PasswordFile { .. } => "config",
            BusError::Redis { .. } => "redis",
            BusError::Timeout { .. } => "timeout",
            BusError::Disconnected => "disconnected",
            BusError::NoEpoch => "no_epoch",
            BusError::MalformedLatest(_) => "malformed_latest",
            BusError::BlobMissing(_) => "blob_missing",
            BusError::Script(_) => "script",
            BusError::BlobTooLarge { .. } => "blob_too_large",
        }
    }
}

/// An operator hint for the common Redis failures.
fn redis_hint(e: &::redis::RedisError) -> &'static str {
    let text = e.to_string();
    if e.kind() == ::redis::ErrorKind::AuthenticationFailed
        || text.contains("NOAUTH")
        || text.contains("Authentication required")
        || text.contains("WRONGPASS")
    {
        " (check the password: --redis-password-file or PILOTFISH_REDIS_PASSWORD)"
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
    {
        " (is Redis reachable at the configured URL?)"
    } else {
        ""
    }
}

/// The publishing side. Dyn-compatible (boxed futures) so a binary can hold
/// `Arc<dyn SnapshotPublisher>` and pick memory or Redis at start.
pub trait SnapshotPublisher: Send + Sync {
    /// Takes `floor` as this publisher's epoch unless the store knows a higher one (then
    /// [`EpochGrant::Superseded`], and nothing changes). `floor` must be above every
    /// epoch any earlier acquisition used, by any process, and must not depend on the
    /// store: the Kubernetes mode derives it from the Lease it just acquired
    /// (`Leadership::epoch_floor`), `--config-dir` mode from the wall clock
    /// ([`wall_clock_epoch_floor`]). Taking the same floor twice (a retry whose first reply
    /// was lost) gives it again. From then on, a publisher holding an older epoch is
    /// fenced.
    fn take_epoch(&self, floor: u64) -> BoxFuture<'_, Result<EpochGrant, BusError>>;

    /// Publishes `snapshot` unless `latest` already carries the same content hash.
    fn publish(&self, snapshot: EncodedSnapshot)
    -> BoxFuture<'_, Result<PublishOutcome, BusError>>;

    /// The snapshot `latest` points at and its blob, as the bus holds them (`None`:
    /// nothing published, or the blob is gone or too large to read). A controller that
    /// (re)starts reads it to keep serving the last accepted version of objects that are
    /// invalid when it starts.
    fn fetch_latest(&self) -> BoxFuture<'_, Result<Option<(SnapshotRef, Bytes)>, BusError>>;

    /// Gives up the epoch when leadership ends: publishing fails with
    /// [`BusError::NoEpoch`] until a new epoch is taken, and anything publishing on this
    /// publisher's behalf (the Redis watchdog) stops. The default does nothing, for buses
    /// with nothing to stop.
    fn resign(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A decoded snapshot together with the reference it was published under.
#[derive(Debug)]
pub struct Followed<T> {
    pub reference: SnapshotRef,
    pub value: T,
}

/// Error of a decode function given to a follower: its text goes to the log line, its
/// [`reason`](DecodeError::reason) to the `pilotfish_snapshot_rejected_total{reason}` label.
pub trait DecodeError: fmt::Display {
    /// Stable metric label, e.g. `corrupt`, `unknown_schema`, `oversized`.
    fn reason(&self) -> &'static str {
        "invalid"
    }
}

/// A blob the follower refused, as a value (for decode functions that want to build one
/// directly, e.g. in tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: &'static str,
    pub detail: String,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason, self.detail)
    }
}

impl DecodeError for Rejection {
    fn reason(&self) -> &'static str {
        self.reason
    }
}

/// What a decode function returns: the value and the content hash it verified (the hex
/// hash the codec's header carries), which the follower compares with `latest`'s.
#[derive(Debug)]
pub struct Verified<T> {
    pub value: T,
    pub hash: String,
}

/// Type-erased decode function shared by both follower implementations.
pub(crate) type DecodeFn<T> = Arc<dyn Fn(&[u8]) -> Result<Verified<T>, Rejection> + Send + Sync>;

pub(crate) fn erase_decode<T, E, D>(decode: D) -> DecodeFn<T>
where
    D: Fn(&[u8]) -> Result<Verified<T>, E> + Send + Sync + 'static,
    E: DecodeError,
{
    Arc::new(move |bytes| {
        decode(bytes).map_err(|e| Rejection {
            reason: e.reason(),
            detail: e.to_string(),
        })
    })
}

/// What a follower knows about its own health, for `/readyz` detail and debug pages.
#[derive(Clone, Debug, Default)]
pub struct FollowerStatus {
    /// A session with the store is established and its last operation succeeded.
    pub connected: bool,
    /// When `latest` was last read successfully.
    pub last_success: Option<Instant>,
    /// The last error (connection, fetch or rejected blob), cleared by the next success
    /// of the same kind.
    pub last_error: Option<String>,
    /// The snapshot being served.
    pub current: Option<SnapshotRef>,
    /// Blobs rejected since start.
    pub rejected: u64,
    /// Readiness ends when `latest` has not been read for this long (`None`: never).
    pub stale_after: Option<Duration>,
}

impl FollowerStatus {
    /// A replica is ready once it holds a snapshot, and stays ready while the store is
    /// unreachable — it keeps serving its last good snapshot, so a short outage must not
    /// flap readiness — until `latest` has not been read for `stale_after`: then the
    /// Service stops sending it *new* streams (those it has keep their configuration).
    pub fn is_ready(&self) -> bool {
        self.current.is_some() && !self.is_stale()
    }

    /// `latest` has not been read for longer than `stale_after`.
    pub fn is_stale(&self) -> bool {
        match (self.stale_after, self.since_last_success()) {
            (Some(bound), Some(since)) => since > bound,
            _ => false,
        }
    }

    /// Time since `latest` was last read successfully.
    pub fn since_last_success(&self) -> Option<Duration> {
        self.last_success.map(|at| at.elapsed())
    }

    /// One line for `/readyz`: what is served and whether the store is reachable.
    pub fn detail(&self) -> String {
        let serving = match &self.current {
            Some(r) => format!("serving snapshot {r}"),
            None => "no snapshot yet".to_owned(),
        };
        let link = if self.connected {
            "store connected".to_owned()
        } else {
            match self.since_last_success() {
                Some(d) => format!("store unreachable, last read {}s ago", d.as_secs()),
                None => "store unreachable".to_owned(),
            }
        };
        let link = match (self.is_stale(), self.stale_after) {
            (true, Some(bound)) => format!(
                "{link}; stale (not read for over {}s): not taking new streams",
                bound.as_secs()
            ),
            _ => link,
        };
        match &self.last_error {
            Some(e) => format!("{serving}; {link}; last error: {e}"),
            None => format!("{serving}; {link}"),
        }
    }
}

/// The consumer side of a follow loop; cheap to clone.
pub struct Follower<T> {
    snapshots: watch::Receiver<Option<Arc<Followed<T>>>>,
    status: watch::Receiver<FollowerStatus>,
}

// Manual impls: a derive would demand `T: Clone` / `T: Debug`, and snapshots are neither.
impl<T> Clone for Follower<T> {
    fn clone(&self) -> Self {
        Follower {
            snapshots: self.snapshots.clone(),
            status: self.status.clone(),
        }
    }
}

impl<T> fmt::Debug for Follower<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Follower")
            .field("status", &*self.status.borrow())
            .finish_non_exhaustive()
    }
}

impl<T> Follower<T> {
    pub(crate) fn new(
        snapshots: watch::Receiver<Option<Arc<Followed<T>>>>,
        status: watch::Receiver<FollowerStatus>,
    ) -> Self {
        Follower { snapshots, status }
    }

    /// A receiver that changes each time a new good snapshot is accepted.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Followed<T>>>> {
        self.snapshots.clone()
    }

    /// The snapshot being served, if any.
    pub fn current(&self) -> Option<Arc<Followed<T>>> {
        self.snapshots.borrow().clone()
    }

    /// Health of the follow loop.
    pub fn status(&self) -> FollowerStatus {
        self.status.borrow().clone()
    }

    /// Waits (up to `timeout`) until the served snapshot satisfies `pred`; returns it.
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut pred: impl FnMut(&Followed<T>) -> bool,
    ) -> Option<Arc<Followed<T>>> {
        let mut rx = self.snapshots.clone();
        let found = tokio::time::timeout(
            timeout,
            rx.wait_for(|s| s.as_deref().is_some_and(&mut pred)),
        )
        .await
        .ok()?
        .ok()?;
        found.clone()
    }
}

/// A long-lived bus task (follow loop, publisher watchdog). Aborted when dropped so a
/// failing test or an abandoned handle leaves nothing running; binaries hold it and
/// [`join`](BusTask::join) it with their other tasks.
#[derive(Debug)]
pub struct BusTask {
    name: &'static str,
    handle: Option<JoinHandle<()>>,
}

impl BusTask {
    pub(crate) fn spawn(
        name: &'static str,
        fut: impl Future<Output = ()> + Send + 'static,
    ) -> Self {
        BusTask {
            name,
            handle: Some(tokio::spawn(fut)),
        }
    }

    /// The task's name, for the supervisor's log line.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Waits for the task to end (it only ends by panic or abort: the loops run forever).
    pub async fn join(mut self) -> Result<(), tokio::task::JoinError> {
        match self.handle.take() {
            Some(h) => h.await,
            None => Ok(()),
        }
    }
}

impl Drop for BusTask {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.abort();
        }
    }
}

/// The epoch floor of a writer without a Lease (`--config-dir` mode, standalone): the
/// wall clock in milliseconds. A restarted writer takes an epoch above its predecessor's
/// even when the store lost its counter, as long as the clock does not go back.
pub fn wall_clock_epoch_floor() -> u64 {
    now_ms()
}

/// Asks whether this process still holds the right to publish (the Lease claim); the
/// Redis watchdog asks before every republish. `--config-dir` mode has no Lease: always.
pub type Claim = Arc<dyn Fn() -> bool + Send + Sync>;

/// Milliseconds since the Unix epoch (0 if the clock is before 1970).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_ends_when_latest_was_not_read_for_longer_than_the_bound() {
        let now = Instant::now();
        let Some(long_ago) = now.checked_sub(Duration::from_secs(20)) else {
            return; // a machine up for less than 20 s cannot express the case
        };
        let mut status = FollowerStatus {
            current: Some(SnapshotRef {
                version: 1,
                hash: "h".into(),
                epoch: 1,
                published_at_ms: 0,
            }),
            last_success: Some(long_ago),
            stale_after: None,
            ..FollowerStatus::default()
        };
        assert!(
            status.is_ready(),
            "no bound: ready while it holds a snapshot"
        );
        status.stale_after = Some(Duration::from_secs(10));
        assert!(status.is_stale() && !status.is_ready());
        assert!(
            status.detail().contains("not taking new streams"),
            "{}",
            status.detail()
        );
        status.last_success = Some(now);
        assert!(status.is_ready());
        status.current = None;
        assert!(!status.is_ready(), "nothing held: never ready");
    }
}
