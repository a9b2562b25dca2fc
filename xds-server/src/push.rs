//! Push admission: bounds how many streams compute responses for a new snapshot at once.
//!
//! Two independent pools: one for full pushes and one for endpoints-only pushes, so the
//! cheap and frequent EDS updates are never queued behind expensive full recomputations.
//! A permit is held only while a stream computes its responses, never while it waits to
//! send them, so a slow or dead client cannot hold up anyone else. Coalescing needs no
//! queue: each stream reads the newest snapshot from a `watch` when it gets its permit.

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::ads::ChangeKind;

/// The two permit pools.
#[derive(Debug)]
pub struct PushLimiter {
    full: Semaphore,
    endpoints: Semaphore,
}

impl PushLimiter {
    /// `full` and `endpoints` are the pool sizes (each at least 1).
    pub fn new(full: usize, endpoints: usize) -> Self {
        PushLimiter {
            full: Semaphore::new(full.max(1)),
            endpoints: Semaphore::new(endpoints.max(1)),
        }
    }

    /// Waits for a permit of the pool that serves `kind`. `None` only if the pool was
    /// closed, which this type never does.
    pub async fn acquire(&self, kind: ChangeKind) -> Option<SemaphorePermit<'_>> {
        let pool = match kind {
            ChangeKind::EndpointsOnly => &self.endpoints,
            ChangeKind::Full => &self.full,
        };
        pool.acquire().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn endpoint_pushes_overtake_a_saturated_full_pool() {
        let limiter = PushLimiter::new(1, 1);
        let _busy = limiter.acquire(ChangeKind::Full).await;
        let eds = tokio::time::timeout(
            Duration::from_secs(5),
            limiter.acquire(ChangeKind::EndpointsOnly),
        )
        .await;
        assert!(
            matches!(eds, Ok(Some(_))),
            "an EDS push must not wait for the full pool"
        );
        let full =
            tokio::time::timeout(Duration::from_millis(50), limiter.acquire(ChangeKind::Full))
                .await;
        assert!(full.is_err(), "the full pool is bounded");
    }
}
