//! The scaled-out tier end to end: `pilotfish-controller --config-dir` publishes through a
//! real `redis-server` to two `pilotfish-xds` replicas, each serving its own gRPC xDS
//! client. Editing the folder changes routing through either replica; Redis killed and
//! restarted empty never costs a proxy its routes, and the tier heals by itself.

use std::time::{Duration, Instant};

use pilotfish_testkit::mesh::{reviews_target, reviews_virtual_service};
use pilotfish_testkit::process::{ControllerProcess, XdsServer};
use pilotfish_testkit::redis::RedisServer;

use crate::xds_grpc::{
    assert_routed_80_20, assert_split, reviews_backends, reviews_client, wait_for_split,
    write_reviews_mesh,
};

#[test]
fn folder_edits_reach_clients_through_redis_and_both_replicas() {
    let (_backends, ports) = reviews_backends();
    let redis = RedisServer::start().expect("start redis-server");
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports, (80, 20));
    let _controller = ControllerProcess::config_dir("controller", dir.path(), &redis.url())
        .expect("start the controller");
    let replicas = [
        XdsServer::following("xds-a", &redis.url(), &[]).expect("start replica a"),
        XdsServer::following("xds-b", &redis.url(), &[]).expect("start replica b"),
    ];
    let mut clients = [
        reviews_client(replicas[0].xds, "client-a"),
        reviews_client(replicas[1].xds, "client-b"),
    ];
    for client in &mut clients {
        assert_split(&client.rpcs(&reviews_target(), 2000, &[]).unwrap(), 80.0);
    }
    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        reviews_virtual_service(50, 50),
    )
    .unwrap();
    for client in &mut clients {
        let took = wait_for_split(client, 50.0, Duration::from_secs(30));
        eprintln!("folder edit → new split through Redis observed after {took:?}");
        assert_split(&client.rpcs(&reviews_target(), 2000, &[]).unwrap(), 50.0);
    }
    // Both replicas serve the same snapshot (same version and content hash).
    let a = replicas[0].admin_json("/debug/snapshot").unwrap();
    let b = replicas[1].admin_json("/debug/snapshot").unwrap();
    assert_eq!((&a["version"], &a["hash"]), (&b["version"], &b["hash"]));
    for r in &replicas {
        assert_eq!(r.nacks().unwrap(), vec![]);
    }
}

#[test]
fn redis_restarted_empty_costs_no_routes_and_heals_by_itself() {
    let (_backends, ports) = reviews_backends();
    let mut redis = RedisServer::start().expect("start redis-server");
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports, (80, 20));
    let _controller = ControllerProcess::config_dir("controller", dir.path(), &redis.url())
        .expect("start the controller");
    // A short resync so the replicas notice the restart quickly.
    let replicas = [
        XdsServer::following("xds-a", &redis.url(), &["--redis-resync", "1s"]).unwrap(),
        XdsServer::following("xds-b", &redis.url(), &["--redis-resync", "1s"]).unwrap(),
    ];
    let mut clients = [
        reviews_client(replicas[0].xds, "client-a"),
        reviews_client(replicas[1].xds, "client-b"),
    ];
    for client in &mut clients {
        assert_routed_80_20(&client.rpcs(&reviews_target(), 500, &[]).unwrap());
    }
    let before = replicas[0].admin_json("/debug/snapshot").unwrap()["version"]
        .as_u64()
        .unwrap();

    redis.kill();
    // Proxies keep their routes while Redis is gone, and replicas stay ready.
    for client in &mut clients {
        let t = client.rpcs(&reviews_target(), 300, &[]).unwrap();
        assert!(
            t.errors.is_empty(),
            "RPCs failed while Redis was down: {t:?}"
        );
    }
    for r in &replicas {
        assert_eq!(
            pilotfish_testkit::process::http_get(r.admin, "/readyz")
                .unwrap()
                .0,
            200
        );
    }
    redis.start_again().expect("restart redis-server empty");

    // The controller republishes by itself (no config change): `latest` reappears.
    let start = Instant::now();
    let mut republished = false;
    while start.elapsed() < Duration::from_secs(30) {
        let out = std::process::Command::new("redis-cli")
            .args([
                "-p",
                &redis.port().to_string(),
                "hget",
                "pilotfish:latest",
                "version",
            ])
            .output()
            .expect("redis-cli");
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            republished = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        republished,
        "the controller did not republish after Redis lost its data"
    );
    // Printed, not asserted (a shared machine): the watchdog checks every second and
    // retries after 200 ms, so this is about 1 s.
    println!(
        "MEASURED Redis back (empty) -> controller republished: {:?}",
        start.elapsed()
    );

    // A later change reaches every replica and every client.
    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        reviews_virtual_service(50, 50),
    )
    .unwrap();
    for client in &mut clients {
        wait_for_split(client, 50.0, Duration::from_secs(30));
        assert_split(&client.rpcs(&reviews_target(), 2000, &[]).unwrap(), 50.0);
    }
    let after = replicas[0].admin_json("/debug/snapshot").unwrap()["version"]
        .as_u64()
        .unwrap();
    eprintln!("served version {before} before the Redis restart, {after} after");
    for r in &replicas {
        assert_eq!(r.nacks().unwrap(), vec![]);
    }
}

fn redis_cli(redis: &RedisServer, args: &[&str]) -> String {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &redis.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn a_corrupt_blob_is_rejected_counted_and_the_replica_keeps_serving() {
    let (_backends, ports) = reviews_backends();
    let redis = RedisServer::start().expect("start redis-server");
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports, (80, 20));
    let _controller =
        ControllerProcess::config_dir("controller", dir.path(), &redis.url()).unwrap();
    let replica = XdsServer::following("xds-a", &redis.url(), &["--redis-resync", "1s"]).unwrap();
    let mut client = reviews_client(replica.xds, "client-a");
    assert_routed_80_20(&client.rpcs(&reviews_target(), 500, &[]).unwrap());
    let served = replica.admin_json("/debug/snapshot").unwrap();
    let epoch = redis_cli(&redis, &["hget", "pilotfish:latest", "epoch"]);

    // A blob that is not a snapshot, written by hand under a newer version.
    redis_cli(
        &redis,
        &[
            "set",
            "pilotfish:snapshot:99",
            "PFSN-this-is-not-a-snapshot",
        ],
    );
    redis_cli(
        &redis,
        &[
            "hset",
            "pilotfish:latest",
            "version",
            "99",
            "hash",
            "deadbeef",
            "epoch",
            &epoch,
        ],
    );
    redis_cli(&redis, &["publish", "pilotfish:notify", "99"]);

    let start = Instant::now();
    let mut counted = false;
    while start.elapsed() < Duration::from_secs(20) && !counted {
        let (_, metrics) = pilotfish_testkit::process::http_get(replica.admin, "/metrics").unwrap();
        counted = metrics
            .lines()
            .any(|l| l.starts_with("pilotfish_snapshot_rejected_total{") && !l.ends_with(" 0"));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        counted,
        "the corrupt blob was not counted in pilotfish_snapshot_rejected_total"
    );
    let still = replica.admin_json("/debug/snapshot").unwrap();
    assert_eq!(
        (&still["version"], &still["hash"]),
        (&served["version"], &served["hash"]),
        "the replica must keep its last good snapshot"
    );
    assert!(
        still["bus"].as_str().unwrap().contains("last error"),
        "{still}"
    );
    assert_routed_80_20(&client.rpcs(&reviews_target(), 500, &[]).unwrap());
}
