//! Admission of new streams ([`Admission`]): a replica takes new streams at a bounded
//! rate, shared fairly between peer addresses, and a stream that finds no token waits a
//! bounded time for one before it is refused (the client retries with backoff, possibly
//! on another replica).
//!
//! istiod (1.30) takes new streams through one token bucket (20–100 per second by core
//! count, burst 1) and lets a stream wait up to 1 s for a token before refusing it with
//! `RESOURCE_EXHAUSTED`; one client opening streams in a loop spends that budget for
//! everyone. Here every stream takes a token from the replica's bucket *and* from its
//! peer address's bucket, which refills at a quarter of the replica's rate: one address
//! gets at most a quarter of the budget, however fast it asks, and the rest stays for the
//! others (a mass reconnect comes from thousands of pod addresses, one stream each).
//! Tokens are reserved ahead, as Go's `rate.Limiter` does: a stream is admitted at once
//! or after the wait its reservation needs, and refused at once (nothing taken) when that
//! wait would be longer than [`MAX_ADMISSION_WAIT`]. So at most about a second's worth of
//! streams wait at any time.
//!
//! The peers table keeps only addresses whose bucket is not full: a full bucket is the
//! same as no entry, and it is swept whenever the table doubled since the last sweep. A
//! bucket is not full only within three seconds of admitting a stream (two to refill its
//! burst, one to pay back what was reserved ahead), and every admission took a replica
//! token too, so the table holds at most the replica's burst plus three seconds of its
//! rate of addresses (plus the sweep's slack), whatever a client does.
//!
//! Pure (the caller passes the clock), so its behaviour is a plain unit test.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Longest a new stream waits for a token before it is refused (istiod's).
pub const MAX_ADMISSION_WAIT: Duration = Duration::from_secs(1);

/// The share of the replica's rate one peer address gets (its bucket's rate).
const PEER_SHARE: f64 = 0.25;

/// Why a stream was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The replica's budget has no token within the wait.
    Replica,
    /// The peer address's share has no token within the wait.
    Peer,
}

impl Refusal {
    /// The `reason` label of `pilotfish_xds_streams_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Replica => "rate_limit",
            Refusal::Peer => "peer_rate_limit",
        }
    }
}

/// A token bucket whose tokens may be reserved ahead (negative).
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            last: now,
        }
    }

    fn refill(&mut self, rate: f64, burst: f64, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(burst);
        self.last = now;
    }

    /// How long until one token is there for the next reservation.
    fn wait(&self, rate: f64) -> Duration {
        if self.tokens >= 1.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((1.0 - self.tokens) / rate)
        }
    }
}

/// Admission of new streams: `rate` per second for the replica (bursts of twice that),
/// a quarter of it (at least 1 per second) per peer address.
#[derive(Clone, Debug)]
pub struct Admission {
    rate: f64,
    burst: f64,
    peer_rate: f64,
    peer_burst: f64,
    max_wait: Duration,
    replica: Bucket,
    peers: HashMap<IpAddr, Bucket>,
    sweep_at: usize,
}

impl Admission {
    /// `rate` new streams per second (bursts of twice that, at least 1), each waiting at
    /// most `max_wait` for its token.
    pub fn new(rate: f64, max_wait: Duration, now: Instant) -> Self {
        let rate = rate.max(f64::MIN_POSITIVE);
        let burst = (rate * 2.0).max(1.0);
        let peer_rate = (rate * PEER_SHARE).max(1.0).min(rate);
        let peer_burst = (peer_rate * 2.0).max(1.0);
        Admission {
            rate,
            burst,
            peer_rate,
            peer_burst,
            max_wait,
            replica: Bucket::full(burst, now),
            peers: HashMap::new(),
            sweep_at: 64,
        }
    }

    /// Reserves a token for a new stream from `peer` (`None`: not known, the replica's
    /// budget alone): how long the stream must wait before it starts, or why it is
    /// refused (then nothing is taken).
    pub fn reserve(&mut self, peer: Option<IpAddr>, now: Instant) -> Result<Duration, Refusal> {
        self.replica.refill(self.rate, self.burst, now);
        let replica_wait = self.replica.wait(self.rate);
        let (peer_rate, peer_burst) = (self.peer_rate, self.peer_burst);
        let mut peer_bucket = peer.map(|ip| {
            let mut bucket = self
                .peers
                .get(&ip)
                .copied()
                .unwrap_or_else(|| Bucket::full(peer_burst, now));
            bucket.refill(peer_rate, peer_burst, now);
            (ip, bucket)
        });
        let peer_wait = peer_bucket
            .as_ref()
            .map_or(Duration::ZERO, |(_, b)| b.wait(peer_rate));
        if peer_wait > self.max_wait {
            return Err(Refusal::Peer);
        }
        if replica_wait > self.max_wait {
            return Err(Refusal::Replica);
        }
        self.replica.tokens -= 1.0;
        if let Some((ip, bucket)) = peer_bucket.as_mut() {
            bucket.tokens -= 1.0;
            self.peers.insert(*ip, *bucket);
            if self.peers.len() > self.sweep_at {
                self.sweep(now);
            }
        }
        Ok(replica_wait.max(peer_wait))
    }

