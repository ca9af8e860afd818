//! The pool over in-memory pipes: the test plays the upstream on the server end of each connection, so
//! it decides exactly when a connection answers, stalls or closes.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;

use super::*;

/// A connector handing out in-memory pipes; the test receives the server end of each.
#[derive(Clone)]
struct Pipes(mpsc::UnboundedSender<DuplexStream>);

impl tower_service::Service<Uri> for Pipes {
    type Response = TokioIo<DuplexStream>;
    type Error = io::Error;
    type Future = std::future::Ready<io::Result<TokioIo<DuplexStream>>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let (client, server) = duplex(64 * 1024);
        let sent = self
            .0
            .send(server)
            .map_err(|_| io::Error::other("test ended"));
        std::future::ready(sent.map(|()| TokioIo::new(client)))
    }
}

type TestPool = Pool<Pipes, Empty<Bytes>>;

const LIMITS: PoolLimits = PoolLimits {
    max_idle: 256,
    idle_timeout: Duration::from_secs(90),
};

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

fn pool(limits: PoolLimits) -> (TestPool, mpsc::UnboundedReceiver<DuplexStream>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Pool::new(Pipes(tx), limits), rx)
}

fn get(path: &str) -> Request<Empty<Bytes>> {
    Request::get(format!("http://upstream.test{path}"))
        .body(Empty::new())
        .expect("request")
}

fn origin() -> Uri {
    Uri::from_static("http://upstream.test")
}

/// One request head from the server end ("" once the client has closed).
async fn read_head(s: &mut DuplexStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Takes the next connection, answers one request with `OK` and returns the request head and the pipe.
async fn answer_one(rx: &mut mpsc::UnboundedReceiver<DuplexStream>) -> (String, DuplexStream) {
    let mut s = rx.recv().await.expect("a connection");
    let head = read_head(&mut s).await;
    s.write_all(OK).await.expect("answer");
    (head, s)
}

/// Sends a request to `path` while answering it on the next new connection. A deadline turns a
/// connection that never comes into a failure instead of a hang.
async fn on_new_connection(
    pool: &TestPool,
    path: &str,
    rx: &mut mpsc::UnboundedReceiver<DuplexStream>,
) -> (
    Result<Response<Incoming>, SendError>,
    (String, DuplexStream),
) {
    within(async { tokio::join!(pool.send(get(path)), answer_one(rx)) }).await
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .expect("done within 5 s")
}

/// Answers every request on every connection with `OK`; counts the connections.
fn serve_all(mut rx: mpsc::UnboundedReceiver<DuplexStream>) -> Arc<AtomicUsize> {
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        while let Some(s) = rx.recv().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(s));
        }
    });
    connections
}

async fn serve(mut s: DuplexStream) {
    while !read_head(&mut s).await.is_empty() {
        if s.write_all(OK).await.is_err() {
            return;
        }
    }
}

async fn body(resp: Result<Response<Incoming>, SendError>) -> Bytes {
    let resp = resp.expect("a response");
    resp.into_body().collect().await.expect("body").to_bytes()
}

