//! Pieces both per-stream state machines share: what a client subscribed to
//! ([`Subscription`]), the record of responses sent, ACKed and NACKed per type
//! ([`TypeRecord`]), the events a state machine reports ([`ProtocolEvent`]) and the
//! content hash that becomes a SotW `version_info`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Serialize, Serializer};
use sha2::{Digest, Sha256};

use super::types::XdsType;

/// The name that subscribes to every resource of a type.
pub const WILDCARD: &str = "*";

/// What a client subscribed to for one type.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subscription {
    /// Everything of the type (explicit `*`, or the legacy empty first request).
    pub wildcard: bool,
    /// Explicitly named resources, remembered even when they do not exist yet so they
    /// are sent when they appear.
    pub names: BTreeSet<String>,
    /// Set once the client named a resource explicitly: from then on an empty list
    /// means "nothing", never the legacy wildcard.
    pub named_before: bool,
}

impl Subscription {
    /// Applies a SotW request's full name list. Returns whether the subscription changed.
    pub fn apply_sotw(&mut self, xds_type: XdsType, first_request: bool, names: &[String]) -> bool {
        let before = self.clone();
        if names.is_empty() {
            // Legacy wildcard: only an empty list on a type never named explicitly.
            self.wildcard = xds_type.empty_means_wildcard()
                && !self.named_before
                && (first_request || before.wildcard);
            self.names.clear();
        } else {
            self.named_before = true;
            self.wildcard = names.iter().any(|n| n == WILDCARD);
            self.names = names.iter().filter(|n| *n != WILDCARD).cloned().collect();
        }
        *self != before
    }

    /// Applies a delta request's subscribe/unsubscribe lists. Returns the names that were
    /// unsubscribed (to be removed from what the client holds) and whether anything changed.
    pub fn apply_delta(
        &mut self,
        xds_type: XdsType,
        first_request: bool,
        subscribe: &[String],
        unsubscribe: &[String],
    ) -> (BTreeSet<String>, bool) {
        let before = self.clone();
        if first_request && subscribe.is_empty() && xds_type.empty_means_wildcard() {
            self.wildcard = true;
        }
        for name in subscribe {
            if name == WILDCARD {
                self.wildcard = true;
            } else {
                self.named_before = true;
                self.names.insert(name.clone());
            }
        }
        let mut unsubscribed = BTreeSet::new();
        for name in unsubscribe {
            if name == WILDCARD {
                self.wildcard = false;
            } else if self.names.remove(name) {
                unsubscribed.insert(name.clone());
            }
        }
        let changed = *self != before;
        (unsubscribed, changed)
    }

    /// The `names` argument for [`XdsSnapshot::resources`](super::resource::XdsSnapshot::resources): `None` for wildcard.
    pub fn query(&self) -> Option<&BTreeSet<String>> {
        if self.wildcard {
            None
        } else {
            Some(&self.names)
        }
    }

    /// Whether the client asked for nothing at all.
    pub fn is_empty(&self) -> bool {
        !self.wildcard && self.names.is_empty()
    }
}

/// A response sent on a stream, as the debug pages and the ACK logic need it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentRecord {
    pub version: String,
    pub nonce: String,
    pub at: SystemTime,
    /// Name → version of every resource in the response (SotW only: delta needs just the
    /// counts). Shared with what the client holds once it ACKs, so an idle SotW stream
    /// keeps one copy of its view, not two.
    pub resources: Arc<BTreeMap<String, String>>,
    pub resource_count: usize,
    /// How many names went in `removed_resources` (delta only).
    pub removed_count: usize,
}

/// Per stream and per type: what was sent, ACKed and NACKed, and what is subscribed.
#[derive(Clone, Debug, Default)]
pub struct TypeRecord {
    /// Set by the first request of this type; no response is pushed before it.
    pub requested: bool,
    pub subscription: Subscription,
    pub last_sent: Option<SentRecord>,
    pub last_ack: Option<AckStatus>,
    pub last_nack: Option<NackStatus>,
}

impl TypeRecord {
    /// Whether `nonce` is not the latest one sent for this type. An empty nonce never is
    /// (a request made before, or regardless of, any response), and neither is any nonce
    /// before this stream sent the type anything: that is a client reconnecting with a
    /// nonce of its previous stream (possibly to another replica), to be answered.
    pub fn is_stale(&self, nonce: &str) -> bool {
        !nonce.is_empty() && self.last_sent.as_ref().is_some_and(|s| s.nonce != nonce)
    }

    /// The status shown on the debug pages.
    pub fn status(&self, xds_type: XdsType, holds: usize) -> TypeStatus {
        TypeStatus {
            type_url: xds_type.type_url().to_string(),
            wildcard: self.subscription.wildcard,
            subscribed: self.subscription.names.iter().cloned().collect(),
            last_sent: self.last_sent.as_ref().map(|s| SentStatus {
                version: s.version.clone(),
                nonce: s.nonce.clone(),
                at: s.at,
                resources: s.resource_count,
                removed: s.removed_count,
            }),
            last_ack: self.last_ack.clone(),
            last_nack: self.last_nack.clone(),
            client_holds: holds,
        }
    }
}

