//! A folder of Kubernetes-style YAML as a published stream of snapshots: the loop behind
//! the controller's `--config-dir` mode and the xDS server's standalone mode. Every change
//! is debounced, the folder rescanned (each file keeps its last good content), the mesh
//! rebuilt and published. No Lease: one writer per bus key prefix, so the loop takes a new
//! epoch at start — floored by the wall clock, so it is above its predecessor's even when
//! Redis lost its counter — which fences any earlier writer of the same prefix. Before the
//! first build it reads back what is published ([`super::seed`]), so an object that is
//! invalid when the loop (re)starts keeps its last good version, as in the Kubernetes
//! mode. Nothing in the folder stops the loop: what cannot be read is reported and keeps
//! its last content ([`crate::source`]); what is still changing is rescanned when the
//! source asks, and the first build waits until the folder was read whole (or, for files
//! that never stop changing, [`FIRST_BUILD_PATIENCE`]).

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;

use super::debounce::{ChangeClass, Debouncer};
use super::seed::{Seed, SeedEvent};
use super::{Built, Pipeline, metrics};
use crate::bus::{BusError, EpochGrant, PublishOutcome, SnapshotRef, wall_clock_epoch_floor};
use crate::jwks::JwksLink;
use crate::retry::{Backoff, Retry, sleep_until_opt};
use crate::source::{DirSource, FolderWatch};
use pilotfish_mesh::push_context::BuildInputs;

/// Why the folder loop stopped (it runs until then).
#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error("cannot watch {dir}: {source}")]
    Watch {
        dir: PathBuf,
        #[source]
        source: notify::Error,
    },
    #[error("the watch on {0} ended")]
    WatchEnded(PathBuf),
    #[error(
        "another writer took over this key prefix (latest: {}); only one folder publisher may write a prefix",
        .current.as_ref().map(ToString::to_string).unwrap_or_else(|| "none".into())
    )]
    Fenced { current: Option<SnapshotRef> },
    #[error(
        "Redis holds epoch {newer}, above this writer's {floor} (taken from the wall clock): another writer of this key prefix started later, or this machine's clock is behind"
    )]
    Superseded { floor: u64, newer: u64 },
}

/// Told about each publish attempt, so a binary can show it on its admin pages.
pub trait FolderObserver: Send + Sync {
    /// After taking the epoch at start.
    fn epoch_taken(&self, _epoch: u64) {}
    /// The published snapshot could not be read back yet (retried; nothing is built).
    fn seed_retrying(&self, _error: &str) {}
    /// After each publish attempt of `built`: `Ok` with what the bus did, or the error
    /// (the loop retries with backoff).
    fn published(&self, built: &Built, outcome: Result<&PublishOutcome, &BusError>);
}

/// How the folder loop runs.
#[derive(Clone, Debug)]
pub struct FolderLoop {
    pub dir: PathBuf,
    /// Mesh config and cluster domain; the folder's objects are added to it.
    pub base: BuildInputs,
    pub debounce_after: Duration,
    pub debounce_max: Duration,
    /// A rescan without a filesystem event, in case an event was missed (network
    /// filesystems, ConfigMap volume swaps).
    pub resync_every: Duration,
    /// The JWKS resolver this loop feeds and reads (`None`: rules that need a fetched key
    /// set fail closed).
    pub jwks: Option<JwksLink>,
}

/// The longest the first build waits for files that keep changing (it always waits for
/// the folder itself to be listable: a build of nothing would publish an empty mesh).
pub const FIRST_BUILD_PATIENCE: Duration = Duration::from_secs(30);

/// Retries after a failed publish or epoch, from 200 ms up to 10 s.
const RETRY: Backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));

