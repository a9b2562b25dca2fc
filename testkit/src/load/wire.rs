//! What the load client and the null server read and write, as light protobuf messages:
//! responses with their resources kept as bytes (a client of 2,000 streams must not
//! decode every route), the few fields of clusters and listeners an Envoy-like client
//! follows, and the captured responses the null server replays.

use bytes::Bytes;
use prost::Message;

/// `DiscoveryResponse` with each resource left encoded.
#[derive(Clone, PartialEq, Message)]
pub struct RawResponse {
    #[prost(string, tag = "1")]
    pub version_info: String,
    #[prost(bytes = "bytes", repeated, tag = "2")]
    pub resources: Vec<Bytes>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
}

/// A SotW `DiscoveryRequest` whose resource names are encoded once per subscription
/// ([`SotwNames`]): every SotW ACK repeats the whole list, and a client of 2,000 streams
/// re-encoding a thousand names per ACK spent its core on it (as Envoy's own encoding is
/// not what the benchmark measures). The bytes are a `DiscoveryRequest`'s; the names
/// follow the other fields, which protobuf allows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SotwAck {
    pub version_info: String,
    pub node: Option<envoy_types::pb::envoy::config::core::v3::Node>,
    pub type_url: String,
    pub response_nonce: String,
    pub names: SotwNames,
}

/// The `resource_names` fields of a SotW request, encoded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SotwNames(Bytes);

impl SotwNames {
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> SotwNames {
        let mut buf = Vec::new();
        for name in names {
            prost::encoding::string::encode(3, &name.to_string(), &mut buf);
        }
        SotwNames(buf.into())
    }
}

