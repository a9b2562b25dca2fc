//! The state-of-the-world ADS state machine of one stream ([`SotwStream`]): synchronous
//! and free of I/O. Input: a `DiscoveryRequest` or a new snapshot; output: the responses
//! to send, in wire order, and the protocol events to log and count.
//!
//! Rules it implements (each has a unit test below and a wire test in
//! `tests/integration/ads_sotw.rs`):
//! - the first request of a type is answered at once, even when empty;
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
//!   ACK, newly subscribed names, and the endpoints of warming clusters — as the protocol
//!   allows for these types (their deletion follows from their parents). One
//!   VirtualService edit then sends one route configuration, not every one the client
//!   subscribes to;
//! - `version_info` is a hash of the names and resource versions of the whole subscribed
//!   view (also when the response carries part of it).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use pilotfish_mesh::model::Proxy;

use super::resource::{ChangeKind, Resource, XdsSnapshot, to_envoy_any};
use super::state::{AckStatus, NackStatus, TypeStatus};
use super::state::{
    NonceSource, Output, ProtocolEvent, SentRecord, TypeRecord, served_type, view_version,
};
use super::types::XdsType;

/// Per type: the protocol record and what the client holds (the content of its last ACK).
#[derive(Debug, Default)]
struct SotwType {
    record: TypeRecord,
    holds: Arc<BTreeMap<String, String>>,
}

/// The content of one response: resources deduplicated by name, in name order.
struct Content {
    resources: Vec<Arc<Resource>>,
    versions: BTreeMap<String, String>,
    version: String,
}

/// State of one SotW ADS stream.
pub struct SotwStream {
    proxy: Arc<Proxy>,
    control_plane: ControlPlane,
    snapshot: Arc<dyn XdsSnapshot>,
    nonces: NonceSource,
    types: BTreeMap<XdsType, SotwType>,
    unknown_types: BTreeSet<String>,
}

impl SotwStream {
    /// A stream of `proxy`, answering from `snapshot`, signing responses with
    /// `control_plane_id` (the replica name).
    pub fn new(proxy: Arc<Proxy>, control_plane_id: &str, snapshot: Arc<dyn XdsSnapshot>) -> Self {
        SotwStream {
            proxy,
            control_plane: ControlPlane {
                identifier: control_plane_id.to_string(),
            },
            snapshot,
            nonces: NonceSource::default(),
            types: XdsType::ALL
                .iter()
                .map(|t| (*t, SotwType::default()))
                .collect(),
            unknown_types: BTreeSet::new(),
        }
    }

    pub fn proxy(&self) -> &Proxy {
        &self.proxy
    }

    /// Publisher version of the snapshot responses are computed from.
    pub fn snapshot_version(&self) -> u64 {
        self.snapshot.version()
    }

