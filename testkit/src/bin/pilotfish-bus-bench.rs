//! Publish-to-all-followers latency of the Redis snapshot bus.
//!
//! Starts its own `redis-server` (testkit harness), one publisher and F followers in this
//! process, then publishes N blobs of the given size one after another; for each, measures
//! the time from calling `publish` until every follower serves that version. Prints
//! p50/p99 as a Markdown table row (see docs/PERFORMANCE.md).
//!
//! The followers' decode checks a magic prefix only, so the numbers are the bus's own
//! cost (Redis round trips, transfer, copies), without the codec's decode.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use pilotfish_shared::bus::redis::{RedisConfig, RedisPublisher, follow};
use pilotfish_shared::bus::{
    EncodedSnapshot, PublishOutcome, Rejection, SnapshotPublisher, Verified,
};
use pilotfish_testkit::redis::RedisServer;

#[derive(Parser, Debug)]
#[command(about = "Measure publish-to-all-followers latency of the Redis snapshot bus")]
struct Args {
    /// Blob size in bytes (e.g. 1048576 for 1 MiB).
    #[arg(long, default_value_t = 1 << 20)]
    size_bytes: usize,
    /// Followers (each with its own Redis connections, as separate replicas would have).
    #[arg(long, default_value_t = 1)]
    followers: usize,
    /// Measured publishes.
    #[arg(long, default_value_t = 50)]
    count: usize,
    /// Unmeasured publishes first (connections, allocator, script cache).
    #[arg(long, default_value_t = 3)]
    warmup: usize,
}

const MAGIC: &[u8] = b"PFBENCH\n";

/// A blob is the magic, the round number (u64 LE: the content hash is `bench-{round}`),
/// then filler.
fn decode(bytes: &[u8]) -> Result<Verified<usize>, Rejection> {
    let round = bytes
        .strip_prefix(MAGIC)
        .and_then(|rest| rest.get(..8))
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| Rejection {
            reason: "corrupt",
            detail: "bad magic".into(),
        })?;
    Ok(Verified {
        value: bytes.len(),
        hash: format!("bench-{round}"),
    })
}

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.size_bytes < MAGIC.len() + 8 || args.followers == 0 || args.count == 0 {
        bail!("need --size-bytes >= 16, --followers >= 1 and --count >= 1");
    }
    let redis = RedisServer::start().context("starting redis-server")?;
    let config = RedisConfig::new(&redis.url())?
        .with_timeouts(Duration::from_secs(5), Duration::from_secs(60))
        .with_max_blob_bytes(args.size_bytes as u64);
    let publisher = RedisPublisher::new(config.clone())?;
    publisher.take_epoch(1).await?;
    let mut followers = Vec::new();
    for _ in 0..args.followers {
        followers.push(follow(config.clone(), decode)?);
    }

    let mut template = vec![0x5Au8; args.size_bytes];
    template[..MAGIC.len()].copy_from_slice(MAGIC);
    let mut publish_times = Vec::with_capacity(args.count);
    let mut all_times = Vec::with_capacity(args.count);
    for i in 0..(args.warmup + args.count) {
        // Distinct content per round (the bus skips unchanged hashes).
        template[MAGIC.len()..MAGIC.len() + 8].copy_from_slice(&(i as u64).to_le_bytes());
        let snapshot = EncodedSnapshot {
            bytes: Bytes::from(template.clone()),
            hash: format!("bench-{i}"),
        };
        let started = Instant::now();
        let reference = match publisher.publish(snapshot).await? {
            PublishOutcome::Published(r) => r,
            other => bail!("unexpected publish outcome {other:?}"),
        };
        let published = started.elapsed();
        for (follower, _) in &followers {
            follower
                .wait_for(Duration::from_secs(120), |f| {
                    f.reference.version >= reference.version
                })
                .await
                .with_context(|| {
                    format!(
                        "a follower did not reach {reference}: {:?}",
                        follower.status()
                    )
                })?;
        }
        let all = started.elapsed();
        if i >= args.warmup {
            publish_times.push(published);
            all_times.push(all);
        }
    }
    publish_times.sort_unstable();
    all_times.sort_unstable();
    println!(
        "| blob | followers | publishes | publish p50 / p99 (ms) | all followers p50 / p99 (ms) | max (ms) |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    println!(
        "| {:.1} MiB | {} | {} | {} / {} | {} / {} | {} |",
        args.size_bytes as f64 / (1 << 20) as f64,
        args.followers,
        args.count,
        ms(percentile(&publish_times, 50.0)),
        ms(percentile(&publish_times, 99.0)),
        ms(percentile(&all_times, 50.0)),
        ms(percentile(&all_times, 99.0)),
        ms(all_times.last().copied().unwrap_or_default()),
    );
    Ok(())
}
