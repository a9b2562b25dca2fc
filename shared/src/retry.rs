//! Retrying after a failure, one way everywhere: [`Backoff`] is the formula (exponential,
//! jittered, capped), [`Retry`] counts the failures of one operation and holds the
//! deadline of its next attempt, and [`sleep_until_opt`] is the timer a `select!` loop
//! sleeps on until that deadline. Used by the Redis follower's reconnects, the publish
//! and epoch retries of both publishing loops (the folder loop and the Kubernetes mode's
//! conductor) and the status writer.
//!
//! Pure apart from the jitter, which is injected ([`Retry::with_jitter`]): with a fixed
//! unit every delay is a plain unit test, and a unit of `1.0` gives the un-jittered
//! ceiling `min(cap, base·2^attempt)`.

use std::time::Duration;

use tokio::time::Instant;

/// Exponential backoff with jitter: the delay before retry `attempt` (0 for the first)
/// is uniform in `[base/2, min(cap, base·2^attempt)]`. The lower bound keeps a crowd of
/// clients (replicas reconnecting to a recovering Redis) from all coming back at once
/// while still spreading them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Backoff {
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Backoff { base, cap }
    }

    /// The delay before retry `attempt`; `unit` is a uniform random number in `[0, 1)`
    /// (values outside are clamped, a non-finite one counts as 0).
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let ceiling = self
            .base
            .checked_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX))
            .unwrap_or(self.cap)
            .min(self.cap);
        let floor = (self.base / 2).min(ceiling);
        let unit = if unit.is_finite() {
            unit.clamp(0.0, 1.0)
        } else {
            0.0
        };
        floor + (ceiling - floor).mul_f64(unit)
    }
}

/// Where a [`Retry`] gets its jitter: a uniform number in `[0, 1)` per delay.
pub type Jitter = fn() -> f64;

/// The default [`Jitter`]: the thread-local random generator.
pub fn random_unit() -> f64 {
    rand::random::<f64>()
}

/// The retries of one operation: how many attempts failed since the last success, and
/// when the next one is due (for loops that wake on a deadline rather than sleep).
#[derive(Clone, Debug)]
pub struct Retry {
    backoff: Backoff,
    jitter: Jitter,
    attempt: u32,
    deadline: Option<Instant>,
}

impl Retry {
    /// No failure yet, nothing scheduled; jittered by [`random_unit`].
    pub fn new(backoff: Backoff) -> Self {
        Retry {
            backoff,
            jitter: random_unit,
            attempt: 0,
            deadline: None,
        }
    }

    /// The same, jittered by `jitter` (a constant in tests).
    pub fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Failures counted since the last [`reset`](Self::reset).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Counts a failure and returns how long to wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.backoff.delay(self.attempt, (self.jitter)());
        self.attempt = self.attempt.saturating_add(1);
        delay
    }

    /// Counts a failure at `now` and schedules the next attempt one delay later;
    /// returns the delay.
    pub fn schedule(&mut self, now: Instant) -> Duration {
        let delay = self.next_delay();
        self.deadline = Some(now + delay);
        delay
    }

    /// Schedules the next attempt at `at` without counting a failure.
    pub fn schedule_at(&mut self, at: Instant) {
        self.deadline = Some(at);
    }

    /// When the next attempt is due, if one is scheduled.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// An attempt is scheduled and due at `now`.
    pub fn is_due(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|at| at <= now)
    }

    /// Drops the scheduled attempt (it is starting, or no longer wanted); the failure
    /// count stays.
    pub fn cancel(&mut self) {
        self.deadline = None;
    }

    /// Success: forgets the failures and any scheduled attempt.
    pub fn reset(&mut self) {
        self.attempt = 0;
        self.deadline = None;
    }
}

/// Sleeps until `at`, or forever when `None`: a `select!` branch that is off until a
/// deadline exists (debounce, retries, claim expiry, connection ages).
pub async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn backoff_grows_to_the_cap_and_stays_within_bounds() {
        let b = Backoff::new(100 * MS, Duration::from_secs(5));
        assert_eq!(b.delay(0, 0.0), 50 * MS);
        assert_eq!(b.delay(0, 1.0), 100 * MS);
        assert_eq!(b.delay(3, 1.0), 800 * MS);
        assert_eq!(b.delay(30, 1.0), b.cap);
        assert_eq!(b.delay(u32::MAX, 1.0), b.cap);
        for attempt in 0..40 {
            for unit in [0.0, 0.3, 0.999, f64::NAN, -1.0, 7.0] {
                let d = b.delay(attempt, unit);
                assert!(
                    d >= b.base / 2 && d <= b.cap,
                    "attempt {attempt} unit {unit}: {d:?}"
                );
            }
        }
    }

    #[test]
    fn a_cap_below_half_the_base_bounds_every_delay() {
        let b = Backoff::new(Duration::from_secs(10), Duration::from_secs(1));
        assert_eq!(b.delay(0, 0.0), Duration::from_secs(1));
        assert_eq!(b.delay(5, 1.0), Duration::from_secs(1));
    }

    #[test]
    fn failures_count_up_and_a_success_starts_over() {
        let mut r = Retry::new(Backoff::new(200 * MS, Duration::from_secs(10))).with_jitter(|| 1.0);
        let delays: Vec<Duration> = (0..8).map(|_| r.next_delay()).collect();
        assert_eq!(
            delays,
            [200, 400, 800, 1600, 3200, 6400, 10_000, 10_000].map(|ms| ms * MS)
        );
        assert_eq!(r.attempt(), 8);
        r.reset();
        assert_eq!(r.attempt(), 0);
        assert_eq!(r.next_delay(), 200 * MS);
    }

    #[test]
    fn the_jitter_spreads_each_delay_between_half_the_base_and_the_ceiling() {
        let mut low =
            Retry::new(Backoff::new(200 * MS, Duration::from_secs(10))).with_jitter(|| 0.0);
        assert_eq!(low.next_delay(), 100 * MS);
        assert_eq!(low.next_delay(), 100 * MS);
        let mut mid =
            Retry::new(Backoff::new(200 * MS, Duration::from_secs(10))).with_jitter(|| 0.5);
        assert_eq!(mid.next_delay(), 150 * MS);
        assert_eq!(mid.next_delay(), 250 * MS);
        let mut random = Retry::new(Backoff::new(200 * MS, Duration::from_secs(10)));
        for _ in 0..50 {
            let d = random.next_delay();
            assert!(d >= 100 * MS && d <= Duration::from_secs(10), "{d:?}");
        }
    }

    #[test]
    fn a_scheduled_attempt_is_due_at_its_deadline_until_cancelled() {
        let t0 = Instant::now();
        let mut r = Retry::new(Backoff::new(200 * MS, Duration::from_secs(10))).with_jitter(|| 1.0);
        assert_eq!(r.deadline(), None);
        assert!(!r.is_due(t0));
        assert_eq!(r.schedule(t0), 200 * MS);
        assert_eq!(r.deadline(), Some(t0 + 200 * MS));
        assert!(!r.is_due(t0 + 199 * MS));
        assert!(r.is_due(t0 + 200 * MS));
        r.cancel();
        assert!(!r.is_due(t0 + 300 * MS));
        assert_eq!(r.attempt(), 1, "cancelling keeps the count");
        assert_eq!(r.schedule(t0), 400 * MS);
        r.schedule_at(t0 + 5 * MS);
        assert_eq!(r.deadline(), Some(t0 + 5 * MS));
        assert_eq!(r.attempt(), 2, "scheduling at an instant counts nothing");
        r.reset();
        assert_eq!((r.attempt(), r.deadline()), (0, None));
    }
}
