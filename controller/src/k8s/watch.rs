//! One watch task per kind: a kube-runtime watcher (list, then watch; relist on 410
//! Gone; backoff after errors) over [`Decoded<K>`], so an object that does not decode is
//! reported and skipped instead of failing its list. Objects are trimmed and converted
//! here, off the mode's loop ([`Watched::ingest`]); the initial list and every relist are
//! buffered and handed over whole ([`Change::Relisted`]), so the stores never hold half
//! a list.

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use tokio::sync::mpsc;

use super::decode::Decoded;
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

/// Watches every object of kind `K` in the cluster and sends changes on `tx`.
pub async fn run<K: Watched>(client: Client, tx: mpsc::Sender<Update>) -> Result<(), WatchError>
where
    Decoded<K>: Resource<DynamicType = ()>,
{
    let api: Api<Decoded<K>> = Api::all(client);
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut buffer: Option<Vec<(ObjectKey, Ingested<K::Stored>)>> = None;
    let mut errors: u32 = 0;
    while let Some(event) = stream.next().await {
        let change = match event {
            Ok(Event::Init) => {
                buffer = Some(Vec::new());
                continue;
            }
            Ok(Event::InitApply(object)) => {
                let item = ingest::<K>(object);
                buffer.get_or_insert_with(Vec::new).push(item);
                continue;
            }
            Ok(Event::InitDone) => {
                errors = 0;
                Change::Relisted(buffer.take().unwrap_or_default())
            }
            Ok(Event::Apply(object)) => {
                errors = 0;
                let (key, item) = ingest::<K>(object);
                Change::Apply(key, item)
            }
            Ok(Event::Delete(object)) => {
                errors = 0;
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
    Err(WatchError::Ended(K::KIND))
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
