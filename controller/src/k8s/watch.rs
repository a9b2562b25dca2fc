//! One watch task per kind: a kube-runtime watcher (list, then watch; relist on 410
//! Gone; backoff after errors) over [`Decoded<K>`], so an object that does not decode is
//! reported and skipped instead of failing its list. Objects are trimmed and converted
//! here, off the mode's loop ([`Watched::ingest`]); the initial list and every relist are
//! buffered and handed over whole ([`Change::Relisted`]), so the stores never hold half
//! a list. Namespaced kinds drop objects of namespaces MeshConfig's `discoverySelectors`
//! leave out before anything is buffered or sent ([`super::discovery`]); they start
//! listing once the selection is known and list afresh whenever it changes.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use tokio::sync::{mpsc, watch};

use super::decode::Decoded;
use super::discovery::Selection;
use super::store::{Change, Ingested, ObjectKey, Update, Watched, object_key};
use crate::metrics;

/// Why a watch task ended (it never ends on its own: every end is an error for `main`).
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("the {0} watch stream ended")]
    Ended(&'static str),
    #[error("the controller loop is gone; the {0} watch cannot deliver changes")]
    LoopGone(&'static str),
}

/// Watches every object of kind `K` in the cluster and sends changes on `tx`. With
/// `selection` (namespaced kinds), objects of namespaces it does not allow are dropped as
/// they arrive; the watch waits until the selection is known and restarts with a fresh
/// list each time it selects a namespace it did not (a narrower one only filters).
pub async fn run<K: Watched>(
    client: Client,
    tx: mpsc::Sender<Update>,
    mut selection: Option<watch::Receiver<Arc<Selection>>>,
) -> Result<(), WatchError>
where
    Decoded<K>: Resource<DynamicType = ()>,
{
    loop {
        if let Some(rx) = selection.as_mut() {
            // Nothing can be judged before the namespaces are listed.
            if rx.wait_for(|s| s.is_known()).await.is_err() {
                return Err(WatchError::LoopGone(K::KIND));
            }
            rx.mark_unchanged();
        }
        match watch_once::<K>(client.clone(), &tx, selection.as_mut()).await? {
            Restart::SelectionChanged => {
                tracing::debug!(kind = K::KIND, "namespace selection changed; listing again");
                metrics::K8S_DISCOVERY_RELISTS
                    .with_label_values(&[K::KIND])
                    .inc();
            }
        }
    }
}

enum Restart {
    SelectionChanged,
}

/// One watcher's life: until the stream ends (an error) or the selection changes.
async fn watch_once<K: Watched>(
    client: Client,
    tx: &mpsc::Sender<Update>,
    mut selection: Option<&mut watch::Receiver<Arc<Selection>>>,
) -> Result<Restart, WatchError>
where
    Decoded<K>: Resource<DynamicType = ()>,
{
    // The selection the stores are complete for (narrowed along with the selection).
    let mut listed_with = selection.as_ref().map(|rx| rx.borrow().clone());
    let api: Api<Decoded<K>> = Api::all(client);
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut buffer: Option<Vec<(ObjectKey, Ingested<K::Stored>)>> = None;
    let mut errors: u32 = 0;
    loop {
        let (event, allowed) = tokio::select! {
            event = stream.next() => {
                let Some(event) = event else { return Err(WatchError::Ended(K::KIND)) };
                let allowed = selection.as_ref().map(|rx| rx.borrow().clone());
                (event, allowed)
            }
            changed = changed_opt(selection.as_deref_mut()) => {
                if changed.is_err() {
                    return Err(WatchError::LoopGone(K::KIND));
                }
                // A narrower selection only filters what comes next (the mode loop has
                // dropped the rest); a wider one needs the new namespaces' objects.
                let now = selection.as_ref().map(|rx| rx.borrow().clone());
                let widened = match (&now, &listed_with) {
                    (Some(now), Some(before)) => now.widens(before),
                    _ => false,
                };
                if widened {
                    return Ok(Restart::SelectionChanged);
                }
                listed_with = now;
                continue;
            }
        };
        let keep = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            let kept = allowed
                .as_ref()
                .is_none_or(|s| s.allows(meta.namespace.as_deref().unwrap_or_default()));
            if !kept {
                metrics::K8S_DISCOVERY_DROPPED
                    .with_label_values(&[K::KIND])
                    .inc();
            }
            kept
        };
        let change = match event {
            Ok(Event::Init) => {
                buffer = Some(Vec::new());
                continue;
            }
            Ok(Event::InitApply(object)) => {
                if keep(object.meta()) {
                    let item = ingest::<K>(object);
                    buffer.get_or_insert_with(Vec::new).push(item);
                }
                continue;
            }
            Ok(Event::InitDone) => {
                errors = 0;
                Change::Relisted(buffer.take().unwrap_or_default())
            }
            Ok(Event::Apply(object)) => {
                errors = 0;
                if !keep(object.meta()) {
                    continue;
                }
                let (key, item) = ingest::<K>(object);
                Change::Apply(key, item)
            }
            Ok(Event::Delete(object)) => {
                errors = 0;
                if !keep(object.meta()) {
                    continue;
                }
                Change::Delete(object_key(object.meta()))
            }
            Err(e) => {
                errors = errors.saturating_add(1);
                metrics::K8S_WATCH_ERRORS
                    .with_label_values(&[K::KIND])
                    .inc();
                // First failure loud, then one line in 30: a long outage must not flood.
                if errors == 1 || errors.is_multiple_of(30) {
                    tracing::warn!(kind = K::KIND, failures = errors, "{}", describe::<K>(&e));
                }
                continue;
            }
        };
        if tx.send(Update::new::<K>(change)).await.is_err() {
            return Err(WatchError::LoopGone(K::KIND));
        }
    }
}

/// The selection changing, or never without one (a disabled `select!` branch).
async fn changed_opt(
    rx: Option<&mut watch::Receiver<Arc<Selection>>>,
) -> Result<(), watch::error::RecvError> {
    match rx {
        Some(rx) => rx.changed().await,
        None => std::future::pending().await,
    }
}

fn ingest<K: Watched>(object: Decoded<K>) -> (ObjectKey, Ingested<K::Stored>) {
    let (key, item) = Ingested::from_decoded(object);
    if let Ingested::Failed(failed) = &item {
        metrics::K8S_DECODE_ERRORS
            .with_label_values(&[K::KIND])
            .inc();
        tracing::warn!(
            kind = K::KIND,
            namespace = %key.0,
            name = %key.1,
            generation = failed.generation.unwrap_or(0),
            "cannot read the object, skipped (its last readable version stays in use): {}",
            failed.failure
        );
    }
    (key, item)
}

/// A log line that says what failed and what to do about it.
fn describe<K: Watched>(e: &watcher::Error) -> String {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(&**s),
        watcher::Error::WatchError(s) => Some(&**s),
        _ => None,
    };
    let group = K::group(&());
    match status {
        Some(s) if s.code == 404 && !group.is_empty() => format!(
            "cannot list {}: the API server does not serve {}/{} (are the Istio CRDs installed?); no snapshot is published until every kind is listed",
            K::KIND,
            group,
            K::version(&())
        ),
        Some(s) if s.code == 401 || s.code == 403 => format!(
            "cannot list or watch {}: {} (check the controller's RBAC: list and watch on {})",
            K::KIND,
            s.message,
            K::plural(&())
        ),
        Some(s) => format!(
            "watching {} failed: {} ({}); retrying with backoff",
            K::KIND,
            s.message,
            s.code
        ),
        None => format!("watching {} failed: {e}; retrying with backoff", K::KIND),
    }
}
