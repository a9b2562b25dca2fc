//! Prometheus metrics of the snapshot pipeline (debounce, build, validation), in the
//! default registry, under `pilotfish_` names.

use std::sync::LazyLock;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts,
    register_histogram_vec, register_int_counter, register_int_counter_vec, register_int_gauge_vec,
};

// Registration fails only on a duplicate name or a malformed definition: programming
// errors that the unit test below catches, so a panic at first use is the right response.

/// Events merged into a rebuild beyond the first of each burst.
pub static DEBOUNCE_MERGED: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "pilotfish_debounce_merged_events_total",
        "Configuration events merged into an already pending rebuild by the debounce."
    )
    .expect("register pilotfish_debounce_merged_events_total")
});

/// Build + encode time of one snapshot, by path (`full`, `endpoints`).
pub static BUILD_TIME: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        HistogramOpts::new(
            "pilotfish_build_seconds",
            "Seconds to build and encode one snapshot, by path."
        )
        .buckets(vec![
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0
        ]),
        &["path"]
    )
    .expect("register pilotfish_build_seconds")
});

/// Snapshots built, by path (`full`, `endpoints`).
pub static REBUILDS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_rebuilds_total",
            "Snapshots built, by path (full, endpoints)."
        ),
        &["path"]
    )
    .expect("register pilotfish_rebuilds_total")
});

/// Objects currently rejected (with at least one error), by kind.
pub static INVALID_CONFIGS: LazyLock<IntGaugeVec> = LazyLock::new(|| {
    register_int_gauge_vec!(
        Opts::new(
            "pilotfish_invalid_configs",
            "Objects with validation errors, by kind."
        ),
        &["kind"]
    )
    .expect("register pilotfish_invalid_configs")
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_registers_and_renders() {
        DEBOUNCE_MERGED.inc();
        BUILD_TIME.with_label_values(&["full"]).observe(0.1);
        INVALID_CONFIGS
            .with_label_values(&["VirtualService"])
            .set(1);
        REBUILDS.with_label_values(&["full"]).inc();
        let text = crate::telemetry::render_metrics();
        for name in [
            "pilotfish_debounce_merged_events_total",
            "pilotfish_build_seconds",
            "pilotfish_invalid_configs",
            "pilotfish_rebuilds_total",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
    }
}
