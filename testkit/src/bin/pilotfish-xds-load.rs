//! `pilotfish-xds-load`: measures the ADS engine under many streams.
//!
//! `run` starts this same binary as a child in `serve` mode (an in-process ADS server fed
//! with synthetic map snapshots, so its memory is measured apart from the clients'), opens
//! N SotW streams (wildcard CDS + EDS for every cluster, each on its own connection like
//! real proxies), waits until all are idle, reads the child's RSS, then asks the child to
//! publish new snapshots (alternately endpoints-only and full) and measures the time from
//! publishing until the last stream has received its new endpoints.
//!
//! ```text
//! pilotfish-xds-load run --streams 1000 --clusters 100 --rounds 6
//! ```

use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use pilotfish_xds::ads::ConnectionRegistry;
use pilotfish_xds::ads::{self, AdsConfig, CLUSTER_TYPE, ENDPOINT_TYPE, MapSnapshot};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

#[derive(Parser)]
#[command(about = "ADS load client: memory per idle stream and push time to N streams")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Open N streams against a child `serve` process and measure.
    Run(RunArgs),
    /// Serve ADS with synthetic snapshots; stdin lines `eds` / `full` publish the next one.
    Serve(ServeArgs),
}

#[derive(Args, Clone)]
struct RunArgs {
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    #[arg(long, default_value_t = 100)]
    clusters: usize,
    /// Snapshot changes to time, alternately endpoints-only and full.
    #[arg(long, default_value_t = 6)]
    rounds: usize,
    #[arg(long, default_value_t = 64)]
    push_concurrency: usize,
    /// Seconds to wait after the last stream is idle before reading memory.
    #[arg(long, default_value_t = 2)]
    settle_secs: u64,
}

#[derive(Args, Clone)]
struct ServeArgs {
    #[arg(long, default_value_t = 100)]
    clusters: usize,
    #[arg(long, default_value_t = 64)]
    push_concurrency: usize,
}

/// Cluster (and EDS) name of synthetic cluster `i`.
fn cluster_name(i: usize) -> String {
    format!("outbound|8080||svc-{i}.load.svc.cluster.local")
}

/// A synthetic snapshot: `clusters` clusters of ~512 bytes and load assignments of ~256
/// bytes. `full_generation` changes cluster 0, `eds_generation` the endpoints of cluster 0
/// (one pod coming or going, the common case).
fn synthetic(
    version: u64,
    clusters: usize,
    full_generation: u64,
    eds_generation: u64,
) -> MapSnapshot {
    let mut snapshot = MapSnapshot::new(version);
    for i in 0..clusters {
        let name = cluster_name(i);
        let mut cluster = format!(
            "cluster {name} gen {}",
            if i == 0 { full_generation } else { 0 }
        )
        .into_bytes();
        cluster.resize(512, b'c');
        let mut endpoints = format!(
            "endpoints {name} gen {}",
            if i == 0 { eds_generation } else { 0 }
        )
        .into_bytes();
        endpoints.resize(256, b'e');
        snapshot.insert(CLUSTER_TYPE, &name, &cluster);
        snapshot.insert(ENDPOINT_TYPE, &name, &endpoints);
    }
    snapshot
}

async fn serve(args: ServeArgs) -> Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (mut full, mut eds, mut version) = (0u64, 0u64, 1u64);
    let (tx, rx) = watch::channel(Some(synthetic(version, args.clusters, full, eds).stamped()));
    let config = AdsConfig {
        replica_name: "load".into(),
        ..AdsConfig::default()
    };
    let drain = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(ads::serve(
        listener,
        rx,
        ConnectionRegistry::new(),
        config,
        drain.clone(),
    ));
    println!("LISTENING {addr}");
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        version += 1;
        let next = match line.trim() {
            "eds" => {
                eds += 1;
                synthetic(version, args.clusters, full, eds).endpoints_only_since(version - 1)
            }
            "full" => {
                full += 1;
                synthetic(version, args.clusters, full, eds)
            }
            other => bail!("unknown command {other:?} (expected eds or full)"),
        };
        tx.send_replace(Some(next.stamped()));
        println!("PUBLISHED {version}");
    }
    drain.cancel();
    server.await??;
    Ok(())
}

/// Resident memory of a process in bytes, from `/proc/<pid>/status`.
fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| anyhow!("no VmRSS in /proc/{pid}/status"))?;
    let kib: u64 = line.split_whitespace().nth(1).unwrap_or("0").parse()?;
    Ok(kib * 1024)
}

/// What a client stream reports to the measuring loop.
enum Report {
    Ready,
    Endpoints { stream: usize, at: Instant },
}

/// One simulated proxy: CDS wildcard, then EDS for every cluster, ACKing everything.
async fn proxy(
    index: usize,
    url: String,
    eds_names: Arc<Vec<String>>,
    reports: mpsc::UnboundedSender<Report>,
) -> Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(url)?
        .connect()
        .await?;
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (tx, rx) = mpsc::channel(8);
    tx.send(DiscoveryRequest {
        node: Some(Node {
            id: format!(
                "sidecar~10.{}.{}.{}~load-{index}.load~load.svc.cluster.local",
                index / 65536 % 256,
                index / 256 % 256,
                index % 256
            ),
            ..Default::default()
        }),
        type_url: CLUSTER_TYPE.into(),
        ..Default::default()
    })
    .await?;
    let mut inbound = client
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let ack = |r: &DiscoveryResponse| DiscoveryRequest {
        version_info: r.version_info.clone(),
        type_url: r.type_url.clone(),
        response_nonce: r.nonce.clone(),
        resource_names: if r.type_url == ENDPOINT_TYPE {
            eds_names.to_vec()
        } else {
            Vec::new()
        },
        ..Default::default()
    };
    let cds = inbound
        .message()
        .await?
        .context("stream ended before CDS")?;
    tx.send(ack(&cds)).await?;
    tx.send(DiscoveryRequest {
        type_url: ENDPOINT_TYPE.into(),
        resource_names: eds_names.to_vec(),
        ..Default::default()
    })
    .await?;
    let eds = inbound
        .message()
        .await?
        .context("stream ended before EDS")?;
    tx.send(ack(&eds)).await?;
    reports.send(Report::Ready)?;
    while let Some(response) = inbound.message().await? {
        let at = Instant::now();
        tx.send(ack(&response)).await?;
        if response.type_url == ENDPOINT_TYPE {
            reports.send(Report::Endpoints { stream: index, at })?;
        }
    }
    Ok(())
}

