//! The replica's side of the Redis bus: [`follow`] starts a loop that serves the newest
//! good snapshot from Redis and heals by itself.
//!
//! A session = one pub/sub connection (notifications) + one multiplexed connection
//! (reads). Per session: subscribe first, then read `latest` (so nothing published in
//! between is missed), then re-read `latest` on every notification and every
//! `resync_interval` (heals a lost message). Any Redis error ends the session; the loop
//! reconnects with jittered exponential backoff and re-reads `latest` (heals a restart).
//! Meanwhile the last good snapshot stays served. The store's `run_id` is read per
//! session, so a version regression after a restart or failover is recognised as a reset.

use std::time::Duration;

use ::redis::AsyncCommands;
use ::redis::aio::MultiplexedConnection;
use bytes::Bytes;
use futures::{FutureExt, StreamExt};

use super::publisher::redis_op;
use super::{RedisConfig, parse_latest, parse_run_id};
use crate::bus::decision::{Decision, Observation};
use crate::bus::follow::FollowCore;
use crate::bus::{BusError, BusTask, DecodeError, Follower, Rejection, erase_decode, metrics};
use crate::retry::{Backoff, Retry};

/// Starts following Redis. The returned [`Follower`] serves nothing until the first good
/// snapshot is read; the [`BusTask`] runs until aborted (or dropped).
pub fn follow<T, E, D>(config: RedisConfig, decode: D) -> Result<(Follower<T>, BusTask), BusError>
where
    T: Send + Sync + 'static,
    E: DecodeError,
    D: Fn(&[u8]) -> Result<T, E> + Send + Sync + 'static,
{
    let client = config.client()?;
    let (core, follower) = FollowCore::new("redis", erase_decode(decode));
    let mut lp = FollowLoop {
        config,
        client,
        core,
    };
    let task = BusTask::spawn("redis-follower", async move { lp.run().await });
    Ok((follower, task))
}

struct FollowLoop<T> {
    config: RedisConfig,
    client: ::redis::Client,
    core: FollowCore<T>,
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
        let server = self.run_id(&mut conn).await;
        self.sync(&mut conn, server.as_deref()).await?;
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
            self.sync(&mut conn, server.as_deref()).await?;
        }
    }

    /// The store's identity, or `None` if INFO is not allowed (ACL); then only a missing
    /// `latest` marks a reset.
    async fn run_id(&self, conn: &mut MultiplexedConnection) -> Option<String> {
        match ::redis::cmd("INFO")
            .arg("server")
            .query_async::<String>(conn)
            .await
        {
            Ok(info) => parse_run_id(&info),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the Redis run_id; reset detection relies on a missing latest");
                None
            }
        }
    }

    /// Reads `latest` and, when the decision says so, fetches and offers its blob.
    async fn sync(
        &mut self,
        conn: &mut MultiplexedConnection,
        server: Option<&str>,
    ) -> Result<(), BusError> {
        let keys = self.config.keys();
        let fields: Vec<(String, String)> =
            redis_op("read_latest", conn.hgetall(&keys.latest)).await?;
        let latest = parse_latest(&fields)?;
        self.core.record_read_success();
        metrics::LAST_READ.record_success();
        let observation = match &latest {
            None => Observation::Missing,
            Some(latest) => Observation::Present { latest, server },
        };
        let (Decision::Fetch { reset }, Some(latest)) = (self.core.observe(observation), latest)
        else {
            return Ok(());
        };
        let key = keys.snapshot(latest.version);
        // Size first, so an oversized blob is refused without being downloaded.
        let size: u64 = redis_op("fetch_blob", conn.strlen(&key)).await?;
        if size > self.config.max_blob_bytes {
            self.core.reject(
                latest,
                Rejection {
                    reason: "oversized",
                    detail: format!("{size} bytes, limit {}", self.config.max_blob_bytes),
                },
            );
            return Ok(());
        }
        let blob: Option<Vec<u8>> = redis_op("fetch_blob", conn.get(&key)).await?;
        match blob {
            Some(bytes) if !bytes.is_empty() => {
                self.core
                    .offer(latest, server.map(str::to_owned), Bytes::from(bytes), reset)
                    .await;
            }
            // `latest` is only advanced after its blob is written, so a missing blob means
            // it expired (this follower fell far behind) or was removed by hand: not
            // coming back. The next version will be tried.
            _ => self.core.reject(
                latest,
                Rejection {
                    reason: "missing",
                    detail: format!("{key} does not exist"),
                },
            ),
        }
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
