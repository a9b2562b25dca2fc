//! The replica's side of the Redis bus: [`follow`] starts a loop that serves the newest
//! good snapshot from Redis and heals by itself.
//!
//! A session = one pub/sub connection (notifications) + one multiplexed connection
//! (reads). Per session: subscribe first, then read `latest` (so nothing published in
//! between is missed), then re-read `latest` on every notification and every
//! `resync_interval` (heals a lost message). A Redis error ends the session; the loop
//! reconnects with jittered exponential backoff and re-reads `latest` (heals a restart).
//! Meanwhile the last good snapshot stays served.
//!
//! What `latest` names is fetched only if it comes after what is served in `(epoch,
//! version)` order, in one atomic bounded read (an oversized blob never crosses the
//! network), and served only if it decodes, verifies and carries the content hash
//! `latest` names. A `latest` that cannot be parsed is not a session error: it is
//! reported and waited out (the publisher overwrites it), never retried in a loop. A
//! replica that holds nothing yet while `latest`'s blob is unusable (corrupt, missing, or
//! `latest` unreadable) serves the newest good retained blob instead.

use std::time::Duration;

use ::redis::AsyncCommands;
use ::redis::Script;
use ::redis::aio::MultiplexedConnection;
use futures::{FutureExt, StreamExt};

use super::publisher::redis_op;
use super::{Fetched, RedisConfig, fetch_bounded, parse_latest, parse_ref, scripts};
use crate::bus::decision::{Decision, KeepReason, Observation};
use crate::bus::follow::{FollowCore, Offered};
use crate::bus::{
    BusError, BusTask, DecodeError, Follower, Rejection, SnapshotRef, Verified, erase_decode,
    metrics,
};
use crate::retry::{Backoff, Retry};

/// Starts following Redis. The returned [`Follower`] serves nothing until the first good
/// snapshot is read; the [`BusTask`] runs until aborted (or dropped). `decode` returns the
/// value and the content hash it verified.
pub fn follow<T, E, D>(config: RedisConfig, decode: D) -> Result<(Follower<T>, BusTask), BusError>
where
    T: Send + Sync + 'static,
    E: DecodeError,
    D: Fn(&[u8]) -> Result<Verified<T>, E> + Send + Sync + 'static,
{
    let client = config.client()?;
    let (core, follower) = FollowCore::new("redis", erase_decode(decode), config.stale_after);
    let mut lp = FollowLoop {
        config,
        client,
        core,
        fetch: Script::new(scripts::FETCH_BOUNDED),
        fallback_tried: None,
        malformed_reported: false,
    };
    let task = BusTask::spawn("redis-follower", async move { lp.run().await });
    Ok((follower, task))
}

struct FollowLoop<T> {
    config: RedisConfig,
    client: ::redis::Client,
    core: FollowCore<T>,
    fetch: Script,
    /// The `latest` (as text) a fallback was last tried for: tried once per `latest`, not
    /// on every re-read.
    fallback_tried: Option<String>,
    /// A malformed `latest` was logged (once until it is readable again).
    malformed_reported: bool,
}

