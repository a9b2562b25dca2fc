//! Prometheus metrics of the controller itself (the pipeline's — debounce merges, build
//! time, invalid configs by kind — and the bus's — publish time — live in
//! `pilotfish_shared`), in the default registry. Istio's name where Istio has one
//! (`pilot_k8s_cfg_events`), `pilotfish_` names for the rest.

use std::sync::LazyLock;

use prometheus::{
    IntCounter, IntCounterVec, IntGauge, Opts, register_int_counter, register_int_counter_vec,
    register_int_gauge,
};

// Registration fails only on a duplicate name or a malformed definition: programming
// errors that the unit test below catches, so a panic at first use is the right response.

/// 1 while this replica holds the Lease (always 1 in `--config-dir` mode).
pub static LEADER: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "pilotfish_leader",
        "1 while this controller replica is the leader."
    )
    .expect("register pilotfish_leader")
});

/// Changes of watched Kubernetes objects that reached the stores, as Istio counts them:
/// `type` is the kind, `event` one of `add`, `update`, `delete`.
pub static K8S_CFG_EVENTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilot_k8s_cfg_events",
            "Events from the Kubernetes API that changed the controller's view, by kind and event."
        ),
        &["type", "event"]
    )
    .expect("register pilot_k8s_cfg_events")
});

/// Updates dropped before the debounce because nothing the mesh reads changed, by kind
/// and reason (`unchanged`: a no-op or metadata-only update; `status`: only the status
/// changed, e.g. our own status write coming back).
pub static K8S_IGNORED_UPDATES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_k8s_ignored_updates_total",
            "Kubernetes updates dropped before the debounce because the mesh does not see them, by kind and reason."
        ),
        &["type", "reason"]
    )
    .expect("register pilotfish_k8s_ignored_updates_total")
});

/// Watch failures (they are retried with backoff), by kind.
pub static K8S_WATCH_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_k8s_watch_errors_total",
            "Failed list or watch requests against the Kubernetes API (retried with backoff), by kind."
        ),
        &["type"]
    )
    .expect("register pilotfish_k8s_watch_errors_total")
});

/// Objects dropped on arrival because MeshConfig's `discoverySelectors` leave their
/// namespace out, by kind.
pub static K8S_DISCOVERY_DROPPED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_k8s_discovery_filtered_total",
            "Kubernetes objects dropped on arrival because discoverySelectors do not select their namespace, by kind."
        ),
        &["type"]
    )
    .expect("register pilotfish_k8s_discovery_filtered_total")
});

/// Lists started afresh because the namespace selection changed, by kind.
pub static K8S_DISCOVERY_RELISTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_k8s_discovery_relists_total",
            "Watches restarted with a fresh list because the discoverySelectors' namespace selection changed, by kind."
        ),
        &["type"]
    )
    .expect("register pilotfish_k8s_discovery_relists_total")
});

/// Objects that could not be read into their type, by kind (skipped; the watch goes on).
pub static K8S_DECODE_ERRORS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_k8s_decode_errors_total",
            "Objects from the Kubernetes API that could not be decoded and were skipped, by kind."
        ),
        &["type"]
    )
    .expect("register pilotfish_k8s_decode_errors_total")
});

/// Lease transitions of this replica (`acquired`, `lost`).
pub static LEADER_TRANSITIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_leader_transitions_total",
            "Leadership changes of this controller replica (acquired, lost)."
        ),
        &["transition"]
    )
    .expect("register pilotfish_leader_transitions_total")
});

/// Terms in which this replica stood down: it held the Lease, yet another writer had a
/// newer epoch (a stale view, or a second controller on the same Redis prefix).
pub static STOOD_DOWN: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "pilotfish_leader_stood_down_total",
        "Terms this controller stopped publishing in because another writer had a newer epoch while it held the Lease."
    )
    .expect("register pilotfish_leader_stood_down_total")
});

/// Status subresource writes, by kind and result (`written`, `conflict`, `error`).
pub static STATUS_WRITES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_status_writes_total",
            "Writes of the Reconciled condition through the status subresource, by kind and result."
        ),
        &["kind", "result"]
    )
    .expect("register pilotfish_status_writes_total")
});

/// Kubernetes Events emitted, by reason.
pub static EVENTS_EMITTED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_k8s_events_total",
            "Kubernetes Events emitted about configuration objects, by reason and result."
        ),
        &["reason", "result"]
    )
    .expect("register pilotfish_k8s_events_total")
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_registers_and_renders() {
        LEADER.set(1);
        K8S_CFG_EVENTS
            .with_label_values(&["VirtualService", "add"])
            .inc();
        K8S_IGNORED_UPDATES
            .with_label_values(&["VirtualService", "status"])
            .inc();
        K8S_WATCH_ERRORS.with_label_values(&["Lease"]).inc();
        K8S_DISCOVERY_DROPPED.with_label_values(&["Pod"]).inc();
        K8S_DISCOVERY_RELISTS.with_label_values(&["Pod"]).inc();
        K8S_DECODE_ERRORS
            .with_label_values(&["VirtualService"])
            .inc();
        LEADER_TRANSITIONS.with_label_values(&["acquired"]).inc();
        STOOD_DOWN.inc();
        STATUS_WRITES
            .with_label_values(&["VirtualService", "written"])
            .inc();
        EVENTS_EMITTED
            .with_label_values(&["InvalidConfig", "emitted"])
            .inc();
        let text = pilotfish_shared::telemetry::render_metrics();
        assert!(text.contains("pilotfish_leader 1"), "{text}");
        for name in [
            "pilot_k8s_cfg_events",
            "pilotfish_k8s_ignored_updates_total",
            "pilotfish_k8s_watch_errors_total",
            "pilotfish_k8s_decode_errors_total",
            "pilotfish_leader_transitions_total",
            "pilotfish_leader_stood_down_total",
            "pilotfish_status_writes_total",
            "pilotfish_k8s_events_total",
        ] {
            assert!(text.contains(name), "{name} missing");
        }
    }
}
