//! The controller's side of the Redis bus: [`RedisPublisher`] implements
//! [`SnapshotPublisher`] (take an epoch, publish fenced and versioned, resign, read back
//! what is published) and runs a watchdog ([`RedisPublisher::spawn_watchdog`]) that
//! republishes the current snapshot by itself when Redis lost it or holds what a lower
//! epoch wrote — but only while its process still holds the claim.
//!
//! One publish: read `latest` and the epoch counter → fenced or unchanged? stop → allocate
//! a version (re-seeding the counter above what this process handed out) → SET the blob
//! with a TTL → the ADVANCE script moves `latest` atomically, persists the blob, applies
//! retention and notifies. A `latest` that cannot be parsed is treated as absent and
//! overwritten (the script agrees), so it never wedges publishing. All publishes and
//! watchdog rounds of one publisher are serialized by one lock, which owns the publish
//! state; the epoch lives beside it so [`resign`](SnapshotPublisher::resign) takes effect
//! at once even while a publish is under way.

use std::sync::{Arc, Mutex as SyncMutex, MutexGuard};
use std::time::{Duration, Instant};

use ::redis::Script;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::Mutex;

use super::{Keys, RedisConfig, parse_latest, scripts};
use crate::bus::decision::{check_advance, needs_republish};
use crate::bus::memory::outcome_label;
use crate::bus::{
    BusError, BusTask, Claim, EncodedSnapshot, EpochGrant, PublishOutcome, SnapshotPublisher,
    SnapshotRef, metrics, now_ms,
};

/// A blob written but not yet made `latest` expires after this, so one left behind by a
/// publisher that died between the two steps does not stay forever.
const PENDING_TTL: Duration = Duration::from_secs(300);

/// After a failed watchdog round, the next one comes this soon (then backs off to the
/// interval): when Redis returns, the first round often fails on the connection that
/// died with the old server, and the republish must not wait a whole interval for that.
const WATCHDOG_RETRY: Duration = Duration::from_millis(200);

/// Publishes snapshots to Redis. Cheap to clone (clones share one connection and state).
#[derive(Clone)]
pub struct RedisPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    keys: Keys,
    conn: ConnectionManager,
    take_epoch: Script,
    restore_epoch: Script,
    allocate: Script,
    advance: Script,
    fetch: Script,
    /// Our epoch; `None` before `take_epoch` and after `resign`. Apart from the publish
    /// state so that resigning never waits for a publish in flight.
    epoch: SyncMutex<Option<u64>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// What `latest` was when we last published or confirmed it (unchanged).
    last: Option<SnapshotRef>,
    /// The snapshot we stand behind, republished by the watchdog when Redis lost it.
    current: Option<EncodedSnapshot>,
    /// Highest version this process ever allocated: the floor for re-seeding.
    highest_version: u64,
    /// A publish was fenced: a newer leader exists, so the watchdog must not republish.
    /// Cleared by `take_epoch`.
    fenced: bool,
}

