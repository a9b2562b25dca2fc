//! The SotW ADS state machine (`pilotfish_xds::ads::SotwStream`) fed requests decoded from
//! the input as an unauthenticated client would send them: the input is a sequence of
//! length-prefixed (1 byte) protobuf `DiscoveryRequest`s; after each, every response the
//! stream owes is taken (as a transport that always has room would). A request whose
//! `response_nonce` is `"?"` echoes the last nonce sent, so ACK and NACK paths are reached
//! too; a length of 0 moves the stream to the other of two snapshots. Any panic is a bug.
#![no_main]

use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use libfuzzer_sys::fuzz_target;
use pilotfish_mesh::model::Proxy;
use pilotfish_xds::ads::{
    CLUSTER_TYPE, MapSnapshot, NameSets, ProtocolEvent, ROUTE_TYPE, ServedSnapshot, SotwStream,
};
use prost::Message;

static SNAPSHOTS: LazyLock<[Arc<ServedSnapshot>; 2]> = LazyLock::new(|| {
    [
        ServedSnapshot::new(MapSnapshot::sample(1).shared()),
        ServedSnapshot::new(
            MapSnapshot::sample(2)
                .with(CLUSTER_TYPE, "c3", b"c3")
                .with(ROUTE_TYPE, "r1", b"r1-changed")
                .without(CLUSTER_TYPE, "c2")
                .shared(),
        ),
    ]
});

fuzz_target!(|data: &[u8]| {
    let proxy = Arc::new(Proxy::with_defaults(
        "sidecar~10.0.0.1~a-0.ns~ns.svc.cluster.local".to_string(),
    ));
    let mut stream = SotwStream::new(proxy, SNAPSHOTS[0].clone(), NameSets::new());
    let mut current = 0;
    let mut last_nonce = String::new();
    let mut rest = data;
    // Bounded: at most 64 steps per input.
    for _ in 0..64 {
        let Some((&len, tail)) = rest.split_first() else {
            break;
        };
        if len == 0 {
            current = 1 - current;
            stream.on_snapshot(SNAPSHOTS[current].clone());
            rest = tail;
        } else {
            let len = usize::from(len).min(tail.len());
            let (message, tail) = tail.split_at(len);
            rest = tail;
            let Ok(mut request) = DiscoveryRequest::decode(message) else {
                continue;
            };
            if request.response_nonce == "?" {
                request.response_nonce = last_nonce.clone();
            }
            let events = stream.on_request(&request, SystemTime::UNIX_EPOCH);
            if events
                .iter()
                .any(|e| matches!(e, ProtocolEvent::OverLimit { .. }))
            {
                // The stream ends here.
                break;
            }
        }
        while let Some(response) = stream.next_response(SystemTime::UNIX_EPOCH) {
            last_nonce = response.nonce.clone();
        }
    }
    let _ = stream.status();
});
