//! Backpressure over a real socket: a client that stops reading holds the server to one
//! response in flight, whatever is pushed meanwhile, and the other streams converge — for
//! SotW and for delta streams (the same pending-response code serves both, but each
//! protocol builds its responses differently).

use pilotfish_xds::ads::{CLUSTER_TYPE, MAX_SEND_BUFFER, MapSnapshot, StreamStatus};

use crate::harness::*;

/// One cluster of `size` bytes whose content names the snapshot version.
fn big(version: u64, size: usize) -> MapSnapshot {
    let mut payload = format!("v{version:04}:").into_bytes();
    payload.resize(size, b'x');
    MapSnapshot::new(version).with(CLUSTER_TYPE, "c", &payload)
}

fn version_of(payload: &[u8]) -> u64 {
    std::str::from_utf8(&payload[1..5])
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A wildcard CDS stream of either protocol.
enum Client {
    Sotw(Sotw),
    Delta(Delta),
}

impl Client {
    /// Opens a stream; with `window`, on its own connection with that HTTP/2 window.
    async fn open(server: &TestServer, delta: bool, window: Option<u32>) -> Client {
        match (delta, window) {
            (false, None) => Client::Sotw(server.sotw(first(CLUSTER_TYPE, &[])).await.unwrap()),
            (false, Some(w)) => Client::Sotw(
                server
                    .sotw_with_window(first(CLUSTER_TYPE, &[]), w)
                    .await
                    .unwrap(),
            ),
            (true, None) => {
                Client::Delta(server.delta(delta_first(CLUSTER_TYPE, &[])).await.unwrap())
            }
            (true, Some(w)) => Client::Delta(
                server
                    .delta_with_window(delta_first(CLUSTER_TYPE, &[]), w)
                    .await
                    .unwrap(),
            ),
        }
    }

    /// Receives the next response, ACKs it, and returns the snapshot version its cluster
    /// names.
    async fn next_acked(&mut self) -> u64 {
        match self {
            Client::Sotw(s) => {
                let r = s.recv().await;
                s.ack(&r, &[]).await;
                version_of(&r.resources[0].value)
            }
            Client::Delta(s) => {
                let r = s.recv().await;
                s.ack(&r).await;
                let any = r.resources[0].resource.as_ref().expect("a resource body");
                version_of(&any.value)
            }
        }
    }
}

#[tokio::test]
async fn a_stalled_sotw_client_holds_one_response_while_every_other_stream_converges() {
    a_stalled_client_holds_one_response(false).await;
}

#[tokio::test]
async fn a_stalled_delta_client_holds_one_response_while_every_other_stream_converges() {
    a_stalled_client_holds_one_response(true).await;
}

async fn a_stalled_client_holds_one_response(delta: bool) {
    const SIZE: usize = 256 * 1024;
    const WINDOW: u32 = 64 * 1024;
    const PUSHES: u64 = 30;
    let server = TestServer::start("a", Some(big(1, SIZE))).await;
    let mut stalled = Client::open(&server, delta, Some(WINDOW)).await;
    assert_eq!(stalled.next_acked().await, 1);
    let mut others = Vec::new();
    for _ in 0..4 {
        let mut s = Client::open(&server, delta, None).await;
        assert_eq!(s.next_acked().await, 1);
        others.push(s);
    }
    // From here the stalled client reads nothing. Every snapshot goes to every stream.
    for version in 2..=PUSHES {
        server.publish(big(version, SIZE));
        for s in &mut others {
            let mut received = 0;
            while s.next_acked().await != version {
                received += 1;
                assert!(received < PUSHES, "version {version} never arrives");
            }
        }
    }
    // Every other stream has the newest snapshot; the stalled one was computed at most
    // one response beyond what its HTTP/2 window let through, and nothing waits for it
    // in the engine beyond that one response.
    let stalled_status = find_stalled(&server.registry.streams());
    let meter = &stalled_status.transport;
    println!(
        "stalled stream: {} responses, {} bytes to HTTP/2, {} queued",
        meter.messages(),
        meter.sent_bytes(),
        meter.queued_bytes()
    );
    let response_bytes = (SIZE + 1024) as u64;
    assert!(
        meter.messages() <= 3,
        "{} responses computed for a client that read one ({PUSHES} snapshots pushed)",
        meter.messages()
    );
    assert!(
        meter.queued_bytes() <= response_bytes,
        "{} bytes queued in the engine",
        meter.queued_bytes()
    );
    assert!(
        meter.sent_bytes() <= 2 * response_bytes + u64::from(WINDOW) + MAX_SEND_BUFFER as u64,
        "{} bytes handed to HTTP/2",
        meter.sent_bytes()
    );
    // The others' records say they hold the newest content.
    eventually("every other stream ACKed the newest response", || {
        server
            .registry
            .streams()
            .iter()
            .filter(|s| s.stream_id != stalled_status.stream_id)
            .all(|s| s.types[0].sync_state() == "SYNCED" && s.transport.messages() >= PUSHES)
    })
    .await;
    // The stalled client resumes: it gets what was in flight, then the newest snapshot.
    let mut received = 0;
    loop {
        let version = stalled.next_acked().await;
        received += 1;
        if version == PUSHES {
            break;
        }
        assert!(
            received < 4,
            "the stalled stream is sent old snapshots one by one"
        );
    }
}

/// The stream with the fewest responses: the one whose client stopped reading.
fn find_stalled(streams: &[StreamStatus]) -> StreamStatus {
    streams
        .iter()
        .min_by_key(|s| s.transport.messages())
        .cloned()
        .expect("streams are registered")
}