impl std::fmt::Debug for RedisPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPublisher")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &SyncMutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RedisPublisher {
    /// Creates the publisher. The connection is made lazily and re-made after errors by
    /// the connection manager, so the controller can start before Redis is reachable.
    pub fn new(config: RedisConfig) -> Result<Self, BusError> {
        let client = config.client()?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            .set_number_of_retries(2)
            .set_max_delay(config.backoff_max);
        let conn =
            ConnectionManager::new_lazy_with_config(client, manager_config).map_err(|source| {
                BusError::Redis {
                    operation: "connect",
                    source,
                }
            })?;
        Ok(RedisPublisher {
            inner: Arc::new(Inner {
                keys: config.keys(),
                config,
                conn,
                take_epoch: Script::new(scripts::TAKE_EPOCH),
                restore_epoch: Script::new(scripts::RESTORE_EPOCH),
                allocate: Script::new(scripts::ALLOCATE),
                advance: Script::new(scripts::ADVANCE),
                fetch: Script::new(scripts::FETCH_BOUNDED),
                epoch: SyncMutex::new(None),
                state: Mutex::new(State::default()),
            }),
        })
    }

    /// The snapshot `latest` points at, as read from Redis (an unreadable `latest` is an
    /// error).
    pub async fn latest(&self) -> Result<Option<SnapshotRef>, BusError> {
        let (latest, _) = self.inner.read_latest().await?;
        latest.map_err(BusError::MalformedLatest)
    }

    /// One watchdog round: if this process still holds the claim and Redis no longer holds
    /// what we last published (or holds what a lower epoch wrote), put our epoch back
    /// into the counter and publish the current snapshot again. `Ok(None)`: nothing to do.
    pub async fn check_store(&self, claim: &Claim) -> Result<Option<PublishOutcome>, BusError> {
        let mut state = self.inner.state.lock().await;
        let epoch = *lock(&self.inner.epoch);
        let (Some(epoch), Some(current), false) = (epoch, state.current.clone(), state.fenced)
        else {
            return Ok(None);
        };
        if !claim() {
            return Ok(None);
        }
        let (latest, _) = self.inner.read_latest().await?;
        let malformed = latest.is_err();
        let latest = latest.ok().flatten();
        if !needs_republish(latest.as_ref(), state.last.as_ref(), malformed) {
            return Ok(None);
        }
        // Asked again right before writing: the read above may have taken a while.
        if !claim() {
            return Ok(None);
        }
        tracing::warn!(
            last_published = %state.last.as_ref().map(ToString::to_string).unwrap_or_default(),
            found = %latest.as_ref().map(ToString::to_string).unwrap_or_else(|| if malformed { "an unreadable latest".into() } else { "nothing".into() }),
            "Redis lost the published snapshot or holds an older writer's (restarted empty, failed over to a lagging replica, or a deposed writer wrote); republishing"
        );
        let _: u64 = redis_op(
            "restore_epoch",
            self.inner
                .restore_epoch
                .key(&self.inner.keys.epoch)
                .arg(epoch)
                .invoke_async(&mut self.inner.conn()),
        )
        .await?;
        let started = Instant::now();
        let result = self.inner.publish_locked(&mut state, epoch, current).await;
        record_publish(started, &result);
        result.map(Some)
    }

    /// Runs [`check_store`](Self::check_store) every `watchdog_interval`, sooner after a
    /// failure, forever. `claim` says whether this process may still publish.
    pub fn spawn_watchdog(&self, claim: Claim) -> BusTask {
        let publisher = self.clone();
        BusTask::spawn("redis-publisher-watchdog", async move {
            let interval = publisher.inner.config.watchdog_interval;
            let mut failures: u32 = 0;
            loop {
                let delay = if failures == 0 {
                    interval
                } else {
                    WATCHDOG_RETRY.min(interval)
                };
                tokio::time::sleep(delay).await;
                let round = tokio::time::timeout(
                    publisher.inner.config.response_timeout,
                    publisher.check_store(&claim),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(BusError::Timeout {
                        operation: "watchdog",
                        after: publisher.inner.config.response_timeout,
                    })
                });
                match round {
                    Ok(outcome) => {
                        if let Some(outcome) = outcome {
                            tracing::info!(?outcome, "republished after a Redis reset");
                        }
                        failures = 0;
                    }
                    // First failure loud, then one line in 30: an outage must not flood the log.
                    Err(e) if failures.is_multiple_of(30) => {
                        failures += 1;
                        tracing::warn!(error = %e, "checking Redis for the published snapshot failed; will retry");
                    }
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        tracing::debug!(error = %e, "Redis still unreachable for the publisher");
                    }
                }
            }
        })
    }
}

impl Inner {
    fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Reads `latest` (`Err(text)` when it cannot be parsed) and the epoch counter in one
    /// round trip.
    async fn read_latest(&self) -> Result<(Result<Option<SnapshotRef>, String>, u64), BusError> {
        let (fields, epoch_counter): (Vec<(String, String)>, Option<u64>) = redis_op(
            "read_latest",
            ::redis::pipe()
                .hgetall(&self.keys.latest)
                .get(&self.keys.epoch)
                .query_async(&mut self.conn()),
        )
        .await?;
        let latest = parse_latest(&fields).map_err(|e| match e {
            BusError::MalformedLatest(why) => why,
            other => other.to_string(),
        });
        Ok((latest, epoch_counter.unwrap_or(0)))
    }

    /// The snapshot `latest` points at and its blob, if both are there and the blob is
    /// within `max_blob_bytes`.
    async fn fetch_latest(&self) -> Result<Option<(SnapshotRef, bytes::Bytes)>, BusError> {
        let (latest, _) = self.read_latest().await?;
        let Some(latest) = latest.map_err(BusError::MalformedLatest)? else {
            return Ok(None);
        };
        let blob = super::fetch_bounded(
            &self.fetch,
            &mut self.conn(),
            &self.keys.snapshot(latest.version),
            self.config.max_blob_bytes,
        )
        .await?;
        Ok(match blob {
            super::Fetched::Blob(bytes) => Some((latest, bytes)),
            super::Fetched::Missing | super::Fetched::TooLarge(_) => None,
        })
    }

