//! Admission of new streams: a token bucket ([`StreamRate`]), so a replica takes new
//! streams at a bounded rate and refuses the rest at once (the client retries, possibly
//! on another replica).

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
