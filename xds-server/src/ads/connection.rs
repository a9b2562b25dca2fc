//! The ADS listener's HTTP/2 connections, served by hyper, each request handed to the
//! ADS [`Handler`], with two ways a connection ends on the server's initiative:
//!
//! - **maximum age** (`--max-connection-age`, default 30 min, ±10% jitter per connection so
//!   connections opened together do not all end together), so load spreads to replicas
//!   added by a scale-up;
//! - **drain** on shutdown: the listener closes and every connection ends at a random
//!   moment within the drain grace, spreading the reconnects over the other replicas.
//!
//! Either way the connection first sends GOAWAY (so the client opens its next stream on a
//! *new* connection, which the Service may route to another replica), then its ADS
//! streams end with `UNAVAILABLE`, and after a short close grace the socket is closed.
//! Ending only the stream would let the client retry over the same connection.
//!
//! Before hyper gets a connection, the transport's handshake (TLS on the secure port) and
//! the client's HTTP/2 preface and SETTINGS header must arrive within the handshake timeout
//! (`--handshake-timeout`, default 10 s; `super::handshake`); a connection that sends
//! nothing, or something else, is closed. At most `--max-connections` connections are
//! open (handshaking or served); one beyond is closed at once. Both are counted in
//! `pilotfish_xds_connections_refused_total{reason}`.
//!
//! The listener serves any gRPC service over any [`Transport`]: the plaintext port runs
//! the ADS service over TCP ([`Plaintext`]); the secure port (`crate::secure`) runs its
//! authenticating router over TLS, whose handshake adds the client's certificates to
//! every request of the connection.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use pilotfish_shared::retry::sleep_until_opt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::handshake::{PrefaceError, read_preface};
use crate::metrics;

/// Largest amount of a stream's unsent data h2 buffers before it stops asking the
/// response body for more (hyper's default is 400 KiB). A response body hands over whole
/// shared buffers, so this bounds only how early the next response is computed, not how
/// much is copied: a stream whose client stops reading holds at most this much in h2
/// plus the chunk hyper has in hand.
pub const MAX_SEND_BUFFER: usize = 64 * 1024;

/// Connections waiting to be accepted: a replica that dies sends thousands of proxies to
/// the others at once, and a connection beyond the backlog is dropped by the kernel and
/// retried by the client seconds later. (Linux caps it at `net.core.somaxconn`.)
pub const LISTEN_BACKLOG: u32 = 4096;

/// Binds the ADS listener with [`LISTEN_BACKLOG`].
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Turns an accepted TCP connection into the byte stream HTTP/2 runs over, with what the
/// handshake learned (e.g. the client's certificates) for every request's extensions.
/// `None` drops the connection (the transport logs why).
pub(crate) trait Transport: Clone + Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
    ) -> impl Future<Output = Option<(Self::Io, http::Extensions)>> + Send;
}

/// Plain TCP: the plaintext ADS port (15010).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Plaintext;

impl Transport for Plaintext {
    type Io = TcpStream;
    async fn handshake(
        &self,
        tcp: TcpStream,
        _peer: SocketAddr,
    ) -> Option<(TcpStream, http::Extensions)> {
        Some((tcp, http::Extensions::new()))
    }
}

/// What serves the requests of a connection: the ADS service.
pub(crate) trait Handler: Clone + Send + Sync + 'static {
    /// The response body: ADS's own framing ([`AdsBody`](super::grpc::AdsBody)); the
    /// secure port adds tonic's for the CA.
    type Body: hyper::body::Body<
            Data = bytes::Bytes,
            Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        > + Send
        + 'static;
    fn handle(
        &self,
        request: Request<Incoming>,
        peer: Option<SocketAddr>,
        closing: Option<ConnectionClosing>,
    ) -> impl Future<Output = Response<Self::Body>> + Send;
}

