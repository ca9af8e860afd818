//! In-process costs of one reservation: the pure math (`BucketState::reserve`) and the memory store
//! (`MemoryStore::acquire_now`: clock read, mutex, map lookup, math), on one key and on 1000 keys.
//!
//! Run: `cargo bench --bench store` (add `-- --quick` for a short pass).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use tollgate::config::Limit;
use tollgate::store::bucket::BucketState;
use tollgate::store::{Bucket, Decision, MemoryStore, MonotonicClock};

const MAX_WAIT: Duration = Duration::from_secs(60);

fn limit(rate: f64, capacity: f64) -> Limit {
    Limit::new(rate, capacity).expect("a valid bench limit")
}

fn buckets(n: usize, limit: Limit) -> Vec<Bucket> {
    (0..n)
        .map(|i| Bucket {
            key: format!("tollgate:{{bench{i}}}").into(),
            limit,
        })
        .collect()
}

/// The math alone: a pass-through bucket (never in debt) and a contended one (every call queues).
fn reserve(c: &mut Criterion) {
    let mut group = c.benchmark_group("bucket/reserve");
    group.throughput(Throughput::Elements(1));
    for (name, l) in [
        ("pass_through", limit(1e9, 1e9)),
        ("contended", limit(200.0, 1.0)),
    ] {
        group.bench_function(name, |b| {
            let mut state = BucketState::full(l, 0);
            let mut now = 0u64;
            b.iter(|| {
                now += 1;
                let d = state.reserve(l, black_box(now), black_box(1.0), MAX_WAIT);
                // The contended bucket's debt is capped by max_wait: start over when it refuses.
                if matches!(d, Decision::Refused(_)) {
                    state = BucketState::full(l, now);
                }
                d
            });
        });
    }
    group.finish();
}

/// The memory store: one key (every call on the same entry) and 1000 keys taken in turn.
fn memory_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory/acquire_now");
    group.throughput(Throughput::Elements(1));
    for keys in [1usize, 1000] {
        let store = MemoryStore::new(Arc::new(MonotonicClock::new()));
        let all = buckets(keys, limit(1e9, 1e9));
        group.bench_with_input(BenchmarkId::new("keys", keys), &all, |b, all| {
            let mut i = 0usize;
            b.iter(|| {
                i = (i + 1) % all.len();
                store.acquire_now(&all[i], 1.0, MAX_WAIT)
            });
        });
    }
    group.finish();
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    reserve(&mut c);
    memory_store(&mut c);
    c.final_summary();
}
