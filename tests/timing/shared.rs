//! Several replicas on one Redis behave as one limiter: checked at the provider, with real Redis.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tollgate::store::{Clock, RedisStore, WallClock};
use tollgate::upstream::{GuardedResolver, HttpClient, Timeouts};
use tollgate::{Config, Parts};

use crate::support::client::{client, get};
use crate::support::fake_provider::{FakeProvider, OwnLimit};
use crate::support::naive_store::{NaiveStore, OffsetClock};
use crate::support::redis_server::RedisServer;
use crate::support::swarm::{self, JITTER};
use crate::support::tollgate::{provider, redis_sections, Tollgate, EPHEMERAL};
use crate::support::window;

fn redis_toml(redis: &RedisServer, clock: &str, replicas: u32, providers: &str) -> String {
    let store = redis_sections(&redis.url(), "250ms", clock, "local", replicas);
    format!("{EPHEMERAL}{store}{providers}")
}

fn upstream() -> Arc<HttpClient> {
    Arc::new(HttpClient::new(
        Timeouts {
            connect: Duration::from_secs(2),
            response: Duration::from_secs(10),
        },
        GuardedResolver::default(),
    ))
}

/// A replica whose store uses `clock` (for `store.clock = "local"`).
async fn replica_with_clock(toml: &str, clock: Arc<dyn Clock>) -> Tollgate {
    let config = Config::from_toml("test.toml", toml).expect("valid");
    let store = RedisStore::connect(&config.store, clock).expect("store");
    Tollgate::start_with(
        toml,
        Parts {
            store: Arc::new(store),
            upstream: upstream(),
        },
    )
    .await
}

