//! What reaches the provider and what comes back: paths, headers, bodies, errors, admin endpoints.

use std::time::Duration;

use http_body_util::BodyExt;
use hyper::Method;

use crate::support::client::{client, get, raw_first, send};
use crate::support::fake_provider::{Behaviour, FakeProvider};
use crate::support::free_port;
use crate::support::tollgate::{provider, Tollgate, EPHEMERAL};

async fn setup() -> (FakeProvider, Tollgate) {
    let p = FakeProvider::start().await;
    let toml = format!(
        "{EPHEMERAL}upstream_timeout = \"300ms\"\n{}\n[providers.geo]\nupstream = \"{}/api/\"\n[providers.geo.regions.eu]\nrate = 1000\n",
        provider("nominatim", &p.url(), 1000.0, 100.0),
        p.url()
    );
    let t = Tollgate::start(&toml).await;
    (p, t)
}

#[tokio::test]
async fn path_and_query_are_forwarded_byte_for_byte_with_the_upstream_host() {
    let (p, t) = setup().await;
    let c = client();
    let a = get(
        &c,
        &t.url("/nominatim/search/a%2Fb?q=S%C3%A3o+Paulo&format=json&x=%20"),
        &[
            ("x-tollgate-region", "ignored-here-no-regions"),
            ("authorization", "Bearer k"),
        ],
    )
    .await;
    // An unknown region header for a provider without regions is a 404, so retry without it.
    assert_eq!(a.status, 404, "{:?}", a.body);
    let a = get(
        &c,
        &t.url("/nominatim/search/a%2Fb?q=S%C3%A3o+Paulo&format=json&x=%20"),
        &[
            ("x-tollgate-max-wait", "5s"),
            ("x-tollgate-cost", "1"),
            ("authorization", "Bearer k"),
        ],
    )
    .await;
    assert_eq!(a.status, 200);
    let got = p.arrivals();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].target,
        "/search/a%2Fb?q=S%C3%A3o+Paulo&format=json&x=%20"
    );
    assert_eq!(got[0].headers["host"], p.addr().to_string().as_str());
    assert_eq!(got[0].headers["authorization"], "Bearer k");
    assert!(
        got[0]
            .headers
            .keys()
            .all(|k| !k.as_str().starts_with("x-tollgate-")),
        "X-Tollgate-* must not be forwarded: {:?}",
        got[0].headers
    );
    // The answer comes back unchanged plus tollgate's headers.
    assert_eq!(a.header("x-provider"), "fake");
    assert_eq!(a.header("x-tollgate-bucket"), "nominatim");
    assert!(a.header("x-tollgate-wait-ms").parse::<u64>().is_ok());
    assert!(a.json()[0]["display_name"]
        .as_str()
        .is_some_and(|s| s.contains("London")));
}

#[tokio::test]
async fn regions_route_by_path_or_header_onto_the_base_path() {
    let (p, t) = setup().await;
    let c = client();
    assert_eq!(get(&c, &t.url("/geo/eu/v1/x?y=1"), &[]).await.status, 200);
    let a = get(&c, &t.url("/geo/v1/z"), &[("X-Tollgate-Region", "eu")]).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.header("x-tollgate-bucket"), "geo:eu");
    let targets: Vec<String> = p.arrivals().into_iter().map(|a| a.target).collect();
    assert_eq!(targets, ["/api/v1/x?y=1", "/api/v1/z"]);
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_both_ways() {
    let (p, t) = setup().await;
    let head = raw_first(
        t.proxy,
        b"GET /nominatim/x HTTP/1.1\r\nHost: tollgate\r\nConnection: keep-alive, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: 5\r\nTE: trailers\r\nProxy-Authorization: Basic abc\r\nX-End: kept\r\n\r\n",
    )
    .await
    .to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        !head.contains("keep-alive: timeout=5"),
        "provider's Keep-Alive passed back: {head}"
    );
    let got = &p.arrivals()[0];
    for h in ["x-hop", "keep-alive", "te", "proxy-authorization"] {
        assert!(
            !got.headers.contains_key(h),
            "{h} forwarded: {:?}",
            got.headers
        );
    }
    assert_eq!(got.headers["x-end"], "kept");
}