fn mib(bytes: f64) -> String {
    format!("{:.1} MiB", bytes / (1024.0 * 1024.0))
}

async fn run(args: RunArgs) -> Result<()> {
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .args([
            "serve",
            "--clusters",
            &args.clusters.to_string(),
            "--push-concurrency",
            &args.push_concurrency.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("start the serve child")?;
    let pid = child.id().context("child pid")?;
    let mut child_in = child.stdin.take().context("child stdin")?;
    let mut child_out = BufReader::new(child.stdout.take().context("child stdout")?).lines();
    let addr = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = child_out.next_line().await? {
            if let Some(addr) = line.strip_prefix("LISTENING ") {
                return Ok(addr.to_string());
            }
        }
        Err(anyhow!("child exited before listening"))
    })
    .await
    .context("child did not start listening in 30 s")??;
    // Drain the child's further output so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = child_out.next_line().await {} });

    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = rss_bytes(pid)?;
    let eds_names: Arc<Vec<String>> = Arc::new((0..args.clusters).map(cluster_name).collect());
    let (reports_tx, mut reports) = mpsc::unbounded_channel();
    let connect_started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..args.streams {
        let (url, names, reports) = (
            format!("http://{addr}"),
            eds_names.clone(),
            reports_tx.clone(),
        );
        tasks.spawn(async move {
            if let Err(e) = proxy(index, url, names, reports).await {
                eprintln!("stream {index}: {e:#}");
            }
        });
    }
    drop(reports_tx);
    let mut ready = 0;
    while ready < args.streams {
        match tokio::time::timeout(Duration::from_secs(120), reports.recv()).await {
            Ok(Some(Report::Ready)) => ready += 1,
            Ok(Some(Report::Endpoints { .. })) => {}
            Ok(None) | Err(_) => bail!("only {ready} of {} streams became ready", args.streams),
        }
    }
    let connect_time = connect_started.elapsed();
    tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
    let rss_idle = rss_bytes(pid)?;
    let per_stream = (rss_idle.saturating_sub(rss_before)) as f64 / args.streams as f64;

    let mut rows = Vec::new();
    for round in 0..args.rounds {
        let kind = if round % 2 == 0 { "eds" } else { "full" };
        let started = Instant::now();
        child_in.write_all(format!("{kind}\n").as_bytes()).await?;
        child_in.flush().await?;
        let mut seen: HashSet<usize> = HashSet::new();
        let (mut first, mut last) = (None, started);
        while seen.len() < args.streams {
            match tokio::time::timeout(Duration::from_secs(120), reports.recv()).await {
                Ok(Some(Report::Endpoints { stream, at })) if at >= started => {
                    if seen.insert(stream) {
                        first.get_or_insert(at);
                        last = last.max(at);
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => bail!(
                    "round {round}: only {} of {} streams got new endpoints",
                    seen.len(),
                    args.streams
                ),
            }
        }
        rows.push((
            kind,
            first.map_or(Duration::ZERO, |f| f - started),
            last - started,
        ));
        // Let ACKs land before the next change.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rss_after = rss_bytes(pid)?;
    // Close the clients before the server so its shutdown is not reported as stream errors.
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    drop(child_in);
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;

    println!(
        "streams: {}  clusters: {}  push concurrency: {}",
        args.streams, args.clusters, args.push_concurrency
    );
    println!(
        "all streams connected and idle after {:.2} s",
        connect_time.as_secs_f64()
    );
    println!(
        "server RSS: before streams {}, idle with streams {}, after pushes {}",
        mib(rss_before as f64),
        mib(rss_idle as f64),
        mib(rss_after as f64)
    );
    println!("memory per idle stream: {:.1} KiB", per_stream / 1024.0);
    println!("| round | change | first stream | last stream |");
    println!("| --- | --- | --- | --- |");
    for (i, (kind, first, last)) in rows.iter().enumerate() {
        println!(
            "| {} | {kind} | {:.1} ms | {:.1} ms |",
            i + 1,
            first.as_secs_f64() * 1e3,
            last.as_secs_f64() * 1e3
        );
    }
    let kinds: BTreeSet<&str> = rows.iter().map(|r| r.0).collect();
    for kind in kinds {
        let mut lasts: Vec<f64> = rows
            .iter()
            .filter(|r| r.0 == kind)
            .map(|r| r.2.as_secs_f64() * 1e3)
            .collect();
        lasts.sort_by(f64::total_cmp);
        println!(
            "{kind}: median time to last stream {:.1} ms over {} rounds",
            lasts[lasts.len() / 2],
            lasts.len()
        );
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Run(args) => run(args).await,
        Command::Serve(args) => serve(args).await,
    }
}
