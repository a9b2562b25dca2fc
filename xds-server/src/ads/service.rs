//! The tonic ADS service ([`AdsServer`]) and the async loop of each stream. The loop only
//! moves messages: it selects between the client's requests, the next snapshot and room
//! in the outbound channel, and hands requests and snapshots to the stream's synchronous
//! state machine ([`SotwStream`] or [`DeltaStream`]), which decides every response.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use pilotfish_mesh::model::Proxy;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tracing::{Instrument, debug, info, warn};

use super::connection::{ConnectionClosing, ConnectionPolicy};
use super::delta::DeltaStream;
use super::push::{PushLimiter, StreamRate};
use super::registry::{ConnectionRegistry, StreamHandle, StreamMode, StreamStatus};
use super::resource::{SnapshotReceiver, XdsSnapshot};
use super::sotw::SotwStream;
use super::state::TypeStatus;
use super::state::{Output, ProtocolEvent};
use super::types::XdsType;
use crate::identity::{Caller, authorize_node};
use crate::metrics;
use crate::node::{ParsedNode, parse_node};

/// Settings of the ADS engine.
#[derive(Clone, Debug)]
pub struct AdsConfig {
    /// `control_plane.identifier` of every response (`--replica-name`).
    pub replica_name: String,
    /// Streams computing a full push at once.
    pub push_concurrency: usize,
    /// Streams computing an endpoints-only push at once (a separate pool).
    pub endpoint_push_concurrency: usize,
    /// Responses buffered per stream in the channel to the transport; beyond it they wait
    /// in the stream's own queue and the stream stops taking new snapshots until drained.
    pub outbound_buffer: usize,
    /// How long a new stream may take to send its first request.
    pub first_request_timeout: Duration,
    /// How client connections are kept and ended (maximum age with jitter, GOAWAY).
    pub connections: ConnectionPolicy,
    /// On shutdown, connections are ended at random moments within this grace, so their
    /// clients reconnect to other replicas spread over time rather than all at once.
    pub drain_grace: Duration,
    /// New streams accepted per second (burst: twice that); beyond it a new stream is
    /// refused at once with `UNAVAILABLE`, so the client retries another replica instead
    /// of piling onto this one. `None`: no limit.
    pub new_streams_per_second: Option<f64>,
}

impl Default for AdsConfig {
    fn default() -> Self {
        AdsConfig {
            replica_name: "pilotfish-xds".to_string(),
            push_concurrency: 64,
            endpoint_push_concurrency: 64,
            outbound_buffer: 8,
            first_request_timeout: Duration::from_secs(30),
            connections: ConnectionPolicy::default(),
            drain_grace: Duration::ZERO,
            new_streams_per_second: None,
        }
    }
}

