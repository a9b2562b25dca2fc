//! The ADS protocol engine: `StreamAggregatedResources` (SotW) and
//! `DeltaAggregatedResources` over tonic, with one synchronous state machine per stream.
//!
//! Public surface:
//! - [`XdsSnapshot`], [`Resource`], [`ChangeKind`]: the seam the generators implement;
//!   [`MapSnapshot`] is a map-backed one for tests and load tools.
//! - [`SotwStream`], [`DeltaStream`]: the per-stream protocol state machines.
//! - [`AdsServer`] (the tonic service), [`AdsConfig`], and [`serve`] to run it on a listener.
//! - [`ConnectionRegistry`]: the open streams and their per-type status records
//!   ([`TypeStatus`]: last sent, ACK, NACK), for `/debug/adsz` and `/debug/syncz`.
//! - [`XdsType`] and the four served type URLs.

mod connection;
mod delta;
mod map_snapshot;
mod push;
mod registry;
mod resource;
mod service;
mod sotw;
mod state;
mod types;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use connection::{ConnectionClosing, ConnectionPolicy};
pub(crate) use connection::{Transport, serve_connections};
pub use delta::DeltaStream;
pub use map_snapshot::MapSnapshot;
pub use registry::{
    ConnectionRegistry, StreamHandle, StreamMode, StreamStatus, SyncStatus, TypeSync,
};
pub use resource::{
    ChangeKind, Resource, SnapshotReceiver, SnapshotSender, StampedSnapshot, XdsSnapshot,
    content_version,
};
pub use service::{AdsConfig, AdsError, AdsServer};
pub use sotw::SotwStream;
pub use state::{
    AckStatus, NackStatus, Output, ProtocolEvent, SentStatus, Subscription, TypeStatus, WILDCARD,
};
pub use types::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE, XdsType};

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
        server.service(),
        connection::Plaintext,
        policy,
        drain,
        drain_grace,
    )
    .await;
    Ok(())
}
