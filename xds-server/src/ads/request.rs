//! The requests as the engine decodes them ([`RequestMessage`]): a delta request through prost,
//! and a SotW request ([`SotwRequest`]) by hand, with its resource names left in the
//! received message.
//!
//! Every SotW request repeats the client's whole subscription for its type, and a
//! sidecar's RDS and EDS lists run to a name per service: decoded as `String`s, each ACK
//! allocated (and UTF-8 checked, and freed) thousands of strings per stream per push —
//! a seventh of the server's CPU during a VirtualService push to 2,000 SotW streams
//! (docs/PERFORMANCE.md); as `Bytes` slices, it still took a reference count per name. A
//! [`SotwRequest`] keeps the received message and the position of each name in it; the
//! state machine compares them with the stream's interned subscription as bytes and makes
//! strings of them only when the subscription changes
//! ([`crate::ads::Subscription::apply_sotw`], which also refuses a name that is not UTF-8,
//! as decoding a `string` field would have).
//!
//! The field numbers are those of `envoy.service.discovery.v3.DiscoveryRequest`;
//! `resource_locators` (xdstp), which the engine does not serve, is skipped like any
//! unknown field.

use std::ops::Range;

use bytes::{Buf, Bytes};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::rpc::Status;
use prost::encoding::{DecodeContext, WireType, decode_key, decode_varint, message, skip_field};
use prost::{DecodeError, Message};

/// A request message of an ADS stream, decoded from one gRPC message.
pub trait RequestMessage: Sized + Send + 'static {
    fn decode(message: Bytes) -> Result<Self, RequestDecodeError>;
}

/// Why a request message does not decode.
#[derive(Debug, thiserror::Error)]
pub enum RequestDecodeError {
    #[error(transparent)]
    Protobuf(#[from] DecodeError),
    #[error("{0}")]
    Field(&'static str),
}

impl RequestMessage for DeltaDiscoveryRequest {
    fn decode(message: Bytes) -> Result<Self, RequestDecodeError> {
        Ok(<DeltaDiscoveryRequest as Message>::decode(message)?)
    }
}

/// The fields of a `DiscoveryRequest` the SotW engine reads; the resource names stay in
/// the received message ([`SotwRequest::resource_names`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SotwRequest {
    pub version_info: String,
    /// Boxed: only a stream's first request carries it.
    pub node: Option<Box<Node>>,
    pub type_url: String,
    pub response_nonce: String,
    pub error_detail: Option<Status>,
    /// The received message, and where each resource name is in it.
    message: Bytes,
    names: Vec<Range<u32>>,
    /// From the first name's field key to the end of the last name, when no other field
    /// came between two names (how every encoder writes a repeated field).
    names_field: Option<Range<u32>>,
}

impl SotwRequest {
    /// The subscribed names, in the order sent, as sent (not checked to be UTF-8).
    pub fn resource_names(&self) -> ResourceNames<'_> {
        ResourceNames {
            message: &self.message,
            names: self.names.iter(),
        }
    }

    /// A 64-bit digest of the name list as sent (order and repeats included), never 0:
    /// equal digests mean, but for a 2⁻⁶⁴ accident, the same list. A stream keeps the
    /// digest of the last list it applied, so an ACK that repeats the list — nearly every
    /// SotW request — is recognised with one hash over its bytes instead of a comparison
    /// per name (a sidecar's RDS and EDS lists hold a name per service). The hash is not
    /// collision-resistant against a chosen list; a client that forged a collision would
    /// only keep its own previous subscription.
    pub fn names_digest(&self) -> u64 {
        use xxhash_rust::xxh3::{Xxh3, xxh3_64_with_seed};
        let digest = match &self.names_field {
            // The field's bytes (keys, lengths, names) encode the list unambiguously.
            Some(field) => {
                xxh3_64_with_seed(&self.message[field.start as usize..field.end as usize], 0)
            }
            None => {
                // Names between other fields: each name with its length, another seed.
                let mut hasher = Xxh3::with_seed(1);
                for name in self.resource_names() {
                    hasher.update(&(name.len() as u64).to_le_bytes());
                    hasher.update(name);
                }
                hasher.digest()
            }
        };
        digest.max(1)
    }
}

