//! Codec tests: round trips (property-based), determinism, and every rejection path.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use prost::Message;
use sha2::{Digest, Sha256};

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

fn signer() -> SnapshotSigner {
    SnapshotSigner::from_seed([42; 32])
}

fn keys() -> VerifyKeys {
    VerifyKeys::new([signer().verify_key()])
}

fn dec(blob: &[u8], limits: &DecodeLimits) -> Result<PushContext, DecodeError> {
    decode(blob, limits, &keys())
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
    let encoded = encode(&ctx, &signer());
    assert_eq!(encoded.header.key_id, signer().key_id());
    let decoded = dec(&encoded.bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.data(), ctx.data());
    assert_eq!(decoded.hashes(), ctx.hashes());
}

#[test]
fn encoding_is_deterministic() {
    let a = encode(&synthetic(300), &signer());
    let b = encode(&synthetic(300), &signer());
    assert_eq!(a.bytes, b.bytes);
    assert_eq!(a.hash_hex(), b.hash_hex());
    let c = encode(&synthetic(301), &signer());
    assert_ne!(a.hash_hex(), c.hash_hex());
    // Re-encoding what was decoded gives the same bytes.
    let again = encode(&dec(&a.bytes, &DecodeLimits::default()).unwrap(), &signer());
    assert_eq!(again.bytes, a.bytes);
    // Another key: other bytes, the same content hash.
    let other = encode(&synthetic(300), &SnapshotSigner::from_seed([1; 32]));
    assert_ne!(other.bytes, a.bytes);
    assert_eq!(other.hash_hex(), a.hash_hex());
}

#[test]
fn rejects_truncated_bad_magic_unsigned_and_unknown_major() {
    let blob = encode(&synthetic(10), &signer()).bytes;
    let limits = DecodeLimits::default();
    assert_eq!(
        dec(&blob[..10], &limits).unwrap_err(),
        DecodeError::Truncated { len: 10 }
    );
    let mut bad = blob.clone();
    bad[0] = b'X';
    assert!(matches!(
        dec(&bad, &limits),
        Err(DecodeError::BadMagic { .. })
    ));
    let mut newer = blob.clone();
    newer[4..6].copy_from_slice(&3u16.to_le_bytes());
    let err = dec(&newer, &limits).unwrap_err();
    assert_eq!(err, DecodeError::UnsupportedVersion { major: 3, minor: 0 });
    assert!(err.to_string().contains("schema version 3.0"), "{err}");
    // A schema-1 blob (what controllers wrote before blobs were signed) is unsigned.
    let mut old = b"PFSN".to_vec();
    old.extend_from_slice(&1u16.to_le_bytes());
    old.extend_from_slice(&0u16.to_le_bytes());
    old.extend_from_slice(&[0; 44]);
    let err = dec(&old, &limits).unwrap_err();
    assert_eq!(err.reason(), "unsigned");
    // The minor version is signed: changing it breaks the signature.
    let mut minor = blob.clone();
    minor[6..8].copy_from_slice(&7u16.to_le_bytes());
    assert_eq!(dec(&minor, &limits).unwrap_err().reason(), "bad_signature");
}

#[test]
fn only_blobs_signed_by_a_known_key_are_opened() {
    let ctx = synthetic(20);
    let limits = DecodeLimits::default();
    let forged = encode(&ctx, &SnapshotSigner::from_seed([9; 32]));
    let err = dec(&forged.bytes, &limits).unwrap_err();
    assert_eq!(err.reason(), "unknown_key", "{err}");
    // Rotation: a reader holding both keys accepts both.
    let both = VerifyKeys::new([
        signer().verify_key(),
        SnapshotSigner::from_seed([9; 32]).verify_key(),
    ]);
    assert!(decode(&forged.bytes, &limits, &both).is_ok());
    // A forged signature under a known key id.
    let mut blob = encode(&ctx, &signer()).bytes;
    blob[70] ^= 0x01;
    assert_eq!(dec(&blob, &limits).unwrap_err().reason(), "bad_signature");
    // A key id swapped for another known one.
    let mut blob = encode(&ctx, &signer()).bytes;
    blob[52..60].copy_from_slice(&SnapshotSigner::from_seed([9; 32]).key_id().0);
    assert_eq!(
        decode(&blob, &limits, &both).unwrap_err().reason(),
        "bad_signature"
    );
    // No keys at all: nothing is accepted.
    let err = decode(
        &encode(&ctx, &signer()).bytes,
        &limits,
        &VerifyKeys::default(),
    )
    .unwrap_err();
    assert_eq!(err.reason(), "unknown_key");
}

