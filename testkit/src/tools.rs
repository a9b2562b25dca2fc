//! The real `kubectl` 1.33 and `helm` 4 that `scripts/deps/kube-tools.sh` installs into
//! `<workspace>/.tools/bin` (overridable with `PILOTFISH_KUBECTL` / `PILOTFISH_HELM`),
//! and [`KubeEnv`], which runs them with their own `HOME`, kubeconfig and helm
//! directories so tests share no discovery cache. A missing binary is an error that
//! says how to install it: tests must fail, not skip, since `make test` installs them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(
        "{tool} not found at {path}: run `scripts/deps/kube-tools.sh` (or `make test-deps`), or set {env} to a {tool} binary"
    )]
    Missing {
        tool: &'static str,
        path: PathBuf,
        env: &'static str,
    },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} did not finish within {timeout:?}")]
    Timeout { program: String, timeout: Duration },
}

/// The workspace root (the parent of this crate's folder).
pub fn workspace_root() -> PathBuf {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    crate_dir.parent().unwrap_or(crate_dir).to_path_buf()
}

/// The Cargo target directory (`CARGO_TARGET_DIR` honoured).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

fn locate(tool: &'static str, env: &'static str) -> Result<PathBuf, ToolError> {
    let path = std::env::var_os(env)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".tools").join("bin").join(tool));
    if path.is_file() {
        Ok(path)
    } else {
        Err(ToolError::Missing { tool, path, env })
    }
}

/// `kubectl` 1.33 (never Debian's older one on `PATH`).
pub fn kubectl() -> Result<PathBuf, ToolError> {
    locate("kubectl", "PILOTFISH_KUBECTL")
}

/// `helm` 4.
pub fn helm() -> Result<PathBuf, ToolError> {
    locate("helm", "PILOTFISH_HELM")
}

/// What a finished tool run printed.
#[derive(Debug)]
pub struct ToolOutput {
    pub success: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// An isolated environment for kubectl and helm: its own `HOME` (and so discovery
/// cache), `KUBECONFIG` and helm cache/config/data directories under `home`.
#[derive(Debug, Clone)]
pub struct KubeEnv {
    home: PathBuf,
    kubeconfig: PathBuf,
}

impl KubeEnv {
    pub fn new(home: &Path, kubeconfig: &Path) -> Self {
        KubeEnv {
            home: home.to_path_buf(),
            kubeconfig: kubeconfig.to_path_buf(),
        }
    }

    /// A command for `program` with the isolated environment applied; killed if dropped.
    pub fn command(&self, program: &Path) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(program);
        command
            .env("HOME", &self.home)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("KUBECACHEDIR", self.home.join(".kube").join("cache"))
            .env("HELM_CACHE_HOME", self.home.join("helm-cache"))
            .env("HELM_CONFIG_HOME", self.home.join("helm-config"))
            .env("HELM_DATA_HOME", self.home.join("helm-data"))
            .env_remove("HELM_KUBECONTEXT")
            .env_remove("HELM_NAMESPACE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// Runs `program args…` to completion (or kills it after `timeout`).
    pub async fn run(
        &self,
        program: &Path,
        args: &[&str],
        timeout: Duration,
    ) -> Result<ToolOutput, ToolError> {
        let name = format!("{} {}", program.display(), args.join(" "));
        let child =
            self.command(program)
                .args(args)
                .spawn()
                .map_err(|source| ToolError::Spawn {
                    program: name.clone(),
                    source,
                })?;
        let output = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| ToolError::Timeout {
                program: name.clone(),
                timeout,
            })?
            .map_err(|source| ToolError::Spawn {
                program: name,
                source,
            })?;
        Ok(ToolOutput {
            success: output.status.success(),
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}
