//! The ADS service ([`AdsServer`]) and the async loop of each stream. The loop only
//! moves messages: it selects between the client's requests, the next snapshot, the
//! connection closing and the response body asking for its next message, and hands
//! requests and snapshots to the stream's synchronous state machine ([`SotwStream`] or
//! [`DeltaStream`]), which decides every response.
//!
//! A response is computed only when the body asks for one ([`Outbox::wanted`]), which it
//! does only when h2 has room to send on the stream: a stream computes and queues at the
//! pace its socket drains, holds at most one response between itself and h2, and a stream
//! whose client stopped reading computes nothing at all.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use hyper::body::Incoming;
use hyper::{Request, Response};
use pilotfish_mesh::model::Proxy;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::{Instrument, debug, info, warn};

use super::admission::{Admission, MAX_ADMISSION_WAIT, Refusal};
use super::connection::{ConnectionClosing, Handler};
use super::delta::DeltaStream;
use super::grpc::{
    AdsBody, DELTA_PATH, Outbox, RequestStream, SOTW_PATH, response_channel, status_response,
    streaming_response,
};
use super::machine::StreamMachine;
use super::names::NameSets;
use super::registry::{ConnectionRegistry, LiveStatus, StreamHandle, StreamStatus};
use super::request::RequestMessage;
use super::sotw::SotwStream;
use super::state::{Limit, ProtocolEvent, TypeStatus};
use super::view::SnapshotReceiver;
use super::wire::ControlPlane;
use crate::identity::{Caller, authorize_node};
use crate::metrics;
use crate::node::{ParsedNode, parse_node};

/// Settings of the ADS engine.
#[derive(Clone, Debug)]
pub struct AdsConfig {
    /// `control_plane.identifier` of every response (`--replica-name`).
    pub replica_name: String,
    /// How long a new stream may take to send its first request.
    pub first_request_timeout: Duration,
    /// How client connections are kept and ended (maximum age with jitter, GOAWAY).
    pub connections: super::connection::ConnectionPolicy,
    /// On shutdown, connections are ended at random moments within this grace, so their
    /// clients reconnect to other replicas spread over time rather than all at once.
    pub drain_grace: Duration,
    /// New streams accepted per second (burst: twice that), a quarter of it per peer
    /// address (`Admission`); a stream waits up to `MAX_ADMISSION_WAIT` for its token,
    /// else it is refused with `RESOURCE_EXHAUSTED` and the client retries with backoff
    /// (possibly on another replica). `None`: no limit.
    pub new_streams_per_second: Option<f64>,
}

impl Default for AdsConfig {
    fn default() -> Self {
        AdsConfig {
            replica_name: "pilotfish-xds".to_string(),
            first_request_timeout: Duration::from_secs(30),
            connections: super::connection::ConnectionPolicy::default(),
            drain_grace: Duration::ZERO,
            new_streams_per_second: None,
        }
    }
}

/// Why the ADS server (`ads::serve`) stopped.
#[derive(Debug, thiserror::Error)]
pub enum AdsError {
    #[error("cannot read the ADS listener's address: {0}")]
    Listener(#[source] std::io::Error),
}

struct Shared {
    snapshots: SnapshotReceiver,
    registry: ConnectionRegistry,
    config: AdsConfig,
    /// The replica's `control_plane` field, encoded once.
    control_plane: ControlPlane,
    /// Subscribed name sets, one copy each for all streams.
    names: Arc<NameSets>,
    /// Cancelled when the replica drains: new streams are refused.
    draining: CancellationToken,
    /// Admission of new streams (`new_streams_per_second`).
    admission: Option<std::sync::Mutex<Admission>>,
}

/// The ADS service. Cheap to clone; every clone serves the same streams.
#[derive(Clone)]
pub struct AdsServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AdsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdsServer")
            .field("config", &self.shared.config)
            .field("streams", &self.shared.registry.len())
            .finish()
    }
}

