//! Reading back what is already published, to seed a restarted builder's "previous"
//! snapshot ([`Pipeline::seed_previous`](super::Pipeline::seed_previous)): an object that
//! is invalid when a controller starts then keeps its last accepted version instead of
//! dropping out. Works on any [`SnapshotPublisher`] (Redis, or the in-memory bus); used
//! by the Kubernetes mode and the `--config-dir` mode alike.
//!
//! The read ends only with an answer — the published snapshot, or the knowledge that
//! there is none usable (nothing published; a blob that does not verify or decode) —
//! because building without it could publish a mesh that lost the last good version of
//! every object invalid at restart. While Redis cannot answer, each attempt is bounded
//! ([`ATTEMPT_TIMEOUT`]) and retried with backoff, and every failure is reported as a
//! [`SeedEvent::Retrying`] for the log and the readiness reason. There is no bound on
//! the whole wait: without Redis nothing can be published anyway, and the first build
//! follows as soon as Redis answers. Decoding runs off the async workers.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;

use crate::bus::{BusError, SnapshotPublisher};
use crate::retry::{Backoff, Retry};
use pilotfish_mesh::codec::{self, DecodeLimits, VerifyKeys};
use pilotfish_mesh::push_context::PushContext;

/// One attempt to read the published snapshot gives up after this.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries after a failed attempt, from 200 ms up to 5 s.
const RETRY: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));

/// What the read reports.
#[derive(Debug)]
pub enum SeedEvent {
    /// An attempt failed (Redis unreachable, slow or refusing); another follows after
    /// `retry_in`.
    Retrying { error: String, retry_in: Duration },
    /// The answer: the published snapshot, or `None` when there is nothing usable. Last.
    /// (Boxed: one large value at the end of a stream of small ones.)
    Done(Option<Box<PushContext>>),
}

/// The read, as a stream that ends after [`SeedEvent::Done`].
pub type Seed = BoxStream<'static, SeedEvent>;

/// Reads and decodes (with `limits` and `keys`) the snapshot `latest` points at, retrying
/// until Redis answers.
pub fn read_published(
    publisher: Arc<dyn SnapshotPublisher>,
    limits: DecodeLimits,
    keys: VerifyKeys,
) -> Seed {
    let keys = Arc::new(keys);
    futures::stream::unfold(Some(Retry::new(RETRY)), move |retry| {
        let (publisher, keys) = (publisher.clone(), keys.clone());
        async move {
            let mut retry = retry?;
            if retry.attempt() > 0 {
                tokio::time::sleep(retry.deadline().map_or(Duration::ZERO, |at| {
                    at.saturating_duration_since(tokio::time::Instant::now())
                }))
                .await;
            }
            match attempt(&*publisher, limits, keys).await {
                Ok(found) => Some((SeedEvent::Done(found.map(Box::new)), None)),
                Err(error) => {
                    let retry_in = retry.schedule(tokio::time::Instant::now());
                    if retry.attempt() == 1 || retry.attempt().is_multiple_of(20) {
                        tracing::warn!(error = %error, attempts = retry.attempt(), retry_in_ms = retry_in.as_millis() as u64, "cannot read the published snapshot yet; nothing is built until it is read (it keeps the last good version of objects invalid now)");
                    }
                    Some((SeedEvent::Retrying { error, retry_in }, Some(retry)))
                }
            }
        }
    })
    .boxed()
}

/// One bounded attempt: `Ok` is an answer, `Err` a reason to try again.
async fn attempt(
    publisher: &dyn SnapshotPublisher,
    limits: DecodeLimits,
    keys: Arc<VerifyKeys>,
) -> Result<Option<PushContext>, String> {
    let fetched = match tokio::time::timeout(ATTEMPT_TIMEOUT, publisher.fetch_latest()).await {
        Ok(Ok(fetched)) => fetched,
        // An answer, not a failure: nothing usable is published (the next publish
        // overwrites it).
        Ok(Err(e @ BusError::MalformedLatest(_))) => {
            tracing::warn!(error = %e, "the published snapshot cannot be read back; objects invalid now get no last-good fallback");
            return Ok(None);
        }
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {ATTEMPT_TIMEOUT:?}")),
    };
    let Some((reference, blob)) = fetched else {
        tracing::info!(
            "nothing is published yet: the first build has no last-good fallback to keep"
        );
        return Ok(None);
    };
    let decoded = tokio::task::spawn_blocking(move || codec::decode(&blob, &limits, &keys))
        .await
        .map_err(|e| format!("decoding the published snapshot panicked: {e}"))?;
    match decoded {
        Ok(previous) => {
            tracing::info!(%reference, "read the published snapshot: objects invalid now keep the version it holds");
            Ok(Some(previous))
        }
        Err(e) => {
            tracing::warn!(%reference, error = %e, "the published snapshot does not verify or decode; objects invalid now get no last-good fallback");
            Ok(None)
        }
    }
}

