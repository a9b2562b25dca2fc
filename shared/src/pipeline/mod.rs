//! From builder inputs to a published snapshot: build and encode (CPU work, off the async
//! threads), then publish through the bus. The pipeline owns the previous snapshot: the
//! builder keeps an object's last accepted version from it when an edit is invalid, and
//! the endpoint-only path starts from it.
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

use crate::bus::{BusError, EncodedSnapshot, PublishOutcome, SnapshotPublisher};
use pilotfish_mesh::codec::{self, Encoded};
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
    previous: Option<Arc<PushContext>>,
    /// Findings of the last full build, to report only what is new.
    reported: BTreeSet<ConfigError>,
}

impl Pipeline {
    pub fn new(publisher: Arc<dyn SnapshotPublisher>) -> Self {
        Pipeline {
            publisher,
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
        let previous = self.previous.clone();
        let started = Instant::now();
        // Building a large mesh takes a good fraction of a second of CPU: keep it off the
        // async worker threads so the admin server and the Lease keep answering.
        let built = tokio::task::spawn_blocking(move || match (&previous, endpoints_only) {
            (Some(prev), true) => {
                let context = build_endpoints_only(&inputs, prev);
                (context, Vec::new(), Vec::new(), true)
            }
            _ => {
                let out = build(&inputs, previous.as_deref());
                (out.context, out.findings, out.kept_previous, false)
            }
        })
        .await;
        let (context, findings, kept_previous, endpoints_only) = match built {
            Ok(b) => b,
            // A panic in the builder is a bug; surface it instead of serving nothing new.
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        let context = Arc::new(context);
        let encoded = codec::encode(&context);
        let took = started.elapsed();
        let path = if endpoints_only { "endpoints" } else { "full" };
        metrics::BUILD_TIME
            .with_label_values(&[path])
            .observe(took.as_secs_f64());
        metrics::REBUILDS.with_label_values(&[path]).inc();
        if !endpoints_only {
            self.report(&findings);
        }
        self.previous = Some(context.clone());
        Built {
            context,
            encoded,
            findings,
            kept_previous,
            endpoints_only,
            took,
        }
    }

    /// Publishes a built snapshot.
    pub async fn publish(&self, built: &Built) -> Result<PublishOutcome, BusError> {
        self.publisher
            .publish(EncodedSnapshot {
                bytes: built.encoded.bytes.clone().into(),
                hash: built.encoded.hash_hex(),
            })
            .await
    }

    pub async fn take_epoch(&self) -> Result<u64, BusError> {
        self.publisher.take_epoch().await
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::memory::MemoryBus;
    use pilotfish_mesh::synthetic::{MeshShape, mesh};

    #[tokio::test]
    async fn builds_publishes_and_takes_the_cheap_path_for_endpoints() {
        let bus = MemoryBus::new();
        let mut pipeline = Pipeline::new(Arc::new(bus.publisher()));
        pipeline.take_epoch().await.unwrap();
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
