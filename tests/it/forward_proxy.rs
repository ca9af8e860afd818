//! Forward-proxy mode (workers with HTTP_PROXY) and the guards every way in shares.

use std::process::Command;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::support::client::{client, get, raw_first};
use crate::support::fake_provider::FakeProvider;
use crate::support::tollgate::{Tollgate, EPHEMERAL};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_with_a_proxy_is_gated_like_base_url_mode() {
    let p = FakeProvider::start().await;
    // The provider is reached as a named host (`hosts`) that resolves nowhere: tollgate routes by name
    // and dials the configured upstream, never the name the client gave.
    let toml = format!(
        "{EPHEMERAL}[providers.geo]\nupstream = \"{}\"\nrate = 2\ncapacity = 1\nhosts = [\"geo.internal.example\"]\n",
        p.url()
    );
    let t = Tollgate::start(&toml).await;
    let proxy = format!("http://{}", t.proxy);
    let started = tokio::time::Instant::now();
    let out = tokio::task::spawn_blocking(move || {
        (0..3)
            .map(|i| {
                Command::new("curl")
                    .args(["-s", "-i", "--max-time", "10", "-x", &proxy])
                    .arg(format!("http://geo.internal.example/search?q={i}"))
                    .output()
                    .expect("curl runs")
            })
            .collect::<Vec<_>>()
    })
    .await
    .expect("curl");
    for o in &out {
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(
            text.to_ascii_lowercase().contains("x-tollgate-bucket: geo"),
            "{text}"
        );
    }
    // Rate 2/s, capacity 1: the third request goes ~1 s after the first.
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "gated: {:?}",
        started.elapsed()
    );
    let targets: Vec<String> = p.arrivals().into_iter().map(|a| a.target).collect();
    assert_eq!(targets, ["/search?q=0", "/search?q=1", "/search?q=2"]);
    assert!(p
        .arrivals()
        .iter()
        .all(|a| a.headers["host"] == p.addr().to_string().as_str()));
}

#[tokio::test]
async fn an_unconfigured_host_is_refused_with_403_and_never_contacted() {
    let p = FakeProvider::start().await;
    // A listener standing in for an internal service: it must see no connection.
    let internal = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let internal_addr = internal.local_addr().expect("addr");
    let t = Tollgate::start(&format!(
        "{EPHEMERAL}[providers.geo]\nupstream = \"{}\"\nrate = 100\n",
        p.url()
    ))
    .await;
    for target in [
        format!("http://{internal_addr}/admin"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        "http://localhost/".to_string(),
        format!("http://{}:1/", p.addr().ip()),
    ] {
        let req = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        let answer = raw_first(t.proxy, req.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{target}: {answer}");
        assert!(answer.contains("host-not-allowed"), "{answer}");
    }
    let accepted = tokio::time::timeout(Duration::from_millis(200), internal.accept()).await;
    assert!(accepted.is_err(), "the internal listener was contacted");
    assert!(p.arrivals().is_empty());
}

#[tokio::test]
async fn a_configured_name_resolving_to_a_private_address_is_refused_unless_allowed() {
    let p = FakeProvider::start().await;
    let named = format!("http://localhost:{}", p.addr().port());
    let c = client();
    let strict = Tollgate::start(&format!(
        "{EPHEMERAL}[providers.strict]\nupstream = \"{named}\"\nrate = 100\n"
    ))
    .await;
    let a = get(&c, &strict.url("/strict/x"), &[]).await;
    assert_eq!(a.status, 502, "{:?}", a.body);
    assert!(
        p.arrivals().is_empty(),
        "nothing was sent to the private address"
    );
    let lenient = Tollgate::start(&format!(
        "{EPHEMERAL}[providers.lenient]\nupstream = \"{named}\"\nrate = 100\nallow_private = true\n"
    ))
    .await;
    let a = get(&c, &lenient.url("/lenient/x"), &[]).await;
    assert_eq!(a.status, 200);
    assert_eq!(p.arrivals().len(), 1);
}
