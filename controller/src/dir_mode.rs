//! `--config-dir` mode: a folder of Kubernetes-style YAML (the same reader as standalone
//! mode) is the source; every change is debounced, built and published. No Lease: one
//! writer per key prefix, so the controller takes a new epoch at start, which fences any
//! earlier writer of the same prefix.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use pilotfish_shared::bus::PublishOutcome;
use pilotfish_shared::push_context::BuildInputs;
use pilotfish_shared::source::DirSource;
use tokio::time::Instant;

use crate::admin::AdminState;
use crate::debounce::{ChangeClass, Debouncer};
use crate::metrics;
use crate::pipeline::{Built, Pipeline};

/// How `--config-dir` mode runs.
pub struct DirMode {
    pub dir: PathBuf,
    /// Mesh config and cluster domain; the folder's objects are added to it.
    pub base: BuildInputs,
    pub debounce_after: Duration,
    pub debounce_max: Duration,
    /// A rescan without a filesystem event, in case an event was missed (network
    /// filesystems, ConfigMap volume swaps).
    pub resync_every: Duration,
}

/// Retries after a failed publish, from 200 ms up to 10 s.
fn retry_delay(attempt: u32) -> Duration {
    Duration::from_millis(200u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(10))
}

impl DirMode {
    pub async fn run(self, mut pipeline: Pipeline, admin: AdminState) -> Result<()> {
        metrics::LEADER.set(1);
        admin.set_leader(serde_json::json!({"mode": "config-dir", "leader": true, "note": "one writer per key prefix; no Lease"}));
        let epoch = take_epoch_with_retry(&pipeline).await;
        admin.set_leader(serde_json::json!({"mode": "config-dir", "leader": true, "epoch": epoch}));
        let mut source = DirSource::new(&self.dir);
        let (_watcher, mut events) = pilotfish_shared::source::watch_dir(&self.dir)
            .with_context(|| format!("cannot watch {}", self.dir.display()))?;
        let mut debounce = Debouncer::new(self.debounce_after, self.debounce_max);
        // The first build happens at once.
        debounce.event(std::time::Instant::now(), ChangeClass::Config);
        let mut pending: Option<Built> = None;
        let mut attempt = 0u32;
        let mut retry_at: Option<Instant> = None;
        let mut resync = tokio::time::interval(self.resync_every);
        resync.tick().await;
        loop {
            let due = debounce.deadline().map(Instant::from_std);
            tokio::select! {
                event = events.recv() => {
                    if event.is_none() {
                        bail!("the watch on {} ended", self.dir.display());
                    }
                    debounce.event(std::time::Instant::now(), ChangeClass::Config);
                }
                _ = resync.tick() => debounce.event(std::time::Instant::now(), ChangeClass::Config),
                _ = sleep_until_opt(due) => {
                    let Some(burst) = debounce.take_if_due(std::time::Instant::now()) else { continue };
                    metrics::DEBOUNCE_MERGED.inc_by(burst.events.saturating_sub(1));
                    let report = source.rescan().with_context(|| format!("cannot read {}", self.dir.display()))?;
                    for e in &report.new_errors {
                        tracing::warn!("{e} (the file's last good content stays in use)");
                    }
                    for kind in &report.new_unknown_kinds {
                        tracing::info!(kind = %kind, "ignoring objects of a kind Pilotfish does not read");
                    }
                    if report.changed || pipeline.previous().is_none() {
                        let built = pipeline.build(source.inputs(self.base.clone()), false).await;
                        pending = Some(built);
                        attempt = 0;
                        retry_at = Some(Instant::now());
                    }
                }
                _ = sleep_until_opt(retry_at) => {
                    retry_at = None;
                    let Some(built) = pending.take() else { continue };
                    match pipeline.publish(&built).await {
                        Ok(outcome @ (PublishOutcome::Published(_) | PublishOutcome::Unchanged(_))) => {
                            if let PublishOutcome::Published(r) = &outcome {
                                tracing::info!(version = r.version, hash = %built.encoded.hash_hex(), build_ms = built.took.as_millis() as u64, "published snapshot");
                            }
                            admin.set_snapshot(&built, Some(&outcome));
                            admin.set_ready(true, "published the folder's snapshot");
                        }
                        Ok(PublishOutcome::Fenced { current }) => {
                            admin.set_snapshot(&built, None);
                            bail!(
                                "another writer took over key prefix (latest: {}); only one --config-dir controller may publish per prefix",
                                current.map(|r| r.to_string()).unwrap_or_else(|| "none".into())
                            );
                        }
                        Err(e) => {
                            let delay = retry_delay(attempt);
                            tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "publish failed; retrying");
                            admin.set_snapshot(&built, None);
                            pending = Some(built);
                            attempt += 1;
                            retry_at = Some(Instant::now() + delay);
                        }
                    }
                }
            }
        }
    }
}

async fn take_epoch_with_retry(pipeline: &Pipeline) -> u64 {
    let mut attempt = 0;
    loop {
        match pipeline.take_epoch().await {
            Ok(epoch) => {
                tracing::info!(
                    epoch,
                    "took a new epoch; earlier writers of this key prefix are fenced"
                );
                return epoch;
            }
            Err(e) => {
                let delay = retry_delay(attempt);
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot take an epoch yet");
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
        }
    }
}

/// Sleeps until `at`, or forever when `None` (a disabled `select!` branch).
async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