/// The resource names of a [`SotwRequest`].
#[derive(Clone, Debug)]
pub struct ResourceNames<'a> {
    message: &'a Bytes,
    names: std::slice::Iter<'a, Range<u32>>,
}

impl<'a> Iterator for ResourceNames<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let range = self.names.next()?;
        Some(&self.message[range.start as usize..range.end as usize])
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.names.size_hint()
    }
}

impl ExactSizeIterator for ResourceNames<'_> {}

impl RequestMessage for SotwRequest {
    fn decode(message: Bytes) -> Result<Self, RequestDecodeError> {
        if u32::try_from(message.len()).is_err() {
            return Err(RequestDecodeError::Field("request too large"));
        }
        let mut request = SotwRequest {
            message: message.clone(),
            ..SotwRequest::default()
        };
        let mut buf: &[u8] = &message;
        // Where the names field runs, and whether another field came between two names.
        let mut names_field: Option<Range<u32>> = None;
        let mut names_contiguous = true;
        let string = |wire: WireType, value: &mut String, buf: &mut &[u8]| {
            prost::encoding::string::merge(wire, value, buf, DecodeContext::default())
        };
        while buf.has_remaining() {
            // Fits in u32: the message does.
            let field_start = (message.len() - buf.remaining()) as u32;
            let (tag, wire) = decode_key(&mut buf)?;
            match tag {
                1 => string(wire, &mut request.version_info, &mut buf)?,
                2 => message::merge(
                    wire,
                    &mut **request.node.get_or_insert_with(Box::default),
                    &mut buf,
                    DecodeContext::default(),
                )?,
                3 => {
                    if wire != WireType::LengthDelimited {
                        return Err(RequestDecodeError::Field(
                            "resource_names: not length-delimited",
                        ));
                    }
                    let len = usize::try_from(decode_varint(&mut buf)?)
                        .map_err(|_| RequestDecodeError::Field("resource_names: bad length"))?;
                    if len > buf.remaining() {
                        return Err(RequestDecodeError::Field("resource_names: truncated"));
                    }
                    // Both fit in u32: the message does.
                    let start = (message.len() - buf.remaining()) as u32;
                    request.names.push(start..start + len as u32);
                    buf.advance(len);
                    let end = start + len as u32;
                    match &mut names_field {
                        Some(field) if field.end == field_start => field.end = end,
                        Some(_) => names_contiguous = false,
                        None => names_field = Some(field_start..end),
                    }
                }
                4 => string(wire, &mut request.type_url, &mut buf)?,
                5 => string(wire, &mut request.response_nonce, &mut buf)?,
                6 => message::merge(
                    wire,
                    request.error_detail.get_or_insert_with(Status::default),
                    &mut buf,
                    DecodeContext::default(),
                )?,
                _ => skip_field(wire, tag, &mut buf, DecodeContext::default())?,
            }
        }
        request.names_field = names_field.filter(|_| names_contiguous);
        Ok(request)
    }
}

