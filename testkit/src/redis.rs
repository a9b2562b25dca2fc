//! Real `redis-server` processes for tests and benches, plus a TCP link that can be cut.
//!
//! - [`RedisServer`]: one `redis-server` on 127.0.0.1 and a free port, in its own temp dir,
//!   without persistence. [`kill`](RedisServer::kill) + [`start_again`](RedisServer::start_again)
//!   (or [`restart`](RedisServer::restart)) bring it back on the same port with its data
//!   gone, like a Redis pod restarted without a volume. Killed on drop, by PID.
//! - [`TcpLink`]: a forwarding proxy in front of a server whose
//!   [`cut`](TcpLink::cut) drops every connection and refuses new ones until
//!   [`restore`](TcpLink::restore): one client loses Redis while others keep it.
//!
//! `redis-server` comes from `PATH` (installed by `scripts/deps/redis.sh`) or from
//! `PILOTFISH_REDIS_SERVER`.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Why a test Redis could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum RedisHarnessError {
    #[error(
        "cannot run {binary}: {source} (install it with scripts/deps/redis.sh, or set PILOTFISH_REDIS_SERVER)"
    )]
    Spawn {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    #[error("redis-server on port {port} did not answer PING within {waited:?}; its log:\n{log}")]
    NotReady {
        port: u16,
        waited: Duration,
        log: String,
    },
    #[error("redis-server exited at start ({status}); its log:\n{log}")]
    Exited { status: String, log: String },
    #[error("test harness I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// Options for [`RedisServer::start_with`].
#[derive(Clone, Debug, Default)]
pub struct RedisOptions {
    /// `requirepass`: clients must AUTH (default user).
    pub password: Option<String>,
}

/// A running (or killed, restartable) `redis-server`.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    options: RedisOptions,
    child: Option<Child>,
}

const READY_WITHIN: Duration = Duration::from_secs(15);

impl RedisServer {
    /// Starts a server with default options.
    pub fn start() -> Result<Self, RedisHarnessError> {
        Self::start_with(RedisOptions::default())
    }

    pub fn start_with(options: RedisOptions) -> Result<Self, RedisHarnessError> {
        let dir = tempfile::Builder::new()
            .prefix("pilotfish-redis-")
            .tempdir()?;
        let mut server = RedisServer {
            port: free_port()?,
            dir,
            options,
            child: None,
        };
        server.start_again()?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `redis://127.0.0.1:PORT` (no credentials: pass the password separately).
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL (no shutdown, no save) and reap. No-op when not running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // Kill by the PID of the child we spawned, then reap it.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty. No-op when running.
    pub fn start_again(&mut self) -> Result<(), RedisHarnessError> {
        if self.child.is_some() {
            return Ok(());
        }
        let binary =
            std::env::var("PILOTFISH_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let log_path = self.log_path();
        let mut cmd = Command::new(&binary);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--protected-mode", "no"])
            // No persistence: a restart loses every key, which is what the tests exercise.
            .args(["--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(password) = &self.options.password {
            cmd.arg("--requirepass").arg(password);
        }
        let child = cmd.spawn().map_err(|source| RedisHarnessError::Spawn {
            binary: binary.clone(),
            source,
        })?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Kill, then start again on the same port with no data.
    pub fn restart(&mut self) -> Result<(), RedisHarnessError> {
        self.kill();
        self.start_again()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn log(&self) -> String {
        read_tail(&self.log_path())
    }

    fn wait_ready(&mut self) -> Result<(), RedisHarnessError> {
        let started = Instant::now();
        while started.elapsed() < READY_WITHIN {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(RedisHarnessError::Exited {
                    status: status.to_string(),
                    log: self.log(),
                });
            }
            if answers_ping(self.addr()) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = self.log();
        self.kill();
        Err(RedisHarnessError::NotReady {
            port: self.port,
            waited: READY_WITHIN,
            log,
        })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free port on 127.0.0.1 (bound, then released for the server to take).
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Whether a Redis answers on `addr`; `-NOAUTH` counts (the server is up, it wants AUTH).
fn answers_ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 64];
    match stream.read(&mut reply) {
        Ok(n) => {
            let reply = &reply[..n];
            reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH")
        }
        Err(_) => false,
    }
}

fn read_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// A TCP forwarder on 127.0.0.1 that can be cut and restored (see module docs).
#[derive(Debug)]
pub struct TcpLink {
    addr: SocketAddr,
    up: Arc<AtomicBool>,
    /// Bumped by `cut`; every forwarding task ends when it changes.
    generation: watch::Sender<u64>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl TcpLink {
    /// Starts forwarding from a fresh port to `upstream`. Needs a tokio runtime.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let up = Arc::new(AtomicBool::new(true));
        let (generation, _) = watch::channel(0u64);
        let accept_up = up.clone();
        let accept_generation = generation.clone();
        let accept_task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if !accept_up.load(Ordering::SeqCst) {
                    drop(client); // refused while cut
                    continue;
                }
                let mut cut = accept_generation.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (mut client, mut server) = (client, server);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.changed() => {}
                    }
                });
            }
        });
        Ok(TcpLink {
            addr,
            up,
            generation,
            accept_task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:LINKPORT`.
    pub fn redis_url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Drops every open connection and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        self.accept_task.abort();
        self.generation.send_modify(|g| *g += 1);
    }
}
