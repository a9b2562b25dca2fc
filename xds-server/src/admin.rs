//! The xDS replica's admin HTTP server (port 15014): `/metrics`, `/healthz`, `/readyz`
//! (ready once a snapshot is loaded, and staying ready while the bus is unreachable up to
//! `--stale-after`),
//! `/debug/adsz`, `/debug/syncz`, `/debug/config_dump?proxyID=`, `/debug/push_status`,
//! `/debug/snapshot`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pilotfish_shared::bus::FollowerStatus;
use pilotfish_shared::telemetry;
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::ads::ConnectionRegistry;
use crate::feed::FeedState;
use crate::generate::config_dump;

/// What the admin pages read.
#[derive(Clone)]
pub struct AdminContext {
    pub registry: ConnectionRegistry,
    pub feed: Arc<FeedState>,
    /// The bus follower's health.
    pub follower: Arc<dyn Fn() -> FollowerStatus + Send + Sync>,
    pub replica_name: String,
    /// The ADS drain, cancelled on SIGTERM: readiness turns false so no new clients are
    /// sent here.
    pub draining: CancellationToken,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(ctx): State<AdminContext>) -> Response {
    if ctx.draining.is_cancelled() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "draining: shutting down, clients are moving to other replicas\n",
        )
            .into_response();
    }
    let status = (ctx.follower)();
    let code = if status.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, format!("{}\n", status.detail())).into_response()
}

async fn metrics_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        telemetry::render_metrics(),
    )
        .into_response()
}

async fn adsz(State(ctx): State<AdminContext>) -> Response {
    axum::Json(ctx.registry.adsz()).into_response()
}

async fn syncz(State(ctx): State<AdminContext>) -> Response {
    axum::Json(ctx.registry.syncz()).into_response()
}

async fn push_status(State(ctx): State<AdminContext>) -> Response {
    // How many open streams have already been served each snapshot; for a snapshot every
    // open stream was served, how long after its arrival the last response went out.
    let streams = ctx.registry.streams();
    let pushes: Vec<_> = ctx
        .feed
        .history()
        .into_iter()
        .map(|p| {
            let served: Vec<_> = streams
                .iter()
                .filter(|s| s.snapshot_version >= Some(p.version))
                .collect();
            let last_sent = served
                .iter()
                .filter(|s| s.snapshot_version == Some(p.version))
                .flat_map(|s| {
                    s.types
                        .iter()
                        .filter_map(|t| t.last_sent.as_ref().map(|l| l.at))
                })
                .filter(|at| *at >= p.received)
                .max();
            let pushed_to_all_ms = (served.len() == streams.len())
                .then(|| last_sent.and_then(|at| at.duration_since(p.received).ok()))
                .flatten()
                .map(|d| d.as_secs_f64() * 1000.0);
            json!({
                "push": p,
                "streams_served": served.len(),
                "streams_open": streams.len(),
                "pushed_to_all_ms": pushed_to_all_ms,
            })
        })
        .collect();
    axum::Json(json!({"replica": ctx.replica_name, "pushes": pushes})).into_response()
}

async fn snapshot(State(ctx): State<AdminContext>) -> Response {
    let status = (ctx.follower)();
    let Some((reference, snap)) = ctx.feed.current() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": "no snapshot yet", "bus": status.detail()})),
        )
            .into_response();
    };
    let data = snap.push_context().data();
    axum::Json(json!({
        "version": reference.version,
        "hash": reference.hash,
        "epoch": reference.epoch,
        "published_at_ms": reference.published_at_ms,
        "bus": status.detail(),
        "rejected_blobs": status.rejected,
        "services": data.services.len(),
        "virtual_services": data.virtual_services.iter().map(|v| format!("{}/{}", v.meta.namespace, v.meta.name)).collect::<Vec<_>>(),
        "destination_rules": data.destination_rules.iter().map(|d| format!("{}/{}", d.meta.namespace, d.meta.name)).collect::<Vec<_>>(),
        "peer_authentications": data.peer_authentications.iter().map(|p| format!("{}/{}", p.meta.namespace, p.meta.name)).collect::<Vec<_>>(),
        "request_authentications": data.request_authentications.iter().map(|r| format!("{}/{}", r.meta.namespace, r.meta.name)).collect::<Vec<_>>(),
        // The key sets the controller fetched (or why not), by source.
        "jwks": data.jwks.iter().map(|(source, outcome)| match outcome {
            pilotfish_mesh::push_context::JwksOutcome::Keys(_) => json!({"source": source.to_string(), "fetched": true}),
            pilotfish_mesh::push_context::JwksOutcome::Failed(e) => json!({"source": source.to_string(), "fetched": false, "error": e}),
        }).collect::<Vec<_>>(),
        "sidecars": data.sidecars.iter().map(|s| format!("{}/{}", s.meta.namespace, s.meta.name)).collect::<Vec<_>>(),
        "authorization_policies": data.authorization_policies.iter().map(|a| format!("{}/{}", a.meta.namespace, a.meta.name)).collect::<Vec<_>>(),
    }))
    .into_response()
}

async fn config_dump_page(
    State(ctx): State<AdminContext>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let Some(id) = q.get("proxyID") else {
        return (
            StatusCode::BAD_REQUEST,
            "give ?proxyID=<node id of a connected proxy> (see /debug/adsz)\n",
        )
            .into_response();
    };
    let Some(proxy) = ctx.registry.proxy(id) else {
        return (
            StatusCode::NOT_FOUND,
            format!("proxy {id:?} is not connected to this replica (see /debug/adsz)\n"),
        )
            .into_response();
    };
    let Some((_, snap)) = ctx.feed.current() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no snapshot yet\n").into_response();
    };
    match config_dump(&snap, &proxy) {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot render the config dump: {e}\n"),
        )
            .into_response(),
    }
}

/// Serves the admin pages on `listener` until `shutdown` is cancelled; `/debug/*` only
/// to loopback peers unless `expose_debug_pages` ([`pilotfish_shared::admin`]).
pub async fn serve(
    listener: TcpListener,
    ctx: AdminContext,
    expose_debug_pages: bool,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let public = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_page))
        .with_state(ctx.clone());
    let debug = Router::new()
        .route("/debug/adsz", get(adsz))
        .route("/debug/syncz", get(syncz))
        .route("/debug/push_status", get(push_status))
        .route("/debug/snapshot", get(snapshot))
        .route("/debug/config_dump", get(config_dump_page))
        .with_state(ctx);
    pilotfish_shared::admin::serve(listener, public, debug, expose_debug_pages, shutdown).await
}
