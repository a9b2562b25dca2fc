//! The SotW ADS state machine (`pilotfish_xds::ads::SotwStream::on_request`) fed requests
//! decoded from the input as an unauthenticated client would send them: the input is a
//! sequence of length-prefixed (1 byte) protobuf `DiscoveryRequest`s, each answered from a
//! sample snapshot; the nonce of each response is echoed back by a following request when
//! the request asks for it (its `response_nonce` is `"?"`), so ACK and NACK paths are
//! reached too. Any panic is a bug.
#![no_main]

use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use libfuzzer_sys::fuzz_target;
use pilotfish_mesh::model::Proxy;
use pilotfish_xds::ads::{MapSnapshot, SotwStream, XdsSnapshot};
use prost::Message;

static SNAPSHOT: LazyLock<Arc<dyn XdsSnapshot>> =
    LazyLock::new(|| Arc::new(MapSnapshot::sample(1)));

fuzz_target!(|data: &[u8]| {
    let proxy = Arc::new(Proxy::with_defaults(
        "sidecar~10.0.0.1~a-0.ns~ns.svc.cluster.local".to_string(),
    ));
    let mut stream = SotwStream::new(proxy, "fuzz", SNAPSHOT.clone());
    let mut last_nonce = String::new();
    let mut rest = data;
    // Bounded: at most 64 requests per input.
    for _ in 0..64 {
        let Some((&len, tail)) = rest.split_first() else {
            break;
        };
        let len = usize::from(len).min(tail.len());
        let (message, tail) = tail.split_at(len);
        rest = tail;
        let Ok(mut request) = DiscoveryRequest::decode(message) else {
            continue;
        };
        if request.response_nonce == "?" {
            request.response_nonce = last_nonce.clone();
        }
        let out = stream.on_request(&request, SystemTime::UNIX_EPOCH);
        if let Some(nonce) = out.responses.last().map(|r| r.nonce.clone()) {
            last_nonce = nonce;
        }
    }
    let _ = stream.status();
});