/// Connections a replica holds by default: at the ~20 KiB a stream costs (docs/PERFORMANCE.md)
/// 10,000 are about 200 MiB beside the shared snapshot, within the chart's 1 GiB with room
/// for a push's second generation.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// How connections are kept and ended.
#[derive(Clone, Debug)]
pub struct ConnectionPolicy {
    /// A connection is ended after this age (jittered); `None` keeps connections forever.
    pub max_age: Option<Duration>,
    /// Relative jitter of the age: 0.1 picks each connection's age in [0.9, 1.1] × max_age.
    pub age_jitter: f64,
    /// Between GOAWAY and closing the socket, so responses in flight are written.
    pub close_grace: Duration,
    /// HTTP/2 PINGs detect clients that vanished without closing their connection.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// A connection whose transport handshake and HTTP/2 preface (with SETTINGS) have not
    /// arrived within this is closed.
    pub handshake_timeout: Duration,
    /// Most connections open at once (handshaking or served); one beyond is closed at
    /// once. `None`: no cap.
    pub max_connections: Option<usize>,
}

impl Default for ConnectionPolicy {
    fn default() -> Self {
        ConnectionPolicy {
            max_age: Some(Duration::from_secs(30 * 60)),
            age_jitter: 0.1,
            close_grace: Duration::from_secs(1),
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            max_connections: Some(DEFAULT_MAX_CONNECTIONS),
        }
    }
}

impl ConnectionPolicy {
    /// One connection's age: `max_age` scaled by a random factor in [1-j, 1+j].
    fn jittered_age(&self) -> Option<Duration> {
        let j = self.age_jitter.clamp(0.0, 0.9);
        self.max_age
            .map(|age| age.mul_f64(rand::random_range(1.0 - j..=1.0 + j)))
    }
}

/// Attached to every request of a managed connection: fires when the connection is
/// ending, so its ADS streams end with `UNAVAILABLE` right after the GOAWAY.
#[derive(Clone, Debug)]
pub struct ConnectionClosing(CancellationToken);

impl ConnectionClosing {
    /// Completes when the connection starts closing (or its task is gone); never for
    /// requests that did not come through the ADS listener (`ads::serve`).
    pub async fn wait(closing: Option<&ConnectionClosing>) {
        match closing {
            Some(c) => c.0.cancelled().await,
            None => std::future::pending().await,
        }
    }
}

