//! Process lifecycle shared by the binaries. Every long-lived task is spawned into a
//! [`Supervisor`]; when any of them ends — returns, fails or panics — the process exits
//! non-zero, so a dead task never hides behind a healthy-looking pod. SIGTERM and SIGINT
//! end the process cleanly.
//!
//! Shutdown has one vocabulary, [`CancellationToken`]: the supervisor holds the process's
//! root token ([`Supervisor::shutdown_token`]) and cancels it in [`Supervisor::shutdown`];
//! a part that must stop earlier than the rest (the xDS server's drain) takes a child
//! token and is cancelled by its caller first.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// What a supervised task may fail with (`anyhow::Error` converts into it).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The long-lived tasks of one process.
#[derive(Default)]
pub struct Supervisor {
    tasks: JoinSet<(&'static str, Result<(), BoxError>)>,
    /// Tasks with nothing to finish on shutdown (followers, watchdogs): aborted at once.
    background: Vec<tokio::task::AbortHandle>,
    /// The process's root shutdown signal, cancelled by [`Supervisor::shutdown`].
    root: CancellationToken,
}

impl Supervisor {
    pub fn new() -> Self {
        Supervisor::default()
    }

    /// The root shutdown token: tasks that have something to finish (release a Lease,
    /// close a server gracefully) stop when it is cancelled. Take a
    /// [`child_token`](CancellationToken::child_token) for a part to stop earlier.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.root.clone()
    }

    /// Spawns a task that must run for the life of the process.
    pub fn spawn<F, E>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        self.tasks
            .spawn(async move { (name, task.await.map_err(Into::into)) });
    }

    /// Like [`Supervisor::spawn`], for a task that has nothing to finish on shutdown
    /// (followers, watchdogs): it is aborted at once instead of being waited for.
    pub fn spawn_background<F, E>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError>,
    {
        let handle = self
            .tasks
            .spawn(async move { (name, task.await.map_err(Into::into)) });
        self.background.push(handle);
    }

    /// Waits until a task ends (failure) or a shutdown signal arrives (success).
    pub async fn wait(&mut self) -> ExitCode {
        tokio::select! {
            ended = self.tasks.join_next() => {
                match ended {
                    Some(Ok((name, Ok(())))) => tracing::error!(task = name, "a long-lived task ended; exiting"),
                    Some(Ok((name, Err(e)))) => tracing::error!(task = name, error = %e, "a long-lived task failed; exiting"),
                    Some(Err(e)) => tracing::error!(error = %e, "a long-lived task panicked; exiting"),
                    None => tracing::error!("no tasks left; exiting"),
                }
                ExitCode::FAILURE
            }
            _ = shutdown_signal() => {
                tracing::info!("shutdown signal received");
                ExitCode::SUCCESS
            }
        }
    }

    /// Cancels the root token, aborts the background tasks, gives the others `grace` to
    /// finish, then aborts what is left.
    pub async fn shutdown(mut self, grace: Duration) {
        self.root.cancel();
        for handle in &self.background {
            handle.abort();
        }
        let _ = tokio::time::timeout(grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        self.tasks.abort_all();
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        // Without signal handlers the process still stops on SIGKILL.
        _ => std::future::pending().await,
    }
}

/// Runs a binary's async `main` on a multi-threaded runtime. An error is printed with
/// its chain (`{:#}`) and exits with status 2 (a usage or startup error).
pub fn run_main<F, E>(main: F) -> ExitCode
where
    F: Future<Output = Result<ExitCode, E>>,
    E: Display,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(main) {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_ends_makes_the_process_fail() {
        let mut s = Supervisor::new();
        s.spawn("forever", async {
            std::future::pending::<Result<(), BoxError>>().await
        });
        s.spawn("short-lived", async { Ok::<(), BoxError>(()) });
        assert_eq!(s.wait().await, ExitCode::FAILURE);
        s.shutdown(Duration::from_millis(10)).await;
    }

    #[tokio::test]
    async fn shutdown_aborts_background_tasks_at_once_and_waits_for_the_others() {
        let mut s = Supervisor::new();
        let stop = s.shutdown_token();
        let finished = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = finished.clone();
        s.spawn("finishes on stop", async move {
            stop.cancelled().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok::<(), BoxError>(())
        });
        s.spawn_background("runs forever", async {
            std::future::pending::<Result<(), BoxError>>().await
        });
        let started = std::time::Instant::now();
        s.shutdown(Duration::from_secs(30)).await;
        assert!(
            finished.load(std::sync::atomic::Ordering::SeqCst),
            "the stopping task finished"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "did not wait out the grace for a background task"
        );
    }

    #[tokio::test]
    async fn a_panicking_task_makes_the_process_fail() {
        let mut s = Supervisor::new();
        s.spawn("panics", async {
            if true {
                panic!("boom");
            }
            Ok::<(), BoxError>(())
        });
        assert_eq!(s.wait().await, ExitCode::FAILURE);
    }
}
