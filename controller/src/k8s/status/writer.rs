//! The status writer: the task that writes what [`super::plan`] decides. It takes the
//! newest [`StatusJob`] from a `watch` channel (a slow writer just sees the latest job),
//! re-checks the Lease claim before every write, patches `/status` (a JSON merge patch
//! conditional on the object's resourceVersion, re-read and re-planned on 409), emits
//! the `InvalidConfig` Event of each newly invalid object ([`EventSink`]), and retries a
//! job with failed writes with backoff ([`RETRY`]) until a newer job replaces it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::events::{Recorder, Reporter};
use pilotfish_mesh::api::{
    AuthorizationPolicy, DestinationRule, IstioStatus, PeerAuthentication, RequestAuthentication,
    ServiceEntry, Sidecar, VirtualService,
};
use pilotfish_mesh::config::{ConfigKey, ConfigKind};
use pilotfish_shared::retry::{Backoff, Retry};
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

use super::plan::{
    Desired, REASON_INVALID, StatusItem, StatusJob, invalid_event, newly_invalid, plan,
};
use crate::k8s::lease::Leadership;
use crate::metrics;

/// Retries of a job with failed writes, from 500 ms up to 30 s.
pub const RETRY: Backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

/// API resource of an Istio kind, for untyped (`DynamicObject`) requests: the status
/// writer must not fail on an object whose spec our types cannot read.
fn api_resource(kind: ConfigKind) -> ApiResource {
    match kind {
        ConfigKind::DestinationRule => ApiResource::erase::<DestinationRule>(&()),
        ConfigKind::ServiceEntry => ApiResource::erase::<ServiceEntry>(&()),
        ConfigKind::PeerAuthentication => ApiResource::erase::<PeerAuthentication>(&()),
        ConfigKind::Sidecar => ApiResource::erase::<Sidecar>(&()),
        ConfigKind::RequestAuthentication => ApiResource::erase::<RequestAuthentication>(&()),
        ConfigKind::AuthorizationPolicy => ApiResource::erase::<AuthorizationPolicy>(&()),
        _ => ApiResource::erase::<VirtualService>(&()),
    }
}

/// How one status write ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Written,
    UpToDate,
    /// Not leading, object gone, or its generation moved on: nothing to retry.
    Skipped,
    /// Worth retrying later.
    Failed,
}

/// Writes statuses for the leader.
pub struct StatusWriter {
    client: Client,
    events: EventSink,
    leadership: watch::Receiver<Leadership>,
    jobs: watch::Receiver<Option<Arc<StatusJob>>>,
    /// Writes whose echo has not reached the store yet: key → (resourceVersion the store
    /// had when we wrote, what we wrote). While the store still shows that version, the
    /// same write is not repeated.
    in_flight: HashMap<ConfigKey, (Option<String>, Desired)>,
    concurrency: usize,
}

/// Errors that end the status writer.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error("the status job channel closed (the controller loop is gone)")]
    Closed,
}

impl StatusWriter {
    pub fn new(
        client: Client,
        events: EventSink,
        leadership: watch::Receiver<Leadership>,
        jobs: watch::Receiver<Option<Arc<StatusJob>>>,
    ) -> Self {
        StatusWriter {
            client,
            events,
            leadership,
            jobs,
            in_flight: HashMap::new(),
            concurrency: 8,
        }
    }

    /// Processes jobs until the channel closes. A job with failed writes is retried with
    /// backoff ([`RETRY`]) until it succeeds or a newer job replaces it.
    pub async fn run(mut self) -> Result<(), StatusError> {
        let mut retry = Retry::new(RETRY);
        let mut failed: Option<Arc<StatusJob>> = None;
        loop {
            let job = match failed.take() {
                Some(job) => {
                    let delay = retry.next_delay();
                    tokio::select! {
                        changed = self.jobs.changed() => {
                            changed.map_err(|_| StatusError::Closed)?;
                            retry.reset();
                            self.jobs.borrow_and_update().clone()
                        }
                        _ = tokio::time::sleep(delay) => Some(job),
                    }
                }
                None => {
                    self.jobs.changed().await.map_err(|_| StatusError::Closed)?;
                    retry.reset();
                    self.jobs.borrow_and_update().clone()
                }
            };
            let Some(job) = job else { continue };
            if self.process(&job).await {
                failed = Some(job);
            }
        }
    }

