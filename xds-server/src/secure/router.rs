//! The secure port's gRPC service: every request is authenticated first (its caller
//! goes into the request's extensions, where the ADS engine and the CA read it), then
//! routed — `CreateCertificate` to the CA, everything else to ADS. An unauthenticated
//! request is answered with `UNAUTHENTICATED` (or `UNAVAILABLE` when the API server
//! could not be asked) before any of its messages is read.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::Either;
use hyper::body::Incoming;
use hyper::{Request, Response};
use pilotfish_ca::proto::CREATE_CERTIFICATE_PATH;
use tracing::debug;

use super::authn::Authenticator;
use super::ca_service::{CaService, CreateCertificate};
use super::metrics;
use super::tls::PeerCertificates;
use crate::ads::{AdsBody, AdsServer, ConnectionClosing, Handler};

/// Authenticate, then route.
#[derive(Clone)]
pub(crate) struct SecureRouter {
    pub ads: AdsServer,
    pub ca: Arc<CaService>,
    pub authn: Arc<Authenticator>,
}

impl Handler for SecureRouter {
    /// ADS streams keep the engine's own framing; the CA and refusals are tonic's.
    type Body = Either<AdsBody, tonic::body::Body>;

    async fn handle(
        &self,
        mut request: Request<Incoming>,
        peer: Option<SocketAddr>,
        closing: Option<ConnectionClosing>,
    ) -> Response<Self::Body> {
        let certificates = request.extensions().get::<PeerCertificates>().cloned();
        let offered = match (
            &certificates,
            request.headers().contains_key(http::header::AUTHORIZATION),
        ) {
            (Some(_), _) => "certificate",
            (None, true) => "token",
            (None, false) => "none",
        };
        let caller = match self
            .authn
            .authenticate(request.headers(), certificates.as_ref())
            .await
        {
            Ok(caller) => caller,
            Err(e) => {
                metrics::AUTHN_FAILURES.inc();
                metrics::REQUESTS
                    .with_label_values(&[offered, e.result()])
                    .inc();
                debug!(path = %request.uri().path(), error = %e, "secure port: request not authenticated");
                return e
                    .into_status()
                    .into_http::<tonic::body::Body>()
                    .map(Either::Right);
            }
        };
        metrics::REQUESTS
            .with_label_values(&[caller.source.as_str(), "authenticated"])
            .inc();
        if request.uri().path() == CREATE_CERTIFICATE_PATH {
            let method = CreateCertificate {
                ca: self.ca.clone(),
                caller,
            };
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            return grpc.unary(method, request).await.map(Either::Right);
        }
        request.extensions_mut().insert(caller);
        self.ads
            .handle(request, peer, closing)
            .await
            .map(Either::Left)
    }
}
