//! The controller's side of the Redis bus: [`RedisPublisher`] implements
//! [`SnapshotPublisher`] (take an epoch, publish fenced and versioned, resign, read back
//! what is published) and runs a watchdog ([`RedisPublisher::spawn_watchdog`]) that
//! republishes the current snapshot by itself when Redis lost it (restarted empty, or
//! failed over to a lagging replica).
//!
//! One publish: read `latest` and the epoch counter → fenced or unchanged? stop → allocate
//! a version (re-seeding the counters above what this process handed out) → SET the blob
//! with a TTL → the ADVANCE script moves `latest` atomically, persists the blob, applies
//! retention and notifies. All publishes and watchdog rounds of one publisher are
//! serialized by one lock, which owns the publisher's state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::Script;
use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::Mutex;

use super::{RedisConfig, parse_latest, scripts};
use crate::bus::decision::{check_advance, needs_republish};
use crate::bus::memory::outcome_label;
use crate::bus::{
    BusError, BusTask, EncodedSnapshot, PublishOutcome, SnapshotPublisher, SnapshotRef, metrics,
    now_ms,
};

/// A blob written but not yet made `latest` expires after this, so one left behind by a
/// publisher that died between the two steps does not stay forever.
const PENDING_TTL: Duration = Duration::from_secs(300);

/// Publishes snapshots to Redis. Cheap to clone (clones share one connection and state).
#[derive(Clone)]
pub struct RedisPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    config: RedisConfig,
    keys: super::Keys,
    conn: ConnectionManager,
    take_epoch: Script,
    allocate: Script,
    advance: Script,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Our leadership epoch; `None` before `take_epoch` and after `resign`.
    epoch: Option<u64>,
    /// What `latest` was when we last published or confirmed it (unchanged).
    last: Option<SnapshotRef>,
    /// The snapshot we stand behind, republished by the watchdog when Redis lost it.
    current: Option<EncodedSnapshot>,
    /// Highest version this process ever allocated: the floor for re-seeding.
    highest_version: u64,
    /// Highest epoch this process ever took (kept across `resign`).
    highest_epoch: u64,
    /// A publish was fenced: a newer leader exists, so the watchdog must not republish
    /// (after a Redis reset it could otherwise overwrite the new leader). Cleared by
    /// `take_epoch`.
    fenced: bool,
}

