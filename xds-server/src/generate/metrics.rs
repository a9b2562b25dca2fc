//! Metrics of the generators (default Prometheus registry, `pilotfish_` names: Istio has no
//! equivalents). The snapshot updates them from the generators' findings.

use std::sync::LazyLock;

use prometheus::{IntCounterVec, Opts, register_int_counter_vec};

// Registration fails only on a duplicate or malformed definition, a programming error the
// unit test below catches.

/// `pilotfish_xds_inconsistent_references_total{type}`: references between generated
/// resources that did not resolve (a bug: the reference was dropped before sending).
pub static INCONSISTENT_REFERENCES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_xds_inconsistent_references_total",
            "Generated references (route->cluster, listener->route, cluster->endpoints) that did not resolve; each is a bug, replaced before sending."
        ),
        &["type"]
    )
    .expect("register pilotfish_xds_inconsistent_references_total")
});

/// `pilotfish_xds_proxyless_downgrades_total{feature}`: configured features left out (or
/// replaced) for proxyless gRPC clients because gRPC's xDS client would reject them.
pub static PROXYLESS_DOWNGRADES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_xds_proxyless_downgrades_total",
            "Configured features left out or replaced for proxyless gRPC clients, which would reject them."
        ),
        &["feature"]
    )
    .expect("register pilotfish_xds_proxyless_downgrades_total")
});

/// `pilotfish_xds_unresolved_destinations_total`: route destinations naming a host or
/// port the proxy has no cluster for; the route answers 503 instead.
pub static UNRESOLVED_DESTINATIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_xds_unresolved_destinations_total",
            "Route destinations without a cluster for the proxy (unknown host or port); such routes answer 503."
        ),
        &["kind"]
    )
    .expect("register pilotfish_xds_unresolved_destinations_total")
});

/// `pilotfish_xds_generations_total{part}`: parts generated (cache misses); the rest of
/// the requests were served from the per-snapshot cache.
pub static GENERATIONS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_xds_generations_total",
            "Resource parts generated per scope (cache misses of the per-snapshot cache)."
        ),
        &["part"]
    )
    .expect("register pilotfish_xds_generations_total")
});

/// `pilotfish_xds_unsupported_proxies_total{type}`: ADS streams of proxies Pilotfish does
/// not configure yet (`router`: gateways), which get an empty configuration.
pub static UNSUPPORTED_PROXIES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_xds_unsupported_proxies_total",
            "ADS streams of proxies Pilotfish does not configure yet (type=router: gateways); they get an empty configuration."
        ),
        &["type"]
    )
    .expect("register pilotfish_xds_unsupported_proxies_total")
});

/// Registers every generator metric now, so `/metrics` lists them before first use.
pub fn register_all() {
    LazyLock::force(&UNSUPPORTED_PROXIES);
    LazyLock::force(&INCONSISTENT_REFERENCES);
    LazyLock::force(&PROXYLESS_DOWNGRADES);
    LazyLock::force(&UNRESOLVED_DESTINATIONS);
    LazyLock::force(&GENERATIONS);
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_metric_registers() {
        super::register_all();
        super::PROXYLESS_DOWNGRADES
            .with_label_values(&["maglev"])
            .inc();
        super::INCONSISTENT_REFERENCES
            .with_label_values(&["rds"])
            .inc();
        super::UNRESOLVED_DESTINATIONS
            .with_label_values(&["http"])
            .inc();
        super::GENERATIONS.with_label_values(&["routes"]).inc();
        super::UNSUPPORTED_PROXIES
            .with_label_values(&["router"])
            .inc();
        let names: Vec<String> = prometheus::gather()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        for expected in [
            "pilotfish_xds_inconsistent_references_total",
            "pilotfish_xds_proxyless_downgrades_total",
            "pilotfish_xds_unresolved_destinations_total",
            "pilotfish_xds_generations_total",
            "pilotfish_xds_unsupported_proxies_total",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected} missing");
        }
    }
}
