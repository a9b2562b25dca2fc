//! State-of-the-world ADS over a real socket: one test per protocol rule.

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use pilotfish_xds::ads::{
    AdsConfig, CLUSTER_TYPE, ConnectionPolicy, ENDPOINT_TYPE, LISTENER_TYPE, MapSnapshot,
    ROUTE_TYPE,
};
use tonic::Code;

use crate::harness::*;

#[tokio::test]
async fn first_request_without_node_is_invalid_argument() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let err = server
        .sotw(request(CLUSTER_TYPE, &[], ""))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    let mut empty_id = request(CLUSTER_TYPE, &[], "");
    empty_id.node = node("");
    let err = server.sotw(empty_id).await.err().expect("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("node.id"), "{}", err.message());
    // A proper node on the same server is served.
    let mut ok = server
        .sotw(first(CLUSTER_TYPE, &[]))
        .await
        .expect("accepted");
    assert_eq!(payloads(&ok.recv().await), ["c1", "c2"]);
}

#[tokio::test]
async fn node_is_parsed_and_unconventional_ids_get_defaults() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut istio = server
        .sotw(first(CLUSTER_TYPE, &[]))
        .await
        .expect("accepted");
    istio.recv().await;
    let mut odd = request(CLUSTER_TYPE, &[], "");
    odd.node = node("just-a-name");
    let mut odd = server.sotw(odd).await.expect("accepted with defaults");
    odd.recv().await;
    let shop = server.registry.streams_of(NODE_ID);
    assert_eq!(shop.len(), 1);
    assert_eq!(shop[0].namespace, "shop");
    let plain = server.registry.streams_of("just-a-name");
    assert_eq!(plain[0].namespace, "default");
}

#[tokio::test]
async fn first_wildcard_request_is_answered_even_when_empty() {
    let server = TestServer::start("a", Some(MapSnapshot::new(1))).await;
    let mut s = server
        .sotw(first(LISTENER_TYPE, &[]))
        .await
        .expect("stream");
    let r = s.recv().await;
    assert_eq!(r.type_url, LISTENER_TYPE);
    assert!(r.resources.is_empty());
    assert!(!r.nonce.is_empty() && !r.version_info.is_empty());
}

#[tokio::test]
async fn streams_wait_for_the_first_snapshot() {
    let server = TestServer::start("a", None).await;
    let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    s.expect_silence().await;
    server.publish(MapSnapshot::sample(1));
    assert_eq!(payloads(&s.recv().await), ["c1", "c2"]);
}

#[tokio::test]
async fn ack_is_never_answered_and_later_changes_still_arrive() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    let r = s.recv().await;
    s.ack(&r, &[]).await;
    s.expect_silence().await;
    // A second ACK of the same response is not answered either.
    s.ack(&r, &[]).await;
    s.expect_silence().await;
    let converged_before = pilotfish_xds::metrics::PROXY_CONVERGENCE_TIME.get_sample_count();
    let pushes_before = pilotfish_xds::metrics::XDS_PUSHES
        .with_label_values(&["cds"])
        .get();
    server.publish(MapSnapshot::sample(2).with(CLUSTER_TYPE, "c3", b"c3"));
    let next = s.recv().await;
    assert_eq!(payloads(&next), ["c1", "c2", "c3"]);
    assert!(
        pilotfish_xds::metrics::XDS_PUSHES
            .with_label_values(&["cds"])
            .get()
            > pushes_before
    );
    assert!(
        pilotfish_xds::metrics::PROXY_CONVERGENCE_TIME.get_sample_count() > converged_before,
        "a push that reached the stream is a convergence sample"
    );
    assert_ne!(next.nonce, r.nonce);
    assert_ne!(next.version_info, r.version_info);
}

