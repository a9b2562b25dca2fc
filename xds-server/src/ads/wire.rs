//! Responses as the state machines decide them ([`SotwResponse`], [`DeltaResponse`]) and
//! as the transport sends them ([`Encoded`]: one gRPC message as a chain of byte chunks).
//!
//! Nothing is copied per stream but what differs per stream. A SotW response is the 5-byte
//! gRPC prefix, the view's shared body (`version_info`, resources, `type_url`), the
//! replica's shared `control_plane` field and a tail with the nonce; a SotW RDS or EDS
//! response that carries part of its view is the resources' own shared entries instead of
//! the body, and `version_info` and `type_url` go in the tail. A delta response is
//! the prefix, the resources (each encoded once and shared, or the view's shared body when
//! the client is sent all of them), `control_plane` and a tail with the system version,
//! type URL, nonce and removed names. Protobuf accepts fields in any order, so the
//! per-stream fields can follow the shared ones.

use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use super::proto;
use super::resource::Resource;
use super::types::XdsType;
use super::view::View;

/// The gRPC message prefix: a compression flag and the length (big endian).
pub const GRPC_PREFIX: usize = 5;

/// Small resources are copied together into chunks of about this size when a delta
/// response is sent, so a response of many small resources is not as many HTTP/2 frames.
const COALESCE_BYTES: usize = 16 * 1024;

/// A SotW response: a view shared by every stream that sends it, what of it the response
/// carries, and this stream's nonce.
#[derive(Clone, Debug)]
pub struct SotwResponse {
    /// The whole subscribed view: its version is the response's `version_info`.
    pub view: Arc<View>,
    /// `None`: every resource of the view (its one shared body). `Some`: only these (RDS
    /// and EDS: what the client does not hold), each sent as its own shared encoding.
    pub partial: Option<Vec<Arc<Resource>>>,
    pub nonce: String,
}

impl SotwResponse {
    pub fn xds_type(&self) -> XdsType {
        self.view.xds_type()
    }

    /// How many resources the response carries.
    pub fn resource_count(&self) -> usize {
        self.partial.as_ref().map_or(self.view.len(), Vec::len)
    }
}

/// A delta response of one stream.
#[derive(Clone, Debug)]
pub struct DeltaResponse {
    pub xds_type: XdsType,
    /// Hash of everything the client holds once it applies this response.
    pub system_version: Arc<str>,
    pub resources: DeltaResources,
    pub removed: Vec<String>,
    pub nonce: String,
}

/// The resources of a delta response.
#[derive(Clone, Debug)]
pub enum DeltaResources {
    /// Every resource of a view (sent as the view's one shared buffer).
    All(Arc<View>),
    /// Some resources (each sent as its own shared encoding).
    Some(Vec<Arc<Resource>>),
}

