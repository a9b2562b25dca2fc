//! The ADS listener's limits over real sockets: the HTTP/2 handshake timeout, the
//! connection cap and admission fair per peer address. Assertions are on counts (who
//! was closed, served or refused), never on timing.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use pilotfish_xds::ads::{AdsConfig, CLUSTER_TYPE, ConnectionPolicy, MapSnapshot};
use pilotfish_xds::metrics::{ADS_CONNECTIONS_REFUSED, STREAMS_REFUSED};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;

use crate::harness::*;

fn refused_connections(reason: &str) -> u64 {
    ADS_CONNECTIONS_REFUSED.with_label_values(&[reason]).get()
}

/// Waits until the server closes `tcp` (end of stream or reset); fails the test if it
/// is still open after [`PATIENCE`].
async fn closed_by_server(tcp: &mut TcpStream) {
    let mut buf = [0u8; 256];
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
            Err(_) => panic!("the server kept a connection open"),
            Ok(Ok(0)) | Ok(Err(_)) => return,
            // Whatever the server wrote before closing (its SETTINGS): read on.
            Ok(Ok(_)) => {}
        }
    }
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

#[tokio::test]
async fn silent_connections_are_closed_after_the_handshake_timeout_and_clients_still_served() {
    let config = AdsConfig {
        connections: ConnectionPolicy {
            handshake_timeout: Duration::from_millis(500),
            ..ConnectionPolicy::default()
        },
        ..AdsConfig::default()
    };
    let server = TestServer::start_with(config, Some(MapSnapshot::sample(1))).await;
    let timed_out = refused_connections("handshake_timeout");
    let not_http2 = refused_connections("not_http2");
    let mut silent = Vec::new();
    for _ in 0..100 {
        silent.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    // Something that is not HTTP/2 is closed as soon as it is read.
    let mut http1 = TcpStream::connect(server.addr).await.expect("connect");
    http1
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        .await
        .expect("write");
    // A real client is served meanwhile, and stays served after.
    let mut client = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    assert_eq!(payloads(&client.recv().await), ["c1", "c2"]);
    for tcp in &mut silent {
        closed_by_server(tcp).await;
    }
    closed_by_server(&mut http1).await;
    assert!(refused_connections("handshake_timeout") >= timed_out + 100);
    assert!(refused_connections("not_http2") > not_http2);
    server.publish(MapSnapshot::sample(2).with(CLUSTER_TYPE, "c3", b"c3"));
    assert_eq!(payloads(&client.recv().await), ["c1", "c2", "c3"]);
    let mut again = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    assert_eq!(payloads(&again.recv().await), ["c1", "c2", "c3"]);
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once_while_open_streams_keep_working() {
    let config = AdsConfig {
        connections: ConnectionPolicy {
            max_connections: Some(5),
            ..ConnectionPolicy::default()
        },
        ..AdsConfig::default()
    };
    let server = TestServer::start_with(config, Some(MapSnapshot::sample(1))).await;
    // Three clients (a connection each) and two silent connections fill the cap.
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
        s.recv().await;
        clients.push(s);
    }
    let mut silent = Vec::new();
    for _ in 0..2 {
        silent.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    eventually("five connections held", || {
        pilotfish_xds::metrics::ADS_CONNECTIONS.get() >= 3 && server.registry.len() == 3
    })
    .await;
    let before = refused_connections("connection_limit");
    // Each connection beyond the cap is closed without a byte, however many come.
    for _ in 0..20 {
        let mut beyond = TcpStream::connect(server.addr).await.expect("connect");
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(PATIENCE, beyond.read(&mut buf))
            .await
            .expect("closed in time");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
    assert_eq!(refused_connections("connection_limit") - before, 20);
    // The streams already open keep receiving pushes.
    server.publish(MapSnapshot::sample(2).with(CLUSTER_TYPE, "c3", b"c3"));
    for s in &mut clients {
        assert_eq!(payloads(&s.recv().await), ["c1", "c2", "c3"]);
    }
    // Once the silent ones are gone, a new client is served again.
    drop(silent);
    let mut late = None;
    for _ in 0..50 {
        if let Ok(s) = tokio::time::timeout(
            Duration::from_secs(1),
            server.sotw(first(CLUSTER_TYPE, &[])),
        )
        .await
        {
            late = Some(s.expect("stream"));
            break;
        }
    }
    let mut late = late.expect("a connection slot came free");
    assert_eq!(payloads(&late.recv().await), ["c1", "c2", "c3"]);
}

#[tokio::test]
async fn a_greedy_peer_cannot_starve_another_peers_new_streams() {
    // 8 new streams a second (burst 16); a peer address gets 2 a second (burst 4).
    let config = AdsConfig {
        new_streams_per_second: Some(8.0),
        ..AdsConfig::default()
    };
    let server = TestServer::start_with(config, Some(MapSnapshot::sample(1))).await;
    let peer_refused = || {
        STREAMS_REFUSED
            .with_label_values(&["peer_rate_limit"])
            .get()
    };
    let before = peer_refused();
    // The greedy peer asks for 40 streams at once over one connection.
    let greedy = server.client_from(loopback(2)).await;
    let attempts = (0..40).map(|_| TestServer::sotw_on(greedy.clone(), first(CLUSTER_TYPE, &[])));
    let results = futures::future::join_all(attempts).await;
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    let exhausted = results
        .iter()
        .filter(|r| matches!(r, Err(s) if s.code() == Code::ResourceExhausted))
        .count();
    assert_eq!(admitted + exhausted, 40, "admitted or RESOURCE_EXHAUSTED");
    // Its share: a burst of 4, and what its rate of 2 a second adds within the wait and
    // the time the burst took (far less than the 24 one bucket would have given it).
    assert!((4..=16).contains(&admitted), "{admitted} admitted");
    // (Other tests of this binary may count too: at least these.)
    assert!(peer_refused() - before >= exhausted as u64);
    // Another peer still gets all of its (reconnecting) streams.
    let other = server.client_from(loopback(3)).await;
    let mut served = 0;
    for _ in 0..4 {
        let mut s = TestServer::sotw_on(other.clone(), first(CLUSTER_TYPE, &[]))
            .await
            .expect("the other peer is admitted");
        assert_eq!(payloads(&s.recv().await), ["c1", "c2"]);
        served += 1;
    }
    assert_eq!(served, 4);
}