#[tokio::test]
async fn request_bodies_reach_the_provider_intact() {
    let (p, t) = setup().await;
    let c = client();
    let body = "{\"q\":\"Straße 1, Zürich\"}".repeat(500);
    let a = send(
        &c,
        Method::POST,
        &t.url("/nominatim/batch"),
        &[("content-type", "application/json")],
        &body,
    )
    .await;
    assert_eq!(a.status, 200);
    // And chunked, over raw TCP.
    let answer = raw_first(t.proxy, b"POST /nominatim/chunked HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let got = p.arrivals();
    assert_eq!(got[0].method, "POST");
    assert_eq!(got[0].body, body.as_bytes());
    assert_eq!(got[1].body, "hello world".as_bytes());
}

#[tokio::test]
async fn response_bodies_stream_through_without_being_buffered() {
    let (p, t) = setup().await;
    let c = client();
    let req = hyper::Request::get(t.url("/nominatim/stream"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = c.request(req).await.expect("response");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    // The provider sends its last chunk only after we have read the first through the proxy:
    // a proxy that buffered whole bodies would never deliver it.
    let first = tokio::time::timeout(Duration::from_secs(3), body.frame())
        .await
        .expect("first chunk arrives before the body is complete")
        .expect("frame")
        .expect("ok");
    assert_eq!(first.into_data().expect("data"), "first;");
    p.release_stream();
    let rest = body.collect().await.expect("rest").to_bytes();
    assert_eq!(rest, "last");
}

#[tokio::test]
async fn an_upstream_429_passes_back_unchanged_and_is_counted() {
    let (p, t) = setup().await;
    p.set(Behaviour::TooMany("7"));
    let c = client();
    let a = get(&c, &t.url("/nominatim/search?q=x"), &[]).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.header("retry-after"), "7");
    assert_eq!(a.header("x-provider"), "fake");
    assert_eq!(a.header("x-tollgate-bucket"), "nominatim");
    assert_eq!(a.json()["error"], "slow down");
    let metrics = get(&c, &t.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("tollgate_upstream_429_total{bucket=\"nominatim\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_upstream_responses_total{bucket=\"nominatim\",code=\"429\"} 1"),
        "{text}"
    );
    let buckets = get(&c, &t.admin_url("/buckets"), &[]).await.json();
    let nominatim = buckets["buckets"]
        .as_array()
        .expect("list")
        .iter()
        .find(|b| b["name"] == "nominatim")
        .expect("bucket")
        .clone();
    assert_eq!(nominatim["upstream_429"], 1);
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_with_a_json_reason() {
    let port = free_port();
    let toml = format!(
        "{EPHEMERAL}{}",
        provider("down", &format!("http://127.0.0.1:{port}"), 10.0, 10.0)
    );
    let t = Tollgate::start(&toml).await;
    let a = get(&client(), &t.url("/down/x"), &[]).await;
    assert_eq!(a.status, 502);
    assert_eq!(a.json()["error"], "upstream-connect");
    assert!(
        !a.json()["message"]
            .as_str()
            .unwrap_or("")
            .contains("127.0.0.1"),
        "no internals in 5xx"
    );
    let text = String::from_utf8_lossy(&get(&client(), &t.admin_url("/metrics"), &[]).await.body)
        .to_string();
    assert!(
        text.contains("tollgate_requests_total{bucket=\"down\",outcome=\"upstream_error\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_slow_upstream_is_a_504_after_the_response_timeout() {
    let (p, t) = setup().await;
    p.set(Behaviour::Slow(Duration::from_secs(2)));
    let a = get(&client(), &t.url("/nominatim/slow"), &[]).await;
    assert_eq!(a.status, 504);
    assert_eq!(a.json()["error"], "upstream-timeout");
}

#[tokio::test]
async fn unknown_provider_or_region_is_a_404_naming_what_is_configured() {
    let (p, t) = setup().await;
    let c = client();
    let a = get(&c, &t.url("/mapbox/x"), &[]).await;
    assert_eq!(a.status, 404);
    assert_eq!(a.json()["error"], "unknown-route");
    assert!(a.json()["message"]
        .as_str()
        .unwrap_or("")
        .contains("geo, nominatim"));
    let a = get(&c, &t.url("/geo/x"), &[("x-tollgate-region", "mars")]).await;
    assert_eq!(a.status, 404);
    assert!(a.json()["message"].as_str().unwrap_or("").contains("eu"));
    let a = get(&c, &t.url("/geo/x"), &[]).await;
    assert_eq!(a.status, 404, "geo has no provider-level bucket");
    assert!(p.arrivals().is_empty(), "nothing reached the provider");
}

#[tokio::test]
async fn bad_tollgate_headers_are_a_400() {
    let (p, t) = setup().await;
    let c = client();
    assert_eq!(
        get(&c, &t.url("/nominatim/x"), &[("x-tollgate-cost", "-3")])
            .await
            .status,
        400
    );
    assert_eq!(
        get(
            &c,
            &t.url("/nominatim/x"),
            &[("x-tollgate-max-wait", "later")]
        )
        .await
        .status,
        400
    );
    let a = get(&c, &t.url("/nominatim/x"), &[("x-tollgate-cost", "500")]).await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"], "cost-over-capacity");
    assert!(p.arrivals().is_empty());
}

#[tokio::test]
async fn connect_and_upgrade_are_refused_with_405() {
    let (p, t) = setup().await;
    for raw in [
        &b"CONNECT api.example:443 HTTP/1.1\r\nHost: api.example:443\r\n\r\n"[..],
        &b"GET /nominatim/ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"[..],
    ] {
        let text = raw_first(t.proxy, raw).await;
        assert!(text.starts_with("HTTP/1.1 405"), "{text}");
        assert!(text.contains("method-not-allowed"), "{text}");
    }
    assert!(p.arrivals().is_empty());
}

#[tokio::test]
async fn admin_endpoints_report_health_readiness_metrics_and_buckets() {
    let (_p, t) = setup().await;
    let c = client();
    assert_eq!(get(&c, &t.admin_url("/healthz"), &[]).await.status, 200);
    let ready = get(&c, &t.admin_url("/readyz"), &[]).await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["store"]["backend"], "memory");
    assert_eq!(ready.json()["store"]["reachable"], true);
    let metrics = get(&c, &t.admin_url("/metrics"), &[]).await;
    let text = String::from_utf8_lossy(&metrics.body);
    for name in [
        "tollgate_requests_total",
        "tollgate_wait_seconds",
        "tollgate_upstream_429_total",
        "tollgate_held_requests",
        "tollgate_store_fallback_active",
        "tollgate_store_errors_total",
        "tollgate_store_seconds",
    ] {
        assert!(text.contains(name), "{name} missing");
    }
    let b = get(&c, &t.admin_url("/buckets"), &[]).await.json();
    let list = b["buckets"].as_array().expect("list");
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["key"], "tollgate:{geo:eu}");
    assert_eq!(list[0]["rate"], 1000.0);
    assert_eq!(list[0]["tokens"], 3000.0);
    assert_eq!(get(&c, &t.admin_url("/nope"), &[]).await.status, 404);
}

#[tokio::test]
async fn redirects_pass_back_and_are_never_followed() {
    let (p, t) = setup().await;
    p.set(Behaviour::Redirect(
        "http://169.254.169.254/latest/meta-data/",
    ));
    let a = get(&client(), &t.url("/nominatim/moved"), &[]).await;
    assert_eq!(a.status, 302);
    assert_eq!(
        a.header("location"),
        "http://169.254.169.254/latest/meta-data/"
    );
    assert_eq!(
        p.arrivals().len(),
        1,
        "one request upstream, nothing followed"
    );
}
