//! The snapshot feed of a replica: takes each decoded snapshot the bus follower delivers,
//! wraps it into a [`GeneratedSnapshot`] (with the change kind relative to the previous
//! one, so endpoint-only changes take the cheap path), stamps it with its arrival time
//! and hands it to the ADS streams — the one hand-off between the bus and the engine.
//! Keeps what the admin pages show: the current snapshot and the recent push history.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use pilotfish_mesh::push_context::PushContext;
use pilotfish_shared::bus::{Followed, SnapshotRef};
use serde::Serialize;
use tokio::sync::watch;

use crate::ads::{ChangeKind, ConnectionRegistry, SnapshotSender, StampedSnapshot, XdsSnapshot};
use crate::audit_worker::AuditWorker;
use crate::generate::GeneratedSnapshot;

/// Pushes remembered for `/debug/push_status`.
const HISTORY: usize = 32;

/// One snapshot this replica started serving.
#[derive(Clone, Debug, Serialize)]
pub struct PushRecord {
    pub version: u64,
    pub hash: String,
    /// `full` or `endpoints` (the trigger, as the engine sees it).
    pub change: &'static str,
    pub received_at: String,
    /// `received_at` as a time, for the push duration on the debug page.
    #[serde(skip)]
    pub received: SystemTime,
    /// Streams open when it arrived.
    pub streams_at_arrival: usize,
    /// From the follower delivering it to the streams seeing it, in milliseconds.
    pub handoff_ms: f64,
    /// Broken references the consistency check found (0 expected).
    pub broken_references: Option<usize>,
}

/// The current snapshot and its history; shared with the admin server.
#[derive(Default)]
pub struct FeedState {
    current: Mutex<Option<(SnapshotRef, Arc<GeneratedSnapshot>)>>,
    history: Mutex<VecDeque<PushRecord>>,
}

impl FeedState {
    pub fn current(&self) -> Option<(SnapshotRef, Arc<GeneratedSnapshot>)> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn history(&self) -> Vec<PushRecord> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect()
    }

    fn record(&self, record: PushRecord) {
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        if h.len() == HISTORY {
            h.pop_front();
        }
        h.push_back(record);
    }

    fn set_broken(&self, version: u64, n: usize) {
        let mut h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = h.iter_mut().rev().find(|r| r.version == version) {
            r.broken_references = Some(n);
        }
    }
}

/// Follows `snapshots` until the follower goes away, feeding the streams through `engine`.
pub async fn run(
    mut snapshots: watch::Receiver<Option<Arc<Followed<Arc<PushContext>>>>>,
    engine: SnapshotSender,
    state: Arc<FeedState>,
    registry: ConnectionRegistry,
) {
    let mut previous: Option<Arc<GeneratedSnapshot>> = None;
    // One auditor for the replica's snapshots, so each audit decodes only new content;
    // it runs on its own low-priority thread, newest snapshot only.
    let audit_state = state.clone();
    let auditor = match AuditWorker::start(Box::new(move |version, broken| {
        audit_state.set_broken(version, broken)
    })) {
        Ok(worker) => Some(worker),
        Err(e) => {
            tracing::error!(error = %e, "could not start the consistency audit thread; snapshots are served unaudited");
            None
        }
    };
    loop {
        let followed = snapshots.borrow_and_update().clone();
        if let Some(followed) = followed {
            // Arrival, measured once: the streams' convergence time and the push history
            // both start here.
            let (arrived, received) = (Instant::now(), SystemTime::now());
            let version = followed.reference.version;
            let context = followed.value.clone();
            let snapshot = Arc::new(match &previous {
                // Takes what did not change from the previous snapshot (incremental
                // generation); the change kind is computed against it.
                Some(prev) if prev.version() < version => {
                    GeneratedSnapshot::following(prev, context.clone(), version)
                }
                // A reset (lower version) or anything unknown is a full push.
                _ => GeneratedSnapshot::new_since(
                    context.clone(),
                    version,
                    previous.as_ref().map(|p| p.version()),
                    ChangeKind::Full,
                ),
            });
            let change = snapshot.change();
            *state.current.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((followed.reference.clone(), snapshot.clone()));
            engine.send_replace(Some(StampedSnapshot::new(
                snapshot.clone() as Arc<dyn XdsSnapshot>,
                arrived,
            )));
            state.record(PushRecord {
                version,
                hash: followed.reference.hash.clone(),
                change: match change {
                    ChangeKind::EndpointsOnly => "endpoints",
                    ChangeKind::Full => "full",
                },
                received_at: humantime::format_rfc3339_millis(received).to_string(),
                received,
                streams_at_arrival: registry.len(),
                handoff_ms: arrived.elapsed().as_secs_f64() * 1000.0,
                broken_references: None,
            });
            tracing::info!(version, change = ?change, streams = registry.len(), "serving snapshot");
            // The generators never emit a broken reference (they replace it); this audit
            // reports one as a bug. It runs after the engine has the snapshot and only
            // when the streams leave the core idle, so it never delays convergence.
            if let Some(auditor) = &auditor {
                auditor.submit(snapshot.clone());
            }
            // Held strongly only until the next snapshot is made from it: the new one
            // keeps it weakly (streams still serving it keep it alive).
            previous = Some(snapshot);
        }
        if snapshots.changed().await.is_err() {
            return;
        }
    }
}