#[tokio::test]
async fn nack_is_recorded_and_the_same_content_is_never_resent() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    let r = s.recv().await;
    s.send(nack(
        CLUSTER_TYPE,
        &[],
        &r.nonce,
        "cluster c1: bad lb policy",
    ))
    .await;
    s.expect_silence().await;
    eventually("the NACK is recorded", || {
        server.registry.syncz()[0].types["cds"].state == "NACKED"
    })
    .await;
    let stream = &server.registry.streams_of(NODE_ID)[0];
    let cds = stream
        .types
        .iter()
        .find(|t| t.type_url == CLUSTER_TYPE)
        .expect("cds status");
    assert_eq!(
        cds.last_nack.as_ref().map(|n| n.detail.as_str()),
        Some("cluster c1: bad lb policy")
    );
    // Same clusters in a new snapshot (only a listener changed): no CDS resend.
    server.publish(MapSnapshot::sample(2).with(LISTENER_TYPE, "l1", b"l1'"));
    s.expect_silence().await;
    // Changed clusters are sent.
    server.publish(MapSnapshot::sample(3).with(CLUSTER_TYPE, "c1", b"c1'"));
    assert_eq!(payloads(&s.recv().await), ["c1'", "c2"]);
}

#[tokio::test]
async fn a_stale_nonce_is_ignored() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .sotw(first(ROUTE_TYPE, &["r1"]))
        .await
        .expect("stream");
    let r1 = s.recv().await;
    server.publish(MapSnapshot::sample(2).with(ROUTE_TYPE, "r1", b"r1'"));
    let r2 = s.recv().await;
    assert_eq!(payloads(&r2), ["r1'"]);
    // A name change still carrying the first nonce is stale.
    s.send(request(ROUTE_TYPE, &["r1", "r2"], &r1.nonce)).await;
    s.expect_silence().await;
    s.send(request(ROUTE_TYPE, &["r1", "r2"], &r2.nonce)).await;
    assert_eq!(payloads(&s.recv().await), ["r1'", "r2"]);
}

#[tokio::test]
async fn changed_names_get_exactly_the_subscribed_set_even_after_a_b_a() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .sotw(first(ROUTE_TYPE, &["r1"]))
        .await
        .expect("stream");
    let r = s.recv().await;
    assert_eq!(payloads(&r), ["r1"]);
    s.send(request(ROUTE_TYPE, &["r2"], &r.nonce)).await;
    let r = s.recv().await;
    assert_eq!(payloads(&r), ["r2"]);
    s.send(request(ROUTE_TYPE, &["r1"], &r.nonce)).await;
    let r = s.recv().await;
    assert_eq!(payloads(&r), ["r1"], "R1 again after R1→R2→R1");
    s.send(request(ROUTE_TYPE, &["r1", "r2"], &r.nonce)).await;
    assert_eq!(payloads(&s.recv().await), ["r1", "r2"]);
}

#[tokio::test]
async fn wildcard_lds_and_cds_carry_the_full_set_and_deletions() {
    let server = TestServer::start(
        "a",
        Some(MapSnapshot::sample(1).with(LISTENER_TYPE, "l2", b"l2")),
    )
    .await;
    let mut s = server
        .sotw(first(LISTENER_TYPE, &[]))
        .await
        .expect("stream");
    let r = s.recv().await;
    assert_eq!(payloads(&r), ["l1", "l2"]);
    s.ack(&r, &[]).await;
    server.publish(MapSnapshot::sample(2));
    assert_eq!(
        payloads(&s.recv().await),
        ["l1"],
        "absent from the full set = deleted"
    );
    // Explicit names on a wildcard type: from now on only those.
    let mut c = server
        .sotw(first(CLUSTER_TYPE, &["c2"]))
        .await
        .expect("stream");
    assert_eq!(payloads(&c.recv().await), ["c2"]);
}

#[tokio::test]
async fn names_requested_before_they_exist_are_sent_when_they_appear() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .sotw(first(ENDPOINT_TYPE, &["c1", "c9"]))
        .await
        .expect("stream");
    let r = s.recv().await;
    assert_eq!(payloads(&r), ["e1"]);
    s.ack(&r, &["c1", "c9"]).await;
    server.publish(MapSnapshot::sample(2).with(ENDPOINT_TYPE, "c9", b"e9"));
    assert_eq!(payloads(&s.recv().await), ["e1", "e9"]);
}

