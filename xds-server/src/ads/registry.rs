//! The connection registry: one entry per open ADS stream with what the admin pages
//! (`/debug/adsz`, `/debug/syncz`) show — proxy id, peer, connect time, and per type URL
//! the subscription, the last response sent, the last ACK and the last NACK.
//!
//! An entry holds what does not change for the stream's life, and a handle on the
//! stream's state machine ([`LiveStatus`]), which owns the per-type records: a page reads
//! them when it is asked for, so a stream copies nothing here on its events (a copy per
//! stream was ~1.4 KiB of memory and a few allocations per request). The entry disappears
//! when the stream's [`StreamHandle`] is dropped, so a stream that ends for any reason
//! never lingers here. Locks are taken registry first, then a stream's machine; a stream
//! never takes the registry's lock while holding its machine's.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use pilotfish_mesh::model::Proxy;
use serde::Serialize;

use super::grpc::StreamMeter;
use super::state::{TypeStatus, rfc3339};
use super::types::XdsType;
use crate::metrics;

/// The protocol flavour of a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StreamMode {
    Sotw,
    Delta,
}

/// Everything the admin pages show about one ADS stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StreamStatus {
    /// Registry id, unique on this replica.
    pub stream_id: u64,
    /// The parsed identity, for pages that regenerate a proxy's configuration
    /// (`/debug/config_dump?proxyID=`); the JSON shows its main fields below instead.
    #[serde(skip)]
    pub proxy: Arc<Proxy>,
    pub proxy_id: String,
    pub namespace: String,
    /// The SPIFFE identity the stream authenticated as (secure port only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    pub proxyless: bool,
    pub istio_version: Option<String>,
    pub peer: Option<String>,
    pub mode: StreamMode,
    #[serde(serialize_with = "rfc3339")]
    pub connected_at: SystemTime,
    /// Publisher version of the snapshot the stream's last responses were computed from.
    pub snapshot_version: Option<u64>,
    pub types: Vec<TypeStatus>,
    /// Type URLs the client asked for that this server does not serve.
    pub unknown_type_urls: Vec<String>,
    /// Responses and bytes handed to the transport, and bytes not yet taken by it.
    #[serde(serialize_with = "meter")]
    pub transport: Arc<StreamMeter>,
}

impl PartialEq for StreamMeter {
    /// Meters are live counters: two are equal only if they are the same meter.
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for StreamMeter {}

fn meter<S: serde::Serializer>(meter: &Arc<StreamMeter>, serializer: S) -> Result<S::Ok, S::Error> {
    meter.as_ref().serialize(serializer)
}

/// One row of `/debug/syncz`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SyncStatus {
    pub proxy_id: String,
    pub stream_id: u64,
    pub istio_version: Option<String>,
    /// Short type name (`cds`, `eds`, `lds`, `rds`) → state.
    pub types: BTreeMap<String, TypeSync>,
}

/// Sync state of one type on one stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TypeSync {
    pub state: &'static str,
    pub sent: Option<String>,
    pub acked: Option<String>,
}

/// What a stream's state machine reports when a page asks: the publisher version of the
/// snapshot it answers from, its per-type records and the type URLs it does not serve.
pub trait LiveStatus: Send + Sync {
    fn live(&self) -> (u64, Vec<TypeStatus>, Vec<String>);
}

/// One stream's entry: what is fixed for its life (its `types`, `snapshot_version` and
/// `unknown_type_urls` empty), and where the rest is read.
struct Entry {
    fixed: StreamStatus,
    live: Arc<dyn LiveStatus>,
}

impl Entry {
    fn status(&self) -> StreamStatus {
        let (version, types, unknown) = self.live.live();
        StreamStatus {
            snapshot_version: Some(version),
            types,
            unknown_type_urls: unknown,
            ..self.fixed.clone()
        }
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.fixed.fmt(f)
    }
}

/// The open ADS streams of this replica. Cheap to clone (shared handle).
#[derive(Clone, Debug, Default)]
pub struct ConnectionRegistry {
    streams: Arc<Mutex<BTreeMap<u64, Entry>>>,
    next_id: Arc<AtomicU64>,
}

