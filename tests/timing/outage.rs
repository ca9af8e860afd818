//! When Redis fails: degrade on purpose, loudly, and never breach. Real Redis, really killed or paused.

use std::time::Duration;

use tokio::time::Instant;

use crate::support::client::{client, get};
use crate::support::fake_provider::{FakeProvider, OwnLimit};
use crate::support::redis_server::RedisServer;
use crate::support::swarm::{self, JITTER};
use crate::support::tollgate::{provider, redis_sections, Tollgate, TollgateProcess, EPHEMERAL};

fn store(redis: &RedisServer, mode: &str, replicas: u32) -> String {
    redis_sections(&redis.url(), "100ms", "redis", mode, replicas)
}

async fn mode_of(admin: &str) -> String {
    let r = get(&client(), &format!("{admin}/readyz"), &[]).await.json();
    r["store"]["mode"].as_str().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_swarm_degrades_to_local_limits_without_a_breach_or_a_5xx() {
    let (rate, capacity) = (20.0, 10.0);
    let mut redis = RedisServer::start();
    let p = FakeProvider::start_with(Some(OwnLimit {
        rate,
        capacity,
        jitter: JITTER,
    }))
    .await;
    let body = format!(
        "{}{}",
        store(&redis, "local", 2),
        provider("geo", &p.url(), rate, capacity)
    );
    let replicas = [
        TollgateProcess::launch("", &body).await,
        TollgateProcess::launch("", &body).await,
    ];
    let urls: Vec<String> = replicas
        .iter()
        .map(|r| format!("{}/geo/search?q=x", r.proxy))
        .collect();
    let admins: Vec<String> = replicas.iter().map(|r| r.admin.clone()).collect();

    let swarm = swarm::Swarm::warm(&p, &urls, 20, rate, capacity).await;
    let outage = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        redis.stop();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        redis.restart();
        let back = Instant::now();
        // Recovery: until both replicas say they limit through Redis again.
        loop {
            let mut shared = true;
            for a in &admins {
                shared &= mode_of(a).await == "shared";
            }
            if shared || back.elapsed() > Duration::from_secs(5) {
                return (back.elapsed(), redis);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let run = swarm.run(Duration::from_secs(7)).await;
    let (recovery, _redis) = outage.await.expect("outage task");
    eprintln!("recovery: both replicas shared again {recovery:?} after Redis came back");
    for r in &replicas {
        for line in r
            .log_lines("store unreachable")
            .iter()
            .chain(&r.log_lines("store reachable again"))
        {
            eprintln!("transition: {line}");
        }
    }
    assert_eq!(run.server_errors(), 0, "no 5xx from tollgate in local mode");
    assert_eq!(
        p.arrivals().len(),
        run.warm_up + run.requests(),
        "every request reached the provider exactly once"
    );
    assert!(
        run.report.holds(),
        "bound broken across the outage: {:?}",
        run.report
    );
    assert_eq!(p.breaches(), 0);
    for r in &replicas {
        assert_eq!(
            r.log_lines("store unreachable").len(),
            1,
            "one down transition:\n{}",
            r.log_text()
        );
        assert_eq!(
            r.log_lines("store reachable again").len(),
            1,
            "one up transition:\n{}",
            r.log_text()
        );
        assert!(r.log_lines("store unreachable")[0].contains("\"level\":\"WARN\""));
    }
    assert!(
        recovery <= Duration::from_secs(1),
        "recovered in {recovery:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_costs_at_most_one_timeout_then_the_fallback_answers() {
    let redis = RedisServer::start();
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}{}",
        store(&redis, "local", 1),
        provider("geo", &p.url(), 1000.0, 1000.0)
    ))
    .await;
    let c = client();
    assert_eq!(get(&c, &t.url("/geo/warm"), &[]).await.status, 200);
    redis.pause(Duration::from_millis(1500));
    let mut latencies = Vec::new();
    for i in 0..20 {
        let asked = Instant::now();
        let a = get(&c, &t.url(&format!("/geo/{i}")), &[]).await;
        assert_eq!(a.status, 200);
        latencies.push(asked.elapsed());
    }
    assert_eq!(mode_of(&t.admin_url("")).await, "fallback-local");
    let slowest = latencies.iter().max().copied().unwrap_or_default();
    let slow = latencies
        .iter()
        .filter(|l| **l > Duration::from_millis(50))
        .count();
    eprintln!("paused redis: slowest request {slowest:?}, {slow} of 20 over 50 ms");
    assert!(
        slowest <= Duration::from_millis(100 + 150),
        "one store timeout at most: {slowest:?}"
    );
    assert!(
        slow <= 1,
        "only the request that found Redis slow paid the timeout"
    );
    // Once the pause ends the probe brings it back.
    let deadline = Instant::now() + Duration::from_secs(4);
    while mode_of(&t.admin_url("")).await != "shared" {
        assert!(Instant::now() < deadline, "did not switch back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_starts_with_redis_down_serves_in_fallback_and_switches_when_it_comes_up() {
    let mut redis = RedisServer::start();
    redis.stop();
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}{}",
        store(&redis, "local", 2),
        provider("geo", &p.url(), 100.0, 10.0)
    ))
    .await;
    let c = client();
    assert_eq!(get(&c, &t.url("/geo/a"), &[]).await.status, 200);
    let ready = get(&c, &t.admin_url("/readyz"), &[]).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["store"]["reachable"], false);
    assert_eq!(ready.json()["store"]["mode"], "fallback-local");
    let buckets = get(&c, &t.admin_url("/buckets"), &[]).await.json();
    assert_eq!(buckets["buckets"][0]["store_mode"], "fallback-local");
    assert!(t
        .metrics
        .encode()
        .contains("tollgate_store_fallback_active{bucket=\"geo\"} 1"));
    redis.restart();
    let back = Instant::now();
    while mode_of(&t.admin_url("")).await != "shared" {
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "did not switch to Redis"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(get(&c, &t.url("/geo/b"), &[]).await.status, 200);
    assert_eq!(
        redis.command(&["EXISTS", "tollgate:{geo}"]),
        "1",
        "the request went through Redis"
    );
    assert!(t
        .metrics
        .encode()
        .contains("tollgate_store_fallback_active{bucket=\"geo\"} 0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_answers_503_with_retry_after_while_redis_is_down() {
    let mut redis = RedisServer::start();
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}{}",
        store(&redis, "closed", 1),
        provider("geo", &p.url(), 100.0, 10.0)
    ))
    .await;
    redis.stop();
    let a = get(&client(), &t.url("/geo/a"), &[]).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.header("retry-after"), "1");
    assert_eq!(a.json()["error"], "store-unavailable");
    assert!(p.arrivals().is_empty());
    assert!(t
        .metrics
        .encode()
        .contains("tollgate_requests_total{bucket=\"geo\",outcome=\"unavailable\"} 1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_forwards_everything_and_says_so_at_error() {
    let mut redis = RedisServer::start();
    let p = FakeProvider::start().await;
    let body = format!(
        "{}{}",
        store(&redis, "open", 1),
        provider("geo", &p.url(), 1.0, 1.0)
    );
    let proc = TollgateProcess::launch("", &body).await;
    redis.stop();
    let c = client();
    let started = Instant::now();
    for i in 0..10 {
        assert_eq!(
            get(&c, &format!("{}/geo/{i}", proc.proxy), &[])
                .await
                .status,
            200
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no limit while open"
    );
    assert_eq!(p.arrivals().len(), 10);
    let lines = proc.log_lines("WITHOUT ANY LIMIT");
    assert_eq!(lines.len(), 1, "{}", proc.log_text());
    assert!(lines[0].contains("\"level\":\"ERROR\""), "{}", lines[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_loses_its_data_mid_run_does_not_lose_the_queue() {
    // FLUSHALL stands in for a restart without persistence that no request noticed: every bucket
    // comes back full while slots handed out before are still being released.
    let (rate, capacity) = (20.0, 10.0);
    let redis = std::sync::Arc::new(RedisServer::start());
    let p = FakeProvider::start_with(Some(OwnLimit {
        rate,
        capacity,
        jitter: JITTER,
    }))
    .await;
    let toml = format!(
        "{EPHEMERAL}{}{}",
        store(&redis, "local", 2),
        provider("geo", &p.url(), rate, capacity)
    );
    let replicas = [Tollgate::start(&toml).await, Tollgate::start(&toml).await];
    let urls: Vec<String> = replicas.iter().map(|t| t.url("/geo/q")).collect();
    let swarm = swarm::Swarm::warm(&p, &urls, 20, rate, capacity).await;
    let flusher = {
        let redis = redis.clone();
        tokio::task::spawn_blocking(move || {
            std::thread::sleep(Duration::from_millis(1500));
            assert_eq!(redis.command(&["FLUSHALL"]), "OK");
        })
    };
    let run = swarm.run(Duration::from_secs(4)).await;
    flusher.await.expect("flusher");
    assert_eq!(run.server_errors(), 0);
    assert!(
        run.report.holds(),
        "the flushed bucket re-issued queued slots: {:?}",
        run.report
    );
    assert_eq!(p.breaches(), 0);
}