impl<T: Send + Sync + 'static> FollowLoop<T> {
    async fn run(&mut self) {
        metrics::LAST_READ.follower_started();
        tracing::info!(redis = %self.config, "following snapshots from Redis");
        let mut retry = Retry::new(Backoff::new(
            self.config.backoff_base,
            self.config.backoff_max,
        ));
        loop {
            let error = self.session(&mut retry).await;
            metrics::REDIS_CONNECTED.set(0);
            self.core.record_error(false, error.to_string());
            let attempt = retry.attempt();
            let delay = retry.next_delay();
            // First failure loud, then one line every 10 attempts: an outage of minutes
            // must not flood the log.
            if attempt.is_multiple_of(10) {
                tracing::warn!(error = %error, attempt, retry_in = ?delay, "Redis session lost; serving the last good snapshot and reconnecting");
            } else {
                tracing::debug!(error = %error, attempt, retry_in = ?delay, "Redis still unreachable");
            }
            tokio::time::sleep(delay).await;
        }
    }

    /// One session; returns why it ended. Resets `retry` once it has read `latest`.
    async fn session(&mut self, retry: &mut Retry) -> BusError {
        match self.session_inner(retry).await {
            Ok(never) => match never {},
            Err(e) => e,
        }
    }

    async fn session_inner(
        &mut self,
        retry: &mut Retry,
    ) -> Result<std::convert::Infallible, BusError> {
        let connect = self.config.connect_timeout;
        let mut pubsub = timed("subscribe", connect, self.client.get_async_pubsub()).await?;
        let keys = self.config.keys();
        // Subscribe before the first read of `latest`, so a version published in between
        // is announced on this subscription rather than lost.
        timed(
            "subscribe",
            self.config.response_timeout,
            pubsub.subscribe(&keys.channel),
        )
        .await?;
        let conn_config = ::redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(self.config.response_timeout));
        let mut conn = timed(
            "connect",
            connect,
            self.client
                .get_multiplexed_async_connection_with_config(&conn_config),
        )
        .await?;
        self.sync(&mut conn).await?;
        metrics::REDIS_CONNECTED.set(1);
        retry.reset();

        let mut messages = pubsub.into_on_message();
        let mut resync = tokio::time::interval(self.config.resync_interval);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resync.tick().await; // the first tick is immediate; we just synced
        loop {
            tokio::select! {
                message = messages.next() => {
                    if message.is_none() {
                        metrics::REDIS_ERRORS.with_label_values(&["subscribe"]).inc();
                        return Err(BusError::Disconnected);
                    }
                    // Coalesce a burst: `latest` is the truth, one read covers them all.
                    while let Some(Some(_)) = messages.next().now_or_never() {}
                }
                _ = resync.tick() => {}
            }
            self.sync(&mut conn).await?;
        }
    }

    /// Reads `latest` and, when the decision says so, fetches and offers its blob; falls
    /// back to a retained blob when nothing is served and `latest` is unusable.
    async fn sync(&mut self, conn: &mut MultiplexedConnection) -> Result<(), BusError> {
        let keys = self.config.keys();
        let fields: Vec<(String, String)> =
            redis_op("read_latest", conn.hgetall(&keys.latest)).await?;
        self.core.record_read_success();
        metrics::LAST_READ.record_success();
        let parsed = parse_latest(&fields);
        let (observation, seen) = match &parsed {
            Ok(None) => (Observation::Missing, "missing".to_owned()),
            Ok(Some(latest)) => (Observation::Present { latest }, latest.to_string()),
            Err(e) => {
                self.report_malformed(e);
                (Observation::Malformed, format!("malformed: {fields:?}"))
            }
        };
        if parsed.is_ok() {
            self.malformed_reported = false;
        }
        let decision = self.core.observe(observation);
        let usable = match (decision, parsed) {
            (Decision::Fetch, Ok(Some(latest))) => self.fetch_and_offer(conn, latest).await?,
            (Decision::Keep(KeepReason::UpToDate | KeepReason::Stale), _) => true,
            _ => false,
        };
        if !usable && self.core.holds_nothing() && self.fallback_tried.as_ref() != Some(&seen) {
            self.fallback_tried = Some(seen);
            self.fall_back(conn).await?;
        }
        Ok(())
    }

    fn report_malformed(&mut self, error: &BusError) {
        metrics::REJECTED
            .with_label_values(&["malformed_latest"])
            .inc();
        let text = format!("{error}; waiting for a publisher to overwrite it");
        if !self.malformed_reported {
            self.malformed_reported = true;
            tracing::error!(error = %error, "`latest` in Redis cannot be read; keeping the served snapshot until a publisher overwrites it");
        }
        self.core.record_error(true, text);
    }

    /// Fetches the blob `latest` names (bounded) and offers it. Returns whether it is now
    /// served.
    async fn fetch_and_offer(
        &mut self,
        conn: &mut MultiplexedConnection,
        latest: SnapshotRef,
    ) -> Result<bool, BusError> {
        let key = self.config.keys().snapshot(latest.version);
        let limit = self.config.max_blob_bytes;
        match fetch_bounded(&self.fetch, conn, &key, limit).await? {
            Fetched::Blob(bytes) => {
                Ok(self.core.offer(latest, bytes, false).await == Offered::Accepted)
            }
            Fetched::TooLarge(size) => {
                self.core.reject(
                    latest,
                    Rejection {
                        reason: "oversized",
                        detail: format!("{size} bytes, limit {limit}"),
                    },
                );
                Ok(false)
            }
            // `latest` is only advanced after its blob is written, so a missing blob means
            // it expired (this follower fell far behind) or was removed by hand: not
            // coming back. The next version will be tried.
            Fetched::Missing => {
                self.core.reject(
                    latest,
                    Rejection {
                        reason: "missing",
                        detail: format!("{key} does not exist"),
                    },
                );
                Ok(false)
            }
        }
    }

    /// Serves the newest retained blob that decodes and verifies, if any comes after what
    /// is served (a replica starting while `latest` is unusable).
    async fn fall_back(&mut self, conn: &mut MultiplexedConnection) -> Result<(), BusError> {
        let keys = self.config.keys();
        let versions: Vec<u64> = redis_op(
            "fallback",
            conn.zrevrange(&keys.index, 0, self.config.retention as isize),
        )
        .await?;
        if versions.is_empty() {
            return Ok(());
        }
        let entries: Vec<Option<String>> = redis_op(
            "fallback",
            ::redis::cmd("HMGET")
                .arg(&keys.refs)
                .arg(&versions)
                .query_async(conn),
        )
        .await?;
        let limit = self.config.max_blob_bytes;
        for (version, entry) in versions.into_iter().zip(entries) {
            let Some(reference) = entry.and_then(|e| parse_ref(version, &e)) else {
                continue;
            };
            if !self.core.state().may_serve(&reference) {
                continue;
            }
            let key = keys.snapshot(version);
            if let Fetched::Blob(bytes) = fetch_bounded(&self.fetch, conn, &key, limit).await?
                && self.core.offer(reference, bytes, true).await == Offered::Accepted
            {
                return Ok(());
            }
        }
        tracing::warn!("no retained snapshot is usable either; waiting for the next publish");
        Ok(())
    }
}

/// Runs a Redis operation that has no timeout of its own, bounded by `after`.
async fn timed<T>(
    operation: &'static str,
    after: Duration,
    fut: impl Future<Output = ::redis::RedisResult<T>>,
) -> Result<T, BusError> {
    match tokio::time::timeout(after, redis_op(operation, fut)).await {
        Ok(result) => result,
        Err(_) => {
            metrics::REDIS_ERRORS.with_label_values(&[operation]).inc();
            Err(BusError::Timeout { operation, after })
        }
    }
}
