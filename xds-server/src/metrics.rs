//! Every Prometheus metric of the ADS engine, in the default registry. Names follow
//! Istio's where Istio has one, so existing Pilot dashboards work unchanged; the rest use
//! the `pilotfish_` prefix. The `type` label takes Istio's short names (`cds`, `eds`,
//! `lds`, `rds`).

use std::sync::LazyLock;

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    register_histogram, register_histogram_vec, register_int_counter, register_int_counter_vec,
    register_int_gauge,
};

/// Buckets for push and convergence times: 1 ms to 30 s (Istio uses a similar range).
const TIME_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0,
];

// Registration only fails on a duplicate name or an invalid definition, both programming
// errors caught by the unit test below; panicking at first use is the right response.

/// `pilot_xds_pushes{type}`: responses sent, by type.
pub static XDS_PUSHES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilot_xds_pushes",
            "xDS responses sent, by type (cds, eds, lds, rds)."
        ),
        &["type"]
    )
    .expect("register pilot_xds_pushes")
});

/// `pilot_xds_push_time{type}`: time to compute one response, by type.
pub static XDS_PUSH_TIME: LazyLock<HistogramVec> = LazyLock::new(|| {
    register_histogram_vec!(
        HistogramOpts::new(
            "pilot_xds_push_time",
            "Seconds to compute the responses of one push, by type."
        )
        .buckets(TIME_BUCKETS.to_vec()),
        &["type"]
    )
    .expect("register pilot_xds_push_time")
});

/// `pilotfish_xds_sent_bytes_total{type}`: bytes of responses handed to the transport.
pub static XDS_SENT_BYTES: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_xds_sent_bytes_total",
            "Bytes of xDS responses handed to the transport (gRPC framing included), by type."
        ),
        &["type"]
    )
    .expect("register pilotfish_xds_sent_bytes_total")
});

/// `pilotfish_xds_queued_bytes`: bytes of responses handed to the response bodies and not
/// yet taken by HTTP/2 (at most one response per stream).
pub static QUEUED_BYTES: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!(
        "pilotfish_xds_queued_bytes",
        "Bytes of xDS responses computed and not yet taken by HTTP/2 (at most one response per stream)."
    )
    .expect("register pilotfish_xds_queued_bytes")
});

/// `pilot_proxy_convergence_time`: from a snapshot's arrival on this replica until all
/// responses for it were handed to one stream.
pub static PROXY_CONVERGENCE_TIME: LazyLock<Histogram> = LazyLock::new(|| {
    register_histogram!(
        HistogramOpts::new(
            "pilot_proxy_convergence_time",
            "Seconds from a snapshot arriving on this replica until all its responses were handed to a stream."
        )
        .buckets(TIME_BUCKETS.to_vec())
    )
    .expect("register pilot_proxy_convergence_time")
});

/// `pilot_xds`: connected ADS streams on this replica.
pub static XDS_CLIENTS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!("pilot_xds", "ADS streams connected to this replica.")
        .expect("register pilot_xds")
});

/// `pilot_total_xds_rejects{type}`: NACKs received, by type.
pub static XDS_REJECTS: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilot_total_xds_rejects",
            "xDS responses rejected (NACKed) by proxies, by type."
        ),
        &["type"]
    )
    .expect("register pilot_total_xds_rejects")
});

/// `pilotfish_xds_stale_nonce_total`: requests ignored because their nonce was not the latest.
pub static STALE_NONCES: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "pilotfish_xds_stale_nonce_total",
        "Requests whose response_nonce was not the latest sent for their type (ignored)."
    )
    .expect("register pilotfish_xds_stale_nonce_total")
});

/// `pilotfish_xds_unknown_type_total`: requests for a type URL this server does not serve.
pub static UNKNOWN_TYPES: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "pilotfish_xds_unknown_type_total",
        "Requests for a type URL this server does not serve (ignored)."
    )
    .expect("register pilotfish_xds_unknown_type_total")
});

/// `pilotfish_xds_invalid_node_total`: streams refused because the first request had no node id.
pub static INVALID_NODES: LazyLock<IntCounter> = LazyLock::new(|| {
    register_int_counter!(
        "pilotfish_xds_invalid_node_total",
        "ADS streams refused because the first request carried no node id."
    )
    .expect("register pilotfish_xds_invalid_node_total")
});