impl AdsServer {
    /// Builds the service; its streams follow `snapshots` (the feed's hand-off). Once
    /// `draining` is cancelled, new streams are refused (open ones end with their
    /// connections).
    pub fn new(
        snapshots: SnapshotReceiver,
        registry: ConnectionRegistry,
        config: AdsConfig,
        draining: CancellationToken,
    ) -> Self {
        metrics::register_all();
        AdsServer {
            shared: Arc::new(Shared {
                snapshots,
                registry,
                control_plane: ControlPlane::new(&config.replica_name),
                names: NameSets::new(),
                admission: config.new_streams_per_second.map(|rate| {
                    std::sync::Mutex::new(Admission::new(rate, MAX_ADMISSION_WAIT, Instant::now()))
                }),
                config,
                draining,
            }),
        }
    }

    pub fn registry(&self) -> &ConnectionRegistry {
        &self.shared.registry
    }

    /// Distinct subscribed name sets held by the open streams.
    pub fn name_sets(&self) -> usize {
        self.shared.names.len()
    }

    /// Admits a stream (draining, rate limit, first request, node) and starts its task;
    /// SotW and delta differ only in their state machine.
    async fn open<M: StreamMachine>(
        &self,
        request: Request<Incoming>,
        origin: Origin,
    ) -> Response<AdsBody> {
        // The secure port's router put the authenticated caller here.
        let caller = request.extensions().get::<Caller>().cloned();
        let mut inbound = RequestStream::<M::Request>::new(request.into_body());
        let (first, proxy) = match self
            .accept(
                &mut inbound,
                |r: &M::Request| parse_node(M::node(r)),
                caller.as_ref(),
                origin.peer,
            )
            .await
        {
            Ok(accepted) => accepted,
            Err(status) => return status_response(status),
        };
        let (body, outbox) = response_channel();
        tokio::spawn(run_stream::<M>(
            self.shared.clone(),
            proxy,
            origin,
            first,
            inbound,
            outbox,
        ));
        streaming_response(body)
    }

    /// Reads the first request of a stream and turns its node into a proxy. A stream of
    /// the secure port carries its authenticated `caller`, and its node must be one that
    /// caller may claim (`identity::authorize_node`).
    async fn accept<R: RequestMessage>(
        &self,
        inbound: &mut RequestStream<R>,
        node_of: impl FnOnce(&R) -> Result<ParsedNode, crate::node::NodeError>,
        caller: Option<&Caller>,
        peer: Option<SocketAddr>,
    ) -> Result<(Box<R>, Arc<Proxy>), Status> {
        if self.shared.draining.is_cancelled() {
            metrics::STREAMS_REFUSED
                .with_label_values(&["draining"])
                .inc();
            return Err(Status::unavailable(
                "this xDS replica is shutting down; reconnect to another",
            ));
        }
        if let Some(admission) = &self.shared.admission {
            let reserved = admission
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .reserve(peer.map(|p| p.ip()), Instant::now());
            match reserved {
                Ok(wait) if wait.is_zero() => {}
                Ok(wait) => tokio::time::sleep(wait).await,
                Err(refusal) => {
                    metrics::STREAMS_REFUSED
                        .with_label_values(&[refusal.label()])
                        .inc();
                    return Err(Status::resource_exhausted(match refusal {
                        Refusal::Replica => {
                            "this xDS replica is taking new streams at its limit; retry with backoff (another replica may take it)"
                        }
                        Refusal::Peer => {
                            "new streams from this address are at their share of this xDS replica's limit; retry with backoff"
                        }
                    }));
                }
            }
        }
        let first =
            tokio::time::timeout(self.shared.config.first_request_timeout, inbound.message())
                .await
                .map_err(|_| {
                    Status::deadline_exceeded("no first DiscoveryRequest within the timeout")
                })??
                .ok_or_else(|| {
                    Status::invalid_argument("the stream ended before its first request")
                })?;
        let parsed = node_of(&first).map_err(|e| {
            metrics::INVALID_NODES.inc();
            warn!(error = %e, "refusing ADS stream");
            e.into_status()
        })?;
        if let Some(why) = &parsed.unconventional_id {
            info!(node = %parsed.proxy.id, reason = %why, "node id does not follow Istio's conventions; using namespace `default` unless metadata says otherwise");
        }
        let mut proxy = parsed.proxy;
        if let Some(caller) = caller {
            let identity = authorize_node(caller, &proxy).map_err(|e| {
                metrics::STREAMS_REFUSED
                    .with_label_values(&["unauthorized_node"])
                    .inc();
                warn!(node = %proxy.id, error = %e, "refusing ADS stream");
                e.into_status()
            })?;
            proxy.verified_identity = Some(identity);
        }
        // Boxed: held until the stream's task has handled it, which would otherwise keep
        // its size in the task for the stream's life.
        Ok((Box::new(first), Arc::new(proxy)))
    }
}

