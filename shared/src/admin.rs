//! The admin HTTP server both binaries run (port 15014). Its public pages (`/metrics`,
//! `/healthz`, `/readyz`) answer anyone who can reach the port, because Prometheus and the
//! kubelet must. Its `/debug/*` pages show every connected proxy and the whole mesh
//! configuration, so they answer only peers on the loopback interface — `kubectl
//! port-forward` and `kubectl exec` arrive there — unless `--expose-debug-pages` says
//! otherwise. Refusals are `403` with the reason, logged at debug level and counted.

use std::net::SocketAddr;
use std::sync::LazyLock;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use prometheus::IntCounter;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Flags of the admin server, shared by both binaries.
#[derive(clap::Args, Clone, Debug)]
pub struct AdminArgs {
    /// Admin HTTP address: /metrics, /healthz, /readyz for anyone who can reach it;
    /// /debug/* only from loopback (kubectl port-forward) unless --expose-debug-pages.
    #[arg(long, env = "PILOTFISH_ADMIN_ADDR", default_value = "0.0.0.0:15014")]
    pub admin_addr: SocketAddr,
    /// Serve /debug/* (every proxy's configuration, the whole snapshot) to any peer that
    /// can reach the admin port, not only loopback. Only behind a NetworkPolicy or proxy
    /// that authorizes who may read them.
    #[arg(long, env = "PILOTFISH_EXPOSE_DEBUG_PAGES", default_value_t = false)]
    pub expose_debug_pages: bool,
}

static DEBUG_REFUSED: LazyLock<IntCounter> = LazyLock::new(|| {
    let counter = IntCounter::new(
        "pilotfish_admin_debug_refused_total",
        "Requests for /debug/* refused because the peer is not on loopback (see --expose-debug-pages).",
    )
    .expect("static metric definition");
    if let Err(e) = prometheus::register(Box::new(counter.clone())) {
        tracing::warn!(error = %e, "admin metric not registered");
    }
    counter
});

/// Whether a peer may read the debug pages.
pub fn debug_allowed(peer: SocketAddr, expose_debug_pages: bool) -> bool {
    expose_debug_pages || peer.ip().to_canonical().is_loopback()
}

async fn guard_debug(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    if debug_allowed(peer, false) {
        return next.run(request).await;
    }
    DEBUG_REFUSED.inc();
    tracing::debug!(%peer, path = %request.uri().path(), "refused a debug page to a non-loopback peer");
    (
        StatusCode::FORBIDDEN,
        "debug pages are served to loopback peers only (use `kubectl port-forward`); \
         start the process with --expose-debug-pages to serve them to any address\n",
    )
        .into_response()
}

/// The admin app: `debug` behind the loopback guard unless `expose_debug_pages`.
fn router(public: Router, debug: Router, expose_debug_pages: bool) -> Router {
    let debug = if expose_debug_pages {
        debug
    } else {
        debug.layer(middleware::from_fn(guard_debug))
    };
    public.merge(debug)
}

/// Serves `public` to every peer and `debug` (routes under `/debug/`) to the peers
/// [`debug_allowed`] admits, on `listener` until `shutdown` is cancelled.
pub async fn serve(
    listener: TcpListener,
    public: Router,
    debug: Router,
    expose_debug_pages: bool,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    LazyLock::force(&DEBUG_REFUSED);
    let app = router(public, debug, expose_debug_pages);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::connect_info::MockConnectInfo;
    use axum::routing::get;
    use tower::ServiceExt;

    async fn status(peer: &str, path: &str, expose: bool) -> StatusCode {
        let app = router(
            Router::new().route("/metrics", get(|| async { "m" })),
            Router::new().route("/debug/adsz", get(|| async { "d" })),
            expose,
        )
        .layer(MockConnectInfo(peer.parse::<SocketAddr>().unwrap()));
        let request = Request::builder().uri(path).body(Body::empty()).unwrap();
        app.oneshot(request).await.unwrap().status()
    }

    #[tokio::test]
    async fn a_remote_peer_reads_metrics_but_not_debug_pages() {
        let before = DEBUG_REFUSED.get();
        assert_eq!(
            status("10.0.0.7:5000", "/metrics", false).await,
            StatusCode::OK
        );
        assert_eq!(
            status("10.0.0.7:5000", "/debug/adsz", false).await,
            StatusCode::FORBIDDEN
        );
        assert!(DEBUG_REFUSED.get() > before);
        assert_eq!(
            status("127.0.0.1:5000", "/debug/adsz", false).await,
            StatusCode::OK
        );
        assert_eq!(
            status("10.0.0.7:5000", "/debug/adsz", true).await,
            StatusCode::OK
        );
    }

    #[test]
    fn only_loopback_peers_read_debug_pages_by_default() {
        let peer = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(debug_allowed(peer("127.0.0.1:5000"), false));
        assert!(debug_allowed(peer("[::1]:5000"), false));
        assert!(debug_allowed(peer("[::ffff:127.0.0.1]:5000"), false));
        assert!(!debug_allowed(peer("10.0.0.7:5000"), false));
        assert!(!debug_allowed(peer("[fd00::7]:5000"), false));
        assert!(!debug_allowed(peer("[::ffff:10.0.0.7]:5000"), false));
        assert!(debug_allowed(peer("10.0.0.7:5000"), true));
    }
}
