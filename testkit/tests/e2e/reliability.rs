//! Issue 12's faults that need processes, each reproduced against the real binaries
//! (`pilotfish-controller`, `pilotfish-xds`, the test API server, `redis-server`): two
//! controllers with one configuration, a deposed controller after Redis restarted empty,
//! a Redis that stops answering during a publish, a controller restarted while Redis is
//! unreachable or in `--config-dir` mode with an invalid object, forged, unsigned and
//! bomb blobs, and a corrupt or unreadable `latest`. The bus-level halves are in
//! `bus_redis.rs`; docs/RELIABILITY.md maps every fault to its tests.
//!
//! Behaviour is asserted (who leads, what is published and served, what is counted, how
//! much memory a replica used), never timing.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use pilotfish_mesh::codec::{self, SnapshotSigner};
use pilotfish_mesh::push_context::PushContext;
use pilotfish_shared::bus::redis::{RedisConfig, follow};
use pilotfish_shared::bus::{BusTask, Follower};
use pilotfish_testkit::mesh::reviews_virtual_service;
use pilotfish_testkit::process::{ControllerProcess, XdsServer, http_get};
use pilotfish_testkit::redis::{RedisServer, TcpLink};
use serde_json::Value;

use crate::controller_k8s::{
    Cluster, Controller, decode, eventually, leader_of, metric, reviews_weights, served,
};
use crate::xds_grpc::write_reviews_mesh;

const PUBLISHED: &str = "pilotfish_snapshot_publishes_total{outcome=\"published\"}";

/// A follower of real snapshots straight from Redis, re-reading often.
fn observer(url: &str) -> (Follower<PushContext>, BusTask) {
    let config = RedisConfig::new(url)
        .unwrap()
        .with_resync_interval(Duration::from_millis(200))
        .with_backoff(Duration::from_millis(50), Duration::from_millis(500));
    follow(config, decode).expect("follow Redis")
}

/// What `follower` serves from now on, in order: `(content hash, reviews weights)`.
type History = Arc<Mutex<Vec<(String, Option<Vec<i32>>)>>>;

fn record(follower: &Follower<PushContext>) -> History {
    let seen: History = Arc::default();
    let mut updates = follower.subscribe();
    let sink = seen.clone();
    tokio::spawn(async move {
        while updates.changed().await.is_ok() {
            if let Some(f) = updates.borrow_and_update().clone() {
                let entry = (f.reference.hash.clone(), reviews_weights(&f.value));
                sink.lock().unwrap().push(entry);
            }
        }
    });
    seen
}

/// Like [`record`], with the folder mesh's `split` weights.
fn record_split(follower: &Follower<PushContext>) -> History {
    let seen: History = Arc::default();
    let mut updates = follower.subscribe();
    let sink = seen.clone();
    let probe = follower.clone();
    tokio::spawn(async move {
        while updates.changed().await.is_ok() {
            let hash = updates
                .borrow_and_update()
                .as_ref()
                .map(|f| f.reference.hash.clone());
            if let (Some(hash), Some(weights)) = (hash, split_weights(&probe)) {
                sink.lock().unwrap().push((hash, weights));
            }
        }
    });
    seen
}

/// A plain Redis connection (commands a test writes by hand, as an attacker or a fault
/// would).
fn redis_conn(redis: &RedisServer) -> redis::Connection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

fn latest(conn: &mut redis::Connection) -> Option<(u64, String, u64)> {
    let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg("pilotfish:latest")
        .query(conn)
        .ok()?;
    Some((
        fields.get("version")?.parse().ok()?,
        fields.get("hash")?.clone(),
        fields.get("epoch")?.parse().ok()?,
    ))
}