impl From<DiscoveryRequest> for SotwRequest {
    /// The request as the engine would decode it from the wire (tests and tools).
    fn from(request: DiscoveryRequest) -> Self {
        <SotwRequest as RequestMessage>::decode(request.encode_to_vec().into())
            .expect("an encoded DiscoveryRequest decodes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> DiscoveryRequest {
        DiscoveryRequest {
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
        }
    }

    /// The bytes of a `DiscoveryRequest` decode to the same fields, the names read in
    /// place in the received buffer.
    #[test]
    fn decodes_a_discovery_request_with_names_in_place() {
        let original = request();
        let wire = Bytes::from(original.encode_to_vec());
        let decoded = <SotwRequest as RequestMessage>::decode(wire.clone()).expect("decodes");
        assert_eq!(decoded.version_info, original.version_info);
        assert_eq!(decoded.node.as_deref(), original.node.as_ref());
        assert_eq!(decoded.type_url, original.type_url);
        assert_eq!(decoded.response_nonce, original.response_nonce);
        assert_eq!(decoded.error_detail, original.error_detail);
        let names: Vec<&[u8]> = decoded.resource_names().collect();
        let expected: Vec<&[u8]> = original
            .resource_names
            .iter()
            .map(String::as_bytes)
            .collect();
        assert_eq!(names, expected);
        let buffer = wire.as_ptr_range();
        assert!(
            names.iter().all(|n| buffer.contains(&n.as_ptr())),
            "names are read in the message"
        );
    }

    fn digest_of(names: &[&str]) -> u64 {
        let request = DiscoveryRequest {
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            ..request()
        };
        SotwRequest::from(request).names_digest()
    }

    /// The digest follows the list as sent: equal lists (whatever else the request says)
    /// have equal digests; another order, a repeat, a missing or an extra name differ.
    #[test]
    fn the_names_digest_follows_the_list_as_sent() {
        let ab = digest_of(&["a", "b"]);
        assert_eq!(ab, digest_of(&["a", "b"]));
        let other_nonce = DiscoveryRequest {
            resource_names: vec!["a".into(), "b".into()],
            response_nonce: "8".into(),
            version_info: "v2".into(),
            ..request()
        };
        assert_eq!(ab, SotwRequest::from(other_nonce).names_digest());
        for other in [
            &["b", "a"][..],
            &["a", "b", "b"],
            &["a"],
            &["a", "b", "c"],
            &["ab"],
            &[],
        ] {
            assert_ne!(ab, digest_of(other), "{other:?}");
        }
        assert_ne!(digest_of(&[]), 0, "0 means no list applied yet");
    }

    /// Names with another field between them (no encoder we know writes that, but the
    /// wire allows it) have a digest of their own that still tells lists apart.
    #[test]
    fn names_between_other_fields_have_a_digest_too() {
        // resource_names "a", type_url "t", resource_names "b".
        let split = Bytes::from_static(&[0x1a, 1, b'a', 0x22, 1, b't', 0x1a, 1, b'b']);
        let split = <SotwRequest as RequestMessage>::decode(split).expect("decodes");
        assert!(split.names_field.is_none());
        let again = <SotwRequest as RequestMessage>::decode(Bytes::from_static(&[
            0x1a, 1, b'a', 0x22, 1, b't', 0x1a, 1, b'b',
        ]))
        .expect("decodes");
        assert_eq!(split.names_digest(), again.names_digest());
        let other = <SotwRequest as RequestMessage>::decode(Bytes::from_static(&[
            0x1a, 1, b'a', 0x22, 1, b't', 0x1a, 1, b'c',
        ]))
        .expect("decodes");
        assert_ne!(split.names_digest(), other.names_digest());
        assert_ne!(split.names_digest(), 0);
    }

    /// What prost refuses, this refuses: truncated names, a wrong wire type, bad strings;
    /// and every truncation of a valid request either fails or decodes a prefix of it.
    #[test]
    fn refuses_what_prost_refuses() {
        let wire = request().encode_to_vec();
        for cut in 0..wire.len() {
            let ours =
                <SotwRequest as RequestMessage>::decode(Bytes::copy_from_slice(&wire[..cut]));
            let prost = <DiscoveryRequest as Message>::decode(&wire[..cut]);
            assert_eq!(ours.is_ok(), prost.is_ok(), "cut at {cut}");
        }
        // resource_names (3) as a varint.
        assert!(
            <SotwRequest as RequestMessage>::decode(Bytes::from_static(&[0x18, 0x01])).is_err()
        );
        // type_url (4) that is not UTF-8.
        assert!(
            <SotwRequest as RequestMessage>::decode(Bytes::from_static(&[0x22, 0x01, 0xff]))
                .is_err()
        );
    }
}
