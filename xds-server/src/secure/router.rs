//! The secure port's gRPC service: every request is authenticated first (its caller
//! goes into the request's extensions, where the ADS engine and the CA read it), then
//! routed — `CreateCertificate` to the CA, everything else to ADS. An unauthenticated
//! request is answered with `UNAUTHENTICATED` (or `UNAVAILABLE` when the API server
//! could not be asked) before any of its messages is read.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use futures::future::BoxFuture;
use hyper::body::Incoming;
use pilotfish_ca::proto::CREATE_CERTIFICATE_PATH;
use tonic::codegen::Service;
use tracing::debug;

use super::authn::Authenticator;
use super::ca_service::{CaService, CreateCertificate};
use super::metrics;
use super::tls::PeerCertificates;
use crate::ads::AdsServer;

/// Authenticate, then route.
#[derive(Clone)]
pub(crate) struct SecureRouter {
    pub ads: AggregatedDiscoveryServiceServer<AdsServer>,
    pub ca: Arc<CaService>,
    pub authn: Arc<Authenticator>,
}

impl Service<hyper::Request<Incoming>> for SecureRouter {
    type Response = hyper::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: hyper::Request<Incoming>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let peer = request.extensions().get::<PeerCertificates>().cloned();
            let offered = match (
                &peer,
                request.headers().contains_key(http::header::AUTHORIZATION),
            ) {
                (Some(_), _) => "certificate",
                (None, true) => "token",
                (None, false) => "none",
            };
            let caller = match this
                .authn
                .authenticate(request.headers(), peer.as_ref())
                .await
            {
                Ok(caller) => caller,
                Err(e) => {
                    metrics::AUTHN_FAILURES.inc();
                    metrics::REQUESTS
                        .with_label_values(&[offered, e.result()])
                        .inc();
                    debug!(path = %request.uri().path(), error = %e, "secure port: request not authenticated");
                    return Ok(e.into_status().into_http());
                }
            };
            metrics::REQUESTS
                .with_label_values(&[caller.source.as_str(), "authenticated"])
                .inc();
            if request.uri().path() == CREATE_CERTIFICATE_PATH {
                let method = CreateCertificate {
                    ca: this.ca.clone(),
                    caller,
                };
                let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
                return Ok(grpc.unary(method, request).await);
            }
            request.extensions_mut().insert(caller);
            let mut ads = this.ads;
            ads.call(request).await
        })
    }
}
