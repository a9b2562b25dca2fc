//! Deterministic encoding. prost writes fields in field-number order, except that a map
//! field's entries come in `HashMap` order, which differs between processes (and between
//! maps in one process). A route with both a fault and a CORS per-filter config would then
//! encode differently on every replica, and its content-hash version with it — breaking
//! the promise that an unchanged view is never re-sent. [`canonicalize`] re-emits an
//! encoded message with every map's entries sorted, recursing into nested messages and
//! into `Any` payloads of known types.

use prost::bytes::Buf;
use prost::encoding::{WireType, decode_key, decode_varint, encode_key, encode_varint};
use prost_reflect::{Kind, MessageDescriptor};

use super::descriptors::pool;

const ANY: &str = "google.protobuf.Any";

/// Bytes that do not parse as the message they claim to be (never the case for messages
/// we encoded ourselves: a bug), handed back unchanged.
#[derive(Debug)]
pub struct NotCanonical {
    pub bytes: Vec<u8>,
    pub why: &'static str,
}

/// The canonical encoding of `bytes`, a message named `type_name`; the input unchanged
/// when the type is unknown, and back in the error when the bytes do not parse.
pub fn canonicalize(type_name: &str, bytes: Vec<u8>) -> std::result::Result<Vec<u8>, NotCanonical> {
    let Some(desc) = pool().ok().and_then(|p| p.get_message_by_name(type_name)) else {
        return Ok(bytes);
    };
    let mut out = Vec::with_capacity(bytes.len());
    match message(&desc, &bytes, &mut out) {
        Ok(()) => Ok(out),
        Err(why) => Err(NotCanonical { bytes, why }),
    }
}

type Result<T> = std::result::Result<T, &'static str>;

fn message(desc: &MessageDescriptor, mut buf: &[u8], out: &mut Vec<u8>) -> Result<()> {
    // Encoded fields in input order; the entries of each map field are gathered at the
    // position of its first entry and sorted there.
    let mut fields: Vec<(Option<u32>, Vec<u8>)> = Vec::new();
    let mut maps: Vec<(u32, Vec<Vec<u8>>)> = Vec::new();
    while buf.has_remaining() {
        let (number, wire) = decode_key(&mut buf).map_err(|_| "bad key")?;
        let mut field = Vec::new();
        encode_key(number, wire, &mut field);
        match wire {
            WireType::Varint => {
                let v = decode_varint(&mut buf).map_err(|_| "bad varint")?;
                encode_varint(v, &mut field);
            }
            WireType::SixtyFourBit => copy(&mut buf, 8, &mut field)?,
            WireType::ThirtyTwoBit => copy(&mut buf, 4, &mut field)?,
            WireType::LengthDelimited => {
                let len = usize::try_from(decode_varint(&mut buf).map_err(|_| "bad length")?)
                    .map_err(|_| "bad length")?;
                if buf.remaining() < len {
                    return Err("truncated field");
                }
                let payload = &buf[..len];
                buf.advance(len);
                let field_desc = desc.get_field(number);
                let nested = match field_desc.as_ref().map(|f| f.kind()) {
                    Some(Kind::Message(m)) => Some(m),
                    _ => None,
                };
                match nested {
                    Some(m) => {
                        let mut inner = Vec::with_capacity(len);
                        if m.full_name() == ANY {
                            any(payload, &mut inner)?;
                        } else {
                            message(&m, payload, &mut inner)?;
                        }
                        encode_varint(inner.len() as u64, &mut field);
                        field.extend_from_slice(&inner);
                    }
                    None => {
                        encode_varint(len as u64, &mut field);
                        field.extend_from_slice(payload);
                    }
                }
                if field_desc.is_some_and(|f| f.is_map()) {
                    match maps.iter_mut().find(|(n, _)| *n == number) {
                        Some((_, entries)) => entries.push(field),
                        None => {
                            maps.push((number, vec![field]));
                            fields.push((Some(number), Vec::new()));
                        }
                    }
                    continue;
                }
            }
            WireType::StartGroup | WireType::EndGroup => {
                return Err("groups are not used by Envoy's protos");
            }
        }
        fields.push((None, field));
    }
    for (map, field) in fields {
        match map {
            None => out.extend_from_slice(&field),
            Some(number) => {
                if let Some((_, entries)) = maps.iter_mut().find(|(n, _)| *n == number) {
                    entries.sort();
                    for e in entries.iter() {
                        out.extend_from_slice(e);
                    }
                }
            }
        }
    }
    Ok(())
}

