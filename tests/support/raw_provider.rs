//! A provider that records the exact bytes of each request it receives (one request per connection),
//! for asserting what tollgate puts on the wire and how it treats connections an upstream closes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What the provider does once it has read a whole request on a connection.
#[derive(Debug, Clone, Copy)]
pub enum Mode {
    /// Answers 200 with `Connection: close` and closes.
    Close,
    /// Answers 200 as keep-alive, then closes the idle connection after this long (as an upstream's
    /// keep-alive timeout does).
    IdleClose(Duration),
    /// Closes without answering.
    HangUp,
}

/// A running raw provider; stops on drop.
pub struct RawProvider {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
    connections: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl RawProvider {
    /// Starts on a free loopback port, answering `Connection: close`.
    pub async fn start() -> RawProvider {
        RawProvider::start_with(Mode::Close).await
    }

    /// Starts on a free loopback port, treating connections as `mode` says.
    pub async fn start_with(mode: Mode) -> RawProvider {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let (rec, count) = (requests.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let rec = rec.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // Read until the request is complete by its own framing (or 2 s of silence).
                    while !complete(&buf) {
                        match tokio::time::timeout(Duration::from_secs(2), s.read(&mut chunk)).await
                        {
                            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
                            _ => break,
                        }
                    }
                    // Only whole requests count: a body cut off mid-stream never reached the provider as a request.
                    if complete(&buf) {
                        rec.lock().expect("lock").push(buf);
                    }
                    match mode {
                        Mode::Close => {
                            let _ = s
                                .write_all(
                                    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                                )
                                .await;
                        }
                        Mode::IdleClose(after) => {
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                                .await;
                            tokio::time::sleep(after).await;
                        }
                        Mode::HangUp => {}
                    }
                });
            }
        });
        RawProvider {
            addr,
            requests,
            connections,
            task,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// The raw bytes of every complete request so far.
    pub fn requests(&self) -> Vec<Vec<u8>> {
        self.requests.lock().expect("lock").clone()
    }
}

impl Drop for RawProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Whether `buf` holds a whole request: head plus a Content-Length or chunked body.
fn complete(buf: &[u8]) -> bool {
    let Some(head_end) = find(buf, b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let body = &buf[head_end + 4..];
    if head.contains("transfer-encoding: chunked") {
        return find(body, b"0\r\n\r\n").is_some();
    }
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    body.len() >= len
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
