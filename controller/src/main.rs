//! `pilotfish-controller`: watches configuration, builds mesh snapshots and publishes them.
//! Today it offers the offline `validate` subcommand; the publishing run modes are added
//! with the snapshot bus.

mod validate_cmd;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use pilotfish_shared::mesh_config::MeshConfig;

#[derive(Parser, Debug)]
#[command(name = "pilotfish-controller", version, about = "Pilotfish controller")]
struct Cli {
    /// Kubernetes cluster domain used to resolve short host names.
    #[arg(
        long,
        env = "PILOTFISH_CLUSTER_DOMAIN",
        default_value = "cluster.local",
        global = true
    )]
    cluster_domain: String,
    /// Istio MeshConfig YAML (the subset Pilotfish honours: rootNamespace, outboundTrafficPolicy, ...).
    #[arg(long, env = "PILOTFISH_MESH_CONFIG", global = true)]
    mesh_config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Validate Istio configs offline (like `istioctl validate`); exit 1 on errors.
    Validate {
        /// Files or folders of YAML (multi-document, `kind: List` allowed).
        #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
        files: Vec<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
        output: validate_cmd::OutputFormat,
    },
}

fn load_mesh_config(path: Option<&PathBuf>) -> Result<MeshConfig> {
    let Some(path) = path else {
        return Ok(MeshConfig::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read mesh config {}", path.display()))?;
    let loaded = MeshConfig::from_yaml(&text)
        .with_context(|| format!("invalid mesh config {}", path.display()))?;
    if !loaded.ignored_fields.is_empty() {
        eprintln!(
            "note: mesh config fields not used by Pilotfish: {}",
            loaded.ignored_fields.join(", ")
        );
    }
    Ok(loaded.config)
}

fn run(cli: Cli) -> Result<ExitCode> {
    let mesh = load_mesh_config(cli.mesh_config.as_ref())?;
    match cli.command {
        Command::Validate { files, output } => {
            let report = validate_cmd::validate_paths(&files, mesh, &cli.cluster_domain)?;
            let code = validate_cmd::print(&report, output, &mut std::io::stdout().lock())?;
            Ok(ExitCode::from(code as u8))
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
