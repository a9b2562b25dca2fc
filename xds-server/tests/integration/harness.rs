//! Test harness: an ADS server on an ephemeral 127.0.0.1 port fed by a `watch` of
//! [`MapSnapshot`]s, and thin SotW/delta clients with bounded waits.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use pilotfish_xds::ads::ConnectionRegistry;
use pilotfish_xds::ads::{self, AdsConfig, MapSnapshot, StampedSnapshot};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Streaming;

/// Upper bound for anything expected to happen; only reached when a test fails.
pub const PATIENCE: Duration = Duration::from_secs(10);
/// How long "nothing arrives" is watched for.
pub const QUIET: Duration = Duration::from_millis(300);

pub const NODE_ID: &str = "sidecar~10.0.0.1~app-1.shop~shop.svc.cluster.local";

pub struct TestServer {
    pub addr: std::net::SocketAddr,
    pub registry: ConnectionRegistry,
    snapshots: watch::Sender<Option<StampedSnapshot>>,
    drain: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), ads::AdsError>>>,
}

impl TestServer {
    /// A server named `replica` serving `snapshot` (none yet when `None`).
    pub async fn start(replica: &str, snapshot: Option<MapSnapshot>) -> TestServer {
        Self::start_with(
            AdsConfig {
                replica_name: replica.into(),
                ..AdsConfig::default()
            },
            snapshot,
        )
        .await
    }

    pub async fn start_with(config: AdsConfig, snapshot: Option<MapSnapshot>) -> TestServer {
        Self::start_stamped(config, snapshot.map(MapSnapshot::stamped)).await
    }