impl std::fmt::Debug for RedisPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPublisher")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
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
                allocate: Script::new(scripts::ALLOCATE),
                advance: Script::new(scripts::ADVANCE),
                state: Mutex::new(State::default()),
            }),
        })
    }

    /// The snapshot `latest` points at, as read from Redis.
    pub async fn latest(&self) -> Result<Option<SnapshotRef>, BusError> {
        self.inner.read_latest().await.map(|(latest, _)| latest)
    }

    /// One watchdog round: if Redis no longer holds what we last published, re-seed the
    /// counters and publish the current snapshot again. `Ok(None)`: nothing to do.
    pub async fn check_store(&self) -> Result<Option<PublishOutcome>, BusError> {
        let mut state = self.inner.state.lock().await;
        let (Some(_), Some(current), false) = (state.epoch, state.current.clone(), state.fenced)
        else {
            return Ok(None);
        };
        let (latest, _) = self.inner.read_latest().await?;
        if !needs_republish(latest.as_ref(), state.last.as_ref()) {
            return Ok(None);
        }
        tracing::warn!(
            last_published = %state.last.as_ref().map(ToString::to_string).unwrap_or_default(),
            found = %latest.as_ref().map(ToString::to_string).unwrap_or_else(|| "nothing".into()),
            "Redis lost the published snapshot (restarted empty or failed over to a lagging replica); republishing"
        );
        let started = Instant::now();
        let result = self.inner.publish_locked(&mut state, current).await;
        record_publish(started, &result);
        result.map(Some)
    }

    /// Runs [`check_store`](Self::check_store) every `resync_interval`, forever.
    pub fn spawn_watchdog(&self) -> BusTask {
        let publisher = self.clone();
        BusTask::spawn("redis-publisher-watchdog", async move {
            let mut every = tokio::time::interval(publisher.inner.config.resync_interval);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failures: u32 = 0;
            loop {
                every.tick().await;
                match publisher.check_store().await {
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

    /// Reads `latest` and the epoch counter in one round trip.
    async fn read_latest(&self) -> Result<(Option<SnapshotRef>, u64), BusError> {
        let (fields, epoch_counter): (Vec<(String, String)>, Option<u64>) = redis_op(
            "read_latest",
            ::redis::pipe()
                .hgetall(&self.keys.latest)
                .get(&self.keys.epoch)
                .query_async(&mut self.conn()),
        )
        .await?;
        Ok((parse_latest(&fields)?, epoch_counter.unwrap_or(0)))
    }

    /// The snapshot `latest` points at and its blob, if both are there and the blob is
    /// within `max_blob_bytes`.
    async fn fetch_latest(&self) -> Result<Option<(SnapshotRef, bytes::Bytes)>, BusError> {
        use ::redis::AsyncCommands;
        let (latest, _) = self.read_latest().await?;
        let Some(latest) = latest else {
            return Ok(None);
        };
        let key = self.keys.snapshot(latest.version);
        let mut conn = self.conn();
        let size: u64 = redis_op("fetch_blob", conn.strlen(&key)).await?;
        if size == 0 || size > self.config.max_blob_bytes {
            return Ok(None);
        }
        let blob: Option<Vec<u8>> = redis_op("fetch_blob", conn.get(&key)).await?;
        Ok(blob
            .filter(|b| !b.is_empty())
            .map(|b| (latest, bytes::Bytes::from(b))))
    }

    async fn take_epoch(&self) -> Result<u64, BusError> {
        let mut state = self.state.lock().await;
        let epoch: u64 = redis_op(
            "take_epoch",
            self.take_epoch
                .key(&self.keys.epoch)
                .key(&self.keys.latest)
                .arg(state.highest_epoch)
                .invoke_async(&mut self.conn()),
        )
        .await?;
        state.highest_epoch = state.highest_epoch.max(epoch);
        state.fenced = false;
        tracing::info!(epoch, prefix = %self.config.prefix, "took a new publishing epoch");
        state.epoch = Some(epoch);
        Ok(epoch)
    }

    async fn publish_locked(
        &self,
        state: &mut State,
        snapshot: EncodedSnapshot,
    ) -> Result<PublishOutcome, BusError> {
        let epoch = state.epoch.ok_or(BusError::NoEpoch)?;
        let (latest, epoch_counter) = self.read_latest().await?;
        if let Some(l) = latest.as_ref().filter(|l| l.hash == snapshot.hash) {
            // Same content: nothing to write, but a deposed publisher must still learn
            // that it is deposed (same rule as the script).
            if !check_advance(Some(l), epoch_counter, l.version + 1, epoch) {
                state.fenced = true;
                return Ok(self.fenced(latest));
            }
            state.last = Some(l.clone());
            state.current = Some(snapshot);
            return Ok(PublishOutcome::Unchanged(l.clone()));
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
                .key(&self.keys.epoch)
                .arg(floor)
                .arg(epoch)
                .invoke_async(&mut self.conn()),
        )
        .await?;
        state.highest_version = state.highest_version.max(version);
        let blob_key = self.keys.snapshot(version);
        let size = snapshot.bytes.len();
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
                let current = parse_fenced_reply(&reply[1..])?;
                state.fenced = true;
                Ok(self.fenced(current))
            }
            Some("missing") => Err(BusError::BlobMissing(reference)),
            _ => Err(BusError::Script(format!("{reply:?}"))),
        }
    }

    fn fenced(&self, current: Option<SnapshotRef>) -> PublishOutcome {
        tracing::warn!(
            current = %current.as_ref().map(ToString::to_string).unwrap_or_else(|| "none".into()),
            "publish refused: a publisher with a newer epoch owns this prefix; this one is deposed"
        );
        PublishOutcome::Fenced { current }
    }
}

/// `{version, hash, epoch, published_at_ms}` as returned by the script when it refused.
fn parse_fenced_reply(fields: &[String]) -> Result<Option<SnapshotRef>, BusError> {
    if fields.first().is_none_or(|v| v.is_empty()) {
        return Ok(None);
    }
    let names = ["version", "hash", "epoch", "published_at_ms"];
    let pairs: Vec<(String, String)> = names
        .iter()
        .zip(fields)
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    parse_latest(&pairs)
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
    fn take_epoch(&self) -> BoxFuture<'_, Result<u64, BusError>> {
        self.inner.take_epoch().boxed()
    }

    fn fetch_latest(&self) -> BoxFuture<'_, Result<Option<(SnapshotRef, bytes::Bytes)>, BusError>> {
        self.inner.fetch_latest().boxed()
    }

    /// Stops publishing (lost the Lease): the watchdog no longer republishes and
    /// `publish` fails with [`BusError::NoEpoch`] until a new epoch is taken.
    fn resign(&self) -> BoxFuture<'_, ()> {
        async move {
            self.inner.state.lock().await.epoch = None;
        }
        .boxed()
    }

    fn publish(
        &self,
        snapshot: EncodedSnapshot,
    ) -> BoxFuture<'_, Result<PublishOutcome, BusError>> {
        async move {
            let started = Instant::now();
            let mut state = self.inner.state.lock().await;
            let result = self.inner.publish_locked(&mut state, snapshot).await;
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
        let current = parse_fenced_reply(&strings(&["9", "abc", "4", "1700"]))
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                current.version,
                current.hash.as_str(),
                current.epoch,
                current.published_at_ms
            ),
            (9, "abc", 4, 1700)
        );
        assert_eq!(
            parse_fenced_reply(&strings(&["", "", "", ""])).unwrap(),
            None
        );
        assert_eq!(parse_fenced_reply(&[]).unwrap(), None);
        assert!(parse_fenced_reply(&strings(&["x", "abc", "4", ""])).is_err());
    }
}