    /// Handles one client request.
    pub fn on_request(
        &mut self,
        request: &DiscoveryRequest,
        now: SystemTime,
    ) -> Output<DiscoveryResponse> {
        let mut out = Output::default();
        let Some(xds_type) = served_type(&request.type_url, &mut self.unknown_types, &mut out)
        else {
            return out;
        };
        let state = self.type_state(xds_type);
        let nonce = request.response_nonce.as_str();
        if state.record.is_stale(nonce) {
            out.events.push(ProtocolEvent::StaleNonce {
                xds_type,
                nonce: nonce.to_string(),
            });
            return out;
        }
        let nack = request.error_detail.as_ref();
        if let (false, Some(sent)) = (nonce.is_empty(), state.record.last_sent.as_ref()) {
            match nack {
                Some(error) => {
                    state.record.last_nack = Some(NackStatus {
                        version: request.version_info.clone(),
                        nonce: nonce.to_string(),
                        detail: error.message.clone(),
                        at: now,
                    });
                    out.events.push(ProtocolEvent::Nack {
                        xds_type,
                        nonce: nonce.to_string(),
                        detail: error.message.clone(),
                    });
                }
                // An ACK reports the version it applied. The latest nonce with another
                // version is a later request of a client that rejected that response
                // (e.g. a name change after a NACK), not an ACK of it.
                None if request.version_info != sent.version => {}
                None => {
                    state.record.last_ack = Some(AckStatus {
                        version: sent.version.clone(),
                        nonce: nonce.to_string(),
                        at: now,
                    });
                    state.holds = sent.resources.clone();
                    out.events.push(ProtocolEvent::Ack {
                        xds_type,
                        nonce: nonce.to_string(),
                    });
                }
            }
        }
        let first_request = !state.record.requested;
        state.record.requested = true;
        let before = state.record.subscription.clone();
        let changed =
            state
                .record
                .subscription
                .apply_sotw(xds_type, first_request, &request.resource_names);
        // Names the client asks for now and did not before: it wants them even if it
        // held them once (A→B→A).
        let subscription = &state.record.subscription;
        let fresh: BTreeSet<String> = if subscription.wildcard && !before.wildcard {
            self.compute(xds_type).versions.into_keys().collect()
        } else {
            subscription
                .names
                .difference(&before.names)
                .cloned()
                .collect()
        };
        // A request with the latest nonce and an unchanged name set is an ACK or a NACK:
        // answering it would make the client answer again (the silent hot loop).
        if !first_request && !nonce.is_empty() && !changed {
            return out;
        }
        let content = self.compute(xds_type);
        let last_version = self.last_version(xds_type);
        if nack.is_some() && last_version == Some(content.version.as_str()) {
            // The client just rejected exactly this content.
            return out;
        }
        let changed_clusters = self.changed_names(xds_type, &content);
        let resources = self.to_send(xds_type, &content, &fresh);
        out.responses
            .push(self.send(xds_type, content, resources, now));
        if xds_type == XdsType::Cluster {
            self.follow_with_endpoints(&changed_clusters, now, &mut out);
        }
        out
    }

    /// Moves the stream to a newer snapshot and returns what must be pushed.
    pub fn on_snapshot(
        &mut self,
        snapshot: Arc<dyn XdsSnapshot>,
        now: SystemTime,
    ) -> Output<DiscoveryResponse> {
        let mut out = Output::default();
        let previous = self.snapshot.version();
        if snapshot.version() == previous {
            return out;
        }
        let kind = snapshot.change_since(previous);
        self.snapshot = snapshot;
        let mut changed_clusters = BTreeSet::new();
        for xds_type in XdsType::ALL {
            if !self.type_state(xds_type).record.requested
                || (kind == ChangeKind::EndpointsOnly && xds_type != XdsType::Endpoint)
            {
                continue;
            }
            let content = self.compute(xds_type);
            let warms_cluster = xds_type == XdsType::Endpoint
                && content
                    .versions
                    .keys()
                    .any(|n| changed_clusters.contains(n));
            if self.last_version(xds_type) == Some(content.version.as_str()) && !warms_cluster {
                continue;
            }
            let resources = if xds_type == XdsType::Endpoint {
                self.to_send(xds_type, &content, &changed_clusters)
            } else {
                self.to_send(xds_type, &content, &BTreeSet::new())
            };
            if xds_type == XdsType::Cluster {
                changed_clusters = self.changed_names(xds_type, &content);
            }
            if resources.is_empty() && !xds_type.sends_state_of_the_world() {
                // Only deletions or unchanged names: nothing the client needs (RDS and EDS
                // deletions follow from their parents).
                continue;
            }
            out.responses
                .push(self.send(xds_type, content, resources, now));
        }
        out
    }

    /// Per-type status for the registry, and the unknown type URLs seen.
    pub fn status(&self) -> (Vec<TypeStatus>, Vec<String>) {
        let types = self
            .types
            .iter()
            .filter(|(_, s)| s.record.requested)
            .map(|(t, s)| s.record.status(*t, s.holds.len()))
            .collect();
        (types, self.unknown_types.iter().cloned().collect())
    }

