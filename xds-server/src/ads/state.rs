//! Pieces both per-stream state machines share: what a client subscribed to
//! ([`Subscription`]), the record of responses sent, ACKed and NACKed per type
//! ([`TypeRecord`]), what a client holds ([`Held`]), when a type is due ([`Reply`]) and
//! the events a state machine reports ([`ProtocolEvent`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use serde::{Serialize, Serializer};

use super::names::{NameSet, NameSets};
use super::request::ResourceNames;
use super::resource::Resource;
use super::types::XdsType;
use super::view::View;

/// The name that subscribes to every resource of a type.
pub const WILDCARD: &str = "*";

/// What a client subscribed to for one type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    /// Everything of the type (explicit `*`, or the legacy empty first request).
    pub wildcard: bool,
    /// Explicitly named resources, remembered even when they do not exist yet so they
    /// are sent when they appear. Interned: streams subscribed to the same names share it.
    pub names: Arc<NameSet>,
    /// Set once the client named a resource explicitly: from then on an empty list
    /// means "nothing", never the legacy wildcard.
    pub named_before: bool,
}

impl Default for Subscription {
    fn default() -> Self {
        Subscription {
            wildcard: false,
            names: NameSet::empty(),
            named_before: false,
        }
    }
}

impl Subscription {
    /// Applies a SotW request's full name list (as received: [`super::SotwRequest`]).
    /// Returns whether the subscription changed, or — changing nothing — why the request
    /// cannot be taken: a list beyond [`MAX_SUBSCRIBED_NAMES`] or `max_bytes` (what the
    /// stream's other types leave of [`MAX_SUBSCRIBED_NAME_BYTES`]), or a name that is not
    /// UTF-8 ([`Limit::Malformed`]).
    pub fn apply_sotw(
        &mut self,
        xds_type: XdsType,
        first_request: bool,
        names: ResourceNames<'_>,
        sets: &NameSets,
        max_bytes: usize,
    ) -> Result<bool, (Limit, String)> {
        let before = self.clone();
        if names.len() == 0 {
            // Legacy wildcard: only an empty list on a type never named explicitly.
            self.wildcard = xds_type.empty_means_wildcard()
                && !self.named_before
                && (first_request || before.wildcard);
            if !self.names.is_empty() {
                self.names = NameSet::empty();
            }
        } else {
            let is_wildcard = |n: &&[u8]| *n == WILDCARD.as_bytes();
            let explicit = names.clone().filter(|n| !is_wildcard(n));
            // Every SotW ACK repeats the whole list: compare before building anything.
            if !self.names.same_as(explicit.clone()) {
                let explicit = explicit
                    .map(|n| std::str::from_utf8(n).map(str::to_string))
                    .collect::<Result<Vec<String>, _>>()
                    .map_err(|_| {
                        (
                            Limit::Malformed,
                            format!("a resource name subscribed for {xds_type} is not UTF-8"),
                        )
                    })?;
                self.names = sets
                    .intern_within(explicit, MAX_SUBSCRIBED_NAMES, max_bytes)
                    .map_err(|(count, bytes)| {
                        (
                            Limit::SubscribedNames,
                            over_names(xds_type, count, bytes, max_bytes),
                        )
                    })?;
            }
            self.named_before = true;
            self.wildcard = names.clone().any(|n| is_wildcard(&n));
        }
        Ok(*self != before)
    }