fn copy(buf: &mut &[u8], n: usize, out: &mut Vec<u8>) -> Result<()> {
    if buf.remaining() < n {
        return Err("truncated field");
    }
    out.extend_from_slice(&buf[..n]);
    buf.advance(n);
    Ok(())
}

/// An `Any`: its payload canonicalized as the type its URL names, when known.
fn any(mut buf: &[u8], out: &mut Vec<u8>) -> Result<()> {
    let mut type_url = String::new();
    let mut value: Vec<u8> = Vec::new();
    while buf.has_remaining() {
        let (number, wire) = decode_key(&mut buf).map_err(|_| "bad key")?;
        if wire != WireType::LengthDelimited {
            return Err("unexpected wire type in Any");
        }
        let len = usize::try_from(decode_varint(&mut buf).map_err(|_| "bad length")?)
            .map_err(|_| "bad length")?;
        if buf.remaining() < len {
            return Err("truncated Any");
        }
        let payload = &buf[..len];
        buf.advance(len);
        match number {
            1 => type_url = String::from_utf8(payload.to_vec()).map_err(|_| "bad type URL")?,
            2 => value = payload.to_vec(),
            _ => return Err("unknown field in Any"),
        }
    }
    let type_name = type_url.rsplit('/').next().unwrap_or_default();
    let value = match pool().ok().and_then(|p| p.get_message_by_name(type_name)) {
        Some(desc) => {
            let mut inner = Vec::with_capacity(value.len());
            message(&desc, &value, &mut inner)?;
            inner
        }
        None => value,
    };
    if !type_url.is_empty() {
        encode_key(1, WireType::LengthDelimited, out);
        encode_varint(type_url.len() as u64, out);
        out.extend_from_slice(type_url.as_bytes());
    }
    if !value.is_empty() {
        encode_key(2, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.extend_from_slice(&value);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::util::any as pack;
    use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
    use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
    use prost::{Message, Name};
    use std::collections::HashMap;

    fn config(keys: &[&str]) -> RouteConfiguration {
        let per_filter: HashMap<_, _> = keys
            .iter()
            .map(|k| (k.to_string(), pack(&HttpFault::default())))
            .collect();
        RouteConfiguration {
            name: "80".into(),
            virtual_hosts: vec![VirtualHost {
                name: "a".into(),
                domains: vec!["a".into()],
                routes: vec![Route {
                    name: "r".into(),
                    typed_per_filter_config: per_filter,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn maps_encode_identically_whatever_their_hash_order() {
        let keys = [
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "x.y",
            "z",
        ];
        let first = canonicalize(
            &RouteConfiguration::full_name(),
            config(&keys).encode_to_vec(),
        )
        .unwrap();
        let mut orders = std::collections::HashSet::new();
        for _ in 0..32 {
            let raw = config(&keys).encode_to_vec();
            orders.insert(raw.clone());
            assert_eq!(
                canonicalize(&RouteConfiguration::full_name(), raw).unwrap(),
                first
            );
        }
        assert!(
            orders.len() > 1,
            "the raw encodings should differ at least once in 32 tries"
        );
        let decoded = RouteConfiguration::decode(first.as_slice()).unwrap();
        assert_eq!(
            decoded,
            config(&keys),
            "canonical bytes decode to the same message"
        );
    }

    #[test]
    fn unknown_types_and_garbage_pass_through() {
        assert_eq!(
            canonicalize("no.such.Type", vec![1, 2, 3]).unwrap(),
            vec![1, 2, 3]
        );
        let garbage = canonicalize(&RouteConfiguration::full_name(), vec![0x0a, 0xff]);
        assert_eq!(garbage.unwrap_err().bytes, vec![0x0a, 0xff]);
    }
}
