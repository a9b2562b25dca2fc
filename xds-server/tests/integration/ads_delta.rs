//! Delta (incremental) ADS over a real socket: one test per protocol rule.

use pilotfish_xds::ads::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, MapSnapshot, ROUTE_TYPE};
use tonic::Code;

use crate::harness::*;

#[tokio::test]
async fn first_request_without_node_is_invalid_argument() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let err = server
        .delta(delta_request(CLUSTER_TYPE, &["*"], &[], ""))
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn first_wildcard_request_is_answered_even_when_empty() {
    let server = TestServer::start("a", Some(MapSnapshot::new(1))).await;
    let mut s = server
        .delta(delta_first(CLUSTER_TYPE, &[]))
        .await
        .expect("stream");
    let r = s.recv().await;
    assert!(r.resources.is_empty() && r.removed_resources.is_empty());
    assert_eq!(r.control_plane.map(|c| c.identifier).as_deref(), Some("a"));
}

#[tokio::test]
async fn reconnect_to_another_replica_with_initial_versions_resends_nothing_held() {
    let a = TestServer::start("replica-a", Some(MapSnapshot::sample(1))).await;
    let mut s = a
        .delta(delta_first(CLUSTER_TYPE, &["*"]))
        .await
        .expect("stream a");
    let held = s.recv().await;
    assert_eq!(names(&held), ["c1", "c2"]);
    drop(s);
    // Replica b has another snapshot version, the same c1, a changed c2 and a new c3.
    let b = TestServer::start(
        "replica-b",
        Some(
            MapSnapshot::sample(9)
                .with(CLUSTER_TYPE, "c2", b"c2'")
                .with(CLUSTER_TYPE, "c3", b"c3"),
        ),
    )
    .await;
    let mut again = delta_first(CLUSTER_TYPE, &["*"]);
    again.initial_resource_versions = held
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();
    again
        .initial_resource_versions
        .insert("deleted-meanwhile".into(), "0123".into());
    let mut s = b.delta(again).await.expect("stream b");
    let r = s.recv().await;
    assert_eq!(names(&r), ["c2", "c3"]);
    assert_eq!(r.removed_resources, ["deleted-meanwhile"]);
}

#[tokio::test]
async fn only_changed_resources_are_sent_and_deletions_are_removed() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .delta(delta_first(LISTENER_TYPE, &["*"]))
        .await
        .expect("stream");
    let r = s.recv().await;
    s.ack(&r).await;
    server.publish(MapSnapshot::sample(2).with(LISTENER_TYPE, "l2", b"l2"));
    let r = s.recv().await;
    assert_eq!(names(&r), ["l2"], "l1 is unchanged");
    s.ack(&r).await;
    server.publish(MapSnapshot::sample(3).without(LISTENER_TYPE, "l1").with(
        LISTENER_TYPE,
        "l2",
        b"l2",
    ));
    let r = s.recv().await;
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, ["l1"]);
    s.ack(&r).await;
    // Recreated: sent again, deletions are not forgotten.
    server.publish(MapSnapshot::sample(4).with(LISTENER_TYPE, "l2", b"l2"));
    assert_eq!(names(&s.recv().await), ["l1"]);
}

#[tokio::test]
async fn unsubscribe_removes_and_resubscribe_sends_again() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .delta(delta_first(ROUTE_TYPE, &["r1"]))
        .await
        .expect("stream");
    let r = s.recv().await;
    assert_eq!(names(&r), ["r1"]);
    s.send(delta_request(ROUTE_TYPE, &["r2"], &["r1"], &r.nonce))
        .await;
    let r = s.recv().await;
    assert_eq!(names(&r), ["r2"]);
    assert_eq!(r.removed_resources, ["r1"]);
    s.send(delta_request(ROUTE_TYPE, &["r1"], &["r2"], &r.nonce))
        .await;
    let r = s.recv().await;
    assert_eq!(names(&r), ["r1"], "R1 again after R1→R2→R1");
    assert_eq!(r.removed_resources, ["r2"]);
}

