//! `pilotfish-xds-load`: the ADS load benchmark (`make bench-load`, see
//! `pilotfish_testkit::load` and docs/PERFORMANCE.md).
//!
//! ```text
//! pilotfish-xds-load bench --server-bin target/release/pilotfish-xds --server-cpu 0 \
//!     --services 1000 --streams 2000 --edits 20
//! ```
//!
//! `bench` writes the mesh, runs the real `pilotfish-xds --config-dir` and then the null
//! server (`null-serve`, this binary as a child) against the same Envoy-like streams, and
//! prints one table per mode. Run it on another core than the server (`taskset -c 1`)
//! with a file-descriptor limit above twice the number of streams.
//!
//! `reconnect` (`make bench-reconnect`) is the mass-reconnect run: three replicas, one
//! killed, its streams reconnecting to the others with Envoy's backoff
//! (`pilotfish_testkit::load::reconnect`).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use pilotfish_mesh::synthetic::MeshShape;
use pilotfish_testkit::load::bench::{self, BenchConfig};
use pilotfish_testkit::load::client::Mode;
use pilotfish_testkit::load::null_server;
use pilotfish_testkit::load::reconnect::{self, ReconnectConfig};
use pilotfish_testkit::load::wire::Capture;
use prost::Message;
use tokio::io::{AsyncBufReadExt, BufReader};

#[derive(Parser)]
#[command(about = "ADS load benchmark: pilotfish-xds against a null server, SotW and delta")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the benchmark and print the report.
    Bench(BenchArgs),
    /// Serve a captured run (the null server); stdin lines `N` move every stream to step N.
    NullServe(NullArgs),
    /// Mass reconnect: three replicas, one killed, its streams back on the others.
    Reconnect(ReconnectArgs),
}

#[derive(Args)]
struct ReconnectArgs {
    /// The `pilotfish-xds` binary (a release build).
    #[arg(long)]
    server_bin: PathBuf,
    #[arg(long, default_value_t = 100)]
    services: usize,
    #[arg(long, default_value_t = 20)]
    namespaces: usize,
    #[arg(long, default_value_t = 2000)]
    streams: usize,
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    #[arg(long, value_enum, default_value = "sotw")]
    mode: ModeArg,
    #[arg(long, default_value = "target/bench-reconnect")]
    work_dir: PathBuf,
    /// Extra flags for every replica, e.g. `--server-arg=--max-new-streams-per-second=200`.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ModeArg {
    Sotw,
    Delta,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Sotw => Mode::Sotw,
            ModeArg::Delta => Mode::Delta,
        }
    }
}

#[derive(Args)]
struct BenchArgs {
    /// The `pilotfish-xds` binary to measure (a release build).
    #[arg(long)]
    server_bin: PathBuf,
    /// Core to pin the servers to (`taskset -c`).
    #[arg(long)]
    server_cpu: Option<u32>,
    #[arg(long, default_value_t = 1000)]
    services: usize,
    #[arg(long, default_value_t = 20)]
    namespaces: usize,
    /// Pods (sidecars) per service.
    #[arg(long, default_value_t = 2)]
    pods: usize,
    /// Streams; when more than the Pods, Pods get several sidecars.
    #[arg(long, default_value_t = 2000)]
    streams: usize,
    /// VirtualService edits, one after another.
    #[arg(long, default_value_t = 20)]
    edits: usize,
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["sotw", "delta"])]
    modes: Vec<ModeArg>,
    /// Where the mesh, the server logs and the captures go.
    #[arg(long, default_value = "target/bench-load")]
    work_dir: PathBuf,
    /// Skip the null server.
    #[arg(long)]
    no_null: bool,
    /// The server's debounce quiet period (`--debounce-after`).
    #[arg(long, default_value = "100ms")]
    debounce: String,
    /// Scope every sidecar with a Sidecar per namespace importing `./*` and `istio-system/*`.
    #[arg(long)]
    sidecar_per_namespace: bool,
}

#[derive(Args)]
struct NullArgs {
    #[arg(long)]
    capture: PathBuf,
    #[arg(long)]
    mode: ModeArg,
    #[arg(long)]
    addr: std::net::SocketAddr,
}

async fn null_serve(args: NullArgs) -> Result<()> {
    let capture =
        Capture::decode(&std::fs::read(&args.capture)?[..]).context("read the capture")?;
    let steps = capture.steps.len();
    let listener = null_server::listen(args.addr)?;
    let (tx, rx) = tokio::sync::watch::channel(0usize);
    let server = tokio::spawn(null_server::serve(listener, capture, args.mode.into(), rx));
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let step: usize = line.trim().parse().context("a step number")?;
        if step >= steps {
            bail!("step {step} of {steps}");
        }
        tx.send_replace(step);
    }
    server.abort();
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Bench(args) => {
            bench::run(BenchConfig {
                server_bin: args.server_bin,
                self_bin: std::env::current_exe()?,
                shape: MeshShape {
                    services: args.services,
                    endpoints_per_service: args.pods,
                    routed_every: 10,
                    namespaces: args.namespaces,
                },
                streams: args.streams,
                edits: args.edits,
                modes: args.modes.into_iter().map(Mode::from).collect(),
                server_cpu: args.server_cpu,
                work_dir: args.work_dir,
                null_server: !args.no_null,
                debounce: args.debounce,
                sidecar_per_namespace: args.sidecar_per_namespace,
            })
            .await
        }
        Command::NullServe(args) => null_serve(args).await,
        Command::Reconnect(args) => {
            reconnect::run(ReconnectConfig {
                server_bin: args.server_bin,
                shape: MeshShape {
                    services: args.services,
                    endpoints_per_service: 2,
                    routed_every: 10,
                    namespaces: args.namespaces,
                },
                streams: args.streams,
                replicas: args.replicas,
                mode: args.mode.into(),
                work_dir: args.work_dir,
                server_args: args.server_args,
            })
            .await
        }
    }
}
