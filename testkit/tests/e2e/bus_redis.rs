//! The snapshot bus against real `redis-server` processes (each test starts its own):
//! convergence of several followers, fencing, healing after a lost connection or
//! notification, Redis restarted empty (a deposed writer's snapshot is never served), a
//! corrupt, oversized, swapped or unreadable `latest` and the fallback to a retained
//! blob, retention and Redis memory under churn, AUTH and database selection.
//!
//! Blobs use a toy codec (magic + UTF-8 payload, content hash `hash-{payload}`); the
//! decode function is a parameter of the follower, so the real codec can be swapped in
//! without changing the bus.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use pilotfish_shared::bus::redis::{RedisConfig, RedisPublisher, follow};
use pilotfish_shared::bus::{
    BusTask, Claim, EncodedSnapshot, EpochGrant, Followed, Follower, PublishOutcome, Rejection,
    SnapshotPublisher, SnapshotRef, Verified, metrics,
};
use pilotfish_testkit::redis::{RedisOptions, RedisServer, TcpLink};
use redis::AsyncCommands;

/// Generous bound for anything to happen; never a performance assertion.
const WAIT: Duration = Duration::from_secs(30);
const MAGIC: &[u8] = b"PFTOY1\n";

fn encode(payload: &str) -> EncodedSnapshot {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(payload.as_bytes());
    EncodedSnapshot {
        bytes: Bytes::from(bytes),
        hash: format!("hash-{payload}"),
    }
}

fn decode(bytes: &[u8]) -> Result<Verified<String>, Rejection> {
    let payload = bytes.strip_prefix(MAGIC).ok_or_else(|| Rejection {
        reason: "corrupt",
        detail: "bad magic".into(),
    })?;
    let payload = String::from_utf8(payload.to_vec()).map_err(|e| Rejection {
        reason: "corrupt",
        detail: e.to_string(),
    })?;
    Ok(Verified {
        hash: format!("hash-{payload}"),
        value: payload,
    })
}

/// Fast timers so healing happens within a test's patience.
fn config(url: &str) -> RedisConfig {
    RedisConfig::new(url)
        .unwrap()
        .with_resync_interval(Duration::from_millis(300))
        .with_backoff(Duration::from_millis(50), Duration::from_millis(500))
        .with_timeouts(Duration::from_secs(2), Duration::from_secs(10))
}

/// Each leader of these tests acquires after the one before: a higher epoch floor, as
/// the Lease gives a later acquisition.
fn next_floor() -> u64 {
    static FLOOR: AtomicU64 = AtomicU64::new(1_000);
    FLOOR.fetch_add(1, Ordering::Relaxed)
}

async fn leader(config: RedisConfig) -> RedisPublisher {
    let publisher = RedisPublisher::new(config).unwrap();
    let grant = publisher.take_epoch(next_floor()).await.unwrap();
    assert!(matches!(grant, EpochGrant::Taken(_)), "{grant:?}");
    publisher
}

fn always() -> Claim {
    Arc::new(|| true)
}

async fn publish(publisher: &RedisPublisher, payload: &str) -> SnapshotRef {
    match publisher.publish(encode(payload)).await.unwrap() {
        PublishOutcome::Published(r) => r,
        other => panic!("publishing {payload:?}: expected Published, got {other:?}"),
    }
}

fn followers(config: &RedisConfig, n: usize) -> Vec<(Follower<String>, BusTask)> {
    (0..n)
        .map(|_| follow(config.clone(), decode).unwrap())
        .collect()
}

