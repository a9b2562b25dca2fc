//! The load benchmark (`make bench-load`): one mesh, the real `pilotfish-xds --config-dir`
//! and the null server, the same Envoy-like streams against each, the same measurements.
//!
//! For each mode (SotW, delta): write the mesh; start the server pinned to its own core;
//! open every stream at once and time each until fully configured; read the server's RSS
//! once all are idle; then make the edits one after another — each a VirtualService file
//! rewritten with a marker, waiting until every stream has ACKed a response carrying it —
//! then add a Service and remove it. Each change is timed to the last stream's ACK, its
//! bytes counted as every stream receives them until all are quiet, and the server's CPU
//! seconds read from `/proc/PID/stat`. Stream 0's view after each step is captured, and
//! the null server replays exactly that to the same streams, measured the same way.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use pilotfish_mesh::synthetic::MeshShape;
use prost::Message;
use tokio::io::AsyncWriteExt;

use super::client::{self, Check, Fleet, Mode, Step};
use super::mesh::{self, ADDED_SERVICE, BenchMesh, Sidecar};
use super::procfs;
use super::wire::Capture;
use crate::process::{free_port, http_get};

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub server_bin: PathBuf,
    /// This tool, for the null server child.
    pub self_bin: PathBuf,
    pub shape: MeshShape,
    pub streams: usize,
    pub edits: usize,
    pub modes: Vec<Mode>,
    /// The core the servers are pinned to (`taskset -c`).
    pub server_cpu: Option<u32>,
    pub work_dir: PathBuf,
    pub null_server: bool,
    /// The server's debounce quiet period.
    pub debounce: String,
    /// A Sidecar per namespace importing `./*` and `istio-system/*`.
    pub sidecar_per_namespace: bool,
}

/// One change, measured.
#[derive(Clone, Debug)]
pub struct Change {
    /// Until the last stream ACKed a response showing it.
    pub last_acked: Duration,
    pub bytes: u64,
    pub cpu_seconds: f64,
    /// The real server only (its `/debug/push_status`): from the file write until the
    /// snapshot reached its streams (debounce, read, build, publish, follow), and from
    /// there until the last stream was sent its last response.
    pub handoff: Option<Duration>,
    pub pushed_to_all: Option<Duration>,
}

/// Everything measured against one server.
#[derive(Clone, Debug)]
pub struct Report {
    pub rss_before: u64,
    pub rss_connected: u64,
    pub rss_peak: u64,
    pub rss_after: u64,
    pub initial: Vec<Duration>,
    pub initial_bytes: u64,
    pub initial_cpu_seconds: f64,
    pub edits: Vec<Change>,
    pub added: Change,
    pub removed: Change,
}

impl Report {
    pub fn per_stream_bytes(&self, streams: usize) -> f64 {
        self.rss_connected.saturating_sub(self.rss_before) as f64 / streams as f64
    }
}

/// How a run makes its changes.
enum Driver<'a> {
    /// Files in the real server's config folder.
    Files(&'a BenchMesh),
    /// Step numbers on the null server's stdin.
    Steps(tokio::process::ChildStdin),
}

impl Driver<'_> {
    async fn step(&mut self, n: usize, edits: usize, marker: &str) -> Result<()> {
        match self {
            Driver::Files(mesh) => {
                if n <= edits {
                    mesh.edit_virtual_service(n, marker)
                } else if n == edits + 1 {
                    mesh.add_service()
                } else {
                    mesh.remove_service()
                }
            }
            Driver::Steps(stdin) => {
                stdin.write_all(format!("{n}\n").as_bytes()).await?;
                Ok(stdin.flush().await?)
            }
        }
    }
}