    /// Applies a delta request's subscribe/unsubscribe lists. Returns the names that were
    /// unsubscribed (to be removed from what the client holds) and whether anything
    /// changed, or — changing nothing — why the result would be beyond
    /// [`MAX_SUBSCRIBED_NAMES`] or `max_bytes` (what the stream's other types leave of
    /// [`MAX_SUBSCRIBED_NAME_BYTES`]).
    pub fn apply_delta(
        &mut self,
        xds_type: XdsType,
        first_request: bool,
        subscribe: &[String],
        unsubscribe: &[String],
        sets: &NameSets,
        max_bytes: usize,
    ) -> Result<(BTreeSet<String>, bool), String> {
        let before = self.clone();
        let mut wildcard = self.wildcard;
        let mut named_before = self.named_before;
        if first_request && subscribe.is_empty() && xds_type.empty_means_wildcard() {
            wildcard = true;
        }
        let mut touched = false;
        for name in subscribe {
            if name == WILDCARD {
                wildcard = true;
            } else {
                named_before = true;
                if !self.names.contains(name) {
                    touched = true;
                }
            }
        }
        // A name in both lists ends unsubscribed, as in istiod: the unsubscribe list
        // applies after the subscribe list.
        let subscribing: BTreeSet<&str> = if unsubscribe.is_empty() {
            BTreeSet::new()
        } else {
            subscribe.iter().map(String::as_str).collect()
        };
        let mut unsubscribed = BTreeSet::new();
        for name in unsubscribe {
            if name == WILDCARD {
                wildcard = false;
            } else if self.names.contains(name) || subscribing.contains(name.as_str()) {
                touched = true;
                unsubscribed.insert(name.clone());
            }
        }
        if touched {
            let mut names: BTreeSet<&str> = self.names.iter().map(String::as_str).collect();
            names.extend(
                subscribe
                    .iter()
                    .filter(|n| *n != WILDCARD)
                    .map(String::as_str),
            );
            for name in &unsubscribed {
                names.remove(name.as_str());
            }
            self.names = sets
                .intern_within(
                    names.into_iter().map(str::to_string).collect(),
                    MAX_SUBSCRIBED_NAMES,
                    max_bytes,
                )
                .map_err(|(count, bytes)| over_names(xds_type, count, bytes, max_bytes))?;
        }
        self.wildcard = wildcard;
        self.named_before = named_before;
        let changed = *self != before;
        Ok((unsubscribed, changed))
    }

    /// The names argument of a view: `None` for wildcard.
    pub fn query(&self) -> Option<&Arc<NameSet>> {
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

/// Why a type is due to be answered, once the stream can send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Reply {
    /// Only if the content differs from what was last sent (a new snapshot, a NACK with
    /// changed names, the endpoints after a cluster response).
    IfChanged,
    /// Even when the content is the same (the first request of a type, a changed name
    /// set that the client expects answered).
    Always,
}

/// Raises `slot` to at least `reply`: a type owes one response, for the strongest reason.
pub fn owe(slot: &mut Option<Reply>, reply: Reply) {
    *slot = (*slot).max(Some(reply));
}

/// The resource versions a client holds (or was sent) for one type.
#[derive(Clone, Debug, Default)]
pub enum Held {
    #[default]
    Nothing,
    /// What a reconnecting delta client reported (`initial_resource_versions`), until its
    /// first response.
    Versions(Arc<BTreeMap<String, String>>),
    /// A view sent to it: shared with every stream that was sent the same.
    View(Arc<View>),
}

impl Held {
    pub fn version_of(&self, name: &str) -> Option<&str> {
        match self {
            Held::Nothing => None,
            Held::Versions(map) => map.get(name).map(String::as_str),
            Held::View(view) => view.version_of(name),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Held::Nothing => 0,
            Held::Versions(map) => map.len(),
            Held::View(view) => view.len(),
        }
    }

    /// Whether this is exactly `view`'s content.
    pub fn is(&self, view: &View) -> bool {
        matches!(self, Held::View(held) if held.same_content(view))
    }

    /// What is held, in name order: each name, its version, and the resource itself
    /// when a view is held.
    fn entries(&self) -> Box<dyn Iterator<Item = HeldEntry<'_>> + '_> {
        match self {
            Held::Nothing => Box::new(std::iter::empty()),
            Held::Versions(map) => Box::new(
                map.iter()
                    .map(|(name, version)| (name.as_str(), version.as_str(), None)),
            ),
            Held::View(view) => Box::new(view_entries(view)),
        }
    }

