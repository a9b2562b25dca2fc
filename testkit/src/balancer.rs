//! A round-robin TCP balancer on 127.0.0.1 standing in for a Kubernetes Service in front
//! of several xDS replicas: each new connection goes to the next upstream that accepts it
//! (a replica that stopped listening is skipped, as a Service drops a pod that is not
//! ready). Runs on its own thread, so synchronous tests can use it; stops on drop.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};

/// A running balancer.
pub struct TcpBalancer {
    addr: SocketAddr,
    upstreams: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TcpBalancer {
    /// Starts balancing over `upstreams`.
    pub fn start(upstreams: Vec<SocketAddr>) -> std::io::Result<Self> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let upstreams = Arc::new(Mutex::new(upstreams));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let shared = upstreams.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(std_listener) else { return };
                let next = Arc::new(AtomicUsize::new(0));
                tokio::pin!(stop_rx);
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => return,
                        accepted = listener.accept() => {
                            let Ok((client, _)) = accepted else { continue };
                            let candidates = shared.lock().unwrap_or_else(|e| e.into_inner()).clone();
                            let next = next.clone();
                            tokio::spawn(async move {
                                let start = next.fetch_add(1, Ordering::Relaxed);
                                for i in 0..candidates.len() {
                                    let target = candidates[(start + i) % candidates.len()];
                                    if let Ok(upstream) = TcpStream::connect(target).await {
                                        let (mut c, mut u) = (client, upstream);
                                        let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
                                        return;
                                    }
                                }
                            });
                        }
                    }
                }
            });
        });
        Ok(TcpBalancer {
            addr,
            upstreams,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Replaces the upstreams (for connections made from now on).
    pub fn set_upstreams(&self, upstreams: Vec<SocketAddr>) {
        *self.upstreams.lock().unwrap_or_else(|e| e.into_inner()) = upstreams;
    }
}

impl Drop for TcpBalancer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