impl Handler for AdsServer {
    type Body = AdsBody;

    async fn handle(
        &self,
        request: Request<Incoming>,
        peer: Option<SocketAddr>,
        closing: Option<ConnectionClosing>,
    ) -> Response<AdsBody> {
        let origin = Origin { peer, closing };
        match request.uri().path() {
            SOTW_PATH => self.open::<SotwStream>(request, origin).await,
            DELTA_PATH => self.open::<DeltaStream>(request, origin).await,
            _ => status_response(Status::unimplemented("")),
        }
    }
}

/// Where a stream came from: its peer and its connection's closing signal.
struct Origin {
    peer: Option<SocketAddr>,
    closing: Option<ConnectionClosing>,
}

/// One stream, from its first request to its end.
async fn run_stream<M: StreamMachine>(
    shared: Arc<Shared>,
    proxy: Arc<Proxy>,
    origin: Origin,
    first: Box<M::Request>,
    inbound: RequestStream<M::Request>,
    outbox: Outbox,
) {
    let Origin { peer, closing } = origin;
    let mut snapshots = shared.snapshots.clone();
    // Streams that arrive before the first snapshot wait for it.
    let stamped = loop {
        if let Some(stamped) = snapshots.borrow_and_update().clone() {
            break stamped;
        }
        tokio::select! {
            changed = snapshots.changed() => if changed.is_err() { return },
            () = outbox.closed() => return,
            () = ConnectionClosing::wait(closing.as_ref()) => {
                outbox.end(connection_ending());
                return;
            }
        }
    };
    // Shared with the registry, which reads its records when a debug page asks.
    let machine = Arc::new(Mutex::new(M::new(
        proxy.clone(),
        stamped.snapshot,
        shared.names.clone(),
    )));
    let handle = shared.registry.register(
        StreamStatus {
            stream_id: 0,
            proxy: proxy.clone(),
            proxy_id: proxy.id.clone(),
            namespace: proxy.namespace.clone(),
            identity: proxy.verified_identity.as_ref().map(ToString::to_string),
            proxyless: proxy.is_proxyless(),
            istio_version: proxy.istio_version.clone(),
            peer: peer.map(|p| p.to_string()),
            mode: M::MODE,
            connected_at: SystemTime::now(),
            snapshot_version: None,
            types: Vec::new(),
            unknown_type_urls: Vec::new(),
            transport: outbox.meter().clone(),
        },
        machine.clone(),
    );
    let span = tracing::info_span!("ads", stream = handle.id(), proxy = %proxy.id);
    let stream = StreamIo {
        shared: &shared,
        snapshots,
        closing,
        inbound,
        outbox,
        handle,
    };
    // Boxed: the serving loop's state (the pending request, the select) lives once, on
    // the heap, instead of beside this function's own in the task (a per-stream cost).
    Box::pin(stream.serve(machine, first, peer))
        .instrument(span)
        .await;
}

