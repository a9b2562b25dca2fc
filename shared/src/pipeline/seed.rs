//! Reading back what is already published, to seed a restarted builder's "previous"
//! snapshot ([`Pipeline::seed_previous`](super::Pipeline::seed_previous)): an object that
//! is invalid when a controller starts then keeps its last accepted version instead of
//! dropping out. Works on any [`SnapshotPublisher`] (Redis, or the in-memory bus).
//!
//! The read is a courtesy, never a reason not to build: it is bounded by a timeout, and
//! every failure (unreachable bus, missing or undecodable blob) is logged and gives
//! `None`.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::bus::SnapshotPublisher;
use pilotfish_mesh::codec::{self, DecodeLimits};
use pilotfish_mesh::push_context::PushContext;

/// A one-shot read of the published snapshot; `None`: nothing usable.
pub type Seed = BoxFuture<'static, Option<PushContext>>;

/// Reads and decodes the snapshot `latest` points at, for at most `timeout`.
pub fn read_published(publisher: Arc<dyn SnapshotPublisher>, timeout: Duration) -> Seed {
    Box::pin(async move {
        match tokio::time::timeout(timeout, publisher.fetch_latest()).await {
            Ok(Ok(Some((reference, blob)))) => {
                match codec::decode(&blob, &DecodeLimits::default()) {
                    Ok(previous) => {
                        tracing::info!(%reference, "read the published snapshot: objects invalid now keep the version it holds");
                        Some(previous)
                    }
                    Err(e) => {
                        tracing::warn!(%reference, error = %e, "cannot decode the published snapshot; objects invalid now get no last-good fallback");
                        None
                    }
                }
            }
            Ok(Ok(None)) => None,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the published snapshot; objects invalid now get no last-good fallback");
                None
            }
            Err(_) => {
                tracing::warn!(
                    ?timeout,
                    "reading the published snapshot timed out; objects invalid now get no last-good fallback"
                );
                None
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::memory::MemoryBus;
    use crate::bus::{EncodedSnapshot, PublishOutcome};
    use crate::pipeline::Pipeline;
    use bytes::Bytes;
    use pilotfish_mesh::synthetic::{MeshShape, mesh};

    const WAIT: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn reads_back_what_the_memory_bus_holds() {
        let bus = MemoryBus::new();
        let publisher: Arc<dyn SnapshotPublisher> = Arc::new(bus.publisher());
        assert!(
            read_published(publisher.clone(), WAIT).await.is_none(),
            "nothing published yet"
        );
        let mut pipeline = Pipeline::new(publisher.clone());
        pipeline.take_epoch().await.unwrap();
        let built = pipeline.build(mesh(MeshShape::standard(5)), false).await;
        pipeline.publish(&built).await.unwrap();
        let seeded = read_published(publisher, WAIT).await.expect("seeded");
        assert_eq!(codec::encode(&seeded).hash_hex(), built.encoded.hash_hex());
    }

    #[tokio::test]
    async fn an_undecodable_blob_gives_nothing() {
        let bus = MemoryBus::new();
        let publisher = bus.publisher();
        publisher.take_epoch().await.unwrap();
        let outcome = publisher
            .publish(EncodedSnapshot {
                bytes: Bytes::from_static(b"not a snapshot"),
                hash: "h".into(),
            })
            .await
            .unwrap();
        assert!(matches!(outcome, PublishOutcome::Published(_)));
        assert!(read_published(Arc::new(publisher), WAIT).await.is_none());
    }

    #[tokio::test]
    async fn an_unreachable_or_silent_redis_gives_nothing_within_the_timeout() {
        use crate::bus::redis::{RedisConfig, RedisPublisher};
        let redis = |port: u16| {
            let config = RedisConfig::new(&format!("redis://127.0.0.1:{port}"))
                .unwrap()
                .with_backoff(Duration::from_millis(1), Duration::from_millis(10))
                .with_timeouts(Duration::from_millis(500), Duration::from_secs(30));
            Arc::new(RedisPublisher::new(config).unwrap()) as Arc<dyn SnapshotPublisher>
        };
        // Accepts connections and never answers: only the timeout ends the read.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_port = silent.local_addr().unwrap().port();
        let held = tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                open.push(socket);
            }
        });
        let read = read_published(redis(silent_port), Duration::from_millis(200));
        assert!(
            tokio::time::timeout(WAIT, read)
                .await
                .expect("bounded")
                .is_none()
        );
        held.abort();
        // Nothing listens: the connection is refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let closed_port = closed.local_addr().unwrap().port();
        drop(closed);
        let read = read_published(redis(closed_port), WAIT);
        assert!(
            tokio::time::timeout(WAIT, read)
                .await
                .expect("bounded")
                .is_none()
        );
    }
}