impl FolderLoop {
    /// Runs the loop. `seed` reads back what is published (`None`: nothing can be, e.g. a
    /// fresh in-memory bus).
    pub async fn run(
        self,
        mut pipeline: Pipeline,
        seed: Option<Seed>,
        observer: &dyn FolderObserver,
    ) -> Result<(), FolderError> {
        if !self.base.mesh.discovery_selectors.is_empty() {
            // A folder has no namespace labels to select by: say so rather than ignore it.
            tracing::warn!(
                "mesh config discoverySelectors apply to the controller's Kubernetes mode only; every object of the config folder is read"
            );
        }
        let epoch = take_epoch_with_retry(&pipeline).await?;
        observer.epoch_taken(epoch);
        if let Some(mut seed) = seed {
            while let Some(event) = seed.next().await {
                match event {
                    SeedEvent::Retrying { error, .. } => observer.seed_retrying(&error),
                    SeedEvent::Done(Some(previous)) => {
                        pipeline.seed_previous(std::sync::Arc::new(*previous))
                    }
                    SeedEvent::Done(None) => {}
                }
            }
        }
        let mut source = DirSource::new(&self.dir);
        let (mut watch, mut events) =
            FolderWatch::new(&self.dir).map_err(|source| FolderError::Watch {
                dir: self.dir.clone(),
                source,
            })?;
        let mut debounce = Debouncer::new(self.debounce_after, self.debounce_max);
        // The first build happens at once.
        debounce.event(std::time::Instant::now(), ChangeClass::Config);
        let mut pending: Option<Built> = None;
        // The publish of `pending`: scheduled at once after a build, later after a failure.
        let mut publish = Retry::new(RETRY);
        let mut resync = tokio::time::interval(self.resync_every);
        resync.tick().await;
        // A rescan the source asked for (files still changing).
        let mut rescan_at: Option<Instant> = None;
        let started = Instant::now();
        // The first build waits until the folder was read whole once.
        let mut read_whole = false;
        let mut unbuilt_change = false;
        let mut resolved = self.jwks.as_ref().map(|link| link.resolved.clone());
        loop {
            let due = debounce.deadline().map(Instant::from_std);
            tokio::select! {
                event = events.recv() => {
                    let Some(event) = event else {
                        return Err(FolderError::WatchEnded(self.dir.clone()));
                    };
                    source.note(event);
                    debounce.event(std::time::Instant::now(), ChangeClass::Config);
                }
                _ = resync.tick() => debounce.event(std::time::Instant::now(), ChangeClass::Config),
                // Newly fetched key sets: a build of the same files, with them.
                _ = crate::jwks::changed(&mut resolved) => {
                    unbuilt_change = true;
                    debounce.event(std::time::Instant::now(), ChangeClass::Config);
                }
                _ = sleep_until_opt(rescan_at) => {
                    rescan_at = None;
                    debounce.event(std::time::Instant::now(), ChangeClass::Config);
                }
                _ = sleep_until_opt(due) => {
                    let Some(burst) = debounce.take_if_due(std::time::Instant::now()) else { continue };
                    metrics::DEBOUNCE_MERGED.inc_by(burst.events.saturating_sub(1));
                    let report = source.rescan();
                    report.log();
                    watch.follow(source.folders());
                    if let Some(after) = report.retry_after {
                        rescan_at = Some(Instant::now() + after);
                    }
                    // Changes wait with the build they belong to.
                    unbuilt_change |= report.changed;
                    if !read_whole && report.pending > 0 {
                        let root_unlisted = source.skipped().iter().any(|s| s.path.as_os_str().is_empty());
                        if root_unlisted || started.elapsed() < FIRST_BUILD_PATIENCE {
                            continue;
                        }
                        tracing::warn!(pending = report.pending, "files of the config folder keep changing; building without their current content");
                    }
                    read_whole = true;
                    if unbuilt_change || pipeline.previous().is_none() {
                        unbuilt_change = false;
                        let mut base = self.base.clone();
                        if let Some(link) = &self.jwks {
                            base.jwks = link.current();
                        }
                        let built = pipeline.build(source.inputs(base), false).await;
                        if let Some(link) = &self.jwks {
                            // This loop is the only publisher of its prefix: it fetches.
                            link.want(built.context.jwks_sources(), true);
                        }
                        pending = Some(built);
                        publish.reset();
                        publish.schedule_at(Instant::now());
                    }
                }
                _ = sleep_until_opt(publish.deadline()) => {
                    publish.cancel();
                    let Some(built) = pending.take() else { continue };
                    match pipeline.publish(&built).await {
                        Ok(PublishOutcome::Fenced { current }) => {
                            observer.published(&built, Ok(&PublishOutcome::Fenced { current: current.clone() }));
                            return Err(FolderError::Fenced { current });
                        }
                        Ok(outcome) => {
                            if let PublishOutcome::Published(r) = &outcome {
                                tracing::info!(version = r.version, hash = %built.encoded.hash_hex(), build_ms = built.took.as_millis() as u64, "published snapshot");
                            }
                            observer.published(&built, Ok(&outcome));
                        }
                        Err(e) => {
                            let delay = publish.schedule(Instant::now());
                            tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "publish failed; retrying");
                            observer.published(&built, Err(&e));
                            pending = Some(built);
                        }
                    }
                }
            }
        }
    }
}