/// The I/O side of one registered stream.
struct StreamIo<'a, M: StreamMachine> {
    shared: &'a Shared,
    snapshots: SnapshotReceiver,
    /// The connection's closing signal (max age or drain), when served by our listener.
    closing: Option<ConnectionClosing>,
    inbound: RequestStream<M::Request>,
    outbox: Outbox,
    handle: StreamHandle,
}

/// A push in progress on one stream: the arrival of the snapshot that started it, and
/// whether it has sent anything yet.
struct Converging {
    arrived: Instant,
    sent: bool,
}

impl<M: StreamMachine> StreamIo<'_, M> {
    async fn serve(self, machine: Arc<Mutex<M>>, first: Box<M::Request>, peer: Option<SocketAddr>) {
        let StreamIo {
            shared,
            mut snapshots,
            closing,
            mut inbound,
            outbox,
            handle: _registered,
        } = self;
        // Never held across an await; the registry only reads it.
        let machine = || machine.lock().unwrap_or_else(|e| e.into_inner());
        debug!(peer = ?peer, mode = ?M::MODE, "ADS stream opened");
        let events = machine().on_request(&first, SystemTime::now());
        absorb(&events);
        drop(first);
        if let Some(status) = over_limit(&events) {
            outbox.end(status);
            return;
        }
        let mut publisher_alive = true;
        // The body asked for a message and has not been given one yet.
        let mut wanted = false;
        let mut converging: Option<Converging> = None;
        loop {
            if wanted {
                let mut machine = machine();
                // No room: the request was stale (the body still holds a message and
                // asks again once it is sent). Nothing handed over: everything owed was
                // unchanged, and the body still waits.
                if machine.has_owed()
                    && (!outbox.has_room()
                        || hand_over(shared, &mut *machine, &outbox, &mut converging))
                {
                    wanted = false;
                }
            }
            tokio::select! {
                biased;
                () = ConnectionClosing::wait(closing.as_ref()) => {
                    debug!("the ADS connection is ending (maximum age or drain)");
                    outbox.end(connection_ending());
                    break;
                }
                () = outbox.closed() => {
                    debug!("the client reset the ADS stream");
                    break;
                }
                () = outbox.wanted(), if !wanted => wanted = true,
                message = inbound.message() => match message {
                    Ok(Some(request)) => {
                        let events = machine().on_request(&request, SystemTime::now());
                        absorb(&events);
                        if let Some(status) = over_limit(&events) {
                            outbox.end(status);
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        debug!(%status, "ADS stream ended by the client");
                        break;
                    }
                },
                // Only marks what is owed: the responses are computed when the body asks,
                // from the newest snapshot, so a snapshot that arrives before the previous
                // one was sent replaces it.
                changed = snapshots.changed(), if publisher_alive => {
                    if changed.is_err() {
                        publisher_alive = false;
                        continue;
                    }
                    let Some(stamped) = snapshots.borrow_and_update().clone() else {
                        continue;
                    };
                    let mut machine = machine();
                    machine.on_snapshot(stamped.snapshot);
                    if machine.has_owed() && converging.is_none() {
                        converging = Some(Converging { arrived: stamped.arrived, sent: false });
                    }
                }
            }
        }
        debug!("ADS stream closed");
    }
}