#[tokio::test]
async fn ack_is_never_answered_and_nack_never_resends() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .delta(delta_first(CLUSTER_TYPE, &["*"]))
        .await
        .expect("stream");
    let r = s.recv().await;
    s.ack(&r).await;
    s.expect_silence().await;
    server.publish(MapSnapshot::sample(2).with(CLUSTER_TYPE, "c1", b"bad"));
    let r = s.recv().await;
    assert_eq!(names(&r), ["c1"]);
    let mut nack = delta_request(CLUSTER_TYPE, &[], &[], &r.nonce);
    nack.error_detail = Some(envoy_types::pb::google::rpc::Status {
        code: 3,
        message: "c1 rejected".into(),
        details: vec![],
    });
    s.send(nack).await;
    s.expect_silence().await;
    server.publish(MapSnapshot::sample(3).with(CLUSTER_TYPE, "c1", b"bad"));
    s.expect_silence().await;
    server.publish(MapSnapshot::sample(4).with(CLUSTER_TYPE, "c1", b"good"));
    assert_eq!(names(&s.recv().await), ["c1"]);
    let status = &server.registry.streams_of(NODE_ID)[0];
    assert_eq!(
        status.types[0]
            .last_nack
            .as_ref()
            .map(|n| n.detail.as_str()),
        Some("c1 rejected")
    );
}

#[tokio::test]
async fn absent_names_are_reported_removed_then_sent_when_they_appear() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .delta(delta_first(ENDPOINT_TYPE, &["c1", "c9"]))
        .await
        .expect("stream");
    let r = s.recv().await;
    assert_eq!(names(&r), ["c1"]);
    assert_eq!(r.removed_resources, ["c9"]);
    s.ack(&r).await;
    server.publish(MapSnapshot::sample(2).with(ENDPOINT_TYPE, "c9", b"e9"));
    let r = s.recv().await;
    assert_eq!(names(&r), ["c9"]);
    assert!(r.removed_resources.is_empty());
}

#[tokio::test]
async fn a_changed_cluster_is_followed_by_its_endpoints() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .delta(delta_first(CLUSTER_TYPE, &["*"]))
        .await
        .expect("stream");
    let r = s.recv().await;
    s.ack(&r).await;
    s.send(delta_request(ENDPOINT_TYPE, &["c1", "c2"], &[], ""))
        .await;
    let r = s.recv().await;
    s.ack(&r).await;
    s.expect_silence().await;
    server.publish(MapSnapshot::sample(2).with(CLUSTER_TYPE, "c1", b"c1'"));
    let cds = s.recv().await;
    assert_eq!(
        (cds.type_url.as_str(), names(&cds)),
        (CLUSTER_TYPE, vec!["c1".to_string()])
    );
    let eds = s.recv().await;
    assert_eq!(
        (eds.type_url.as_str(), names(&eds)),
        (ENDPOINT_TYPE, vec!["c1".to_string()])
    );
}

#[tokio::test]
async fn pushes_follow_make_before_break_order() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .delta(delta_first(ROUTE_TYPE, &["r1"]))
        .await
        .expect("stream");
    s.recv().await;
    for (type_url, subscribe) in [
        (LISTENER_TYPE, &["*"][..]),
        (CLUSTER_TYPE, &["*"]),
        (ENDPOINT_TYPE, &["c2"]),
    ] {
        s.send(delta_request(type_url, subscribe, &[], "")).await;
        s.recv().await;
    }
    server.publish(
        MapSnapshot::sample(2)
            .with(ROUTE_TYPE, "r1", b"r1'")
            .with(LISTENER_TYPE, "l1", b"l1'")
            .with(ENDPOINT_TYPE, "c2", b"e2'")
            .with(CLUSTER_TYPE, "c2", b"c2'"),
    );
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(s.recv().await.type_url);
    }
    assert_eq!(
        order,
        [CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE]
    );
    s.expect_silence().await;
}