/// Why the ADS server (`ads::serve`) stopped.
#[derive(Debug, thiserror::Error)]
pub enum AdsError {
    #[error("ADS gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("cannot read the ADS listener's address: {0}")]
    Listener(#[source] std::io::Error),
}

struct Shared {
    snapshots: SnapshotReceiver,
    registry: ConnectionRegistry,
    config: AdsConfig,
    limiter: PushLimiter,
    /// Cancelled when the replica drains: new streams are refused.
    draining: CancellationToken,
    /// Admission of new streams (`new_streams_per_second`).
    stream_rate: Option<std::sync::Mutex<StreamRate>>,
}

/// The ADS gRPC service. Cheap to clone; every clone serves the same streams.
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
                limiter: PushLimiter::new(
                    config.push_concurrency,
                    config.endpoint_push_concurrency,
                ),
                stream_rate: config
                    .new_streams_per_second
                    .map(|rate| std::sync::Mutex::new(StreamRate::new(rate, Instant::now()))),
                config,
                draining,
            }),
        }
    }

    /// The tonic service to add to a server.
    pub fn service(&self) -> AggregatedDiscoveryServiceServer<AdsServer> {
        AggregatedDiscoveryServiceServer::new(self.clone())
    }

    pub fn registry(&self) -> &ConnectionRegistry {
        &self.shared.registry
    }

    /// Reads the first request of a stream and turns its node into a proxy. A stream of
    /// the secure port carries its authenticated `caller`, and its node must be one that
    /// caller may claim (`identity::authorize_node`).
    async fn accept<R>(
        &self,
        inbound: &mut Streaming<R>,
        node_of: impl FnOnce(&R) -> Result<ParsedNode, crate::node::NodeError>,
        caller: Option<&Caller>,
    ) -> Result<(R, Arc<Proxy>), Status> {
        if self.shared.draining.is_cancelled() {
            metrics::STREAMS_REFUSED
                .with_label_values(&["draining"])
                .inc();
            return Err(Status::unavailable(
                "this xDS replica is shutting down; reconnect to another",
            ));
        }
        if let Some(rate) = &self.shared.stream_rate {
            let admitted = rate
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .try_admit(Instant::now());
            if !admitted {
                metrics::STREAMS_REFUSED
                    .with_label_values(&["rate_limit"])
                    .inc();
                return Err(Status::unavailable(
                    "this xDS replica is taking new streams at its limit; retry (another replica may take it)",
                ));
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
        Ok((first, Arc::new(proxy)))
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsServer {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.open::<SotwStream>(request).await
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.open::<DeltaStream>(request).await
    }
}

impl AdsServer {
    /// Admits a stream (first request, node, rate limit) and starts its task; SotW and
    /// delta differ only in their state machine.
    async fn open<M: Machine>(
        &self,
        request: Request<Streaming<M::Request>>,
    ) -> Result<Response<ReceiverStream<Result<M::Response, Status>>>, Status> {
        let origin = Origin::of(&request);
        let caller = request.extensions().get::<Caller>().cloned();
        let mut inbound = request.into_inner();
        let (first, proxy) = self
            .accept(
                &mut inbound,
                |r: &M::Request| parse_node(M::node(r)),
                caller.as_ref(),
            )
            .await?;
        let (tx, rx) = mpsc::channel(self.shared.config.outbound_buffer.max(1));
        let replica = self.shared.config.replica_name.clone();
        let make = move |proxy: Arc<Proxy>, snapshot| M::new(proxy, &replica, snapshot);
        tokio::spawn(run_stream(
            self.shared.clone(),
            proxy,
            origin,
            first,
            inbound,
            tx,
            make,
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// What the stream loop needs of a state machine; SotW and delta differ only here.
trait Machine: Send + 'static {
    type Request: Send + 'static;
    type Response: Send + 'static;
    const MODE: StreamMode;
    fn new(proxy: Arc<Proxy>, replica: &str, snapshot: Arc<dyn XdsSnapshot>) -> Self;
    /// The node of a request (only the first one is guaranteed to carry it).
    fn node(request: &Self::Request) -> Option<&Node>;
    fn on_request(&mut self, request: &Self::Request, now: SystemTime) -> Output<Self::Response>;
    fn on_snapshot(
        &mut self,
        snapshot: Arc<dyn XdsSnapshot>,
        now: SystemTime,
    ) -> Output<Self::Response>;
    fn status(&self) -> (Vec<TypeStatus>, Vec<String>);
    fn snapshot_version(&self) -> u64;
    fn type_url(response: &Self::Response) -> &str;
}

// The stream loop drives the state machines through this trait; each method is the
// machine's own (inherent) one.
impl Machine for SotwStream {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const MODE: StreamMode = StreamMode::Sotw;
    fn new(proxy: Arc<Proxy>, replica: &str, snapshot: Arc<dyn XdsSnapshot>) -> Self {
        SotwStream::new(proxy, replica, snapshot)
    }
    fn node(request: &DiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }
    fn on_request(
        &mut self,
        request: &DiscoveryRequest,
        now: SystemTime,
    ) -> Output<DiscoveryResponse> {
        SotwStream::on_request(self, request, now)
    }
    fn on_snapshot(
        &mut self,
        snapshot: Arc<dyn XdsSnapshot>,
        now: SystemTime,
    ) -> Output<DiscoveryResponse> {
        SotwStream::on_snapshot(self, snapshot, now)
    }
    fn status(&self) -> (Vec<TypeStatus>, Vec<String>) {
        SotwStream::status(self)
    }
    fn snapshot_version(&self) -> u64 {
        SotwStream::snapshot_version(self)
    }
    fn type_url(response: &DiscoveryResponse) -> &str {
        &response.type_url
    }
}

impl Machine for DeltaStream {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    const MODE: StreamMode = StreamMode::Delta;
    fn new(proxy: Arc<Proxy>, replica: &str, snapshot: Arc<dyn XdsSnapshot>) -> Self {
        DeltaStream::new(proxy, replica, snapshot)
    }
    fn node(request: &DeltaDiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }
    fn on_request(
        &mut self,
        request: &DeltaDiscoveryRequest,
        now: SystemTime,
    ) -> Output<DeltaDiscoveryResponse> {
        DeltaStream::on_request(self, request, now)
    }
    fn on_snapshot(
        &mut self,
        snapshot: Arc<dyn XdsSnapshot>,
        now: SystemTime,
    ) -> Output<DeltaDiscoveryResponse> {
        DeltaStream::on_snapshot(self, snapshot, now)
    }
    fn status(&self) -> (Vec<TypeStatus>, Vec<String>) {
        DeltaStream::status(self)
    }
    fn snapshot_version(&self) -> u64 {
        DeltaStream::snapshot_version(self)
    }
    fn type_url(response: &DeltaDiscoveryResponse) -> &str {
        &response.type_url
    }
}

/// Per-stream mutable loop state besides the machine.
struct Outbox<R> {
    pending: VecDeque<R>,
    /// Arrival time of the oldest snapshot whose responses are still queued.
    converging: Option<Instant>,
}

/// Where a stream came from: its peer and its connection's closing signal.
struct Origin {
    peer: Option<SocketAddr>,
    closing: Option<ConnectionClosing>,
}

impl Origin {
    fn of<T>(request: &Request<T>) -> Self {
        Origin {
            peer: request.remote_addr(),
            closing: request.extensions().get::<ConnectionClosing>().cloned(),
        }
    }
}

/// One stream, from its first request to its end.
async fn run_stream<M: Machine>(
    shared: Arc<Shared>,
    proxy: Arc<Proxy>,
    origin: Origin,
    first: M::Request,
    inbound: Streaming<M::Request>,
    tx: mpsc::Sender<Result<M::Response, Status>>,
    make: impl FnOnce(Arc<Proxy>, Arc<dyn XdsSnapshot>) -> M + Send + 'static,
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
            _ = tx.closed() => return,
            _ = ConnectionClosing::wait(closing.as_ref()) => {
                let _ = tx.try_send(Err(connection_ending()));
                return;
            }
        }
    };
    let machine = make(proxy.clone(), stamped.snapshot);
    let handle = shared.registry.register(StreamStatus {
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
    });
    let span = tracing::info_span!("ads", stream = handle.id(), proxy = %proxy.id);
    let stream = StreamIo {
        shared: &shared,
        snapshots,
        closing,
        inbound,
        tx,
        handle,
    };
    stream.serve(machine, first, peer).instrument(span).await;
}

/// The I/O side of one registered stream.
struct StreamIo<'a, M: Machine> {
    shared: &'a Shared,
    snapshots: SnapshotReceiver,
    /// The connection's closing signal (max age or drain), when served by our listener.
    closing: Option<ConnectionClosing>,
    inbound: Streaming<M::Request>,
    tx: mpsc::Sender<Result<M::Response, Status>>,
    handle: StreamHandle,
}

impl<M: Machine> StreamIo<'_, M> {
    async fn serve(self, mut machine: M, first: M::Request, peer: Option<SocketAddr>) {
        let StreamIo {
            shared,
            mut snapshots,
            closing,
            mut inbound,
            tx,
            handle,
        } = self;
        debug!(peer = ?peer, mode = ?M::MODE, "ADS stream opened");
        let mut outbox = Outbox {
            pending: VecDeque::new(),
            converging: None,
        };
        let out = machine.on_request(&first, SystemTime::now());
        absorb::<M>(out, &mut outbox, None);
        publish_status(&handle, &machine);
        let mut publisher_alive = true;
        loop {
            tokio::select! {
                biased;
                _ = ConnectionClosing::wait(closing.as_ref()) => {
                    debug!("the ADS connection is ending (maximum age or drain)");
                    let _ = tx.try_send(Err(connection_ending()));
                    break;
                }
                permit = tx.reserve(), if !outbox.pending.is_empty() => {
                    let Ok(permit) = permit else { break };
                    if let Some(response) = outbox.pending.pop_front() {
                        // Observed before the hand-off so the sample exists by the time
                        // the client can see the last response.
                        if outbox.pending.is_empty()
                            && let Some(arrived) = outbox.converging.take()
                        {
                            metrics::PROXY_CONVERGENCE_TIME.observe(arrived.elapsed().as_secs_f64());
                        }
                        permit.send(Ok(response));
                    }
                }
                message = inbound.message() => match message {
                    Ok(Some(request)) => {
                        let out = machine.on_request(&request, SystemTime::now());
                        absorb::<M>(out, &mut outbox, None);
                        publish_status(&handle, &machine);
                    }
                    Ok(None) => break,
                    Err(status) => {
                        debug!(%status, "ADS stream ended by the client");
                        break;
                    }
                },
                // A stream still sending an older push does not look at snapshots; when it is
                // done it reads only the newest one.
                changed = snapshots.changed(), if outbox.pending.is_empty() && publisher_alive => {
                    if changed.is_err() {
                        publisher_alive = false;
                        continue;
                    }
                    push(shared, &mut snapshots, &mut machine, &mut outbox).await;
                    publish_status(&handle, &machine);
                }
            }
        }
        debug!("ADS stream closed");
    }
}

/// How a stream ends when its connection is being closed by this replica: the client has
/// already received GOAWAY and reconnects over a new connection.
fn connection_ending() -> Status {
    Status::unavailable(
        "this connection is being closed by the xDS server (maximum age or shutdown); reconnect",
    )
}

/// Computes the responses for the newest snapshot under a push permit.
async fn push<M: Machine>(
    shared: &Shared,
    snapshots: &mut SnapshotReceiver,
    machine: &mut M,
    outbox: &mut Outbox<M::Response>,
) {
    let kind = match snapshots.borrow().as_ref() {
        Some(stamped) => stamped.snapshot.change_since(machine.snapshot_version()),
        None => return,
    };
    let _permit = shared.limiter.acquire(kind).await;
    // Newer snapshots may have arrived while waiting: take the newest.
    let Some(stamped) = snapshots.borrow_and_update().clone() else {
        return;
    };
    let started = Instant::now();
    let out = machine.on_snapshot(stamped.snapshot, SystemTime::now());
    absorb::<M>(out, outbox, Some((stamped.arrived, started.elapsed())));
}

/// Queues a machine's responses and turns its events into metrics and logs.
fn absorb<M: Machine>(
    out: Output<M::Response>,
    outbox: &mut Outbox<M::Response>,
    push: Option<(Instant, Duration)>,
) {
    for event in &out.events {
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
    for response in &out.responses {
        let label =
            XdsType::from_type_url(M::type_url(response)).map_or("unknown", XdsType::short_name);
        metrics::XDS_PUSHES.with_label_values(&[label]).inc();
        if let Some((_, took)) = push {
            metrics::XDS_PUSH_TIME
                .with_label_values(&[label])
                .observe(took.as_secs_f64());
        }
    }
    if let Some((arrived, _)) = push
        && !out.responses.is_empty()
    {
        outbox.converging.get_or_insert(arrived);
    }
    outbox.pending.extend(out.responses);
}

fn publish_status<M: Machine>(handle: &StreamHandle, machine: &M) {
    let (types, unknown) = machine.status();
    handle.update(machine.snapshot_version(), types, unknown);
}