#[tokio::test]
async fn pushes_follow_make_before_break_order_and_skip_unchanged_types() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    // Subscribed in reverse order: the order of pushes is the server's, not the client's.
    let mut s = server
        .sotw(first(ROUTE_TYPE, &["r1"]))
        .await
        .expect("stream");
    let r = s.recv().await;
    s.ack(&r, &["r1"]).await;
    for (type_url, names) in [
        (LISTENER_TYPE, &[][..]),
        (CLUSTER_TYPE, &[]),
        (ENDPOINT_TYPE, &["c1"]),
    ] {
        s.send(request(type_url, names, "")).await;
        let r = s.recv().await;
        s.ack(&r, names).await;
    }
    s.expect_silence().await;
    server.publish(
        MapSnapshot::sample(2)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .with(LISTENER_TYPE, "l1", b"l1'")
            .with(ROUTE_TYPE, "r1", b"r1'"),
    );
    let order: Vec<String> = [
        s.recv().await,
        s.recv().await,
        s.recv().await,
        s.recv().await,
    ]
    .iter()
    .map(|r| r.type_url.clone())
    .collect();
    assert_eq!(
        order,
        [CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE]
    );
    // Only the listener changes: only LDS is pushed.
    server.publish(
        MapSnapshot::sample(3)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .with(ROUTE_TYPE, "r1", b"r1'"),
    );
    let r = s.recv().await;
    assert_eq!(r.type_url, LISTENER_TYPE);
    s.expect_silence().await;
}

#[tokio::test]
async fn a_changed_cluster_is_followed_by_its_own_endpoints() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    let cds = s.recv().await;
    s.ack(&cds, &[]).await;
    s.send(request(ENDPOINT_TYPE, &["c1", "c2"], "")).await;
    let eds = s.recv().await;
    s.ack(&eds, &["c1", "c2"]).await;
    s.expect_silence().await;
    server.publish(MapSnapshot::sample(2).with(CLUSTER_TYPE, "c2", b"c2'"));
    let cds2 = s.recv().await;
    assert_eq!(cds2.type_url, CLUSTER_TYPE);
    let eds2 = s.recv().await;
    assert_eq!(eds2.type_url, ENDPOINT_TYPE);
    assert_eq!(
        payloads(&eds2),
        ["e2"],
        "the changed cluster's endpoints; c1 is not warming"
    );
    assert_eq!(
        eds2.version_info, eds.version_info,
        "unchanged endpoints, sent again"
    );
    assert_ne!(eds2.nonce, eds.nonce);
}

#[tokio::test]
async fn unknown_type_urls_are_ignored() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let secret = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
    let mut s = server
        .sotw(first(secret, &["default"]))
        .await
        .expect("stream");
    s.expect_silence().await;
    s.send(request(CLUSTER_TYPE, &[], "")).await;
    assert_eq!(s.recv().await.type_url, CLUSTER_TYPE);
    let status = &server.registry.streams_of(NODE_ID)[0];
    assert_eq!(status.unknown_type_urls, [secret]);
}

/// A client inventing type URLs cannot grow its stream: past the cap of unknown ones the
/// stream ends with INVALID_ARGUMENT, and what the registry keeps stays bounded.
#[tokio::test]
async fn a_stream_asking_for_too_many_unknown_type_urls_is_ended() {
    use pilotfish_xds::ads::MAX_UNKNOWN_TYPES;
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    assert_eq!(s.recv().await.type_url, CLUSTER_TYPE);
    for i in 0..MAX_UNKNOWN_TYPES {
        s.send(request(&format!("type.example.com/made.up.{i}"), &[], ""))
            .await;
    }
    s.expect_silence().await;
    let kept = server.registry.streams_of(NODE_ID)[0]
        .unknown_type_urls
        .len();
    assert_eq!(kept, MAX_UNKNOWN_TYPES);
    s.send(request("type.example.com/one.more", &[], "")).await;
    let end = tokio::time::timeout(PATIENCE, s.inbound.message())
        .await
        .expect("ended in time");
    assert!(
        matches!(end, Err(ref status) if status.code() == Code::InvalidArgument),
        "{end:?}"
    );
}

