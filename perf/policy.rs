//! Criterion benchmarks of routing-input extraction and the cache_aware decision (filled in by the policy work).
use criterion::{criterion_group, criterion_main, Criterion};

fn placeholder(c: &mut Criterion) {
    c.bench_function("noop", |b| b.iter(|| std::hint::black_box(1 + 1)));
}

criterion_group!(benches, placeholder);
criterion_main!(benches);