    /// A server serving any snapshot (e.g. a `GeneratedSnapshot`).
    pub async fn start_stamped(config: AdsConfig, snapshot: Option<StampedSnapshot>) -> TestServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let (snapshots, rx) = watch::channel(snapshot);
        let registry = ConnectionRegistry::new();
        let drain = CancellationToken::new();
        let task = tokio::spawn(ads::serve(
            listener,
            rx,
            registry.clone(),
            config,
            drain.clone(),
        ));
        TestServer {
            addr,
            registry,
            snapshots,
            drain,
            task: Some(task),
        }
    }

    pub fn publish(&self, snapshot: MapSnapshot) {
        self.snapshots.send_replace(Some(snapshot.stamped()));
    }

    async fn client(&self) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
        AggregatedDiscoveryServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect to the test ADS server")
    }

    /// Opens a SotW stream whose first request is `first`.
    pub async fn sotw(&self, first: DiscoveryRequest) -> Result<Sotw, tonic::Status> {
        let client = self.client().await;
        Self::sotw_on(client, first).await
    }

    /// A client on its own connection whose HTTP/2 receive windows are `window` bytes: a
    /// client that stops reading stops the server after that much.
    async fn client_with_window(
        &self,
        window: u32,
    ) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("endpoint")
            .initial_stream_window_size(window)
            .initial_connection_window_size(window)
            .connect()
            .await
            .expect("connect to the test ADS server");
        AggregatedDiscoveryServiceClient::new(channel)
    }

    /// Opens a SotW stream on its own connection with `window`-byte HTTP/2 windows.
    pub async fn sotw_with_window(
        &self,
        first: DiscoveryRequest,
        window: u32,
    ) -> Result<Sotw, tonic::Status> {
        Self::sotw_on(self.client_with_window(window).await, first).await
    }

    /// Opens a delta stream on its own connection with `window`-byte HTTP/2 windows.
    pub async fn delta_with_window(
        &self,
        first: DeltaDiscoveryRequest,
        window: u32,
    ) -> Result<Delta, tonic::Status> {
        Self::delta_on(self.client_with_window(window).await, first).await
    }

    /// A client on its own connection from the local address `local` (any 127.0.0.0/8
    /// address works on Linux), so admission sees it as its own peer.
    pub async fn client_from(
        &self,
        local: std::net::IpAddr,
    ) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("endpoint")
            .local_address(Some(local))
            .connect()
            .await
            .expect("connect to the test ADS server");
        AggregatedDiscoveryServiceClient::new(channel)
    }

    /// Opens a SotW stream over `client` (streams of one client share its connection).
    pub async fn sotw_on(
        mut client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
        first: DiscoveryRequest,
    ) -> Result<Sotw, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.expect("queue first request");
        let inbound = tokio::time::timeout(
            PATIENCE,
            client.stream_aggregated_resources(ReceiverStream::new(rx)),
        )
        .await
        .expect("stream opened in time")?
        .into_inner();
        Ok(Sotw { tx, inbound })
    }

    pub async fn delta(&self, first: DeltaDiscoveryRequest) -> Result<Delta, tonic::Status> {
        Self::delta_on(self.client().await, first).await
    }

    /// Opens a delta stream over `client`.
    pub async fn delta_on(
        mut client: AggregatedDiscoveryServiceClient<tonic::transport::Channel>,
        first: DeltaDiscoveryRequest,
    ) -> Result<Delta, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await.expect("queue first request");
        let inbound = tokio::time::timeout(
            PATIENCE,
            client.delta_aggregated_resources(ReceiverStream::new(rx)),
        )
        .await
        .expect("stream opened in time")?
        .into_inner();
        Ok(Delta { tx, inbound })
    }

    /// Stops the server and waits for it to return.
    pub async fn stop(mut self) {
        self.drain.cancel();
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(PATIENCE, task)
                .await
                .expect("server stopped in time");
            result.expect("server task").expect("server result");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

pub fn node(id: &str) -> Option<Node> {
    Some(Node {
        id: id.into(),
        ..Default::default()
    })
}

pub fn request(type_url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.into(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

/// The first request of a stream: with the standard node.
pub fn first(type_url: &str, names: &[&str]) -> DiscoveryRequest {
    DiscoveryRequest {
        node: node(NODE_ID),
        ..request(type_url, names, "")
    }
}

pub fn nack(type_url: &str, names: &[&str], nonce: &str, detail: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        error_detail: Some(RpcStatus {
            code: 3,
            message: detail.into(),
            details: vec![],
        }),
        ..request(type_url, names, nonce)
    }
}

pub fn delta_request(
    type_url: &str,
    subscribe: &[&str],
    unsubscribe: &[&str],
    nonce: &str,
) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
        resource_names_unsubscribe: unsubscribe.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

pub fn delta_first(type_url: &str, subscribe: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        node: node(NODE_ID),
        ..delta_request(type_url, subscribe, &[], "")
    }
}

/// A SotW client stream.
pub struct Sotw {
    tx: mpsc::Sender<DiscoveryRequest>,
    pub inbound: Streaming<DiscoveryResponse>,
}

impl Sotw {
    pub async fn send(&self, request: DiscoveryRequest) {
        self.tx.send(request).await.expect("send request");
    }

    /// The next response; fails the test when none comes in time.
    pub async fn recv(&mut self) -> DiscoveryResponse {
        match tokio::time::timeout(PATIENCE, self.inbound.message()).await {
            Ok(Ok(Some(r))) => r,
            other => panic!("expected a response, got {other:?}"),
        }
    }

    /// Asserts that no response arrives for a while.
    pub async fn expect_silence(&mut self) {
        if let Ok(message) = tokio::time::timeout(QUIET, self.inbound.message()).await {
            panic!("expected no response, got {message:?}");
        }
    }

    /// Sends the ACK of `response` (same names as `names`).
    pub async fn ack(&self, response: &DiscoveryResponse, names: &[&str]) {
        let mut r = request(&response.type_url, names, &response.nonce);
        r.version_info = response.version_info.clone();
        self.send(r).await;
    }
}

/// A delta client stream.
pub struct Delta {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    pub inbound: Streaming<DeltaDiscoveryResponse>,
}

impl Delta {
    pub async fn send(&self, request: DeltaDiscoveryRequest) {
        self.tx.send(request).await.expect("send request");
    }

    pub async fn recv(&mut self) -> DeltaDiscoveryResponse {
        match tokio::time::timeout(PATIENCE, self.inbound.message()).await {
            Ok(Ok(Some(r))) => r,
            other => panic!("expected a response, got {other:?}"),
        }
    }

    pub async fn expect_silence(&mut self) {
        if let Ok(message) = tokio::time::timeout(QUIET, self.inbound.message()).await {
            panic!("expected no response, got {message:?}");
        }
    }

    pub async fn ack(&self, response: &DeltaDiscoveryResponse) {
        self.send(delta_request(&response.type_url, &[], &[], &response.nonce))
            .await;
    }
}

/// Payloads (the test resources' bytes) of a SotW response, in order.
pub fn payloads(response: &DiscoveryResponse) -> Vec<String> {
    response
        .resources
        .iter()
        .map(|a| String::from_utf8_lossy(&a.value).into_owned())
        .collect()
}

/// Names of a delta response's resources.
pub fn names(response: &DeltaDiscoveryResponse) -> Vec<String> {
    response.resources.iter().map(|r| r.name.clone()).collect()
}

/// Waits until `condition` holds; fails the test after [`PATIENCE`].
pub async fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
