//! Pilotfish's own binaries as child processes of a test: started with free loopback
//! ports, waited for until ready, and killed (by PID, on drop) when the test ends. Plus
//! the small network helpers tests need: a free port and a plain HTTP GET.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::tools::target_dir;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{0} is not built: run `cargo build --workspace --bins` first (make test does)")]
    NotBuilt(PathBuf),
    #[error("cannot start {name}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{name} did not become ready within {timeout:?}: {last}")]
    NotReady {
        name: String,
        timeout: Duration,
        last: String,
    },
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// A plain HTTP/1.1 GET; returns (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {text:.80}")))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Path of one of the workspace's binaries.
pub fn binary(name: &str) -> Result<PathBuf, ProcessError> {
    let path = target_dir().join("debug").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(ProcessError::NotBuilt(path))
    }
}

/// A child process killed on drop.
pub struct ChildProcess {
    pub name: String,
    child: Child,
}

impl ChildProcess {
    /// Starts `program` with `args`; stdout/stderr go to the test's output.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(&str, &str)],
    ) -> Result<Self, ProcessError> {
        let child = Command::new(program)
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .spawn()
            .map_err(|source| ProcessError::Spawn {
                name: name.to_string(),
                source,
            })?;
        Ok(ChildProcess {
            name: name.to_string(),
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a signal by PID (`TERM`, `KILL`, `STOP`, `CONT`) with `kill(1)`.
    pub fn signal(&self, signal: &str) -> std::io::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "kill -{signal} {} failed",
                self.pid()
            )))
        }
    }

    /// Whether the process has exited; its status if so.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Polls `GET path` on `admin` until it answers 200.
    pub fn wait_http_ok(
        &mut self,
        admin: SocketAddr,
        path: &str,
        timeout: Duration,
    ) -> Result<(), ProcessError> {
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            if let Some(status) = self.try_wait() {
                return Err(ProcessError::NotReady {
                    name: self.name.clone(),
                    timeout,
                    last: format!("exited with {status}"),
                });
            }
            match http_get(admin, path) {
                Ok((200, _)) => return Ok(()),
                Ok((code, body)) => last = format!("{path} answered {code}: {body:.200}"),
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(ProcessError::NotReady {
            name: self.name.clone(),
            timeout,
            last,
        })
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // SIGKILL also ends a process a test left stopped (SIGSTOP).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `pilotfish-xds` process with its ADS and admin addresses.
pub struct XdsServer {
    pub process: ChildProcess,
    pub xds: SocketAddr,
    pub admin: SocketAddr,
}

impl XdsServer {
    /// Standalone mode on `config_dir`; returns once `/readyz` answers 200.
    pub fn standalone(name: &str, config_dir: &Path) -> Result<Self, ProcessError> {
        Self::standalone_with(name, config_dir, &[])
    }

    /// Standalone mode with extra flags.
    pub fn standalone_with(
        name: &str,
        config_dir: &Path,
        extra: &[&str],
    ) -> Result<Self, ProcessError> {
        let mut args = vec!["--config-dir".to_string(), config_dir.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::start(name, &args)
    }

    /// Standalone mode as an unprivileged user, as the chart runs it: when the tests run as
    /// root, through `setpriv` as uid/gid 65534 (`nobody`), so that file permissions apply;
    /// otherwise as the tests' own user. `config_dir` must be readable by that user.
    pub fn standalone_unprivileged(name: &str, config_dir: &Path) -> Result<Self, ProcessError> {
        use std::os::unix::fs::MetadataExt;
        let args = ["--config-dir".to_string(), config_dir.display().to_string()];
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        let wrapper: Vec<String> = if root {
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ]
            .map(String::from)
            .into()
        } else {
            Vec::new()
        };
        let mut process = Self::spawn_wrapped(name, &wrapper, &args, &[])?;
        process
            .process
            .wait_http_ok(process.admin, "/readyz", Duration::from_secs(60))?;
        Ok(process)
    }

    /// Standalone mode with the secure port on as well (TLS, authenticated ADS, Istio's
    /// CA) on a free port, signing with the CA in `ca_dir` (Istio's file layout), serving
    /// as [`crate::secure::SERVER_NAME`] and reviewing tokens with the API server of
    /// `kubeconfig`. Returns the server and the secure port's address.
    pub fn standalone_secure(
        name: &str,
        config_dir: &Path,
        ca_dir: &Path,
        kubeconfig: &Path,
    ) -> Result<(Self, SocketAddr), ProcessError> {
        let secure: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let args = [
            "--config-dir".to_string(),
            config_dir.display().to_string(),
            "--secure-xds-addr".to_string(),
            secure.to_string(),
            "--ca-dir".to_string(),
            ca_dir.display().to_string(),
            "--serving-dns-names".to_string(),
            crate::secure::SERVER_NAME.to_string(),
        ];
        let kubeconfig = kubeconfig.display().to_string();
        let server = Self::start_with_env(name, &args, &[("KUBECONFIG", kubeconfig.as_str())])?;
        Ok((server, secure))
    }

    /// Following Redis at `url`, verifying with the tests' key ([`crate::keys`]); returns
    /// once `/readyz` answers 200 (a snapshot is loaded).
    pub fn following(name: &str, url: &str, extra: &[&str]) -> Result<Self, ProcessError> {
        let mut process = Self::spawn_following(name, url, extra)?;
        process
            .process
            .wait_http_ok(process.admin, "/readyz", Duration::from_secs(60))?;
        Ok(process)
    }

    /// [`following`](Self::following) without waiting to be ready (a replica that may
    /// never hold a snapshot).
    pub fn spawn_following(name: &str, url: &str, extra: &[&str]) -> Result<Self, ProcessError> {
        let mut args = vec![
            "--redis-url".to_string(),
            url.to_string(),
            "--verify-keys".to_string(),
            crate::keys::files().verify.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        Self::spawn(name, &args)
    }

    fn start(name: &str, source: &[String]) -> Result<Self, ProcessError> {
        Self::start_with_env(name, source, &[])
    }

    fn start_with_env(
        name: &str,
        source: &[String],
        envs: &[(&str, &str)],
    ) -> Result<Self, ProcessError> {
        let mut process = Self::spawn_with_env(name, source, envs)?;
        process
            .process
            .wait_http_ok(process.admin, "/readyz", Duration::from_secs(60))?;
        Ok(process)
    }

    fn spawn(name: &str, source: &[String]) -> Result<Self, ProcessError> {
        Self::spawn_with_env(name, source, &[])
    }

    fn spawn_with_env(
        name: &str,
        source: &[String],
        envs: &[(&str, &str)],
    ) -> Result<Self, ProcessError> {
        Self::spawn_wrapped(name, &[], source, envs)
    }

    /// Spawns `pilotfish-xds`, through `wrapper` (a command and its arguments, e.g.
    /// `setpriv ...`) when it is not empty.
    fn spawn_wrapped(
        name: &str,
        wrapper: &[String],
        source: &[String],
        envs: &[(&str, &str)],
    ) -> Result<Self, ProcessError> {
        let xds: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let mut args = vec![
            "--xds-addr".to_string(),
            xds.to_string(),
            "--admin-addr".to_string(),
            admin.to_string(),
            "--replica-name".to_string(),
            name.to_string(),
        ];
        args.extend(source.iter().cloned());
        let binary = binary("pilotfish-xds")?;
        let process = match wrapper.split_first() {
            None => ChildProcess::spawn(name, &binary, &args, envs)?,
            Some((program, wrapper_args)) => {
                let mut all = wrapper_args.to_vec();
                all.push(binary.display().to_string());
                all.extend(args);
                ChildProcess::spawn(name, Path::new(program), &all, envs)?
            }
        };
        Ok(XdsServer {
            process,
            xds,
            admin,
        })
    }

    /// `GET path` on the admin server, parsed as JSON.
    pub fn admin_json(&self, path: &str) -> std::io::Result<serde_json::Value> {
        let (status, body) = http_get(self.admin, path)?;
        if status != 200 {
            return Err(std::io::Error::other(format!(
                "{path} answered {status}: {body}"
            )));
        }
        serde_json::from_str(&body).map_err(std::io::Error::other)
    }

    /// Open ADS streams on this replica, as `(proxy id, peer address)`.
    pub fn clients(&self) -> std::io::Result<Vec<(String, String)>> {
        let adsz = self.admin_json("/debug/adsz")?;
        Ok(adsz["clients"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["proxy_id"].as_str().unwrap_or("").to_string(),
                    c["peer"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect())
    }

    /// The value of a counter or gauge on `/metrics` (the sum over its label sets that
    /// contain `labels`, e.g. `reason="max_age"`).
    pub fn metric(&self, name: &str, labels: &str) -> std::io::Result<f64> {
        let (_, text) = http_get(self.admin, "/metrics")?;
        Ok(text
            .lines()
            .filter(|l| {
                l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']) && l.contains(labels)
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    /// NACKs recorded on any stream of this replica, as `(proxy id, type, detail)`.
    pub fn nacks(&self) -> std::io::Result<Vec<(String, String, String)>> {
        let adsz = self.admin_json("/debug/adsz")?;
        let mut out = Vec::new();
        for client in adsz["clients"].as_array().into_iter().flatten() {
            for t in client["types"].as_array().into_iter().flatten() {
                if !t["last_nack"].is_null() {
                    out.push((
                        client["proxy_id"].as_str().unwrap_or("").to_string(),
                        t["type_url"].as_str().unwrap_or("").to_string(),
                        t["last_nack"].to_string(),
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// A `pilotfish-controller` process publishing to Redis.
pub struct ControllerProcess {
    pub process: ChildProcess,
    pub admin: SocketAddr,
}

impl ControllerProcess {
    /// `--config-dir DIR --redis-url URL` mode, signing with the tests' key
    /// ([`crate::keys`]); returns once `/readyz` answers 200 (the folder's first snapshot
    /// is published).
    pub fn config_dir(name: &str, dir: &Path, redis_url: &str) -> Result<Self, ProcessError> {
        let mut process = Self::spawn_config_dir(name, dir, redis_url, &[])?;
        process
            .process
            .wait_http_ok(process.admin, "/readyz", Duration::from_secs(60))?;
        Ok(process)
    }

    /// [`config_dir`](Self::config_dir) with extra flags, without waiting to be ready.
    pub fn spawn_config_dir(
        name: &str,
        dir: &Path,
        redis_url: &str,
        extra: &[&str],
    ) -> Result<Self, ProcessError> {
        let admin: SocketAddr = ([127, 0, 0, 1], free_port()).into();
        let mut args: Vec<String> = [
            "--config-dir".to_string(),
            dir.display().to_string(),
            "--redis-url".to_string(),
            redis_url.to_string(),
            "--admin-addr".to_string(),
            admin.to_string(),
            "--replica-name".to_string(),
            name.to_string(),
            "--debounce-after".to_string(),
            "50ms".to_string(),
            "--signing-key-file".to_string(),
            crate::keys::files().signing.display().to_string(),
        ]
        .into();
        args.extend(extra.iter().map(|s| s.to_string()));
        let process = ChildProcess::spawn(name, &binary("pilotfish-controller")?, &args, &[])?;
        Ok(ControllerProcess { process, admin })
    }
}
