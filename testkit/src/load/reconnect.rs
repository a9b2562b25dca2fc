//! The mass-reconnect run (`pilotfish-xds-load reconnect`, `make bench-reconnect`): three
//! `pilotfish-xds --config-dir` replicas on one mesh folder, Envoy-like streams spread
//! over them, then one replica killed (SIGKILL, by PID). Its streams reconnect to the
//! survivors — a Service sends a new connection to a ready endpoint, so to a survivor —
//! each from its own source address (a pod of its own, as per-peer admission sees it)
//! and with Envoy's backoff: full jitter over 0.5 s × 2^attempt, capped at 30 s, reset
//! once a response arrives. While they reconnect, a VirtualService edit is written.
//!
//! Measured: how long until every stream is served again (fully configured on its new
//! stream), how long the established streams on the survivors took to receive the edit
//! (they must keep receiving pushes through the storm), what admission refused, and the
//! survivors' peak RSS and queued bytes (`pilotfish_xds_queued_bytes`). A load run, not a
//! test: it prints figures for docs/PERFORMANCE.md.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use pilotfish_mesh::synthetic::MeshShape;

use super::client::{self, Check, Fleet, Mode, Step};
use super::mesh::{self, Sidecar};
use super::procfs;
use crate::process::{free_port, http_get};

/// Envoy's xDS stream backoff (`JitteredExponentialBackOffStrategy`).
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_CAP: Duration = Duration::from_secs(30);
/// The target: every stream served again within this after the kill.
const TARGET: Duration = Duration::from_secs(30);

/// What the run needs.
#[derive(Clone, Debug)]
pub struct ReconnectConfig {
    pub server_bin: PathBuf,
    pub shape: MeshShape,
    pub streams: usize,
    pub replicas: usize,
    pub mode: Mode,
    pub work_dir: PathBuf,
    /// Extra flags for every replica (e.g. `--max-new-streams-per-second 200`).
    pub server_args: Vec<String>,
}

struct Replica {
    child: tokio::process::Child,
    pid: u32,
    url: String,
    admin: SocketAddr,
}

/// One stream's life. Its first stream reports to `Run::initial`, every later one to
/// `Run::reconnected`.
struct Lane {
    /// The replica its current stream is on.
    replica: AtomicUsize,
    /// Streams of it that were served and then ended.
    reconnects: AtomicUsize,
    /// Streams opened (served or refused).
    attempts: AtomicUsize,
}

/// The run's shared state.
struct Run {
    initial: Arc<Fleet>,
    reconnected: Arc<Fleet>,
    lanes: Vec<Lane>,
    urls: Vec<String>,
    /// Indexes of the replicas a new stream may go to.
    alive: std::sync::Mutex<Vec<usize>>,
    mode: Mode,
    stop: AtomicBool,
}