#[test]
fn rejects_corruption_anywhere_in_the_blob_before_decompressing() {
    let blob = encode(&synthetic(50), &signer()).bytes;
    let limits = DecodeLimits::default();
    // Cut the frame short: the signature covers the frame.
    let err = dec(&blob[..blob.len() - 7], &limits).unwrap_err();
    assert_eq!(err.reason(), "bad_signature", "{err}");
    // Flip bytes anywhere: each is caught, by the signature.
    for pos in (0..blob.len()).step_by(97).filter(|p| !(0..4).contains(p)) {
        let mut bad = blob.clone();
        bad[pos] ^= 0x5a;
        let result = dec(&bad, &limits);
        assert!(result.is_err(), "flip at {pos} was not detected");
    }
}

#[test]
fn a_signed_frame_that_lies_is_caught_after_decompression() {
    let ctx = synthetic(50);
    let payload = super::direct::encode_payload(&ctx);
    let frame = zstd::bulk::compress(&payload, 3).unwrap();
    let hash: [u8; 32] = Sha256::digest(&payload).into();
    let limits = DecodeLimits::default();
    // A wrong content hash.
    let liar = seal_frame(frame.clone(), payload.len() as u64, [7; 32], &signer());
    assert_eq!(
        dec(&liar.bytes, &limits).unwrap_err(),
        DecodeError::Corrupt("content hash does not match the header".into())
    );
    // A length shorter or longer than what the frame holds.
    for len in [16, payload.len() as u64 - 1, payload.len() as u64 + 1] {
        let liar = seal_frame(frame.clone(), len, hash, &signer());
        let err = dec(&liar.bytes, &limits).unwrap_err();
        assert_eq!(err.reason(), "corrupt", "{len}: {err}");
    }
    assert!(
        dec(
            &seal_frame(frame, payload.len() as u64, hash, &signer()).bytes,
            &limits
        )
        .is_ok()
    );
}

#[test]
fn enforces_size_limits_before_allocating() {
    let blob = encode(&synthetic(50), &signer()).bytes;
    let small = DecodeLimits {
        max_blob_bytes: blob.len() - 1,
        ..DecodeLimits::default()
    };
    assert!(matches!(
        dec(&blob, &small),
        Err(DecodeError::TooLarge { .. })
    ));
    let header = read_header(&blob).unwrap();
    let tight = DecodeLimits {
        max_payload_bytes: header.payload_len as usize - 1,
        ..DecodeLimits::default()
    };
    assert_eq!(dec(&blob, &tight).unwrap_err().reason(), "too_large");
    assert_eq!(
        DecodeLimits::for_max_blob(1 << 20).max_payload_bytes,
        32 << 20
    );
}

