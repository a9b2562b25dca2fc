//! [`SotwRequest`]: a `DiscoveryRequest` as the SotW engine reads it.
//!
//! Every SotW request repeats the client's whole subscription for its type, and a
//! sidecar's RDS and EDS lists run to a name per service: decoded as `String`s, each ACK
//! allocated (and UTF-8 checked, and freed) thousands of strings per stream per push —
//! a seventh of the server's CPU during a VirtualService push to 2,000 SotW streams
//! (docs/PERFORMANCE.md). Here the names stay slices of the received message (`Bytes`,
//! no copy); the state machine compares them with the stream's interned subscription as
//! bytes and makes strings of them only when the subscription changes
//! ([`crate::ads::Subscription::apply_sotw`], which also refuses a name that is not
//! UTF-8, as decoding a `string` field would have).
//!
//! The field numbers are those of `envoy.service.discovery.v3.DiscoveryRequest`, so the
//! message decodes from the same bytes; `resource_locators` (xdstp), which the engine does
//! not serve, is skipped as an unknown field.

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::rpc::Status;

/// The fields of a `DiscoveryRequest` the SotW engine reads.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SotwRequest {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(message, optional, tag = "2")]
    pub node: Option<Node>,
    /// The subscribed names, as sent (not checked to be UTF-8 yet).
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub resource_names: Vec<Bytes>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<Status>,
}

impl From<DiscoveryRequest> for SotwRequest {
    fn from(r: DiscoveryRequest) -> Self {
        SotwRequest {
            version_info: r.version_info,
            node: r.node,
            resource_names: r.resource_names.into_iter().map(Bytes::from).collect(),
            type_url: r.type_url,
            response_nonce: r.response_nonce,
            error_detail: r.error_detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// The bytes of a `DiscoveryRequest` decode as the same request, names slicing the
    /// received buffer rather than copying it.
    #[test]
    fn decodes_a_discovery_request_without_copying_names() {
        let request = DiscoveryRequest {
            version_info: "v1".into(),
            node: Some(Node {
                id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local".into(),
                ..Default::default()
            }),
            resource_names: vec!["outbound|80||a.ns.svc.cluster.local".into(), "b".into()],
            type_url: crate::ads::CLUSTER_TYPE.into(),
            response_nonce: "7".into(),
            error_detail: Some(Status {
                code: 3,
                message: "rejected".into(),
                details: vec![],
            }),
            resource_locators: vec![Default::default()],
        };
        let wire = Bytes::from(request.encode_to_vec());
        let decoded = SotwRequest::decode(wire.clone()).expect("decodes");
        assert_eq!(decoded, SotwRequest::from(request));
        let buffer = wire.as_ptr_range();
        assert!(
            decoded
                .resource_names
                .iter()
                .all(|n| buffer.contains(&n.as_ptr())),
            "names are slices of the message"
        );
    }
}
