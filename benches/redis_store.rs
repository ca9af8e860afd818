//! The Redis store's acquire against a local `redis-server` this bench starts on a free loopback port
//! (nothing persisted) and kills at the end: one call at a time (latency) and 64 in flight
//! (throughput), on one bucket and on 1000 buckets taken in turn. Skips with a message when
//! `redis-server` is not installed.
//!
//! Run: `cargo bench --bench redis_store` (add `-- --quick` for a short pass).

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use tokio::runtime::Runtime;
use tokio::time::Instant;
use tollgate::config::Limit;
use tollgate::store::{Bucket, Decision, RedisStore, Store, WallClock};
use tollgate::Config;

#[path = "../tests/support/redis_server.rs"]
#[allow(dead_code)]
mod redis_server;

use redis_server::RedisServer;

const MAX_WAIT: Duration = Duration::from_secs(60);
/// Calls in flight at once in the throughput benches (the proxy's load steps use 64 connections too).
const IN_FLIGHT: u64 = 64;

fn redis_server_installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn store(url: &str) -> RedisStore {
    // A generous call deadline: a bench must measure calls, not abort on one scheduling hiccup.
    let text = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout = \"2s\"\n\
         [providers.bench]\nupstream = \"http://127.0.0.1:9\"\nrate = 1\n"
    );
    let config = Config::from_toml("bench.toml", &text).expect("a valid bench config");
    RedisStore::connect(&config.store, Arc::new(WallClock)).expect("a redis store")
}

fn buckets(n: usize) -> Arc<Vec<Bucket>> {
    let limit = Limit::new(1e9, 1e9).expect("a valid bench limit");
    Arc::new(
        (0..n)
            .map(|i| Bucket {
                key: format!("tollgate:{{bench{i}}}").into(),
                limit,
            })
            .collect(),
    )
}

async fn acquire(store: &RedisStore, bucket: &Bucket) {
    match store
        .acquire(bucket, 1.0, MAX_WAIT)
        .await
        .expect("redis acquire")
    {
        Decision::Granted(_) => {}
        Decision::Refused(r) => panic!("a pass-through bucket refused: {r:?}"),
    }
}

fn main() {
    if !redis_server_installed() {
        println!("redis_store bench: skipped, redis-server is not installed (Debian: apt-get install redis-server)");
        return;
    }
    let server = RedisServer::start();
    let rt = Runtime::new().expect("a tokio runtime");
    let store = Arc::new(store(&server.url()));
    rt.block_on(store.ping()).expect("redis answers PING");

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(30)
        .configure_from_args();

    let mut group = c.benchmark_group("redis/acquire");
    group.throughput(Throughput::Elements(1));
    for keys in [1usize, 1000] {
        let all = buckets(keys);
        group.bench_with_input(BenchmarkId::new("sequential/keys", keys), &all, |b, all| {
            let mut i = 0usize;
            b.to_async(&rt).iter(|| {
                i = (i + 1) % all.len();
                acquire(&store, &all[i])
            });
        });
        group.bench_with_input(
            BenchmarkId::new(format!("in_flight_{IN_FLIGHT}/keys"), keys),
            &all,
            |b, all| {
                b.to_async(&rt).iter_custom(|iters| {
                    let store = store.clone();
                    let all = all.clone();
                    async move {
                        let next = Arc::new(AtomicUsize::new(0));
                        let started = Instant::now();
                        let tasks: Vec<_> = (0..IN_FLIGHT)
                            .map(|t| {
                                let (store, all, next) = (store.clone(), all.clone(), next.clone());
                                // Task t makes every IN_FLIGHT-th of the `iters` calls.
                                let calls = iters / IN_FLIGHT + u64::from(t < iters % IN_FLIGHT);
                                tokio::spawn(async move {
                                    for _ in 0..calls {
                                        let i = next.fetch_add(1, Ordering::Relaxed) % all.len();
                                        acquire(&store, &all[i]).await;
                                    }
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.expect("bench task");
                        }
                        started.elapsed()
                    }
                });
            },
        );
    }
    group.finish();
    c.final_summary();
    drop(rt);
    drop(server);
}
