//! The in-memory bus, for standalone mode (`pilotfish-xds --config-dir`): the same
//! publisher/follower contract as Redis, in one process. Snapshots still travel as
//! encoded bytes and go through the decode function, so standalone serves exactly what a
//! replica would.
//!
//! Public surface: [`MemoryBus`] (the store: version and epoch counters plus `latest`),
//! [`MemoryPublisher`] (implements [`SnapshotPublisher`]), [`MemoryBus::follow`].

use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::watch;

use super::decision::{Decision, Observation, check_advance};
use super::follow::FollowCore;
use super::{
    BusError, BusTask, DecodeError, EncodedSnapshot, EpochGrant, Follower, PublishOutcome,
    SnapshotPublisher, SnapshotRef, Verified, erase_decode, metrics, now_ms,
};

/// The in-process store; cheap to clone (all clones share it).
#[derive(Clone, Debug)]
pub struct MemoryBus {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    counters: Mutex<Counters>,
    /// `latest` and its blob; the only copy, fanned out to followers.
    latest: watch::Sender<Option<Stored>>,
}

#[derive(Debug, Default)]
struct Counters {
    version: u64,
    epoch: u64,
}

#[derive(Clone, Debug)]
struct Stored {
    reference: SnapshotRef,
    bytes: Bytes,
}

impl Default for MemoryBus {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBus {
    pub fn new() -> Self {
        MemoryBus {
            inner: Arc::new(Inner {
                counters: Mutex::new(Counters::default()),
                latest: watch::channel(None).0,
            }),
        }
    }

    /// A publisher on this bus. Several may exist (they fence each other by epoch).
    pub fn publisher(&self) -> MemoryPublisher {
        MemoryPublisher {
            inner: self.inner.clone(),
            epoch: Mutex::new(None),
        }
    }

    /// The current `latest`, if anything was published.
    pub fn latest(&self) -> Option<SnapshotRef> {
        self.inner
            .latest
            .borrow()
            .as_ref()
            .map(|s| s.reference.clone())
    }