/// Awaits the answer of `seed`, ignoring its retries (tests, tools).
pub async fn answer(mut seed: Seed) -> Option<PushContext> {
    while let Some(event) = seed.next().await {
        if let SeedEvent::Done(found) = event {
            return found.map(|b| *b);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::memory::MemoryBus;
    use crate::bus::{EncodedSnapshot, PublishOutcome};
    use crate::pipeline::Pipeline;
    use bytes::Bytes;
    use pilotfish_mesh::codec::SnapshotSigner;
    use pilotfish_mesh::synthetic::{MeshShape, mesh};

    const WAIT: Duration = Duration::from_secs(10);

    fn signer() -> SnapshotSigner {
        SnapshotSigner::from_seed([5; 32])
    }

    fn keys() -> VerifyKeys {
        VerifyKeys::new([signer().verify_key()])
    }

    #[tokio::test]
    async fn reads_back_what_the_memory_bus_holds() {
        let bus = MemoryBus::new();
        let publisher: Arc<dyn SnapshotPublisher> = Arc::new(bus.publisher());
        let read = |p: &Arc<dyn SnapshotPublisher>| {
            answer(read_published(p.clone(), DecodeLimits::default(), keys()))
        };
        assert!(read(&publisher).await.is_none(), "nothing published yet");
        let mut pipeline = Pipeline::new(publisher.clone(), signer());
        pipeline.take_epoch(1).await.unwrap();
        let built = pipeline.build(mesh(MeshShape::standard(5)), false).await;
        pipeline.publish(&built).await.unwrap();
        let seeded = read(&publisher).await.expect("seeded");
        assert_eq!(
            codec::encode(&seeded, &signer()).hash_hex(),
            built.encoded.hash_hex()
        );
        // Signed by a key the reader does not trust: no fallback from it.
        let other = answer(read_published(
            publisher,
            DecodeLimits::default(),
            VerifyKeys::new([SnapshotSigner::from_seed([6; 32]).verify_key()]),
        ))
        .await;
        assert!(other.is_none());
    }

    #[tokio::test]
    async fn an_undecodable_blob_gives_nothing() {
        let bus = MemoryBus::new();
        let publisher = bus.publisher();
        publisher.take_epoch(1).await.unwrap();
        let outcome = publisher
            .publish(EncodedSnapshot {
                bytes: Bytes::from_static(b"not a snapshot"),
                hash: "h".into(),
            })
            .await
            .unwrap();
        assert!(matches!(outcome, PublishOutcome::Published(_)));
        let seed = read_published(Arc::new(publisher), DecodeLimits::default(), keys());
        assert!(answer(seed).await.is_none());
    }

    #[tokio::test]
    async fn an_unreachable_or_silent_redis_is_retried_not_taken_for_an_answer() {
        use crate::bus::redis::{RedisConfig, RedisPublisher};
        let redis = |port: u16| {
            let config = RedisConfig::new(&format!("redis://127.0.0.1:{port}"))
                .unwrap()
                .with_backoff(Duration::from_millis(1), Duration::from_millis(10))
                .with_timeouts(Duration::from_millis(500), Duration::from_millis(300));
            Arc::new(RedisPublisher::new(config).unwrap()) as Arc<dyn SnapshotPublisher>
        };
        // Accepts connections and never answers.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_port = silent.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                open.push(socket);
            }
        });
        // Nothing listens: the connection is refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        for port in [silent_port, closed_port] {
            let mut seed = read_published(redis(port), DecodeLimits::default(), keys());
            for _ in 0..2 {
                let event = tokio::time::timeout(WAIT, seed.next())
                    .await
                    .expect("each attempt is bounded");
                assert!(
                    matches!(event, Some(SeedEvent::Retrying { .. })),
                    "port {port}: {event:?}"
                );
            }
        }
        held.abort();
    }
}
