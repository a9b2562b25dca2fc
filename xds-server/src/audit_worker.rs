//! The replica's consistency audit, run off the serving path: one long-lived thread at the
//! lowest CPU priority (nice 19) audits the newest snapshot handed to it, skipping any it
//! did not reach before a newer one arrived.
//!
//! Why a thread of its own: with the server pinned to one core, an audit run as ordinary
//! blocking work took a quarter of the core during every push (PERFORMANCE.md, run 5), so
//! proxies converged later by that much. At nice 19 the kernel gives it the core only
//! when the streams leave it idle, and a burst of snapshots costs one audit, not one each.
//! At most one snapshot waits (the newest), so the audit never holds a chain of old ones.
//!
//! The audit checks what the streams were served (`generate::Auditor`), so it waits
//! [`SERVE_DELAY`] after a hand-off before it starts: by then the streams have asked for
//! their scopes' parts (on a machine with a spare core it would otherwise run while they
//! are still asking, and see few of them).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::ads::XdsSnapshot;
use crate::generate::{Auditor, GeneratedSnapshot};

/// What the audit thread does with a finished audit: the snapshot's version and how many
/// broken references it found.
pub type AuditReport = Box<dyn Fn(u64, usize) + Send>;

/// How long after a hand-off the audit waits before it checks the newest snapshot.
pub const SERVE_DELAY: Duration = Duration::from_secs(1);

#[derive(Default)]
struct Slot {
    newest: Option<Arc<GeneratedSnapshot>>,
    /// When the oldest snapshot not audited yet was handed over: the audit starts
    /// [`SERVE_DELAY`] after it, so a steady stream of snapshots is still audited.
    waiting_since: Option<Instant>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    slot: Mutex<Slot>,
    wake: Condvar,
}

/// The feed's handle on the audit thread; dropping it lets the thread finish its current
/// audit and exit.
pub struct AuditWorker {
    shared: Arc<Shared>,
}

impl AuditWorker {
    /// Starts the audit thread; `report` is called after each audit.
    pub fn start(report: AuditReport) -> std::io::Result<AuditWorker> {
        let shared = Arc::new(Shared::default());
        let for_thread = shared.clone();
        thread::Builder::new()
            .name("pilotfish-audit".into())
            .spawn(move || audit_loop(&for_thread, &report))?;
        Ok(AuditWorker { shared })
    }

    /// Queues `snapshot` for audit, replacing one still waiting.
    pub fn submit(&self, snapshot: Arc<GeneratedSnapshot>) {
        let mut slot = self.shared.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.newest = Some(snapshot);
        slot.waiting_since.get_or_insert_with(Instant::now);
        self.shared.wake.notify_one();
    }
}

impl Drop for AuditWorker {
    fn drop(&mut self) {
        let mut slot = self.shared.slot.lock().unwrap_or_else(|e| e.into_inner());
        slot.closed = true;
        slot.newest = None;
        self.shared.wake.notify_one();
    }
}

fn audit_loop(shared: &Shared, report: &AuditReport) {
    lower_priority();
    let mut auditor = Auditor::default();
    loop {
        let snapshot = {
            let mut slot = shared.slot.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if slot.closed {
                    return;
                }
                if let Some(since) = slot.waiting_since {
                    let due = since + SERVE_DELAY;
                    let now = Instant::now();
                    if now < due {
                        slot = shared
                            .wake
                            .wait_timeout(slot, due - now)
                            .unwrap_or_else(|e| e.into_inner())
                            .0;
                        continue;
                    }
                    if let Some(s) = slot.newest.take() {
                        slot.waiting_since = None;
                        break s;
                    }
                }
                slot = shared.wake.wait(slot).unwrap_or_else(|e| e.into_inner());
            }
        };
        // A panic in the audit is a bug in the checks, not in what is served: it is
        // logged, the auditor starts afresh, and the thread keeps auditing.
        match catch_unwind(AssertUnwindSafe(|| auditor.check(&snapshot))) {
            Ok(broken) => report(snapshot.version(), broken.len()),
            Err(_) => {
                tracing::error!(
                    version = snapshot.version(),
                    "the consistency audit panicked; it continues with the next snapshot"
                );
                auditor = Auditor::default();
            }
        }
    }
}

/// Nice 19 for the calling thread only (Linux applies `setpriority` per thread id).
fn lower_priority() {
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), 19) {
        tracing::warn!(error = %e, "could not lower the audit thread's priority; audits compete with serving");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    use pilotfish_mesh::push_context::PushContext;

    use crate::ads::ChangeKind;

    fn snapshot(version: u64) -> Arc<GeneratedSnapshot> {
        Arc::new(GeneratedSnapshot::new_since(
            Arc::new(PushContext::default()),
            version,
            None,
            ChangeKind::Full,
        ))
    }

    /// Every submitted snapshot is audited unless a newer one replaced it first, the
    /// newest is always audited, and the thread runs at nice 19.
    #[test]
    fn audits_the_newest_snapshot_at_the_lowest_priority() {
        let (tx, rx) = mpsc::channel();
        let worker = AuditWorker::start(Box::new(move |version, broken| {
            let nice = rustix::process::getpriority_process(Some(rustix::thread::gettid()));
            tx.send((version, broken, nice.ok())).ok();
        }))
        .unwrap();
        for version in 1..=50 {
            worker.submit(snapshot(version));
        }
        let mut seen = Vec::new();
        while seen.last().map(|(v, _, _)| *v) != Some(50) {
            seen.push(
                rx.recv_timeout(Duration::from_secs(30))
                    .expect("an audit report"),
            );
        }
        assert!(
            seen.windows(2).all(|w| w[0].0 < w[1].0),
            "in order, none twice: {seen:?}"
        );
        assert!(seen.iter().all(|(_, broken, _)| *broken == 0));
        assert_eq!(seen[0].2, Some(19), "the audit thread runs at nice 19");
        drop(worker);
    }
}