    /// Compares `now` with what is held; see [`walk_changes`].
    pub fn walk<'a>(
        &'a self,
        now: &'a View,
        changed: impl FnMut(&'a Arc<Resource>),
        gone: impl FnMut(&'a str),
    ) {
        if self.is(now) {
            return;
        }
        walk_changes(self.entries(), now, changed, gone);
    }

    /// Names of `now` that are new or changed compared with what is held.
    pub fn changed_in<'a>(&'a self, now: &'a View) -> Vec<&'a str> {
        let mut names = Vec::new();
        self.walk(now, |r| names.push(r.name.as_str()), |_| {});
        names
    }
}

/// A held resource: its name, its version, and the resource when a view is held.
pub type HeldEntry<'a> = (&'a str, &'a str, Option<&'a Arc<Resource>>);

/// The resources of `view` as held entries, in name order.
pub fn view_entries(view: &View) -> impl Iterator<Item = HeldEntry<'_>> {
    view.resources()
        .iter()
        .map(|r| (r.name.as_str(), r.version.as_str(), Some(r)))
}

/// Compares `now` with `held` in one walk over both, which are in name order:
/// `changed` gets each resource of `now` that is new or at another version, `gone` each
/// held name that `now` lacks, both in name order. A resource that did not change is
/// usually the same interned `Arc` in both, so most steps compare a pointer, not a name:
/// this runs for every stream on every push, over thousands of names.
pub fn walk_changes<'a>(
    held: impl Iterator<Item = HeldEntry<'a>>,
    now: &'a View,
    mut changed: impl FnMut(&'a Arc<Resource>),
    mut gone: impl FnMut(&'a str),
) {
    let mut held = held.peekable();
    for resource in now.resources() {
        if let Some(&(_, _, Some(same))) = held.peek()
            && Arc::ptr_eq(same, resource)
        {
            held.next();
            continue;
        }
        while let Some(&(name, _, _)) = held.peek()
            && name < resource.name.as_str()
        {
            gone(name);
            held.next();
        }
        match held.peek() {
            Some(&(name, version, _)) if name == resource.name => {
                if version != resource.version {
                    changed(resource);
                }
                held.next();
            }
            _ => changed(resource),
        }
    }
    for (name, _, _) in held {
        gone(name);
    }
}

/// A response sent on a stream, as the debug pages and the ACK logic need it.
#[derive(Clone, Debug)]
pub struct SentRecord {
    /// SotW `version_info`, or delta `system_version_info`.
    pub version: Arc<str>,
    pub nonce: String,
    pub at: SystemTime,
    /// The view sent (SotW only: delta keeps what the client holds instead). Shared with
    /// every stream sent the same, and with what the client holds once it ACKs.
    pub view: Option<Arc<View>>,
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
    /// Boxed: most streams never NACK, and every stream holds four records.
    pub last_nack: Option<Box<NackStatus>>,
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
            subscribed: self.subscription.names.clone(),
            last_sent: self.last_sent.as_ref().map(|s| SentStatus {
                version: s.version.to_string(),
                nonce: s.nonce.clone(),
                at: s.at,
                resources: s.resource_count,
                removed: s.removed_count,
            }),
            last_ack: self.last_ack.clone(),
            last_nack: self.last_nack.as_deref().cloned(),
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
    /// Explicitly subscribed names (may include names that do not exist yet); shared
    /// with the stream, never copied.
    #[serde(serialize_with = "names_list")]
    pub subscribed: Arc<NameSet>,
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

fn names_list<S: Serializer>(names: &Arc<NameSet>, serializer: S) -> Result<S::Ok, S::Error> {
    names.as_ref().serialize(serializer)
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
    /// The client went past a per-stream cap: the stream must end, with `reason`.
    OverLimit {
        limit: Limit,
        reason: String,
    },
}

/// Which per-stream cap a client went past.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// [`MAX_UNKNOWN_TYPES`] or [`MAX_TYPE_URL_BYTES`]: type URLs nobody serves, a
    /// malformed request (`INVALID_ARGUMENT`).
    TypeUrls,
    /// [`MAX_SUBSCRIBED_NAMES`] or [`MAX_SUBSCRIBED_NAME_BYTES`]: a valid request beyond
    /// this server's per-stream quota (`RESOURCE_EXHAUSTED`).
    SubscribedNames,
    /// Not a limit: a request that is not what its type says (a resource name that is not
    /// UTF-8), `INVALID_ARGUMENT`.
    Malformed,
}

impl Limit {
    /// The `reason` label of `pilotfish_xds_streams_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Limit::TypeUrls => "over_limit",
            Limit::SubscribedNames => "subscription_limit",
            Limit::Malformed => "malformed_request",
        }
    }
}