    /// Runs one job; true when some write failed and is worth retrying.
    async fn process(&mut self, job: &StatusJob) -> bool {
        let keys: BTreeSet<&ConfigKey> = job.items.iter().map(|i| &i.object.key).collect();
        self.in_flight.retain(|k, _| keys.contains(k));
        let now = Timestamp::now();
        let mut todo = Vec::new();
        for item in &job.items {
            let echo_pending = self.in_flight.get(&item.object.key)
                == Some(&(item.object.resource_version.clone(), item.desired.clone()));
            if echo_pending {
                continue;
            }
            match plan(
                item.object.status.as_ref(),
                &item.desired,
                item.object.generation,
                now,
            ) {
                Some(status) => todo.push((item.clone(), status)),
                None => {
                    self.in_flight.remove(&item.object.key);
                }
            }
        }
        if todo.is_empty() {
            return false;
        }
        let this = &*self;
        let results: Vec<(ConfigKey, Option<String>, Desired, Outcome)> =
            futures::stream::iter(todo)
                .map(|(item, status): (StatusItem, IstioStatus)| async move {
                    let outcome = this.write(&item, status).await;
                    (
                        item.object.key,
                        item.object.resource_version,
                        item.desired,
                        outcome,
                    )
                })
                .buffer_unordered(self.concurrency)
                .collect()
                .await;
        let mut failed = false;
        for (key, rv, desired, outcome) in results {
            match outcome {
                Outcome::Written => {
                    self.in_flight.insert(key, (rv, desired));
                }
                Outcome::Failed => failed = true,
                Outcome::UpToDate | Outcome::Skipped => {}
            }
        }
        failed
    }

    fn leading(&self) -> bool {
        self.leadership.borrow().holds(Instant::now())
    }

    /// Writes one object's status; re-reads and retries (at most 3 times) on a conflict.
    async fn write(&self, item: &StatusItem, first_status: IstioStatus) -> Outcome {
        let key = &item.object.key;
        let kind = key.kind.as_str();
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &key.namespace, &api_resource(key.kind));
        let mut status = first_status;
        let mut current = item.object.status.clone();
        let mut resource_version = item.object.resource_version.clone();
        for _ in 0..3 {
            // The claim check: only the leader writes, and only while its claim holds.
            if !self.leading() {
                return Outcome::Skipped;
            }
            let body = json!({
                "metadata": {"resourceVersion": resource_version},
                "status": status,
            });
            match api
                .patch_status(&key.name, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                Ok(_) => {
                    metrics::STATUS_WRITES
                        .with_label_values(&[kind, "written"])
                        .inc();
                    tracing::debug!(object = %key, valid = item.desired.valid, "wrote status");
                    if newly_invalid(current.as_ref(), &item.desired, item.object.generation) {
                        self.events.publish(item).await;
                    }
                    return Outcome::Written;
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => return Outcome::Skipped,
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    metrics::STATUS_WRITES
                        .with_label_values(&[kind, "conflict"])
                        .inc();
                    // Someone changed the object since we read it: read it again and
                    // decide again from what it holds now.
                    let fresh = match api.get_opt(&key.name).await {
                        Ok(Some(o)) => o,
                        Ok(None) => return Outcome::Skipped,
                        Err(e) => {
                            tracing::warn!(object = %key, error = %e, "cannot re-read the object for its status");
                            return Outcome::Failed;
                        }
                    };
                    if fresh.metadata.generation.unwrap_or(0) != item.object.generation {
                        // A new spec: the next build's job handles it.
                        return Outcome::Skipped;
                    }
                    current = fresh
                        .data
                        .get("status")
                        .cloned()
                        .and_then(|s| serde_json::from_value(s).ok());
                    resource_version = fresh.metadata.resource_version.clone();
                    match plan(
                        current.as_ref(),
                        &item.desired,
                        item.object.generation,
                        Timestamp::now(),
                    ) {
                        Some(s) => status = s,
                        None => return Outcome::UpToDate,
                    }
                }
                Err(e) => {
                    metrics::STATUS_WRITES
                        .with_label_values(&[kind, "error"])
                        .inc();
                    tracing::warn!(object = %key, error = %e, "cannot write the status; will retry");
                    return Outcome::Failed;
                }
            }
        }
        Outcome::Failed
    }
}

/// Emits Events through kube-runtime's recorder (events.k8s.io/v1, which `kubectl get
/// events` shows as core v1 Events).
#[derive(Clone)]
pub struct EventSink {
    recorder: Recorder,
}

impl EventSink {
    pub fn new(client: Client, instance: &str) -> Self {
        EventSink {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "pilotfish-controller".into(),
                    instance: Some(instance.to_string()),
                },
            ),
        }
    }

    /// Reports that `item`'s object was rejected ([`invalid_event`]). Failures are
    /// logged and counted: an Event is a courtesy, the status condition is the record.
    pub async fn publish(&self, item: &StatusItem) {
        let (event, reference) = invalid_event(item);
        match self.recorder.publish(&event, &reference).await {
            Ok(()) => {
                metrics::EVENTS_EMITTED
                    .with_label_values(&[REASON_INVALID, "emitted"])
                    .inc();
            }
            Err(e) => {
                metrics::EVENTS_EMITTED
                    .with_label_values(&[REASON_INVALID, "error"])
                    .inc();
                tracing::warn!(object = %item.object.key, error = %e, "cannot emit the InvalidConfig Event");
            }
        }
    }
}
