//! Prometheus metrics of the snapshot bus, registered in the default registry (the
//! binaries' `/metrics` encodes `prometheus::gather()`).
//!
//! | name | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `pilotfish_snapshot_version` | gauge | `role` (publisher/follower) | version last published / served |
//! | `pilotfish_snapshot_blob_bytes` | gauge | `role` | size of that blob |
//! | `pilotfish_snapshot_publish_duration_seconds` | histogram | | one `publish()` call, Redis round trips included |
//! | `pilotfish_snapshot_publishes_total` | counter | `outcome` (published/unchanged/fenced/error) | publish calls |
//! | `pilotfish_snapshot_follow_latency_seconds` | histogram | | publisher's clock at publish → follower serves the decoded snapshot |
//! | `pilotfish_snapshot_rejected_total` | counter | `reason` | blobs a follower refused: `unsigned`, `unknown_key`, `bad_signature` (not from a key it trusts), `too_large`/`oversized`, `corrupt`, `hash_mismatch` (not the blob `latest` names), `missing`, `malformed_latest` (each read of an unparsable `latest`), … |
//! | `pilotfish_redis_errors_total` | counter | `operation` | failed Redis operations |
//! | `pilotfish_redis_connected` | gauge | | 1 while a follower's Redis session is up |
//! | `pilotfish_snapshot_seconds_since_last_read` | gauge | | since a follower last read `latest` successfully (computed at scrape time) |
//!
//! Several followers in one process (tests, benches) share these series; a replica has one.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

use prometheus::core::{Collector, Desc};

use crate::telemetry::registered;
use prometheus::proto::MetricFamily;
use prometheus::{
    Gauge, Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    exponential_buckets,
};

fn latency_buckets() -> Vec<f64> {
    // 1 ms … ~33 s.
    exponential_buckets(0.001, 2.0, 16).unwrap_or_default()
}

pub(crate) static SNAPSHOT_VERSION: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    registered(
        IntGaugeVec::new(
            Opts::new(
                "pilotfish_snapshot_version",
                "Snapshot version last published or served.",
            ),
            &["role"],
        )
        .expect("static metric definition"),
    )
});

pub(crate) static BLOB_BYTES: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    registered(
        IntGaugeVec::new(
            Opts::new(
                "pilotfish_snapshot_blob_bytes",
                "Size of the snapshot blob last published or served.",
            ),
            &["role"],
        )
        .expect("static metric definition"),
    )
});

pub(crate) static PUBLISH_DURATION: LazyLock<Histogram> = LazyLock::new(|| {
    registered(
        Histogram::with_opts(
            HistogramOpts::new(
                "pilotfish_snapshot_publish_duration_seconds",
                "Duration of one snapshot publish, Redis round trips included.",
            )
            .buckets(latency_buckets()),
        )
        .expect("static metric definition"),
    )
});

pub(crate) static PUBLISHES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    registered(
        IntCounterVec::new(
            Opts::new(
                "pilotfish_snapshot_publishes_total",
                "Snapshot publish calls by outcome.",
            ),
            &["outcome"],
        )
        .expect("static metric definition"),
    )
});

pub(crate) static FOLLOW_LATENCY: LazyLock<Histogram> = LazyLock::new(|| {
    registered(
        Histogram::with_opts(
            HistogramOpts::new(
                "pilotfish_snapshot_follow_latency_seconds",
                "From the publisher's clock at publish to the follower serving the decoded snapshot.",
            )
            .buckets(latency_buckets()),
        )
        .expect("static metric definition"),
    )
});

pub(crate) static REJECTED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    registered(
        IntCounterVec::new(
            Opts::new(
                "pilotfish_snapshot_rejected_total",
                "Snapshot blobs a follower refused, by reason.",
            ),
            &["reason"],
        )
        .expect("static metric definition"),
    )
});

pub(crate) static REDIS_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    registered(
        IntCounterVec::new(
            Opts::new(
                "pilotfish_redis_errors_total",
                "Failed Redis operations, by operation.",
            ),
            &["operation"],
        )
        .expect("static metric definition"),
    )
});

pub(crate) static REDIS_CONNECTED: LazyLock<IntGauge> = LazyLock::new(|| {
    registered(
        IntGauge::new(
            "pilotfish_redis_connected",
            "1 while the follower's Redis session is up.",
        )
        .expect("static metric definition"),
    )
});

/// Blobs rejected so far in this process for `reason` (tests and debug pages).
pub fn rejected_total(reason: &str) -> u64 {
    REJECTED.with_label_values(&[reason]).get()
}

/// Tracks the last successful read of `latest`; the gauge is computed at scrape time so it
/// keeps growing while Redis is unreachable (a stored gauge would freeze).
pub(crate) struct LastRead {
    gauge: Gauge,
    state: Mutex<Option<ReadTimes>>,
}

#[derive(Clone, Copy)]
struct ReadTimes {
    started: Instant,
    last_success: Option<Instant>,
}

impl LastRead {
    /// A follower started: from now on the gauge is exported.
    pub(crate) fn follower_started(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_none() {
            *state = Some(ReadTimes {
                started: Instant::now(),
                last_success: None,
            });
        }
    }

    pub(crate) fn record_success(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let times = state.get_or_insert(ReadTimes {
            started: now,
            last_success: None,
        });
        times.last_success = Some(now);
    }
}

impl Collector for LastRead {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let state = *self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(times) = state else {
            return Vec::new();
        };
        // Never read yet: count from the follower's start, so "stuck since boot" alerts too.
        let since = times.last_success.unwrap_or(times.started).elapsed();
        self.gauge.set(since.as_secs_f64());
        self.gauge.collect()
    }
}

pub(crate) static LAST_READ: LazyLock<Arc<LastRead>> = LazyLock::new(|| {
    let last_read = Arc::new(LastRead {
        gauge: Gauge::new(
            "pilotfish_snapshot_seconds_since_last_read",
            "Seconds since a follower last read the latest snapshot reference successfully.",
        )
        .expect("static metric definition"),
        state: Mutex::new(None),
    });
    if let Err(e) = prometheus::register(Box::new(SharedLastRead(last_read.clone()))) {
        tracing::warn!(error = %e, "bus metric not registered");
    }
    last_read
});

/// The registry's handle to the process-wide [`LastRead`].
struct SharedLastRead(Arc<LastRead>);

impl Collector for SharedLastRead {
    fn desc(&self) -> Vec<&Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.0.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_register_and_export_under_their_names() {
        SNAPSHOT_VERSION.with_label_values(&["follower"]).set(7);
        REJECTED.with_label_values(&["corrupt"]).inc();
        LAST_READ.follower_started();
        LAST_READ.record_success();
        let names: Vec<String> = prometheus::gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        for expected in [
            "pilotfish_snapshot_version",
            "pilotfish_snapshot_rejected_total",
            "pilotfish_snapshot_seconds_since_last_read",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} missing from {names:?}"
            );
        }
    }
}
