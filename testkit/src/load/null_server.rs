//! The null ADS server: the floor the benchmark compares `pilotfish-xds` with. It replays
//! what one stream of the real server held at each step of a run ([`Capture`]) to every
//! stream: each response body is encoded once and shared, and per stream it adds only the
//! gRPC prefix and the nonce. It computes nothing, tracks only which types a stream asked
//! for, and answers every request that is not an ACK. Like the real server, a SotW push of
//! RDS or EDS carries only the resources changed since the previous step.
//!
//! Served over hyper's HTTP/2 like the real server (backlog 4,096), so the difference
//! between the two is what the engine costs, not the transport.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::{Context as _, Result};
use bytes::{BufMut, Bytes, BytesMut};
use hyper::body::{Body, Frame, Incoming};
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{HeaderMap, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tokio::sync::{mpsc, watch};

use super::client::Mode;
use super::wire::{Capture, CapturedStep, SotwRequestSummary};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;

/// Every step's responses, encoded once.
struct Replay {
    steps: Vec<Encoded>,
}

/// One step: per type URL, the SotW body, the delta body of everything, each resource's
/// delta entry (for named subscriptions) and the delta body of what changed since the
/// previous step; for RDS and EDS also the SotW body of what changed since the previous
/// step (absent when nothing but deletions).
#[derive(Default)]
struct Encoded {
    sotw: HashMap<String, Bytes>,
    sotw_since_previous: HashMap<String, Bytes>,
    delta_all: HashMap<String, Bytes>,
    delta_entries: HashMap<String, BTreeMap<String, Bytes>>,
    delta_since_previous: HashMap<String, Bytes>,
}

fn delimited(tag: u32, value: &[u8], buf: &mut BytesMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(value.len() as u64, buf);
    buf.put_slice(value);
}

/// Whether a SotW response of this type may carry only what changed (RDS and EDS).
fn sotw_partial(type_url: &str) -> bool {
    type_url.ends_with("RouteConfiguration") || type_url.ends_with("ClusterLoadAssignment")
}

fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn delta_entry(name: &str, version: &str, any: &[u8]) -> Bytes {
    let inner = delimited_len(1, version.len())
        + delimited_len(2, any.len())
        + delimited_len(3, name.len());
    let mut buf = BytesMut::with_capacity(delimited_len(2, inner));
    encode_key(2, WireType::LengthDelimited, &mut buf);
    encode_varint(inner as u64, &mut buf);
    delimited(1, version.as_bytes(), &mut buf);
    delimited(2, any, &mut buf);
    delimited(3, name.as_bytes(), &mut buf);
    buf.freeze()
}

impl Replay {
    fn new(capture: &Capture) -> Replay {
        let mut steps: Vec<Encoded> = Vec::new();
        let mut previous: Option<&CapturedStep> = None;
        for step in &capture.steps {
            let mut encoded = Encoded::default();
            for t in &step.types {
                // The version is the content's, so an unchanged type is not resent.
                let version = {
                    use std::hash::{Hash, Hasher};
                    let mut h = std::hash::DefaultHasher::new();
                    for r in &t.resources {
                        r.any.hash(&mut h);
                    }
                    format!("{:016x}", h.finish())
                };
                let mut sotw = BytesMut::new();
                delimited(1, version.as_bytes(), &mut sotw);
                for r in &t.resources {
                    delimited(2, &r.any, &mut sotw);
                }
                delimited(4, t.type_url.as_bytes(), &mut sotw);
                encoded.sotw.insert(t.type_url.clone(), sotw.freeze());
                let held: Option<BTreeMap<&str, &str>> = previous
                    .and_then(|p| p.types.iter().find(|x| x.type_url == t.type_url))
                    .map(|p| {
                        p.resources
                            .iter()
                            .map(|r| (r.name.as_str(), r.version.as_str()))
                            .collect()
                    });
                if let Some(held) = held.filter(|_| sotw_partial(&t.type_url)) {
                    let changed: Vec<_> = t
                        .resources
                        .iter()
                        .filter(|r| held.get(r.name.as_str()) != Some(&r.version.as_str()))
                        .collect();
                    if !changed.is_empty() {
                        let mut part = BytesMut::new();
                        delimited(1, version.as_bytes(), &mut part);
                        for r in changed {
                            delimited(2, &r.any, &mut part);
                        }
                        delimited(4, t.type_url.as_bytes(), &mut part);
                        encoded
                            .sotw_since_previous
                            .insert(t.type_url.clone(), part.freeze());
                    }
                }
                let entries: BTreeMap<String, Bytes> = t
                    .resources
                    .iter()
                    .map(|r| (r.name.clone(), delta_entry(&r.name, &r.version, &r.any)))
                    .collect();
                let mut all = BytesMut::new();
                for entry in entries.values() {
                    all.put_slice(entry);
                }
                delimited(4, t.type_url.as_bytes(), &mut all);
                encoded.delta_all.insert(t.type_url.clone(), all.freeze());
                let before: BTreeMap<&str, &str> = previous
                    .and_then(|p| p.types.iter().find(|x| x.type_url == t.type_url))
                    .map(|p| {
                        p.resources
                            .iter()
                            .map(|r| (r.name.as_str(), r.version.as_str()))
                            .collect()
                    })
                    .unwrap_or_default();
                let mut diff = BytesMut::new();
                for r in &t.resources {
                    if before.get(r.name.as_str()) != Some(&r.version.as_str()) {
                        diff.put_slice(&entries[&r.name]);
                    }
                }
                for name in before.keys() {
                    if !entries.contains_key(*name) {
                        delimited(6, name.as_bytes(), &mut diff);
                    }
                }
                if !diff.is_empty() {
                    delimited(4, t.type_url.as_bytes(), &mut diff);
                    encoded
                        .delta_since_previous
                        .insert(t.type_url.clone(), diff.freeze());
                }
                encoded.delta_entries.insert(t.type_url.clone(), entries);
            }
            previous = Some(step);
            steps.push(encoded);
        }
        Replay { steps }
    }
}

/// A response body: shared chunks from the stream task, then `grpc-status: 0`.
struct ReplayBody {
    rx: mpsc::UnboundedReceiver<Bytes>,
    done: bool,
}

impl Body for ReplayBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => Poll::Ready(Some(Ok(Frame::data(chunk)))),
            Poll::Ready(None) => {
                self.done = true;
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", HeaderValue::from_static("0"));
                Poll::Ready(Some(Ok(Frame::trailers(trailers))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// Sends one message: prefix and nonce are this stream's, `body` is shared.
fn send(tx: &mpsc::UnboundedSender<Bytes>, body: &Bytes, nonce: u64) {
    let nonce = nonce.to_string();
    let tail_len = delimited_len(5, nonce.len());
    let mut own = BytesMut::with_capacity(5 + tail_len);
    own.put_u8(0);
    own.put_u32((body.len() + tail_len) as u32);
    delimited(5, nonce.as_bytes(), &mut own);
    let own = own.freeze();
    let _ = tx.send(own.slice(..5));
    let _ = tx.send(body.clone());
    let _ = tx.send(own.slice(5..));
}

/// Reads gRPC messages from a request body.
struct Requests {
    body: Incoming,
    buf: BytesMut,
}

impl Requests {
    async fn next<M: Message + Default>(&mut self) -> Option<M> {
        let message = self.next_message().await?;
        M::decode(message).ok()
    }

    /// The next SotW request, read without decoding its names.
    async fn next_sotw(&mut self) -> Option<SotwRequestSummary> {
        let message = self.next_message().await?;
        SotwRequestSummary::read(&message)
    }

    async fn next_message(&mut self) -> Option<BytesMut> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    let _ = self.buf.split_to(5);
                    let message = self.buf.split_to(len);
                    if self.buf.is_empty() {
                        // Do not keep a buffer sized to the largest request.
                        self.buf = BytesMut::new();
                    }
                    return Some(message);
                }
            }
            let frame = std::future::poll_fn(|cx| Pin::new(&mut self.body).poll_frame(cx)).await;
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                _ => return None,
            }
        }
    }
}

