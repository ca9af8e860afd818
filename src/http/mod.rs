//! The HTTP layer: the accept loop with graceful drain, the proxy service, the admin endpoints and the
//! one function that turns a failure into a response. It stays thin: routing, limiting and forwarding
//! live in their own modules.

use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;

pub mod admin;
pub mod error;
pub mod headers;
pub mod proxy;

/// A response body: the upstream's, streamed, or one the proxy wrote itself.
pub type Body = Either<Incoming, Full<Bytes>>;

/// Header naming the bucket a request went through.
pub const HEADER_BUCKET: &str = "x-tollgate-bucket";
/// Header giving how long the request was held, in milliseconds.
pub const HEADER_WAIT_MS: &str = "x-tollgate-wait-ms";
/// Header giving the reason the proxy answered itself.
pub const HEADER_REASON: &str = "x-tollgate-reason";
/// Request header choosing the region.
pub const HEADER_REGION: &str = "x-tollgate-region";
/// Request header lowering the max wait.
pub const HEADER_MAX_WAIT: &str = "x-tollgate-max-wait";
/// Request header giving the request's cost in tokens (default 1).
pub const HEADER_COST: &str = "x-tollgate-cost";

/// Connection-level limits, enforced by hyper before a request reaches a service.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Most request headers (past it: 431).
    pub max_headers: usize,
    /// Largest request head in bytes (past it: 431).
    pub max_header_bytes: usize,
    /// Deadline for a request's headers, idle keep-alive included (slow-loris).
    pub header_read_timeout: Duration,
}

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            max_headers: 100,
            max_header_bytes: 65_536,
            header_read_timeout: Duration::from_secs(30),
        }
    }
}

/// HTTP/1 connection settings.
pub fn http1_builder(limits: ConnLimits) -> http1::Builder {
    let mut b = http1::Builder::new();
    // hyper enforces the header-read timeout only with a timer.
    b.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(limits.max_headers)
        .max_buf_size(limits.max_header_bytes.max(8192))
        .keep_alive(true);
    b
}

/// Accepts connections until `shutdown` resolves, then lets open connections finish their requests
/// for up to `grace`. Returns whether everything finished in time.
pub async fn serve<S>(
    listener: TcpListener,
    limits: ConnLimits,
    connections: Gauge,
    service: S,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) -> bool
where
    S: Service<Request<Incoming>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let builder = http1_builder(limits);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    let _ = stream.set_nodelay(true);
                    let conn = builder.serve_connection(TokioIo::new(stream), service.clone());
                    let conn = graceful.watch(conn);
                    let open = connections.clone();
                    open.inc();
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        open.dec();
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => true,
        () = tokio::time::sleep(grace) => false,
    }
}