impl Message for SotwAck {
    fn encode_raw(&self, buf: &mut impl bytes::BufMut) {
        use prost::encoding::{message, string};
        if !self.version_info.is_empty() {
            string::encode(1, &self.version_info, buf);
        }
        if let Some(node) = &self.node {
            message::encode(2, node, buf);
        }
        if !self.type_url.is_empty() {
            string::encode(4, &self.type_url, buf);
        }
        if !self.response_nonce.is_empty() {
            string::encode(5, &self.response_nonce, buf);
        }
        buf.put_slice(&self.names.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Only sent, never received.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        use prost::encoding::{message, string};
        let string_len = |tag, s: &String| {
            if s.is_empty() {
                0
            } else {
                string::encoded_len(tag, s)
            }
        };
        string_len(1, &self.version_info)
            + self.node.as_ref().map_or(0, |n| message::encoded_len(2, n))
            + string_len(4, &self.type_url)
            + string_len(5, &self.response_nonce)
            + self.names.0.len()
    }

    fn clear(&mut self) {
        *self = SotwAck::default();
    }
}

/// What the null server reads of a SotW request: its type URL, its nonce and a hash of its
/// resource names (to tell a changed subscription), read without allocating a name.
#[derive(Debug, Default, PartialEq)]
pub struct SotwRequestSummary {
    pub type_url: String,
    pub response_nonce: String,
    pub names_hash: u64,
}

impl SotwRequestSummary {
    /// `None` when the bytes are not a request.
    pub fn read(mut buf: &[u8]) -> Option<SotwRequestSummary> {
        use prost::encoding::{DecodeContext, decode_key, decode_varint, skip_field, string};
        use std::hash::Hasher;
        let mut summary = SotwRequestSummary::default();
        let mut names = std::hash::DefaultHasher::new();
        while !buf.is_empty() {
            let (tag, wire) = decode_key(&mut buf).ok()?;
            match tag {
                3 if wire == prost::encoding::WireType::LengthDelimited => {
                    let len = usize::try_from(decode_varint(&mut buf).ok()?).ok()?;
                    let (name, rest) = buf.split_at_checked(len)?;
                    names.write(name);
                    names.write_u8(0xff);
                    buf = rest;
                }
                4 => string::merge(
                    wire,
                    &mut summary.type_url,
                    &mut buf,
                    DecodeContext::default(),
                )
                .ok()?,
                5 => string::merge(
                    wire,
                    &mut summary.response_nonce,
                    &mut buf,
                    DecodeContext::default(),
                )
                .ok()?,
                _ => skip_field(wire, tag, &mut buf, DecodeContext::default()).ok()?,
            }
        }
        summary.names_hash = names.finish();
        Some(summary)
    }
}

/// `DeltaDiscoveryResponse` with each resource's body left encoded.
#[derive(Clone, PartialEq, Message)]
pub struct RawDeltaResponse {
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<RawResource>,
    #[prost(string, tag = "4")]
    pub type_url: String,
    #[prost(string, tag = "5")]
    pub nonce: String,
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
}

/// `envoy.service.discovery.v3.Resource`: name, version and the encoded `Any`.
#[derive(Clone, PartialEq, Message)]
pub struct RawResource {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub resource: Bytes,
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `google.protobuf.Any` with its value left encoded.
#[derive(Clone, PartialEq, Message)]
pub struct RawAny {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

/// The cluster fields an Envoy follows to EDS.
#[derive(Clone, PartialEq, Message)]
struct RawCluster {
    #[prost(string, tag = "1")]
    name: String,
    /// `type`: EDS is 3.
    #[prost(int32, optional, tag = "2")]
    discovery_type: Option<i32>,
    #[prost(message, optional, tag = "3")]
    eds_cluster_config: Option<RawEdsClusterConfig>,
}

#[derive(Clone, PartialEq, Message)]
struct RawEdsClusterConfig {
    #[prost(string, tag = "2")]
    service_name: String,
}

/// The listener fields an Envoy follows to RDS.
#[derive(Clone, PartialEq, Message)]
struct RawListener {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, repeated, tag = "3")]
    filter_chains: Vec<RawFilterChain>,
    #[prost(message, optional, tag = "25")]
    default_filter_chain: Option<RawFilterChain>,
}

#[derive(Clone, PartialEq, Message)]
struct RawFilterChain {
    #[prost(message, repeated, tag = "3")]
    filters: Vec<RawFilter>,
}

#[derive(Clone, PartialEq, Message)]
struct RawFilter {
    #[prost(message, optional, tag = "4")]
    typed_config: Option<RawAny>,
}

/// `HttpConnectionManager.rds.route_config_name`.
#[derive(Clone, PartialEq, Message)]
struct RawHcm {
    #[prost(message, optional, tag = "3")]
    rds: Option<RawRds>,
}

#[derive(Clone, PartialEq, Message)]
struct RawRds {
    #[prost(string, tag = "2")]
    route_config_name: String,
}

const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const EDS: i32 = 3;

/// The cluster's name and, for an EDS cluster, the name Envoy asks EDS for.
/// Any xDS resource's name: field 1 of `Cluster`, `Listener`, `RouteConfiguration` and
/// `ClusterLoadAssignment` (`cluster_name`).
#[derive(Clone, PartialEq, Message)]
struct RawNamed {
    #[prost(string, tag = "1")]
    name: String,
}

/// The name of the resource in an encoded Any.
pub fn resource_name(any: &[u8]) -> Option<String> {
    let any = RawAny::decode(any).ok()?;
    Some(RawNamed::decode(any.value).ok()?.name)
}

pub fn cluster_eds_name(any: &[u8]) -> Option<(String, Option<String>)> {
    let any = RawAny::decode(any).ok()?;
    let cluster = RawCluster::decode(any.value).ok()?;
    let eds = (cluster.discovery_type == Some(EDS)).then(|| {
        cluster
            .eds_cluster_config
            .as_ref()
            .map(|c| c.service_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| cluster.name.clone())
    });
    Some((cluster.name, eds))
}

/// The listener's name and the route configurations its HTTP connection managers name.
pub fn listener_rds_names(any: &[u8]) -> Option<(String, Vec<String>)> {
    let any = RawAny::decode(any).ok()?;
    let listener = RawListener::decode(any.value).ok()?;
    let mut names = Vec::new();
    for chain in listener
        .filter_chains
        .iter()
        .chain(listener.default_filter_chain.iter())
    {
        for filter in &chain.filters {
            if let Some(config) = &filter.typed_config
                && config.type_url == HCM_TYPE
                && let Ok(hcm) = RawHcm::decode(config.value.clone())
                && let Some(rds) = hcm.rds
            {
                names.push(rds.route_config_name);
            }
        }
    }
    names.sort();
    names.dedup();
    Some((listener.name, names))
}

/// One resource the null server replays.
#[derive(Clone, PartialEq, Message)]
pub struct CapturedResource {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub version: String,
    /// The encoded `Any`.
    #[prost(bytes = "bytes", tag = "3")]
    pub any: Bytes,
}

/// What one stream held of one type at one step.
#[derive(Clone, PartialEq, Message)]
pub struct CapturedType {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<CapturedResource>,
}

/// Everything one stream held after one step of the benchmark.
#[derive(Clone, PartialEq, Message)]
pub struct CapturedStep {
    #[prost(message, repeated, tag = "1")]
    pub types: Vec<CapturedType>,
}

/// Every step of one run.
#[derive(Clone, PartialEq, Message)]
pub struct Capture {
    #[prost(message, repeated, tag = "1")]
    pub steps: Vec<CapturedStep>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
    use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, Rds, http_connection_manager,
    };
    use envoy_types::pb::google::protobuf::Any;

