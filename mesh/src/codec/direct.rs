//! Protobuf encoding of the snapshot straight from the mesh model, for the two item kinds
//! that make up nearly all of a snapshot (services and endpoints). Going through the
//! generated `pb` structs would first copy every string and label map; this writes the
//! same bytes without copies. It must produce exactly what prost's generated encoder
//! produces for the converted message (proto3 rules: default scalars and empty strings
//! omitted, map entries omit default keys and values, fields in tag order) — a property
//! test compares the two on random meshes.

use std::collections::BTreeMap;

use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint};

use super::{convert, pb};
use crate::model::{
    Endpoint, EndpointHealth, Resolution, Service, ServiceEndpoints, ServiceOrigin, TargetPort,
};
use crate::push_context::PushContext;

fn put_bytes(buf: &mut Vec<u8>, tag: u32, bytes: &[u8]) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.extend_from_slice(bytes);
}

/// A proto3 `string` field: omitted when empty.
fn put_str(buf: &mut Vec<u8>, tag: u32, s: &str) {
    if !s.is_empty() {
        put_bytes(buf, tag, s.as_bytes());
    }
}

/// A varint field (uint32, int64, bool, enum): omitted when zero.
fn put_varint(buf: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(v, buf);
    }
}

/// A `map<string, string>` field: one entry message per pair, in key order.
fn put_map(buf: &mut Vec<u8>, tag: u32, map: &BTreeMap<String, String>) {
    for (k, v) in map {
        let field_len = |s: &str| {
            if s.is_empty() {
                0
            } else {
                1 + prost::encoding::encoded_len_varint(s.len() as u64) + s.len()
            }
        };
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint((field_len(k) + field_len(v)) as u64, buf);
        put_str(buf, 1, k);
        put_str(buf, 2, v);
    }
}

/// Scratch buffers, one per nesting level, reused across items.
#[derive(Default)]
struct Scratch {
    levels: [Vec<u8>; 3],
}

fn encode_service(s: &Service, out: &mut Vec<u8>, scratch: &mut Vec<u8>) {
    put_str(out, 1, &s.hostname);
    put_str(out, 2, &s.name);
    put_str(out, 3, &s.namespace);
    for a in &s.addresses {
        // Repeated strings keep empty elements.
        put_bytes(out, 4, a.as_bytes());
    }
    for p in &s.ports {
        scratch.clear();
        put_str(scratch, 1, &p.name);
        put_varint(scratch, 2, u64::from(p.port));
        put_varint(
            scratch,
            3,
            convert::protocol_to_pb(p.protocol) as i32 as u64,
        );
        match &p.target_port {
            // A oneof member is written whenever it is set, even with a default value.
            Some(TargetPort::Number(n)) => {
                encode_key(4, WireType::Varint, scratch);
                encode_varint(u64::from(*n), scratch);
            }
            Some(TargetPort::Name(n)) => put_bytes(scratch, 5, n.as_bytes()),
            None => {}
        }
        put_bytes(out, 5, scratch);
    }
    put_map(out, 6, &s.labels);
    put_map(out, 7, &s.selector);
    for e in &s.export_to.0 {
        put_bytes(out, 8, e.as_bytes());
    }
    let resolution = match s.resolution {
        Resolution::ClientSideLb => pb::Resolution::ClientSideLb,
        Resolution::Passthrough => pb::Resolution::Passthrough,
        Resolution::Dns => pb::Resolution::Dns,
        Resolution::DnsRoundRobin => pb::Resolution::DnsRoundRobin,
    };
    put_varint(out, 9, resolution as i32 as u64);
    if let ServiceOrigin::ServiceEntry { name } = &s.origin {
        put_str(out, 10, name);
    }
    put_varint(out, 11, u64::from(s.mesh_external));
    put_str(out, 12, s.external_name.as_deref().unwrap_or(""));
    // int64 varints carry negative values as their two's complement.
    put_varint(out, 13, s.creation_ms as u64);
    for san in &s.subject_alt_names {
        put_bytes(out, 14, san.as_bytes());
    }
    put_varint(out, 15, u64::from(s.send_unhealthy_endpoints));
}

fn encode_endpoint(e: &Endpoint, out: &mut Vec<u8>) {
    put_str(out, 1, &e.address);
    put_varint(out, 2, u64::from(e.port));
    put_map(out, 3, &e.labels);
    put_str(out, 4, &e.locality.region);
    put_str(out, 5, &e.locality.zone);
    put_str(out, 6, &e.locality.subzone);
    let health = match e.health {
        EndpointHealth::Healthy => pb::Health::Healthy,
        EndpointHealth::Unhealthy => pb::Health::Unhealthy,
        EndpointHealth::Terminating => pb::Health::Terminating,
    };
    put_varint(out, 7, health as i32 as u64);
    put_str(out, 8, e.service_account.as_deref().unwrap_or(""));
    if let Some(w) = e.weight {
        // `optional` scalars are written whenever present.
        encode_key(9, WireType::Varint, out);
        encode_varint(u64::from(w), out);
    }
    put_str(out, 10, &e.network);
    put_str(out, 11, e.workload.as_deref().unwrap_or(""));
}

fn encode_service_endpoints(se: &ServiceEndpoints, out: &mut Vec<u8>, scratch: &mut Scratch) {
    put_str(out, 1, &se.hostname);
    put_str(out, 2, &se.namespace);
    let [port_buf, ep_buf, _] = &mut scratch.levels;
    for p in &se.ports {
        port_buf.clear();
        put_varint(port_buf, 1, u64::from(p.service_port));
        for e in &p.endpoints {
            ep_buf.clear();
            encode_endpoint(e, ep_buf);
            put_bytes(port_buf, 2, ep_buf);
        }
        put_bytes(out, 3, port_buf);
    }
}

/// The protobuf payload of a snapshot: byte-identical to `to_pb(ctx).encode_to_vec()`.
pub fn encode_payload(ctx: &PushContext) -> Vec<u8> {
    let data = ctx.data();
    let mut out = Vec::with_capacity(64 * (data.services.len() + 8 * data.endpoints.len()) + 1024);
    put_bytes(
        &mut out,
        1,
        &convert::mesh_to_pb(&data.mesh).encode_to_vec(),
    );
    put_str(&mut out, 2, &data.cluster_domain);
    let mut item = Vec::new();
    let mut scratch = Scratch::default();
    for s in &data.services {
        item.clear();
        encode_service(s, &mut item, &mut scratch.levels[2]);
        put_bytes(&mut out, 3, &item);
    }
    for e in &data.endpoints {
        item.clear();
        encode_service_endpoints(e, &mut item, &mut scratch);
        put_bytes(&mut out, 4, &item);
    }
    for c in convert::configs_to_pb(ctx) {
        item.clear();
        c.encode(&mut item).unwrap_or_default();
        put_bytes(&mut out, 5, &item);
    }
    for j in convert::jwks_to_pb(ctx) {
        item.clear();
        j.encode(&mut item).unwrap_or_default();
        put_bytes(&mut out, 6, &item);
    }
    out
}
