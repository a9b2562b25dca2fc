//! PushContext build, encode and decode for synthetic meshes of 1k and 10k services
//! (5 endpoints each, 10% with a VirtualService and a DestinationRule). Run `make bench`;
//! results go to docs/PERFORMANCE.md.
//!
//! Measured in *thread CPU time* (from `/proc/thread-self/schedstat`), not wall time: the
//! work is single-threaded, so on an idle machine the two agree, and on a shared, busy
//! machine CPU time still gives the same figures. Dropping the result (freeing a whole
//! snapshot) is left out of the timings: it happens later, when the old snapshot is
//! released, not on the path from a change to a published snapshot.

use std::hint::black_box;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pilotfish_mesh::codec::{self, DecodeLimits, SnapshotSigner, VerifyKeys};
use pilotfish_mesh::push_context::{build, build_endpoints_only};
use pilotfish_mesh::synthetic::{MeshShape, mesh};

/// CPU time consumed by the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = if typical >= 1e9 {
            (1e-9, "s (cpu)")
        } else if typical >= 1e6 {
            (1e-6, "ms (cpu)")
        } else {
            (1e-3, "µs (cpu)")
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }
    fn scale_throughputs(&self, _: f64, _: &Throughput, values: &mut [f64]) -> &'static str {
        self.scale_values(1.0, values)
    }
    fn scale_for_machines(&self, _: &mut [f64]) -> &'static str {
        "ns"
    }
}

fn benches(c: &mut Criterion<ThreadCpuTime>) {
    let mut group = c.benchmark_group("push_context");
    group.sample_size(10);
    for n in [1_000usize, 10_000] {
        let inputs = mesh(MeshShape::standard(n));
        let ctx = build(&inputs, None).context;
        let signer = SnapshotSigner::from_seed([1; 32]);
        let keys = VerifyKeys::new([signer.verify_key()]);
        let blob = codec::encode(&ctx, &signer);
        eprintln!(
            "mesh of {n} services: blob {} bytes compressed, {} bytes protobuf",
            blob.bytes.len(),
            blob.header.payload_len
        );
        group.bench_with_input(BenchmarkId::new("build", n), &inputs, |b, i| {
            b.iter_with_large_drop(|| build(black_box(i), None))
        });
        group.bench_with_input(
            BenchmarkId::new("build_endpoints_only", n),
            &inputs,
            |b, i| b.iter_with_large_drop(|| build_endpoints_only(black_box(i), &ctx)),
        );
        group.bench_with_input(BenchmarkId::new("build_and_encode", n), &inputs, |b, i| {
            b.iter_with_large_drop(|| {
                let out = build(black_box(i), None);
                (codec::encode(&out.context, &signer), out)
            })
        });
        group.bench_with_input(BenchmarkId::new("encode", n), &ctx, |b, c| {
            b.iter(|| codec::encode(black_box(c), &signer))
        });
        group.bench_with_input(BenchmarkId::new("decode", n), &blob.bytes, |b, bytes| {
            b.iter_with_large_drop(|| {
                codec::decode(black_box(bytes), &DecodeLimits::default(), &keys)
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = push_context;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = benches
}
criterion_main!(push_context);