/// `(version, hash)` a replica serves.
fn serving(replica: &XdsServer) -> (u64, String) {
    let page = replica
        .admin_json("/debug/snapshot")
        .expect("/debug/snapshot");
    (
        page["version"].as_u64().unwrap_or(0),
        page["hash"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Peak resident memory of a process, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// Defect 2 (two controllers with the same configuration both lead and overwrite each
/// other) and defect 1 (a deposed controller's mesh served again after Redis restarted
/// empty), with two real controllers given the same `--replica-name`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_configuration_twice_never_both_publish_and_a_deposed_mesh_is_never_served_again() {
    let cluster = Cluster::start().await;
    let mut redis = RedisServer::start().expect("redis-server");
    let mut a = Controller::new("controller", &redis.url(), &cluster);
    let mut b = Controller::new("controller", &redis.url(), &cluster);
    a.start();
    b.start();
    cluster.install_reviews(10001, 10002).await;
    let (follower, _follow_task) = observer(&redis.url());
    eventually("the 80/20 route in Redis", || {
        (served(&follower)?? == [80, 20]).then_some(())
    })
    .await;
    // Exactly one leads, under an identity of its own.
    let first = leader_of(&[&a, &b]).await;
    let identities: Vec<String> = [&a, &b]
        .iter()
        .map(|c| {
            c.leader_page().unwrap()["identity"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_ne!(identities[0], identities[1]);
    assert!(identities.iter().all(|i| i.starts_with("controller_")));
    let mut conn = redis_conn(&redis);
    let (_, _, epoch) = latest(&mut conn).expect("latest");
    for (file, weights) in [
        ("reviews-50-50.yaml", [50, 50]),
        ("reviews-80-20.yaml", [80, 20]),
        ("reviews-0-100.yaml", [0, 100]),
    ] {
        cluster.apply(file).await;
        eventually("the change in Redis", || {
            (served(&follower)?? == weights).then_some(())
        })
        .await;
        assert_eq!(leader_of(&[&a, &b]).await, first, "leadership moved");
        assert_eq!(
            latest(&mut conn).expect("latest").2,
            epoch,
            "another epoch wrote"
        );
    }
    let controllers = [&mut a, &mut b];
    let standby = 1 - first;
    let standby_metrics = controllers[standby].metrics();
    for outcome in ["published", "fenced"] {
        assert_eq!(
            metric(
                &standby_metrics,
                &format!("pilotfish_snapshot_publishes_total{{outcome=\"{outcome}\"}}")
            ),
            0.0,
            "the standby's {outcome} publishes"
        );
    }
    assert!(metric(&controllers[first].metrics(), PUBLISHED) >= 1.0);
    for c in controllers.iter() {
        assert_eq!(
            metric(&c.metrics(), "pilotfish_leader_stood_down_total"),
            0.0
        );
    }

    // --- the leader is paused, the standby takes over and publishes a change ---
    let replica = XdsServer::following("xds", &redis.url(), &["--redis-resync", "300ms"]).unwrap();
    let deposed_hash = serving(&replica).1;
    controllers[first].signal("STOP");
    eventually("the standby to lead", || {
        controllers[standby].leads().then_some(())
    })
    .await;
    let new_epoch = eventually("its epoch", || controllers[standby].epoch()).await;
    assert!(new_epoch > epoch);
    cluster.apply("reviews-50-50.yaml").await;
    eventually("the new leader's change", || {
        (served(&follower)?? == [50, 50]).then_some(())
    })
    .await;
    let current_hash = follower.current().unwrap().reference.hash.clone();
    eventually("the replica to serve it", || {
        (serving(&replica).1 == current_hash).then_some(())
    })
    .await;

    // --- Redis restarts empty while the deposed leader is paused; then it resumes ---
    let history = record(&follower);
    redis.restart().expect("restart redis-server");
    controllers[first].signal("CONT");
    // Until the new leader has republished, and for a while after: nothing but its mesh.
    let mut conn = redis_conn(&redis);
    let mut republished = 0;
    for _ in 0..60 {
        if let Some((_, hash, epoch)) = latest(&mut conn) {
            assert_eq!(
                (hash.as_str(), epoch),
                (current_hash.as_str(), new_epoch),
                "Redis holds another writer's snapshot"
            );
            republished += 1;
        }
        let (_, hash) = serving(&replica);
        assert_ne!(hash, deposed_hash, "the replica serves the deposed mesh");
        assert_eq!(hash, current_hash);
        if republished >= 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        republished >= 20,
        "the leader did not republish after the reset"
    );
    for (hash, _) in history.lock().unwrap().iter() {
        assert_eq!(hash, &current_hash, "served after the reset");
    }
    eventually("the resumed controller to step down", || {
        (controllers[first].leader_page()?["leader"] == false).then_some(())
    })
    .await;
    assert_eq!(latest(&mut conn).map(|l| l.2), Some(new_epoch));
    for c in controllers.into_iter() {
        c.assert_running();
    }
}

/// Defect 2, second half: Redis I/O no longer runs inline in the controller's loop, so a
/// Redis that stops answering during a publish does not keep the loop from ending the
/// term when the Lease is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_redis_does_not_hold_up_the_end_of_a_term() {
    let cluster = Cluster::start().await;
    let redis = RedisServer::start().expect("redis-server");
    let link = TcpLink::start(redis.addr()).await.unwrap();
    let mut a = Controller::new("controller-a", &link.redis_url(), &cluster);
    a.start();
    cluster.install_reviews(10001, 10002).await;
    let (follower, _follow_task) = observer(&redis.url());
    eventually("the 80/20 route in Redis", || {
        (served(&follower)?? == [80, 20]).then_some(())
    })
    .await;
    eventually("a to lead", || a.leads().then_some(())).await;

    link.stall();
    cluster.apply("reviews-50-50.yaml").await;
    eventually("the publish in flight", || {
        (a.leader_page()?["in_flight"] == "publish").then_some(())
    })
    .await;
    // Someone else holds the Lease now.
    cluster
        .kubectl(&[
            "patch",
            "lease",
            "pilotfish-controller",
            "-n",
            "default",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"holderIdentity":"someone-else"}}"#,
        ])
        .await;
    let page = eventually("the term to end while the publish hangs", || {
        let page = a.leader_page()?;
        (page["leader"] == false).then_some(page)
    })
    .await;
    assert_eq!(page["in_flight"], "publish", "{page}");
    assert_eq!(page["term"], Value::Null, "{page}");
    link.restore();
    a.assert_running();
}

/// Defect 6, Kubernetes mode: a controller that starts while Redis is unreachable waits
/// (not ready, saying why) instead of building without the published snapshot, so an
/// object invalid at restart keeps its last good version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restarted_while_redis_is_unreachable_keeps_the_last_good_version() {
    let cluster = Cluster::start().await;
    let redis = RedisServer::start().expect("redis-server");
    let link = TcpLink::start(redis.addr()).await.unwrap();
    let mut a = Controller::new("controller-a", &link.redis_url(), &cluster);
    a.start();
    cluster.install_reviews(10001, 10002).await;
    let (follower, _follow_task) = observer(&redis.url());
    eventually("the 80/20 route in Redis", || {
        (served(&follower)?? == [80, 20]).then_some(())
    })
    .await;
    a.kill();
    cluster.apply("reviews-invalid.yaml").await;
    link.cut();
    a.start();
    eventually("not ready, naming the wait and Redis' failure", || {
        let (code, body) = http_get(a.admin, "/readyz").ok()?;
        (code == 503
            && body.contains("waiting to read back the published snapshot")
            && body.contains("Redis:"))
        .then_some(())
    })
    .await;
    // Several failed attempts later, still nothing built.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        a.leader_page().unwrap()["last_published"],
        Value::Null,
        "published while Redis was unreachable"
    );
    let history = record(&follower);
    link.restore();
    let snapshot = eventually("the restarted controller's publish", || {
        let page: Value = serde_json::from_str(&a.get("/debug/snapshot")?).ok()?;
        matches!(
            page["publish"]["result"].as_str(),
            Some("published" | "unchanged")
        )
        .then_some(page)
    })
    .await;
    assert!(
        snapshot["kept_previous"]
            .to_string()
            .contains("VirtualService default/reviews"),
        "{snapshot}"
    );
    assert_eq!(served(&follower), Some(Some(vec![80, 20])));
    for (_, weights) in history.lock().unwrap().iter() {
        assert_eq!(
            weights.as_deref(),
            Some(&[80, 20][..]),
            "served after the restart"
        );
    }
    a.assert_running();
}