async fn reaches(
    follower: &Follower<String>,
    reference: &SnapshotRef,
) -> std::sync::Arc<Followed<String>> {
    match follower.wait_for(WAIT, |f| &f.reference == reference).await {
        Some(f) => f,
        None => panic!(
            "follower did not reach {reference} within {WAIT:?}; it serves {:?}, status {:?}",
            follower.current().map(|f| f.reference.clone()),
            follower.status()
        ),
    }
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Polls `check` every 50 ms until it holds; panics with `what` after [`WAIT`].
async fn eventually<F: AsyncFnMut() -> bool>(what: &str, mut check: F) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not reached within {WAIT:?}: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_publisher_three_followers_reach_the_same_version_and_hash() {
    let redis = RedisServer::start().unwrap();
    let cfg = config(&redis.url());
    let publisher = leader(cfg.clone()).await;
    let first = publish(&publisher, "one").await;
    // Followers started after a publish load `latest` at start.
    let followers = followers(&cfg, 3);
    for (f, _) in &followers {
        assert_eq!(reaches(f, &first).await.value, "one");
    }
    let mut last = first.clone();
    for payload in ["two", "three"] {
        let next = publish(&publisher, payload).await;
        assert!(next.version > last.version, "{next} after {last}");
        last = next;
    }
    for (f, _) in &followers {
        let got = reaches(f, &last).await;
        assert_eq!(got.value, "three");
        assert_eq!(got.reference.hash, "hash-three");
        assert!(f.status().is_ready());
        assert!(f.status().connected);
    }
    // Same content again: no new version.
    assert_eq!(
        publisher.publish(encode("three")).await.unwrap(),
        PublishOutcome::Unchanged(last.clone())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_with_an_older_epoch_cannot_move_latest() {
    let redis = RedisServer::start().unwrap();
    let cfg = config(&redis.url());
    let old = leader(cfg.clone()).await;
    let before = publish(&old, "old-leader").await;

    // A new leader takes an epoch: the old one is fenced at once, before the new one
    // publishes anything.
    let new = leader(cfg.clone()).await;
    let outcome = old.publish(encode("old-again")).await.unwrap();
    assert_eq!(
        outcome,
        PublishOutcome::Fenced {
            current: Some(before.clone())
        }
    );

    let current = publish(&new, "new-leader").await;
    assert!(current.epoch > before.epoch);
    assert!(
        current.version > before.version,
        "versions keep growing across leaders"
    );
    // The old leader's next attempt allocates a higher version than `current`, and is
    // still refused: the epoch decides.
    let outcome = old.publish(encode("old-third")).await.unwrap();
    assert_eq!(
        outcome,
        PublishOutcome::Fenced {
            current: Some(current.clone())
        }
    );
    let mut conn = raw(&redis.url()).await;
    let counter: u64 = conn.get("pilotfish:version").await.unwrap();
    assert!(
        counter > current.version,
        "the refused publish used a higher version ({counter})"
    );
    assert_eq!(old.latest().await.unwrap(), Some(current.clone()));
    // Its blob was removed by the script, not left behind.
    let refused_blob: bool = conn
        .exists(format!("pilotfish:snapshot:{counter}"))
        .await
        .unwrap();
    assert!(!refused_blob);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cut_off_while_two_versions_were_published_catches_up() {
    let redis = RedisServer::start().unwrap();
    let link = TcpLink::start(redis.addr()).await.unwrap();
    let publisher = leader(config(&redis.url())).await;
    let (follower, _task) = follow(config(&link.redis_url()), decode).unwrap();
    let first = publish(&publisher, "before-cut").await;
    reaches(&follower, &first).await;

    link.cut();
    eventually("follower notices the cut", async || {
        !follower.status().connected
    })
    .await;
    publish(&publisher, "during-cut-1").await;
    let newest = publish(&publisher, "during-cut-2").await;
    assert_eq!(
        follower.current().unwrap().reference,
        first,
        "still serving the last snapshot"
    );
    assert!(
        follower.status().is_ready(),
        "readiness does not flap while Redis is unreachable"
    );
    assert!(
        follower.status().detail().contains("unreachable"),
        "{}",
        follower.status().detail()
    );
    link.restore();
    assert_eq!(reaches(&follower, &newest).await.value, "during-cut-2");

    // A version whose notification is lost (written without PUBLISH) is found by the
    // periodic re-read of `latest`.
    let silent = SnapshotRef {
        version: newest.version + 10,
        hash: "hash-silent".into(),
        epoch: newest.epoch,
        published_at_ms: 0,
    };
    let mut conn = raw(&redis.url()).await;
    let _: () = conn
        .set(
            format!("pilotfish:snapshot:{}", silent.version),
            encode("silent").bytes.to_vec(),
        )
        .await
        .unwrap();
    let _: () = conn
        .hset_multiple(
            "pilotfish:latest",
            &[
                ("version", silent.version.to_string()),
                ("hash", silent.hash.clone()),
                ("epoch", silent.epoch.to_string()),
                ("published_at_ms", "0".to_owned()),
            ],
        )
        .await
        .unwrap();
    assert_eq!(reaches(&follower, &silent).await.value, "silent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_publisher_republishes_and_followers_keep_serving() {
    let mut redis = RedisServer::start().unwrap();
    let cfg = config(&redis.url());
    let publisher = leader(cfg.clone()).await;
    let _watchdog = publisher.spawn_watchdog(always());
    let followers = followers(&cfg, 3);
    publish(&publisher, "a").await;
    let held = publish(&publisher, "b").await;
    for (f, _) in &followers {
        reaches(f, &held).await;
    }

    redis.kill();
    for (f, _) in &followers {
        let f = f.clone();
        eventually("followers see Redis gone", async || !f.status().connected).await;
    }
    // Throughout the outage every follower serves its last snapshot and stays ready.
    for _ in 0..5 {
        for (f, _) in &followers {
            assert_eq!(f.current().unwrap().reference, held);
            assert!(f.status().is_ready());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    redis.start_again().unwrap();
    // The publisher notices `latest` is gone and republishes by itself, with a version
    // re-seeded above what it handed out before.
    let mut republished = None;
    eventually("publisher republishes after the reset", async || {
        republished = publisher.latest().await.ok().flatten();
        republished.is_some()
    })
    .await;
    let republished = republished.unwrap();
    assert_eq!(republished.hash, held.hash);
    assert!(
        republished.version > held.version,
        "{republished} after {held}"
    );
    for (f, _) in &followers {
        assert_eq!(reaches(f, &republished).await.value, "b");
    }
    let later = publish(&publisher, "c").await;
    for (f, _) in &followers {
        assert_eq!(reaches(f, &later).await.value, "c");
        assert!(f.status().connected);
    }
}

/// A new leader after Redis restarted empty (a new acquisition, a higher epoch) starts
/// its versions low again: followers take it, because the epoch orders first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_accept_a_regressed_sequence_after_redis_and_controller_restart() {
    let mut redis = RedisServer::start().unwrap();
    let cfg = config(&redis.url());
    let followers = followers(&cfg, 2);
    let held = {
        let publisher = leader(cfg.clone()).await;
        for payload in ["v1", "v2", "v3"] {
            publish(&publisher, payload).await;
        }
        publish(&publisher, "v4").await
    }; // the controller goes away with its memory of versions
    for (f, _) in &followers {
        reaches(f, &held).await;
    }
    redis.restart().unwrap();

    // A fresh controller on an empty Redis starts again at version 1: lower than what the
    // followers hold, under a higher epoch (a later acquisition).
    let publisher = leader(cfg.clone()).await;
    let restarted = publish(&publisher, "after-reset").await;
    assert!(restarted.version < held.version, "{restarted} vs {held}");
    for (f, _) in &followers {
        assert_eq!(reaches(f, &restarted).await.value, "after-reset");
    }
    let later = publish(&publisher, "after-reset-2").await;
    for (f, _) in &followers {
        reaches(f, &later).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_blob_is_rejected_counted_and_the_previous_snapshot_kept() {
    let redis = RedisServer::start().unwrap();
    let cfg = config(&redis.url());
    let publisher = leader(cfg.clone()).await;
    let (follower, _task) = follow(cfg.clone(), decode).unwrap();
    let (small_follower, _small_task) =
        follow(cfg.clone().with_max_blob_bytes(64), decode).unwrap();
    let good = publish(&publisher, "good").await;
    reaches(&follower, &good).await;
    reaches(&small_follower, &good).await;
    let corrupt_before = metrics::rejected_total("corrupt");
    let oversized_before = metrics::rejected_total("oversized");

    // Written by hand under a newer version, announced like a real publish.
    let bad_version = good.version + 1;
    let mut conn = raw(&redis.url()).await;
    let garbage = vec![0xAB_u8; 200];
    let _: () = conn
        .set(format!("pilotfish:snapshot:{bad_version}"), garbage)
        .await
        .unwrap();
    let _: () = conn
        .hset_multiple(
            "pilotfish:latest",
            &[
                ("version", bad_version.to_string()),
                ("hash", "hash-garbage".to_owned()),
                ("epoch", good.epoch.to_string()),
                ("published_at_ms", "0".to_owned()),
            ],
        )
        .await
        .unwrap();
    let _: () = conn.publish("pilotfish:notify", bad_version).await.unwrap();

    eventually("the corrupt blob is rejected", async || {
        follower.status().rejected == 1
    })
    .await;
    eventually("the oversized blob is rejected", async || {
        small_follower.status().rejected == 1
    })
    .await;
    assert!(metrics::rejected_total("corrupt") > corrupt_before);
    assert!(metrics::rejected_total("oversized") > oversized_before);
    assert_eq!(follower.current().unwrap().reference, good);
    assert!(
        follower
            .status()
            .last_error
            .unwrap_or_default()
            .contains("corrupt")
    );
    // Re-reads of `latest` do not fetch the rejected blob again.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(follower.status().rejected, 1);

    // The next good version is accepted.
    let next = publish(&publisher, "next").await;
    assert!(next.version > bad_version);
    assert_eq!(reaches(&follower, &next).await.value, "next");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_keeps_exactly_k_blobs() {
    let redis = RedisServer::start().unwrap();
    let cfg = config(&redis.url())
        .with_retention(3)
        .unwrap()
        .with_superseded_ttl(Duration::from_millis(200));
    let publisher = leader(cfg).await;
    let mut published = Vec::new();
    for i in 0..8 {
        published.push(publish(&publisher, &format!("blob-{i}")).await.version);
    }
    let mut conn = raw(&redis.url()).await;
    let newest: Vec<u64> = published[published.len() - 3..].to_vec();
    for v in &newest {
        let ttl: i64 = conn.ttl(format!("pilotfish:snapshot:{v}")).await.unwrap();
        assert_eq!(ttl, -1, "v{v} is among the newest 3 and must persist");
    }
    let mut keys: Vec<String> = Vec::new();
    eventually("superseded blobs expire", async || {
        keys = conn.keys("pilotfish:snapshot:*").await.unwrap();
        keys.len() == 3
    })
    .await;
    let mut kept: Vec<u64> = keys
        .iter()
        .map(|k| k.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    kept.sort_unstable();
    assert_eq!(kept, newest);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_from_a_password_file_and_a_database_number() {
    let redis = RedisServer::start_with(RedisOptions {
        password: Some("s3cret-pw".into()),
        ..RedisOptions::default()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pw_file = dir.path().join("redis-password");
    std::fs::write(&pw_file, "s3cret-pw\n").unwrap();
    let url = format!("{}/4", redis.url());
    let cfg = config(&url)
        .with_password_from(Some(Path::new(&pw_file)))
        .unwrap();

    // Without the password the follower gets nothing, and says why.
    let (unauthenticated, _t) = follow(config(&url), decode).unwrap();
    let publisher = leader(cfg.clone()).await;
    let (follower, _task) = follow(cfg.clone(), decode).unwrap();
    let reference = publish(&publisher, "authed").await;
    assert_eq!(reaches(&follower, &reference).await.value, "authed");
    eventually(
        "the follower without password reports the refusal",
        async || {
            let error = unauthenticated.status().last_error.unwrap_or_default();
            error.contains("Authentication required") && error.contains("password")
        },
    )
    .await;
    assert!(unauthenticated.current().is_none());
    assert!(!unauthenticated.status().is_ready());

    // Everything lives in database 4.
    let mut conn = raw(&format!("redis://:s3cret-pw@127.0.0.1:{}/4", redis.port())).await;
    let version: Option<u64> = conn.hget("pilotfish:latest", "version").await.unwrap();
    assert_eq!(version, Some(reference.version));
    let mut db0 = raw(&format!("redis://:s3cret-pw@127.0.0.1:{}/0", redis.port())).await;
    let in_db0: bool = db0.exists("pilotfish:latest").await.unwrap();
    assert!(!in_db0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca() {
    let redis = RedisServer::start_with(RedisOptions {
        tls: true,
        ..RedisOptions::default()
    })
    .unwrap();
    let ca = redis.ca_path().unwrap();
    let cfg = config(&redis.url()).with_tls_ca_file(&ca).unwrap();
    assert!(cfg.is_tls());
    let publisher = leader(cfg.clone()).await;
    let (follower, _task) = follow(cfg.clone(), decode).unwrap();
    let reference = publish(&publisher, "over-tls").await;
    assert_eq!(reaches(&follower, &reference).await.value, "over-tls");

    // Without the CA the server certificate is not trusted: nothing is served.
    let (untrusting, _t) = follow(config(&redis.url()), decode).unwrap();
    eventually(
        "the untrusting follower reports the TLS failure",
        async || untrusting.status().last_error.is_some(),
    )
    .await;
    assert!(untrusting.current().is_none());
}

/// Every value `follower` serves from now on, in order (for assertions about what was
/// never served).
fn record(follower: &Follower<String>) -> Arc<std::sync::Mutex<Vec<String>>> {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut updates = follower.subscribe();
    let sink = seen.clone();
    tokio::spawn(async move {
        while updates.changed().await.is_ok() {
            if let Some(f) = updates.borrow_and_update().clone() {
                sink.lock().unwrap().push(f.value.clone());
            }
        }
    });
    seen
}

/// Issue 12, defect 1: a deposed writer that still believes in its epoch writes into a
/// Redis that restarted empty. Followers holding the new leader's snapshot refuse it
/// (a lower epoch), the deposed writer's own watchdog (claim lost) never republishes, and
/// the leader's watchdog republishes its own within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_redis_reset_a_deposed_writers_snapshot_is_never_served() {
    let mut redis = RedisServer::start().unwrap();
    let cfg = config(&redis.url()).with_watchdog_interval(Duration::from_millis(300));
    let deposed = leader(cfg.clone()).await;
    publish(&deposed, "deposed-mesh").await;
    let current = leader(cfg.clone()).await;
    let held = publish(&current, "current-mesh").await;
    // The deposed process lost its claim: its watchdog must ask, and be told no.
    let _deposed_watchdog = deposed.spawn_watchdog(Arc::new(|| false));
    let _current_watchdog = current.spawn_watchdog(always());
    let followers = followers(&cfg, 2);
    let mut seen = Vec::new();
    for (f, _) in &followers {
        reaches(f, &held).await;
        seen.push(record(f));
    }

    redis.restart().unwrap();
    // The deposed writer publishes into the empty Redis (nothing there fences it yet).
    let outcome = deposed.publish(encode("deposed-mesh-2")).await;
    // Whatever it got, the leader's watchdog puts its own snapshot back, under its epoch.
    let mut latest = None;
    eventually("the leader republishes after the reset", async || {
        latest = current.latest().await.ok().flatten();
        latest
            .as_ref()
            .is_some_and(|l| l.hash == "hash-current-mesh" && l.epoch == held.epoch)
    })
    .await;
    // The deposed writer is fenced from now on (the epoch counter was put back).
    assert!(
        matches!(
            deposed.publish(encode("deposed-mesh-3")).await,
            Ok(PublishOutcome::Fenced { .. })
        ),
        "first attempt after the reset: {outcome:?}"
    );
    // A new follower starts now: it gets the leader's snapshot.
    let (late, _late_task) = follow(cfg.clone(), decode).unwrap();
    assert_eq!(
        late.wait_for(WAIT, |_| true).await.unwrap().value,
        "current-mesh"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    for ((f, _), seen) in followers.iter().zip(&seen) {
        assert_eq!(f.current().unwrap().value, "current-mesh");
        let seen = seen.lock().unwrap().clone();
        assert!(
            seen.iter().all(|v| v == "current-mesh"),
            "a follower served {seen:?} after the reset"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_below_the_counter_is_refused_and_the_same_floor_granted_again() {
    let redis = RedisServer::start().unwrap();
    let publisher = RedisPublisher::new(config(&redis.url())).unwrap();
    assert_eq!(
        publisher.take_epoch(50).await.unwrap(),
        EpochGrant::Taken(50)
    );
    // A retry whose first reply was lost gets the same epoch.
    assert_eq!(
        publisher.take_epoch(50).await.unwrap(),
        EpochGrant::Taken(50)
    );
    let stale = RedisPublisher::new(config(&redis.url())).unwrap();
    assert_eq!(
        stale.take_epoch(49).await.unwrap(),
        EpochGrant::Superseded { newer: 50 }
    );
    assert!(matches!(
        stale.publish(encode("stale")).await,
        Err(pilotfish_shared::bus::BusError::NoEpoch)
    ));
    // Epochs as large as the Lease gives (creation time x 2^21) stay exact.
    let big = 3_700_000_000_000_123u64;
    assert_eq!(
        publisher.take_epoch(big).await.unwrap(),
        EpochGrant::Taken(big)
    );
    assert_eq!(publish(&publisher, "big").await.epoch, big);
    let mut conn = raw(&redis.url()).await;
    let counter: String = conn.get("pilotfish:epoch").await.unwrap();
    assert_eq!(counter, big.to_string());
    assert_eq!(
        stale.take_epoch(big - 1).await.unwrap(),
        EpochGrant::Superseded { newer: big }
    );
}

/// Issue 12, defect 5: a replica that starts while `latest` names a corrupt blob serves the
/// newest good retained blob; a blob under another content hash than `latest` names is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_starting_on_a_corrupt_latest_serves_the_newest_good_retained_blob() {
    let redis = RedisServer::start().unwrap();
    let cfg = config(&redis.url());
    let publisher = leader(cfg.clone()).await;
    publish(&publisher, "one").await;
    let good = publish(&publisher, "two").await;
    let bad = publish(&publisher, "three").await;
    let mut conn = raw(&redis.url()).await;
    let _: () = conn
        .set(format!("pilotfish:snapshot:{}", bad.version), "garbage")
        .await
        .unwrap();
    let before = metrics::rejected_total("corrupt");
    let (follower, _task) = follow(cfg.clone(), decode).unwrap();
    let served = reaches(&follower, &good).await;
    assert_eq!(served.value, "two");
    assert!(follower.status().is_ready());
    assert!(metrics::rejected_total("corrupt") > before);
    // The next publish is followed as usual.
    let next = publish(&publisher, "four").await;
    reaches(&follower, &next).await;

    // A good blob, but not the one `latest` names: refused.
    let swapped = SnapshotRef {
        version: next.version + 1,
        hash: "hash-something-else".into(),
        ..next.clone()
    };
    let _: () = conn
        .set(
            format!("pilotfish:snapshot:{}", swapped.version),
            encode("swapped").bytes.to_vec(),
        )
        .await
        .unwrap();
    let _: () = conn
        .hset_multiple(
            "pilotfish:latest",
            &[
                ("version", swapped.version.to_string()),
                ("hash", swapped.hash.clone()),
                ("epoch", swapped.epoch.to_string()),
                ("published_at_ms", "0".to_owned()),
            ],
        )
        .await
        .unwrap();
    let _: () = conn
        .publish("pilotfish:notify", swapped.version)
        .await
        .unwrap();
    eventually("the swapped blob is refused", async || {
        follower
            .status()
            .last_error
            .is_some_and(|e| e.contains("hash_mismatch"))
    })
    .await;
    assert_eq!(follower.current().unwrap().value, "four");
}

/// `INFO commandstats` calls of `command` so far.
async fn command_calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Issue 12, defect 5: an unreadable `latest` neither wedges the publisher (it overwrites
/// it) nor makes followers spin (they keep their session and wait); a replica starting
/// meanwhile serves the newest good retained blob.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_latest_is_overwritten_and_waited_out_without_spinning() {
    let redis = RedisServer::start().unwrap();
    let cfg = config(&redis.url());
    let publisher = leader(cfg.clone()).await;
    let first = publish(&publisher, "first").await;
    let (follower, _task) = follow(cfg.clone(), decode).unwrap();
    reaches(&follower, &first).await;
    let mut conn = raw(&redis.url()).await;
    let _: () = conn
        .hset("pilotfish:latest", "version", "not-a-number")
        .await
        .unwrap();
    let _: () = conn.publish("pilotfish:notify", 0).await.unwrap();
    eventually("the follower reports it", async || {
        follower
            .status()
            .last_error
            .is_some_and(|e| e.contains("malformed"))
    })
    .await;
    // Three seconds with re-reads every 300 ms: about ten reads, no reconnect.
    let (reads, subscribes) = (
        command_calls(&mut conn, "hgetall").await,
        command_calls(&mut conn, "subscribe").await,
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reads = command_calls(&mut conn, "hgetall").await - reads;
    let subscribes = command_calls(&mut conn, "subscribe").await - subscribes;
    assert!(reads <= 20, "{reads} reads of latest in 3 s");
    assert_eq!(subscribes, 0, "the follower reconnected");
    assert_eq!(follower.current().unwrap().value, "first");
    assert!(follower.status().is_ready() && follower.status().connected);
    // A replica starting now falls back to the retained blob.
    let (fresh, _fresh_task) = follow(cfg.clone(), decode).unwrap();
    assert_eq!(reaches(&fresh, &first).await.value, "first");

    // The publisher overwrites what it cannot read.
    let next = publish(&publisher, "second").await;
    assert!(next.version > first.version);
    assert_eq!(publisher.latest().await.unwrap(), Some(next.clone()));
    reaches(&follower, &next).await;
    reaches(&fresh, &next).await;
}

/// Issue 12, defect 9: under endpoint churn (many publishes, each superseding the last)
/// the blobs in Redis stay within K + M + 1, so a Redis sized for that never refuses a
/// write. 60 publishes of 1 MiB into a 48 MB Redis: superseded blobs kept for their TTL
/// would need 75 MB (the allocator rounds a 1 MiB string up to 1.25 MiB); 11 blobs and the
/// transfer buffers peak near 30 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_churn_cannot_fill_redis() {
    let redis = RedisServer::start_with(RedisOptions {
        args: ["--maxmemory", "48mb", "--maxmemory-policy", "noeviction"]
            .map(String::from)
            .to_vec(),
        ..RedisOptions::default()
    })
    .unwrap();
    let cfg = config(&redis.url());
    let publisher = leader(cfg.clone()).await;
    let (follower, _task) = follow(cfg.clone(), decode).unwrap();
    let mut conn = raw(&redis.url()).await;
    let blob_keys = (cfg.retention + cfg.superseded_max + 1) as u64;
    let mut last = None;
    let mut peak_keys = 0u64;
    // 1 MiB of text; each publish stores its own copy (Redis shares nothing between values).
    const LETTERS: &[u8] = b"abcdefghijklmnopqrstuvwxyz012345";
    let base: String = (0..1 << 20)
        .map(|_| LETTERS[usize::from(rand::random::<u8>() & 31)] as char)
        .collect();
    for i in 0..60u32 {
        let payload = format!("{i}-{base}");
        let reference = match publisher.publish(encode(&payload)).await {
            Ok(PublishOutcome::Published(r)) => r,
            other => panic!("publish {i} into a 48 MB Redis: {other:?}"),
        };
        let keys: Vec<String> = conn.keys("pilotfish:snapshot:*").await.unwrap();
        peak_keys = peak_keys.max(keys.len() as u64);
        last = Some(reference);
    }
    assert!(peak_keys <= blob_keys, "{peak_keys} blobs at once");
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .unwrap();
    let peak: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory_peak:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    assert!(peak <= 48 << 20, "used_memory_peak {peak}");
    let last = last.unwrap();
    assert!(
        reaches(&follower, &last).await.value.starts_with("59-"),
        "the follower keeps up"
    );
}