    /// Starts following this bus: every new `latest` is decoded with `decode`; rejected
    /// blobs are counted and logged, and the last good snapshot stays served.
    pub fn follow<T, E, D>(&self, decode: D) -> (Follower<T>, BusTask)
    where
        T: Send + Sync + 'static,
        E: DecodeError,
        D: Fn(&[u8]) -> Result<Verified<T>, E> + Send + Sync + 'static,
    {
        let (mut core, follower) = FollowCore::new("memory", erase_decode(decode), None);
        let mut latest = self.inner.latest.subscribe();
        let task = BusTask::spawn("memory-follower", async move {
            loop {
                let stored = latest.borrow_and_update().clone();
                core.record_read_success();
                let observation = match &stored {
                    None => Observation::Missing,
                    Some(s) => Observation::Present {
                        latest: &s.reference,
                    },
                };
                if let (Decision::Fetch, Some(s)) = (core.observe(observation), &stored) {
                    core.offer(s.reference.clone(), s.bytes.clone(), false)
                        .await;
                }
                // The sender lives in `Inner`, which the bus and this task's receiver keep
                // alive; `changed` fails only if every bus handle is gone.
                if latest.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        });
        (follower, task)
    }

    fn counters(&self) -> MutexGuard<'_, Counters> {
        lock(&self.inner.counters)
    }
}

/// A poisoned lock only means another thread panicked mid-update of two integers; the
/// values are still usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Publishes onto a [`MemoryBus`].
#[derive(Debug)]
pub struct MemoryPublisher {
    inner: Arc<Inner>,
    epoch: Mutex<Option<u64>>,
}

impl MemoryPublisher {
    fn publish_now(&self, snapshot: EncodedSnapshot) -> Result<PublishOutcome, BusError> {
        let epoch = (*lock(&self.epoch)).ok_or(BusError::NoEpoch)?;
        let bus = MemoryBus {
            inner: self.inner.clone(),
        };
        // Hold the counters for the whole publish: it is the memory bus's "script".
        let mut counters = bus.counters();
        let current = self
            .inner
            .latest
            .borrow()
            .as_ref()
            .map(|s| s.reference.clone());
        let next_version = counters.version + 1;
        if !check_advance(current.as_ref(), counters.epoch, next_version, epoch) {
            return Ok(PublishOutcome::Fenced { current });
        }
        if let Some(current) = current.filter(|c| c.hash == snapshot.hash) {
            return Ok(PublishOutcome::Unchanged(current));
        }
        counters.version = next_version;
        let reference = SnapshotRef {
            version: next_version,
            hash: snapshot.hash,
            epoch,
            published_at_ms: now_ms(),
        };
        metrics::BLOB_BYTES
            .with_label_values(&["publisher"])
            .set(i64::try_from(snapshot.bytes.len()).unwrap_or(i64::MAX));
        metrics::SNAPSHOT_VERSION
            .with_label_values(&["publisher"])
            .set(i64::try_from(reference.version).unwrap_or(i64::MAX));
        self.inner.latest.send_replace(Some(Stored {
            reference: reference.clone(),
            bytes: snapshot.bytes,
        }));
        Ok(PublishOutcome::Published(reference))
    }
}

impl SnapshotPublisher for MemoryPublisher {
    /// The same rule as the Redis script: the floor is taken unless a higher epoch was.
    fn take_epoch(&self, floor: u64) -> BoxFuture<'_, Result<EpochGrant, BusError>> {
        let bus = MemoryBus {
            inner: self.inner.clone(),
        };
        let grant = {
            let mut counters = bus.counters();
            let stored = self
                .inner
                .latest
                .borrow()
                .as_ref()
                .map_or(0, |s| s.reference.epoch);
            let newer = counters.epoch.max(stored);
            if newer > floor {
                EpochGrant::Superseded { newer }
            } else {
                counters.epoch = floor;
                EpochGrant::Taken(floor)
            }
        };
        if let EpochGrant::Taken(epoch) = grant {
            *lock(&self.epoch) = Some(epoch);
        }
        futures::future::ready(Ok(grant)).boxed()
    }

    fn fetch_latest(&self) -> BoxFuture<'_, Result<Option<(SnapshotRef, Bytes)>, BusError>> {
        let latest = self
            .inner
            .latest
            .borrow()
            .as_ref()
            .map(|s| (s.reference.clone(), s.bytes.clone()));
        futures::future::ready(Ok(latest)).boxed()
    }

    fn publish(
        &self,
        snapshot: EncodedSnapshot,
    ) -> BoxFuture<'_, Result<PublishOutcome, BusError>> {
        let started = std::time::Instant::now();
        let result = self.publish_now(snapshot);
        metrics::PUBLISH_DURATION.observe(started.elapsed().as_secs_f64());
        metrics::PUBLISHES
            .with_label_values(&[outcome_label(&result)])
            .inc();
        futures::future::ready(result).boxed()
    }
}

