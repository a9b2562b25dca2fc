//! The `pilotfish-test-apiserver` binary: listens, writes `--kubeconfig-out` once
//! ready, serves kubectl through that file, and stops on SIGTERM.

use std::time::Duration;

use pilotfish_testkit::tools::{self, KubeEnv};

use crate::support::{TOOL_TIMEOUT, within};

/// Kills the spawned server if the test ends early.
struct Child(tokio::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_writes_a_kubeconfig_kubectl_can_use() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Child(
        tokio::process::Command::new(env!("CARGO_BIN_EXE_pilotfish-test-apiserver"))
            .args(["--addr", "127.0.0.1:0", "--kubeconfig-out"])
            .arg(&kubeconfig)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start pilotfish-test-apiserver"),
    );
    within("the kubeconfig file", async {
        while !kubeconfig.exists() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let text = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(text.contains("server: http://127.0.0.1:"), "{text}");

    let kubectl = tools::kubectl().unwrap_or_else(|e| panic!("{e}"));
    let env = KubeEnv::new(dir.path(), &kubeconfig);
    let out = env
        .run(&kubectl, &["get", "namespaces", "-o", "name"], TOOL_TIMEOUT)
        .await
        .unwrap();
    assert!(out.success, "{}", out.stderr);
    assert!(out.stdout.contains("namespace/default"), "{}", out.stdout);
    let out = env
        .run(&kubectl, &["version", "-o", "json"], TOOL_TIMEOUT)
        .await
        .unwrap();
    assert!(
        out.stdout.contains("\"gitVersion\": \"v1.33.0\""),
        "{}",
        out.stdout
    );

    let pid = child.0.id().expect("server pid");
    let term = tokio::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await
        .unwrap();
    assert!(term.success());
    let status = within("the server to exit", child.0.wait()).await.unwrap();
    assert!(status.success(), "server exited with {status}");
}
