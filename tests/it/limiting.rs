//! The limit, checked where it matters: at the provider, from its recorded arrival times.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::client::{client, get};
use crate::support::fake_provider::{FakeProvider, OwnLimit};
use crate::support::tollgate::{provider, Tollgate, EPHEMERAL};
use crate::support::window;

/// Delivery-jitter allowance: a request released on its slot may reach the provider this much later
/// than the one after it (scheduling on a loaded 2-core machine).
const JITTER: Duration = Duration::from_millis(10);

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
    let start = Instant::now();
    let stop_at = start + Duration::from_secs(3);
    let c = client();
    let url = Arc::new(t.url("/geo/search?q=x"));
    let mut clients = Vec::new();
    for _ in 0..20 {
        let (c, url) = (c.clone(), url.clone());
        clients.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            while Instant::now() < stop_at {
                statuses.push(get(&c, &url, &[]).await.status.as_u16());
            }
            statuses
        }));
    }
    let mut statuses = Vec::new();
    for task in clients {
        statuses.extend(task.await.expect("client"));
    }
    let times: Vec<Duration> = p.arrival_times().iter().map(|a| *a - start).collect();
    let report = window::check(&times, rate, capacity, JITTER);
    let last = times.iter().max().copied().unwrap_or_default();
    let allowed = capacity + rate * last.as_secs_f64();
    let utilisation = times.len() as f64 / allowed;
    eprintln!(
        "swarm: {} arrivals over {:.3}s; worst window {} in {:?} against bound {:.2} (excess {:.2}); utilisation {:.3}",
        times.len(),
        last.as_secs_f64(),
        report.worst_count,
        report.worst_len,
        report.worst_bound,
        report.max_excess,
        utilisation
    );
    assert!(report.holds(), "sliding-window bound broken: {report:?}");
    assert_eq!(p.breaches(), 0, "the provider's own limit saw breaches");
    assert!(
        statuses.iter().all(|s| *s == 200),
        "every client request succeeded"
    );
    assert!(last >= Duration::from_secs(3), "ran at least 3 s");
    assert!(utilisation >= 0.95, "utilisation {utilisation:.3} < 0.95");
}

/// After the bucket is drained, the n-th queued request goes at n/rate: reported and actual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_requests_are_released_at_n_over_rate() {
    let (rate, capacity, queued) = (20.0, 5.0, 20usize);
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}",
        provider("geo", &p.url(), rate, capacity)
    ))
    .await;
    let c = client();
    // Warm the connection pool so the queued requests are not also paying for connects.
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
        let actual = arrivals[capacity as usize + n - 1];
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
