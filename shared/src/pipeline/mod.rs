//! From builder inputs to a published snapshot: build, encode and sign (CPU work, off the
//! async threads), then publish through the bus. The pipeline owns the previous snapshot:
//! the builder keeps an object's last accepted version from it when an edit is invalid,
//! and the endpoint-only path starts from it. It holds the signing key; the bus only ever
//! sees signed blobs.
//!
//! - [`Pipeline`]: one build + publish at a time, with findings logged once and counted.
//! - [`debounce`]: bursts of changes become one rebuild.
//! - [`folder`]: the loop that turns a folder of YAML into published snapshots (the
//!   controller's `--config-dir` mode and the xDS server's standalone mode).
//! - [`seed`]: reading back what is published, as a restarted builder's "previous".

pub mod debounce;
pub mod folder;
pub mod metrics;
pub mod seed;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::bus::{BusError, EncodedSnapshot, EpochGrant, PublishOutcome, SnapshotPublisher};
use pilotfish_mesh::codec::{self, Encoded, SnapshotSigner};
use pilotfish_mesh::config::{ConfigError, ConfigKey, ConfigKind};
use pilotfish_mesh::push_context::{BuildInputs, PushContext, build, build_endpoints_only};

/// One built snapshot, ready to publish.
#[derive(Debug)]
pub struct Built {
    pub context: Arc<PushContext>,
    pub encoded: Encoded,
    /// Every finding of the full build (empty on the endpoint path: configs did not change,
    /// so the previous findings still hold).
    pub findings: Vec<ConfigError>,
    pub kept_previous: Vec<ConfigKey>,
    pub endpoints_only: bool,
    pub took: Duration,
}

/// Builds and publishes snapshots for one controller.
pub struct Pipeline {
    publisher: Arc<dyn SnapshotPublisher>,
    signer: Arc<SnapshotSigner>,
    previous: Option<Arc<PushContext>>,
    /// Findings of the last full build, to report only what is new.
    reported: BTreeSet<ConfigError>,
}

impl Pipeline {
    pub fn new(publisher: Arc<dyn SnapshotPublisher>, signer: SnapshotSigner) -> Self {
        Pipeline {
            publisher,
            signer: Arc::new(signer),
            previous: None,
            reported: BTreeSet::new(),
        }
    }

    pub fn previous(&self) -> Option<&Arc<PushContext>> {
        self.previous.as_ref()
    }

    /// Gives a pipeline that has built nothing yet a previous snapshot: what is already
    /// published. A restarted controller seeds it so that objects invalid at restart keep
    /// their last accepted version instead of dropping out. Ignored once a build happened.
    pub fn seed_previous(&mut self, previous: Arc<PushContext>) {
        if self.previous.is_none() {
            self.previous = Some(previous);
        }
    }

    /// Builds a snapshot from `inputs`. `endpoints_only` takes the cheap path when there is
    /// a previous snapshot to start from.
    pub async fn build(&mut self, inputs: BuildInputs, endpoints_only: bool) -> Built {
        let built = self.start_build(inputs, endpoints_only).await;
        self.finish_build(&built);
        built
    }

    /// The CPU part of [`build`](Self::build) as a future of its own (for a loop that
    /// keeps handling events meanwhile); hand its result to
    /// [`finish_build`](Self::finish_build).
    pub fn start_build(
        &self,
        inputs: BuildInputs,
        endpoints_only: bool,
    ) -> impl Future<Output = Built> + Send + 'static {
        let previous = self.previous.clone();
        let signer = self.signer.clone();
        async move {
            let started = Instant::now();
            // Building and encoding a large mesh take a good fraction of a second of CPU:
            // keep them off the async worker threads so the admin server and the Lease
            // keep answering.
            let built = tokio::task::spawn_blocking(move || {
                let (context, findings, kept_previous, endpoints_only) =
                    match (&previous, endpoints_only) {
                        (Some(prev), true) => {
                            let context = build_endpoints_only(&inputs, prev);
                            (context, Vec::new(), Vec::new(), true)
                        }
                        _ => {
                            let out = build(&inputs, previous.as_deref());
                            (out.context, out.findings, out.kept_previous, false)
                        }
                    };
                let encoded = codec::encode(&context, &signer);
                (context, encoded, findings, kept_previous, endpoints_only)
            })
            .await;
            let (context, encoded, findings, kept_previous, endpoints_only) = match built {
                Ok(b) => b,
                // A panic in the builder is a bug; surface it instead of serving nothing new.
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
            Built {
                context: Arc::new(context),
                encoded,
                findings,
                kept_previous,
                endpoints_only,
                took: started.elapsed(),
            }
        }
    }