/// Serves `capture` on `listener` in `mode`; `steps` selects the step every stream is at.
pub async fn serve(
    listener: tokio::net::TcpListener,
    capture: Capture,
    mode: Mode,
    steps: watch::Receiver<usize>,
) -> Result<()> {
    let replay = Arc::new(Replay::new(&capture));
    loop {
        let (tcp, _) = listener.accept().await.context("accept")?;
        let _ = tcp.set_nodelay(true);
        let (replay, steps) = (replay.clone(), steps.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let (replay, steps) = (replay.clone(), steps.clone());
                async move {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let requests = Requests {
                        body: request.into_body(),
                        buf: BytesMut::new(),
                    };
                    match mode {
                        Mode::Sotw => tokio::spawn(sotw_stream(replay, steps, requests, tx)),
                        Mode::Delta => tokio::spawn(delta_stream(replay, steps, requests, tx)),
                    };
                    let mut response = Response::new(ReplayBody { rx, done: false });
                    response
                        .headers_mut()
                        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
                    Ok::<_, Infallible>(response)
                }
            });
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), service)
                .await;
        });
    }
}

async fn sotw_stream(
    replay: Arc<Replay>,
    mut steps: watch::Receiver<usize>,
    mut requests: Requests,
    tx: mpsc::UnboundedSender<Bytes>,
) {
    let mut nonce = 0u64;
    // Per type: the last nonce sent and a hash of the names last asked for.
    let mut asked: HashMap<String, (u64, u64)> = HashMap::new();
    let mut step = *steps.borrow_and_update();
    loop {
        tokio::select! {
            request = requests.next_sotw() => {
                let Some(request) = request else { return };
                let names = request.names_hash;
                // Answered: the first request of a type, and a request with the latest
                // nonce (or none) that changes the names. ACKs and stale nonces are not.
                let answer = match asked.get(&request.type_url) {
                    None => true,
                    Some((n, h)) => {
                        request.response_nonce.is_empty()
                            || (request.response_nonce == n.to_string() && *h != names)
                    }
                };
                if !answer {
                    continue;
                }
                if let Some(body) = replay.steps[step].sotw.get(&request.type_url) {
                    nonce += 1;
                    send(&tx, body, nonce);
                    asked.insert(request.type_url, (nonce, names));
                }
            }
            changed = steps.changed() => {
                if changed.is_err() { return }
                let next = *steps.borrow_and_update();
                for (type_url, (sent, _)) in asked.iter_mut() {
                    let (old, new) = (replay.steps[step].sotw.get(type_url), replay.steps[next].sotw.get(type_url));
                    if let Some(body) = new && old != Some(body) {
                        // RDS and EDS one step on: only what changed, nothing for deletions.
                        let body = if next == step + 1 && sotw_partial(type_url) {
                            match replay.steps[next].sotw_since_previous.get(type_url) {
                                Some(part) => part,
                                None => continue,
                            }
                        } else {
                            body
                        };
                        nonce += 1;
                        send(&tx, body, nonce);
                        *sent = nonce;
                    }
                }
                step = next;
            }
        }
    }
}

