//! The part of a follow loop both implementations share: given an observed `latest` and,
//! when asked for, its blob, decide, decode, publish the good value to the `watch`
//! channel, and keep status and metrics. The loops (memory, Redis) only do I/O around it.
//! Owns the follower's mutable state; nothing else writes the channels.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::watch;

use super::decision::{Decision, FollowState, KeepReason, Observation};
use super::metrics;
use super::{DecodeFn, Followed, Follower, FollowerStatus, Rejection, SnapshotRef, now_ms};

pub(crate) struct FollowCore<T> {
    decode: DecodeFn<T>,
    state: FollowState,
    snapshots: watch::Sender<Option<Arc<Followed<T>>>>,
    status: watch::Sender<FollowerStatus>,
    /// Which implementation, for log lines.
    source: &'static str,
}

impl<T: Send + Sync + 'static> FollowCore<T> {
    pub(crate) fn new(source: &'static str, decode: DecodeFn<T>) -> (Self, Follower<T>) {
        let (snapshots, snapshots_rx) = watch::channel(None);
        let (status, status_rx) = watch::channel(FollowerStatus::default());
        let core = FollowCore {
            decode,
            state: FollowState::default(),
            snapshots,
            status,
            source,
        };
        (core, Follower::new(snapshots_rx, status_rx))
    }

    /// Applies the decision rule to what was read, recording a missing `latest`.
    pub(crate) fn observe(&mut self, observation: Observation<'_>) -> Decision {
        if matches!(observation, Observation::Missing) {
            if self.state.held().is_some() {
                tracing::info!(
                    source = self.source,
                    "latest snapshot reference is missing: store reset? keeping the current snapshot"
                );
            }
            self.state.record_missing();
        }
        let decision = self.state.decide(observation);
        if let (Decision::Keep(KeepReason::Stale), Observation::Present { latest, .. }) =
            (decision, observation)
        {
            tracing::debug!(source = self.source, %latest, "ignoring an older latest from the same store (no reset seen)");
        }
        decision
    }

    /// Decodes `bytes` (off the async workers: decoding a large blob is CPU work) and, if
    /// good, serves it. Returns whether it was accepted.
    pub(crate) async fn offer(
        &mut self,
        reference: SnapshotRef,
        server: Option<String>,
        bytes: Bytes,
        reset: bool,
    ) -> bool {
        let size = bytes.len();
        let decode = self.decode.clone();
        let decoded = match tokio::task::spawn_blocking(move || decode(&bytes)).await {
            Ok(result) => result,
            Err(e) => Err(Rejection {
                reason: "decoder_panic",
                detail: e.to_string(),
            }),
        };
        match decoded {
            Ok(value) => {
                let lag_ms = now_ms().saturating_sub(reference.published_at_ms);
                metrics::FOLLOW_LATENCY.observe(lag_ms as f64 / 1000.0);
                metrics::SNAPSHOT_VERSION
                    .with_label_values(&["follower"])
                    .set(i64::try_from(reference.version).unwrap_or(i64::MAX));
                metrics::BLOB_BYTES
                    .with_label_values(&["follower"])
                    .set(i64::try_from(size).unwrap_or(i64::MAX));
                if reset {
                    let previous = self.state.held().map(|h| h.to_string()).unwrap_or_default();
                    tracing::warn!(source = self.source, %reference, %previous, "store was reset: accepting the new snapshot sequence");
                } else {
                    tracing::info!(source = self.source, %reference, bytes = size, lag_ms, "following new snapshot");
                }
                self.state.accept(reference.clone(), server);
                self.status.send_modify(|s| {
                    s.current = Some(reference.clone());
                    s.last_error = None;
                });
                self.snapshots
                    .send_replace(Some(Arc::new(Followed { reference, value })));
                true
            }
            Err(rejection) => {
                self.reject(reference, rejection);
                false
            }
        }
    }

    /// Refuses `reference` (not fetched again; the next version is tried) and keeps
    /// serving the last good snapshot.
    pub(crate) fn reject(&mut self, reference: SnapshotRef, rejection: Rejection) {
        metrics::REJECTED
            .with_label_values(&[rejection.reason])
            .inc();
        let serving = self
            .state
            .held()
            .map(|h| h.to_string())
            .unwrap_or_else(|| "nothing".into());
        tracing::error!(
            source = self.source,
            %reference,
            reason = rejection.reason,
            detail = %rejection.detail,
            %serving,
            "rejected snapshot blob; keeping the last good snapshot and waiting for the next version"
        );
        let text = format!("rejected snapshot {reference}: {rejection}");
        self.state.reject(reference);
        self.status.send_modify(|s| {
            s.rejected += 1;
            s.last_error = Some(text);
        });
    }

    pub(crate) fn record_read_success(&self) {
        self.status.send_if_modified(|s| {
            let was_connected = s.connected;
            s.connected = true;
            s.last_success = Some(Instant::now());
            // Only "connected" matters to watchers; the timestamp is read on demand.
            !was_connected
        });
    }

    pub(crate) fn record_error(&self, connected: bool, text: String) {
        self.status.send_modify(|s| {
            s.connected = connected;
            s.last_error = Some(text);
        });
    }
}