    /// Forgets peers whose bucket has refilled: they are the same as new ones.
    fn sweep(&mut self, now: Instant) {
        let (rate, burst) = (self.peer_rate, self.peer_burst);
        self.peers.retain(|_, bucket| {
            bucket.refill(rate, burst, now);
            bucket.tokens < burst
        });
        self.sweep_at = 2 * self.peers.len() + 64;
    }

    /// Peer addresses currently tracked.
    pub fn peers(&self) -> usize {
        self.peers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, last)))
    }

    fn admitted_now(a: &mut Admission, peer: Option<IpAddr>, now: Instant, tries: usize) -> usize {
        (0..tries)
            .filter(|_| a.reserve(peer, now) == Ok(Duration::ZERO))
            .count()
    }

    #[test]
    fn admits_a_burst_then_waits_then_refuses() {
        let t0 = Instant::now();
        let mut a = Admission::new(10.0, Duration::from_secs(1), t0);
        // Unknown peers share the replica's budget alone: a burst of twice the rate ...
        assert_eq!(admitted_now(&mut a, None, t0, 20), 20);
        // ... then a second's worth of streams wait, each a tenth of a second longer ...
        for i in 1..=10u32 {
            let wait = a.reserve(None, t0).expect("waits");
            assert!(
                (wait.as_secs_f64() - f64::from(i) / 10.0).abs() < 1e-6,
                "{wait:?}"
            );
        }
        // ... and the next would wait longer than a second: refused, nothing taken.
        assert_eq!(a.reserve(None, t0), Err(Refusal::Replica));
        assert_eq!(a.reserve(None, t0), Err(Refusal::Replica));
        // Two seconds later the reservations are paid and half the burst is back.
        let later = t0 + Duration::from_secs(2);
        assert_eq!(admitted_now(&mut a, None, later, 20), 10);
        let much_later = t0 + Duration::from_secs(3600);
        assert_eq!(
            admitted_now(&mut a, None, much_later, 100),
            20,
            "never more than the burst"
        );
    }

    #[test]
    fn one_peer_gets_a_quarter_and_cannot_starve_the_others() {
        let t0 = Instant::now();
        let mut a = Admission::new(40.0, Duration::from_secs(1), t0);
        // A greedy peer asks 1,000 times at once: its burst (20) at once, a second of its
        // rate (10) waiting, the rest refused as its own.
        let results: Vec<_> = (0..1000).map(|_| a.reserve(ip(1), t0)).collect();
        let now = results.iter().filter(|r| **r == Ok(Duration::ZERO)).count();
        let waiting = results
            .iter()
            .filter(|r| matches!(r, Ok(w) if !w.is_zero()))
            .count();
        let refused = results.iter().filter(|r| **r == Err(Refusal::Peer)).count();
        assert_eq!((now, waiting, refused), (20, 10, 970));
        // The replica's budget (burst 80) has 50 left for everyone else, one each.
        let others = (2..=51)
            .filter(|i| a.reserve(ip(*i), t0) == Ok(Duration::ZERO))
            .count();
        assert_eq!(others, 50);
        assert!(
            a.reserve(ip(60), t0).is_ok_and(|w| !w.is_zero()),
            "then they wait"
        );
    }

    #[test]
    fn the_peers_table_stays_bounded_whatever_the_addresses() {
        let t0 = Instant::now();
        let mut a = Admission::new(100.0, Duration::from_secs(1), t0);
        let mut most = 0;
        // 100,000 distinct addresses over 100 s, 1,000 a second: ten times the rate.
        for i in 0..100_000u32 {
            let now = t0 + Duration::from_millis(u64::from(i));
            let addr = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            let _ = a.reserve(Some(addr), now);
            most = most.max(a.peers());
        }
        // At most ~5 s of the replica's rate live, plus the sweep's slack (2× + 64).
        assert!(most <= 2 * 500 + 64 + 1, "{most}");
    }

    #[test]
    fn a_small_rate_still_admits_one_per_peer() {
        let t0 = Instant::now();
        let mut a = Admission::new(1.0, Duration::from_secs(1), t0);
        assert_eq!(admitted_now(&mut a, ip(1), t0, 2), 2);
        assert_eq!(a.reserve(ip(2), t0), Ok(Duration::from_secs(1)));
        assert_eq!(a.reserve(ip(3), t0), Err(Refusal::Replica));
    }
}