/// Distinct type URLs a stream may ask for that the engine does not serve (Envoy asks for
/// a few it may get elsewhere, e.g. secrets); each is kept for `/debug/adsz`, so a client
/// inventing new ones ends its stream instead of growing it.
pub const MAX_UNKNOWN_TYPES: usize = 16;
/// Longest type URL accepted (the longest Envoy type URL is about 100 bytes).
pub const MAX_TYPE_URL_BYTES: usize = 256;

/// Most names a stream may subscribe to for one type. A sidecar of a 10,000-service mesh
/// subscribes to about 10,000 EDS and as many RDS names; the cap leaves ten times that,
/// and 100,000 names are answered in about 0.1 s.
pub const MAX_SUBSCRIBED_NAMES: usize = 100_000;
/// Most bytes of subscribed names a stream may hold, all types together (names are
/// counted by length; each is held once per distinct set, shared by the streams that
/// subscribe to it). 20,000 names of Istio's usual length (60–80 bytes) are about 1.5 MiB.
pub const MAX_SUBSCRIBED_NAME_BYTES: usize = 16 * 1024 * 1024;

/// The error of a subscription beyond the caps.
fn over_names(xds_type: XdsType, count: usize, bytes: usize, max_bytes: usize) -> String {
    if count > MAX_SUBSCRIBED_NAMES {
        format!("{count} names subscribed for {xds_type} (at most {MAX_SUBSCRIBED_NAMES} per type)")
    } else {
        format!(
            "{bytes} bytes of names subscribed for {xds_type} where the stream's other types leave {max_bytes} (at most {MAX_SUBSCRIBED_NAME_BYTES} bytes per stream)"
        )
    }
}

/// What the stream's subscriptions to types other than `xds_type` leave of
/// [`MAX_SUBSCRIBED_NAME_BYTES`] for `xds_type`.
pub(crate) fn name_bytes_left<'a>(
    xds_type: XdsType,
    records: impl Iterator<Item = (XdsType, &'a TypeRecord)>,
) -> usize {
    let others: usize = records
        .filter(|(t, _)| *t != xds_type)
        .map(|(_, r)| r.subscription.names.bytes())
        .sum();
    MAX_SUBSCRIBED_NAME_BYTES.saturating_sub(others)
}