impl ConnectionRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Entry>> {
        // A panic while holding the lock cannot leave the map half-updated (every
        // update inserts or removes one entry), so a poisoned lock is still safe to use.
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a stream whose per-type records `live` reports; it is removed when the
    /// returned handle is dropped.
    pub fn register(&self, mut status: StreamStatus, live: Arc<dyn LiveStatus>) -> StreamHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        status.stream_id = id;
        self.lock().insert(
            id,
            Entry {
                fixed: status,
                live,
            },
        );
        metrics::XDS_CLIENTS.inc();
        StreamHandle {
            registry: self.clone(),
            id,
        }
    }

    /// Number of open streams.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every open stream, ordered by id.
    pub fn streams(&self) -> Vec<StreamStatus> {
        self.lock().values().map(Entry::status).collect()
    }

    /// Streams of one proxy id (a proxy may hold more than one, e.g. while reconnecting).
    pub fn streams_of(&self, proxy_id: &str) -> Vec<StreamStatus> {
        self.lock()
            .values()
            .filter(|e| e.fixed.proxy_id == proxy_id)
            .map(Entry::status)
            .collect()
    }

    /// The identity of a connected proxy (its newest stream), if connected here.
    pub fn proxy(&self, proxy_id: &str) -> Option<Arc<Proxy>> {
        self.lock()
            .values()
            .rev()
            .find(|e| e.fixed.proxy_id == proxy_id)
            .map(|e| e.fixed.proxy.clone())
    }

    /// The `/debug/adsz` document: `{"totalClients": n, "clients": [...]}`.
    pub fn adsz(&self) -> serde_json::Value {
        let streams = self.streams();
        serde_json::json!({
            "totalClients": streams.len(),
            "clients": streams,
        })
    }

    /// The `/debug/syncz` rows.
    pub fn syncz(&self) -> Vec<SyncStatus> {
        self.streams()
            .iter()
            .map(|s| SyncStatus {
                proxy_id: s.proxy_id.clone(),
                stream_id: s.stream_id,
                istio_version: s.istio_version.clone(),
                types: s
                    .types
                    .iter()
                    .map(|t| {
                        let short = XdsType::from_type_url(&t.type_url)
                            .map_or(t.type_url.clone(), |x| x.short_name().to_string());
                        let sync = TypeSync {
                            state: t.sync_state(),
                            sent: t.last_sent.as_ref().map(|x| x.version.clone()),
                            acked: t.last_ack.as_ref().map(|x| x.version.clone()),
                        };
                        (short, sync)
                    })
                    .collect(),
            })
            .collect()
    }
}

/// A stream's entry in the registry; dropping it removes the entry.
#[derive(Debug)]
pub struct StreamHandle {
    registry: ConnectionRegistry,
    id: u64,
}

impl StreamHandle {
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
        metrics::XDS_CLIENTS.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::state::SentStatus;
    use std::time::UNIX_EPOCH;

    fn status(proxy: &str) -> StreamStatus {
        StreamStatus {
            stream_id: 0,
            proxy: Arc::new(Proxy::with_defaults(proxy)),
            proxy_id: proxy.into(),
            namespace: "default".into(),
            identity: None,
            proxyless: false,
            istio_version: None,
            peer: None,
            mode: StreamMode::Sotw,
            connected_at: UNIX_EPOCH,
            snapshot_version: None,
            types: vec![],
            unknown_type_urls: vec![],
            transport: Arc::default(),
        }
    }

    /// A stream reporting whatever the test last put here.
    struct Fixed(Mutex<(u64, Vec<TypeStatus>, Vec<String>)>);

    impl LiveStatus for Fixed {
        fn live(&self) -> (u64, Vec<TypeStatus>, Vec<String>) {
            self.0.lock().unwrap().clone()
        }
    }

    #[test]
    fn entries_live_as_long_as_their_handle() {
        let registry = ConnectionRegistry::new();
        let a_live = Arc::new(Fixed(Mutex::new((0, vec![], vec![]))));
        let a = registry.register(status("a"), a_live.clone());
        let b = registry.register(status("b"), Arc::new(Fixed(Mutex::default())));
        assert_ne!(a.id(), b.id());
        assert_eq!(registry.len(), 2);
        let sent = TypeStatus {
            type_url: crate::ads::types::CLUSTER_TYPE.into(),
            wildcard: true,
            subscribed: crate::ads::names::NameSet::empty(),
            last_sent: Some(SentStatus {
                version: "v1".into(),
                nonce: "1".into(),
                at: UNIX_EPOCH,
                resources: 1,
                removed: 0,
            }),
            last_ack: None,
            last_nack: None,
            client_holds: 0,
        };
        // What the stream reports when asked, not a copy made before.
        *a_live.0.lock().unwrap() = (7, vec![sent], vec!["type.googleapis.com/x".into()]);
        let doc = registry.adsz();
        assert_eq!(doc["totalClients"], 2);
        assert_eq!(doc["clients"][0]["snapshot_version"], 7);
        assert_eq!(
            doc["clients"][0]["types"][0]["last_sent"]["at"],
            "1970-01-01T00:00:00.000Z"
        );
        let sync = registry.syncz();
        assert_eq!(sync[0].types["cds"].state, "STALE");
        drop(a);
        assert_eq!(registry.streams_of("a").len(), 0);
        assert_eq!(registry.streams_of("b").len(), 1);
        assert_eq!(
            registry.proxy("b").map(|p| p.namespace.clone()).as_deref(),
            Some("default")
        );
        assert!(registry.proxy("a").is_none());
    }
}