#[tokio::test]
async fn unknown_type_urls_are_ignored() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .delta(delta_first(
            "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
            &["x"],
        ))
        .await
        .expect("stream");
    s.expect_silence().await;
    s.send(delta_request(LISTENER_TYPE, &["*"], &[], "")).await;
    assert_eq!(names(&s.recv().await), ["l1"]);
}

#[tokio::test]
async fn a_stale_nonce_is_not_an_ack_but_its_subscription_applies() {
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .delta(delta_first(ROUTE_TYPE, &["r1"]))
        .await
        .expect("stream");
    let first_response = s.recv().await;
    server.publish(MapSnapshot::sample(2).with(ROUTE_TYPE, "r1", b"r1'"));
    let second = s.recv().await;
    // Answering the first response now is stale: not recorded as an ACK...
    s.send(delta_request(
        ROUTE_TYPE,
        &["r2"],
        &[],
        &first_response.nonce,
    ))
    .await;
    // ...but the subscription change it carries is applied (delta changes are incremental).
    assert_eq!(names(&s.recv().await), ["r2"]);
    let status = &server.registry.streams_of(NODE_ID)[0];
    assert!(
        status.types[0].last_ack.is_none(),
        "stale nonce must not count as an ACK of {}",
        second.nonce
    );
}

#[tokio::test]
async fn a_delta_stream_subscribing_past_the_name_cap_is_ended_with_resource_exhausted() {
    use pilotfish_xds::ads::MAX_SUBSCRIBED_NAMES;
    let refused = || {
        pilotfish_xds::metrics::STREAMS_REFUSED
            .with_label_values(&["subscription_limit"])
            .get()
    };
    let server = TestServer::start("a", Some(MapSnapshot::sample(1))).await;
    let mut s = server
        .delta(delta_first(CLUSTER_TYPE, &["*"]))
        .await
        .expect("stream");
    s.recv().await;
    let name = |i: usize| format!("outbound|80||svc-{i:06}.ns.svc.cluster.local");
    // A hostile client adds names request after request; each is within the request size.
    let chunk = MAX_SUBSCRIBED_NAMES / 4;
    for part in 0..4 {
        let mut request = delta_request(ENDPOINT_TYPE, &[], &[], "");
        request.resource_names_subscribe = (part * chunk..(part + 1) * chunk).map(name).collect();
        s.send(request).await;
        // Absent names are announced once, as removed.
        assert_eq!(s.recv().await.removed_resources.len(), chunk);
    }
    let held = |server: &TestServer| {
        let stream = &server.registry.streams_of(NODE_ID)[0];
        let eds = stream
            .types
            .iter()
            .find(|t| t.type_url == ENDPOINT_TYPE)
            .expect("eds status");
        (eds.subscribed.len(), eds.subscribed.bytes())
    };
    let bytes: usize = (0..MAX_SUBSCRIBED_NAMES).map(|i| name(i).len()).sum();
    assert_eq!(held(&server), (MAX_SUBSCRIBED_NAMES, bytes));
    let before = refused();
    let mut request = delta_request(ENDPOINT_TYPE, &[], &[], "");
    request.resource_names_subscribe = vec![name(MAX_SUBSCRIBED_NAMES)];
    s.send(request).await;
    let end = tokio::time::timeout(PATIENCE, s.inbound.message())
        .await
        .expect("ended in time");
    match end {
        Err(status) => {
            assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
            assert!(status.message().contains("at most 100000"), "{status}");
        }
        other => panic!("the stream went on: {other:?}"),
    }
    assert!(refused() > before, "counted under subscription_limit");
    eventually("the stream is gone", || {
        server.registry.streams_of(NODE_ID).is_empty()
    })
    .await;
}