/// The weights of the folder mesh's `split` route (`None`: no such route).
fn split_weights(follower: &Follower<PushContext>) -> Option<Option<Vec<i32>>> {
    let served = follower.current()?;
    let vs = served
        .value
        .virtual_services()
        .iter()
        .find(|vs| vs.meta.namespace == "default" && vs.meta.name == "reviews")
        .cloned();
    Some(vs.and_then(|vs| {
        let split = vs
            .spec
            .http
            .iter()
            .find(|h| h.name.as_deref() == Some("split"))?;
        Some(split.route.iter().map(|r| r.weight.unwrap_or(0)).collect())
    }))
}

/// The reviews VirtualService with a negative weight: invalid, so a build keeps the last
/// accepted version if it has one.
fn invalid_reviews_virtual_service() -> String {
    reviews_virtual_service(80, 20).replace("weight: 20", "weight: -20")
}

fn ports() -> Vec<(&'static str, u16)> {
    vec![("v1", 10001), ("v2", 10002), ("v3", 10003)]
}

/// Defect 6, `--config-dir` mode: a controller restarted with an object that became
/// invalid keeps serving that object's last good version (it reads back the published
/// snapshot, as the Kubernetes mode does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folder_controller_restarted_with_an_invalid_object_keeps_its_last_good_version() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports(), (80, 20));
    let (follower, _follow_task) = observer(&redis.url());
    let controller = ControllerProcess::config_dir("controller", dir.path(), &redis.url())
        .expect("start the controller");
    eventually("the 80/20 route in Redis", || {
        (split_weights(&follower)?? == [80, 20]).then_some(())
    })
    .await;
    drop(controller);
    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        invalid_reviews_virtual_service(),
    )
    .unwrap();
    let history = record_split(&follower);
    let restarted = ControllerProcess::config_dir("controller", dir.path(), &redis.url())
        .expect("restart the controller");
    let page: Value =
        serde_json::from_str(&http_get(restarted.admin, "/debug/snapshot").unwrap().1).unwrap();
    assert!(
        page["kept_previous"]
            .to_string()
            .contains("VirtualService default/reviews"),
        "{page}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(split_weights(&follower), Some(Some(vec![80, 20])));
    for (_, weights) in history.lock().unwrap().iter() {
        assert_eq!(
            weights.as_deref(),
            Some(&[80, 20][..]),
            "served after the restart"
        );
    }
}

