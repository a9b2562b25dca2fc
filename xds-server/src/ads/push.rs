//! Push admission: bounds how many streams compute responses for a new snapshot at once.
//!
//! Two independent pools: one for full pushes and one for endpoints-only pushes, so the
//! cheap and frequent EDS updates are never queued behind expensive full recomputations.
//! A permit is held only while a stream computes its responses, never while it waits to
//! send them, so a slow or dead client cannot hold up anyone else. Coalescing needs no
//! queue: each stream reads the newest snapshot from a `watch` when it gets its permit.

use tokio::sync::{Semaphore, SemaphorePermit};

use super::resource::ChangeKind;

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

/// Admission of new streams: a token bucket refilled at `rate` per second up to `burst`.
/// Pure (the caller passes the clock), so its behaviour is a plain unit test.
#[derive(Clone, Debug)]
pub struct StreamRate {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: std::time::Instant,
}

impl StreamRate {
    /// `rate` new streams per second, bursts of up to twice that (at least 1).
    pub fn new(rate: f64, now: std::time::Instant) -> Self {
        let burst = (rate * 2.0).max(1.0);
        StreamRate {
            rate: rate.max(0.0),
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes one token if there is one.
    pub fn try_admit(&mut self, now: std::time::Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod stream_rate_tests {
    use super::StreamRate;
    use std::time::{Duration, Instant};

    #[test]
    fn admits_a_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut r = StreamRate::new(10.0, t0);
        let burst = (0..100).filter(|_| r.try_admit(t0)).count();
        assert_eq!(burst, 20, "burst of twice the rate");
        assert!(!r.try_admit(t0));
        // 10 per second refill: after 0.5 s, 5 more.
        let later = t0 + Duration::from_millis(500);
        let refilled = (0..100).filter(|_| r.try_admit(later)).count();
        assert_eq!(refilled, 5);
        // Idle time never stores more than the burst.
        let much_later = t0 + Duration::from_secs(3600);
        assert_eq!((0..100).filter(|_| r.try_admit(much_later)).count(), 20);
    }
}