/// Runs the mass reconnect and prints the figures.
pub async fn run(config: ReconnectConfig) -> Result<()> {
    std::fs::create_dir_all(&config.work_dir)?;
    let dir = config.work_dir.join("mesh");
    let _ = std::fs::remove_dir_all(&dir);
    let mesh = mesh::write(&dir, config.shape)?;
    println!(
        "mass reconnect: {} replicas of pilotfish-xds --config-dir, {} {} streams, {} services in {} namespaces",
        config.replicas,
        config.streams,
        config.mode.name(),
        config.shape.services,
        config.shape.namespaces
    );
    let mut replicas = Vec::new();
    for r in 0..config.replicas {
        replicas.push(start_replica(&config, &mesh.dir, r).await?);
    }
    for replica in &mut replicas {
        wait_ready(replica).await?;
    }
    let n = config.streams;
    let run = Arc::new(Run {
        initial: Fleet::new(n),
        reconnected: Fleet::new(n),
        lanes: (0..n)
            .map(|i| Lane {
                replica: AtomicUsize::new(i % config.replicas),
                reconnects: AtomicUsize::new(0),
                attempts: AtomicUsize::new(0),
            })
            .collect(),
        urls: replicas.iter().map(|r| r.url.clone()).collect(),
        alive: std::sync::Mutex::new((0..config.replicas).collect()),
        mode: config.mode,
        stop: AtomicBool::new(false),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let sidecar = sidecar_of(&mesh.sidecars, i);
        tasks.spawn(lane(run.clone(), i, client::node(&sidecar)));
    }
    let connect_started = Instant::now();
    wait_for("every stream configured", Duration::from_secs(300), || {
        run.initial.configured() == n
    })
    .await
    .with_context(|| format!("{} of {n} configured", run.initial.configured()))?;
    println!(
        "  initial: {n} streams configured in {:.1} s",
        connect_started.elapsed().as_secs_f64()
    );
    quiet(&run.initial).await;

    // Kill replica 0 by its PID; new streams go to the others from now on.
    let victim = 0;
    let survivors: Vec<usize> = (1..config.replicas).collect();
    let on_victim: Vec<usize> = (0..n)
        .filter(|i| run.lanes[*i].replica.load(Ordering::Relaxed) == victim)
        .collect();
    let established: Vec<usize> = (0..n).filter(|i| !on_victim.contains(i)).collect();
    let refused_before: Vec<f64> = survivors
        .iter()
        .map(|s| metric(replicas[*s].admin, "pilotfish_xds_streams_refused_total"))
        .collect();
    let rss_before: Vec<u64> = survivors
        .iter()
        .map(|s| procfs::rss_bytes(replicas[*s].pid).unwrap_or(0))
        .collect();
    *run.alive.lock().unwrap_or_else(|e| e.into_inner()) = survivors.clone();
    let step_initial = Step::new(Check::Contains("reconnect-storm-edit".into()), n);
    let step_reconnected = Step::new(Check::Contains("reconnect-storm-edit".into()), n);
    let attempts_before: usize = on_victim
        .iter()
        .map(|i| run.lanes[*i].attempts.load(Ordering::Relaxed))
        .sum();
    let killed_at = Instant::now();
    kill(&mut replicas[victim]).await?;
    println!(
        "  killed replica {victim} (pid {}): {} streams lost",
        replicas[victim].pid,
        on_victim.len()
    );

    // Sample the survivors while the storm lasts; write the edit one second in.
    let mut rss_peak = rss_before.clone();
    let mut queued_peak = vec![0f64; survivors.len()];
    let mut edited_at = None;
    let all_back = |run: &Run| run.reconnected.configured() == on_victim.len();
    let edit_reached = |step: &Step, lanes: &[usize]| {
        let times = step.times();
        lanes.iter().filter(|i| times[**i].is_some()).count()
    };
    let deadline = killed_at + Duration::from_secs(180);
    let mut served_again = None;
    loop {
        for (k, s) in survivors.iter().enumerate() {
            rss_peak[k] = rss_peak[k].max(procfs::rss_bytes(replicas[*s].pid).unwrap_or(0));
            queued_peak[k] =
                queued_peak[k].max(metric(replicas[*s].admin, "pilotfish_xds_queued_bytes"));
        }
        if edited_at.is_none() && killed_at.elapsed() >= Duration::from_secs(1) {
            run.initial.begin(step_initial.clone());
            run.reconnected.begin(step_reconnected.clone());
            mesh.edit_virtual_service(0, "reconnect-storm-edit")?;
            edited_at = Some(Instant::now());
        }
        if served_again.is_none() && all_back(&run) {
            served_again = Some(killed_at.elapsed());
        }
        let edit_done = edit_reached(&step_initial, &established) == established.len();
        if served_again.is_some() && edit_done {
            break;
        }
        if Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let edited_at = edited_at.context("the edit was written")?;
    let refused_after: Vec<f64> = survivors
        .iter()
        .map(|s| metric(replicas[*s].admin, "pilotfish_xds_streams_refused_total"))
        .collect();

    // Report.
    let secs = |d: Duration| d.as_secs_f64();
    match served_again {
        Some(d) => println!(
            "  served again: all {} reconnecting streams configured {:.1} s after the kill (target {} s: {})",
            on_victim.len(),
            secs(d),
            TARGET.as_secs(),
            if d <= TARGET { "met" } else { "MISSED" }
        ),
        None => println!(
            "  served again: only {} of {} within {} s (target {} s: MISSED)",
            run.reconnected.configured(),
            on_victim.len(),
            secs(deadline - killed_at),
            TARGET.as_secs()
        ),
    }
    let reconnect_times: Vec<f64> = run
        .reconnected
        .configured_times()
        .into_iter()
        .flatten()
        .map(|t| secs(t.saturating_sub(killed_at - run.reconnected.started())))
        .collect();
    let mut sorted = reconnect_times.clone();
    sorted.sort_by(f64::total_cmp);
    if !sorted.is_empty() {
        println!(
            "    per stream after the kill: p50 {:.1} s, p90 {:.1} s, max {:.1} s",
            percentile(&sorted, 0.5),
            percentile(&sorted, 0.9),
            sorted[sorted.len() - 1]
        );
    }
    let attempts: usize = on_victim
        .iter()
        .map(|i| run.lanes[*i].attempts.load(Ordering::Relaxed))
        .sum::<usize>()
        - attempts_before;
    let refused: f64 = refused_after
        .iter()
        .zip(&refused_before)
        .map(|(a, b)| a - b)
        .sum();
    println!(
        "    {attempts} streams opened after the kill for {} lost; the survivors refused {refused:.0} (RESOURCE_EXHAUSTED after waiting up to 1 s)",
        on_victim.len()
    );
    let edit_base = edited_at - step_initial.started();
    let established_times: Vec<f64> = {
        let times = step_initial.times();
        let mut v: Vec<f64> = established
            .iter()
            .filter_map(|i| times[*i])
            .map(|t| secs(t.saturating_sub(edit_base)))
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    println!(
        "  the edit (written {:.1} s after the kill): {} of {} established streams on the survivors received it; p50 {:.1} s, max {:.1} s after it was written",
        secs(edited_at - killed_at),
        established_times.len(),
        established.len(),
        percentile(&established_times, 0.5),
        established_times.last().copied().unwrap_or(f64::NAN),
    );
    println!(
        "    reconnected streams that received it (on their new stream, in their first configuration or as a push): {} of {}",
        edit_reached(&step_reconnected, &on_victim),
        on_victim.len()
    );
    for (k, s) in survivors.iter().enumerate() {
        println!(
            "  survivor {s}: RSS {:.0} MiB before the kill, peak {:.0} MiB; peak queued bytes {:.0} KiB",
            rss_before[k] as f64 / (1024.0 * 1024.0),
            rss_peak[k] as f64 / (1024.0 * 1024.0),
            queued_peak[k] / 1024.0
        );
    }
    let dropped = established
        .iter()
        .filter(|i| run.lanes[**i].reconnects.load(Ordering::Relaxed) > 0)
        .count();
    let dropped_again = on_victim
        .iter()
        .filter(|i| run.lanes[**i].reconnects.load(Ordering::Relaxed) > 1)
        .count();
    println!(
        "  established streams on the survivors that were dropped: {dropped}; reconnected streams dropped again: {dropped_again}"
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("  load average at the end: {}", load.trim());
    run.stop.store(true, Ordering::Relaxed);
    tasks.abort_all();
    for replica in &mut replicas {
        replica.child.kill().await.ok();
    }
    Ok(())
}

/// The sidecar of stream `i`: more streams than Pods make more sidecars of the same
/// workloads.
fn sidecar_of(sidecars: &[Sidecar], i: usize) -> Sidecar {
    let mut sidecar = sidecars[i % sidecars.len()].clone();
    if i >= sidecars.len() {
        sidecar.pod = format!("{}-r{}", sidecar.pod, i / sidecars.len());
    }
    sidecar
}

/// Stream `i`'s source address: one of its own in 127.0.0.0/8 (Linux answers on all of
/// it), as a pod has its own IP.
fn source_of(i: usize) -> IpAddr {
    let i = i as u32;
    IpAddr::V4(Ipv4Addr::new(
        127,
        1 + (i / 62_500) as u8,
        ((i / 250) % 250) as u8,
        (i % 250 + 1) as u8,
    ))
}

/// Keeps stream `i` open: on its replica first, then — whenever it ends — on a replica
/// that is alive, after Envoy's backoff.
async fn lane(run: Arc<Run>, i: usize, node: envoy_types::pb::envoy::config::core::v3::Node) {
    let lane = &run.lanes[i];
    let mut retry = 0u32;
    let mut first = true;
    while !run.stop.load(Ordering::Relaxed) {
        let replica = {
            let alive = run.alive.lock().unwrap_or_else(|e| e.into_inner());
            if first {
                lane.replica.load(Ordering::Relaxed)
            } else {
                // Through the Service: any ready replica.
                alive[rand::random_range(0..alive.len())]
            }
        };
        lane.replica.store(replica, Ordering::Relaxed);
        let fleet = if first {
            &run.initial
        } else {
            &run.reconnected
        };
        lane.attempts.fetch_add(1, Ordering::Relaxed);
        let mut answered = false;
        let _ = client::open(
            i,
            node.clone(),
            &run.urls[replica],
            Some(source_of(i)),
            run.mode,
            fleet,
            &mut answered,
        )
        .await;
        if answered {
            // Envoy resets its backoff once the stream received a response.
            retry = 0;
            if first {
                first = false;
            }
            lane.reconnects.fetch_add(1, Ordering::Relaxed);
        }
        let ceiling = BACKOFF_BASE
            .saturating_mul(1u32 << retry.min(16))
            .min(BACKOFF_CAP);
        retry += 1;
        let wait = ceiling.mul_f64(rand::random_range(0.0..1.0));
        tokio::time::sleep(wait).await;
    }
}

async fn start_replica(config: &ReconnectConfig, dir: &Path, r: usize) -> Result<Replica> {
    let (xds, admin) = (free_port(), free_port());
    let log = std::fs::File::create(config.work_dir.join(format!("replica-{r}.log")))?;
    let mut command = tokio::process::Command::new(&config.server_bin);
    command
        .arg("--config-dir")
        .arg(dir)
        .args([
            "--xds-addr",
            &format!("127.0.0.1:{xds}"),
            "--admin-addr",
            &format!("127.0.0.1:{admin}"),
            "--replica-name",
            &format!("replica-{r}"),
        ])
        .args(&config.server_args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    let child = command.spawn().context("start pilotfish-xds")?;
    let pid = child.id().context("replica pid")?;
    Ok(Replica {
        child,
        pid,
        url: format!("http://127.0.0.1:{xds}"),
        admin: format!("127.0.0.1:{admin}").parse()?,
    })
}

async fn wait_ready(replica: &mut Replica) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let admin = replica.admin;
    loop {
        if let Ok((200, _)) =
            tokio::task::spawn_blocking(move || http_get(admin, "/readyz")).await?
        {
            return Ok(());
        }
        if let Some(status) = replica.child.try_wait()? {
            bail!("pilotfish-xds exited before it was ready: {status}");
        }
        if Instant::now() > deadline {
            bail!("pilotfish-xds was not ready within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGKILL by PID, as a node failure or the OOM killer would.
async fn kill(replica: &mut Replica) -> Result<()> {
    let status = tokio::process::Command::new("kill")
        .args(["-KILL", &replica.pid.to_string()])
        .status()
        .await?;
    if !status.success() {
        bail!("kill -KILL {} failed", replica.pid);
    }
    replica.child.wait().await?;
    Ok(())
}

/// The sum of a metric's samples on a replica's `/metrics` (0 when unreadable).
fn metric(admin: SocketAddr, name: &str) -> f64 {
    let Ok((_, text)) = http_get(admin, "/metrics") else {
        return 0.0;
    };
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until no stream of `fleet` has received anything for 500 ms (at most 30 s).
async fn quiet(fleet: &Fleet) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while fleet.quiet_for() < Duration::from_millis(500) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for(what: &str, patience: Duration, done: impl Fn() -> bool) -> Result<()> {
    let deadline = Instant::now() + patience;
    while !done() {
        if Instant::now() > deadline {
            bail!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}
