//! TLS of the secure port: the rustls configuration built from an authority (serving
//! chain and key; client certificates optional, verified against the mesh roots; ALPN
//! `h2`) and the [`TlsTransport`] the listener runs each connection through, which puts
//! the verified client chain into every request as [`PeerCertificates`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use pilotfish_ca::CaBundle;
use pilotfish_ca::issue::ServingCert;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
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

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The server configuration for one authority.
pub fn server_config(
    bundle: &CaBundle,
    serving: &ServingCert,
) -> Result<rustls::ServerConfig, String> {
    let mut roots = RootCertStore::empty();
    for root in bundle.roots_der() {
        roots
            .add(root.clone())
            .map_err(|e| format!("root certificate: {e}"))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| format!("client verifier: {e}"))?;
    let chain = CertificateDer::pem_slice_iter(serving.chain_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("serving chain: {e}"))?;
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
        .map_err(|e| format!("serving key: {e}"))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("serving certificate: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

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
