//! gRPC's own xDS clients and backend servers for end-to-end tests: Python `grpcio`
//! (C-core; installed into `.venv-grpc/` by `scripts/deps/python-grpc.sh`) and Node's
//! `@grpc/grpc-js-xds` (a separate, stricter implementation; installed into
//! `testkit/node/node_modules/` by `scripts/deps/node-grpc-xds.sh`).
//!
//! [`GrpcBackends`] runs named backend servers on 127.0.0.1 that answer with their name;
//! [`GrpcXdsServer`] is an xDS-enabled (proxyless) server, its listener, TLS and RBAC from
//! the control plane; [`XdsClient`] is one long-lived client process (so it stays
//! connected to the control plane across configuration changes) driven by the same JSON
//! commands in either language.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::tools::workspace_root;

#[derive(Debug, thiserror::Error)]
pub enum GrpcHarnessError {
    #[error(
        "Python with grpcio not found at {0}: run `scripts/deps/python-grpc.sh` (or `make test-deps`)"
    )]
    MissingVenv(PathBuf),
    #[error(
        "Node's @grpc/grpc-js-xds not found at {0}: run `scripts/deps/node-grpc-xds.sh` (or `make test-deps`)"
    )]
    MissingNodeModules(PathBuf),
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed: {detail}")]
    Protocol { what: &'static str, detail: String },
}

/// The venv's Python, which has `grpcio`.
pub fn python() -> Result<PathBuf, GrpcHarnessError> {
    let p = workspace_root().join(".venv-grpc/bin/python");
    if p.is_file() {
        Ok(p)
    } else {
        Err(GrpcHarnessError::MissingVenv(p))
    }
}

/// Which implementation of gRPC's xDS client an [`XdsClient`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientRuntime {
    /// Python `grpcio` (gRPC C-core).
    Python,
    /// Node `@grpc/grpc-js-xds`.
    Node,
}

impl ClientRuntime {
    /// The command that runs this runtime's client script.
    fn command(self) -> Result<Command, GrpcHarnessError> {
        match self {
            ClientRuntime::Python => {
                let mut cmd = Command::new(python()?);
                cmd.arg(script("xds_client.py"));
                Ok(cmd)
            }
            ClientRuntime::Node => {
                let dir = workspace_root().join("testkit/node");
                let modules = dir.join("node_modules/@grpc/grpc-js-xds");
                if !modules.is_dir() {
                    return Err(GrpcHarnessError::MissingNodeModules(modules));
                }
                let mut cmd = Command::new("node");
                cmd.arg(dir.join("xds_client.js"));
                Ok(cmd)
            }
        }
    }
}

fn script(name: &str) -> PathBuf {
    workspace_root().join("testkit/python").join(name)
}

/// Reads one line, failing after `timeout` (the child is killed by its owner on drop).
fn read_line(
    reader: &mut BufReader<ChildStdout>,
    what: &'static str,
) -> Result<String, GrpcHarnessError> {
    let mut line = String::new();
    let n = reader
        .read_line(&mut line)
        .map_err(|e| GrpcHarnessError::Protocol {
            what,
            detail: e.to_string(),
        })?;
    if n == 0 {
        return Err(GrpcHarnessError::Protocol {
            what,
            detail: "the process exited (see its stderr above)".into(),
        });
    }
    Ok(line)
}

