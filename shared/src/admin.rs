//! The admin HTTP server both binaries run (port 15014). Its public pages (`/metrics`,
//! `/healthz`, `/readyz`) answer anyone who can reach the port, because Prometheus and the
//! kubelet must. Its `/debug/*` pages show every connected proxy and the whole mesh
//! configuration, so they answer only peers on the loopback interface — `kubectl
//! port-forward` and `kubectl exec` arrive there — unless `--expose-debug-pages` says
//! otherwise. Refusals are `403` with the reason, logged at debug level and counted.
//!
//! The server is bounded for whoever can reach the port: at most [`MAX_CONNECTIONS`] open
//! connections (more are closed at once and counted), request headers within
//! [`HEADER_READ_TIMEOUT`], each request answered within [`REQUEST_TIMEOUT`] (else `503`).

use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use prometheus::{IntCounter, IntCounterVec, Opts};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::telemetry::registered;

/// Open connections at most: Prometheus, the kubelet's probes and a person with `kubectl
/// port-forward` need a handful.
pub const MAX_CONNECTIONS: usize = 64;
/// A client must send a request's headers within this.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Every page is rendered from memory; one that takes longer is answered `503`.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

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
    registered(
        IntCounter::new(
            "pilotfish_admin_debug_refused_total",
            "Requests for /debug/* refused because the peer is not on loopback (see --expose-debug-pages).",
        )
        .expect("static metric definition"),
    )
});

static BOUNDED: LazyLock<IntCounterVec> = LazyLock::new(|| {
    registered(
        IntCounterVec::new(
            Opts::new(
                "pilotfish_admin_limited_total",
                "Admin connections closed at the connection cap and requests cut at the time limit.",
            ),
            &["limit"],
        )
        .expect("static metric definition"),
    )
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

async fn time_limit(request: Request, next: Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            BOUNDED.with_label_values(&["request_timeout"]).inc();
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the page took longer than the admin server's time limit\n",
            )
                .into_response()
        }
    }
}

/// The admin app: `debug` behind the loopback guard unless `expose_debug_pages`, every
/// request under the time limit.
fn router(public: Router, debug: Router, expose_debug_pages: bool) -> Router {
    let debug = if expose_debug_pages {
        debug
    } else {
        debug.layer(middleware::from_fn(guard_debug))
    };
    public.merge(debug).layer(middleware::from_fn(time_limit))
}

/// Serves `public` to every peer and `debug` (routes under `/debug/`) to the peers
/// [`debug_allowed`] admits, on `listener` until `shutdown` is cancelled; open
/// connections get a second to finish, then are closed.
pub async fn serve(
    listener: TcpListener,
    public: Router,
    debug: Router,
    expose_debug_pages: bool,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    LazyLock::force(&DEBUG_REFUSED);
    LazyLock::force(&BOUNDED);
    let app = router(public, debug, expose_debug_pages);
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "admin server: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            BOUNDED.with_label_values(&["connections"]).inc();
            tracing::debug!(%peer, "admin server: connection cap reached, closing");
            continue;
        };
        let service =
            TowerToHyperService::new(app.clone().layer(axum::Extension(ConnectInfo(peer))));
        let builder = builder.clone();
        connections.spawn(async move {
            let _permit = permit;
            if let Err(e) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "admin connection ended with an error");
            }
        });
    }
    let drain = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(1), drain)
        .await
        .is_err()
    {
        connections.shutdown().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::extract::connect_info::MockConnectInfo;
    use axum::routing::get as get_route;
    use tower::ServiceExt;

    async fn status(peer: &str, path: &str, expose: bool) -> StatusCode {
        let app = router(
            Router::new().route("/metrics", get_route(|| async { "m" })),
            Router::new().route("/debug/adsz", get_route(|| async { "d" })),
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

    /// Writes a GET and reads until the server closes or 5 s pass; returns what was read.
    async fn get(stream: &mut tokio::net::TcpStream, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        if stream.write_all(request.as_bytes()).await.is_err() {
            return String::new();
        }
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_and_the_server_recovers() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve(
            listener,
            Router::new().route("/healthz", get_route(|| async { "ok" })),
            Router::new(),
            false,
            stop.clone(),
        ));
        let before = BOUNDED.with_label_values(&["connections"]).get();
        // Idle connections (no request yet) hold every slot.
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        // Each idle connection was accepted once the server sees the next one; the one
        // beyond the cap is closed without an answer.
        let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
        let answer = get(&mut extra, "/healthz").await;
        assert!(!answer.contains("200 OK"), "{answer}");
        assert!(BOUNDED.with_label_values(&["connections"]).get() > before);
        // Slots come back when connections close.
        drop(idle);
        let mut answered = false;
        for _ in 0..50 {
            let mut fresh = tokio::net::TcpStream::connect(addr).await.unwrap();
            if get(&mut fresh, "/healthz").await.contains("200 OK") {
                answered = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(
            answered,
            "the server did not recover after the idle connections closed"
        );
        stop.cancel();
        server.await.unwrap().unwrap();
    }
}