#[tokio::test]
async fn versions_are_identical_on_every_replica_and_responses_name_theirs() {
    let a = TestServer::start("replica-a", Some(MapSnapshot::sample(1))).await;
    let b = TestServer::start("replica-b", Some(MapSnapshot::sample(42))).await;
    let mut sa = a.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream a");
    let mut sb = b.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream b");
    let (ra, rb) = (sa.recv().await, sb.recv().await);
    assert_eq!(ra.version_info, rb.version_info);
    assert_eq!(
        ra.control_plane.map(|c| c.identifier).as_deref(),
        Some("replica-a")
    );
    assert_eq!(
        rb.control_plane.map(|c| c.identifier).as_deref(),
        Some("replica-b")
    );
}

#[tokio::test]
async fn a_slow_stream_gets_only_the_newest_and_never_blocks_others() {
    // Big resources fill the HTTP/2 window of a client that does not read.
    let big = |version: u64| {
        let mut payload = vec![b'x'; 256 * 1024];
        payload.extend_from_slice(version.to_string().as_bytes());
        MapSnapshot::new(version).with(CLUSTER_TYPE, "c", &payload)
    };
    let server = TestServer::start("a", Some(big(1))).await;
    let mut slow = server
        .sotw(first(CLUSTER_TYPE, &[]))
        .await
        .expect("slow stream");
    let mut fast = server
        .sotw(first(CLUSTER_TYPE, &[]))
        .await
        .expect("fast stream");
    let mut fast_latest = fast.recv().await;
    const SNAPSHOTS: u64 = 40;
    for version in 2..=SNAPSHOTS {
        server.publish(big(version));
        // The fast stream keeps up, whatever the slow one does.
        loop {
            fast_latest = fast.recv().await;
            if fast_latest.resources[0]
                .value
                .ends_with(version.to_string().as_bytes())
            {
                break;
            }
        }
    }
    // Now the slow client reads: some buffered responses, then the newest.
    let mut received = 0;
    loop {
        let r = slow.recv().await;
        received += 1;
        if r.version_info == fast_latest.version_info {
            break;
        }
        assert!(
            received < SNAPSHOTS,
            "the slow stream was sent every snapshot"
        );
    }
    assert!(
        received < SNAPSHOTS,
        "received {received} responses for {SNAPSHOTS} snapshots"
    );
}

#[tokio::test]
async fn shutdown_ends_streams_with_unavailable() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    s.recv().await;
    server.stop().await;
    let end = tokio::time::timeout(PATIENCE, s.inbound.message())
        .await
        .expect("stream ended in time");
    match end {
        Err(status) => assert_eq!(status.code(), Code::Unavailable),
        Ok(other) => panic!("expected UNAVAILABLE, got {other:?}"),
    }
}

#[tokio::test]
async fn registry_and_metrics_track_sent_acked_and_nacked() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let rejects_before = pilotfish_xds::metrics::XDS_REJECTS
        .with_label_values(&["lds"])
        .get();
    let mut s = server
        .sotw(first(LISTENER_TYPE, &[]))
        .await
        .expect("stream");
    let r = s.recv().await;
    s.ack(&r, &[]).await;
    s.expect_silence().await;
    eventually("the ACK is recorded", || {
        server.registry.syncz()[0].types["lds"].state == "SYNCED"
    })
    .await;
    let sync = server.registry.syncz();
    assert_eq!(sync[0].types["lds"].state, "SYNCED");
    assert_eq!(
        sync[0].types["lds"].acked.as_deref(),
        Some(r.version_info.as_str())
    );
    server.publish(MapSnapshot::sample(2).with(LISTENER_TYPE, "l1", b"broken"));
    let r2 = s.recv().await;
    s.send(nack(LISTENER_TYPE, &[], &r2.nonce, "bad listener"))
        .await;
    s.expect_silence().await;
    eventually("the NACK is recorded", || {
        server.registry.syncz()[0].types["lds"].state == "NACKED"
    })
    .await;
    let rejects_after = pilotfish_xds::metrics::XDS_REJECTS
        .with_label_values(&["lds"])
        .get();
    assert!(rejects_after > rejects_before);
    let adsz = server.registry.adsz();
    assert_eq!(adsz["totalClients"], 1);
    assert_eq!(
        adsz["clients"][0]["types"][0]["last_nack"]["detail"],
        "bad listener"
    );
    drop(s);
    eventually("the closed stream leaves the registry", || {
        server.registry.is_empty()
    })
    .await;
}

