//! `pilotfish-test-apiserver`: runs the test Kubernetes API server until SIGINT/SIGTERM.
//! Writes a kubeconfig once listening (`--kubeconfig-out`), so scripts can wait for the
//! file and point `KUBECONFIG`, kubectl, helm or kube-rs at it.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use pilotfish_testkit::apiserver::{Config, TestApiServer};

#[derive(Debug, Parser)]
#[command(
    name = "pilotfish-test-apiserver",
    about = "In-memory Kubernetes API server for tests"
)]
struct Args {
    /// Address to listen on (plain HTTP, no auth); port 0 picks a free port.
    #[arg(long, env = "PILOTFISH_ADDR", default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// Write a kubeconfig for this server here once it listens.
    #[arg(long, env = "PILOTFISH_KUBECONFIG_OUT")]
    kubeconfig_out: Option<PathBuf>,
    /// Changes kept for watch resumption; older resource versions get 410 Gone.
    #[arg(long, env = "PILOTFISH_HISTORY_LIMIT", default_value_t = 10_000)]
    history_limit: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let server = TestApiServer::start_with(Config {
        addr: args.addr,
        history_limit: args.history_limit,
    })
    .await?;
    if let Some(path) = &args.kubeconfig_out {
        server
            .write_kubeconfig(path)
            .with_context(|| format!("writing kubeconfig {}", path.display()))?;
    }
    println!("{}", server.url());
    wait_for_signal().await?;
    server.shutdown().await;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing SIGTERM handler")?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result.context("waiting for SIGINT")?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