/// Runs the benchmark and prints the report.
pub async fn run(config: BenchConfig) -> Result<()> {
    std::fs::create_dir_all(&config.work_dir)?;
    println!(
        "mesh: {} services in {} namespaces, {} pods each, a VirtualService and DestinationRule on every {}th; {} streams",
        config.shape.services,
        config.shape.namespaces,
        config.shape.endpoints_per_service,
        config.shape.routed_every,
        config.streams
    );
    for mode in config.modes.clone() {
        let dir = config.work_dir.join(format!("mesh-{}", mode.name()));
        let _ = std::fs::remove_dir_all(&dir);
        let mesh = mesh::write(&dir, config.shape)?;
        if config.sidecar_per_namespace {
            mesh::write_namespace_sidecars(&mesh)?;
        }
        let (real, capture) = run_real(&config, &mesh, mode).await?;
        let null = if config.null_server {
            Some(run_null(&config, &mesh, mode, capture).await?)
        } else {
            None
        };
        print_report(&config, mode, &real, null.as_ref());
    }
    Ok(())
}

async fn run_real(config: &BenchConfig, mesh: &BenchMesh, mode: Mode) -> Result<(Report, Capture)> {
    let (xds, admin) = (free_port(), free_port());
    let log = std::fs::File::create(config.work_dir.join(format!("server-{}.log", mode.name())))?;
    let mut command = pinned(config.server_cpu, &config.server_bin);
    command
        .args(["--config-dir"])
        .arg(&mesh.dir)
        .args([
            "--xds-addr",
            &format!("127.0.0.1:{xds}"),
            "--admin-addr",
            &format!("127.0.0.1:{admin}"),
            "--max-new-streams-per-second",
            "0",
            "--max-connection-age",
            "0s",
            "--replica-name",
            "bench",
            "--debounce-after",
            &config.debounce,
        ])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true);
    let mut child = command.spawn().context("start pilotfish-xds")?;
    let pid = child.id().context("server pid")?;
    let admin_addr: SocketAddr = format!("127.0.0.1:{admin}").parse()?;
    wait_ready(admin_addr, &mut child).await?;
    let url = format!("http://127.0.0.1:{xds}");
    let mut captured = Capture::default();
    let server = Measured {
        pid,
        admin: Some(admin_addr),
        url,
    };
    let report = measure(
        config,
        &server,
        &mesh.sidecars,
        mode,
        Driver::Files(mesh),
        Some(&mut captured),
    )
    .await?;
    let sent = metric(admin_addr, "pilotfish_xds_sent_bytes_total").unwrap_or(0.0);
    println!(
        "  ({}: the server counted {:.1} MB sent in all)",
        mode.name(),
        sent / 1e6
    );
    child.kill().await.ok();
    Ok((report, captured))
}