impl DeltaResources {
    pub fn len(&self) -> usize {
        match self {
            DeltaResources::All(view) => view.len(),
            DeltaResources::Some(list) => list.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Arc<Resource>> {
        match self {
            DeltaResources::All(view) => view.resources().iter(),
            DeltaResources::Some(list) => list.iter(),
        }
    }
}

/// The replica's `control_plane` field, encoded once for each response kind.
#[derive(Clone, Debug)]
pub struct ControlPlane {
    /// `DiscoveryResponse.control_plane` (field 6).
    sotw: Bytes,
    /// `DeltaDiscoveryResponse.control_plane` (field 7).
    delta: Bytes,
}

impl ControlPlane {
    /// `control_plane { identifier: replica }`.
    pub fn new(replica: &str) -> Self {
        let field = |tag: u32| {
            let inner = proto::delimited_len(1, replica.len());
            let mut buf = BytesMut::with_capacity(proto::delimited_len(tag, inner));
            proto::put_delimited_header(tag, inner, &mut buf);
            proto::put_delimited(1, replica.as_bytes(), &mut buf);
            buf.freeze()
        };
        ControlPlane {
            sotw: field(6),
            delta: field(7),
        }
    }
}

/// One gRPC message ready to send, as chunks in wire order. Only the prefix and the tail
/// are this stream's own bytes; every other chunk is shared.
#[derive(Debug)]
pub struct Encoded {
    /// Message length, gRPC prefix included.
    len: usize,
    /// Remaining chunks, last first (the transport pops them).
    chunks: Vec<Chunk>,
}

#[derive(Debug)]
enum Chunk {
    Bytes(Bytes),
    /// Resources sent one by one from `next` on, each as the entry `entry` gives (SotW
    /// or delta): consecutive small ones are copied together as they are sent.
    Resources {
        resources: Vec<Arc<Resource>>,
        next: usize,
        entry: fn(&Resource) -> Bytes,
    },
}

impl Chunk {
    fn sotw_resources(list: Vec<Arc<Resource>>) -> (usize, Chunk) {
        Chunk::resources(list, Resource::sotw_entry)
    }

    fn delta_resources(list: Vec<Arc<Resource>>) -> (usize, Chunk) {
        Chunk::resources(list, |r| r.delta_entry().clone())
    }

    /// The chunk of `list` and its length on the wire.
    fn resources(list: Vec<Arc<Resource>>, entry: fn(&Resource) -> Bytes) -> (usize, Chunk) {
        let len = list.iter().map(|r| entry(r).len()).sum();
        let resources = Chunk::Resources {
            resources: list,
            next: 0,
            entry,
        };
        (len, resources)
    }
}

impl Encoded {
    /// Bytes on the wire, gRPC prefix included.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The next chunk to send; `None` once the message is sent.
    pub fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            match self.chunks.last_mut()? {
                Chunk::Bytes(_) => {
                    let Some(Chunk::Bytes(bytes)) = self.chunks.pop() else {
                        unreachable!("just matched")
                    };
                    return Some(bytes);
                }
                Chunk::Resources {
                    resources,
                    next,
                    entry,
                } => {
                    let Some(first) = resources.get(*next).map(|r| entry(r)) else {
                        self.chunks.pop();
                        continue;
                    };
                    *next += 1;
                    // Small resources that follow are copied together with it, into a
                    // buffer of exactly their size; a large one, or a small one alone,
                    // goes as its own shared bytes.
                    let small = |len: usize| len < COALESCE_BYTES / 4;
                    let mut len = first.len();
                    let mut end = *next;
                    if small(len) {
                        while let Some(more) = resources.get(end).map(|r| entry(r).len())
                            && small(more)
                            && len + more <= COALESCE_BYTES
                        {
                            len += more;
                            end += 1;
                        }
                    }
                    if end == *next {
                        return Some(first);
                    }
                    // A transient buffer, freed once the transport has written it.
                    let mut buf = BytesMut::with_capacity(len);
                    buf.extend_from_slice(&first);
                    for r in &resources[*next..end] {
                        buf.extend_from_slice(&entry(r));
                    }
                    *next = end;
                    return Some(buf.freeze());
                }
            }
        }
    }

    /// The whole message in one buffer (tests and tools).
    pub fn to_vec(mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len);
        while let Some(chunk) = self.next_chunk() {
            out.extend_from_slice(&chunk);
        }
        out
    }

    /// The prefix and tail in one allocation, split; `tail` writes the per-stream fields.
    fn assemble(
        shared_len: usize,
        shared: Vec<Chunk>,
        control_plane: &Bytes,
        tail_len: usize,
        tail: impl FnOnce(&mut BytesMut),
    ) -> Encoded {
        let message_len = shared_len + control_plane.len() + tail_len;
        let mut own = BytesMut::with_capacity(GRPC_PREFIX + tail_len);
        own.put_u8(0);
        own.put_u32(u32::try_from(message_len).unwrap_or(u32::MAX));
        tail(&mut own);
        debug_assert_eq!(own.len(), GRPC_PREFIX + tail_len);
        let own = own.freeze();
        let mut chunks = Vec::with_capacity(shared.len() + 3);
        chunks.push(Chunk::Bytes(own.slice(GRPC_PREFIX..)));
        chunks.push(Chunk::Bytes(control_plane.clone()));
        chunks.extend(shared.into_iter().rev());
        chunks.push(Chunk::Bytes(own.slice(..GRPC_PREFIX)));
        Encoded {
            len: GRPC_PREFIX + message_len,
            chunks,
        }
    }
}

/// Encodes a SotW response: the view's shared body (or the shared entries of the part it
/// carries, then its version and type URL), then the control plane and nonce.
pub fn encode_sotw(response: &SotwResponse, control_plane: &ControlPlane) -> Encoded {
    let nonce = response.nonce.as_bytes();
    let Some(partial) = &response.partial else {
        let body = response.view.sotw_body().clone();
        return Encoded::assemble(
            body.len(),
            vec![Chunk::Bytes(body)],
            &control_plane.sotw,
            proto::delimited_len(5, nonce.len()),
            |buf| proto::put_delimited(5, nonce, buf),
        );
    };
    let (shared_len, chunk) = Chunk::sotw_resources(partial.clone());
    let version = response.view.version().as_bytes();
    let type_url = response.xds_type().type_url().as_bytes();
    let tail_len = proto::delimited_len(1, version.len())
        + proto::delimited_len(4, type_url.len())
        + proto::delimited_len(5, nonce.len());
    Encoded::assemble(
        shared_len,
        vec![chunk],
        &control_plane.sotw,
        tail_len,
        |buf| {
            proto::put_delimited(1, version, buf);
            proto::put_delimited(4, type_url, buf);
            proto::put_delimited(5, nonce, buf);
        },
    )
}