/// Lets connection tasks catch up (a finished exchange makes its sender ready again).
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn requests_in_turn_share_one_connection_in_origin_form() {
    let (pool, mut rx) = pool(LIMITS);
    let (resp, (head, s)) = on_new_connection(&pool, "/a?b=1", &mut rx).await;
    assert_eq!(body(resp).await, "ok");
    assert!(head.starts_with("GET /a?b=1 HTTP/1.1\r\n"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\nhost: upstream.test\r\n"),
        "{head}"
    );
    tokio::spawn(serve(s));
    for i in 0..20 {
        settle().await;
        assert_eq!(body(pool.send(get(&format!("/{i}"))).await).await, "ok");
    }
    assert!(rx.try_recv().is_err(), "one connection for all requests");
    assert_eq!(pool.pooled(&origin()), 1);
}

#[tokio::test]
async fn a_request_never_written_on_a_stale_connection_is_retried_on_a_new_one() {
    let (pool, mut rx) = pool(LIMITS);
    let (resp, (_, mut first)) = on_new_connection(&pool, "/a", &mut rx).await;
    assert_eq!(body(resp).await, "ok");
    settle().await;
    // The upstream closes the idle connection; its task has not run since, so the pool still thinks
    // the connection ready and picks it.
    first.shutdown().await.expect("close");
    let (resp, (head, _second)) = on_new_connection(&pool, "/b", &mut rx).await;
    assert_eq!(body(resp).await, "ok");
    assert!(head.starts_with("GET /b HTTP/1.1\r\n"), "{head}");
    let mut stale = Vec::new();
    within(first.read_to_end(&mut stale)).await.expect("read");
    assert!(
        stale.is_empty(),
        "the request went out on the stale connection too: {}",
        String::from_utf8_lossy(&stale)
    );
    assert!(rx.try_recv().is_err(), "exactly one new connection");
}

#[tokio::test]
async fn a_request_that_may_have_been_written_is_not_retried() {
    let (pool, mut rx) = pool(LIMITS);
    let (resp, (_, mut first)) = on_new_connection(&pool, "/a", &mut rx).await;
    assert_eq!(body(resp).await, "ok");
    settle().await;
    // The upstream reads the next request, then hangs up without answering.
    let (resp, head) = within(async {
        tokio::join!(pool.send(get("/b")), async {
            let head = read_head(&mut first).await;
            drop(first);
            head
        })
    })
    .await;
    assert!(head.starts_with("GET /b"), "{head}");
    match resp {
        Err(SendError::Request(e)) => assert!(!e.is_user(), "{e}"),
        other => panic!("expected a failed exchange, got {other:?}"),
    }
    assert!(rx.try_recv().is_err(), "no second attempt");
}

#[tokio::test]
async fn a_connection_still_streaming_a_body_stays_pooled_and_is_reused_once_read() {
    let (pool, mut rx) = pool(LIMITS);
    let (resp, mut first) = within(async {
        tokio::join!(pool.send(get("/slow")), async {
            let mut s = rx.recv().await.expect("a connection");
            read_head(&mut s).await;
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nab")
                .await
                .expect("answer");
            s
        })
    })
    .await;
    let mut slow = resp.expect("a response").into_body();
    settle().await;
    assert_eq!(pool.pooled(&origin()), 1, "busy, not dropped");
    // Meanwhile another request needs a connection of its own.
    let (resp, (_, second)) = on_new_connection(&pool, "/b", &mut rx).await;
    assert_eq!(body(resp).await, "ok");
    assert_eq!(pool.pooled(&origin()), 2);
    // The first body ends; both connections are then ready for more.
    first.write_all(b"cd").await.expect("rest");
    let mut got = Vec::new();
    while let Some(frame) = slow.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            got.extend_from_slice(&data);
        }
    }
    assert_eq!(got, b"abcd");
    tokio::spawn(serve(first));
    tokio::spawn(serve(second));
    for path in ["/c", "/d", "/e"] {
        settle().await;
        assert_eq!(body(pool.send(get(path)).await).await, "ok");
    }
    assert!(rx.try_recv().is_err(), "no third connection");
    assert_eq!(pool.pooled(&origin()), 2);
}

#[tokio::test]
async fn concurrent_requests_open_connections_and_the_pool_keeps_at_most_its_cap() {
    let (pool, rx) = pool(PoolLimits {
        max_idle: 2,
        idle_timeout: Duration::from_secs(90),
    });
    let connections = serve_all(rx);
    // Polled together on this task: each checks out before any answer comes back.
    let answers = tokio::join!(
        pool.send(get("/0")),
        pool.send(get("/1")),
        pool.send(get("/2")),
        pool.send(get("/3")),
        pool.send(get("/4")),
    );
    let (a, b, c, d, e) = answers;
    for resp in [a, b, c, d, e] {
        assert_eq!(body(resp).await, "ok");
    }
    assert_eq!(connections.load(Ordering::SeqCst), 5);
    assert_eq!(pool.pooled(&origin()), 2);
}

#[tokio::test(start_paused = true)]
async fn idle_connections_expire_at_checkout_and_in_the_sweep() {
    let (pool, rx) = pool(LIMITS);
    let connections = serve_all(rx);
    assert_eq!(body(pool.send(get("/a")).await).await, "ok");
    settle().await;
    tokio::time::advance(Duration::from_secs(89)).await;
    assert_eq!(body(pool.send(get("/b")).await).await, "ok");
    assert_eq!(connections.load(Ordering::SeqCst), 1, "reused within 90 s");
    settle().await;
    tokio::time::advance(Duration::from_secs(91)).await;
    assert_eq!(body(pool.send(get("/c")).await).await, "ok");
    assert_eq!(connections.load(Ordering::SeqCst), 2, "expired, replaced");
    settle().await;
    assert_eq!(pool.pooled(&origin()), 1);
    tokio::time::advance(Duration::from_secs(91)).await;
    pool.sweep();
    assert_eq!(pool.pooled(&origin()), 0);
}

#[tokio::test]
async fn a_relative_uri_is_refused() {
    let (pool, _rx) = pool(LIMITS);
    let req = Request::get("/x").body(Empty::new()).expect("request");
    assert!(matches!(pool.send(req).await, Err(SendError::NotAbsolute)));
}