/// Runs `testkit/python/istio_ca_client.py`: a CSR sent to Istio's CA API at `ca` over
/// TLS (`grpc.ssl_channel_credentials` trusting `root`, verified as `server_name`) with the
/// token in `token_file` as call credentials; the certificate files land in `out`.
/// Returns the script's JSON line (`identity`, `chain`; or `error`, `message`).
pub fn istio_ca_client(
    ca: &str,
    server_name: &str,
    root: &Path,
    token_file: &Path,
    out: &Path,
    ttl_seconds: u64,
) -> Result<Value, GrpcHarnessError> {
    let output = Command::new(python()?)
        .arg(script("istio_ca_client.py"))
        .args(["--ca-address", ca, "--server-name", server_name])
        .arg("--root")
        .arg(root)
        .arg("--token")
        .arg(token_file)
        .arg("--out")
        .arg(out)
        .args(["--ttl", &ttl_seconds.to_string()])
        .env(
            "GRPC_VERBOSITY",
            std::env::var("GRPC_VERBOSITY").unwrap_or_else(|_| "ERROR".into()),
        )
        .stderr(Stdio::inherit())
        .output()
        .map_err(|source| GrpcHarnessError::Spawn {
            what: "Istio CA client",
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.trim()).map_err(|e| GrpcHarnessError::Protocol {
        what: "Istio CA client",
        detail: format!("{e}: {stdout}"),
    })
}

/// Backend gRPC servers answering `/pilotfish.test.Echo/Who` with their name.
pub struct GrpcBackends {
    child: Child,
    /// Closing stdin stops the servers; kept so that it stays open until drop.
    _stdin: ChildStdin,
    pub ports: BTreeMap<String, u16>,
}

impl GrpcBackends {
    /// Starts one server per `(name, port)` and waits until all listen.
    pub fn start(backends: &[(&str, u16)]) -> Result<Self, GrpcHarnessError> {
        let mut cmd = Command::new(python()?);
        cmd.arg(script("grpc_backend.py"));
        for (name, port) in backends {
            cmd.arg(format!("{name}={port}"));
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| GrpcHarnessError::Spawn {
                what: "gRPC backends",
                source,
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut me = GrpcBackends {
            child,
            _stdin: stdin,
            ports: backends.iter().map(|(n, p)| (n.to_string(), *p)).collect(),
        };
        let line = read_line(&mut out, "gRPC backends")?;
        if line.trim() != "ready" {
            let _ = me.child.kill();
            return Err(GrpcHarnessError::Protocol {
                what: "gRPC backends",
                detail: format!("unexpected first line {line:?}"),
            });
        }
        Ok(me)
    }
}

impl Drop for GrpcBackends {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An xDS-enabled gRPC server (`testkit/python/grpc_xds_server.py`: `grpc.server(...,
/// xds=True)` with `grpc.xds_server_credentials`) answering `/pilotfish.test.Echo/Who` with
/// its name and `/pilotfish.test.Echo/Peer` with the caller's SPIFFE identity.
pub struct GrpcXdsServer {
    child: Child,
    _stdin: ChildStdin,
    _bootstrap_dir: tempfile::TempDir,
}

impl GrpcXdsServer {
    /// Starts the server `name` on `address` (`<ip>:<port>`) with `bootstrap`; returns once
    /// it is started — it serves only when the control plane has sent its listener.
    pub fn start(bootstrap: &Value, name: &str, address: &str) -> Result<Self, GrpcHarnessError> {
        let spawn = |source| GrpcHarnessError::Spawn {
            what: "xDS gRPC server",
            source,
        };
        let dir = tempfile::tempdir().map_err(spawn)?;
        let path = dir.path().join("bootstrap.json");
        std::fs::write(&path, bootstrap.to_string()).map_err(spawn)?;
        let mut child = Command::new(python()?)
            .arg(script("grpc_xds_server.py"))
            .args([name, address])
            .env("GRPC_XDS_BOOTSTRAP", &path)
            .env(
                "GRPC_VERBOSITY",
                std::env::var("GRPC_VERBOSITY").unwrap_or_else(|_| "ERROR".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(spawn)?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut me = GrpcXdsServer {
            child,
            _stdin: stdin,
            _bootstrap_dir: dir,
        };
        let line = read_line(&mut out, "xDS gRPC server")?;
        if line.trim() != "ready" {
            let _ = me.child.kill();
            return Err(GrpcHarnessError::Protocol {
                what: "xDS gRPC server",
                detail: format!("unexpected first line {line:?}"),
            });
        }
        Ok(me)
    }
}

impl Drop for GrpcXdsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The channel credentials of a client's RPCs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChannelCreds {
    /// Plaintext, whatever the control plane configures.
    Insecure,
    /// `grpc.xds_channel_credentials`: the TLS the cluster's `transport_socket` configures
    /// (certificates from the bootstrap's certificate providers), plaintext without one.
    Xds,
}

impl ChannelCreds {
    fn as_str(self) -> &'static str {
        match self {
            ChannelCreds::Insecure => "insecure",
            ChannelCreds::Xds => "xds",
        }
    }
}

/// What a batch of RPCs returned.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
pub struct RpcTally {
    /// RPCs answered, by backend name.
    pub counts: BTreeMap<String, u64>,
    /// RPCs failed, by gRPC status code name (`UNAVAILABLE`, ...).
    pub errors: BTreeMap<String, u64>,
    /// The first few failure details.
    #[serde(default)]
    pub details: Vec<String>,
}

impl RpcTally {
    pub fn total(&self) -> u64 {
        self.counts.values().sum::<u64>() + self.errors.values().sum::<u64>()
    }

    /// Share of RPCs `backend` answered, in percent of all RPCs.
    pub fn percent(&self, backend: &str) -> f64 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        *self.counts.get(backend).unwrap_or(&0) as f64 * 100.0 / total as f64
    }
}

/// The outcome of waiting until RPCs reach a given backend.
#[derive(Clone, Debug, Deserialize)]
pub struct Until {
    pub ok: bool,
    pub elapsed_ms: f64,
    pub rpcs: u64,
    pub last: Option<String>,
}

/// One gRPC xDS client process.
pub struct XdsClient {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    _bootstrap_dir: tempfile::TempDir,
}

/// A gRPC xDS bootstrap for a proxyless client in `namespace` talking to `server`.
pub fn bootstrap(server: &str, node_id: &str, namespace: &str) -> Value {
    json!({
        "xds_servers": [{
            "server_uri": server,
            "channel_creds": [{"type": "insecure"}],
            "server_features": ["xds_v3"]
        }],
        // grpc-js-xds refuses a bootstrap whose node has no `locality` (C-core accepts it);
        // Istio's agent always writes one.
        "node": {
            "id": node_id,
            "locality": {},
            "metadata": {"GENERATOR": "grpc", "NAMESPACE": namespace}
        }
    })
}

impl XdsClient {
    /// Starts a Python (C-core) client with `bootstrap` (see [`bootstrap`]).
    pub fn start(bootstrap: &Value) -> Result<Self, GrpcHarnessError> {
        Self::start_in(ClientRuntime::Python, bootstrap)
    }

    /// Starts a client of the given implementation with `bootstrap`.
    pub fn start_in(runtime: ClientRuntime, bootstrap: &Value) -> Result<Self, GrpcHarnessError> {
        let dir = tempfile::tempdir().map_err(|source| GrpcHarnessError::Spawn {
            what: "xDS client bootstrap",
            source,
        })?;
        let path = dir.path().join("bootstrap.json");
        std::fs::write(&path, bootstrap.to_string()).map_err(|source| GrpcHarnessError::Spawn {
            what: "xDS client bootstrap",
            source,
        })?;
        Self::spawn(runtime, &path, dir)
    }

    fn spawn(
        runtime: ClientRuntime,
        bootstrap: &Path,
        dir: tempfile::TempDir,
    ) -> Result<Self, GrpcHarnessError> {
        let mut child = runtime
            .command()?
            .env("GRPC_XDS_BOOTSTRAP", bootstrap)
            // Quiet unless a test asks for gRPC's own logs.
            .env(
                "GRPC_VERBOSITY",
                std::env::var("GRPC_VERBOSITY").unwrap_or_else(|_| "ERROR".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|source| GrpcHarnessError::Spawn {
                what: "xDS client",
                source,
            })?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let first = read_line(&mut stdout, "xDS client")?;
        if !first.contains("\"ready\"") {
            let _ = child.kill();
            return Err(GrpcHarnessError::Protocol {
                what: "xDS client",
                detail: format!("unexpected first line {first:?}"),
            });
        }
        Ok(XdsClient {
            child,
            stdin,
            stdout,
            _bootstrap_dir: dir,
        })
    }

    fn call(&mut self, command: Value) -> Result<Value, GrpcHarnessError> {
        writeln!(self.stdin, "{command}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| GrpcHarnessError::Protocol {
                what: "xDS client",
                detail: e.to_string(),
            })?;
        let line = read_line(&mut self.stdout, "xDS client")?;
        let value: Value = serde_json::from_str(&line).map_err(|e| GrpcHarnessError::Protocol {
            what: "xDS client",
            detail: format!("{e}: {line}"),
        })?;
        if let Some(exc) = value.get("exception") {
            return Err(GrpcHarnessError::Protocol {
                what: "xDS client",
                detail: exc.to_string(),
            });
        }
        Ok(value)
    }

    /// Makes `count` RPCs to `target` (`xds:///host:port`) with `metadata`.
    pub fn rpcs(
        &mut self,
        target: &str,
        count: u32,
        metadata: &[(&str, &str)],
    ) -> Result<RpcTally, GrpcHarnessError> {
        let md: BTreeMap<&str, &str> = metadata.iter().copied().collect();
        let v = self.call(json!({"cmd": "rpcs", "target": target, "count": count, "metadata": md, "timeout_s": 5}))?;
        serde_json::from_value(v).map_err(|e| GrpcHarnessError::Protocol {
            what: "xDS client",
            detail: e.to_string(),
        })
    }

    /// Makes `count` RPCs of `method` to `target` with `creds`; answers are counted by
    /// their text.
    pub fn rpcs_of(
        &mut self,
        target: &str,
        method: &str,
        creds: ChannelCreds,
        count: u32,
    ) -> Result<RpcTally, GrpcHarnessError> {
        let v = self.call(json!({
            "cmd": "rpcs", "target": target, "count": count, "method": method,
            "creds": creds.as_str(), "timeout_s": 5
        }))?;
        serde_json::from_value(v).map_err(|e| GrpcHarnessError::Protocol {
            what: "xDS client",
            detail: e.to_string(),
        })
    }

    /// Makes RPCs of `method` with `creds` until one is answered by `expect` (an answer's
    /// text or a status code name), for at most `max`.
    pub fn until_of(
        &mut self,
        target: &str,
        method: &str,
        creds: ChannelCreds,
        expect: &str,
        max: Duration,
    ) -> Result<Until, GrpcHarnessError> {
        let v = self.call(json!({
            "cmd": "until", "target": target, "expect": expect, "method": method,
            "creds": creds.as_str(), "max_s": max.as_secs_f64()
        }))?;
        serde_json::from_value(v).map_err(|e| GrpcHarnessError::Protocol {
            what: "xDS client",
            detail: e.to_string(),
        })
    }

    /// Makes RPCs until one is answered by `expect` (a backend name or a status code name),
    /// for at most `max`.
    pub fn until(
        &mut self,
        target: &str,
        expect: &str,
        metadata: &[(&str, &str)],
        max: Duration,
    ) -> Result<Until, GrpcHarnessError> {
        let md: BTreeMap<&str, &str> = metadata.iter().copied().collect();
        let v = self.call(json!({
            "cmd": "until", "target": target, "expect": expect, "metadata": md, "max_s": max.as_secs_f64()
        }))?;
        serde_json::from_value(v).map_err(|e| GrpcHarnessError::Protocol {
            what: "xDS client",
            detail: e.to_string(),
        })
    }
}

impl Drop for XdsClient {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"cmd": "quit"}));
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
