//! A small HTTP client for tests: one request, whole answer.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A pooled test client.
pub type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

/// A new client with its own pool.
pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(64)
        .build_http()
}

/// A whole response.
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Answer {
    /// A header as text ("" when missing).
    pub fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }
}

/// Sends one request with extra headers and reads the whole answer (10 s deadline).
pub async fn send(
    client: &TestClient,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut req = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let fut = async {
        let resp = client.request(req).await.expect("response");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("answer within 10 s")
}

/// GET with headers.
pub async fn get(client: &TestClient, url: &str, headers: &[(&str, &str)]) -> Answer {
    send(client, Method::GET, url, headers, "").await
}

/// Sends raw bytes on a new connection and returns the first chunk of the answer (5 s deadline; empty
/// when the server closes without answering).
pub async fn raw_first(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut buf = vec![0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .expect("an answer within 5 s")
        .unwrap_or(0);
    String::from_utf8_lossy(&buf[..n]).to_string()
}

/// Sends raw bytes on a new connection and returns everything read until the server closes or is quiet
/// for 1 s.
pub async fn raw_all(addr: std::net::SocketAddr, bytes: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(bytes).await.expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).to_string()
}