#[tokio::test]
async fn endpoints_only_snapshots_recompute_endpoints_alone() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    let r = s.recv().await;
    s.ack(&r, &[]).await;
    s.send(request(ENDPOINT_TYPE, &["c1"], "")).await;
    let r = s.recv().await;
    s.ack(&r, &["c1"]).await;
    s.expect_silence().await;
    // The publisher declares "endpoints only": a cluster difference is not even looked at.
    server.publish(
        MapSnapshot::sample(2)
            .with(CLUSTER_TYPE, "c7", b"c7")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .endpoints_only_since(1),
    );
    let r = s.recv().await;
    assert_eq!(
        (r.type_url.as_str(), payloads(&r)),
        (ENDPOINT_TYPE, vec!["e1'".to_string()])
    );
    s.expect_silence().await;
    // The next full change brings the cluster.
    server.publish(MapSnapshot::sample(3).with(CLUSTER_TYPE, "c7", b"c7").with(
        ENDPOINT_TYPE,
        "c1",
        b"e1'",
    ));
    assert_eq!(payloads(&s.recv().await), ["c1", "c2", "c7"]);
}

#[tokio::test]
async fn connections_end_with_goaway_at_their_maximum_age() {
    let config = AdsConfig {
        connections: ConnectionPolicy {
            max_age: Some(std::time::Duration::from_millis(300)),
            ..ConnectionPolicy::default()
        },
        ..AdsConfig::default()
    };
    let ended_before = pilotfish_xds::metrics::ADS_CONNECTIONS_ENDED
        .with_label_values(&["max_age"])
        .get();
    let server = TestServer::start_with(config, Some(MapSnapshot::sample(1))).await;
    let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    s.recv().await;
    let first_peer = server.registry.streams()[0].peer.clone();
    let end = tokio::time::timeout(PATIENCE, s.inbound.message())
        .await
        .expect("stream ended in time");
    match end {
        Err(status) => assert_eq!(status.code(), Code::Unavailable),
        Ok(other) => panic!("expected UNAVAILABLE, got {other:?}"),
    }
    assert!(
        pilotfish_xds::metrics::ADS_CONNECTIONS_ENDED
            .with_label_values(&["max_age"])
            .get()
            > ended_before,
        "the connection itself was ended (GOAWAY), not only the stream"
    );
    // The client reconnects over a new connection and is served as before.
    let mut again = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    assert_eq!(payloads(&again.recv().await), ["c1", "c2"]);
    let peers: Vec<_> = server
        .registry
        .streams()
        .into_iter()
        .map(|s| s.peer)
        .collect();
    assert!(
        !peers.contains(&first_peer),
        "a new TCP connection: {peers:?} vs {first_peer:?}"
    );
}

