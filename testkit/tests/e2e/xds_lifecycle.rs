//! How xDS replicas hand their clients over: connections older than the maximum age end
//! with GOAWAY and the client resumes on a new connection without a gap, and a replica
//! that receives SIGTERM drains its clients to the other replica behind the "Service"
//! (a round-robin TCP balancer) while RPCs keep flowing.

use std::time::{Duration, Instant};

use pilotfish_testkit::balancer::TcpBalancer;
use pilotfish_testkit::mesh::{reviews_target, reviews_virtual_service};
use pilotfish_testkit::process::{ControllerProcess, XdsServer};
use pilotfish_testkit::redis::RedisServer;

use crate::xds_grpc::{
    assert_routed_80_20, assert_split, reviews_backends, reviews_client, wait_for_split,
    write_reviews_mesh,
};

#[test]
fn connections_older_than_the_maximum_age_reconnect_without_a_gap() {
    let (_backends, ports) = reviews_backends();
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports, (80, 20));
    let server =
        XdsServer::standalone_with("xds-aging", dir.path(), &["--max-connection-age", "2s"])
            .unwrap();
    let mut client = reviews_client(server.xds, "client-1");
    assert_routed_80_20(&client.rpcs(&reviews_target(), 500, &[]).unwrap());
    let first_peer = server.clients().unwrap()[0].1.clone();
    let version = server.admin_json("/debug/snapshot").unwrap()["version"].clone();

    // RPCs keep succeeding across at least two connection ends (2 s ± 10% each).
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(6) {
        let t = client.rpcs(&reviews_target(), 100, &[]).unwrap();
        assert!(
            t.errors.is_empty(),
            "an RPC failed while the connection aged out: {t:?}"
        );
    }
    assert!(
        server
            .metric(
                "pilotfish_xds_connections_ended_total",
                "reason=\"max_age\""
            )
            .unwrap()
            >= 1.0
    );
    // The loop may end just as a connection ages out; the client then resumes within
    // milliseconds. Look a bounded number of times for the one resumed stream.
    let all_synced = |sync: &serde_json::Value| {
        sync[0]["types"]
            .as_object()
            .is_some_and(|types| types.values().all(|t| t["state"] == "SYNCED"))
    };
    let mut clients = server.clients().unwrap();
    for _ in 0..50 {
        if clients.len() == 1 && all_synced(&server.admin_json("/debug/syncz").unwrap()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        clients = server.clients().unwrap();
    }
    assert_eq!(clients.len(), 1, "one stream, resumed: {clients:?}");
    assert_ne!(
        clients[0].1, first_peer,
        "the client came back over a new connection"
    );
    assert_eq!(
        server.admin_json("/debug/snapshot").unwrap()["version"],
        version
    );
    assert_eq!(
        server.nacks().unwrap(),
        vec![],
        "no NACK after reconnecting"
    );
    let sync = server.admin_json("/debug/syncz").unwrap();
    for (ty, state) in sync[0]["types"].as_object().unwrap() {
        assert_eq!(state["state"], "SYNCED", "{ty}: {sync}");
    }
}

#[test]
fn sigterm_drains_clients_to_the_other_replica() {
    let (_backends, ports) = reviews_backends();
    let redis = RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports, (80, 20));
    let _controller =
        ControllerProcess::config_dir("controller", dir.path(), &redis.url()).unwrap();
    let mut a = XdsServer::following("xds-a", &redis.url(), &["--drain-grace", "2s"]).unwrap();
    let b = XdsServer::following("xds-b", &redis.url(), &["--drain-grace", "2s"]).unwrap();
    let service = TcpBalancer::start(vec![a.xds, b.xds]).unwrap();
    let mut clients: Vec<_> = (0..4)
        .map(|i| reviews_client(service.addr(), &format!("client-{i}")))
        .collect();
    for c in &mut clients {
        assert_routed_80_20(&c.rpcs(&reviews_target(), 300, &[]).unwrap());
    }
    let on_a = a.clients().unwrap().len();
    assert!(on_a > 0, "the balancer gave replica a no client");

    let sent = Instant::now();
    a.process.signal("TERM").unwrap();
    // While a drains, RPCs keep working (clients keep their configuration while their
    // ADS stream moves to b).
    while sent.elapsed() < Duration::from_secs(4) {
        for c in &mut clients {
            let t = c.rpcs(&reviews_target(), 50, &[]).unwrap();
            assert!(t.errors.is_empty(), "RPCs failed during the drain: {t:?}");
        }
    }
    let status = a
        .process
        .wait_exit(Duration::from_secs(20))
        .expect("replica a exits after its drain");
    assert!(status.success(), "replica a exits cleanly: {status}");
    eprintln!(
        "replica a drained {on_a} client(s) and had exited when checked {:?} after SIGTERM",
        sent.elapsed()
    );

    // Every client is now on b, and routing changes still reach them.
    let deadline = Instant::now() + Duration::from_secs(30);
    while b.clients().unwrap().len() < clients.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        b.clients().unwrap().len(),
        clients.len(),
        "all clients reconnected to b"
    );
    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        reviews_virtual_service(50, 50),
    )
    .unwrap();
    for c in &mut clients {
        wait_for_split(c, 50.0, Duration::from_secs(30));
        assert_split(&c.rpcs(&reviews_target(), 2000, &[]).unwrap(), 50.0);
    }
    assert_eq!(b.nacks().unwrap(), vec![]);
}
