//! The ADS protocol engine: `StreamAggregatedResources` (SotW) and
//! `DeltaAggregatedResources` over hyper's HTTP/2 with our own gRPC framing of the
//! responses, one synchronous state machine per stream, and every response body shared
//! by the streams that send it.
//!
//! Public surface:
//! - [`XdsSnapshot`], [`Resource`], [`ChangeKind`]: the seam the generators implement;
//!   [`MapSnapshot`] is a map-backed one for tests and load tools.
//! - [`ServedSnapshot`], [`View`]: a snapshot with the responses computed from it, shared
//!   by every stream; [`NameSets`], the interned subscriptions.
//! - [`SotwStream`], [`DeltaStream`]: the per-stream protocol state machines, the SotW
//!   request as the engine decodes it ([`SotwRequest`]: names not copied), and the
//!   responses they decide ([`SotwResponse`], [`DeltaResponse`]) with their encodings;
//!   [`StreamMachine`], the one interface their drivers (stream loop, fuzz targets) use.
//! - [`AdsServer`], [`AdsConfig`], and [`serve`] to run it on a listener; [`Admission`],
//!   the fair admission of new streams.
//! - [`ConnectionRegistry`]: the open streams and their per-type status records
//!   ([`TypeStatus`]: last sent, ACK, NACK), for `/debug/adsz` and `/debug/syncz`.
//! - [`XdsType`] and the four served type URLs.

mod admission;
mod connection;
mod delta;
mod grpc;
mod handshake;
mod intern;
pub(crate) use intern::WeakTable;
mod machine;
mod map_snapshot;
mod names;
#[cfg(test)]
mod props;
mod proto;
mod registry;
mod request;
mod resource;
mod service;
mod sotw;
mod state;
mod types;
mod view;
mod wire;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use admission::{Admission, MAX_ADMISSION_WAIT, Refusal};
pub use connection::{
    ConnectionClosing, ConnectionPolicy, DEFAULT_MAX_CONNECTIONS, LISTEN_BACKLOG, MAX_SEND_BUFFER,
    listen,
};
pub(crate) use connection::{Handler, Transport, serve_connections};
pub use delta::DeltaStream;
pub use grpc::AdsBody;
pub use grpc::{DELTA_PATH, SOTW_PATH, StreamMeter};
pub use machine::StreamMachine;
pub use map_snapshot::MapSnapshot;
pub use names::{NameSet, NameSets};
pub use registry::{
    ConnectionRegistry, LiveStatus, StreamHandle, StreamMode, StreamStatus, SyncStatus, TypeSync,
};
pub use request::{RequestDecodeError, RequestMessage, ResourceNames, SotwRequest};
pub use resource::{ChangeKind, Resource, ResourceMap, XdsSnapshot, content_version, shared_part};
pub use service::{AdsConfig, AdsError, AdsServer};
pub use sotw::SotwStream;
pub use state::{
    AckStatus, Limit, MAX_SUBSCRIBED_NAME_BYTES, MAX_SUBSCRIBED_NAMES, MAX_TYPE_URL_BYTES,
    MAX_UNKNOWN_TYPES, NackStatus, ProtocolEvent, SentStatus, Subscription, TypeStatus, WILDCARD,
};
pub use types::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE, XdsType};
pub use view::{ServedSnapshot, SnapshotReceiver, SnapshotSender, StampedSnapshot, View};
pub use wire::{
    ControlPlane, DeltaResources, DeltaResponse, Encoded, SotwResponse, encode_delta, encode_sotw,
};

/// Serves ADS on `listener` until `drain` is cancelled; then drains: new streams are
/// refused, the listener closes, and every connection ends (GOAWAY, its streams end with
/// `UNAVAILABLE`) at a random moment within `config.drain_grace`, so clients reconnect to
/// other replicas spread over time. Returns once the connections are closed.
pub async fn serve(
    listener: TcpListener,
    snapshots: SnapshotReceiver,
    registry: ConnectionRegistry,
    config: AdsConfig,
    drain: CancellationToken,
) -> Result<(), AdsError> {
    let policy = config.connections.clone();
    let drain_grace = config.drain_grace;
    let server = AdsServer::new(snapshots, registry, config, drain.clone());
    connection::serve_connections(
        listener,
        server,
        connection::Plaintext,
        policy,
        drain,
        drain_grace,
    )
    .await;
    Ok(())
}
