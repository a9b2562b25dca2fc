//! The ADS protocol engine: `StreamAggregatedResources` (SotW) and
//! `DeltaAggregatedResources` over tonic, with one synchronous state machine per stream.
//!
//! Public surface:
//! - [`XdsSnapshot`], [`Resource`], [`ChangeKind`]: the seam the generators implement;
//!   [`MapSnapshot`] is a map-backed one for tests and load tools.
//! - [`SotwStream`], [`DeltaStream`]: the per-stream protocol state machines.
//! - [`AdsServer`] (the tonic service), [`AdsConfig`], and [`serve`] to run it on a listener.
//! - [`XdsType`] and the four served type URLs.

mod delta;
mod map_snapshot;
mod resource;
mod service;
mod sotw;
mod state;
mod types;

use std::future::Future;

use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;

pub use delta::DeltaStream;
pub use map_snapshot::MapSnapshot;
pub use resource::{ChangeKind, Resource, SnapshotReceiver, XdsSnapshot, content_version};
pub use service::{AdsConfig, AdsError, AdsServer};
pub use sotw::SotwStream;
pub use state::{Output, ProtocolEvent, Subscription, WILDCARD};
pub use types::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE, XdsType};

use crate::registry::ConnectionRegistry;

/// Copies a resource body into the Any type of the Envoy messages (`envoy-types` carries
/// its own `google.protobuf.Any`).
pub(crate) fn to_envoy_any(body: &prost_types::Any) -> envoy_types::pb::google::protobuf::Any {
    envoy_types::pb::google::protobuf::Any {
        type_url: body.type_url.clone(),
        value: body.value.clone(),
    }
}

/// Serves ADS on `listener` until `shutdown` completes, then ends every stream with
/// `UNAVAILABLE` (clients reconnect elsewhere) and returns once connections are closed.
pub async fn serve(
    listener: TcpListener,
    snapshots: SnapshotReceiver,
    registry: ConnectionRegistry,
    config: AdsConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AdsError> {
    let server = AdsServer::new(snapshots, registry, config);
    let closer = server.clone();
    tonic::transport::Server::builder()
        // Detects clients that vanished without closing their connection.
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .add_service(server.service())
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
            shutdown.await;
            closer.close_streams();
        })
        .await?;
    Ok(())
}
