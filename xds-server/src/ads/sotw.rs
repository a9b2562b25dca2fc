//! The state-of-the-world ADS state machine of one stream ([`SotwStream`]): synchronous
//! and free of I/O. Inputs: a `DiscoveryRequest`, a new snapshot, and "the transport can
//! take a response now"; outputs: the protocol events to log and count, and one response
//! at a time ([`SotwStream::next_response`]).
//!
//! Requests and snapshots only mark a type as owing a response ([`Reply`]); the response
//! is computed when the stream can send it, from the newest snapshot, so a stream holds
//! at most one pending response per type and a newer snapshot replaces what was not sent
//! yet. Only what is actually returned is recorded as sent, so the client never sees a
//! nonce that was replaced.
//!
//! Rules it implements (each has a unit test below and a wire test in
//! `tests/integration/ads_sotw.rs`):
//! - the first request of a type is answered, even when empty;
//! - an ACK is never answered; a NACK is recorded and never causes a resend of the same
//!   content; a request with a stale nonce is ignored;
//! - a changed name set is answered with exactly the subscribed names (the full set for
//!   a wildcard), even names sent before — so A→B→A subscriptions get A again;
//! - on a new snapshot only types whose content changed for this stream are sent, in
//!   make-before-break order (CDS, EDS, LDS, RDS), and an endpoints-only change
//!   recomputes EDS alone;
//! - a response carrying a new or changed cluster is followed by the endpoints of those
//!   clusters (even unchanged), because Envoy only finishes warming a cluster on a fresh
//!   EDS;
//! - LDS and CDS responses carry the whole state of the world; RDS and EDS responses carry
//!   only what the client does not hold yet — resources new or changed against its last
//!   ACK, names subscribed since the last response, and the endpoints of warming
//!   clusters — as the protocol allows for these types (their deletion follows from their
//!   parents). One VirtualService edit then sends one route configuration, not every one
//!   the client subscribes to. A pushed RDS or EDS response that would carry nothing (only
//!   deletions) is not sent;
//! - `version_info` is a hash of the names and resource versions of the whole subscribed
//!   view (also when the response carries part of it).
//!
//! A response carrying part of a view is still assembled from shared bytes: each resource
//! encodes its `DiscoveryResponse.resources` entry once, for every stream and snapshot
//! (`wire::encode_sotw`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::SystemTime;

use pilotfish_mesh::model::Proxy;

use super::names::NameSets;
use super::request::SotwRequest;
use super::resource::{ChangeKind, Resource};
use super::state::{AckStatus, Held, NackStatus, Reply, TypeStatus, owe};
use super::state::{NonceSource, ProtocolEvent, SentRecord, Subscription, TypeRecord};
use super::state::{name_bytes_left, served_type, view_entries, walk_changes};
use super::types::XdsType;
use super::view::{ServedSnapshot, View};
use super::wire::SotwResponse;

/// Per type: the protocol record, what the client holds (the view of its last ACK),
/// whether a response is owed, the names subscribed since the last response, and the
/// digest of the last name list applied (0: none yet).
#[derive(Debug, Default)]
struct SotwType {
    record: TypeRecord,
    holds: Option<Arc<View>>,
    owed: Option<Reply>,
    fresh: Fresh,
    names_digest: u64,
}

/// Names the client subscribed to since the last response of a type: it wants them even
/// if it held them once (A→B→A), so they are sent whatever it held at its last ACK.
#[derive(Debug, Default)]
enum Fresh {
    #[default]
    Nothing,
    Names(BTreeSet<String>),
    /// The subscription became a wildcard: everything.
    All,
}

impl Fresh {
    fn add(&mut self, before: &Subscription, now: &Subscription) {
        if now.wildcard && !before.wildcard {
            *self = Fresh::All;
            return;
        }
        let added = now.names.iter().filter(|n| !before.names.contains(n));
        match self {
            Fresh::All => {}
            Fresh::Names(names) => names.extend(added.cloned()),
            Fresh::Nothing => {
                let names: BTreeSet<String> = added.cloned().collect();
                if !names.is_empty() {
                    *self = Fresh::Names(names);
                }
            }
        }
    }

    fn contains(&self, name: &str) -> bool {
        match self {
            Fresh::Nothing => false,
            Fresh::Names(names) => names.contains(name),
            Fresh::All => true,
        }
    }
}

/// State of one SotW ADS stream.
pub struct SotwStream {
    proxy: Arc<Proxy>,
    snapshot: Arc<ServedSnapshot>,
    names: Arc<NameSets>,
    nonces: NonceSource,
    types: [SotwType; 4],
    unknown_types: BTreeSet<String>,
    /// The clusters as of the last endpoints response, set when a cluster response
    /// follows it: clusters sent since that differ from it are warming, and the next
    /// endpoints response is sent even unchanged if it carries one of them.
    warm_base: Option<Held>,
}