    fn any<M: prost::Message>(type_url: &str, m: &M) -> Vec<u8> {
        Any {
            type_url: type_url.into(),
            value: m.encode_to_vec(),
        }
        .encode_to_vec()
    }

    #[test]
    fn follows_clusters_to_eds_and_listeners_to_rds() {
        let eds = Cluster {
            name: "outbound|8080||a".into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(3)),
            eds_cluster_config: Some(cluster::EdsClusterConfig {
                service_name: "outbound|8080||a".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let original_dst = Cluster {
            name: "PassthroughCluster".into(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(4)),
            ..Default::default()
        };
        let url = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
        assert_eq!(
            cluster_eds_name(&any(url, &eds)),
            Some(("outbound|8080||a".into(), Some("outbound|8080||a".into())))
        );
        assert_eq!(
            cluster_eds_name(&any(url, &original_dst)),
            Some(("PassthroughCluster".into(), None))
        );
        let hcm = HttpConnectionManager {
            route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
                route_config_name: "8080".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let listener = Listener {
            name: "0.0.0.0_8080".into(),
            filter_chains: vec![FilterChain {
                filters: vec![Filter {
                    name: "envoy.filters.network.http_connection_manager".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(Any {
                        type_url: HCM_TYPE.into(),
                        value: hcm.encode_to_vec(),
                    })),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            listener_rds_names(&any(
                "type.googleapis.com/envoy.config.listener.v3.Listener",
                &listener
            )),
            Some(("0.0.0.0_8080".into(), vec!["8080".into()]))
        );
    }

    /// A pre-encoded SotW ACK is a `DiscoveryRequest` on the wire, and the null server's
    /// summary of it reads its type and nonce and tells its names apart.
    #[test]
    fn a_sotw_ack_is_a_discovery_request_and_its_summary_tells_names_apart() {
        use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
        let ack = |names: &[&str]| SotwAck {
            version_info: "v1".into(),
            node: Some(Default::default()),
            type_url: "t".into(),
            response_nonce: "9".into(),
            names: SotwNames::new(names.iter().copied()),
        };
        let wire = ack(&["a", "bc"]).encode_to_vec();
        assert_eq!(wire.len(), ack(&["a", "bc"]).encoded_len());
        let decoded = DiscoveryRequest::decode(&wire[..]).expect("a DiscoveryRequest");
        assert_eq!(decoded.resource_names, ["a", "bc"]);
        assert_eq!(
            (decoded.version_info.as_str(), decoded.type_url.as_str()),
            ("v1", "t")
        );
        assert_eq!(decoded.response_nonce, "9");
        assert!(decoded.node.is_some());
        let summary =
            |names: &[&str]| SotwRequestSummary::read(&ack(names).encode_to_vec()).expect("reads");
        let ab = summary(&["a", "bc"]);
        assert_eq!(
            (ab.type_url.as_str(), ab.response_nonce.as_str()),
            ("t", "9")
        );
        assert_eq!(ab.names_hash, summary(&["a", "bc"]).names_hash);
        assert_ne!(ab.names_hash, summary(&["ab", "c"]).names_hash);
        assert_ne!(ab.names_hash, summary(&["a"]).names_hash);
        assert!(
            SotwRequestSummary::read(&[0x1a, 0x05, b'a']).is_none(),
            "truncated"
        );
    }
}