async fn run_null(
    config: &BenchConfig,
    mesh: &BenchMesh,
    mode: Mode,
    capture: Capture,
) -> Result<Report> {
    let file = config.work_dir.join(format!("capture-{}.bin", mode.name()));
    std::fs::write(&file, capture.encode_to_vec())?;
    let port = free_port();
    let mut command = pinned(config.server_cpu, &config.self_bin);
    command
        .args(["null-serve", "--capture"])
        .arg(&file)
        .args([
            "--mode",
            match mode {
                Mode::Sotw => "sotw",
                Mode::Delta => "delta",
            },
            "--addr",
            &format!("127.0.0.1:{port}"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    let mut child = command.spawn().context("start the null server")?;
    let pid = child.id().context("null server pid")?;
    let stdin = child.stdin.take().context("null server stdin")?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            bail!("the null server did not listen in 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let server = Measured {
        pid,
        admin: None,
        url: format!("http://{addr}"),
    };
    let report = measure(
        config,
        &server,
        &mesh.sidecars,
        mode,
        Driver::Steps(stdin),
        None,
    )
    .await?;
    child.kill().await.ok();
    Ok(report)
}

fn pinned(cpu: Option<u32>, program: &Path) -> tokio::process::Command {
    match cpu {
        Some(cpu) => {
            let mut c = tokio::process::Command::new("taskset");
            c.args(["-c", &cpu.to_string()]).arg(program);
            c
        }
        None => tokio::process::Command::new(program),
    }
}

async fn wait_ready(admin: SocketAddr, child: &mut tokio::process::Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok((200, _)) =
            tokio::task::spawn_blocking(move || http_get(admin, "/readyz")).await?
        {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("pilotfish-xds exited before it was ready: {status}");
        }
        if Instant::now() > deadline {
            bail!("pilotfish-xds was not ready within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn metric(admin: SocketAddr, name: &str) -> Result<f64> {
    let (_, text) = http_get(admin, "/metrics")?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The server under measurement: Pilotfish or the null server.
struct Measured {
    pid: u32,
    /// Pilotfish's admin address (its metrics and push status); the null server has none.
    admin: Option<SocketAddr>,
    /// Where the streams connect.
    url: String,
}

/// Opens the streams, makes the changes, measures.
async fn measure(
    config: &BenchConfig,
    server: &Measured,
    sidecars: &[Sidecar],
    mode: Mode,
    mut driver: Driver<'_>,
    mut capture: Option<&mut Capture>,
) -> Result<Report> {
    let n = config.streams;
    let pid = server.pid;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = procfs::rss_bytes(pid)?;
    let cpu_before = procfs::cpu_seconds(pid)?;
    let fleet = Fleet::new(n);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let mut sidecar = sidecars[i % sidecars.len()].clone();
        if i >= sidecars.len() {
            // More streams than Pods: more sidecars of the same workloads.
            sidecar.pod = format!("{}-r{}", sidecar.pod, i / sidecars.len());
        }
        tasks.spawn(client::run(
            i,
            client::node(&sidecar),
            server.url.clone(),
            mode,
            fleet.clone(),
        ));
    }
    wait_for("every stream configured", Duration::from_secs(600), || {
        if fleet.failed() > 0 {
            return Err(anyhow::anyhow!("{} streams failed", fleet.failed()));
        }
        Ok(fleet.configured() == n)
    })
    .await?;
    let initial: Vec<Duration> = fleet.configured_times().into_iter().flatten().collect();
    quiet(&fleet).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_connected = procfs::rss_bytes(pid)?;
    let initial_cpu_seconds = procfs::cpu_seconds(pid)? - cpu_before;
    let initial_bytes = fleet.bytes();
    if config.sidecar_per_namespace {
        // Under scoping an edit reaches only its namespace's streams, which the change
        // steps (every stream must see each change) do not model: only the initial figures.
        let last = initial.iter().max().copied().unwrap_or_default();
        println!(
            "scoped initial configuration: server RSS before streams {:.1} MiB, connected {:.1} MiB; {:.1} MB sent in all ({:.1} KB per stream); last stream configured after {:.1} s; server CPU {:.1} s",
            rss_before as f64 / 1048576.0,
            rss_connected as f64 / 1048576.0,
            initial_bytes as f64 / 1e6,
            initial_bytes as f64 / n as f64 / 1e3,
            last.as_secs_f64(),
            initial_cpu_seconds
        );
        anyhow::bail!("--sidecar-per-namespace measures the initial configuration only");
    }
    if let Some(c) = capture.as_deref_mut() {
        c.steps.push(fleet.capture());
    }
    // RSS sampled while the changes are made.
    let peak = Arc::new(AtomicU64::new(rss_connected));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(rss) = procfs::rss_bytes(pid) {
                    peak.fetch_max(rss, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let mut edits = Vec::new();
    for k in 1..=config.edits {
        let marker = format!("bench-edit-{k:04}");
        let change = change(
            &fleet,
            server,
            n,
            Check::Contains(marker.clone()),
            &mut driver,
            k,
            config.edits,
            &marker,
        )
        .await
        .with_context(|| format!("edit {k}"))?;
        if let Some(c) = capture.as_deref_mut() {
            c.steps.push(fleet.capture());
        }
        edits.push(change);
    }
    let name = format!("{ADDED_SERVICE}.");
    let added = change(
        &fleet,
        server,
        n,
        Check::Contains(name.clone()),
        &mut driver,
        config.edits + 1,
        config.edits,
        "",
    )
    .await
    .context("adding a service")?;
    if let Some(c) = capture.as_deref_mut() {
        c.steps.push(fleet.capture());
    }
    let removed = change(
        &fleet,
        server,
        n,
        Check::Gone(name),
        &mut driver,
        config.edits + 2,
        config.edits,
        "",
    )
    .await
    .context("removing a service")?;
    if let Some(c) = capture {
        c.steps.push(fleet.capture());
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = procfs::rss_bytes(pid)?;
    sampler.abort();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    Ok(Report {
        rss_before,
        rss_connected,
        rss_peak: peak.load(Ordering::Relaxed).max(rss_after),
        rss_after,
        initial,
        initial_bytes,
        initial_cpu_seconds,
        edits,
        added,
        removed,
    })
}

#[allow(clippy::too_many_arguments)] // one call site per kind of change; the names say it
async fn change(
    fleet: &Fleet,
    server: &Measured,
    n: usize,
    check: Check,
    driver: &mut Driver<'_>,
    step_number: usize,
    edits: usize,
    marker: &str,
) -> Result<Change> {
    let step = Step::new(check, n);
    let bytes_before = fleet.bytes();
    let pid = server.pid;
    let cpu_before = procfs::cpu_seconds(pid)?;
    fleet.begin(step.clone());
    driver.step(step_number, edits, marker).await?;
    let written = std::time::SystemTime::now();
    wait_for(
        "every stream has the change",
        Duration::from_secs(120),
        || Ok(step.reached() == n),
    )
    .await
    .with_context(|| format!("{} of {n} streams have it", step.reached()))?;
    let last_acked = step.times().into_iter().flatten().max().unwrap_or_default();
    quiet(fleet).await;
    fleet.end_step();
    let (handoff, pushed_to_all) = server
        .admin
        .and_then(|a| last_push(a, written))
        .unwrap_or_default();
    Ok(Change {
        last_acked,
        bytes: fleet.bytes() - bytes_before,
        cpu_seconds: procfs::cpu_seconds(pid)? - cpu_before,
        handoff,
        pushed_to_all,
    })
}

/// The newest push on the server's `/debug/push_status`: how long after `written` its
/// snapshot reached the streams, and how long after that the last stream was sent its
/// last response.
fn last_push(
    admin: SocketAddr,
    written: std::time::SystemTime,
) -> Option<(Option<Duration>, Option<Duration>)> {
    let (_, body) = http_get(admin, "/debug/push_status").ok()?;
    let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
    let last = doc["pushes"].as_array()?.last()?;
    let received = humantime::parse_rfc3339_weak(last["push"]["received_at"].as_str()?).ok()?;
    let pushed = last["pushed_to_all_ms"]
        .as_f64()
        .map(|ms| Duration::from_secs_f64(ms / 1e3));
    Some((received.duration_since(written).ok(), pushed))
}

/// Waits until no stream has received anything for 500 ms (at most 30 s).
async fn quiet(fleet: &Fleet) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while fleet.quiet_for() < Duration::from_millis(500) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for(
    what: &str,
    patience: Duration,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + patience;
    while !done()? {
        if Instant::now() > deadline {
            bail!("timed out waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(values: impl IntoIterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = values.into_iter().collect();
    v.sort_by(f64::total_cmp);
    v
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The figures of one report, in print order: (label, value, unit).
fn figures(config: &BenchConfig, r: &Report) -> Vec<(&'static str, f64, &'static str)> {
    let initial = sorted(r.initial.iter().map(|d| d.as_secs_f64() * 1e3));
    let edit_ms = sorted(r.edits.iter().map(|c| c.last_acked.as_secs_f64() * 1e3));
    let edit_mb = sorted(r.edits.iter().map(|c| c.bytes as f64 / 1e6));
    let edit_cpu = sorted(r.edits.iter().map(|c| c.cpu_seconds));
    vec![
        ("server RSS before streams", mib(r.rss_before), "MiB"),
        ("server RSS, streams connected", mib(r.rss_connected), "MiB"),
        ("server RSS, peak during changes", mib(r.rss_peak), "MiB"),
        ("server RSS after changes", mib(r.rss_after), "MiB"),
        (
            "RSS per stream",
            r.per_stream_bytes(config.streams) / 1024.0,
            "KiB",
        ),
        ("initial config p50", percentile(&initial, 50.0), "ms"),
        ("initial config p99", percentile(&initial, 99.0), "ms"),
        (
            "initial config, last stream",
            percentile(&initial, 100.0),
            "ms",
        ),
        ("initial config, bytes", r.initial_bytes as f64 / 1e6, "MB"),
        ("initial config, server CPU", r.initial_cpu_seconds, "s"),
        (
            "VS edit → last stream ACKed p50",
            percentile(&edit_ms, 50.0),
            "ms",
        ),
        (
            "VS edit → last stream ACKed p99",
            percentile(&edit_ms, 99.0),
            "ms",
        ),
        ("VS edit, bytes sent p50", percentile(&edit_mb, 50.0), "MB"),
        ("VS edit, bytes sent max", percentile(&edit_mb, 100.0), "MB"),
        ("VS edit, server CPU p50", percentile(&edit_cpu, 50.0), "s"),
        (
            "Service added → last stream ACKed",
            r.added.last_acked.as_secs_f64() * 1e3,
            "ms",
        ),
        (
            "Service added, bytes sent",
            r.added.bytes as f64 / 1e6,
            "MB",
        ),
        ("Service added, server CPU", r.added.cpu_seconds, "s"),
        (
            "Service removed → last stream ACKed",
            r.removed.last_acked.as_secs_f64() * 1e3,
            "ms",
        ),
        (
            "Service removed, bytes sent",
            r.removed.bytes as f64 / 1e6,
            "MB",
        ),
        ("Service removed, server CPU", r.removed.cpu_seconds, "s"),
    ]
}

fn print_report(config: &BenchConfig, mode: Mode, real: &Report, null: Option<&Report>) {
    println!();
    println!(
        "### {} — {} streams, {} VirtualService edits",
        mode.name(),
        config.streams,
        real.edits.len()
    );
    println!();
    println!("| figure | pilotfish-xds | null server | ratio |");
    println!("| --- | --- | --- | --- |");
    let ours = figures(config, real);
    let floor = null.map(|n| figures(config, n));
    for (i, (label, value, unit)) in ours.iter().enumerate() {
        let (floor_text, ratio) = match &floor {
            Some(f) => {
                let base = f[i].1;
                let ratio = if base > 0.0 {
                    format!("{:.2}", value / base)
                } else {
                    "—".to_string()
                };
                (format!("{base:.2} {unit}"), ratio)
            }
            None => ("—".to_string(), "—".to_string()),
        };
        println!("| {label} | {value:.2} {unit} | {floor_text} | {ratio} |");
    }
    println!();
    println!(
        "edits (ms to last ACK / MB / server CPU s): {}",
        real.edits
            .iter()
            .map(|c| format!(
                "{:.0}/{:.2}/{:.2}",
                c.last_acked.as_secs_f64() * 1e3,
                c.bytes as f64 / 1e6,
                c.cpu_seconds
            ))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let ms = |d: Option<Duration>| d.map(|d| d.as_secs_f64() * 1e3);
    let handoff = sorted(real.edits.iter().filter_map(|c| ms(c.handoff)));
    let pushed = sorted(real.edits.iter().filter_map(|c| ms(c.pushed_to_all)));
    if !handoff.is_empty() {
        println!(
            "pilotfish-xds edits: write → snapshot at the streams p50 {:.0} / p99 {:.0} ms; then → last response sent to the last stream p50 {:.0} / p99 {:.0} ms",
            percentile(&handoff, 50.0),
            percentile(&handoff, 99.0),
            percentile(&pushed, 50.0),
            percentile(&pushed, 99.0)
        );
        println!(
            "each edit, write → snapshot at the streams + → last response sent (ms): {}",
            real.edits
                .iter()
                .map(|c| format!(
                    "{:.0}+{:.0}",
                    ms(c.handoff).unwrap_or(f64::NAN),
                    ms(c.pushed_to_all).unwrap_or(f64::NAN)
                ))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
}