/// Computes the next response and hands it to the body (which has room: it asked).
/// `false` when there was nothing to send.
fn hand_over<M: StreamMachine>(
    shared: &Shared,
    machine: &mut M,
    outbox: &Outbox,
    converging: &mut Option<Converging>,
) -> bool {
    let started = Instant::now();
    let Some(response) = machine.next_response(SystemTime::now()) else {
        // Everything owed turned out unchanged.
        finish_convergence(converging);
        return false;
    };
    let (xds_type, encoded) = M::encode(&response, &shared.control_plane);
    drop(response);
    let label = xds_type.short_name();
    metrics::XDS_PUSHES.with_label_values(&[label]).inc();
    metrics::XDS_PUSH_TIME
        .with_label_values(&[label])
        .observe(started.elapsed().as_secs_f64());
    metrics::XDS_SENT_BYTES
        .with_label_values(&[label])
        .inc_by(encoded.len() as u64);
    if let Some(c) = converging.as_mut() {
        c.sent = true;
    }
    // Observed before the hand-off so the sample exists by the time the client can see
    // the last response.
    if !machine.has_owed() {
        finish_convergence(converging);
    }
    let handed = outbox.try_send(encoded);
    debug_assert!(handed, "the body asked and its slot is free");
    true
}

fn finish_convergence(converging: &mut Option<Converging>) {
    if let Some(c) = converging.take()
        && c.sent
    {
        metrics::PROXY_CONVERGENCE_TIME.observe(c.arrived.elapsed().as_secs_f64());
    }
}

/// How a stream ends when its connection is being closed by this replica: the client has
/// already received GOAWAY and reconnects over a new connection.
fn connection_ending() -> Status {
    Status::unavailable(
        "this connection is being closed by the xDS server (maximum age or shutdown); reconnect",
    )
}

/// The status that ends a stream whose client went past a per-stream limit: type URLs
/// nobody serves, and resource names that are not UTF-8, are a malformed request
/// (`INVALID_ARGUMENT`); a subscription beyond the
/// name caps is a valid request beyond this server's per-stream quota, which gRPC spells
/// `RESOURCE_EXHAUSTED` (Envoy and gRPC clients retry either with backoff; the code tells
/// an operator which it was).
fn over_limit(events: &[ProtocolEvent]) -> Option<Status> {
    events.iter().find_map(|e| match e {
        ProtocolEvent::OverLimit { limit, reason } => {
            let past = || format!("this ADS stream went past a limit: {reason}");
            Some(match limit {
                Limit::TypeUrls => Status::invalid_argument(past()),
                Limit::SubscribedNames => Status::resource_exhausted(past()),
                Limit::Malformed => {
                    Status::invalid_argument(format!("malformed request: {reason}"))
                }
            })
        }
        _ => None,
    })
}

/// Turns a machine's events into metrics and logs.
fn absorb(events: &[ProtocolEvent]) {
    for event in events {
        match event {
            ProtocolEvent::Ack { xds_type, nonce } => debug!(%xds_type, nonce, "ACK"),
            ProtocolEvent::Nack {
                xds_type,
                nonce,
                detail,
            } => {
                metrics::XDS_REJECTS
                    .with_label_values(&[xds_type.short_name()])
                    .inc();
                warn!(%xds_type, nonce, detail, "NACK: the proxy rejected its configuration");
            }
            ProtocolEvent::StaleNonce { xds_type, nonce } => {
                metrics::STALE_NONCES.inc();
                debug!(%xds_type, nonce, "ignoring request with a stale nonce");
            }
            ProtocolEvent::OverLimit { limit, reason } => {
                metrics::STREAMS_REFUSED
                    .with_label_values(&[limit.label()])
                    .inc();
                warn!(
                    reason,
                    "ending an ADS stream that went past a per-stream limit"
                );
            }
            ProtocolEvent::UnknownType {
                type_url,
                first_time,
            } => {
                metrics::UNKNOWN_TYPES.inc();
                if *first_time {
                    warn!(
                        type_url,
                        "ignoring requests for a type URL this server does not serve"
                    );
                }
            }
        }
    }
}

impl<M: StreamMachine> LiveStatus for Mutex<M> {
    fn live(&self) -> (u64, Vec<TypeStatus>, Vec<String>) {
        let machine = self.lock().unwrap_or_else(|e| e.into_inner());
        let (types, unknown) = machine.status();
        (machine.snapshot_version(), types, unknown)
    }
}