    fn type_state(&mut self, xds_type: XdsType) -> &mut SotwType {
        self.types.entry(xds_type).or_default()
    }

    fn last_version(&self, xds_type: XdsType) -> Option<&str> {
        self.types
            .get(&xds_type)
            .and_then(|s| s.record.last_sent.as_ref())
            .map(|s| s.version.as_str())
    }

    /// Names in `content` that are new or changed compared with the last response sent.
    fn changed_names(&self, xds_type: XdsType, content: &Content) -> BTreeSet<String> {
        let previous = self
            .types
            .get(&xds_type)
            .and_then(|s| s.record.last_sent.as_ref())
            .map(|s| &s.resources);
        content
            .versions
            .iter()
            .filter(|(name, version)| previous.and_then(|p| p.get(*name)) != Some(*version))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// After a cluster response: resend the subscribed endpoints when they include a
    /// cluster that is new or changed for this client, so it can finish warming.
    fn follow_with_endpoints(
        &mut self,
        changed_clusters: &BTreeSet<String>,
        now: SystemTime,
        out: &mut Output<DiscoveryResponse>,
    ) {
        if changed_clusters.is_empty() || !self.type_state(XdsType::Endpoint).record.requested {
            return;
        }
        let content = self.compute(XdsType::Endpoint);
        if content
            .versions
            .keys()
            .any(|n| changed_clusters.contains(n))
        {
            let resources = self.to_send(XdsType::Endpoint, &content, changed_clusters);
            out.responses
                .push(self.send(XdsType::Endpoint, content, resources, now));
        }
    }

    /// What a response of `content` carries: everything for LDS and CDS; for RDS and EDS
    /// the resources the client does not hold at their current version (against its last
    /// ACK, so anything sent but not acknowledged is sent again) and those named in
    /// `also` (newly subscribed names, endpoints of warming clusters).
    fn to_send(
        &self,
        xds_type: XdsType,
        content: &Content,
        also: &BTreeSet<String>,
    ) -> Vec<Arc<Resource>> {
        if xds_type.sends_state_of_the_world() {
            return content.resources.clone();
        }
        let holds = &self.types[&xds_type].holds;
        content
            .resources
            .iter()
            .filter(|r| also.contains(&r.name) || holds.get(&r.name) != Some(&r.version))
            .cloned()
            .collect()
    }

    fn compute(&self, xds_type: XdsType) -> Content {
        let subscription = &self.types[&xds_type].record.subscription;
        let mut by_name: BTreeMap<String, Arc<Resource>> = BTreeMap::new();
        if !subscription.is_empty() {
            for resource in
                self.snapshot
                    .resources(&self.proxy, xds_type.type_url(), subscription.query())
            {
                // Never the same name twice in one response: the first one wins.
                by_name.entry(resource.name.clone()).or_insert(resource);
            }
        }
        let versions: BTreeMap<String, String> = by_name
            .iter()
            .map(|(n, r)| (n.clone(), r.version.clone()))
            .collect();
        Content {
            version: view_version(versions.iter()),
            resources: by_name.into_values().collect(),
            versions,
        }
    }

    /// Sends `resources` (all or part of `content`) as the response for `content`: the
    /// record says what the client holds once it ACKs, the whole of `content`.
    fn send(
        &mut self,
        xds_type: XdsType,
        content: Content,
        resources: Vec<Arc<Resource>>,
        now: SystemTime,
    ) -> DiscoveryResponse {
        let nonce = self.nonces.next_nonce();
        let response = DiscoveryResponse {
            version_info: content.version.clone(),
            resources: resources.iter().map(|r| to_envoy_any(&r.body)).collect(),
            type_url: xds_type.type_url().to_string(),
            nonce: nonce.clone(),
            control_plane: Some(self.control_plane.clone()),
            ..Default::default()
        };
        self.type_state(xds_type).record.last_sent = Some(SentRecord {
            version: content.version,
            nonce,
            at: now,
            resource_count: content.versions.len(),
            resources: Arc::new(content.versions),
            removed_count: 0,
        });
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::map_snapshot::MapSnapshot;
    use crate::ads::types::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE, ROUTE_TYPE};
    use envoy_types::pb::google::rpc::Status;

    const T0: SystemTime = SystemTime::UNIX_EPOCH;

    fn stream(snapshot: MapSnapshot) -> SotwStream {
        SotwStream::new(
            Arc::new(Proxy::with_defaults("p")),
            "replica-a",
            snapshot.shared(),
        )
    }

    fn req(type_url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.to_string(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.to_string(),
            ..Default::default()
        }
    }

    fn nack(type_url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            error_detail: Some(Status {
                code: 3,
                message: "bad cluster".into(),
                details: vec![],
            }),
            ..req(type_url, names, nonce)
        }
    }

