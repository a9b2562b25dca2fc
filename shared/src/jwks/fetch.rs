//! One HTTP(S) GET of a key set or an OpenID discovery document, as istiod's resolver does
//! it: a fresh connection per request (no keep-alive), the system's roots (plus an
//! optional extra bundle, Istio's `/cacerts/extra.pem`) for https, redirects followed (at
//! most 10, as Go's client), a 2xx answer required. Bounded: the whole request — connect,
//! TLS, redirects, body — within the rule's timeout, the body at most `max_body_bytes`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Go's `http.Client` gives up after 10 redirects.
const MAX_REDIRECTS: usize = 10;

/// Makes the GETs; cheap to clone.
#[derive(Clone)]
pub struct Fetcher {
    tls: tokio_rustls::TlsConnector,
    max_body_bytes: usize,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("max_body_bytes", &self.max_body_bytes)
            .finish_non_exhaustive()
    }
}

impl Fetcher {
    /// A fetcher trusting the system's roots and the PEM certificates in `extra_roots`.
    pub fn new(extra_roots: Option<&[u8]>, max_body_bytes: usize) -> Result<Fetcher, String> {
        let mut roots = rustls::RootCertStore::empty();
        let native = rustls_native_certs::load_native_certs();
        for cert in native.certs {
            // A system certificate rustls cannot use is skipped, as Go's pool skips it.
            let _ = roots.add(cert);
        }
        if let Some(pem) = extra_roots {
            let certs = rustls_pemfile_certs(pem)?;
            for cert in certs {
                roots
                    .add(cert)
                    .map_err(|e| format!("extra JWKS root certificate: {e}"))?;
            }
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
        Ok(Fetcher {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            max_body_bytes,
        })
    }

    /// GETs `url` within `timeout`; the body of a 2xx answer, or why not.
    pub async fn get(&self, url: &str, timeout: Duration) -> Result<Bytes, String> {
        match tokio::time::timeout(timeout, self.follow(url)).await {
            Ok(result) => result,
            Err(_) => Err(format!("GET {url}: no answer within {timeout:?}")),
        }
    }

    async fn follow(&self, url: &str) -> Result<Bytes, String> {
        let mut url = url.to_string();
        for _ in 0..=MAX_REDIRECTS {
            match self.once(&url).await? {
                Answer::Body(body) => return Ok(body),
                Answer::Redirect(next) => url = next,
            }
        }
        Err(format!("GET {url}: more than {MAX_REDIRECTS} redirects"))
    }

    async fn once(&self, url: &str) -> Result<Answer, String> {
        let fail = |why: String| format!("GET {url}: {why}");
        let uri: hyper::Uri = url.parse().map_err(|e| fail(format!("{e}")))?;
        let https = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
            Some("http") => false,
            Some("https") => true,
            other => return Err(fail(format!("scheme {other:?} is not http or https"))),
        };
        let host = uri
            .host()
            .ok_or_else(|| fail("no host".into()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let (status, location, body) = if https {
            let name = ServerName::try_from(host.clone()).map_err(|e| fail(e.to_string()))?;
            let tls = self
                .tls
                .connect(name, tcp)
                .await
                .map_err(|e| fail(format!("TLS: {e}")))?;
            self.request(tls, &uri).await
        } else {
            self.request(tcp, &uri).await
        }
        .map_err(fail)?;
        if status.is_redirection()
            && let Some(location) = location
        {
            return Ok(Answer::Redirect(resolve(&uri, &location)));
        }
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body);
            let shown: String = text.chars().take(100).collect();
            return Err(fail(format!("status {}, body {shown:?}", status.as_u16())));
        }
        Ok(Answer::Body(body))
    }

    async fn request<S>(
        &self,
        io: S,
        uri: &hyper::Uri,
    ) -> Result<(hyper::StatusCode, Option<String>, Bytes), String>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| e.to_string())?;
        // The connection is driven beside the request and dropped with it (no reuse).
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        let authority = uri.authority().map(|a| a.as_str()).unwrap_or_default();
        let path = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let request = Request::get(path)
            .header(hyper::header::HOST, authority)
            .header(hyper::header::ACCEPT, "application/json")
            .header(hyper::header::USER_AGENT, "pilotfish-jwks-resolver")
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        let result = async {
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            let location = response
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let body = Limited::new(response.into_body(), self.max_body_bytes)
                .collect()
                .await
                .map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        format!("the body is larger than {} bytes", self.max_body_bytes)
                    } else {
                        e.to_string()
                    }
                })?
                .to_bytes();
            Ok((status, location, body))
        }
        .await;
        driver.abort();
        result
    }
}

enum Answer {
    Body(Bytes),
    Redirect(String),
}

/// A `Location` against the URL that answered with it (absolute, or a path on the same
/// origin).
fn resolve(base: &hyper::Uri, location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let scheme = base.scheme_str().unwrap_or("http");
    let authority = base.authority().map(|a| a.as_str()).unwrap_or_default();
    if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else {
        let dir = base.path().rsplit_once('/').map_or("", |(d, _)| d);
        format!("{scheme}://{authority}{dir}/{location}")
    }
}

/// The certificates of a PEM bundle.
fn rustls_pemfile_certs(
    pem: &[u8],
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("extra JWKS root certificates: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_locations_resolve_against_the_answering_url() {
        let base: hyper::Uri = "http://keys.example.com:8080/a/b/jwks.json"
            .parse()
            .unwrap();
        assert_eq!(resolve(&base, "https://other/x"), "https://other/x");
        assert_eq!(resolve(&base, "/y"), "http://keys.example.com:8080/y");
        assert_eq!(
            resolve(&base, "z.json"),
            "http://keys.example.com:8080/a/b/z.json"
        );
    }
}
