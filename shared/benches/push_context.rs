//! PushContext build, encode and decode for synthetic meshes of 1k and 10k services
//! (5 endpoints each, 10% with a VirtualService and a DestinationRule). Run `make bench`;
//! results go to docs/PERFORMANCE.md.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use pilotfish_shared::codec::{self, DecodeLimits};
use pilotfish_shared::push_context::{build, build_endpoints_only};
use pilotfish_shared::synthetic::{MeshShape, mesh};

fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("push_context");
    group.sample_size(10);
    for n in [1_000usize, 10_000] {
        let inputs = mesh(MeshShape::standard(n));
        let ctx = build(&inputs, None).context;
        let blob = codec::encode(&ctx);
        eprintln!(
            "mesh of {n} services: blob {} bytes compressed, {} bytes protobuf",
            blob.bytes.len(),
            blob.header.payload_len
        );
        group.bench_with_input(BenchmarkId::new("build", n), &inputs, |b, i| {
            b.iter(|| build(black_box(i), None))
        });
        group.bench_with_input(
            BenchmarkId::new("build_endpoints_only", n),
            &inputs,
            |b, i| b.iter(|| build_endpoints_only(black_box(i), &ctx)),
        );
        group.bench_with_input(BenchmarkId::new("build_and_encode", n), &inputs, |b, i| {
            b.iter(|| codec::encode(&build(black_box(i), None).context))
        });
        group.bench_with_input(BenchmarkId::new("encode", n), &ctx, |b, c| {
            b.iter(|| codec::encode(black_box(c)))
        });
        group.bench_with_input(BenchmarkId::new("decode", n), &blob.bytes, |b, bytes| {
            b.iter(|| codec::decode(black_box(bytes), &DecodeLimits::default()))
        });
    }
    group.finish();
}

criterion_group!(push_context, benches);
criterion_main!(push_context);