    async fn take_epoch(&self, floor: u64) -> Result<EpochGrant, BusError> {
        // The publish state's lock: no publish of ours runs while the epoch changes.
        let mut state = self.state.lock().await;
        let (outcome, value): (String, u64) = redis_op(
            "take_epoch",
            self.take_epoch
                .key(&self.keys.epoch)
                .key(&self.keys.latest)
                .arg(floor)
                .invoke_async(&mut self.conn()),
        )
        .await?;
        match outcome.as_str() {
            "taken" => {
                state.fenced = false;
                *lock(&self.epoch) = Some(value);
                tracing::info!(epoch = value, prefix = %self.config.prefix, "took a new publishing epoch");
                Ok(EpochGrant::Taken(value))
            }
            "superseded" => {
                tracing::warn!(floor, newer = value, prefix = %self.config.prefix, "epoch refused: Redis knows a newer one");
                Ok(EpochGrant::Superseded { newer: value })
            }
            other => Err(BusError::Script(format!("take_epoch replied {other:?}"))),
        }
    }

    async fn publish_locked(
        &self,
        state: &mut State,
        epoch: u64,
        snapshot: EncodedSnapshot,
    ) -> Result<PublishOutcome, BusError> {
        let size = snapshot.bytes.len() as u64;
        if size > self.config.max_blob_bytes {
            return Err(BusError::BlobTooLarge {
                size,
                limit: self.config.max_blob_bytes,
            });
        }
        let (latest, epoch_counter) = self.read_latest().await?;
        let latest = match latest {
            Ok(latest) => latest,
            Err(e) => {
                tracing::warn!(error = %e, "`latest` in Redis cannot be read; overwriting it");
                None
            }
        };
        if let Some(l) = latest.as_ref().filter(|l| l.hash == snapshot.hash) {
            // Same content: nothing to write, but a deposed publisher must still learn
            // that it is deposed (same rule as the script). Written under a lower epoch
            // (a deposed writer after a reset), it is written again under ours.
            if !check_advance(Some(l), epoch_counter, l.version + 1, epoch) {
                state.fenced = true;
                return Ok(fenced(latest));
            }
            if l.epoch == epoch {
                state.last = Some(l.clone());
                state.current = Some(snapshot);
                return Ok(PublishOutcome::Unchanged(l.clone()));
            }
        }
        // Fencing is decided by the ADVANCE script alone (atomically, against what Redis
        // holds at that instant); a deposed publisher uploads one blob, which the script
        // deletes, and learns it is deposed.
        let floor = latest
            .as_ref()
            .map_or(0, |l| l.version)
            .max(state.last.as_ref().map_or(0, |l| l.version))
            .max(state.highest_version);
        let version: u64 = redis_op(
            "allocate_version",
            self.allocate
                .key(&self.keys.version)
                .arg(floor)
                .invoke_async(&mut self.conn()),
        )
        .await?;
        state.highest_version = state.highest_version.max(version);
        let blob_key = self.keys.snapshot(version);
        let _: () = redis_op(
            "write_blob",
            ::redis::cmd("SET")
                .arg(&blob_key)
                .arg(snapshot.bytes.as_ref())
                .arg("PX")
                .arg(u64::try_from(PENDING_TTL.as_millis()).unwrap_or(u64::MAX))
                .query_async(&mut self.conn()),
        )
        .await?;
        let reference = SnapshotRef {
            version,
            hash: snapshot.hash.clone(),
            epoch,
            published_at_ms: now_ms(),
        };
        let reply: Vec<String> = redis_op(
            "advance_latest",
            self.advance
                .key(&self.keys.latest)
                .key(&self.keys.epoch)
                .key(&blob_key)
                .key(&self.keys.index)
                .key(&self.keys.superseded)
                .key(&self.keys.refs)
                .arg(version)
                .arg(&reference.hash)
                .arg(epoch)
                .arg(reference.published_at_ms)
                .arg(self.config.retention)
                .arg(
                    u64::try_from(self.config.superseded_ttl.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(1),
                )
                .arg(&self.keys.snapshot_prefix)
                .arg(&self.keys.channel)
                .arg(self.config.superseded_max)
                .invoke_async(&mut self.conn()),
        )
        .await?;
        match reply.first().map(String::as_str) {
            Some("ok") => {
                metrics::SNAPSHOT_VERSION
                    .with_label_values(&["publisher"])
                    .set(i64::try_from(version).unwrap_or(i64::MAX));
                metrics::BLOB_BYTES
                    .with_label_values(&["publisher"])
                    .set(i64::try_from(size).unwrap_or(i64::MAX));
                tracing::info!(%reference, bytes = size, "published snapshot");
                state.last = Some(reference.clone());
                state.current = Some(snapshot);
                Ok(PublishOutcome::Published(reference))
            }
            Some("fenced") => {
                let current = parse_fenced_reply(&reply[1..]);
                state.fenced = true;
                Ok(fenced(current))
            }
            Some("missing") => Err(BusError::BlobMissing(reference)),
            _ => Err(BusError::Script(format!("{reply:?}"))),
        }
    }
}

fn fenced(current: Option<SnapshotRef>) -> PublishOutcome {
    tracing::warn!(
        current = %current.as_ref().map(ToString::to_string).unwrap_or_else(|| "none".into()),
        "publish refused: a publisher with a newer epoch owns this prefix; this one is deposed"
    );
    PublishOutcome::Fenced { current }
}

/// `{version, hash, epoch, published_at_ms}` as returned by the script when it refused
/// (`None` when `latest` is missing or unreadable).
fn parse_fenced_reply(fields: &[String]) -> Option<SnapshotRef> {
    if fields.first().is_none_or(|v| v.is_empty()) {
        return None;
    }
    let names = ["version", "hash", "epoch", "published_at_ms"];
    let pairs: Vec<(String, String)> = names
        .iter()
        .zip(fields)
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    parse_latest(&pairs).ok().flatten()
}

fn record_publish(started: Instant, result: &Result<PublishOutcome, BusError>) {
    metrics::PUBLISH_DURATION.observe(started.elapsed().as_secs_f64());
    metrics::PUBLISHES
        .with_label_values(&[outcome_label(result)])
        .inc();
}

/// Runs one Redis operation, counting its failure under `operation`.
pub(super) async fn redis_op<T>(
    operation: &'static str,
    fut: impl Future<Output = ::redis::RedisResult<T>>,
) -> Result<T, BusError> {
    fut.await.map_err(|source| {
        metrics::REDIS_ERRORS.with_label_values(&[operation]).inc();
        BusError::Redis { operation, source }
    })
}

impl SnapshotPublisher for RedisPublisher {
    fn take_epoch(&self, floor: u64) -> BoxFuture<'_, Result<EpochGrant, BusError>> {
        self.inner.take_epoch(floor).boxed()
    }