#[tokio::test]
async fn new_streams_beyond_the_rate_wait_their_turn_then_are_refused() {
    let config = AdsConfig {
        new_streams_per_second: Some(1.0),
        ..AdsConfig::default()
    };
    let server = TestServer::start_with(config, Some(MapSnapshot::sample(1))).await;
    // A burst of twice the rate is admitted ...
    let mut a = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    let mut b = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
    a.recv().await;
    b.recv().await;
    // ... of three more asking at once, one waits for its token (up to a second) and is
    // served; for the others the wait would be longer: they are refused at once with
    // RESOURCE_EXHAUSTED, as istiod does.
    let three = (0..3).map(|_| server.sotw(first(CLUSTER_TYPE, &[])));
    let results = futures::future::join_all(three).await;
    let codes: Vec<Code> = results
        .iter()
        .filter_map(|r| r.as_ref().err().map(tonic::Status::code))
        .collect();
    assert_eq!(codes, [Code::ResourceExhausted; 2]);
    let mut c = results
        .into_iter()
        .find_map(Result::ok)
        .expect("one admitted");
    assert_eq!(payloads(&c.recv().await), ["c1", "c2"]);
    // Admitted streams are unaffected.
    server.publish(MapSnapshot::sample(2).with(CLUSTER_TYPE, "c3", b"c3"));
    assert_eq!(payloads(&a.recv().await), ["c1", "c2", "c3"]);
}

#[tokio::test]
async fn draining_spreads_connection_ends_over_the_grace() {
    let config = AdsConfig {
        drain_grace: std::time::Duration::from_millis(800),
        ..AdsConfig::default()
    };
    let server = TestServer::start_with(config, Some(MapSnapshot::sample(1))).await;
    let mut streams = Vec::new();
    for _ in 0..6 {
        let mut s = server.sotw(first(CLUSTER_TYPE, &[])).await.expect("stream");
        s.recv().await;
        streams.push(s);
    }
    let addr = server.addr;
    let started = std::time::Instant::now();
    let stop = tokio::spawn(async move { server.stop().await });
    let mut ended_at = Vec::new();
    for s in &mut streams {
        let end = tokio::time::timeout(PATIENCE, s.inbound.message())
            .await
            .expect("ended in time");
        assert!(
            matches!(end, Err(ref status) if status.code() == Code::Unavailable),
            "{end:?}"
        );
        ended_at.push(started.elapsed());
    }
    stop.await.unwrap();
    // The listener is closed: no new connection is accepted.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    // Every connection ended within the grace (plus a margin for a busy machine).
    assert!(
        ended_at
            .iter()
            .all(|t| *t < std::time::Duration::from_secs(5)),
        "{ended_at:?}"
    );
}

#[tokio::test]
async fn a_gateway_gets_an_empty_configuration_over_the_wire() {
    use std::sync::Arc;

    use pilotfish_xds::ads::{ChangeKind, StampedSnapshot};
    use pilotfish_xds::generate::GeneratedSnapshot;
    use pilotfish_xds::generate::metrics::UNSUPPORTED_PROXIES;

    let (snapshot, _, _) = crate::golden::case_snapshot("tcp", None, "client");
    let snapshot = GeneratedSnapshot::new(snapshot.push_context().clone(), 1, ChangeKind::Full);
    let server = TestServer::start_stamped(
        AdsConfig::default(),
        Some(StampedSnapshot::now(Arc::new(snapshot))),
    )
    .await;
    let refused_before = UNSUPPORTED_PROXIES.with_label_values(&["router"]).get();
    let gateway =
        "router~10.1.0.9~istio-ingressgateway-1.istio-system~istio-system.svc.cluster.local";
    for type_url in [LISTENER_TYPE, CLUSTER_TYPE] {
        let mut s = server
            .sotw(DiscoveryRequest {
                node: node(gateway),
                ..request(type_url, &[], "")
            })
            .await
            .expect("stream");
        let r = s.recv().await;
        assert_eq!(r.type_url, type_url);
        assert!(
            r.resources.is_empty(),
            "{type_url}: no sidecar output for a gateway"
        );
        assert!(!r.nonce.is_empty() && !r.version_info.is_empty());
        s.ack(&r, &[]).await;
        s.expect_silence().await;
    }
    assert!(
        UNSUPPORTED_PROXIES.with_label_values(&["router"]).get() >= refused_before + 2,
        "counted once per stream"
    );
    // A sidecar on the same server still gets its listeners.
    let mut s = server
        .sotw(first(LISTENER_TYPE, &[]))
        .await
        .expect("stream");
    assert!(!s.recv().await.resources.is_empty());
}
