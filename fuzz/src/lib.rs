//! What the fuzz targets share: the driver that feeds an ADS state machine (SotW or
//! delta, through [`StreamMachine`]) requests decoded from the input as an
//! unauthenticated client would send them.

use std::sync::{Arc, LazyLock};
use std::time::SystemTime;

use pilotfish_mesh::model::Proxy;
use pilotfish_xds::ads::{
    CLUSTER_TYPE, MapSnapshot, NameSets, ProtocolEvent, ROUTE_TYPE, RequestMessage, ServedSnapshot,
    StreamMachine,
};

/// Two snapshots the input can move the stream between.
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

/// Feeds a new stream of `M` the input: a sequence of length-prefixed (1 byte) protobuf
/// requests of `M`'s kind; after each, every response the stream owes is taken (as a
/// transport that always has room would). A request whose `response_nonce` (reached
/// through `nonce_of`) is `"?"` echoes the last nonce sent, so ACK and NACK paths are
/// reached too; a length of 0 moves the stream to the other of the two snapshots. At most
/// 64 steps; the sequence ends where the machine ends the stream. Any panic is a bug.
pub fn drive_ads_stream<M: StreamMachine>(
    data: &[u8],
    nonce_of: fn(&mut M::Request) -> &mut String,
) {
    let proxy = Arc::new(Proxy::with_defaults(
        "sidecar~10.0.0.1~a-0.ns~ns.svc.cluster.local".to_string(),
    ));
    let mut stream = M::new(proxy, SNAPSHOTS[0].clone(), NameSets::new());
    let mut current = 0;
    let mut last_nonce = String::new();
    let mut rest = data;
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
            let Ok(mut request) =
                <M::Request as RequestMessage>::decode(bytes::Bytes::copy_from_slice(message))
            else {
                continue;
            };
            let nonce = nonce_of(&mut request);
            if nonce == "?" {
                *nonce = last_nonce.clone();
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
            last_nonce = M::nonce(&response).to_string();
        }
    }
    let _ = stream.status();
}