/// `pilotfish_xds_connections`: open ADS (HTTP/2) connections.
pub static ADS_CONNECTIONS: LazyLock<IntGauge> = LazyLock::new(|| {
    register_int_gauge!("pilotfish_xds_connections", "Open ADS HTTP/2 connections.")
        .expect("register pilotfish_xds_connections")
});

/// `pilotfish_xds_connections_ended_total{reason}`: connections this replica ended
/// (`max_age`, `drain`) with GOAWAY.
pub static ADS_CONNECTIONS_ENDED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_xds_connections_ended_total",
            "ADS connections ended by this replica with GOAWAY, by reason (max_age, drain)."
        ),
        &["reason"]
    )
    .expect("register pilotfish_xds_connections_ended_total")
});

/// `pilotfish_xds_connections_refused_total{reason}`: ADS connections closed before
/// serving anything: beyond the connection cap (`connection_limit`, closed at once), no
/// HTTP/2 preface and SETTINGS within the handshake timeout (`handshake_timeout`), or
/// something else than HTTP/2 (`not_http2`).
pub static ADS_CONNECTIONS_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_xds_connections_refused_total",
            "ADS connections closed before serving anything, by reason (connection_limit, handshake_timeout, not_http2)."
        ),
        &["reason"]
    )
    .expect("register pilotfish_xds_connections_refused_total")
});

/// `pilotfish_xds_streams_refused_total{reason}`: new ADS streams refused — with
/// `RESOURCE_EXHAUSTED` when admission found no token within its wait (`rate_limit`: the
/// replica's budget; `peer_rate_limit`: the peer address's share), `UNAVAILABLE`
/// (`draining`) so the client retries another replica, or with
/// `PERMISSION_DENIED` (`unauthorized_node`: the node claims a namespace or service
/// account its authenticated identity does not have), or streams ended past a per-stream
/// cap (`over_limit`: type URLs, `INVALID_ARGUMENT`; `subscription_limit`: subscribed
/// names, `RESOURCE_EXHAUSTED`).
pub static STREAMS_REFUSED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    register_int_counter_vec!(
        Opts::new(
            "pilotfish_xds_streams_refused_total",
            "ADS streams refused or ended, by reason (rate_limit, peer_rate_limit: RESOURCE_EXHAUSTED; draining: UNAVAILABLE; unauthorized_node: PERMISSION_DENIED; over_limit: INVALID_ARGUMENT; subscription_limit: RESOURCE_EXHAUSTED)."
        ),
        &["reason"]
    )
    .expect("register pilotfish_xds_streams_refused_total")
});

/// Registers every metric now, so `/metrics` lists them before the first stream.
pub fn register_all() {
    LazyLock::force(&XDS_PUSHES);
    LazyLock::force(&XDS_PUSH_TIME);
    LazyLock::force(&PROXY_CONVERGENCE_TIME);
    LazyLock::force(&XDS_CLIENTS);
    LazyLock::force(&XDS_REJECTS);
    LazyLock::force(&STALE_NONCES);
    LazyLock::force(&UNKNOWN_TYPES);
    LazyLock::force(&INVALID_NODES);
    LazyLock::force(&ADS_CONNECTIONS);
    LazyLock::force(&ADS_CONNECTIONS_ENDED);
    LazyLock::force(&ADS_CONNECTIONS_REFUSED);
    LazyLock::force(&STREAMS_REFUSED);
    LazyLock::force(&XDS_SENT_BYTES);
    LazyLock::force(&QUEUED_BYTES);
    crate::generate::metrics::register_all();
    crate::secure::metrics::register_all();
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_metric_registers_under_its_istio_name() {
        super::register_all();
        super::XDS_PUSHES.with_label_values(&["cds"]).inc();
        super::XDS_REJECTS.with_label_values(&["cds"]).inc();
        super::XDS_PUSH_TIME
            .with_label_values(&["cds"])
            .observe(0.1);
        let names: Vec<String> = prometheus::gather()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        for expected in [
            "pilot_xds_pushes",
            "pilot_xds_push_time",
            "pilot_proxy_convergence_time",
            "pilot_xds",
            "pilot_total_xds_rejects",
            "pilotfish_xds_stale_nonce_total",
            "pilotfish_xds_unknown_type_total",
        ] {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} missing from {names:?}"
            );
        }
    }
}
