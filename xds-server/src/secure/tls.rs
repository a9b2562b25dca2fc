//! TLS of the secure port: the `TlsTransport` the listener runs each connection
//! through, with the current authority's rustls configuration
//! (`authority::server_config`), which puts the verified client chain into every
//! request as [`PeerCertificates`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::debug;

use super::authority::AuthorityReceiver;
use crate::ads::Transport;

/// The client's certificate chain (leaf first) of a TLS connection, verified against the
/// mesh roots during the handshake. Absent when the client sent none.
#[derive(Clone, Debug)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// TLS over each accepted connection, with the current authority's configuration.
#[derive(Clone)]
pub(crate) struct TlsTransport {
    pub authorities: AuthorityReceiver,
    pub handshake_timeout: Duration,
}

impl Transport for TlsTransport {
    type Io = TlsStream<TcpStream>;

    async fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
    ) -> Option<(Self::Io, http::Extensions)> {
        let Some(authority) = self.authorities.borrow().clone() else {
            debug!(%peer, "secure port: no CA loaded yet; closing the connection");
            return None;
        };
        let accepted = tokio::time::timeout(
            self.handshake_timeout,
            TlsAcceptor::from(authority.tls.clone()).accept(tcp),
        )
        .await;
        let stream = match accepted {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                debug!(%peer, error = %e, "secure port: TLS handshake failed");
                return None;
            }
            Err(_) => {
                debug!(%peer, "secure port: TLS handshake timed out");
                return None;
            }
        };
        let mut extensions = http::Extensions::new();
        if let Some(chain) = stream.get_ref().1.peer_certificates()
            && !chain.is_empty()
        {
            let owned: Vec<CertificateDer<'static>> =
                chain.iter().map(|c| c.clone().into_owned()).collect();
            extensions.insert(PeerCertificates(Arc::new(owned)));
        }
        Some((stream, extensions))
    }
}
