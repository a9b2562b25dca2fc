//! Watch streams: one task per watch reads the store's change history from its cursor
//! whenever the global revision moves, and writes one `{"type","object"}` JSON line per
//! event. Implements `resourceVersion` resume, synthetic `ADDED` events for a fresh
//! watch, selectors (objects leaving a selection are `DELETED`), bookmarks, WatchList
//! (`sendInitialEvents` ending with the `k8s.io/initial-events-end` bookmark), the
//! in-stream `ERROR` 410 for a cursor older than the history, and `timeoutSeconds`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::Shared;
use super::convert::to_served;
use super::error::ApiError;
use super::registry::ResourceType;
use super::selector::{FieldSelector, LabelSelector};
use super::store::{Change, ChangeKind};

/// How often a watch that asked for bookmarks gets one.
const BOOKMARK_INTERVAL: Duration = Duration::from_secs(10);
/// Watches without `timeoutSeconds` end after this long (upstream: 30–60 minutes).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Synthetic `ADDED` for every current object, then changes (`resourceVersion`
    /// unset or `"0"`).
    Now,
    /// Changes after this revision.
    After(u64),
}

#[derive(Debug)]
pub struct WatchRequest {
    pub rt: Arc<ResourceType>,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub start: Start,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Option<Duration>,
}

impl WatchRequest {
    fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }

    fn in_scope(&self, namespace: &str) -> bool {
        match &self.namespace {
            Some(ns) if self.rt.namespaced => ns == namespace,
            _ => true,
        }
    }

    /// The event this watch sees for a change, if any.
    fn event_for(&self, change: &Change) -> Option<(&'static str, Value)> {
        if change.storage != self.rt.storage || !self.in_scope(&change.namespace) {
            return None;
        }
        let now = to_served(&change.object, &self.rt);
        let now_matches = self.matches(&now);
        let was_matching = change
            .previous
            .as_ref()
            .is_some_and(|p| self.matches(&to_served(p, &self.rt)));
        let kind = match (change.kind, was_matching, now_matches) {
            (ChangeKind::Deleted, _, true) => "DELETED",
            (ChangeKind::Deleted, _, false) => return None,
            (ChangeKind::Added, _, true) | (ChangeKind::Modified, false, true) => "ADDED",
            (ChangeKind::Modified, true, true) => "MODIFIED",
            (ChangeKind::Modified, true, false) => "DELETED",
            _ => return None,
        };
        Some((kind, now))
    }

    fn bookmark(&self, revision: u64, initial_events_end: bool) -> Value {
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": metadata})
    }
}

fn line(kind: &str, object: Value) -> Bytes {
    let mut bytes =
        serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn too_old(cursor: u64, floor: u64) -> Bytes {
    let error = ApiError::expired(format!("too old resource version: {cursor} ({floor})"));
    line("ERROR", error.to_status())
}

/// Starts the watch task and returns the streaming response.
pub fn respond(shared: Arc<Shared>, request: WatchRequest) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(run(shared, request, tx));
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, Infallible>));
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(body)
        .unwrap_or_else(|_| Response::new(Body::empty()))
}

async fn run(shared: Arc<Shared>, request: WatchRequest, tx: mpsc::Sender<Bytes>) {
    // Subscribe before reading the store, so no commit between the two goes unnoticed.
    let mut revisions = shared.revisions.clone();
    revisions.borrow_and_update();
    let mut shutdown = shared.shutdown.clone();
    let started = {
        let store = shared.lock();
        match request.start {
            Start::After(revision) if !request.send_initial_events => {
                if revision < store.history_floor() {
                    Err(too_old(revision, store.history_floor()))
                } else {
                    Ok((Vec::new(), revision))
                }
            }
            _ => {
                let namespace = request
                    .namespace
                    .as_deref()
                    .filter(|_| request.rt.namespaced);
                let objects: Vec<Value> = store
                    .objects_in(&request.rt.storage, namespace)
                    .iter()
                    .map(|o| to_served(o, &request.rt))
                    .filter(|o| request.matches(o))
                    .collect();
                Ok((objects, store.revision()))
            }
        }
    };
    let (initial, mut cursor) = match started {
        Ok(started) => started,
        Err(gone) => {
            let _ = tx.send(gone).await;
            return;
        }
    };
    for object in initial {
        if tx.send(line("ADDED", object)).await.is_err() {
            return;
        }
    }
    if request.send_initial_events
        && tx
            .send(line("BOOKMARK", request.bookmark(cursor, true)))
            .await
            .is_err()
    {
        return;
    }
    let deadline = tokio::time::sleep(request.timeout.unwrap_or(DEFAULT_TIMEOUT));
    tokio::pin!(deadline);
    let mut bookmarks = tokio::time::interval(BOOKMARK_INTERVAL);
    bookmarks.tick().await;
    // The first pass catches up from a resumed `resourceVersion` to now.
    let mut catch_up = true;
    loop {
        if catch_up && !forward_changes(&shared, &request, &mut cursor, &tx).await {
            return;
        }
        catch_up = false;
        tokio::select! {
            changed = revisions.changed() => {
                if changed.is_err() {
                    return;
                }
                catch_up = true;
            }
            _ = bookmarks.tick(), if request.bookmarks => {
                if tx.send(line("BOOKMARK", request.bookmark(cursor, false))).await.is_err() {
                    return;
                }
            }
            _ = &mut deadline => return,
            _ = shutdown.changed() => return,
            _ = tx.closed() => return,
        }
    }
}

/// Sends the events of every change after `cursor`; false when the watch must end
/// (client gone, or the history no longer reaches back to `cursor`).
async fn forward_changes(
    shared: &Shared,
    request: &WatchRequest,
    cursor: &mut u64,
    tx: &mpsc::Sender<Bytes>,
) -> bool {
    let batch = {
        let store = shared.lock();
        store.changes_after(*cursor).ok_or(store.history_floor())
    };
    let changes = match batch {
        Ok(changes) => changes,
        Err(floor) => {
            let _ = tx.send(too_old(*cursor, floor)).await;
            return false;
        }
    };
    for change in changes {
        *cursor = change.revision;
        if let Some((kind, object)) = request.event_for(&change)
            && tx.send(line(kind, object)).await.is_err()
        {
            return false;
        }
    }
    true
}