/// The last response sent for one type on one stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SentStatus {
    /// SotW `version_info`, or delta `system_version_info` (hash of what the client holds).
    pub version: String,
    pub nonce: String,
    #[serde(serialize_with = "rfc3339")]
    pub at: SystemTime,
    pub resources: usize,
    pub removed: usize,
}

/// The last ACK of one type on one stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AckStatus {
    pub version: String,
    pub nonce: String,
    #[serde(serialize_with = "rfc3339")]
    pub at: SystemTime,
}

/// The last NACK of one type on one stream: kept until the stream ends, so an operator
/// sees why a proxy rejected its configuration even after later successes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NackStatus {
    /// The version the client reports it still runs (its last good one).
    pub version: String,
    pub nonce: String,
    pub detail: String,
    #[serde(serialize_with = "rfc3339")]
    pub at: SystemTime,
}

/// One type URL on one stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TypeStatus {
    pub type_url: String,
    pub wildcard: bool,
    /// Explicitly subscribed names (may include names that do not exist yet).
    pub subscribed: Vec<String>,
    pub last_sent: Option<SentStatus>,
    pub last_ack: Option<AckStatus>,
    pub last_nack: Option<NackStatus>,
    /// How many resources of this type the client holds, as far as the server knows.
    pub client_holds: usize,
}

impl TypeStatus {
    /// Istio's sync states: `SYNCED` (latest response ACKed), `NACKED`, `STALE` (sent,
    /// not answered yet) or `NOT_SENT`.
    pub fn sync_state(&self) -> &'static str {
        match &self.last_sent {
            None => "NOT_SENT",
            Some(sent)
                if self
                    .last_ack
                    .as_ref()
                    .is_some_and(|a| a.nonce == sent.nonce) =>
            {
                "SYNCED"
            }
            Some(sent)
                if self
                    .last_nack
                    .as_ref()
                    .is_some_and(|n| n.nonce == sent.nonce) =>
            {
                "NACKED"
            }
            Some(_) => "STALE",
        }
    }
}

/// Serializes a time as RFC 3339 UTC with milliseconds, e.g. `2025-01-31T12:00:00.123Z`
/// (what the debug pages show).
pub(crate) fn rfc3339<S: Serializer>(at: &SystemTime, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(&humantime::format_rfc3339_millis(*at))
}

/// Something a state machine observed that the stream loop turns into logs and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolEvent {
    Ack {
        xds_type: XdsType,
        nonce: String,
    },
    Nack {
        xds_type: XdsType,
        nonce: String,
        detail: String,
    },
    /// A request whose nonce is not the latest sent for its type; its ACK/NACK is ignored.
    StaleNonce {
        xds_type: XdsType,
        nonce: String,
    },
    /// A type URL the engine does not serve; `first_time` is true once per stream.
    UnknownType {
        type_url: String,
        first_time: bool,
    },
}

/// What a state machine returns for one input: responses in wire order, and events.
#[derive(Debug)]
pub struct Output<R> {
    pub responses: Vec<R>,
    pub events: Vec<ProtocolEvent>,
}

impl<R> Default for Output<R> {
    fn default() -> Self {
        Output {
            responses: Vec::new(),
            events: Vec::new(),
        }
    }
}

/// The served type of `type_url`; an unknown one is recorded in `unknown` and reported
/// as an event (`first_time` once per stream), and the request is then ignored.
pub(crate) fn served_type<R>(
    type_url: &str,
    unknown: &mut BTreeSet<String>,
    out: &mut Output<R>,
) -> Option<XdsType> {
    let known = XdsType::from_type_url(type_url);
    if known.is_none() {
        let first_time = unknown.insert(type_url.to_string());
        out.events.push(ProtocolEvent::UnknownType {
            type_url: type_url.to_string(),
            first_time,
        });
    }
    known
}

/// Hash of a set of (name, version) pairs: a SotW `version_info` or a delta
/// `system_version_info`. Derived from content only, so it is identical on every replica.
pub fn view_version<'a>(entries: impl IntoIterator<Item = (&'a String, &'a String)>) -> String {
    let mut hasher = Sha256::new();
    for (name, version) in entries {
        hasher.update(name.as_bytes());
        hasher.update([0u8]);
        hasher.update(version.as_bytes());
        hasher.update([0u8]);
    }
    hex::encode(&hasher.finalize()[..8])
}

/// Per-stream nonce source: nonces are unique on the stream, which is all the protocol asks.
#[derive(Debug, Default)]
pub struct NonceSource {
    next: u64,
}

