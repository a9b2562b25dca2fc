//! Shared fixtures: a started server with an isolated kubectl/helm environment, and
//! helpers that run the tools with generous time limits and explain failures.

use std::path::PathBuf;
use std::time::Duration;

use pilotfish_testkit::apiserver::TestApiServer;
use pilotfish_testkit::tools::{self, KubeEnv, ToolOutput};

/// Generous bound for one kubectl/helm invocation on a slow, shared machine.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(180);
/// Generous bound for waiting on an asynchronous effect (watch events, convergence).
pub const WAIT: Duration = Duration::from_secs(60);

pub fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(name)
        .display()
        .to_string()
}

/// A running test API server plus a private HOME for the command-line tools.
pub struct Cluster {
    pub server: TestApiServer,
    env: KubeEnv,
    _home: tempfile::TempDir,
}

impl Cluster {
    pub async fn start() -> Self {
        let server = TestApiServer::start().await.expect("start test API server");
        let home = tempfile::tempdir().expect("temp HOME");
        let env = KubeEnv::new(home.path(), &server.kubeconfig_path());
        Cluster {
            server,
            env,
            _home: home,
        }
    }

    pub fn client(&self) -> kube::Client {
        let url = self.server.url().parse().expect("server URL");
        kube::Client::try_from(kube::Config::new(url)).expect("kube client")
    }

    async fn run(&self, program: PathBuf, args: &[&str]) -> ToolOutput {
        self.env
            .run(&program, args, TOOL_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    pub async fn kubectl(&self, args: &[&str]) -> ToolOutput {
        let kubectl = tools::kubectl().unwrap_or_else(|e| panic!("{e}"));
        self.run(kubectl, args).await
    }

    pub async fn helm(&self, args: &[&str]) -> ToolOutput {
        let helm = tools::helm().unwrap_or_else(|e| panic!("{e}"));
        self.run(helm, args).await
    }

    /// Runs kubectl and returns stdout, failing the test with stderr if it failed.
    pub async fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args).await;
        assert!(
            out.success,
            "kubectl {args:?} failed: {}\n{}",
            out.stderr, out.stdout
        );
        out.stdout
    }

    pub async fn kubectl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut full = args.to_vec();
        full.extend(["-o", "json"]);
        let stdout = self.kubectl_ok(&full).await;
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("kubectl {args:?}: {e}: {stdout}"))
    }

    pub async fn helm_ok(&self, args: &[&str]) -> String {
        let out = self.helm(args).await;
        assert!(
            out.success,
            "helm {args:?} failed: {}\n{}",
            out.stderr, out.stdout
        );
        out.stdout
    }
}

/// Awaits `future` for at most [`WAIT`], naming `what` if it takes longer.
pub async fn within<T>(what: &str, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("timed out after {WAIT:?} waiting for {what}"))
}
