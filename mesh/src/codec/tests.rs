//! Codec tests: round trips (property-based), determinism, and every rejection path.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::model::{
    Endpoint, EndpointHealth, ExportTo, Locality, PortEndpoints, Resolution, Service,
    ServiceEndpoints, ServiceOrigin, ServicePort, TargetPort,
};
use crate::push_context::{self, MeshData, PushContext};
use crate::synthetic::{MeshShape, mesh};

fn synthetic(n: usize) -> PushContext {
    push_context::build(&mesh(MeshShape::standard(n)), None).context
}

#[test]
fn direct_encoding_matches_the_generated_encoder() {
    let ctx = synthetic(200);
    assert_eq!(
        super::direct::encode_payload(&ctx),
        to_pb(&ctx).encode_to_vec()
    );
}

#[test]
fn round_trip_keeps_every_item() {
    let ctx = synthetic(200);
    assert_eq!(ctx.virtual_services().len(), 20);
    let encoded = encode(&ctx);
    let decoded = decode(&encoded.bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.data(), ctx.data());
    assert_eq!(decoded.hashes(), ctx.hashes());
}

#[test]
fn encoding_is_deterministic() {
    let a = encode(&synthetic(300));
    let b = encode(&synthetic(300));
    assert_eq!(a.bytes, b.bytes);
    assert_eq!(a.hash_hex(), b.hash_hex());
    let c = encode(&synthetic(301));
    assert_ne!(a.hash_hex(), c.hash_hex());
    // Re-encoding what was decoded gives the same bytes.
    let again = encode(&decode(&a.bytes, &DecodeLimits::default()).unwrap());
    assert_eq!(again.bytes, a.bytes);
}

#[test]
fn rejects_truncated_bad_magic_and_unknown_major() {
    let blob = encode(&synthetic(10)).bytes;
    let limits = DecodeLimits::default();
    assert_eq!(
        decode(&blob[..10], &limits).unwrap_err(),
        DecodeError::Truncated { len: 10 }
    );
    let mut bad = blob.clone();
    bad[0] = b'X';
    assert!(matches!(
        decode(&bad, &limits),
        Err(DecodeError::BadMagic { .. })
    ));
    let mut newer = blob.clone();
    newer[4..6].copy_from_slice(&2u16.to_le_bytes());
    let err = decode(&newer, &limits).unwrap_err();
    assert_eq!(err, DecodeError::UnsupportedVersion { major: 2, minor: 0 });
    assert!(err.to_string().contains("schema version 2.0"), "{err}");
    // A newer minor version is read.
    let mut minor = blob.clone();
    minor[6..8].copy_from_slice(&7u16.to_le_bytes());
    assert!(decode(&minor, &limits).is_ok());
}

#[test]
fn rejects_corruption_anywhere_in_the_payload() {
    let blob = encode(&synthetic(50)).bytes;
    let limits = DecodeLimits::default();
    // Cut the frame short.
    let err = decode(&blob[..blob.len() - 7], &limits).unwrap_err();
    assert_eq!(err.reason(), "corrupt", "{err}");
    // Flip bytes across the compressed payload: each must be caught (zstd checks or hash).
    for pos in (HEADER_LEN..blob.len()).step_by(97) {
        let mut bad = blob.clone();
        bad[pos] ^= 0x5a;
        let result = decode(&bad, &limits);
        assert!(result.is_err(), "flip at {pos} was not detected");
    }
    // A wrong hash in the header.
    let mut bad = blob.clone();
    bad[30] ^= 1;
    assert_eq!(
        decode(&bad, &limits).unwrap_err(),
        DecodeError::Corrupt("content hash does not match the header".into())
    );
}

#[test]
fn enforces_size_limits_before_allocating() {
    let blob = encode(&synthetic(50)).bytes;
    let small = DecodeLimits {
        max_blob_bytes: blob.len() - 1,
        ..DecodeLimits::default()
    };
    assert!(matches!(
        decode(&blob, &small),
        Err(DecodeError::TooLarge { .. })
    ));
    let header = read_header(&blob).unwrap();
    let tight = DecodeLimits {
        max_payload_bytes: header.payload_len as usize - 1,
        ..DecodeLimits::default()
    };
    assert_eq!(decode(&blob, &tight).unwrap_err().reason(), "too_large");
    // A header that lies about the payload length cannot make the reader expand more.
    let mut liar = blob.clone();
    liar[12..20].copy_from_slice(&16u64.to_le_bytes());
    assert_eq!(
        decode(&liar, &DecodeLimits::default())
            .unwrap_err()
            .reason(),
        "corrupt"
    );
}

