//! The connection registry: one entry per open ADS stream with what the admin pages
//! (`/debug/adsz`, `/debug/syncz`) show — proxy id, peer, connect time, and per type URL
//! the subscription, the last response sent, the last ACK and the last NACK.
//!
//! The registry is the single owner of this data; each stream loop replaces its own entry
//! after every event ([`StreamHandle::update`]) and the entry disappears when the stream's
//! handle is dropped, so a stream that ends for any reason never lingers here.
//! An update replaces a handful of records whose subscribed names are the stream's own
//! interned `Arc<NameSet>`s: nothing proportional to a subscription is copied under the
//! registry's lock (the unknown type URLs copied are capped at 16 × 256 bytes).

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

/// The open ADS streams of this replica. Cheap to clone (shared handle).
#[derive(Clone, Debug, Default)]
pub struct ConnectionRegistry {
    streams: Arc<Mutex<BTreeMap<u64, StreamStatus>>>,
    next_id: Arc<AtomicU64>,
}

impl ConnectionRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, StreamStatus>> {
        // A panic while holding the lock cannot leave the map half-updated (every
        // update replaces one entry), so a poisoned lock is still safe to use.
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a stream; it is removed when the returned handle is dropped.
    pub fn register(&self, mut status: StreamStatus) -> StreamHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        status.stream_id = id;
        self.lock().insert(id, status);
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
        self.lock().values().cloned().collect()
    }

    /// Streams of one proxy id (a proxy may hold more than one, e.g. while reconnecting).
    pub fn streams_of(&self, proxy_id: &str) -> Vec<StreamStatus> {
        self.lock()
            .values()
            .filter(|s| s.proxy_id == proxy_id)
            .cloned()
            .collect()
    }

    /// The identity of a connected proxy (its newest stream), if connected here.
    pub fn proxy(&self, proxy_id: &str) -> Option<Arc<Proxy>> {
        self.lock()
            .values()
            .rev()
            .find(|s| s.proxy_id == proxy_id)
            .map(|s| s.proxy.clone())
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
        self.lock()
            .values()
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

    /// Replaces the mutable parts of this stream's entry.
    pub fn update(&self, snapshot_version: u64, types: Vec<TypeStatus>, unknown: Vec<String>) {
        if let Some(entry) = self.registry.lock().get_mut(&self.id) {
            entry.snapshot_version = Some(snapshot_version);
            entry.types = types;
            entry.unknown_type_urls = unknown;
        }
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

    #[test]
    fn entries_live_as_long_as_their_handle() {
        let registry = ConnectionRegistry::new();
        let a = registry.register(status("a"));
        let b = registry.register(status("b"));
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
        a.update(7, vec![sent], vec!["type.googleapis.com/x".into()]);
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
