//! Start-up and shutdown: held and in-flight requests drain; the binary exits 0 on SIGTERM.

use std::time::Duration;

use tokio::time::Instant;

use crate::support::client::{client, get};
use crate::support::fake_provider::{Behaviour, FakeProvider};
use crate::support::tollgate::{free_port, provider, Tollgate, TollgateProcess, EPHEMERAL};

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
    let (port, admin) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("tollgate-sigterm-{port}"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cfg = dir.join("tollgate.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\nshutdown_grace = \"5s\"\n{}",
            provider("geo", &p.url(), 2.0, 1.0)
        ),
    )
    .expect("write config");
    let mut proc = TollgateProcess::start(&cfg, dir.join("stderr.log"));
    let c = client();
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", admin))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "tollgate did not start: {}",
            proc.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    let _ = std::fs::remove_dir_all(&dir);
}