pub(crate) fn outcome_label(result: &Result<PublishOutcome, BusError>) -> &'static str {
    match result {
        Ok(PublishOutcome::Published(_)) => "published",
        Ok(PublishOutcome::Unchanged(_)) => "unchanged",
        Ok(PublishOutcome::Fenced { .. }) => "fenced",
        Err(_) => "error",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bus::Rejection;

    const WAIT: Duration = Duration::from_secs(10);

    /// Toy codec: a blob is `b"OK"` + the hash + `;` + UTF-8 payload.
    fn decode(bytes: &[u8]) -> Result<Verified<String>, Rejection> {
        let corrupt = |detail: &str| Rejection {
            reason: "corrupt",
            detail: detail.into(),
        };
        let text = bytes
            .strip_prefix(b"OK")
            .ok_or_else(|| corrupt("missing magic"))?;
        let text = std::str::from_utf8(text).map_err(|e| corrupt(&e.to_string()))?;
        let (hash, payload) = text.split_once(';').ok_or_else(|| corrupt("no hash"))?;
        Ok(Verified {
            value: payload.to_owned(),
            hash: hash.to_owned(),
        })
    }

    fn blob(payload: &str, hash: &str) -> EncodedSnapshot {
        EncodedSnapshot {
            bytes: Bytes::from(format!("OK{hash};{payload}")),
            hash: hash.into(),
        }
    }

    #[tokio::test]
    async fn follower_sees_every_published_value_through_decode() {
        let bus = MemoryBus::new();
        let publisher = bus.publisher();
        assert!(matches!(
            publisher.publish(blob("a", "h1")).await,
            Err(BusError::NoEpoch)
        ));
        publisher.take_epoch(1).await.unwrap();
        let (follower, _task) = bus.follow(decode);
        let first = publisher.publish(blob("a", "h1")).await.unwrap();
        let PublishOutcome::Published(first) = first else {
            panic!("{first:?}")
        };
        let got = follower
            .wait_for(WAIT, |f| f.reference == first)
            .await
            .unwrap();
        assert_eq!(got.value, "a");
        assert!(
            matches!(publisher.publish(blob("a", "h1")).await, Ok(PublishOutcome::Unchanged(r)) if r == first)
        );
        let second = publisher.publish(blob("b", "h2")).await.unwrap();
        let PublishOutcome::Published(second) = second else {
            panic!("{second:?}")
        };
        assert!(second.version > first.version);
        let got = follower
            .wait_for(WAIT, |f| f.reference == second)
            .await
            .unwrap();
        assert_eq!(got.value, "b");
        assert!(follower.status().is_ready());
    }

    #[tokio::test]
    async fn older_epoch_is_fenced() {
        let bus = MemoryBus::new();
        let old = bus.publisher();
        let new = bus.publisher();
        assert_eq!(old.take_epoch(1).await.unwrap(), EpochGrant::Taken(1));
        assert_eq!(new.take_epoch(2).await.unwrap(), EpochGrant::Taken(2));
        assert_eq!(
            old.take_epoch(1).await.unwrap(),
            EpochGrant::Superseded { newer: 2 },
            "an older floor is refused"
        );
        let published = new.publish(blob("new", "h1")).await.unwrap();
        let PublishOutcome::Published(current) = published else {
            panic!("{published:?}")
        };
        let outcome = old.publish(blob("old", "h2")).await.unwrap();
        assert_eq!(
            outcome,
            PublishOutcome::Fenced {
                current: Some(current.clone())
            }
        );
        assert_eq!(bus.latest(), Some(current));
    }

    #[tokio::test]
    async fn corrupt_blob_is_rejected_and_the_last_good_one_kept() {
        let bus = MemoryBus::new();
        let publisher = bus.publisher();
        publisher.take_epoch(1).await.unwrap();
        let (follower, _task) = bus.follow(decode);
        publisher.publish(blob("good", "h1")).await.unwrap();
        follower
            .wait_for(WAIT, |f| f.value == "good")
            .await
            .unwrap();
        let bad = EncodedSnapshot {
            bytes: Bytes::from_static(b"garbage"),
            hash: "h2".into(),
        };
        publisher.publish(bad).await.unwrap();
        let mut status = follower.status.clone();
        tokio::time::timeout(WAIT, status.wait_for(|s| s.rejected == 1))
            .await
            .unwrap()
            .unwrap();
        // A good blob under the wrong hash: not what `latest` names.
        let swapped = EncodedSnapshot {
            bytes: blob("swapped", "h-other").bytes,
            hash: "h3".into(),
        };
        publisher.publish(swapped).await.unwrap();
        tokio::time::timeout(WAIT, status.wait_for(|s| s.rejected == 2))
            .await
            .unwrap()
            .unwrap();
        assert!(
            follower
                .status()
                .last_error
                .unwrap()
                .contains("hash_mismatch")
        );
        assert_eq!(follower.current().unwrap().value, "good");
        publisher.publish(blob("next", "h4")).await.unwrap();
        follower
            .wait_for(WAIT, |f| f.value == "next")
            .await
            .unwrap();
    }
}
