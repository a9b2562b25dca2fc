//! The part of a follow loop both implementations share: given an observed `latest` and,
//! when asked for, its blob, decide, decode, check the blob is the one `latest` names,
//! publish the good value to the `watch` channel, and keep status and metrics. The loops
//! (memory, Redis) only do I/O around it. Owns the follower's mutable state; nothing else
//! writes the channels.

use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// How an offered blob fared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Offered {
    Accepted,
    Rejected,
}

impl<T: Send + Sync + 'static> FollowCore<T> {
    pub(crate) fn new(
        source: &'static str,
        decode: DecodeFn<T>,
        stale_after: Option<Duration>,
    ) -> (Self, Follower<T>) {
        let (snapshots, snapshots_rx) = watch::channel(None);
        let (status, status_rx) = watch::channel(FollowerStatus {
            stale_after,
            ..FollowerStatus::default()
        });
        let core = FollowCore {
            decode,
            state: FollowState::default(),
            snapshots,
            status,
            source,
        };
        (core, Follower::new(snapshots_rx, status_rx))
    }

    /// Whether nothing is served yet (the follower then looks for a fallback when
    /// `latest` is unusable).
    pub(crate) fn holds_nothing(&self) -> bool {
        self.state.held().is_none()
    }

    pub(crate) fn state(&self) -> &FollowState {
        &self.state
    }

    /// Applies the decision rule to what was read.
    pub(crate) fn observe(&mut self, observation: Observation<'_>) -> Decision {
        let decision = self.state.decide(observation);
        match (decision, observation) {
            (Decision::Keep(KeepReason::LatestMissing), _) if self.state.held().is_some() => {
                tracing::debug!(
                    source = self.source,
                    "latest snapshot reference is missing (store reset?); keeping the current snapshot"
                );
            }
            (Decision::Keep(KeepReason::Stale), Observation::Present { latest }) => {
                let serving = self.serving();
                tracing::debug!(source = self.source, %latest, %serving, "ignoring a latest that does not come after the served snapshot (older epoch or version)");
            }
            _ => {}
        }
        decision
    }

    fn serving(&self) -> String {
        self.state
            .held()
            .map(|h| h.to_string())
            .unwrap_or_else(|| "nothing".into())
    }

    /// Decodes `bytes` (off the async workers: decoding a large blob is CPU work), checks
    /// that it is the blob `reference` names (same content hash), and if so serves it.
    /// `fallback`: an older retained blob served because `latest`'s was unusable.
    pub(crate) async fn offer(
        &mut self,
        reference: SnapshotRef,
        bytes: Bytes,
        fallback: bool,
    ) -> Offered {
        let size = bytes.len();
        let decode = self.decode.clone();
        let decoded = match tokio::task::spawn_blocking(move || decode(&bytes)).await {
            Ok(result) => result,
            Err(e) => Err(Rejection {
                reason: "decoder_panic",
                detail: e.to_string(),
            }),
        };
        let verified = decoded.and_then(|v| {
            if v.hash == reference.hash {
                Ok(v)
            } else {
                Err(Rejection {
                    reason: "hash_mismatch",
                    detail: format!(
                        "the blob's content hash {} is not the {} `latest` names",
                        short(&v.hash),
                        short(&reference.hash)
                    ),
                })
            }
        });
        match verified {
            Ok(verified) => {
                let lag_ms = now_ms().saturating_sub(reference.published_at_ms);
                metrics::FOLLOW_LATENCY.observe(lag_ms as f64 / 1000.0);
                metrics::SNAPSHOT_VERSION
                    .with_label_values(&["follower"])
                    .set(i64::try_from(reference.version).unwrap_or(i64::MAX));
                metrics::BLOB_BYTES
                    .with_label_values(&["follower"])
                    .set(i64::try_from(size).unwrap_or(i64::MAX));
                if fallback {
                    tracing::warn!(source = self.source, %reference, bytes = size, "serving the newest good retained snapshot: the one `latest` names is unusable");
                } else {
                    tracing::info!(source = self.source, %reference, bytes = size, lag_ms, "following new snapshot");
                }
                self.state.accept(reference.clone());
                self.status.send_modify(|s| {
                    s.current = Some(reference.clone());
                    s.last_error = None;
                });
                self.snapshots.send_replace(Some(Arc::new(Followed {
                    reference,
                    value: verified.value,
                })));
                Offered::Accepted
            }
            Err(rejection) if fallback => {
                // Not marked rejected: `latest` stays the reference the state tracks.
                metrics::REJECTED
                    .with_label_values(&[rejection.reason])
                    .inc();
                tracing::warn!(source = self.source, %reference, reason = rejection.reason, detail = %rejection.detail, "retained snapshot unusable too");
                Offered::Rejected
            }
            Err(rejection) => {
                self.reject(reference, rejection);
                Offered::Rejected
            }
        }
    }

    /// Refuses `reference` (not fetched again; the next version is tried) and keeps
    /// serving the last good snapshot.
    pub(crate) fn reject(&mut self, reference: SnapshotRef, rejection: Rejection) {
        metrics::REJECTED
            .with_label_values(&[rejection.reason])
            .inc();
        let serving = self.serving();
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

fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}