#[test]
fn a_decompression_bomb_is_refused_by_its_declared_length_or_cut_at_it() {
    // 64 MiB of zeros compress to a few KiB.
    let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        std::io::Write::write_all(&mut encoder, &zeros).unwrap();
    }
    let frame = encoder.finish().unwrap();
    assert!(frame.len() < 64 << 10, "{}", frame.len());
    let limits = DecodeLimits::for_max_blob(256 << 10);
    // Declared honestly: refused before decompression (the payload limit is 8 MiB).
    let honest = seal_frame(frame.clone(), 64 << 20, [0; 32], &signer());
    assert_eq!(
        dec(&honest.bytes, &limits).unwrap_err(),
        DecodeError::TooLarge {
            size: 64 << 20,
            limit: 8 << 20
        }
    );
    // Declared small: decompression stops one byte past the declared length.
    let liar = seal_frame(frame.clone(), 1 << 20, [0; 32], &signer());
    let err = dec(&liar.bytes, &limits).unwrap_err();
    assert!(
        err.to_string().contains("longer than the 1048576 bytes"),
        "{err}"
    );
    // Unsigned: refused before anything is decompressed.
    let unsigned = seal_frame(frame, 1 << 20, [0; 32], &SnapshotSigner::from_seed([3; 32]));
    assert_eq!(
        dec(&unsigned.bytes, &limits).unwrap_err().reason(),
        "unknown_key"
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
        prop::collection::vec("[a-z:/]{0,12}", 0..3),
    )
        .prop_map(
            |(name, ns, ports, labels, res, external, entry, created, sans)| Service {
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
                subject_alt_names: sans,
                send_unhealthy_endpoints: created % 2 == 0,
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
                EndpointHealth::Terminating,
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
        let encoded = encode(&ctx, &signer());
        let decoded = dec(&encoded.bytes, &DecodeLimits::default()).unwrap();
        prop_assert_eq!(decoded.data(), ctx.data());
        prop_assert_eq!(encode(&decoded, &signer()).bytes, encoded.bytes);
        // The copy-free encoder writes exactly what prost's generated encoder writes.
        prop_assert_eq!(super::direct::encode_payload(&ctx), to_pb(&ctx).encode_to_vec());
    }

    #[test]
    fn arbitrary_bytes_are_refused_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048),
                                                 magic in any::<bool>()) {
        let mut blob = if magic { MAGIC.to_vec() } else { Vec::new() };
        blob.extend_from_slice(&bytes);
        prop_assert!(dec(&blob, &DecodeLimits::default()).is_err());
    }

    #[test]
    fn every_truncation_is_refused(cut in 0usize..4096) {
        let blob = &valid_blob().bytes;
        let cut = cut % blob.len();
        prop_assert!(dec(&blob[..cut], &DecodeLimits::default()).is_err());
    }

    #[test]
    fn every_bit_flip_is_refused(bit in 0usize..(1 << 20)) {
        let mut blob = valid_blob().bytes.clone();
        let bit = bit % (blob.len() * 8);
        blob[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(dec(&blob, &DecodeLimits::default()).is_err());
    }

    /// Headers forged by someone holding no key: any field, any length, any signature.
    #[test]
    fn forged_headers_are_refused_before_decompression(
        major in prop_oneof![Just(SCHEMA_MAJOR), any::<u16>()],
        minor in any::<u16>(),
        payload_len in prop_oneof![Just(u64::MAX), 0u64..(1 << 40)],
        key_id in prop_oneof![Just(signer().key_id().0), any::<[u8; 8]>()],
        signature in prop::collection::vec(any::<u8>(), 64),
        frame_len in 0usize..256,
    ) {
        let valid = valid_blob();
        let mut blob = valid.bytes[..4].to_vec();
        blob.extend_from_slice(&major.to_le_bytes());
        blob.extend_from_slice(&minor.to_le_bytes());
        blob.extend_from_slice(&[0; 4]);
        blob.extend_from_slice(&payload_len.to_le_bytes());
        blob.extend_from_slice(&valid.header.hash);
        blob.extend_from_slice(&key_id);
        blob.extend_from_slice(&signature);
        let frame = &valid.bytes[HEADER_LEN..];
        blob.extend_from_slice(&frame[..frame_len.min(frame.len())]);
        let err = dec(&blob, &DecodeLimits::default()).unwrap_err();
        prop_assert!(
            matches!(err.reason(), "unknown_key" | "bad_signature" | "unsupported_version" | "unsigned" | "truncated"),
            "{}", err
        );
    }

    /// Headers signed with the real key but lying about the payload (length, hash) or
    /// around a frame that is not the payload's: refused, never a panic, never more
    /// memory than the declared length.
    #[test]
    fn signed_lies_are_refused(
        payload_len in prop_oneof![0u64..(1 << 16), Just(u64::MAX), (1u64 << 30)..(1 << 40)],
        frame in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256).boxed(),
            Just(valid_blob().bytes[HEADER_LEN..].to_vec()).boxed(),
        ],
        hash in any::<[u8; 32]>(),
    ) {
        let blob = seal_frame(frame, payload_len, hash, &signer());
        prop_assert!(dec(&blob.bytes, &DecodeLimits::default()).is_err());
    }
}

/// One small valid blob, encoded once.
fn valid_blob() -> &'static Encoded {
    static BLOB: std::sync::OnceLock<Encoded> = std::sync::OnceLock::new();
    BLOB.get_or_init(|| encode(&synthetic(5), &signer()))
}

