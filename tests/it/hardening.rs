//! Limits answered before a token is taken, and request smuggling: every ambiguous framing is refused
//! or normalised, never forwarded as received.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::client::{client, get, raw_all};
use crate::support::fake_provider::FakeProvider;
use crate::support::raw_provider::RawProvider;
use crate::support::tollgate::{provider, Tollgate};

async fn tokens(t: &Tollgate) -> f64 {
    let b = get(&client(), &t.admin_url("/buckets"), &[]).await.json();
    b["buckets"][0]["tokens"].as_f64().expect("tokens")
}

const LIMITS: &str = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nmax_headers = 20\nmax_header_bytes = 8192\nmax_body_bytes = 1000\nmax_held_per_bucket = 2\nheader_read_timeout = \"500ms\"\n";

#[tokio::test]
async fn oversized_heads_and_bodies_are_refused_before_a_token_is_taken() {
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!("{LIMITS}{}", provider("geo", &p.url(), 1.0, 5.0))).await;
    let many: String = (0..40).map(|i| format!("X-H{i}: v\r\n")).collect();
    let answer = raw_all(
        t.proxy,
        format!("GET /geo/x HTTP/1.1\r\nHost: t\r\n{many}\r\n").as_bytes(),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 431"),
        "too many headers: {answer}"
    );
    let big = "a".repeat(10_000);
    let answer = raw_all(
        t.proxy,
        format!("GET /geo/x HTTP/1.1\r\nHost: t\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 431"),
        "head too large: {answer}"
    );
    let body = "b".repeat(2000);
    let answer = raw_all(
        t.proxy,
        format!("POST /geo/x HTTP/1.1\r\nHost: t\r\nContent-Length: 2000\r\n\r\n{body}").as_bytes(),
    )
    .await;
    assert!(
        answer.starts_with("HTTP/1.1 413"),
        "body too large: {answer}"
    );
    assert!(answer.contains("body-too-large"));
    assert!(p.arrivals().is_empty());
    assert_eq!(tokens(&t).await, 5.0, "no token taken");
}

#[tokio::test]
async fn past_max_held_a_bucket_answers_503_with_retry_after() {
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!("{LIMITS}{}", provider("geo", &p.url(), 1.0, 1.0))).await;
    let c = client();
    assert_eq!(get(&c, &t.url("/geo/a"), &[]).await.status, 200);
    let held: Vec<_> = (0..2)
        .map(|_| {
            let (c, url) = (c.clone(), t.url("/geo/held"));
            tokio::spawn(async move { get(&c, &url, &[]).await.status })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let a = get(&c, &t.url("/geo/third"), &[]).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.header("retry-after"), "1");
    assert_eq!(a.json()["error"], "too-many-held");
    // Two held, none taken by the refused one: -2 tokens (debt) plus a little refill.
    let now = tokens(&t).await;
    assert!(now < -1.5, "tokens {now}");
    for h in held {
        assert_eq!(h.await.expect("held"), 200);
    }
    assert_eq!(p.arrivals().len(), 3);
}

#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    let p = FakeProvider::start().await;
    let t = Tollgate::start(&format!("{LIMITS}{}", provider("geo", &p.url(), 1.0, 1.0))).await;
    let mut s = TcpStream::connect(t.proxy).await.expect("connect");
    s.write_all(b"GET /geo/x HTTP/1.1\r\nHost: t\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("closed within the header-read timeout")
        .unwrap_or(0);
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(n == 0 || text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(p.arrivals().is_empty());
}

/// What a smuggling case must lead to.
enum Expect {
    /// A 4xx answer and nothing at the provider.
    Refused,
    /// Exactly one request at the provider, framed once, with this body.
    Forwarded(&'static str),
}

#[tokio::test]
async fn ambiguous_framing_is_refused_or_normalised_never_forwarded_as_is() {
    use Expect::*;
    let cases: &[(&str, &str, Expect)] = &[
        ("CL and TE: TE wins, CL dropped", "POST /p/x HTTP/1.1\r\nHost: t\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG", Forwarded("")),
        ("TE and CL (reversed order)", "POST /p/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n", Forwarded("abc")),
        ("two different Content-Lengths", "POST /p/x HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 5\r\n\r\nabcde", Refused),
        ("Content-Length list", "POST /p/x HTTP/1.1\r\nHost: t\r\nContent-Length: 3, 5\r\n\r\nabcde", Refused),
        ("signed Content-Length", "POST /p/x HTTP/1.1\r\nHost: t\r\nContent-Length: +3\r\n\r\nabc", Refused),
        ("space before colon", "POST /p/x HTTP/1.1\r\nHost: t\r\nContent-Length : 3\r\n\r\nabc", Refused),
        ("obs-fold", "GET /p/x HTTP/1.1\r\nHost: t\r\nX-Folded: a\r\n b\r\n\r\n", Refused),
        ("TE on HTTP/1.0", "POST /p/x HTTP/1.0\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", Refused),
        ("TE not ending in chunked", "POST /p/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, identity\r\n\r\nabc", Refused),
        ("unknown TE", "POST /p/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", Refused),
        ("bare LF line endings", "POST /p/x HTTP/1.1\nHost: t\nContent-Length: 3\n\nabc", Forwarded("abc")),
        ("same Content-Length twice", "POST /p/x HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", Forwarded("abc")),
        ("invalid chunk size", "POST /p/x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", Refused),
    ];
    for (name, bytes, expect) in cases {
        let p = RawProvider::start().await;
        let t = Tollgate::start(&format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{}",
            provider("p", &p.url(), 1000.0, 1000.0)
        ))
        .await;
        let answer = raw_all(t.proxy, bytes.as_bytes()).await;
        let got = p.requests();
        match expect {
            Refused => {
                assert!(
                    answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
                    "{name}: answered {answer:?}"
                );
                assert!(
                    got.is_empty(),
                    "{name}: forwarded {:?}",
                    got.iter()
                        .map(|r| String::from_utf8_lossy(r).to_string())
                        .collect::<Vec<_>>()
                );
            }
            Forwarded(body) => {
                assert!(answer.starts_with("HTTP/1.1 200"), "{name}: {answer:?}");
                assert_eq!(got.len(), 1, "{name}: exactly one request upstream");
                let text = String::from_utf8_lossy(&got[0]).to_string();
                let lower = text.to_ascii_lowercase();
                let framing = lower.matches("\r\ncontent-length:").count()
                    + lower.matches("\r\ntransfer-encoding:").count();
                assert!(framing <= 1, "{name}: framed more than once:\n{text}");
                assert!(
                    !text.replace("\r\n", "").contains('\n'),
                    "{name}: bare LF upstream:\n{text}"
                );
                let head_end = text.find("\r\n\r\n").expect("head") + 4;
                let raw_body = &text[head_end..];
                let decoded = if lower.contains("transfer-encoding: chunked") {
                    dechunk(raw_body)
                } else {
                    raw_body.to_string()
                };
                assert_eq!(decoded, *body, "{name}: body\n{text}");
            }
        }
    }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    loop {
        let Some(line_end) = s.find("\r\n") else {
            return out;
        };
        let size = usize::from_str_radix(s[..line_end].trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.push_str(&s[line_end + 2..line_end + 2 + size]);
        s = &s[line_end + 2 + size + 2..];
    }
}