    fn fetch_latest(&self) -> BoxFuture<'_, Result<Option<(SnapshotRef, bytes::Bytes)>, BusError>> {
        self.inner.fetch_latest().boxed()
    }

    /// Stops publishing (lost the Lease), at once: the watchdog no longer republishes and
    /// `publish` fails with [`BusError::NoEpoch`] until a new epoch is taken.
    fn resign(&self) -> BoxFuture<'_, ()> {
        *lock(&self.inner.epoch) = None;
        futures::future::ready(()).boxed()
    }

    fn publish(
        &self,
        snapshot: EncodedSnapshot,
    ) -> BoxFuture<'_, Result<PublishOutcome, BusError>> {
        async move {
            let started = Instant::now();
            let mut state = self.inner.state.lock().await;
            let epoch = *lock(&self.inner.epoch);
            let result = match epoch {
                Some(epoch) => self.inner.publish_locked(&mut state, epoch, snapshot).await,
                None => Err(BusError::NoEpoch),
            };
            record_publish(started, &result);
            result
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn fenced_reply_carries_the_current_latest_or_nothing() {
        let current = parse_fenced_reply(&strings(&["9", "abc", "4", "1700"])).unwrap();
        assert_eq!(
            (
                current.version,
                current.hash.as_str(),
                current.epoch,
                current.published_at_ms
            ),
            (9, "abc", 4, 1700)
        );
        assert_eq!(parse_fenced_reply(&strings(&["", "", "", ""])), None);
        assert_eq!(parse_fenced_reply(&[]), None);
        assert_eq!(parse_fenced_reply(&strings(&["x", "abc", "4", ""])), None);
    }
}