fn label_map() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map("[a-z]{1,6}", "[a-z0-9]{0,6}", 0..3)
}

fn service_strategy() -> impl Strategy<Value = Service> {
    (
        "[a-z]{1,8}",
        "[a-z]{1,5}",
        prop::collection::vec(
            (1u32..65535, 0usize..12, prop::option::of(1u32..65535)),
            0..3,
        ),
        label_map(),
        0usize..4,
        any::<bool>(),
        prop::option::of("[a-z]{1,8}"),
        any::<i64>(),
    )
        .prop_map(
            |(name, ns, ports, labels, res, external, entry, created)| Service {
                hostname: format!("{name}.{ns}.svc.cluster.local"),
                name: name.clone(),
                namespace: ns,
                addresses: vec!["10.0.0.1".into()],
                ports: ports
                    .into_iter()
                    .map(|(port, proto, target)| ServicePort {
                        name: format!("p{port}"),
                        port,
                        protocol: crate::model::ALL_PROTOCOLS[proto],
                        target_port: target.map(TargetPort::Number),
                    })
                    .collect(),
                selector: labels.clone(),
                labels,
                export_to: ExportTo(vec![".".into()]),
                resolution: [
                    Resolution::ClientSideLb,
                    Resolution::Passthrough,
                    Resolution::Dns,
                    Resolution::DnsRoundRobin,
                ][res],
                origin: match entry {
                    Some(n) => ServiceOrigin::ServiceEntry { name: n },
                    None => ServiceOrigin::Kubernetes,
                },
                mesh_external: external,
                external_name: None,
                creation_ms: created,
            },
        )
}

fn endpoint_strategy() -> impl Strategy<Value = Endpoint> {
    (
        "[0-9]{1,3}\\.[0-9]{1,3}",
        1u32..65535,
        label_map(),
        "[a-z]{0,4}",
        0usize..3,
        prop::option::of("[a-z]{1,6}"),
        prop::option::of(1u32..100),
    )
        .prop_map(|(addr, port, labels, zone, health, sa, weight)| Endpoint {
            address: format!("10.{addr}"),
            port,
            labels,
            locality: Locality {
                region: "r".into(),
                zone,
                subzone: String::new(),
            },
            health: [
                EndpointHealth::Healthy,
                EndpointHealth::Unhealthy,
                EndpointHealth::Draining,
            ][health],
            service_account: sa,
            weight,
            network: String::new(),
            workload: None,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_model_round_trips(services in prop::collection::vec(service_strategy(), 0..8),
                             endpoints in prop::collection::vec(endpoint_strategy(), 0..10)) {
        let mut services = services;
        services.sort_by(|a, b| (&a.hostname, &a.namespace).cmp(&(&b.hostname, &b.namespace)));
        services.dedup_by(|a, b| a.hostname == b.hostname && a.namespace == b.namespace);
        let eps: Vec<Arc<ServiceEndpoints>> = services.iter().map(|s| Arc::new(ServiceEndpoints {
            hostname: s.hostname.clone(),
            namespace: s.namespace.clone(),
            ports: vec![PortEndpoints { service_port: 80, endpoints: endpoints.clone() }],
        })).collect();
        let base = synthetic(20);
        let data = MeshData {
            services: services.into_iter().map(Arc::new).collect(),
            endpoints: eps,
            ..base.data().clone()
        };
        let ctx = PushContext::from_data(data);
        let encoded = encode(&ctx);
        let decoded = decode(&encoded.bytes, &DecodeLimits::default()).unwrap();
        prop_assert_eq!(decoded.data(), ctx.data());
        prop_assert_eq!(encode(&decoded).bytes, encoded.bytes);
        // The copy-free encoder writes exactly what prost's generated encoder writes.
        prop_assert_eq!(super::direct::encode_payload(&ctx), to_pb(&ctx).encode_to_vec());
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut blob = MAGIC.to_vec();
        blob.extend_from_slice(&bytes);
        let _ = decode(&blob, &DecodeLimits::default());
    }
}