/// PeerAuthentications travel as config kind 3 and come back equal, with their hashes;
/// the direct encoder writes them as the generated one does.
#[test]
fn peer_authentications_round_trip() {
    let yaml = "\
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: istio-system, creationTimestamp: '2024-01-01T00:00:00Z'}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1beta1
kind: PeerAuthentication
metadata: {name: ports, namespace: shop}
spec:
  selector: {matchLabels: {app: cart}}
  portLevelMtls: {'8080': {mode: DISABLE}, '9090': {mode: UNSET}}
";
    let parsed = crate::document::parse_text(std::path::Path::new("pa.yaml"), yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let inputs = crate::document::to_inputs(&parsed.objects, mesh(MeshShape::standard(20)));
    let ctx = push_context::build(&inputs, None).context;
    assert_eq!(ctx.peer_authentications().len(), 2);
    assert_eq!(
        super::direct::encode_payload(&ctx),
        to_pb(&ctx).encode_to_vec()
    );
    let decoded = dec(&encode(&ctx, &signer()).bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.data(), ctx.data());
    assert_eq!(decoded.hashes(), ctx.hashes());
    let labels = BTreeMap::from([("app".to_string(), "cart".to_string())]);
    let mtls = decoded.mtls_for_workload("shop", &labels);
    assert_eq!(mtls.mode, crate::api::MtlsMode::Strict);
    assert_eq!(mtls.for_port(8080), crate::api::MtlsMode::Disable);
    assert_eq!(mtls.for_port(9090), crate::api::MtlsMode::Strict);
}

/// Sidecars travel as config kind 4 and come back equal, with their hashes; the direct
/// encoder writes them as the generated one does; a decoded snapshot selects and scopes as
/// the built one.
#[test]
fn sidecars_round_trip() {
    let yaml = "\
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: istio-system, creationTimestamp: '2024-01-01T00:00:00Z'}
spec: {egress: [{hosts: ['./*', 'istio-system/*']}]}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: cart, namespace: shop}
spec:
  workloadSelector: {labels: {app: cart}}
  egress: [{port: {number: 8080, protocol: HTTP, name: http}, hosts: ['*/*']}]
  outboundTrafficPolicy: {mode: ALLOW_ANY, egressProxy: {host: proxy.example.com, port: {number: 3128}}}
";
    let parsed = crate::document::parse_text(std::path::Path::new("sc.yaml"), yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let inputs = crate::document::to_inputs(&parsed.objects, mesh(MeshShape::standard(20)));
    let ctx = push_context::build(&inputs, None).context;
    assert_eq!(ctx.sidecars().len(), 2);
    assert_eq!(
        super::direct::encode_payload(&ctx),
        to_pb(&ctx).encode_to_vec()
    );
    let decoded = dec(&encode(&ctx, &signer()).bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.data(), ctx.data());
    assert_eq!(decoded.hashes(), ctx.hashes());
    let cart = BTreeMap::from([("app".to_string(), "cart".to_string())]);
    let chosen = decoded.sidecar_for("shop", &cart).unwrap();
    assert_eq!(decoded.sidecars()[chosen].meta.name, "cart");
    let other = decoded.sidecar_for("shop", &BTreeMap::new()).unwrap();
    assert_eq!(decoded.sidecars()[other].meta.namespace, "istio-system");
}

/// AuthorizationPolicies travel as config kind 5 (dry-run and CUSTOM ones included) and
/// come back equal, with their hashes; the direct encoder writes them as the generated one
/// does; a decoded snapshot selects per workload as the built one; a reader that does not
/// know kind 5 (a config of an unknown kind) still reads the rest.
#[test]
fn authorization_policies_round_trip() {
    let yaml = "\
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: mesh, namespace: istio-system, creationTimestamp: '2024-01-01T00:00:00Z'}
spec: {action: DENY, rules: [{from: [{source: {notNamespaces: [shop]}}]}]}
---
apiVersion: security.istio.io/v1beta1
kind: AuthorizationPolicy
metadata: {name: cart, namespace: shop, annotations: {istio.io/dry-run: 'true'}}
spec:
  selector: {matchLabels: {app: cart}}
  rules: [{to: [{operation: {methods: [GET], paths: ['/api/{*}']}}], when: [{key: source.ip, values: [10.0.0.0/8]}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: ext, namespace: shop}
spec: {action: CUSTOM, provider: {name: opa}, rules: [{}]}
";
    let parsed = crate::document::parse_text(std::path::Path::new("ap.yaml"), yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let inputs = crate::document::to_inputs(&parsed.objects, mesh(MeshShape::standard(20)));
    let ctx = push_context::build(&inputs, None).context;
    assert_eq!(ctx.authorization_policies().len(), 3);
    assert_eq!(
        super::direct::encode_payload(&ctx),
        to_pb(&ctx).encode_to_vec()
    );
    let decoded = dec(&encode(&ctx, &signer()).bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.data(), ctx.data());
    assert_eq!(decoded.hashes(), ctx.hashes());
    let cart = BTreeMap::from([("app".to_string(), "cart".to_string())]);
    let applied = decoded.authorization_for_workload("shop", &cart);
    assert_eq!(applied.deny.len(), 1);
    assert_eq!(applied.custom.len(), 1);
    assert_eq!(applied.allow.len(), 1);
    assert!(applied.allow[0].spec.dry_run);
    assert!(
        decoded
            .authorization_for_workload("shop", &BTreeMap::new())
            .allow
            .is_empty()
    );
    // A reader older than kind 5 skips these configs and keeps the rest.
    let mut pb = to_pb(&ctx);
    for c in &mut pb.configs {
        if c.kind == pb::Kind::AuthorizationPolicy as i32 {
            c.kind = 99;
        }
    }
    let older = super::from_pb(pb).unwrap();
    assert!(older.authorization_policies().is_empty());
    assert_eq!(older.services().len(), ctx.services().len());
}

/// RequestAuthentications travel as config kind 6 and the fetched key sets as snapshot
/// field 6; both come back equal with their hashes, the direct encoder matches the
/// generated one, and a refreshed key set changes the policy's hash (so the listeners it
/// shapes are regenerated). A source no accepted policy names is not carried.
#[test]
fn request_authentications_and_their_key_sets_round_trip() {
    use crate::push_context::{JwksOutcome, JwksSource};
    let yaml = "\
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: default, namespace: istio-system}
spec: {jwtRules: [{issuer: 'https://a', jwksUri: 'https://a/keys'}, {issuer: 'https://b'}]}
---
apiVersion: security.istio.io/v1beta1
kind: RequestAuthentication
metadata: {name: inline, namespace: shop}
spec:
  selector: {matchLabels: {app: cart}}
  jwtRules: [{issuer: c, jwks: '{\"keys\":[]}', fromHeaders: [{name: x-token, prefix: 'Bearer '}]}]
";
    let parsed = crate::document::parse_text(std::path::Path::new("ra.yaml"), yaml);
    assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
    let source = |issuer: &str, uri: &str| JwksSource {
        issuer: issuer.into(),
        jwks_uri: uri.into(),
    };
    let mut base = mesh(MeshShape::standard(20));
    base.jwks = BTreeMap::from([
        (
            source("https://a", "https://a/keys"),
            JwksOutcome::Keys("{\"keys\":[{\"kty\":\"EC\"}]}".into()),
        ),
        (
            source("https://b", ""),
            JwksOutcome::Failed("connection refused".into()),
        ),
        (
            source("unused", "https://unused"),
            JwksOutcome::Keys("{}".into()),
        ),
    ]);
    let inputs = crate::document::to_inputs(&parsed.objects, base);
    let ctx = push_context::build(&inputs, None).context;
    assert_eq!(ctx.request_authentications().len(), 2);
    assert_eq!(ctx.jwks().len(), 2, "only the sources policies name");
    assert_eq!(
        super::direct::encode_payload(&ctx),
        to_pb(&ctx).encode_to_vec()
    );
    let decoded = dec(&encode(&ctx, &signer()).bytes, &DecodeLimits::default()).unwrap();
    assert_eq!(decoded.data(), ctx.data());
    assert_eq!(decoded.hashes(), ctx.hashes());
    let cart = BTreeMap::from([("app".to_string(), "cart".to_string())]);
    let issuers: Vec<&str> = decoded
        .jwt_rules_for_workload("shop", &cart)
        .iter()
        .map(|r| r.issuer.as_str())
        .collect();
    assert_eq!(issuers, ["c", "https://a", "https://b"]);

    // A refreshed key set: same policies, another hash for the one using it; a build
    // without the resolver's answer keeps the previous snapshot's.
    let mut refreshed = inputs.clone();
    refreshed.jwks.insert(
        source("https://a", "https://a/keys"),
        JwksOutcome::Keys("{\"keys\":[{\"kty\":\"RSA\"}]}".into()),
    );
    let next = push_context::build(&refreshed, Some(&ctx)).context;
    let key = crate::config::ConfigKey::new(
        crate::config::ConfigKind::RequestAuthentication,
        "istio-system",
        "default",
    );
    assert_ne!(next.hashes().configs[&key], ctx.hashes().configs[&key]);
    let mut forgotten = inputs.clone();
    forgotten.jwks.clear();
    let kept = push_context::build(&forgotten, Some(&ctx)).context;
    assert_eq!(kept.jwks(), ctx.jwks());
}
