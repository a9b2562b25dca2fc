//! The secure port (15012, istiod's): gRPC over TLS with a serving certificate from the
//! mesh CA, every request authenticated by its client certificate or service-account
//! token before any message is read, serving Istio's CA
//! (`IstioCertificateService/CreateCertificate`) and ADS for authenticated streams (whose
//! node must match the caller's namespace, `crate::identity`).
//!
//! - [`authority`]: the CA files → [`authority::Authority`] (bundle, serving certificate,
//!   TLS configuration), reloaded when they change.
//! - [`tls`]: the rustls configuration and the TLS transport of the listener.
//! - [`authn`]: the [`authn::Authenticator`]; [`review`]: TokenReview and its cache.
//! - [`ca_service`]: `CreateCertificate`; `router`: authenticate, then route.

pub mod authn;
pub mod authority;
pub mod ca_service;
pub mod metrics;
pub mod review;
mod router;
pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::ads::{AdsServer, ConnectionPolicy, serve_connections};
use authn::Authenticator;
use ca_service::CaService;
use router::SecureRouter;
use tls::TlsTransport;

/// How long a client may take to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the secure port on `listener` until `drain` is cancelled, then drains its
/// connections as the plaintext port does (GOAWAY at a random moment within `grace`).
/// `ads` should be built with the same `draining` token.
pub async fn serve(
    listener: TcpListener,
    ads: AdsServer,
    ca: CaService,
    authn: Arc<Authenticator>,
    connections: ConnectionPolicy,
    drain: CancellationToken,
    grace: Duration,
) {
    let transport = TlsTransport {
        authorities: ca.authorities.clone(),
        handshake_timeout: HANDSHAKE_TIMEOUT,
    };
    let router = SecureRouter {
        ads,
        ca: Arc::new(ca),
        authn,
    };
    serve_connections(listener, router, transport, connections, drain, grace).await;
}
