//! The limit, checked where it matters: at the provider, from its recorded arrival times.

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::client::{client, get};
use crate::support::fake_provider::{FakeProvider, OwnLimit};
use crate::support::swarm::{self, JITTER};
use crate::support::tollgate::{provider, Tollgate, EPHEMERAL};

/// 20 concurrent clients through one tollgate at 20/s with capacity 10 for 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_swarm_never_exceeds_capacity_plus_rate_times_t_at_the_provider() {
    let (rate, capacity) = (20.0, 10.0);
    let p = FakeProvider::start_with(Some(OwnLimit {
        rate,
        capacity,
        jitter: JITTER,
    }))
    .await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}",
        provider("geo", &p.url(), rate, capacity)
    ))
    .await;
    let run = swarm::run(
        &p,
        &[t.url("/geo/search?q=x")],
        20,
        Duration::from_secs(3),
        rate,
        capacity,
    )
    .await;
    assert!(
        run.report.holds(),
        "sliding-window bound broken: {:?}",
        run.report
    );
    assert_eq!(p.breaches(), 0, "the provider's own limit saw breaches");
    assert!(
        run.statuses.iter().all(|s| *s == 200),
        "every client request succeeded"
    );
    assert!(run.span >= Duration::from_secs(3), "ran at least 3 s");
    assert!(
        run.utilisation >= 0.95,
        "utilisation {:.3} < 0.95",
        run.utilisation
    );
}

/// After the bucket is drained, the n-th queued request goes at n/rate: reported and actual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_are_released_at_n_over_rate() {
    check_release_schedule(|p| format!("{EPHEMERAL}{}", provider("geo", &p.url(), 20.0, 5.0)))
        .await;
}

/// The wait check for any store: `toml` gets the provider and must configure bucket `geo` at 20/s,
/// capacity 5.
pub async fn check_release_schedule(toml: impl Fn(&FakeProvider) -> String) {
    let (rate, capacity, queued) = (20.0, 5.0, 20usize);
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&toml(&p)).await;
    let c = client();
    // Warm the connection pools so the queued requests are not also paying for connects.
    let _warm: Vec<_> = futures_join(&c, &t.url("/geo/warm"), capacity as usize).await;
    tokio::time::sleep(Duration::from_secs_f64(capacity / rate + 0.1)).await;
    let before = p.arrivals().len();

    let start = Instant::now();
    let answers = futures_join(&c, &t.url("/geo/q"), capacity as usize + queued).await;
    let mut arrivals: Vec<Duration> = p.arrival_times()[before..]
        .iter()
        .map(|a| *a - start)
        .collect();
    arrivals.sort();
    let mut reported: Vec<u64> = answers
        .iter()
        .map(|a| {
            a.header("x-tollgate-wait-ms")
                .parse::<u64>()
                .expect("wait header")
        })
        .collect();
    reported.sort();
    let mut worst_actual = Duration::ZERO;
    let mut worst_reported = 0.0f64;
    for n in 1..=queued {
        let expected = Duration::from_secs_f64(n as f64 / rate);
        // Measured at the provider from the moment the bucket was drained (the last burst arrival), so
        // the constant path latency (client → tollgate → provider) cancels out.
        let actual =
            arrivals[capacity as usize + n - 1].saturating_sub(arrivals[capacity as usize - 1]);
        worst_actual = worst_actual.max(actual.abs_diff(expected));
        let rep = reported[capacity as usize + n - 1] as f64;
        worst_reported = worst_reported.max((rep - expected.as_secs_f64() * 1000.0).abs());
    }
    eprintln!("wait: worst actual release error {worst_actual:?}, worst reported error {worst_reported:.1} ms");
    assert!(
        worst_actual <= Duration::from_millis(10),
        "actual error {worst_actual:?}"
    );
    assert!(worst_reported <= 10.0, "reported error {worst_reported} ms");
}

async fn futures_join(
    c: &crate::support::client::TestClient,
    url: &str,
    n: usize,
) -> Vec<crate::support::client::Answer> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (c, url) = (c.clone(), url.to_string());
            tokio::spawn(async move { get(&c, &url, &[]).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("request"));
    }
    out
}

#[tokio::test]
async fn a_slot_past_max_wait_is_refused_at_once_with_retry_after() {
    let p = FakeProvider::start().await;
    let toml = format!(
        "{EPHEMERAL}max_wait = \"1500ms\"\n{}",
        provider("geo", &p.url(), 1.0, 1.0)
    );
    let t = Tollgate::start(&toml).await;
    let c = client();
    assert_eq!(get(&c, &t.url("/geo/a"), &[]).await.status, 200);
    // The next slot is ~1 s away: over the client's 200 ms.
    let asked = Instant::now();
    let a = get(&c, &t.url("/geo/b"), &[("x-tollgate-max-wait", "200ms")]).await;
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "refused at once"
    );
    assert_eq!(a.status, 429);
    assert_eq!(a.header("x-tollgate-reason"), "max-wait");
    assert_eq!(a.header("retry-after"), "1");
    assert_eq!(a.json()["error"], "max-wait");
    // Nothing was taken: the next request still gets the ~1 s slot, not 2 s.
    let a = get(&c, &t.url("/geo/c"), &[]).await;
    assert_eq!(a.status, 200);
    let waited: u64 = a.header("x-tollgate-wait-ms").parse().expect("wait");
    assert!((700..=1300).contains(&waited), "waited {waited} ms");
    // The server's max_wait caps the client's: two queued at 1/s → 2 s > 1.5 s.
    let a = get(&c, &t.url("/geo/d"), &[("x-tollgate-max-wait", "60s")]).await;
    let b = get(&c, &t.url("/geo/e"), &[("x-tollgate-max-wait", "60s")]).await;
    assert_eq!(a.status, 200, "1 s slot fits 1.5 s");
    let _ = b;
    assert_eq!(p.arrivals().len(), 3 + usize::from(b.status == 200));
    let text =
        String::from_utf8_lossy(&get(&c, &t.admin_url("/metrics"), &[]).await.body).to_string();
    assert!(
        text.contains("tollgate_requests_total{bucket=\"geo\",outcome=\"max_wait\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_client_that_disconnects_while_held_gives_its_slot_back() {
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}",
        provider("geo", &p.url(), 1.0, 1.0)
    ))
    .await;
    let c = client();
    assert_eq!(get(&c, &t.url("/geo/first"), &[]).await.status, 200);
    // Held for ~1 s; hang up after 200 ms.
    let mut s = TcpStream::connect(t.proxy).await.expect("connect");
    s.write_all(b"GET /geo/abandoned HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(s);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The freed slot (~0.7 s away) goes to the next caller instead of ~1.7 s.
    let a = get(&c, &t.url("/geo/next"), &[]).await;
    assert_eq!(a.status, 200);
    let waited: u64 = a.header("x-tollgate-wait-ms").parse().expect("wait");
    assert!(waited < 1200, "slot was not given back: waited {waited} ms");
    let targets: Vec<String> = p.arrivals().into_iter().map(|a| a.target).collect();
    assert_eq!(
        targets,
        ["/first", "/next"],
        "the abandoned request never went upstream"
    );
    let text =
        String::from_utf8_lossy(&get(&c, &t.admin_url("/metrics"), &[]).await.body).to_string();
    assert!(
        text.contains("tollgate_requests_total{bucket=\"geo\",outcome=\"cancelled\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_held_requests{bucket=\"geo\"} 0"),
        "{text}"
    );
}