/// Encodes a delta response: the resources (shared), then the control plane and this
/// stream's fields.
pub fn encode_delta(response: &DeltaResponse, control_plane: &ControlPlane) -> Encoded {
    let (shared_len, shared) = match &response.resources {
        DeltaResources::All(view) => {
            let body = view.delta_body().clone();
            (body.len(), vec![Chunk::Bytes(body)])
        }
        DeltaResources::Some(list) => {
            let (len, chunk) = Chunk::delta_resources(list.clone());
            (len, vec![chunk])
        }
    };
    let type_url = response.xds_type.type_url().as_bytes();
    let tail_len = proto::delimited_len(1, response.system_version.len())
        + proto::delimited_len(4, type_url.len())
        + proto::delimited_len(5, response.nonce.len())
        + response
            .removed
            .iter()
            .map(|n| proto::delimited_len(6, n.len()))
            .sum::<usize>();
    Encoded::assemble(shared_len, shared, &control_plane.delta, tail_len, |buf| {
        proto::put_delimited(1, response.system_version.as_bytes(), buf);
        proto::put_delimited(4, type_url, buf);
        proto::put_delimited(5, response.nonce.as_bytes(), buf);
        for name in &response.removed {
            proto::put_delimited(6, name.as_bytes(), buf);
        }
    })
}