impl NonceSource {
    pub fn next_nonce(&mut self) -> String {
        self.next += 1;
        self.next.to_string()
    }
}

/// A snapshot that answers every query with the same name twice (different content), to
/// prove responses never carry a name twice.
#[cfg(test)]
pub(crate) struct DuplicatingSnapshot;

#[cfg(test)]
impl super::resource::XdsSnapshot for DuplicatingSnapshot {
    fn version(&self) -> u64 {
        1
    }
    fn resources(
        &self,
        _proxy: &pilotfish_mesh::model::Proxy,
        type_url: &str,
        _names: Option<&BTreeSet<String>>,
    ) -> Vec<Arc<super::resource::Resource>> {
        [b"one", b"two"]
            .iter()
            .map(|payload| {
                let body = prost_types::Any {
                    type_url: type_url.to_string(),
                    value: payload.to_vec(),
                };
                Arc::new(super::resource::Resource::new("dup", body))
            })
            .collect()
    }
    fn change_since(&self, _previous: u64) -> super::resource::ChangeKind {
        super::resource::ChangeKind::Full
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn times_show_as_rfc3339_with_milliseconds() {
        let at = |t: SystemTime| {
            let ack = AckStatus {
                version: "v".into(),
                nonce: "1".into(),
                at: t,
            };
            serde_json::to_value(ack).unwrap()["at"].clone()
        };
        assert_eq!(at(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(951_782_400_123); // leap day 2000
        assert_eq!(at(t), "2000-02-29T00:00:00.123Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_767_225_599); // last second of 2025
        assert_eq!(at(t), "2025-12-31T23:59:59.000Z");
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn empty_first_request_is_wildcard_for_lds_and_cds_only() {
        let mut cds = Subscription::default();
        assert!(cds.apply_sotw(XdsType::Cluster, true, &[]));
        assert!(cds.wildcard);
        let mut eds = Subscription::default();
        eds.apply_sotw(XdsType::Endpoint, true, &[]);
        assert!(!eds.wildcard && eds.is_empty());
    }

    #[test]
    fn once_named_an_empty_list_means_nothing() {
        let mut sub = Subscription::default();
        sub.apply_sotw(XdsType::Listener, true, &[]);
        assert!(sub.wildcard);
        assert!(sub.apply_sotw(XdsType::Listener, false, &names(&["a"])));
        assert!(!sub.wildcard);
        assert!(sub.apply_sotw(XdsType::Listener, false, &[]));
        assert!(
            sub.is_empty(),
            "empty after explicit names unsubscribes all"
        );
    }

    #[test]
    fn legacy_wildcard_stays_on_repeated_empty_lists() {
        let mut sub = Subscription::default();
        sub.apply_sotw(XdsType::Cluster, true, &[]);
        assert!(!sub.apply_sotw(XdsType::Cluster, false, &[]));
        assert!(sub.wildcard);
    }

    #[test]
    fn explicit_star_with_names() {
        let mut sub = Subscription::default();
        sub.apply_sotw(XdsType::Route, true, &names(&["*", "r1"]));
        assert!(sub.wildcard);
        assert_eq!(sub.names, BTreeSet::from(["r1".to_string()]));
        assert_eq!(sub.query(), None);
    }

    #[test]
    fn delta_subscribe_unsubscribe() {
        let mut sub = Subscription::default();
        let (gone, changed) = sub.apply_delta(XdsType::Endpoint, true, &names(&["a", "b"]), &[]);
        assert!(changed && gone.is_empty() && !sub.wildcard);
        let (gone, changed) = sub.apply_delta(XdsType::Endpoint, false, &[], &names(&["a", "zz"]));
        assert!(changed);
        assert_eq!(gone, BTreeSet::from(["a".to_string()]));
        let (_, changed) = sub.apply_delta(XdsType::Endpoint, false, &[], &names(&["zz"]));
        assert!(!changed);
        let mut lds = Subscription::default();
        lds.apply_delta(XdsType::Listener, true, &[], &[]);
        assert!(lds.wildcard, "legacy wildcard on the first delta request");
        lds.apply_delta(XdsType::Listener, false, &[], &names(&["*"]));
        assert!(!lds.wildcard);
    }

    #[test]
    fn view_version_depends_on_every_pair() {
        let a = BTreeMap::from([("x".to_string(), "1".to_string())]);
        let b = BTreeMap::from([("x".to_string(), "2".to_string())]);
        let c = BTreeMap::from([("y".to_string(), "1".to_string())]);
        let empty = BTreeMap::<String, String>::new();
        let versions = [&a, &b, &c, &empty].map(|m| view_version(m.iter()));
        let unique: BTreeSet<_> = versions.iter().collect();
        assert_eq!(unique.len(), 4);
        assert_eq!(view_version(a.iter()), view_version(a.clone().iter()));
    }
}
