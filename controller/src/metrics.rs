//! Prometheus metrics of the controller itself (the pipeline's and the bus's live in
//! `pilotfish_shared`), in the default registry.

use std::sync::LazyLock;

use prometheus::{IntGauge, register_int_gauge};

/// 1 while this replica holds the Lease (always 1 in `--config-dir` mode). Registration
/// fails only on a duplicate name, a programming error the test below catches.
pub static LEADER: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "pilotfish_leader",
        "1 while this controller replica is the leader."
    )
    .expect("register pilotfish_leader")
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leader_gauge_renders() {
        LEADER.set(1);
        assert!(pilotfish_shared::telemetry::render_metrics().contains("pilotfish_leader 1"));
    }
}
