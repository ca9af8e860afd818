//! Start-up and shutdown: held and in-flight requests drain; the binary exits 0 on SIGTERM.

use std::time::Duration;

use tokio::time::Instant;

use crate::support::client::{client, get};
use crate::support::fake_provider::{Behaviour, FakeProvider};
use crate::support::free_port;
use crate::support::tollgate::{provider, Tollgate, TollgateProcess, EPHEMERAL};

#[tokio::test]
async fn shutdown_drains_held_and_in_flight_requests_then_stops_listening() {
    let p = FakeProvider::start().await;
    let mut t = Tollgate::start(&format!(
        "{EPHEMERAL}shutdown_grace = \"5s\"\n{}",
        provider("geo", &p.url(), 2.0, 1.0)
    ))
    .await;
    let c = client();
    assert_eq!(get(&c, &t.url("/geo/a"), &[]).await.status, 200);
    // One request held ~0.5 s, one more held ~1 s.
    let held: Vec<_> = ["/geo/b", "/geo/c"]
        .iter()
        .map(|path| {
            let (c, url) = (c.clone(), t.url(path));
            tokio::spawn(async move { get(&c, &url, &[]).await.status })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let drained = t.begin_shutdown();
    for h in held {
        assert_eq!(
            h.await.expect("held request"),
            200,
            "held request finished during drain"
        );
    }
    tokio::time::timeout(Duration::from_secs(5), drained)
        .await
        .expect("drain finishes")
        .expect("run task");
    assert_eq!(p.arrivals().len(), 3);
    assert!(
        tokio::net::TcpStream::connect(t.proxy).await.is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn shutdown_gives_up_after_the_grace_period() {
    let p = FakeProvider::start().await;
    p.set(Behaviour::Slow(Duration::from_secs(5)));
    let mut t = Tollgate::start(&format!(
        "{EPHEMERAL}shutdown_grace = \"300ms\"\n{}",
        provider("geo", &p.url(), 10.0, 10.0)
    ))
    .await;
    let c = client();
    let url = t.url("/geo/slow");
    let _stuck = tokio::spawn(async move { get(&c, &url, &[]).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let began = Instant::now();
    tokio::time::timeout(Duration::from_secs(3), t.begin_shutdown())
        .await
        .expect("run returns after the grace")
        .expect("run task");
    assert!(began.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn the_binary_drains_on_sigterm_and_exits_0() {
    let p = FakeProvider::start().await;
    let mut proc = TollgateProcess::launch(
        "shutdown_grace = \"5s\"",
        &provider("geo", &p.url(), 2.0, 1.0),
    )
    .await;
    let c = client();
    let base = proc.proxy.clone();
    assert_eq!(get(&c, &format!("{base}/geo/a"), &[]).await.status, 200);
    let (c2, url) = (c.clone(), format!("{base}/geo/held"));
    let held = tokio::spawn(async move { get(&c2, &url, &[]).await.status });
    tokio::time::sleep(Duration::from_millis(150)).await;
    proc.terminate();
    assert_eq!(held.await.expect("held"), 200, "held request drained");
    let code = tokio::task::spawn_blocking(move || {
        let code = proc.wait_exit(Duration::from_secs(5));
        (code, proc.log_text())
    })
    .await
    .expect("wait");
    assert_eq!(code.0, Some(0), "log:\n{}", code.1);
    assert!(code.1.contains("shutting down"), "{}", code.1);
}

#[tokio::test]
async fn secrets_never_reach_logs_buckets_or_check_output() {
    let p = FakeProvider::start().await;
    p.set(Behaviour::TooMany("3"));
    let body = format!(
        "[store]\nurl = \"redis://app:s3cr3t-redis@127.0.0.1:1/0\"\n{}",
        provider("geo", &p.url(), 100.0, 10.0)
    );
    let mut proc = TollgateProcess::launch_with_env("", &body, &[("RUST_LOG", "trace")]).await;
    let c = client();
    let a = get(
        &c,
        &format!("{}/geo/search?q=x&api_key=s3cr3t-query", proc.proxy),
        &[
            ("authorization", "Bearer s3cr3t-header"),
            ("x-api-key", "s3cr3t-apikey"),
        ],
    )
    .await;
    assert_eq!(
        a.status, 429,
        "the provider's 429 passes back and is logged"
    );
    let buckets =
        String::from_utf8_lossy(&get(&c, &format!("{}/buckets", proc.admin), &[]).await.body)
            .to_string();
    let ready =
        String::from_utf8_lossy(&get(&c, &format!("{}/readyz", proc.admin), &[]).await.body)
            .to_string();
    proc.terminate();
    let _ = tokio::task::spawn_blocking(move || {
        proc.wait_exit(Duration::from_secs(5));
        proc
    })
    .await
    .map(|proc| {
        let log = proc.log_text();
        assert!(log.contains("429"), "the breach was logged: {log}");
        for text in [&log, &buckets, &ready] {
            for secret in [
                "s3cr3t-redis",
                "s3cr3t-query",
                "s3cr3t-header",
                "s3cr3t-apikey",
            ] {
                assert!(!text.contains(secret), "{secret} leaked into:\n{text}");
            }
        }
    });
    let cfg = std::env::temp_dir().join(format!("tollgate-secret-{}.toml", free_port()));
    std::fs::write(
        &cfg,
        format!(
            "[store]\nbackend = \"redis\"\nurl = \"redis://app:s3cr3t-redis@127.0.0.1:6379/0\"\n{}",
            provider("geo", &p.url(), 1.0, 1.0)
        ),
    )
    .expect("write");
    let out = std::process::Command::new(crate::support::tollgate::binary())
        .args(["check", "--config"])
        .arg(&cfg)
        .output()
        .expect("check");
    let _ = std::fs::remove_file(&cfg);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("redis://app:***@127.0.0.1:6379/0"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
}