/// The served type of `type_url`; an unknown one is recorded in `unknown` and reported
/// as an event (`first_time` once per stream), and the request is then ignored — up to
/// the per-stream caps, past which an [`ProtocolEvent::OverLimit`] ends the stream.
pub(crate) fn served_type(
    type_url: &str,
    unknown: &mut BTreeSet<String>,
    events: &mut Vec<ProtocolEvent>,
) -> Option<XdsType> {
    let known = XdsType::from_type_url(type_url);
    if known.is_none() {
        if type_url.len() > MAX_TYPE_URL_BYTES {
            events.push(ProtocolEvent::OverLimit {
                limit: Limit::TypeUrls,
                reason: format!(
                    "a type URL of {} bytes (at most {MAX_TYPE_URL_BYTES})",
                    type_url.len()
                ),
            });
            return None;
        }
        if unknown.len() >= MAX_UNKNOWN_TYPES && !unknown.contains(type_url) {
            events.push(ProtocolEvent::OverLimit {
                limit: Limit::TypeUrls,
                reason: format!(
                    "more than {MAX_UNKNOWN_TYPES} type URLs this server does not serve"
                ),
            });
            return None;
        }
        let first_time = unknown.insert(type_url.to_string());
        events.push(ProtocolEvent::UnknownType {
            type_url: type_url.to_string(),
            first_time,
        });
    }
    known
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

/// A snapshot whose two parts both carry a resource named `dup` (different content), to
/// prove responses never carry a name twice.
#[cfg(test)]
pub(crate) struct DuplicatingSnapshot;

#[cfg(test)]
impl super::resource::XdsSnapshot for DuplicatingSnapshot {
    fn version(&self) -> u64 {
        1
    }
    fn parts(
        &self,
        _proxy: &pilotfish_mesh::model::Proxy,
        xds_type: XdsType,
    ) -> Vec<Arc<super::resource::ResourceMap>> {
        static PARTS: std::sync::OnceLock<Vec<Vec<Arc<super::resource::ResourceMap>>>> =
            std::sync::OnceLock::new();
        let parts = PARTS.get_or_init(|| {
            XdsType::ALL
                .iter()
                .map(|t| {
                    [b"one", b"two"]
                        .iter()
                        .map(|payload| {
                            let body = prost_types::Any {
                                type_url: t.type_url().to_string(),
                                value: payload.to_vec(),
                            };
                            let resource = Arc::new(super::resource::Resource::new("dup", body));
                            Arc::new(BTreeMap::from([("dup".to_string(), resource)]))
                        })
                        .collect()
                })
                .collect()
        });
        parts[xds_type.index()].clone()
    }
    fn change_since(&self, _previous: u64) -> super::resource::ChangeKind {
        super::resource::ChangeKind::Full
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::request::SotwRequest;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
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

    /// Every pair of held and new contents over four names (each absent or at one of
    /// two contents), held as a view and as reported versions: the ordered walk finds
    /// exactly what a lookup of each name finds.
    #[test]
    fn the_ordered_walk_finds_what_lookups_find() {
        const NAMES: [&str; 4] = ["a", "b", "b.x", "c"];
        let view_of = |code: usize| {
            let mut resources = Vec::new();
            for (i, name) in NAMES.iter().enumerate() {
                let content = code / 3usize.pow(i as u32) % 3;
                if content > 0 {
                    let body = prost_types::Any {
                        type_url: XdsType::Cluster.type_url().into(),
                        value: vec![content as u8],
                    };
                    resources.push(Resource::new(*name, body).shared());
                }
            }
            View::new(XdsType::Cluster, resources)
        };
        let cases = 3usize.pow(NAMES.len() as u32);
        for held_code in 0..cases {
            let held_view = Arc::new(view_of(held_code));
            let versions: BTreeMap<String, String> = held_view
                .resources()
                .iter()
                .map(|r| (r.name.clone(), r.version.clone()))
                .collect();
            for held in [
                Held::View(held_view.clone()),
                Held::Versions(Arc::new(versions)),
            ] {
                for now_code in 0..cases {
                    let now = view_of(now_code);
                    let expected_changed: Vec<&str> = now
                        .resources()
                        .iter()
                        .filter(|r| held.version_of(&r.name) != Some(r.version.as_str()))
                        .map(|r| r.name.as_str())
                        .collect();
                    let expected_gone: Vec<&str> = held_view
                        .resources()
                        .iter()
                        .map(|r| r.name.as_str())
                        .filter(|n| now.get(n).is_none())
                        .collect();
                    let (mut changed, mut gone) = (Vec::new(), Vec::new());
                    held.walk(&now, |r| changed.push(r.name.as_str()), |n| gone.push(n));
                    assert_eq!(changed, expected_changed, "{held:?} → {now_code}");
                    assert_eq!(gone, expected_gone, "{held:?} → {now_code}");
                    assert_eq!(held.changed_in(&now), expected_changed);
                }
            }
        }
    }

    /// A SotW request of these names, as the engine decodes it.
    fn sotw_names(list: &[&str]) -> SotwRequest {
        DiscoveryRequest {
            resource_names: names(list),
            ..Default::default()
        }
        .into()
    }

    #[test]
    fn empty_first_request_is_wildcard_for_lds_and_cds_only() {
        let sets = NameSets::default();
        let mut cds = Subscription::default();
        assert!(
            cds.apply_sotw(
                XdsType::Cluster,
                true,
                sotw_names(&[]).resource_names(),
                &sets,
                MAX_SUBSCRIBED_NAME_BYTES
            )
            .unwrap()
        );
        assert!(cds.wildcard);
        let mut eds = Subscription::default();
        eds.apply_sotw(
            XdsType::Endpoint,
            true,
            sotw_names(&[]).resource_names(),
            &sets,
            MAX_SUBSCRIBED_NAME_BYTES,
        )
        .unwrap();
        assert!(!eds.wildcard && eds.is_empty());
    }

    #[test]
    fn once_named_an_empty_list_means_nothing() {
        let sets = NameSets::default();
        let mut sub = Subscription::default();
        sub.apply_sotw(
            XdsType::Listener,
            true,
            sotw_names(&[]).resource_names(),
            &sets,
            MAX_SUBSCRIBED_NAME_BYTES,
        )
        .unwrap();
        assert!(sub.wildcard);
        assert!(
            sub.apply_sotw(
                XdsType::Listener,
                false,
                sotw_names(&["a"]).resource_names(),
                &sets,
                MAX_SUBSCRIBED_NAME_BYTES
            )
            .unwrap()
        );
        assert!(!sub.wildcard);
        assert!(
            sub.apply_sotw(
                XdsType::Listener,
                false,
                sotw_names(&[]).resource_names(),
                &sets,
                MAX_SUBSCRIBED_NAME_BYTES
            )
            .unwrap()
        );
        assert!(
            sub.is_empty(),
            "empty after explicit names unsubscribes all"
        );
    }

    #[test]
    fn legacy_wildcard_stays_on_repeated_empty_lists() {
        let sets = NameSets::default();
        let mut sub = Subscription::default();
        sub.apply_sotw(
            XdsType::Cluster,
            true,
            sotw_names(&[]).resource_names(),
            &sets,
            MAX_SUBSCRIBED_NAME_BYTES,
        )
        .unwrap();
        assert!(
            !sub.apply_sotw(
                XdsType::Cluster,
                false,
                sotw_names(&[]).resource_names(),
                &sets,
                MAX_SUBSCRIBED_NAME_BYTES
            )
            .unwrap()
        );
        assert!(sub.wildcard);
    }

    #[test]
    fn explicit_star_with_names() {
        let sets = NameSets::default();
        let mut sub = Subscription::default();
        sub.apply_sotw(
            XdsType::Route,
            true,
            sotw_names(&["*", "r1"]).resource_names(),
            &sets,
            MAX_SUBSCRIBED_NAME_BYTES,
        )
        .unwrap();
        assert!(sub.wildcard);
        assert_eq!(sub.names.iter().collect::<Vec<_>>(), ["r1"]);
        assert_eq!(sub.query(), None);
    }

    #[test]
    fn an_unchanged_sotw_list_keeps_the_shared_set() {
        let sets = NameSets::default();
        let mut a = Subscription::default();
        let mut b = Subscription::default();
        a.apply_sotw(
            XdsType::Endpoint,
            true,
            sotw_names(&["y", "x"]).resource_names(),
            &sets,
            MAX_SUBSCRIBED_NAME_BYTES,
        )
        .unwrap();
        b.apply_sotw(
            XdsType::Endpoint,
            true,
            sotw_names(&["x", "y"]).resource_names(),
            &sets,
            MAX_SUBSCRIBED_NAME_BYTES,
        )
        .unwrap();
        assert!(Arc::ptr_eq(&a.names, &b.names), "two streams, one set");
        let kept = a.names.clone();
        assert!(
            !a.apply_sotw(
                XdsType::Endpoint,
                false,
                sotw_names(&["x", "y"]).resource_names(),
                &sets,
                MAX_SUBSCRIBED_NAME_BYTES
            )
            .unwrap()
        );
        assert!(Arc::ptr_eq(&a.names, &kept));
        assert!(
            a.apply_sotw(
                XdsType::Endpoint,
                false,
                sotw_names(&["x"]).resource_names(),
                &sets,
                MAX_SUBSCRIBED_NAME_BYTES
            )
            .unwrap()
        );
        assert_eq!(sets.len(), 2);
    }

    #[test]
    fn delta_subscribe_unsubscribe() {
        let sets = NameSets::default();
        let mut sub = Subscription::default();
        let (gone, changed) = sub
            .apply_delta(
                XdsType::Endpoint,
                true,
                &names(&["a", "b"]),
                &[],
                &sets,
                MAX_SUBSCRIBED_NAME_BYTES,
            )
            .unwrap();
        assert!(changed && gone.is_empty() && !sub.wildcard);
        let (gone, changed) = sub
            .apply_delta(
                XdsType::Endpoint,
                false,
                &[],
                &names(&["a", "zz"]),
                &sets,
                MAX_SUBSCRIBED_NAME_BYTES,
            )
            .unwrap();
        assert!(changed);
        assert_eq!(gone, BTreeSet::from(["a".to_string()]));
        assert_eq!(sub.names.iter().collect::<Vec<_>>(), ["b"]);
        let (_, changed) = sub
            .apply_delta(
                XdsType::Endpoint,
                false,
                &[],
                &names(&["zz"]),
                &sets,
                MAX_SUBSCRIBED_NAME_BYTES,
            )
            .unwrap();
        assert!(!changed);
        let mut lds = Subscription::default();
        lds.apply_delta(
            XdsType::Listener,
            true,
            &[],
            &[],
            &sets,
            MAX_SUBSCRIBED_NAME_BYTES,
        )
        .unwrap();
        assert!(lds.wildcard, "legacy wildcard on the first delta request");
        lds.apply_delta(
            XdsType::Listener,
            false,
            &[],
            &names(&["*"]),
            &sets,
            MAX_SUBSCRIBED_NAME_BYTES,
        )
        .unwrap();
        assert!(!lds.wildcard);
    }

    #[test]
    fn a_name_both_subscribed_and_unsubscribed_in_one_request_ends_unsubscribed() {
        // Found by `props`: the subscribe list used to win.
        let sets = NameSets::default();
        let mut sub = Subscription::default();
        let both = names(&["a"]);
        sub.apply_delta(XdsType::Cluster, true, &both, &both, &sets, usize::MAX)
            .unwrap();
        assert!(sub.is_empty(), "{sub:?}");
    }

    #[test]
    fn owed_replies_keep_the_strongest_reason() {
        let mut slot = None;
        owe(&mut slot, Reply::IfChanged);
        assert_eq!(slot, Some(Reply::IfChanged));
        owe(&mut slot, Reply::Always);
        owe(&mut slot, Reply::IfChanged);
        assert_eq!(slot, Some(Reply::Always));
    }

    #[test]
    fn unknown_type_urls_are_capped_per_stream() {
        let mut unknown = BTreeSet::new();
        let mut events = Vec::new();
        for i in 0..MAX_UNKNOWN_TYPES {
            assert_eq!(
                served_type(&format!("t/{i}"), &mut unknown, &mut events),
                None
            );
        }
        // A known one again is fine, and so are the ones already seen.
        assert_eq!(served_type("t/0", &mut unknown, &mut events), None);
        assert!(
            !events
                .iter()
                .any(|e| matches!(e, ProtocolEvent::OverLimit { .. }))
        );
        let mut events = Vec::new();
        assert_eq!(served_type("t/new", &mut unknown, &mut events), None);
        assert!(matches!(
            events.as_slice(),
            [ProtocolEvent::OverLimit { .. }]
        ));
        assert_eq!(
            unknown.len(),
            MAX_UNKNOWN_TYPES,
            "the one past the cap is not kept"
        );

        let mut fresh = BTreeSet::new();
        let mut events = Vec::new();
        let long = "x".repeat(MAX_TYPE_URL_BYTES + 1);
        assert_eq!(served_type(&long, &mut fresh, &mut events), None);
        assert!(matches!(
            events.as_slice(),
            [ProtocolEvent::OverLimit { .. }]
        ));
        assert!(fresh.is_empty());
        // Served types are never limited.
        let mut events = Vec::new();
        assert!(served_type(XdsType::Cluster.type_url(), &mut unknown, &mut events).is_some());
        assert!(events.is_empty());
    }
}
