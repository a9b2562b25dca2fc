//! The resolver against real HTTP(S) servers on 127.0.0.1 (no mock of the fetch): key sets
//! by URI and by OpenID discovery, over http and https; a failing, a slow, an unreachable,
//! an oversized and a non-JWKS source each fail with their reason; a standby fetches
//! nothing; a refresh picks up a rotated key set and keeps it when the server then fails.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

const KEYS_A: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"a","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;
const KEYS_B: &str =
    r#"{"keys":[{"kty":"RSA","kid":"b","e":"AQAB","n":"xAE7eB6qugXyCAG3yhh7pkDkT65pHymX"}]}"#;

#[derive(Clone)]
struct Route {
    status: u16,
    body: String,
    delay: Duration,
}

/// A tiny HTTP/1.1 server: canned answers by path, one request per connection.
struct TestServer {
    addr: SocketAddr,
    routes: Arc<Mutex<HashMap<String, Route>>>,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TestServer {
    async fn start(tls: Option<tokio_rustls::TlsAcceptor>) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let routes: Arc<Mutex<HashMap<String, Route>>> = Arc::default();
        let hits = Arc::new(AtomicUsize::new(0));
        let (r, h) = (routes.clone(), hits.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (routes, hits, tls) = (r.clone(), h.clone(), tls.clone());
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(tcp).await {
                                answer(stream, &routes, &hits).await;
                            }
                        }
                        None => answer(tcp, &routes, &hits).await,
                    }
                });
            }
        });
        TestServer {
            addr,
            routes,
            hits,
            task,
        }
    }

    fn route(&self, path: &str, status: u16, body: &str, delay: Duration) {
        self.routes.lock().unwrap().insert(
            path.to_string(),
            Route {
                status,
                body: body.to_string(),
                delay,
            },
        );
    }

    fn url(&self, scheme: &str, path: &str) -> String {
        let host = if scheme == "https" {
            format!("localhost:{}", self.addr.port())
        } else {
            self.addr.to_string()
        };
        format!("{scheme}://{host}{path}")
    }
}

async fn answer<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    mut stream: S,
    routes: &Mutex<HashMap<String, Route>>,
    hits: &AtomicUsize,
) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    hits.fetch_add(1, Ordering::SeqCst);
    let text = String::from_utf8_lossy(&head);
    let path = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    let route = routes.lock().unwrap().get(&path).cloned().unwrap_or(Route {
        status: 404,
        body: "not found".into(),
        delay: Duration::ZERO,
    });
    tokio::time::sleep(route.delay).await;
    let response = format!(
        "HTTP/1.1 {} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        route.status,
        route.body.len(),
        route.body
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

fn quick() -> ResolverSettings {
    ResolverSettings {
        retries: 1,
        retry_interval: Duration::from_millis(20),
        max_body_bytes: 64 * 1024,
        ..ResolverSettings::default()
    }
}

fn source(issuer: &str, uri: &str) -> JwksSource {
    JwksSource {
        issuer: issuer.into(),
        jwks_uri: uri.into(),
    }
}

/// Waits (at most 10 s) until `done` holds for the published outcomes.
async fn until(link: &JwksLink, done: impl Fn(&BTreeMap<JwksSource, JwksOutcome>) -> bool) {
    let mut rx = link.resolved.clone();
    let wait = async {
        loop {
            if done(&rx.borrow_and_update()) {
                return;
            }
            rx.changed().await.expect("resolver running");
        }
    };
    if tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .is_err()
    {
        panic!("not reached within 10 s: {:?}", link.current());
    }
}

fn start(settings: ResolverSettings, fetcher: Fetcher) -> (JwksLink, tokio::task::JoinHandle<()>) {
    let (link, task) = resolver(settings, fetcher);
    (link, tokio::spawn(task))
}

#[tokio::test]
async fn fetches_by_uri_and_by_discovery_and_a_standby_fetches_nothing() {
    let server = TestServer::start(None).await;
    server.route("/jwks", 200, KEYS_A, Duration::ZERO);
    let issuer = server.url("http", "/issuer");
    server.route(
        "/issuer/.well-known/openid-configuration",
        200,
        &format!(
            r#"{{"issuer":"{issuer}","jwks_uri":"{}"}}"#,
            server.url("http", "/discovered")
        ),
        Duration::ZERO,
    );
    server.route("/discovered", 200, KEYS_B, Duration::ZERO);
    let by_uri = source("https://a", &server.url("http", "/jwks"));
    let by_discovery = source(&format!("{issuer}/"), "");
    let (link, task) = start(quick(), Fetcher::new(None, 1 << 20).unwrap());
    let wanted = BTreeMap::from([
        (by_uri.clone(), Duration::from_secs(2)),
        (by_discovery.clone(), Duration::from_secs(2)),
    ]);
    // A standby holds still: no request reaches the server.
    link.want(wanted.clone(), false);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.hits.load(Ordering::SeqCst), 0);
    assert!(link.current().is_empty());
    link.want(wanted, true);
    until(&link, |r| r.len() == 2).await;
    assert_eq!(link.current()[&by_uri], JwksOutcome::Keys(KEYS_A.into()));
    assert_eq!(
        link.current()[&by_discovery],
        JwksOutcome::Keys(KEYS_B.into())
    );
    assert_eq!(server.hits.load(Ordering::SeqCst), 3);
    // A source no policy names any more is dropped.
    link.want(
        BTreeMap::from([(by_uri.clone(), Duration::from_secs(2))]),
        true,
    );
    until(&link, |r| r.len() == 1).await;
    task.abort();
}

