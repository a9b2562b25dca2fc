//! [`StreamMachine`]: the one interface of the two per-stream state machines
//! ([`SotwStream`], [`DeltaStream`]) that their drivers use — the stream loop in
//! `service.rs`, and the fuzz targets — so each driver is written once for both modes.

use std::sync::Arc;
use std::time::SystemTime;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use pilotfish_mesh::model::Proxy;

use super::delta::DeltaStream;
use super::names::NameSets;
use super::registry::StreamMode;
use super::request::{RequestMessage, SotwRequest};
use super::sotw::SotwStream;
use super::state::{ProtocolEvent, TypeStatus};
use super::types::XdsType;
use super::view::ServedSnapshot;
use super::wire::{ControlPlane, DeltaResponse, Encoded, SotwResponse, encode_delta, encode_sotw};

/// What a driver of a state machine needs of it — the stream loop, and the fuzz targets
/// that feed it requests; SotW and delta differ only here.
pub trait StreamMachine: Send + 'static {
    type Request: RequestMessage;
    type Response: Send;
    const MODE: StreamMode;
    fn new(proxy: Arc<Proxy>, snapshot: Arc<ServedSnapshot>, names: Arc<NameSets>) -> Self;
    /// The node of a request (only the first one is guaranteed to carry it).
    fn node(request: &Self::Request) -> Option<&Node>;
    fn on_request(&mut self, request: &Self::Request, now: SystemTime) -> Vec<ProtocolEvent>;
    fn on_snapshot(&mut self, snapshot: Arc<ServedSnapshot>);
    fn has_owed(&self) -> bool;
    fn next_response(&mut self, now: SystemTime) -> Option<Self::Response>;
    fn encode(response: &Self::Response, control_plane: &ControlPlane) -> (XdsType, Encoded);
    fn status(&self) -> (Vec<TypeStatus>, Vec<String>);
    fn snapshot_version(&self) -> u64;
    /// The nonce a response carries (what the client's next request echoes).
    fn nonce(response: &Self::Response) -> &str;
}

// The stream loop drives the state machines through this trait; each method is the
// machine's own (inherent) one.
impl StreamMachine for SotwStream {
    type Request = SotwRequest;
    type Response = SotwResponse;
    const MODE: StreamMode = StreamMode::Sotw;
    fn new(proxy: Arc<Proxy>, snapshot: Arc<ServedSnapshot>, names: Arc<NameSets>) -> Self {
        SotwStream::new(proxy, snapshot, names)
    }
    fn node(request: &SotwRequest) -> Option<&Node> {
        request.node.as_deref()
    }
    fn on_request(&mut self, request: &SotwRequest, now: SystemTime) -> Vec<ProtocolEvent> {
        SotwStream::on_request(self, request, now)
    }
    fn on_snapshot(&mut self, snapshot: Arc<ServedSnapshot>) {
        SotwStream::on_snapshot(self, snapshot)
    }
    fn has_owed(&self) -> bool {
        SotwStream::has_owed(self)
    }
    fn next_response(&mut self, now: SystemTime) -> Option<SotwResponse> {
        SotwStream::next_response(self, now)
    }
    fn encode(response: &SotwResponse, control_plane: &ControlPlane) -> (XdsType, Encoded) {
        (response.xds_type(), encode_sotw(response, control_plane))
    }
    fn status(&self) -> (Vec<TypeStatus>, Vec<String>) {
        SotwStream::status(self)
    }
    fn snapshot_version(&self) -> u64 {
        SotwStream::snapshot_version(self)
    }
    fn nonce(response: &SotwResponse) -> &str {
        &response.nonce
    }
}

impl StreamMachine for DeltaStream {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaResponse;
    const MODE: StreamMode = StreamMode::Delta;
    fn new(proxy: Arc<Proxy>, snapshot: Arc<ServedSnapshot>, names: Arc<NameSets>) -> Self {
        DeltaStream::new(proxy, snapshot, names)
    }
    fn node(request: &DeltaDiscoveryRequest) -> Option<&Node> {
        request.node.as_ref()
    }
    fn on_request(
        &mut self,
        request: &DeltaDiscoveryRequest,
        now: SystemTime,
    ) -> Vec<ProtocolEvent> {
        DeltaStream::on_request(self, request, now)
    }
    fn on_snapshot(&mut self, snapshot: Arc<ServedSnapshot>) {
        DeltaStream::on_snapshot(self, snapshot)
    }
    fn has_owed(&self) -> bool {
        DeltaStream::has_owed(self)
    }
    fn next_response(&mut self, now: SystemTime) -> Option<DeltaResponse> {
        DeltaStream::next_response(self, now)
    }
    fn encode(response: &DeltaResponse, control_plane: &ControlPlane) -> (XdsType, Encoded) {
        (response.xds_type, encode_delta(response, control_plane))
    }
    fn status(&self) -> (Vec<TypeStatus>, Vec<String>) {
        DeltaStream::status(self)
    }
    fn snapshot_version(&self) -> u64 {
        DeltaStream::snapshot_version(self)
    }
    fn nonce(response: &DeltaResponse) -> &str {
        &response.nonce
    }
}