async fn take_epoch_with_retry(pipeline: &Pipeline) -> Result<u64, FolderError> {
    let mut retry = Retry::new(RETRY);
    // Taken once: a retry after a lost reply must ask for the same floor.
    let floor = wall_clock_epoch_floor();
    loop {
        match pipeline.take_epoch(floor).await {
            Ok(EpochGrant::Taken(epoch)) => {
                tracing::info!(
                    epoch,
                    "took a new epoch; earlier writers of this key prefix are fenced"
                );
                return Ok(epoch);
            }
            Ok(EpochGrant::Superseded { newer }) => {
                return Err(FolderError::Superseded { floor, newer });
            }
            Err(e) => {
                let delay = retry.next_delay();
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "cannot take an epoch yet");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::memory::MemoryBus;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Seen(Mutex<Vec<String>>);

    impl FolderObserver for Seen {
        fn published(&self, built: &Built, outcome: Result<&PublishOutcome, &BusError>) {
            let what = match outcome {
                Ok(PublishOutcome::Published(r)) => format!(
                    "published v{} {}",
                    r.version,
                    built.context.services().len()
                ),
                Ok(other) => format!("{other:?}"),
                Err(e) => format!("error {e}"),
            };
            self.0.lock().unwrap().push(what);
        }
    }

    #[tokio::test]
    async fn publishes_the_folder_and_follows_edits() {
        let dir = tempfile::tempdir().unwrap();
        let svc = |name: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{ports: [{{name: http, port: 80}}]}}\n"
            )
        };
        std::fs::write(dir.path().join("a.yaml"), svc("a")).unwrap();
        let bus = MemoryBus::new();
        let pipeline = Pipeline::new(
            std::sync::Arc::new(bus.publisher()),
            pilotfish_mesh::codec::SnapshotSigner::from_seed([1; 32]),
        );
        let seen = std::sync::Arc::new(Seen::default());
        let looped = FolderLoop {
            dir: dir.path().to_path_buf(),
            base: BuildInputs {
                cluster_domain: "cluster.local".into(),
                ..Default::default()
            },
            debounce_after: Duration::from_millis(20),
            debounce_max: Duration::from_millis(200),
            resync_every: Duration::from_secs(3600),
            jwks: None,
        };
        let observer = seen.clone();
        let task = tokio::spawn(async move { looped.run(pipeline, None, &*observer).await });
        let wait_for = |n: usize| {
            let seen = seen.clone();
            async move {
                for _ in 0..500 {
                    if seen.0.lock().unwrap().len() >= n {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                panic!("no publish within 5 s: {:?}", seen.0.lock().unwrap());
            }
        };
        wait_for(1).await;
        std::fs::write(dir.path().join("b.yaml"), svc("b")).unwrap();
        wait_for(2).await;
        assert_eq!(
            *seen.0.lock().unwrap(),
            ["published v1 1", "published v2 2"]
        );
        assert_eq!(bus.latest().unwrap().version, 2);
        task.abort();
    }
}
