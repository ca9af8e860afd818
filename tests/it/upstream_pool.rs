//! Upstream connections: reused in turn, opened as concurrency needs, replaced when the upstream
//! closes them, and what goes on the wire.

use std::time::Duration;

use crate::support::client::{client, get, raw_all};
use crate::support::fake_provider::{Behaviour, FakeProvider};
use crate::support::raw_provider::{Mode, RawProvider};
use crate::support::tollgate::{provider, Tollgate, EPHEMERAL};

#[tokio::test]
async fn requests_in_turn_reuse_one_upstream_connection() {
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}",
        provider("geo", &p.url(), 1000.0, 100.0)
    ))
    .await;
    let c = client();
    for i in 0..30 {
        assert_eq!(
            get(&c, &t.url(&format!("/geo/q{i}")), &[]).await.status,
            200
        );
    }
    assert_eq!(p.arrivals().len(), 30);
    assert_eq!(p.connections(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_open_more_connections_then_reuse_them() {
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}",
        provider("geo", &p.url(), 1000.0, 100.0)
    ))
    .await;
    p.set(Behaviour::Slow(Duration::from_millis(500)));
    let c = client();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let (c, url) = (c.clone(), t.url(&format!("/geo/slow{i}")));
            tokio::spawn(async move { get(&c, &url, &[]).await.status })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.expect("request"), 200);
    }
    assert_eq!(p.connections(), 8, "all in flight at once");
    p.set(Behaviour::Ok);
    for i in 0..8 {
        assert_eq!(
            get(&c, &t.url(&format!("/geo/q{i}")), &[]).await.status,
            200
        );
    }
    assert_eq!(p.connections(), 8, "pooled connections reused");
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_replaced_transparently() {
    let p = RawProvider::start_with(Mode::IdleClose(Duration::from_millis(50))).await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}",
        provider("p", &p.url(), 1000.0, 100.0)
    ))
    .await;
    let c = client();
    for i in 0..3 {
        assert_eq!(get(&c, &t.url(&format!("/p/{i}")), &[]).await.status, 200);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(p.requests().len(), 3);
    assert_eq!(p.connections(), 3);
}

#[tokio::test]
async fn an_upstream_hanging_up_without_an_answer_is_a_502_and_not_retried() {
    let p = RawProvider::start_with(Mode::HangUp).await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}",
        provider("p", &p.url(), 1000.0, 100.0)
    ))
    .await;
    let a = get(&client(), &t.url("/p/x"), &[]).await;
    assert_eq!(a.status, 502);
    assert_eq!(a.json()["error"], "upstream-failed");
    assert_eq!(p.connections(), 1);
}

#[tokio::test]
async fn the_upstream_gets_origin_form_and_its_own_host_in_both_modes() {
    let p = RawProvider::start().await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}",
        provider("p", &p.url(), 1000.0, 100.0)
    ))
    .await;
    let authority = p.url().trim_start_matches("http://").to_string();
    let base = raw_all(
        t.proxy,
        b"GET /p/search?q=1 HTTP/1.1\r\nHost: tollgate\r\n\r\n",
    )
    .await;
    assert!(base.starts_with("HTTP/1.1 200"), "{base}");
    let absolute = raw_all(
        t.proxy,
        format!("GET http://{authority}/v1/search?q=2 HTTP/1.1\r\nHost: {authority}\r\n\r\n")
            .as_bytes(),
    )
    .await;
    assert!(absolute.starts_with("HTTP/1.1 200"), "{absolute}");
    let got: Vec<String> = p
        .requests()
        .iter()
        .map(|r| String::from_utf8_lossy(r).to_ascii_lowercase())
        .collect();
    assert_eq!(got.len(), 2);
    assert!(
        got[0].starts_with("get /search?q=1 http/1.1\r\n"),
        "{}",
        got[0]
    );
    assert!(
        got[1].starts_with("get /v1/search?q=2 http/1.1\r\n"),
        "{}",
        got[1]
    );
    for r in &got {
        assert_eq!(r.matches("\r\nhost: ").count(), 1, "{r}");
        assert!(r.contains(&format!("\r\nhost: {authority}\r\n")), "{r}");
    }
}

#[tokio::test]
async fn a_request_body_that_breaks_mid_way_is_the_clients_400() {
    let p = RawProvider::start().await;
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}{}",
        provider("p", &p.url(), 1000.0, 100.0)
    ))
    .await;
    let answer = raw_all(
        t.proxy,
        b"POST /p/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(p.requests().is_empty());
}