impl SotwStream {
    /// A stream of `proxy`, answering from `snapshot`; subscribed names are interned in
    /// `names`.
    pub fn new(proxy: Arc<Proxy>, snapshot: Arc<ServedSnapshot>, names: Arc<NameSets>) -> Self {
        SotwStream {
            proxy,
            snapshot,
            names,
            nonces: NonceSource::default(),
            types: Default::default(),
            unknown_types: BTreeSet::new(),
            warm_base: None,
        }
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// Publisher version of the snapshot responses are computed from.
    pub fn snapshot_version(&self) -> u64 {
        self.snapshot.version()
    }

    /// Handles one client request: records ACK/NACK and the subscription, and marks the
    /// type as owing a response when the request asks for one.
    pub fn on_request(&mut self, request: &SotwRequest, now: SystemTime) -> Vec<ProtocolEvent> {
        let mut events = Vec::new();
        let Some(xds_type) = served_type(&request.type_url, &mut self.unknown_types, &mut events)
        else {
            return events;
        };
        let names = self.names.clone();
        let bytes_left = name_bytes_left(
            xds_type,
            XdsType::ALL
                .iter()
                .map(|t| (*t, &self.types[t.index()].record)),
        );
        let state = &mut self.types[xds_type.index()];
        let nonce = request.response_nonce.as_str();
        if state.record.is_stale(nonce) {
            events.push(ProtocolEvent::StaleNonce {
                xds_type,
                nonce: nonce.to_string(),
            });
            return events;
        }
        let nack = request.error_detail.as_ref();
        if let (false, Some(sent)) = (nonce.is_empty(), state.record.last_sent.as_ref()) {
            match nack {
                Some(error) => {
                    state.record.last_nack = Some(Box::new(NackStatus {
                        version: request.version_info.clone(),
                        nonce: nonce.to_string(),
                        detail: error.message.clone(),
                        at: now,
                    }));
                    events.push(ProtocolEvent::Nack {
                        xds_type,
                        nonce: nonce.to_string(),
                        detail: error.message.clone(),
                    });
                }
                // An ACK reports the version it applied. The latest nonce with another
                // version is a later request of a client that rejected that response
                // (e.g. a name change after a NACK), not an ACK of it.
                None if request.version_info != *sent.version => {}
                None => {
                    state.record.last_ack = Some(AckStatus {
                        version: sent.version.to_string(),
                        nonce: nonce.to_string(),
                        at: now,
                    });
                    state.holds = sent.view.clone();
                    events.push(ProtocolEvent::Ack {
                        xds_type,
                        nonce: nonce.to_string(),
                    });
                }
            }
        }
        let first_request = !state.record.requested;
        state.record.requested = true;
        let before = state.record.subscription.clone();
        // Applying the list the stream applied last changes nothing (the legacy wildcard
        // rule included: it only ever holds on the first request), so an ACK repeating
        // it is recognised by its digest.
        let digest = request.names_digest();
        let changed = if state.names_digest == digest {
            false
        } else {
            match state.record.subscription.apply_sotw(
                xds_type,
                first_request,
                request.resource_names(),
                &names,
                bytes_left,
            ) {
                Ok(changed) => {
                    state.names_digest = digest;
                    changed
                }
                Err((limit, reason)) => {
                    events.push(ProtocolEvent::OverLimit { limit, reason });
                    return events;
                }
            }
        };
        if changed {
            state.fresh.add(&before, &state.record.subscription);
        }
        // A request with the latest nonce and an unchanged name set is an ACK or a NACK:
        // answering it would make the client answer again (the silent hot loop).
        if !first_request && !nonce.is_empty() && !changed {
            return events;
        }
        // After a NACK, only different content is worth sending: the client just
        // rejected what it was sent.
        let reply = if nack.is_some() {
            Reply::IfChanged
        } else {
            Reply::Always
        };
        owe(&mut state.owed, reply);
        events
    }

    /// Moves the stream to a newer snapshot: every requested type (only EDS after an
    /// endpoints-only change) owes a response if its content changed.
    pub fn on_snapshot(&mut self, snapshot: Arc<ServedSnapshot>) {
        let previous = self.snapshot.version();
        if snapshot.version() == previous {
            return;
        }
        let kind = snapshot.change_since(previous);
        self.snapshot = snapshot;
        for xds_type in XdsType::ALL {
            let state = &mut self.types[xds_type.index()];
            if state.record.requested && (kind == ChangeKind::Full || xds_type == XdsType::Endpoint)
            {
                owe(&mut state.owed, Reply::IfChanged);
            }
        }
    }

    /// Whether some type owes a response (which may still turn out unchanged).
    pub fn has_owed(&self) -> bool {
        self.types.iter().any(|t| t.owed.is_some())
    }

    /// The next response to send, in make-before-break order, computed now from the
    /// newest snapshot; `None` when nothing is owed or nothing changed. What it returns
    /// is recorded as sent.
    pub fn next_response(&mut self, now: SystemTime) -> Option<SotwResponse> {
        for xds_type in XdsType::ALL {
            let Some(reply) = self.types[xds_type.index()].owed.take() else {
                continue;
            };
            let view = self.compute(xds_type);
            let warming = if xds_type == XdsType::Endpoint {
                self.warming(&view)
            } else {
                BTreeSet::new()
            };
            let forced = reply == Reply::Always || !warming.is_empty();
            let unchanged = self.types[xds_type.index()]
                .record
                .last_sent
                .as_ref()
                .and_then(|s| s.view.as_ref())
                .is_some_and(|sent| sent.same_content(&view));
            if unchanged && !forced {
                continue;
            }
            let partial = self.to_send(xds_type, &view, &warming);
            if reply == Reply::IfChanged && partial.as_ref().is_some_and(Vec::is_empty) {
                // Only deletions or what the client holds: nothing it needs (RDS and EDS
                // deletions follow from their parents). Not recorded as sent.
                continue;
            }
            match xds_type {
                XdsType::Cluster => {
                    if self.warm_base.is_none() {
                        self.warm_base = Some(
                            self.sent_view(XdsType::Cluster)
                                .map_or(Held::Nothing, Held::View),
                        );
                    }
                    let endpoints = &mut self.types[XdsType::Endpoint.index()];
                    if endpoints.record.requested {
                        owe(&mut endpoints.owed, Reply::IfChanged);
                    }
                }
                XdsType::Endpoint => self.warm_base = None,
                _ => {}
            }
            let nonce = self.nonces.next_nonce();
            let state = &mut self.types[xds_type.index()];
            state.fresh = Fresh::Nothing;
            // The record is the whole view: what the client holds once it ACKs.
            state.record.last_sent = Some(SentRecord {
                version: view.version().clone(),
                nonce: nonce.clone(),
                at: now,
                view: Some(view.clone()),
                resource_count: view.len(),
                removed_count: 0,
            });
            return Some(SotwResponse {
                view,
                partial,
                nonce,
            });
        }
        None
    }

    /// Per-type status for the registry, and the unknown type URLs seen.
    pub fn status(&self) -> (Vec<TypeStatus>, Vec<String>) {
        let types = XdsType::ALL
            .iter()
            .map(|t| (*t, &self.types[t.index()]))
            .filter(|(_, s)| s.record.requested)
            .map(|(t, s)| s.record.status(t, s.holds.as_ref().map_or(0, |h| h.len())))
            .collect();
        (types, self.unknown_types.iter().cloned().collect())
    }

    fn sent_view(&self, xds_type: XdsType) -> Option<Arc<View>> {
        self.types[xds_type.index()]
            .record
            .last_sent
            .as_ref()
            .and_then(|s| s.view.clone())
    }

    /// The endpoints in `view` of clusters sent new or changed since the last endpoints
    /// response: they are warming.
    fn warming(&self, view: &View) -> BTreeSet<String> {
        let (Some(base), Some(clusters)) = (&self.warm_base, self.sent_view(XdsType::Cluster))
        else {
            return BTreeSet::new();
        };
        base.changed_in(&clusters)
            .into_iter()
            .filter(|name| view.get(name).is_some())
            .map(str::to_string)
            .collect()
    }

    /// What a response of `view` carries: `None` for all of it (LDS and CDS always; RDS
    /// and EDS when the client needs everything), else the resources the client does not
    /// hold at their current version (against its last ACK, so anything sent but not
    /// acknowledged is sent again), names subscribed since the last response, and the
    /// endpoints of `warming` clusters.
    fn to_send(
        &self,
        xds_type: XdsType,
        view: &View,
        warming: &BTreeSet<String>,
    ) -> Option<Vec<Arc<Resource>>> {
        if xds_type.sends_state_of_the_world() {
            return None;
        }
        let state = &self.types[xds_type.index()];
        let holds = state.holds.as_ref()?;
        let mut changed: Vec<&Arc<Resource>> = Vec::new();
        if !holds.same_content(view) {
            walk_changes(view_entries(holds), view, |r| changed.push(r), |_| {});
        }
        let needed: Vec<Arc<Resource>> =
            if matches!(state.fresh, Fresh::Nothing) && warming.is_empty() {
                changed.into_iter().cloned().collect()
            } else {
                let mut changed = changed.into_iter().peekable();
                view.resources()
                    .iter()
                    .filter(|r| {
                        let is_changed = changed.next_if(|c| Arc::ptr_eq(c, r)).is_some();
                        is_changed || state.fresh.contains(&r.name) || warming.contains(&r.name)
                    })
                    .cloned()
                    .collect()
            };
        (needed.len() < view.len()).then_some(needed)
    }

    fn compute(&self, xds_type: XdsType) -> Arc<View> {
        let subscription = &self.types[xds_type.index()].record.subscription;
        if subscription.is_empty() {
            return Arc::new(View::empty(xds_type));
        }
        self.snapshot
            .view(&self.proxy, xds_type, subscription.query())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::map_snapshot::MapSnapshot;
    use crate::ads::resource::XdsSnapshot;
    use crate::ads::types::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
    use crate::ads::wire::decode;
    use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
    use envoy_types::pb::google::rpc::Status;

    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    /// What one input led to: the events, and every response the stream then sends
    /// (as the client decodes them) when the transport takes all it can.
    #[derive(Debug)]
    struct Output {
        responses: Vec<DiscoveryResponse>,
        events: Vec<ProtocolEvent>,
    }

    fn drain(s: &mut SotwStream) -> Vec<DiscoveryResponse> {
        std::iter::from_fn(|| s.next_response(T0))
            .map(|r| decode::sotw(&r))
            .collect()
    }

    fn handle(s: &mut SotwStream, r: &SotwRequest, now: SystemTime) -> Output {
        let events = s.on_request(r, now);
        Output {
            responses: drain(s),
            events,
        }
    }

    fn push(s: &mut SotwStream, snapshot: Arc<dyn XdsSnapshot>, _now: SystemTime) -> Output {
        s.on_snapshot(ServedSnapshot::new(snapshot));
        Output {
            responses: drain(s),
            events: Vec::new(),
        }
    }

    fn with(proxy: &str, snapshot: Arc<dyn XdsSnapshot>) -> SotwStream {
        SotwStream::new(
            Arc::new(Proxy::with_defaults(proxy)),
            ServedSnapshot::new(snapshot),
            NameSets::new(),
        )
    }

    fn stream(snapshot: MapSnapshot) -> SotwStream {
        with("p", snapshot.shared())
    }

    fn discovery_request(type_url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.to_string(),
            ..Default::default()
        }
    }

    fn req(type_url: &str, names: &[&str], nonce: &str) -> SotwRequest {
        discovery_request(type_url, names, nonce).into()
    }

    fn nack(type_url: &str, names: &[&str], nonce: &str) -> SotwRequest {
        DiscoveryRequest {
            error_detail: Some(Status {
                code: 3,
                message: "bad cluster".into(),
                details: vec![],
            }),
            ..discovery_request(type_url, names, nonce)
        }
        .into()
    }

    fn names(r: &DiscoveryResponse) -> Vec<String> {
        r.resources
            .iter()
            .map(|a| String::from_utf8(a.value.clone()).unwrap_or_default())
            .collect()
    }

    fn types(out: &Output) -> Vec<&str> {
        out.responses.iter().map(|r| r.type_url.as_str()).collect()
    }

    #[test]
    fn first_wildcard_request_is_answered_even_when_empty() {
        let mut s = stream(MapSnapshot::new(1));
        let out = handle(&mut s, &req(LISTENER_TYPE, &[], ""), T0);
        assert_eq!(out.responses.len(), 1);
        let r = &out.responses[0];
        assert!(r.resources.is_empty());
        assert!(!r.version_info.is_empty() && !r.nonce.is_empty());
        assert_eq!(
            r.control_plane.as_ref().map(|c| c.identifier.as_str()),
            Some("replica-a")
        );
    }

    #[test]
    fn ack_is_never_answered_but_later_changes_are_pushed() {
        let mut s = stream(MapSnapshot::sample(1));
        let first = handle(&mut s, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&first), ["c1", "c2"]);
        let mut ack = req(CLUSTER_TYPE, &[], &first.nonce);
        ack.version_info = first.version_info.clone();
        let out = handle(&mut s, &ack, T0);
        assert!(out.responses.is_empty());
        assert_eq!(
            out.events,
            [ProtocolEvent::Ack {
                xds_type: XdsType::Cluster,
                nonce: first.nonce.clone()
            }]
        );
        let out = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(CLUSTER_TYPE, "c3", b"c3")
                .next(2)
                .shared(),
            T0,
        );
        assert_eq!(out.responses.len(), 1);
        assert_eq!(names(&out.responses[0]), ["c1", "c2", "c3"]);
        assert_ne!(out.responses[0].nonce, first.nonce);
    }

    #[test]
    fn nack_is_recorded_and_same_content_never_resent() {
        let mut s = stream(MapSnapshot::sample(1));
        let first = handle(&mut s, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        let out = handle(&mut s, &nack(CLUSTER_TYPE, &[], &first.nonce), T0);
        assert!(out.responses.is_empty());
        assert!(
            matches!(&out.events[0], ProtocolEvent::Nack { detail, .. } if detail == "bad cluster")
        );
        let (status, _) = s.status();
        assert_eq!(
            status[0].last_nack.as_ref().map(|n| n.detail.as_str()),
            Some("bad cluster")
        );
        // A new snapshot with the same cluster content: nothing to send.
        assert!(
            push(&mut s, MapSnapshot::sample(1).next(2).shared(), T0)
                .responses
                .is_empty()
        );
        // New content is sent.
        let out = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(CLUSTER_TYPE, "c1", b"c1'")
                .next(3)
                .shared(),
            T0,
        );
        assert_eq!(names(&out.responses[0]), ["c1'", "c2"]);
    }

    #[test]
    fn a_request_after_a_nack_is_not_taken_for_an_ack() {
        let mut s = stream(MapSnapshot::sample(1));
        let good = handle(&mut s, &req(ENDPOINT_TYPE, &["c1"], ""), T0)
            .responses
            .remove(0);
        let mut ack = req(ENDPOINT_TYPE, &["c1"], &good.nonce);
        ack.version_info = good.version_info.clone();
        handle(&mut s, &ack, T0);
        let bad = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(ENDPOINT_TYPE, "c1", b"bad")
                .next(2)
                .shared(),
            T0,
        )
        .responses
        .remove(0);
        let mut rejected = nack(ENDPOINT_TYPE, &["c1"], &bad.nonce);
        rejected.version_info = good.version_info.clone();
        handle(&mut s, &rejected, T0);
        // The client now adds a name, still reporting its last good version.
        let mut more = req(ENDPOINT_TYPE, &["c1", "c2"], &bad.nonce);
        more.version_info = good.version_info.clone();
        let out = handle(&mut s, &more, T0);
        assert!(out.events.is_empty(), "{:?}", out.events);
        assert_eq!(names(&out.responses[0]), ["bad", "e2"]);
        let (status, _) = s.status();
        assert_eq!(
            status[0].last_ack.as_ref().map(|a| a.version.as_str()),
            Some(good.version_info.as_str())
        );
    }

    #[test]
    fn a_nonce_from_a_previous_stream_on_the_first_request_is_answered() {
        let mut s = stream(MapSnapshot::sample(1));
        let out = handle(
            &mut s,
            &req(CLUSTER_TYPE, &[], "nonce-of-another-replica"),
            T0,
        );
        assert_eq!(names(&out.responses[0]), ["c1", "c2"]);
        assert!(
            out.events.is_empty(),
            "neither stale nor an ACK: {:?}",
            out.events
        );
    }

    #[test]
    fn stale_nonce_is_ignored() {
        let mut s = stream(MapSnapshot::sample(1));
        let first = handle(&mut s, &req(ROUTE_TYPE, &["r1"], ""), T0)
            .responses
            .remove(0);
        let second = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(ROUTE_TYPE, "r1", b"r1'")
                .next(2)
                .shared(),
            T0,
        )
        .responses
        .remove(0);
        // The client changes names while still answering the first response: stale.
        let out = handle(&mut s, &req(ROUTE_TYPE, &["r1", "r2"], &first.nonce), T0);
        assert!(out.responses.is_empty());
        assert!(matches!(out.events[0], ProtocolEvent::StaleNonce { .. }));
        // The same change with the latest nonce is answered.
        let out = handle(&mut s, &req(ROUTE_TYPE, &["r1", "r2"], &second.nonce), T0);
        assert_eq!(names(&out.responses[0]), ["r1'", "r2"]);
    }

    #[test]
    fn changed_names_are_answered_with_exactly_the_subscribed_set_aba() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = handle(&mut s, &req(ROUTE_TYPE, &["r1"], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["r1"]);
        let r = handle(&mut s, &req(ROUTE_TYPE, &["r2"], &r.nonce), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["r2"]);
        let r = handle(&mut s, &req(ROUTE_TYPE, &["r1"], &r.nonce), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["r1"], "R1 is sent again after R1→R2→R1");
    }

    #[test]
    fn names_requested_before_they_exist_are_sent_when_they_appear() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = handle(&mut s, &req(ENDPOINT_TYPE, &["c1", "later"], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["e1"]);
        handle(&mut s, &req(ENDPOINT_TYPE, &["c1", "later"], &r.nonce), T0);
        let out = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(ENDPOINT_TYPE, "later", b"eL")
                .next(2)
                .shared(),
            T0,
        );
        assert_eq!(names(&out.responses[0]), ["e1", "eL"]);
    }

    #[test]
    fn push_order_is_make_before_break_and_only_changed_types() {
        let mut s = stream(MapSnapshot::sample(1));
        for (t, n) in [
            (ROUTE_TYPE, &["r1"][..]),
            (LISTENER_TYPE, &[]),
            (ENDPOINT_TYPE, &["c1"]),
            (CLUSTER_TYPE, &[]),
        ] {
            handle(&mut s, &req(t, n, ""), T0);
        }
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c2", b"c2'")
            .with(LISTENER_TYPE, "l1", b"l1'")
            .with(ROUTE_TYPE, "r1", b"r1'")
            .next(2);
        let out = push(&mut s, next.shared(), T0);
        // c2 changed but its endpoints are not subscribed: no EDS.
        assert_eq!(types(&out), [CLUSTER_TYPE, LISTENER_TYPE, ROUTE_TYPE]);
    }

    #[test]
    fn changed_cluster_is_followed_by_its_endpoints_even_unchanged() {
        let mut s = stream(MapSnapshot::sample(1));
        let cds = handle(&mut s, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        handle(&mut s, &req(CLUSTER_TYPE, &[], &cds.nonce), T0);
        let eds = handle(&mut s, &req(ENDPOINT_TYPE, &["c1", "c2"], ""), T0)
            .responses
            .remove(0);
        handle(&mut s, &req(ENDPOINT_TYPE, &["c1", "c2"], &eds.nonce), T0);
        let out = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(CLUSTER_TYPE, "c1", b"c1'")
                .next(2)
                .shared(),
            T0,
        );
        assert_eq!(types(&out), [CLUSTER_TYPE, ENDPOINT_TYPE]);
        let follow = &out.responses[1];
        assert_eq!(names(follow), ["e1", "e2"]);
        assert_eq!(
            follow.version_info, eds.version_info,
            "same content, fresh nonce"
        );
        assert_ne!(follow.nonce, eds.nonce);
    }

    #[test]
    fn endpoints_only_change_recomputes_eds_alone() {
        let mut s = stream(MapSnapshot::sample(1));
        handle(&mut s, &req(CLUSTER_TYPE, &[], ""), T0);
        handle(&mut s, &req(ENDPOINT_TYPE, &["c1"], ""), T0);
        // The publisher says "endpoints only", so even a cluster difference is not looked at.
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c9", b"c9")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .next(2)
            .endpoints_only_since(1);
        let out = push(&mut s, next.shared(), T0);
        assert_eq!(types(&out), [ENDPOINT_TYPE]);
        assert_eq!(names(&out.responses[0]), ["e1'"]);
    }

    #[test]
    fn unknown_type_is_reported_once_and_ignored() {
        let mut s = stream(MapSnapshot::sample(1));
        let url = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
        let out = handle(&mut s, &req(url, &[], ""), T0);
        assert!(out.responses.is_empty());
        assert_eq!(
            out.events,
            [ProtocolEvent::UnknownType {
                type_url: url.into(),
                first_time: true
            }]
        );
        let out = handle(&mut s, &req(url, &[], ""), T0);
        assert_eq!(
            out.events,
            [ProtocolEvent::UnknownType {
                type_url: url.into(),
                first_time: false
            }]
        );
        assert_eq!(s.status().1, [url.to_string()]);
    }

    #[test]
    fn versions_are_content_hashes_identical_across_streams() {
        let mut a = stream(MapSnapshot::sample(1));
        let mut b = with("q", MapSnapshot::sample(1).next(99).shared());
        let ra = handle(&mut a, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        let rb = handle(&mut b, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_eq!(ra.version_info, rb.version_info);
        let mut c = stream(MapSnapshot::sample(1).with(CLUSTER_TYPE, "c2", b"x"));
        let rc = handle(&mut c, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_ne!(ra.version_info, rc.version_info);
    }

    #[test]
    fn deleted_listener_disappears_from_the_full_set() {
        let mut s = stream(MapSnapshot::sample(1).with(LISTENER_TYPE, "l2", b"l2"));
        let r = handle(&mut s, &req(LISTENER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["l1", "l2"]);
        let out = push(&mut s, MapSnapshot::sample(1).next(2).shared(), T0);
        assert_eq!(names(&out.responses[0]), ["l1"]);
    }

    #[test]
    fn unsubscribing_everything_answers_empty_and_stops_pushes() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = handle(&mut s, &req(ROUTE_TYPE, &["r1"], ""), T0)
            .responses
            .remove(0);
        let r = handle(&mut s, &req(ROUTE_TYPE, &[], &r.nonce), T0)
            .responses
            .remove(0);
        assert!(r.resources.is_empty());
        handle(&mut s, &req(ROUTE_TYPE, &[], &r.nonce), T0);
        let out = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(ROUTE_TYPE, "r1", b"r1'")
                .next(2)
                .shared(),
            T0,
        );
        assert!(out.responses.is_empty());
    }

    #[test]
    fn never_the_same_name_twice_in_a_response() {
        let mut s = with("p", Arc::new(crate::ads::state::DuplicatingSnapshot));
        let r = handle(&mut s, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["one"]);
    }

    #[test]
    fn nonces_are_unique_on_a_stream() {
        let mut s = stream(MapSnapshot::sample(1));
        let mut seen = BTreeSet::new();
        for t in [CLUSTER_TYPE, LISTENER_TYPE, ROUTE_TYPE, ENDPOINT_TYPE] {
            for r in handle(&mut s, &req(t, &["*"], ""), T0).responses {
                assert!(seen.insert(r.nonce));
            }
        }
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .with(LISTENER_TYPE, "l1", b"l1'")
            .with(ROUTE_TYPE, "r1", b"r1'")
            .next(5);
        for r in push(&mut s, next.shared(), T0).responses {
            assert!(seen.insert(r.nonce));
        }
        assert_eq!(seen.len(), 8);
    }

    /// Acknowledges `r` on `s` (the events of the ACK; nothing is sent).
    fn ack(s: &mut SotwStream, r: &DiscoveryResponse, names: &[&str]) -> Vec<ProtocolEvent> {
        let mut request = req(&r.type_url, names, &r.nonce);
        request.version_info = r.version_info.clone();
        let events = s.on_request(&request, T0);
        assert!(!s.has_owed(), "an ACK owes nothing");
        events
    }

    #[test]
    fn snapshots_that_arrive_before_the_stream_can_send_are_replaced_by_the_newest() {
        let mut s = stream(MapSnapshot::sample(1));
        let first = handle(&mut s, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        ack(&mut s, &first, &[]);
        // Three snapshots while the transport is busy: nothing is computed yet.
        for (version, payload) in [(2, b"c1-v2"), (3, b"c1-v3"), (4, b"c1-v4")] {
            s.on_snapshot(ServedSnapshot::new(
                MapSnapshot::sample(1)
                    .with(CLUSTER_TYPE, "c1", payload)
                    .next(version)
                    .shared(),
            ));
        }
        assert!(s.has_owed());
        // When it can send: one response, of the newest snapshot, with the next nonce.
        let sent = drain(&mut s);
        assert_eq!(sent.len(), 1);
        assert_eq!(names(&sent[0]), ["c1-v4", "c2"]);
        assert_eq!(
            sent[0].nonce, "2",
            "no nonce was spent on the replaced responses"
        );
        assert_eq!(s.snapshot_version(), 4);
    }

    #[test]
    fn an_ack_arriving_while_a_newer_response_is_owed_is_an_ack_not_stale() {
        let mut s = stream(MapSnapshot::sample(1));
        let first = handle(&mut s, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        // A new snapshot is owed but not sent when the client's ACK of the first arrives:
        // the client saw only the first nonce, which is still the latest sent.
        s.on_snapshot(ServedSnapshot::new(
            MapSnapshot::sample(1)
                .with(CLUSTER_TYPE, "c9", b"c9")
                .next(2)
                .shared(),
        ));
        let mut request = req(CLUSTER_TYPE, &[], &first.nonce);
        request.version_info = first.version_info.clone();
        let events = s.on_request(&request, T0);
        assert!(
            matches!(events[..], [ProtocolEvent::Ack { .. }]),
            "{events:?}"
        );
        let (status, _) = s.status();
        assert_eq!(status[0].sync_state(), "SYNCED");
        // The owed response still goes out, and its NACK is recorded against it.
        let next = drain(&mut s).remove(0);
        assert_eq!(names(&next), ["c1", "c2", "c9"]);
        let events = s.on_request(&nack(CLUSTER_TYPE, &[], &next.nonce), T0);
        assert!(
            matches!(events[..], [ProtocolEvent::Nack { .. }]),
            "{events:?}"
        );
        assert_eq!(s.status().0[0].sync_state(), "NACKED");
    }

    #[test]
    fn owed_types_go_out_in_make_before_break_order_whatever_the_order_asked() {
        let mut s = stream(MapSnapshot::sample(1));
        // Asked while the transport is busy, routes first.
        for (t, n) in [
            (ROUTE_TYPE, &["r1"][..]),
            (LISTENER_TYPE, &[]),
            (ENDPOINT_TYPE, &["c1"]),
            (CLUSTER_TYPE, &[]),
        ] {
            s.on_request(&req(t, n, ""), T0);
        }
        let sent = drain(&mut s);
        assert_eq!(
            types(&Output {
                responses: sent,
                events: vec![]
            }),
            [CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE]
        );
    }

    #[test]
    fn a_snapshot_that_changes_nothing_for_the_stream_sends_nothing_and_keeps_the_same_view() {
        let mut s = stream(MapSnapshot::sample(1));
        let cds = handle(&mut s, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        ack(&mut s, &cds, &[]);
        let old = s.sent_view(XdsType::Cluster).expect("sent");
        let next = ServedSnapshot::new(MapSnapshot::sample(1).next(2).shared());
        s.on_snapshot(next.clone());
        assert!(drain(&mut s).is_empty());
        let now = next.view(
            &Arc::new(Proxy::with_defaults("other")),
            XdsType::Cluster,
            None,
        );
        assert!(
            Arc::ptr_eq(&old, &now),
            "equal content in a new snapshot is the same view: one copy, one encoding"
        );
        assert_eq!(s.status().0[0].sync_state(), "SYNCED");
    }

    #[test]
    fn streams_of_one_scope_share_their_records_and_subscriptions() {
        let served = ServedSnapshot::new(MapSnapshot::sample(1).shared());
        let names = NameSets::new();
        let mut streams: Vec<SotwStream> = (0..3)
            .map(|i| {
                SotwStream::new(
                    Arc::new(Proxy::with_defaults(format!("p{i}"))),
                    served.clone(),
                    names.clone(),
                )
            })
            .collect();
        for s in &mut streams {
            let r = handle(s, &req(ENDPOINT_TYPE, &["c2", "c1"], ""), T0)
                .responses
                .remove(0);
            ack(s, &r, &["c1", "c2"]);
        }
        let views: Vec<Arc<View>> = streams
            .iter()
            .map(|s| s.sent_view(XdsType::Endpoint).expect("sent"))
            .collect();
        assert!(views.windows(2).all(|w| Arc::ptr_eq(&w[0], &w[1])));
        assert!(streams.windows(2).all(|w| Arc::ptr_eq(
            &w[0].types[1].record.subscription.names,
            &w[1].types[1].record.subscription.names
        )));
        assert_eq!(names.len(), 1);
        assert_eq!(served.live_views(), 1);
    }

    #[test]
    fn a_cluster_change_while_the_transport_is_busy_still_warms_its_endpoints() {
        let mut s = stream(MapSnapshot::sample(1));
        let cds = handle(&mut s, &req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        ack(&mut s, &cds, &[]);
        let eds = handle(&mut s, &req(ENDPOINT_TYPE, &["c1", "c2"], ""), T0)
            .responses
            .remove(0);
        ack(&mut s, &eds, &["c1", "c2"]);
        // Two snapshots: the first changes c1, the second nothing more.
        for version in [2, 3] {
            s.on_snapshot(ServedSnapshot::new(
                MapSnapshot::sample(1)
                    .with(CLUSTER_TYPE, "c1", b"c1'")
                    .next(version)
                    .shared(),
            ));
        }
        let out = drain(&mut s);
        let kinds: Vec<&str> = out.iter().map(|r| r.type_url.as_str()).collect();
        assert_eq!(kinds, [CLUSTER_TYPE, ENDPOINT_TYPE]);
        assert_eq!(
            out[1].version_info, eds.version_info,
            "unchanged, sent to warm"
        );
    }

    /// Sends the first response of `type_url` for `names` and ACKs it.
    fn subscribed(s: &mut SotwStream, type_url: &str, names: &[&str]) -> DiscoveryResponse {
        let r = handle(s, &req(type_url, names, ""), T0).responses.remove(0);
        ack(s, &r, names);
        r
    }

    #[test]
    fn route_and_endpoint_pushes_carry_only_what_changed() {
        let mut s = stream(MapSnapshot::sample(1));
        subscribed(&mut s, ROUTE_TYPE, &["r1", "r2"]);
        subscribed(&mut s, LISTENER_TYPE, &[]);
        let next =
            MapSnapshot::sample(1)
                .with(ROUTE_TYPE, "r1", b"r1'")
                .with(LISTENER_TYPE, "l2", b"l2");
        let out = push(&mut s, next.next(2).shared(), T0);
        assert_eq!(types(&out), [LISTENER_TYPE, ROUTE_TYPE]);
        assert_eq!(
            names(&out.responses[0]),
            ["l1", "l2"],
            "LDS: the whole state"
        );
        assert_eq!(
            names(&out.responses[1]),
            ["r1'"],
            "RDS: the changed one only"
        );
        // The version is that of the whole view, as a fresh stream computes it.
        let fresh = handle(&mut stream(next), &req(ROUTE_TYPE, &["r1", "r2"], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&fresh), ["r1'", "r2"]);
        assert_eq!(out.responses[1].version_info, fresh.version_info);
    }

    #[test]
    fn a_new_name_is_answered_with_itself_and_nothing_held() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = subscribed(&mut s, ROUTE_TYPE, &["r1"]);
        let out = handle(&mut s, &req(ROUTE_TYPE, &["r1", "r2"], &r.nonce), T0);
        assert_eq!(names(&out.responses[0]), ["r2"]);
    }

    #[test]
    fn a_name_dropped_and_asked_again_before_the_ack_is_sent_again() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = subscribed(&mut s, ROUTE_TYPE, &["r1", "r2"]);
        // r2 dropped, then asked again while the client has not ACKed the drop: it held
        // r2 at its last ACK, but dropped it since.
        s.on_request(&req(ROUTE_TYPE, &["r1"], &r.nonce), T0);
        let dropped = drain(&mut s).remove(0);
        assert!(names(&dropped).is_empty(), "r1 is held");
        s.on_request(&req(ROUTE_TYPE, &["r1", "r2"], &dropped.nonce), T0);
        let out = drain(&mut s);
        assert_eq!(names(&out[0]), ["r2"]);
    }

    #[test]
    fn names_asked_while_the_transport_is_busy_are_all_sent() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = subscribed(&mut s, ENDPOINT_TYPE, &["c1"]);
        // Two name changes before the stream can send: both new names go in the one
        // response.
        s.on_request(&req(ENDPOINT_TYPE, &["c1", "c2"], &r.nonce), T0);
        s.on_request(&req(ENDPOINT_TYPE, &["c2", "c1", "c3"], &r.nonce), T0);
        let sent = drain(&mut s);
        assert_eq!(sent.len(), 1);
        assert_eq!(names(&sent[0]), ["e2"], "c3 does not exist; c1 is held");
    }

    #[test]
    fn what_was_sent_but_not_acknowledged_is_sent_again() {
        let mut s = stream(MapSnapshot::sample(1));
        handle(&mut s, &req(ROUTE_TYPE, &["r1", "r2"], ""), T0);
        let out = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(ROUTE_TYPE, "r1", b"r1'")
                .next(2)
                .shared(),
            T0,
        );
        assert_eq!(names(&out.responses[0]), ["r1'", "r2"]);
    }

    #[test]
    fn a_warming_cluster_gets_its_own_endpoints_not_the_others() {
        let mut s = stream(MapSnapshot::sample(1));
        subscribed(&mut s, CLUSTER_TYPE, &[]);
        subscribed(&mut s, ENDPOINT_TYPE, &["c1", "c2"]);
        let out = push(
            &mut s,
            MapSnapshot::sample(1)
                .with(CLUSTER_TYPE, "c1", b"c1'")
                .next(2)
                .shared(),
            T0,
        );
        assert_eq!(types(&out), [CLUSTER_TYPE, ENDPOINT_TYPE]);
        assert_eq!(
            names(&out.responses[1]),
            ["e1"],
            "unchanged, but c1 is warming"
        );
    }

    #[test]
    fn deleting_a_route_sends_no_route_response() {
        let mut s = stream(MapSnapshot::sample(1));
        subscribed(&mut s, ROUTE_TYPE, &["r1", "r2"]);
        let out = push(
            &mut s,
            MapSnapshot::sample(1)
                .without(ROUTE_TYPE, "r2")
                .next(2)
                .shared(),
            T0,
        );
        assert!(out.responses.is_empty(), "the listener that named it goes");
        assert!(!s.has_owed());
    }

    #[test]
    fn a_partial_response_shares_the_resources_encodings_across_streams() {
        let served = ServedSnapshot::new(MapSnapshot::sample(1).shared());
        let names = NameSets::new();
        let mut streams: Vec<SotwStream> = (0..2)
            .map(|i| {
                SotwStream::new(
                    Arc::new(Proxy::with_defaults(format!("p{i}"))),
                    served.clone(),
                    names.clone(),
                )
            })
            .collect();
        let next = ServedSnapshot::new(
            MapSnapshot::sample(1)
                .with(ROUTE_TYPE, "r1", b"r1-shared")
                .next(2)
                .shared(),
        );
        let mut sent = Vec::new();
        for s in &mut streams {
            subscribed(s, ROUTE_TYPE, &["r1", "r2"]);
            s.on_snapshot(next.clone());
            let response = s.next_response(T0).expect("r1 changed");
            assert_eq!(response.resource_count(), 1);
            sent.push(response);
        }
        let [a, b] = &sent[..] else { unreachable!() };
        let (a, b) = (
            a.partial.as_ref().expect("partial"),
            b.partial.as_ref().expect("partial"),
        );
        assert!(Arc::ptr_eq(&a[0], &b[0]), "one resource, one encoding");
        assert!(Arc::ptr_eq(&sent[0].view, &sent[1].view), "one record");
    }

    #[test]
    fn a_name_list_beyond_the_caps_is_refused_and_nothing_applied() {
        use crate::ads::state::{Limit, MAX_SUBSCRIBED_NAME_BYTES, MAX_SUBSCRIBED_NAMES};
        let over = |events: &[ProtocolEvent]| {
            events.iter().any(|e| {
                matches!(
                    e,
                    ProtocolEvent::OverLimit {
                        limit: Limit::SubscribedNames,
                        ..
                    }
                )
            })
        };
        let held = |s: &SotwStream, t: XdsType| {
            let names = &s.types[t.index()].record.subscription.names;
            (names.len(), names.bytes())
        };
        let mut s = stream(MapSnapshot::sample(1));
        let all: Vec<String> = (0..MAX_SUBSCRIBED_NAMES)
            .map(|i| format!("c{i:06}"))
            .collect();
        let mut request = discovery_request(ENDPOINT_TYPE, &[], "");
        request.resource_names = all.clone();
        assert!(!over(&s.on_request(&request.clone().into(), T0)));
        assert_eq!(
            held(&s, XdsType::Endpoint),
            (MAX_SUBSCRIBED_NAMES, 7 * MAX_SUBSCRIBED_NAMES)
        );
        request.resource_names.push("one-more".into());
        assert!(over(&s.on_request(&request.clone().into(), T0)));
        assert_eq!(
            held(&s, XdsType::Endpoint).0,
            MAX_SUBSCRIBED_NAMES,
            "nothing applied"
        );
        // Repeats of names do not count.
        request.resource_names = all.iter().chain(all.iter()).cloned().collect();
        assert!(!over(&s.on_request(&request.into(), T0)));

        // Bytes, across types: 10 MiB of endpoint names leave no room for 10 MiB of routes.
        let mut s = stream(MapSnapshot::sample(1));
        let long = |prefix: &str, i: usize| format!("{prefix}{i:0>252}");
        let mut eds = discovery_request(ENDPOINT_TYPE, &[], "");
        eds.resource_names = (0..40_000).map(|i| long("eds-", i)).collect();
        assert!(!over(&s.on_request(&eds.into(), T0)));
        let mut rds = discovery_request(ROUTE_TYPE, &[], "");
        rds.resource_names = (0..40_000).map(|i| long("rds-", i)).collect();
        assert!(over(&s.on_request(&rds.into(), T0)));
        let total: usize = XdsType::ALL.iter().map(|t| held(&s, *t).1).sum();
        assert_eq!(total, 40_000 * 256);
        assert!(total <= MAX_SUBSCRIBED_NAME_BYTES);
    }

    /// A name that is not UTF-8 (which decoding it as a `string` would have refused) ends
    /// the stream as malformed; the same bytes repeated by an ACK are compared, never
    /// converted.
    #[test]
    fn a_name_that_is_not_utf8_is_a_malformed_request() {
        use crate::ads::request::RequestMessage;
        use crate::ads::state::Limit;
        use prost::Message;
        let mut s = stream(MapSnapshot::sample(1));
        let mut wire = discovery_request(ENDPOINT_TYPE, &["c1"], "").encode_to_vec();
        // resource_names (field 3) once more: two bytes that are not UTF-8.
        wire.extend_from_slice(&[0x1a, 0x02, 0xff, 0xfe]);
        let request = SotwRequest::decode(wire.into()).expect("decodes: names are bytes");
        let events = s.on_request(&request, T0);
        assert!(
            matches!(
                events.as_slice(),
                [ProtocolEvent::OverLimit {
                    limit: Limit::Malformed,
                    ..
                }]
            ),
            "{events:?}"
        );
        assert!(
            s.types[XdsType::Endpoint.index()]
                .record
                .subscription
                .names
                .is_empty()
        );
    }
}
