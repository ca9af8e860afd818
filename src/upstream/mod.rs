//! The upstream seam: send a request to a provider (http or https via rustls) and return its answer,
//! bodies streamed both ways. Connect and response-header deadlines live here; connections are kept per
//! origin in `pool`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;

pub mod address;
mod pool;

pub use address::GuardedResolver;
use pool::{Pool, PoolLimits, SendError};

/// Why an upstream call produced no answer.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made (refused, DNS, TLS, connect timeout).
    #[error("cannot connect to upstream: {0}")]
    Connect(String),
    /// The upstream did not answer within the response deadline.
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// The client's request body could not be read (malformed chunking, client gone).
    #[error("the request body could not be read: {0}")]
    RequestBody(String),
    /// The connection broke before an answer arrived.
    #[error("upstream request failed: {0}")]
    Failed(String),
}

/// Sends one request upstream.
#[async_trait]
pub trait UpstreamClient: Send + Sync + 'static {
    /// Sends `req` (absolute URI, headers ready) and returns the response with its body still streaming.
    async fn send(&self, req: Request<Incoming>) -> Result<Response<Incoming>, UpstreamError>;
}

/// Upstream deadlines.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For opening the TCP connection.
    pub connect: Duration,
    /// For the response headers.
    pub response: Duration,
}

/// The connector every upstream connection is made with: TCP (names through [`GuardedResolver`]),
/// then rustls for https.
type Connector = HttpsConnector<HttpConnector<GuardedResolver>>;

/// An HTTP/1.1 client over TCP or rustls (webpki roots), with connections pooled per origin.
pub struct HttpClient {
    pool: Arc<Pool<Connector, Incoming>>,
    timeouts: Timeouts,
}

impl HttpClient {
    /// Builds the client and its connection pool; names resolve through `resolver`.
    pub fn new(timeouts: Timeouts, resolver: GuardedResolver) -> HttpClient {
        let mut http = HttpConnector::new_with_resolver(resolver);
        http.enforce_http(false);
        http.set_connect_timeout(Some(timeouts.connect));
        http.set_nodelay(true);
        // rustls is built with ring only, so its default provider needs no installing.
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let pool = Arc::new(Pool::new(
            connector,
            PoolLimits {
                max_idle: 256,
                idle_timeout: Duration::from_secs(90),
            },
        ));
        pool.start_sweeping();
        HttpClient { pool, timeouts }
    }
}

#[async_trait]
impl UpstreamClient for HttpClient {
    async fn send(&self, req: Request<Incoming>) -> Result<Response<Incoming>, UpstreamError> {
        match tokio::time::timeout(self.timeouts.response, self.pool.send(req)).await {
            Err(_) => Err(UpstreamError::Timeout(self.timeouts.response)),
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(SendError::Connect(e))) => Err(UpstreamError::Connect(error_chain(&*e))),
            // hyper reports a failure of the body it was sending as a user error; anything else on the
            // connection (closed early, malformed answer) is the upstream's.
            Ok(Err(SendError::Request(e))) if e.is_user() => {
                Err(UpstreamError::RequestBody(error_chain(&e)))
            }
            Ok(Err(SendError::Request(e))) => Err(UpstreamError::Failed(error_chain(&e))),
            Ok(Err(SendError::NotAbsolute)) => Err(UpstreamError::Failed(
                "the request URI has no scheme or authority".into(),
            )),
        }
    }
}

/// An error and its sources on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