    /// Takes `built` as the previous snapshot of the next build, reports its findings and
    /// records its metrics.
    pub fn finish_build(&mut self, built: &Built) {
        let path = if built.endpoints_only {
            "endpoints"
        } else {
            "full"
        };
        metrics::BUILD_TIME
            .with_label_values(&[path])
            .observe(built.took.as_secs_f64());
        metrics::REBUILDS.with_label_values(&[path]).inc();
        if !built.endpoints_only {
            self.report(&built.findings);
        }
        self.previous = Some(built.context.clone());
    }

    /// Publishes a built snapshot.
    pub async fn publish(&self, built: &Built) -> Result<PublishOutcome, BusError> {
        self.publisher.publish(snapshot_of(built)).await
    }

    /// The bus this pipeline publishes to (for a publish run as a task of its own).
    pub fn publisher(&self) -> Arc<dyn SnapshotPublisher> {
        self.publisher.clone()
    }

    /// Takes `floor` as the epoch; see [`SnapshotPublisher::take_epoch`].
    pub async fn take_epoch(&self, floor: u64) -> Result<EpochGrant, BusError> {
        self.publisher.take_epoch(floor).await
    }

    /// Gives up the epoch (leadership ended); see [`SnapshotPublisher::resign`].
    pub async fn resign(&self) {
        self.publisher.resign().await
    }

    /// Logs findings not reported before and updates the invalid-config gauges.
    fn report(&mut self, findings: &[ConfigError]) {
        let current: BTreeSet<ConfigError> = findings.iter().cloned().collect();
        for f in current.difference(&self.reported) {
            if f.is_error() {
                tracing::warn!(kind = %f.key.kind, namespace = %f.key.namespace, name = %f.key.name, path = %f.path, "invalid config left out: {}", f.message);
            } else {
                tracing::info!(kind = %f.key.kind, namespace = %f.key.namespace, name = %f.key.name, path = %f.path, "config warning: {}", f.message);
            }
        }
        let mut invalid: BTreeMap<ConfigKind, BTreeSet<&ConfigKey>> = BTreeMap::new();
        for f in findings.iter().filter(|f| f.is_error()) {
            invalid.entry(f.key.kind).or_default().insert(&f.key);
        }
        // Every kind, so a kind whose last invalid object was fixed goes back to 0.
        for kind in ConfigKind::ALL {
            let n = invalid.get(&kind).map(BTreeSet::len).unwrap_or(0);
            metrics::INVALID_CONFIGS
                .with_label_values(&[kind.as_str()])
                .set(n as i64);
        }
        self.reported = current;
    }
}

/// What the bus is given for `built`.
pub fn snapshot_of(built: &Built) -> EncodedSnapshot {
    EncodedSnapshot {
        bytes: built.encoded.bytes.clone().into(),
        hash: built.encoded.hash_hex(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::memory::MemoryBus;
    use pilotfish_mesh::synthetic::{MeshShape, mesh};

    #[tokio::test]
    async fn builds_publishes_and_takes_the_cheap_path_for_endpoints() {
        let bus = MemoryBus::new();
        let mut pipeline = Pipeline::new(
            Arc::new(bus.publisher()),
            SnapshotSigner::from_seed([1; 32]),
        );
        pipeline.take_epoch(1).await.unwrap();
        let inputs = mesh(MeshShape::standard(20));
        let first = pipeline.build(inputs.clone(), true).await;
        assert!(!first.endpoints_only, "no previous snapshot: a full build");
        assert!(matches!(
            pipeline.publish(&first).await.unwrap(),
            PublishOutcome::Published(_)
        ));
        // Same content: the bus sees an unchanged hash.
        let again = pipeline.build(inputs.clone(), false).await;
        assert!(matches!(
            pipeline.publish(&again).await.unwrap(),
            PublishOutcome::Unchanged(_)
        ));
        let cheap = pipeline.build(inputs, true).await;
        assert!(cheap.endpoints_only);
        assert_eq!(cheap.encoded.hash_hex(), first.encoded.hash_hex());
    }
}