/// Serves `service` on `listener` until `drain` is cancelled; then stops accepting, ends
/// every connection at a random moment within `grace`, and returns once all are closed
/// (or the grace and close grace are over).
pub(crate) async fn serve_connections<A: Handler, T: Transport>(
    listener: TcpListener,
    service: A,
    transport: T,
    policy: ConnectionPolicy,
    drain: CancellationToken,
    grace: Duration,
) {
    let mut connections = JoinSet::new();
    let slots = policy.max_connections.map(|n| Arc::new(Semaphore::new(n)));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let slot = match &slots {
                        None => None,
                        Some(slots) => match slots.clone().try_acquire_owned() {
                            Ok(slot) => Some(slot),
                            // Closed at once: the client retries (possibly elsewhere), and
                            // the connections already served keep their share.
                            Err(_) => {
                                metrics::ADS_CONNECTIONS_REFUSED
                                    .with_label_values(&["connection_limit"])
                                    .inc();
                                debug!(%peer, "closing an ADS connection beyond the connection cap");
                                drop(tcp);
                                continue;
                            }
                        },
                    };
                    let one = serve_one(tcp, peer, service.clone(), transport.clone(), policy.clone(), drain.clone(), grace);
                    connections.spawn(async move {
                        let _slot: Option<OwnedSemaphorePermit> = slot;
                        one.await;
                    });
                }
                // Out of file descriptors and the like: back off, keep serving.
                Err(e) => {
                    warn!(error = %e, "cannot accept an ADS connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = drain.cancelled() => break,
            // Reap finished connections so the set does not grow without bound.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    info!(
        connections = connections.len(),
        grace_ms = grace.as_millis() as u64,
        "draining ADS connections"
    );
    let deadline = grace + policy.close_grace + Duration::from_secs(1);
    let _ = tokio::time::timeout(deadline, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    connections.abort_all();
}

async fn serve_one<A: Handler, T: Transport>(
    tcp: TcpStream,
    peer: SocketAddr,
    service: A,
    transport: T,
    policy: ConnectionPolicy,
    drain: CancellationToken,
    grace: Duration,
) {
    // Cancelled right after the GOAWAY, or when this task ends for any other reason.
    let closing = CancellationToken::new();
    let _closing_on_exit = closing.clone().drop_guard();
    let _ = tcp.set_nodelay(true);
    let started = async {
        let (io, learned) = transport.handshake(tcp, peer).await?;
        match read_preface(io).await {
            Ok(io) => Some((io, learned)),
            Err(e) => {
                if matches!(e, PrefaceError::NotHttp2) {
                    metrics::ADS_CONNECTIONS_REFUSED
                        .with_label_values(&["not_http2"])
                        .inc();
                }
                debug!(%peer, error = %e, "closing an ADS connection that is not HTTP/2");
                None
            }
        }
    };
    let (io, handshake) = match tokio::time::timeout(policy.handshake_timeout, started).await {
        Ok(Some(started)) => started,
        Ok(None) => return,
        Err(_) => {
            metrics::ADS_CONNECTIONS_REFUSED
                .with_label_values(&["handshake_timeout"])
                .inc();
            debug!(%peer, "closing an ADS connection that did not start HTTP/2 in time");
            return;
        }
    };
    let signal = ConnectionClosing(closing.clone());
    let svc = hyper::service::service_fn(move |mut request: Request<Incoming>| {
        let (service, signal) = (service.clone(), signal.clone());
        // What the handshake learned (e.g. the client's certificates) goes with every
        // request of the connection.
        request.extensions_mut().extend(handshake.clone());
        // Boxed: hyper keeps a stream's service future inline in the stream's task for as
        // long as the stream lives, so its full size would be paid per stream; boxed it
        // is a pointer, and the future is freed once it has answered.
        Box::pin(async move {
            Ok::<_, Infallible>(service.handle(request, Some(peer), Some(signal)).await)
        })
    });
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .keep_alive_interval(policy.keepalive_interval)
        .keep_alive_timeout(policy.keepalive_timeout)
        .max_send_buf_size(MAX_SEND_BUFFER);
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    metrics::ADS_CONNECTIONS.inc();
    let end_at = policy.jittered_age().map(|age| Instant::now() + age);
    let reason = tokio::select! {
        result = &mut conn => {
            if let Err(e) = result {
                debug!(%peer, error = %e, "ADS connection ended with an error");
            }
            metrics::ADS_CONNECTIONS.dec();
            return;
        }
        _ = sleep_until_opt(end_at) => "max_age",
        () = drain.cancelled() => {
            // Keep serving until this connection's own moment within the grace.
            let at = Instant::now() + grace.mul_f64(rand::random_range(0.0..1.0));
            tokio::select! {
                result = &mut conn => {
                    let _ = result;
                    metrics::ADS_CONNECTIONS.dec();
                    return;
                }
                _ = tokio::time::sleep_until(at) => {}
            }
            "drain"
        }
    };
    debug!(%peer, reason, "ending ADS connection: GOAWAY, then its streams end");
    metrics::ADS_CONNECTIONS_ENDED
        .with_label_values(&[reason])
        .inc();
    // GOAWAY first, so the client's next stream goes to a new connection ...
    conn.as_mut().graceful_shutdown();
    // ... then the streams on this connection end with UNAVAILABLE ...
    closing.cancel();
    // ... and the socket closes once they are written, or after the close grace.
    let _ = tokio::time::timeout(policy.close_grace, &mut conn).await;
    metrics::ADS_CONNECTIONS.dec();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_jittered_within_bounds() {
        let policy = ConnectionPolicy {
            max_age: Some(Duration::from_secs(100)),
            ..ConnectionPolicy::default()
        };
        let ages: Vec<Duration> = (0..200).map(|_| policy.jittered_age().unwrap()).collect();
        assert!(
            ages.iter()
                .all(|a| *a >= Duration::from_secs(90) && *a <= Duration::from_secs(110))
        );
        let distinct: std::collections::BTreeSet<_> = ages.iter().collect();
        assert!(distinct.len() > 100, "ages must differ between connections");
        let none = ConnectionPolicy {
            max_age: None,
            ..ConnectionPolicy::default()
        };
        assert_eq!(none.jittered_age(), None);
    }
}