/// Decoding helpers for tests: what the client receives.
#[cfg(test)]
pub(crate) mod decode {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse,
    };
    use prost::Message;

    fn message(encoded: Encoded) -> Vec<u8> {
        let len = encoded.len();
        let bytes = encoded.to_vec();
        assert_eq!(bytes.len(), len);
        assert_eq!(bytes[0], 0, "uncompressed");
        let declared = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
        assert_eq!(declared, len - GRPC_PREFIX);
        bytes[GRPC_PREFIX..].to_vec()
    }

    pub fn sotw(response: &SotwResponse) -> DiscoveryResponse {
        let encoded = encode_sotw(response, &ControlPlane::new("replica-a"));
        DiscoveryResponse::decode(&message(encoded)[..]).expect("a DiscoveryResponse")
    }

    pub fn delta(response: &DeltaResponse) -> DeltaDiscoveryResponse {
        let encoded = encode_delta(response, &ControlPlane::new("replica-a"));
        DeltaDiscoveryResponse::decode(&message(encoded)[..]).expect("a DeltaDiscoveryResponse")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ads::map_snapshot::MapSnapshot;
    use crate::ads::types::CLUSTER_TYPE;
    use crate::ads::view::ServedSnapshot;
    use pilotfish_mesh::model::Proxy;

    fn view() -> Arc<View> {
        ServedSnapshot::new(MapSnapshot::sample(1).shared()).view(
            &Arc::new(Proxy::with_defaults("p")),
            XdsType::Cluster,
            None,
        )
    }

    #[test]
    fn a_sotw_response_shares_everything_but_the_nonce() {
        let view = view();
        let response = SotwResponse {
            view: view.clone(),
            partial: None,
            nonce: "42".into(),
        };
        let decoded = decode::sotw(&response);
        assert_eq!(decoded.nonce, "42");
        assert_eq!(decoded.version_info, &*view.version().clone());
        assert_eq!(decoded.type_url, CLUSTER_TYPE);
        assert_eq!(
            decoded.control_plane.map(|c| c.identifier).as_deref(),
            Some("replica-a")
        );
        assert_eq!(decoded.resources.len(), 2);
        // The body chunk is the view's own buffer, not a copy.
        let mut encoded = encode_sotw(&response, &ControlPlane::new("r"));
        let prefix = encoded.next_chunk().expect("prefix");
        assert_eq!(prefix.len(), GRPC_PREFIX);
        let body = encoded.next_chunk().expect("body");
        assert_eq!(body.as_ptr(), view.sotw_body().as_ptr());
    }

    #[test]
    fn a_partial_sotw_response_is_the_resources_own_shared_entries() {
        let view = view();
        let response = SotwResponse {
            view: view.clone(),
            partial: Some(vec![view.resources()[1].clone()]),
            nonce: "9".into(),
        };
        let decoded = decode::sotw(&response);
        assert_eq!(decoded.nonce, "9");
        assert_eq!(
            decoded.version_info,
            &*view.version().clone(),
            "the whole view's"
        );
        assert_eq!(decoded.type_url, CLUSTER_TYPE);
        assert_eq!(decoded.resources.len(), 1);
        assert_eq!(decoded.resources[0].value, b"c2");
        assert_eq!(
            decoded.control_plane.map(|c| c.identifier).as_deref(),
            Some("replica-a")
        );
        // A small resource alone is not copied into a buffer of its own either (one edit
        // sends one small route configuration to every stream).
        let mut encoded = encode_sotw(&response, &ControlPlane::new("r"));
        encoded.next_chunk().expect("prefix");
        let entry = encoded.next_chunk().expect("the resource");
        let within = view.resources()[1].delta_entry().as_ptr_range();
        assert!(within.contains(&entry.as_ptr()), "a copy");
        // A large resource goes out as a slice of its one shared encoding.
        let mut big = MapSnapshot::new(1);
        big.insert(CLUSTER_TYPE, "big", &[b'x'; COALESCE_BYTES]);
        let view = ServedSnapshot::new(big.shared()).view(
            &Arc::new(Proxy::with_defaults("p")),
            XdsType::Cluster,
            None,
        );
        let resource = view.resources()[0].clone();
        let response = SotwResponse {
            view: view.clone(),
            partial: Some(vec![resource.clone()]),
            nonce: "1".into(),
        };
        let mut encoded = encode_sotw(&response, &ControlPlane::new("r"));
        encoded.next_chunk().expect("prefix");
        let entry = encoded.next_chunk().expect("the resource");
        let shared = resource.delta_entry();
        let within = shared.as_ptr_range();
        assert!(within.contains(&entry.as_ptr()), "not a copy");
    }

    #[test]
    fn a_delta_response_carries_names_versions_and_removals() {
        let view = view();
        let some = DeltaResponse {
            xds_type: XdsType::Cluster,
            system_version: "sv".into(),
            resources: DeltaResources::Some(vec![view.resources()[1].clone()]),
            removed: vec!["gone".into(), "also-gone".into()],
            nonce: "7".into(),
        };
        let decoded = decode::delta(&some);
        assert_eq!(decoded.system_version_info, "sv");
        assert_eq!(decoded.nonce, "7");
        assert_eq!(decoded.type_url, CLUSTER_TYPE);
        assert_eq!(decoded.removed_resources, ["gone", "also-gone"]);
        let r = &decoded.resources[0];
        assert_eq!(
            (r.name.as_str(), r.version.as_str()),
            ("c2", view.resources()[1].version.as_str())
        );
        let all = DeltaResponse {
            resources: DeltaResources::All(view.clone()),
            removed: vec![],
            ..some
        };
        let decoded = decode::delta(&all);
        let names: Vec<&str> = decoded.resources.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["c1", "c2"]);
    }

    #[test]
    fn many_small_resources_are_sent_in_few_chunks() {
        let mut snapshot = MapSnapshot::new(1);
        for i in 0..1000 {
            snapshot.insert(CLUSTER_TYPE, &format!("c{i:04}"), &[b'x'; 100]);
        }
        let view = ServedSnapshot::new(snapshot.shared()).view(
            &Arc::new(Proxy::with_defaults("p")),
            XdsType::Cluster,
            None,
        );
        let response = DeltaResponse {
            xds_type: XdsType::Cluster,
            system_version: view.version().clone(),
            resources: DeltaResources::Some(view.resources().to_vec()),
            removed: vec![],
            nonce: "1".into(),
        };
        let mut encoded = encode_delta(&response, &ControlPlane::new("r"));
        let len = encoded.len();
        let mut chunks = 0;
        let mut total = 0;
        while let Some(chunk) = encoded.next_chunk() {
            assert!(chunk.len() <= COALESCE_BYTES);
            chunks += 1;
            total += chunk.len();
        }
        assert_eq!(total, len);
        // ~200 KB of resources: about a dozen chunks, not a thousand.
        assert!(chunks < 20, "{chunks} chunks");
        assert_eq!(decode::delta(&response).resources.len(), 1000);
    }
}