    fn names(r: &DiscoveryResponse) -> Vec<String> {
        r.resources
            .iter()
            .map(|a| String::from_utf8(a.value.clone()).unwrap_or_default())
            .collect()
    }

    fn types(out: &Output<DiscoveryResponse>) -> Vec<&str> {
        out.responses.iter().map(|r| r.type_url.as_str()).collect()
    }

    #[test]
    fn first_wildcard_request_is_answered_even_when_empty() {
        let mut s = stream(MapSnapshot::new(1));
        let out = s.on_request(&req(LISTENER_TYPE, &[], ""), T0);
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
        let first = s
            .on_request(&req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&first), ["c1", "c2"]);
        let mut ack = req(CLUSTER_TYPE, &[], &first.nonce);
        ack.version_info = first.version_info.clone();
        let out = s.on_request(&ack, T0);
        assert!(out.responses.is_empty());
        assert_eq!(
            out.events,
            [ProtocolEvent::Ack {
                xds_type: XdsType::Cluster,
                nonce: first.nonce.clone()
            }]
        );
        let out = s.on_snapshot(
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
        let first = s
            .on_request(&req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        let out = s.on_request(&nack(CLUSTER_TYPE, &[], &first.nonce), T0);
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
            s.on_snapshot(MapSnapshot::sample(1).next(2).shared(), T0)
                .responses
                .is_empty()
        );
        // New content is sent.
        let out = s.on_snapshot(
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
        let good = s
            .on_request(&req(ENDPOINT_TYPE, &["c1"], ""), T0)
            .responses
            .remove(0);
        let mut ack = req(ENDPOINT_TYPE, &["c1"], &good.nonce);
        ack.version_info = good.version_info.clone();
        s.on_request(&ack, T0);
        let bad = s
            .on_snapshot(
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
        s.on_request(&rejected, T0);
        // The client now adds a name, still reporting its last good version.
        let mut more = req(ENDPOINT_TYPE, &["c1", "c2"], &bad.nonce);
        more.version_info = good.version_info.clone();
        let out = s.on_request(&more, T0);
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
        let out = s.on_request(&req(CLUSTER_TYPE, &[], "nonce-of-another-replica"), T0);
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
        let first = s
            .on_request(&req(ROUTE_TYPE, &["r1"], ""), T0)
            .responses
            .remove(0);
        let second = s
            .on_snapshot(
                MapSnapshot::sample(1)
                    .with(ROUTE_TYPE, "r1", b"r1'")
                    .next(2)
                    .shared(),
                T0,
            )
            .responses
            .remove(0);
        // The client changes names while still answering the first response: stale.
        let out = s.on_request(&req(ROUTE_TYPE, &["r1", "r2"], &first.nonce), T0);
        assert!(out.responses.is_empty());
        assert!(matches!(out.events[0], ProtocolEvent::StaleNonce { .. }));
        // The same change with the latest nonce is answered.
        let out = s.on_request(&req(ROUTE_TYPE, &["r1", "r2"], &second.nonce), T0);
        assert_eq!(names(&out.responses[0]), ["r1'", "r2"]);
    }

    #[test]
    fn changed_names_are_answered_with_exactly_the_subscribed_set_aba() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = s
            .on_request(&req(ROUTE_TYPE, &["r1"], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["r1"]);
        let r = s
            .on_request(&req(ROUTE_TYPE, &["r2"], &r.nonce), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["r2"]);
        let r = s
            .on_request(&req(ROUTE_TYPE, &["r1"], &r.nonce), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["r1"], "R1 is sent again after R1→R2→R1");
    }

    #[test]
    fn names_requested_before_they_exist_are_sent_when_they_appear() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = s
            .on_request(&req(ENDPOINT_TYPE, &["c1", "later"], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["e1"]);
        s.on_request(&req(ENDPOINT_TYPE, &["c1", "later"], &r.nonce), T0);
        let out = s.on_snapshot(
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
            s.on_request(&req(t, n, ""), T0);
        }
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c2", b"c2'")
            .with(LISTENER_TYPE, "l1", b"l1'")
            .with(ROUTE_TYPE, "r1", b"r1'")
            .next(2);
        let out = s.on_snapshot(next.shared(), T0);
        // c2 changed but its endpoints are not subscribed: no EDS.
        assert_eq!(types(&out), [CLUSTER_TYPE, LISTENER_TYPE, ROUTE_TYPE]);
    }

    #[test]
    fn changed_cluster_is_followed_by_its_endpoints_even_unchanged() {
        let mut s = stream(MapSnapshot::sample(1));
        let cds = s
            .on_request(&req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        s.on_request(&req(CLUSTER_TYPE, &[], &cds.nonce), T0);
        let eds = s
            .on_request(&req(ENDPOINT_TYPE, &["c1", "c2"], ""), T0)
            .responses
            .remove(0);
        s.on_request(&req(ENDPOINT_TYPE, &["c1", "c2"], &eds.nonce), T0);
        let out = s.on_snapshot(
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
        s.on_request(&req(CLUSTER_TYPE, &[], ""), T0);
        s.on_request(&req(ENDPOINT_TYPE, &["c1"], ""), T0);
        // The publisher says "endpoints only", so even a cluster difference is not looked at.
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c9", b"c9")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .next(2)
            .endpoints_only_since(1);
        let out = s.on_snapshot(next.shared(), T0);
        assert_eq!(types(&out), [ENDPOINT_TYPE]);
        assert_eq!(names(&out.responses[0]), ["e1'"]);
    }

    #[test]
    fn unknown_type_is_reported_once_and_ignored() {
        let mut s = stream(MapSnapshot::sample(1));
        let url = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
        let out = s.on_request(&req(url, &[], ""), T0);
        assert!(out.responses.is_empty());
        assert_eq!(
            out.events,
            [ProtocolEvent::UnknownType {
                type_url: url.into(),
                first_time: true
            }]
        );
        let out = s.on_request(&req(url, &[], ""), T0);
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
        let mut b = SotwStream::new(
            Arc::new(Proxy::with_defaults("q")),
            "replica-b",
            MapSnapshot::sample(1).next(99).shared(),
        );
        let ra = a
            .on_request(&req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        let rb = b
            .on_request(&req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_eq!(ra.version_info, rb.version_info);
        let rc = stream(MapSnapshot::sample(1).with(CLUSTER_TYPE, "c2", b"x"))
            .on_request(&req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_ne!(ra.version_info, rc.version_info);
    }

    #[test]
    fn deleted_listener_disappears_from_the_full_set() {
        let mut s = stream(MapSnapshot::sample(1).with(LISTENER_TYPE, "l2", b"l2"));
        let r = s
            .on_request(&req(LISTENER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["l1", "l2"]);
        let out = s.on_snapshot(MapSnapshot::sample(1).next(2).shared(), T0);
        assert_eq!(names(&out.responses[0]), ["l1"]);
    }

    #[test]
    fn unsubscribing_everything_answers_empty_and_stops_pushes() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = s
            .on_request(&req(ROUTE_TYPE, &["r1"], ""), T0)
            .responses
            .remove(0);
        let r = s
            .on_request(&req(ROUTE_TYPE, &[], &r.nonce), T0)
            .responses
            .remove(0);
        assert!(r.resources.is_empty());
        s.on_request(&req(ROUTE_TYPE, &[], &r.nonce), T0);
        let out = s.on_snapshot(
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
        let snapshot = Arc::new(crate::ads::state::DuplicatingSnapshot);
        let mut s = SotwStream::new(Arc::new(Proxy::with_defaults("p")), "r", snapshot);
        let r = s
            .on_request(&req(CLUSTER_TYPE, &[], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&r), ["one"]);
    }

    #[test]
    fn nonces_are_unique_on_a_stream() {
        let mut s = stream(MapSnapshot::sample(1));
        let mut seen = BTreeSet::new();
        for t in [CLUSTER_TYPE, LISTENER_TYPE, ROUTE_TYPE, ENDPOINT_TYPE] {
            for r in s.on_request(&req(t, &["*"], ""), T0).responses {
                assert!(seen.insert(r.nonce));
            }
        }
        let next = MapSnapshot::sample(1)
            .with(CLUSTER_TYPE, "c1", b"c1'")
            .with(ENDPOINT_TYPE, "c1", b"e1'")
            .with(LISTENER_TYPE, "l1", b"l1'")
            .with(ROUTE_TYPE, "r1", b"r1'")
            .next(5);
        for r in s.on_snapshot(next.shared(), T0).responses {
            assert!(seen.insert(r.nonce));
        }
        assert_eq!(seen.len(), 8);
    }

    /// Sends the first response of `type_url` for `names` and ACKs it.
    fn subscribed(s: &mut SotwStream, type_url: &str, names: &[&str]) -> DiscoveryResponse {
        let r = s
            .on_request(&req(type_url, names, ""), T0)
            .responses
            .remove(0);
        let mut ack = req(type_url, names, &r.nonce);
        ack.version_info = r.version_info.clone();
        assert!(s.on_request(&ack, T0).responses.is_empty());
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
        let out = s.on_snapshot(next.next(2).shared(), T0);
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
        let fresh = stream(next)
            .on_request(&req(ROUTE_TYPE, &["r1", "r2"], ""), T0)
            .responses
            .remove(0);
        assert_eq!(names(&fresh), ["r1'", "r2"]);
        assert_eq!(out.responses[1].version_info, fresh.version_info);
    }

    #[test]
    fn a_new_name_is_answered_with_itself_and_nothing_held() {
        let mut s = stream(MapSnapshot::sample(1));
        let r = subscribed(&mut s, ROUTE_TYPE, &["r1"]);
        let out = s.on_request(&req(ROUTE_TYPE, &["r1", "r2"], &r.nonce), T0);
        assert_eq!(names(&out.responses[0]), ["r2"]);
    }

    #[test]
    fn what_was_sent_but_not_acknowledged_is_sent_again() {
        let mut s = stream(MapSnapshot::sample(1));
        s.on_request(&req(ROUTE_TYPE, &["r1", "r2"], ""), T0);
        let out = s.on_snapshot(
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
        let out = s.on_snapshot(
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
        let out = s.on_snapshot(
            MapSnapshot::sample(1)
                .without(ROUTE_TYPE, "r2")
                .next(2)
                .shared(),
            T0,
        );
        assert!(out.responses.is_empty(), "the listener that named it goes");
    }
}
