//! The controller's admin HTTP server (port 15014): `/metrics`, `/healthz`, `/readyz`,
//! `/debug/snapshot`, `/debug/leader`. The run modes write what these pages show into
//! [`AdminState`]; the server only reads it.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use pilotfish_shared::bus::PublishOutcome;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use pilotfish_shared::pipeline::Built;
use pilotfish_shared::telemetry;

#[derive(Debug, Default)]
struct Inner {
    ready: bool,
    ready_detail: String,
    leader: Value,
    snapshot: Value,
}

/// What the admin pages show; shared between the run mode (writer) and the server.
#[derive(Clone, Debug, Default)]
pub struct AdminState {
    inner: Arc<RwLock<Inner>>,
}

impl AdminState {
    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_ready(&self, ready: bool, detail: impl Into<String>) {
        let mut s = self.write();
        s.ready = ready;
        s.ready_detail = detail.into();
    }

    /// Leadership as `/debug/leader` shows it.
    pub fn set_leader(&self, leader: Value) {
        self.write().leader = leader;
    }

    /// Readiness and its detail, as `/readyz` answers.
    pub fn readiness(&self) -> (bool, String) {
        let s = self.read();
        (s.ready, s.ready_detail.clone())
    }

    /// What `/debug/leader` shows.
    pub fn leader(&self) -> Value {
        self.read().leader.clone()
    }

    /// What `/debug/snapshot` shows.
    pub fn snapshot(&self) -> Value {
        self.read().snapshot.clone()
    }

    /// Records the last snapshot built and what publishing it did.
    pub fn set_snapshot(&self, built: &Built, outcome: Option<&PublishOutcome>) {
        let data = built.context.data();
        let endpoints: usize = data
            .endpoints
            .iter()
            .flat_map(|e| e.ports.iter())
            .map(|p| p.endpoints.len())
            .sum();
        let published = match outcome {
            Some(PublishOutcome::Published(r)) => {
                json!({"result": "published", "version": r.version, "epoch": r.epoch})
            }
            Some(PublishOutcome::Unchanged(r)) => {
                json!({"result": "unchanged", "version": r.version, "epoch": r.epoch})
            }
            Some(PublishOutcome::Fenced { current }) => json!({
                "result": "fenced",
                "current": current.as_ref().map(|r| json!({"version": r.version, "epoch": r.epoch})),
            }),
            None => {
                json!({"result": "not published (not the leader, or the bus failed: see the log)"})
            }
        };
        self.write().snapshot = json!({
            "hash": built.encoded.hash_hex(),
            "blob_bytes": built.encoded.bytes.len(),
            "build_ms": built.took.as_secs_f64() * 1000.0,
            "path": if built.endpoints_only { "endpoints" } else { "full" },
            "publish": published,
            "services": data.services.len(),
            "endpoints": endpoints,
            "virtual_services": data.virtual_services.len(),
            "destination_rules": data.destination_rules.len(),
            "peer_authentications": data.peer_authentications.len(),
            "sidecars": data.sidecars.len(),
            "request_authentications": data.request_authentications.len(),
            "jwks": data.jwks.iter().map(|(source, outcome)| serde_json::json!({"source": source.to_string(), "fetched": matches!(outcome, pilotfish_mesh::push_context::JwksOutcome::Keys(_)), "error": match outcome { pilotfish_mesh::push_context::JwksOutcome::Failed(e) => Some(e.as_str()), _ => None }})).collect::<Vec<_>>(),
            "authorization_policies": data.authorization_policies.len(),
            "kept_previous": built.kept_previous.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
            "findings": built.findings.iter().map(|f| f.to_string()).collect::<Vec<_>>(),
        });
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<AdminState>) -> Response {
    let s = state.read();
    let code = if s.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, format!("{}\n", s.ready_detail)).into_response()
}

async fn metrics_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        telemetry::render_metrics(),
    )
        .into_response()
}

async fn debug_snapshot(State(state): State<AdminState>) -> Response {
    axum::Json(state.read().snapshot.clone()).into_response()
}

async fn debug_leader(State(state): State<AdminState>) -> Response {
    axum::Json(state.read().leader.clone()).into_response()
}

/// Serves the admin pages on `listener` until `shutdown` is cancelled; `/debug/*` only
/// to loopback peers unless `expose_debug_pages` ([`pilotfish_shared::admin`]).
pub async fn serve(
    listener: TcpListener,
    state: AdminState,
    expose_debug_pages: bool,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let public = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_page))
        .with_state(state.clone());
    let debug = Router::new()
        .route("/debug/snapshot", get(debug_snapshot))
        .route("/debug/leader", get(debug_leader))
        .with_state(state);
    pilotfish_shared::admin::serve(listener, public, debug, expose_debug_pages, shutdown).await
}

/// Binds the admin address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