/// Sum of `cmdstat_eval*` calls in `INFO commandstats`.
fn script_calls(redis: &RedisServer) -> u64 {
    redis
        .command(&["INFO", "commandstats"])
        .lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn store_errors(t: &Tollgate) -> String {
    t.metrics
        .encode()
        .lines()
        .find(|l| l.starts_with("tollgate_store_errors_total"))
        .unwrap_or("")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_one_redis_hold_the_bound_with_one_script_call_per_request() {
    let (rate, capacity) = (30.0, 15.0);
    let redis = RedisServer::start();
    let p = FakeProvider::start_with(Some(OwnLimit {
        rate,
        capacity,
        jitter: JITTER,
    }))
    .await;
    let toml = redis_toml(
        &redis,
        "redis",
        3,
        &provider("geo", &p.url(), rate, capacity),
    );
    let replicas = [
        Tollgate::start(&toml).await,
        Tollgate::start(&toml).await,
        Tollgate::start(&toml).await,
    ];
    let urls: Vec<String> = replicas.iter().map(|t| t.url("/geo/search?q=x")).collect();
    // Warm up (the first calls also meet NOSCRIPT and load the script), then count from zero.
    let swarm = swarm::Swarm::warm(&p, &urls, 60, rate, capacity).await;
    let p_before = p.arrivals().len();
    redis.command(&["CONFIG", "RESETSTAT"]);
    let run = swarm.run(Duration::from_secs(5)).await;
    assert_eq!(p.arrivals().len() - p_before, run.requests());
    let calls = script_calls(&redis);
    let per_request = calls as f64 / run.requests() as f64;
    eprintln!(
        "script calls {calls} for {} requests: {per_request:.3} per request",
        run.requests()
    );
    assert!(run.report.holds(), "bound broken: {:?}", run.report);
    assert_eq!(p.breaches(), 0);
    assert!(run.statuses.iter().all(|s| *s == 200), "all forwarded");
    assert!(run.span >= Duration::from_secs(5));
    assert!(
        run.utilisation >= 0.95,
        "utilisation {:.3}",
        run.utilisation
    );
    assert_eq!(
        calls,
        run.requests() as u64,
        "exactly one script call per request"
    );
    for t in &replicas {
        assert!(
            store_errors(t).ends_with(" 0"),
            "no fallback during the run: {}",
            store_errors(t)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_swarm_catches_a_naive_get_then_set_store() {
    let (rate, capacity) = (30.0, 15.0);
    let redis = RedisServer::start();
    let p = FakeProvider::start().await;
    let toml = format!("{EPHEMERAL}{}", provider("geo", &p.url(), rate, capacity));
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let store = NaiveStore::connect(&redis.url()).await;
        replicas.push(
            Tollgate::start_with(
                &toml,
                Parts {
                    store: Arc::new(store),
                    upstream: upstream(),
                },
            )
            .await,
        );
    }
    let urls: Vec<String> = replicas.iter().map(|t| t.url("/geo/search?q=x")).collect();
    let run = swarm::run(&p, &urls, 60, Duration::from_secs(2), rate, capacity).await;
    assert!(
        !run.report.holds(),
        "the naive store should over-issue: {:?}",
        run.report
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_replica_clock_breaks_local_time_but_not_redis_time() {
    let (rate, capacity) = (10.0, 5.0);
    let mut excess = Vec::new();
    for clock in ["local", "redis"] {
        let redis = RedisServer::start();
        let p = FakeProvider::start().await;
        let toml = redis_toml(&redis, clock, 2, &provider("geo", &p.url(), rate, capacity));
        let honest = replica_with_clock(&toml, Arc::new(WallClock)).await;
        let ahead = replica_with_clock(&toml, Arc::new(OffsetClock(Duration::from_secs(3)))).await;
        let start = Instant::now();
        let (a, b) = (honest.url("/geo/a"), ahead.url("/geo/b"));
        // The honest replica queues the bucket up; then the skewed one joins.
        let first = tokio::spawn(async move { burst(&a, 20).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let second = tokio::spawn(async move { burst(&b, 20).await });
        first.await.expect("first");
        second.await.expect("second");
        let times: Vec<Duration> = p
            .arrival_times()
            .iter()
            .map(|t| t.saturating_duration_since(start))
            .collect();
        let report = window::check(&times, rate, capacity, JITTER);
        eprintln!(
            "clock = {clock}: {} arrivals, worst window {} in {:?} vs bound {:.2} (excess {:+.2})",
            times.len(),
            report.worst_count,
            report.worst_len,
            report.worst_bound,
            report.max_excess
        );
        excess.push(report.max_excess);
    }
    assert!(
        excess[0] > 1.0,
        "with local clocks a replica 3 s ahead credits time that never passed (excess {:+.2})",
        excess[0]
    );
    assert!(
        excess[1] <= 1e-9,
        "with the Redis clock the bound holds (excess {:+.2})",
        excess[1]
    );
}

/// `n` concurrent requests, each awaited.
async fn burst(url: &str, n: usize) {
    let c = client();
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (c, url) = (c.clone(), url.to_string());
            tokio::spawn(async move { assert_eq!(get(&c, &url, &[]).await.status, 200) })
        })
        .collect();
    for t in tasks {
        t.await.expect("request");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushing_the_script_cache_mid_run_fails_no_request() {
    let (rate, capacity) = (50.0, 10.0);
    let redis = Arc::new(RedisServer::start());
    let p = FakeProvider::start().await;
    let toml = redis_toml(
        &redis,
        "redis",
        2,
        &provider("geo", &p.url(), rate, capacity),
    );
    let replicas = [Tollgate::start(&toml).await, Tollgate::start(&toml).await];
    let urls: Vec<String> = replicas.iter().map(|t| t.url("/geo/q")).collect();
    let swarm = swarm::Swarm::warm(&p, &urls, 20, rate, capacity).await;
    let flusher = {
        let redis = redis.clone();
        tokio::task::spawn_blocking(move || {
            for _ in 0..8 {
                std::thread::sleep(Duration::from_millis(250));
                redis.script_flush();
            }
        })
    };
    let run = swarm.run(Duration::from_secs(2)).await;
    flusher.await.expect("flusher");
    assert!(
        run.statuses.iter().all(|s| *s == 200),
        "a request failed: {:?}",
        run.statuses
            .iter()
            .filter(|s| **s != 200)
            .collect::<Vec<_>>()
    );
    assert!(run.report.holds(), "{:?}", run.report);
    for t in &replicas {
        assert!(
            store_errors(t).ends_with(" 0"),
            "NOSCRIPT surfaced as a store error: {}",
            store_errors(t)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_on_redis_are_released_at_n_over_rate() {
    let redis = RedisServer::start();
    crate::limiting::check_release_schedule(|p| {
        redis_toml(&redis, "redis", 1, &provider("geo", &p.url(), 20.0, 5.0))
    })
    .await;
}