#[tokio::test]
async fn failing_slow_unreachable_oversized_and_bogus_sources_fail_with_their_reason() {
    let server = TestServer::start(None).await;
    server.route("/down", 500, "boom", Duration::ZERO);
    server.route("/slow", 200, KEYS_A, Duration::from_secs(5));
    server.route("/big", 200, &"x".repeat(100 * 1024), Duration::ZERO);
    server.route("/bogus", 200, "{\"hello\":1}", Duration::ZERO);
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let cases = [
        (source("i", &server.url("http", "/down")), "status 500"),
        (
            source("i", &server.url("http", "/slow")),
            "no answer within",
        ),
        (source("i", &server.url("http", "/big")), "larger than"),
        (
            source("i", &server.url("http", "/bogus")),
            "not a JSON Web Key Set",
        ),
        (source("i", &format!("http://{closed}/jwks")), "GET http://"),
        (source(&server.url("http", "/nowhere"), ""), "status 404"),
    ];
    let (link, task) = start(quick(), Fetcher::new(None, 64 * 1024).unwrap());
    link.want(
        cases
            .iter()
            .map(|(s, _)| (s.clone(), Duration::from_millis(300)))
            .collect(),
        true,
    );
    until(&link, |r| r.len() == cases.len()).await;
    let resolved = link.current();
    for (source, reason) in &cases {
        match &resolved[source] {
            JwksOutcome::Failed(why) => assert!(
                why.contains(reason),
                "{source}: {why:?} does not say {reason:?}"
            ),
            other => panic!("{source}: {other:?}"),
        }
    }
    // First sight once, then the retry round; nothing more until the next refresh (20
    // minutes away): no retry loop hammers a failing server.
    let before = server.hits.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(server.hits.load(Ordering::SeqCst), before);
    task.abort();
}

#[tokio::test]
async fn a_refresh_picks_up_a_rotated_set_and_keeps_it_when_the_server_fails() {
    let server = TestServer::start(None).await;
    server.route("/jwks", 200, KEYS_A, Duration::ZERO);
    let s = source("i", &server.url("http", "/jwks"));
    let settings = ResolverSettings {
        refresh_interval: Duration::from_millis(200),
        failure_interval: Duration::from_millis(200),
        ..quick()
    };
    let (link, task) = start(settings, Fetcher::new(None, 1 << 20).unwrap());
    link.want(BTreeMap::from([(s.clone(), Duration::from_secs(2))]), true);
    until(&link, |r| {
        r.get(&s) == Some(&JwksOutcome::Keys(KEYS_A.into()))
    })
    .await;
    server.route("/jwks", 200, KEYS_B, Duration::ZERO);
    until(&link, |r| {
        r.get(&s) == Some(&JwksOutcome::Keys(KEYS_B.into()))
    })
    .await;
    server.route("/jwks", 503, "unavailable", Duration::ZERO);
    let hits = server.hits.load(Ordering::SeqCst);
    let waited = async {
        while server.hits.load(Ordering::SeqCst) < hits + 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), waited)
        .await
        .expect("refreshed within 10 s");
    assert_eq!(link.current()[&s], JwksOutcome::Keys(KEYS_B.into()));
    task.abort();
}

#[tokio::test]
async fn https_needs_a_trusted_server_certificate() {
    let now = SystemTime::now();
    let root =
        pilotfish_ca::bundle::generate_self_signed("jwks-test", Duration::from_secs(3600), now)
            .unwrap();
    let bundle = pilotfish_ca::CaBundle::load(&root, now).unwrap();
    let serving = pilotfish_ca::issue::issue_serving(
        &bundle,
        &["localhost".to_string()],
        Duration::from_secs(3600),
        now,
    )
    .unwrap();
    let certs = pilotfish_ca::pem::certificates(serving.chain_pem.as_bytes()).unwrap();
    let key = pilotfish_ca::pem::private_key_pkcs8(serving.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()))
    .unwrap();
    let server = TestServer::start(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await;
    server.route("/jwks", 200, KEYS_A, Duration::ZERO);
    let url = server.url("https", "/jwks");

    let trusting = Fetcher::new(Some(&root.root_cert), 1 << 20).unwrap();
    let body = trusting.get(&url, Duration::from_secs(5)).await.unwrap();
    assert_eq!(&body[..], KEYS_A.as_bytes());

    let system_only = Fetcher::new(None, 1 << 20).unwrap();
    let err = system_only
        .get(&url, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.contains("TLS"), "{err}");
}
