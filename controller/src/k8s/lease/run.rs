//! The election's I/O: [`run`] *watches* the Lease (a kube-runtime watcher on one object,
//! so standbys learn of renewals and releases without polling), performs the writes the
//! [`Elector`] asks for with optimistic concurrency (`metadata.resourceVersion`: two
//! candidates racing for a free Lease cannot both win), publishes a [`Leadership`] view
//! through a `watch` channel, and releases the Lease on shutdown.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::elector::{
    Elector, Leadership, LeaseRecord, LeaseTimings, Step, Transition, Write, WriteKind,
    WriteResult, desired_spec,
};
use crate::metrics;

/// Where the Lease lives and who we are.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub timings: LeaseTimings,
}

/// Errors that end the election loop.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("the watch on Lease {namespace}/{name} ended")]
    WatchEnded { namespace: String, name: String },
    #[error("nobody listens to leadership changes any more")]
    Closed,
}

/// Runs the election until `shutdown` is cancelled (then releases the Lease if held).
/// Leadership changes are sent on `tx`.
pub async fn run(
    api: Api<Lease>,
    config: LeaseConfig,
    tx: watch::Sender<Leadership>,
    shutdown: CancellationToken,
) -> Result<(), LeaseError> {
    let mut elector = Elector::new(&config.identity, config.timings);
    let default_duration = config.timings.lease_duration;
    let selector = format!("metadata.name={}", config.name);
    let events = watcher::watcher(api.clone(), watcher::Config::default().fields(&selector))
        .default_backoff();
    let mut events = std::pin::pin!(events);
    // The watcher reports a listed set at once (InitDone); until then we know nothing.
    let mut listed: Option<Option<LeaseRecord>> = None;
    let mut watch_errors: u32 = 0;
    loop {
        let now = Instant::now();
        let (transition, step) = elector.tick(now);
        announce(&elector, transition, &tx, &config)?;
        let step = match step {
            // Before the first list completes, the watch will tell us; a re-read after a
            // conflict is a plain GET.
            Step::Refresh if listed.is_none() => Step::Wait(now + config.timings.retry_period),
            other => other,
        };
        match step {
            Step::Refresh => {
                let observed = match api.get_opt(&config.name).await {
                    Ok(lease) => lease.map(|l| LeaseRecord::from_lease(&l, default_duration)),
                    Err(e) => {
                        tracing::warn!(error = %e, lease = %config.name, "cannot read the Lease; retrying");
                        tokio::select! {
                            _ = tokio::time::sleep(config.timings.retry_period) => {}
                            () = shutdown.cancelled() => return release(&api, &config, &mut elector, &tx).await,
                        }
                        continue;
                    }
                };
                let t = elector.observe(observed, Instant::now());
                announce(&elector, t, &tx, &config)?;
            }
            Step::Write(write) => {
                let sent_at = Instant::now();
                let result = send(&api, &config, &write).await;
                let t = elector.on_written(&write, result, sent_at, Instant::now());
                announce(&elector, t, &tx, &config)?;
            }
            Step::Wait(until) => {
                tokio::select! {
                    event = events.next() => match event {
                        Some(Ok(event)) => {
                            watch_errors = 0;
                            if let Some(observed) = lease_event(event, &mut listed, default_duration) {
                                let t = elector.observe(observed, Instant::now());
                                announce(&elector, t, &tx, &config)?;
                            }
                        }
                        Some(Err(e)) => {
                            watch_errors += 1;
                            metrics::K8S_WATCH_ERRORS.with_label_values(&["Lease"]).inc();
                            if watch_errors == 1 || watch_errors.is_multiple_of(30) {
                                tracing::warn!(error = %e, lease = %config.name, "the Lease watch failed; it is retried with backoff");
                            }
                        }
                        None => return Err(LeaseError::WatchEnded {
                            namespace: config.namespace.clone(),
                            name: config.name.clone(),
                        }),
                    },
                    _ = tokio::time::sleep_until(until) => {}
                    () = shutdown.cancelled() => return release(&api, &config, &mut elector, &tx).await,
                }
            }
        }
    }
}