async fn delta_stream(
    replay: Arc<Replay>,
    mut steps: watch::Receiver<usize>,
    mut requests: Requests,
    tx: mpsc::UnboundedSender<Bytes>,
) {
    let mut nonce = 0u64;
    let mut asked: Vec<String> = Vec::new();
    let mut step = *steps.borrow_and_update();
    loop {
        tokio::select! {
            request = requests.next::<DeltaDiscoveryRequest>() => {
                let Some(request) = request else { return };
                let first = !asked.contains(&request.type_url);
                let encoded = &replay.steps[step];
                if first {
                    asked.push(request.type_url.clone());
                }
                if first && request.resource_names_subscribe.is_empty() {
                    if let Some(body) = encoded.delta_all.get(&request.type_url) {
                        nonce += 1;
                        send(&tx, body, nonce);
                    }
                } else if !request.resource_names_subscribe.is_empty() {
                    // Named subscriptions: the subscribed resources, each shared.
                    let Some(entries) = encoded.delta_entries.get(&request.type_url) else { continue };
                    let mut body = BytesMut::new();
                    for name in &request.resource_names_subscribe {
                        if let Some(entry) = entries.get(name) {
                            body.put_slice(entry);
                        }
                    }
                    delimited(4, request.type_url.as_bytes(), &mut body);
                    nonce += 1;
                    send(&tx, &body.freeze(), nonce);
                }
            }
            changed = steps.changed() => {
                if changed.is_err() { return }
                step = *steps.borrow_and_update();
                for type_url in &asked {
                    if let Some(body) = replay.steps[step].delta_since_previous.get(type_url) {
                        nonce += 1;
                        send(&tx, body, nonce);
                    }
                }
            }
        }
    }
}

/// Binds `addr` with a listen backlog of 4,096, so thousands of streams connecting at
/// once are queued rather than retried.
pub fn listen(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket.listen(4096)?)
}