/// A zstd frame of RLE blocks that decompresses to `size` zero bytes (RFC 8878: frame
/// header without content size, 128 KiB window; each block 4 bytes): a few KiB that a
/// naive reader expands to `size`.
fn zero_bomb(size: usize) -> Vec<u8> {
    const BLOCK: usize = 128 << 10;
    let mut frame = vec![0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x38];
    let blocks = size.div_ceil(BLOCK);
    for i in 0..blocks {
        let len = BLOCK.min(size - i * BLOCK) as u32;
        let last = u32::from(i + 1 == blocks);
        let header = last | (1 << 1) | (len << 3);
        frame.extend_from_slice(&header.to_le_bytes()[..3]);
        frame.push(0);
    }
    frame
}

/// Writes `blob` under `latest`'s next version with `latest`'s epoch (as anyone with write
/// access to Redis could) and announces it. Returns the version.
fn plant(conn: &mut redis::Connection, blob: &[u8], hash: &str) -> u64 {
    let (version, _, epoch) = latest(conn).expect("latest");
    let version = version + 1;
    let _: () = redis::cmd("SET")
        .arg(format!("pilotfish:snapshot:{version}"))
        .arg(blob)
        .query(conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg("pilotfish:latest")
        .arg("version")
        .arg(version)
        .arg("hash")
        .arg(hash)
        .arg("epoch")
        .arg(epoch)
        .query(conn)
        .unwrap();
    let _: () = redis::cmd("PUBLISH")
        .arg("pilotfish:notify")
        .arg(version)
        .query(conn)
        .unwrap();
    version
}

/// Defect 4: whoever can write Redis cannot make a replica serve a snapshot (unsigned,
/// signed by another key, altered), and no blob — not even one signed with the real key
/// — makes a replica decompress more than the limits allow.
#[test]
fn replicas_refuse_unsigned_forged_and_bomb_blobs_without_the_memory() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports(), (80, 20));
    let _controller = ControllerProcess::config_dir("controller", dir.path(), &redis.url())
        .expect("start the controller");
    let replica = XdsServer::following("xds", &redis.url(), &["--redis-resync", "300ms"]).unwrap();
    let (_, good_hash) = serving(&replica);
    let before = peak_rss(replica.process.pid());
    let mut conn = redis_conn(&redis);
    let good_blob: Vec<u8> = {
        let (version, _, _) = latest(&mut conn).unwrap();
        redis::cmd("GET")
            .arg(format!("pilotfish:snapshot:{version}"))
            .query(&mut conn)
            .unwrap()
    };
    let real = pilotfish_testkit::keys::signer();
    let other = SnapshotSigner::from_seed([0x66; 32]);
    let mut tampered = good_blob.clone();
    let last = tampered.len() - 1;
    tampered[last] ^= 0x01;
    let mut unsigned = b"PFSN".to_vec();
    unsigned.extend_from_slice(&1u16.to_le_bytes());
    unsigned.extend_from_slice(&[0; 46]);
    unsigned.extend_from_slice(&good_blob[124..]);
    let bomb = zero_bomb(1 << 30);
    assert!(bomb.len() < 64 << 10);
    let attacks: Vec<(&str, Vec<u8>, &str)> = vec![
        ("unsigned", unsigned, "unsigned"),
        ("tampered", tampered, "bad_signature"),
        (
            "forged",
            codec::seal(b"anything", &other).bytes,
            "unknown_key",
        ),
        (
            "bomb signed by another key",
            codec::seal_frame(bomb.clone(), 1 << 20, [0; 32], &other).bytes,
            "unknown_key",
        ),
        (
            "bomb declaring its size, signed with the real key",
            codec::seal_frame(bomb.clone(), 1 << 30, [0; 32], &real).bytes,
            "too_large",
        ),
        (
            "bomb declaring 1 MiB, signed with the real key",
            codec::seal_frame(bomb, 1 << 20, [0; 32], &real).bytes,
            "corrupt",
        ),
    ];
    for (what, blob, reason) in attacks {
        let counted = |r: &XdsServer| {
            r.metric(
                "pilotfish_snapshot_rejected_total",
                &format!("reason=\"{reason}\""),
            )
            .unwrap()
        };
        let already = counted(&replica);
        plant(&mut conn, &blob, "deadbeef");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while counted(&replica) <= already {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: not counted as {reason}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(serving(&replica).1, good_hash, "{what}: served");
    }
    let growth = peak_rss(replica.process.pid()).saturating_sub(before);
    assert!(
        growth < 64 << 20,
        "the replica's peak memory grew by {} MiB",
        growth >> 20
    );
    // The controller publishes again over what was planted; the replica follows.
    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        reviews_virtual_service(50, 50),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while serving(&replica).1 == good_hash {
        assert!(std::time::Instant::now() < deadline, "the next publish");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `INFO commandstats` calls of `command` so far.
fn command_calls(conn: &mut redis::Connection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Defect 5: a replica starting while `latest` names a corrupt blob becomes ready on the
/// newest good retained one; an unreadable `latest` makes no replica spin and no
/// publisher wedge — the next publish overwrites it.
#[test]
fn a_corrupt_or_unreadable_latest_does_not_stop_recovery() {
    let redis = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    write_reviews_mesh(dir.path(), &ports(), (80, 20));
    let controller = ControllerProcess::config_dir("controller", dir.path(), &redis.url())
        .expect("start the controller");
    let mut conn = redis_conn(&redis);
    let (good, good_hash, _) = latest(&mut conn).unwrap();
    std::fs::write(
        dir.path().join("virtual-service.yaml"),
        reviews_virtual_service(50, 50),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while latest(&mut conn).unwrap().0 == good {
        assert!(std::time::Instant::now() < deadline, "the second publish");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(controller);
    let (bad, _, _) = latest(&mut conn).unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("pilotfish:snapshot:{bad}"))
        .arg("PFSN garbage")
        .query(&mut conn)
        .unwrap();
    // A replica starts: ready, serving the newest good retained snapshot.
    let replica = XdsServer::following("xds", &redis.url(), &["--redis-resync", "300ms"]).unwrap();
    assert_eq!(serving(&replica), (good, good_hash.clone()));
    assert!(
        replica
            .metric("pilotfish_snapshot_rejected_total", "reason=\"bad_magic\"")
            .unwrap()
            + replica
                .metric("pilotfish_snapshot_rejected_total", "reason=\"truncated\"")
                .unwrap()
            >= 1.0
    );

    // `latest` becomes unreadable: the replica keeps serving and does not reconnect.
    let _: () = redis::cmd("HSET")
        .arg("pilotfish:latest")
        .arg("version")
        .arg("not-a-number")
        .query(&mut conn)
        .unwrap();
    let subscribes = command_calls(&mut conn, "subscribe");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        command_calls(&mut conn, "subscribe"),
        subscribes,
        "reconnects"
    );
    assert_eq!(serving(&replica), (good, good_hash.clone()));
    assert_eq!(
        http_get(replica.admin, "/readyz").unwrap().0,
        200,
        "readiness flapped"
    );
    // The next controller overwrites it, and the replica follows.
    let _controller = ControllerProcess::config_dir("controller", dir.path(), &redis.url())
        .expect("restart the controller");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while serving(&replica).0 <= bad {
        assert!(std::time::Instant::now() < deadline, "the overwrite");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(latest(&mut conn).is_some());
}
