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
    // followers hold, on a Redis with a new run_id. A reset, not stale data.
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
