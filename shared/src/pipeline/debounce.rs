//! Debouncing of configuration events: a burst of changes becomes one rebuild, started
//! once events have stopped for `after`, but never later than `max` after the burst's
//! first event (so a steady trickle of changes cannot starve publishing). Pure: callers
//! pass the clock in, so every rule is a plain unit test.

use std::time::{Duration, Instant};

/// What changed, as far as the rebuild cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeClass {
    /// EndpointSlices or Pods only: the builder's cheap path applies.
    Endpoints,
    /// Anything else (configs, services, namespaces, mesh config).
    Config,
}

/// One burst of events, due for a rebuild.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Burst {
    /// Events merged into this rebuild.
    pub events: u64,
    /// Every event of the burst was an endpoint change.
    pub endpoints_only: bool,
    /// From the first event to the rebuild.
    pub waited: Duration,
}

/// Debounce state for one stream of events.
#[derive(Clone, Debug)]
pub struct Debouncer {
    after: Duration,
    max: Duration,
    first: Option<Instant>,
    last: Option<Instant>,
    events: u64,
    endpoints_only: bool,
}

impl Debouncer {
    pub fn new(after: Duration, max: Duration) -> Self {
        Debouncer {
            after,
            max: max.max(after),
            first: None,
            last: None,
            events: 0,
            endpoints_only: true,
        }
    }

    /// Records one event at `now`.
    pub fn event(&mut self, now: Instant, class: ChangeClass) {
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.events += 1;
        self.endpoints_only &= class == ChangeClass::Endpoints;
    }

    /// When the pending burst is due; `None` when nothing is pending.
    pub fn deadline(&self) -> Option<Instant> {
        let (first, last) = (self.first?, self.last?);
        Some((last + self.after).min(first + self.max))
    }

    /// The pending burst if it is due at `now`, resetting the state.
    pub fn take_if_due(&mut self, now: Instant) -> Option<Burst> {
        let deadline = self.deadline()?;
        if now < deadline {
            return None;
        }
        let burst = Burst {
            events: self.events,
            endpoints_only: self.endpoints_only,
            waited: now.saturating_duration_since(self.first?),
        };
        *self = Debouncer::new(self.after, self.max);
        Some(burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn quiet_period_triggers_one_rebuild_for_a_burst() {
        let t0 = Instant::now();
        let mut d = Debouncer::new(100 * MS, 1000 * MS);
        assert_eq!(d.deadline(), None);
        d.event(t0, ChangeClass::Config);
        d.event(t0 + 50 * MS, ChangeClass::Config);
        assert_eq!(d.deadline(), Some(t0 + 150 * MS));
        assert_eq!(d.take_if_due(t0 + 149 * MS), None);
        let burst = d.take_if_due(t0 + 150 * MS).unwrap();
        assert_eq!(burst.events, 2);
        assert!(!burst.endpoints_only);
        assert_eq!(burst.waited, 150 * MS);
        assert_eq!(d.deadline(), None, "state resets after a burst");
    }

    #[test]
    fn a_steady_trickle_is_cut_at_max() {
        let t0 = Instant::now();
        let mut d = Debouncer::new(100 * MS, 1000 * MS);
        let mut t = t0;
        for _ in 0..30 {
            d.event(t, ChangeClass::Endpoints);
            t += 50 * MS;
        }
        assert_eq!(d.deadline(), Some(t0 + 1000 * MS));
        let burst = d.take_if_due(t0 + 1000 * MS).unwrap();
        assert_eq!(burst.events, 30);
        assert!(burst.endpoints_only);
    }

    #[test]
    fn one_config_event_makes_the_burst_a_full_rebuild() {
        let t0 = Instant::now();
        let mut d = Debouncer::new(10 * MS, 100 * MS);
        d.event(t0, ChangeClass::Endpoints);
        d.event(t0, ChangeClass::Config);
        d.event(t0, ChangeClass::Endpoints);
        assert!(!d.take_if_due(t0 + 10 * MS).unwrap().endpoints_only);
    }

    #[test]
    fn max_below_after_is_raised_to_after() {
        let t0 = Instant::now();
        let mut d = Debouncer::new(100 * MS, 10 * MS);
        d.event(t0, ChangeClass::Config);
        assert_eq!(d.deadline(), Some(t0 + 100 * MS));
    }
}