/// Folds one watcher event into "what the Lease is now", when that is known.
fn lease_event(
    event: watcher::Event<Lease>,
    listed: &mut Option<Option<LeaseRecord>>,
    default_duration: Duration,
) -> Option<Option<LeaseRecord>> {
    match event {
        watcher::Event::Init => {
            *listed = Some(None);
            None
        }
        watcher::Event::InitApply(lease) => {
            *listed = Some(Some(LeaseRecord::from_lease(&lease, default_duration)));
            None
        }
        watcher::Event::InitDone => listed.clone(),
        watcher::Event::Apply(lease) => {
            let record = LeaseRecord::from_lease(&lease, default_duration);
            *listed = Some(Some(record.clone()));
            Some(Some(record))
        }
        watcher::Event::Delete(_) => {
            *listed = Some(None);
            Some(None)
        }
    }
}

async fn send(api: &Api<Lease>, config: &LeaseConfig, write: &Write) -> WriteResult {
    let spec = desired_spec(write, &config.identity, &config.timings, Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            namespace: Some(config.namespace.clone()),
            resource_version: write.resource_version.clone(),
            ..Default::default()
        },
        spec: Some(spec),
    };
    // A write that hangs must not outlive our claim.
    let timeout = config.timings.renew_deadline;
    let request = async {
        match write.kind {
            WriteKind::Create => api.create(&PostParams::default(), &lease).await,
            _ => {
                api.replace(&config.name, &PostParams::default(), &lease)
                    .await
            }
        }
    };
    match tokio::time::timeout(timeout, request).await {
        Ok(Ok(lease)) => WriteResult::Written(LeaseRecord::from_lease(
            &lease,
            config.timings.lease_duration,
        )),
        // A create that finds nothing to create in: the namespace is missing. Not a race.
        Ok(Err(kube::Error::Api(status)))
            if write.kind == WriteKind::Create && status.is_not_found() =>
        {
            tracing::warn!(lease = %config.name, namespace = %config.namespace, "cannot create the Lease: {} (does the namespace exist? set --lease-namespace)", status.message);
            WriteResult::Failed
        }
        // 409, or the Lease was created or deleted since we looked: someone else wrote.
        Ok(Err(kube::Error::Api(status)))
            if status.is_conflict() || status.is_already_exists() || status.is_not_found() =>
        {
            tracing::debug!(kind = ?write.kind, reason = %status.reason, "Lease write lost a race; re-reading");
            WriteResult::Conflict
        }
        Ok(Err(e)) => {
            tracing::warn!(kind = ?write.kind, error = %e, lease = %config.name, "Lease write failed");
            WriteResult::Failed
        }
        Err(_) => {
            tracing::warn!(kind = ?write.kind, after = ?timeout, lease = %config.name, "Lease write timed out");
            WriteResult::Failed
        }
    }
}

async fn release(
    api: &Api<Lease>,
    config: &LeaseConfig,
    elector: &mut Elector,
    tx: &watch::Sender<Leadership>,
) -> Result<(), LeaseError> {
    let Some(write) = elector.release() else {
        return Ok(());
    };
    // Stop leading before the Lease says so: nothing may publish after the release.
    let mut stepping_down = elector.leadership();
    stepping_down.leader = false;
    stepping_down.valid_until = None;
    let _ = tx.send(stepping_down);
    let sent_at = Instant::now();
    let result = send(api, config, &write).await;
    let t = elector.on_written(&write, result.clone(), sent_at, Instant::now());
    if matches!(result, WriteResult::Written(_)) {
        tracing::info!(lease = %config.name, "released the Lease on shutdown");
    }
    let _ = announce(elector, t, tx, config);
    Ok(())
}

/// Sends the current leadership (only when it changed) and logs transitions.
fn announce(
    elector: &Elector,
    transition: Option<Transition>,
    tx: &watch::Sender<Leadership>,
    config: &LeaseConfig,
) -> Result<(), LeaseError> {
    match &transition {
        Some(Transition::Acquired) => {
            metrics::LEADER_TRANSITIONS
                .with_label_values(&["acquired"])
                .inc();
            tracing::info!(identity = %config.identity, lease = %format!("{}/{}", config.namespace, config.name), "acquired the Lease: leading");
        }
        Some(Transition::Lost(reason)) => {
            metrics::LEADER_TRANSITIONS
                .with_label_values(&["lost"])
                .inc();
            tracing::warn!(identity = %config.identity, %reason, "lost the Lease: standing by");
        }
        None => {}
    }
    let now = elector.leadership();
    tx.send_if_modified(|current| {
        if *current == now {
            false
        } else {
            *current = now;
            true
        }
    });
    if tx.is_closed() {
        return Err(LeaseError::Closed);
    }
    Ok(())
}
