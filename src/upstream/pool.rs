//! HTTP/1 connections kept per upstream origin. A request takes the newest ready connection or opens
//! one; its sender goes back as soon as the response headers arrive (it becomes ready by itself once the
//! body has been read). A request that was never written on a stale connection is retried once on a new
//! one; a request that may have been written never is.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::{Body, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use tokio::time::Instant;

use crate::affinity::thread_index;

/// A boxed error from a connector or body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How many connections a pool keeps, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct PoolLimits {
    /// Most connections kept per origin.
    pub max_idle: usize,
    /// Idle connections older than this are closed.
    pub idle_timeout: Duration,
}

/// Why the pool produced no response.
#[derive(Debug)]
pub enum SendError {
    /// The request URI has no scheme or authority.
    NotAbsolute,
    /// No connection could be made.
    Connect(BoxError),
    /// The connection failed during the handshake or the exchange.
    Request(hyper::Error),
}

/// Scheme and authority: connections are shared only within one.
type Origin = (Scheme, Authority);

/// Where a connection is kept: per request thread (see [`crate::affinity`]) and origin.
type Key = (usize, Origin);

/// A pooled sender and when it was put back.
struct Pooled<B> {
    sender: SendRequest<B>,
    since: Instant,
}

impl<B> Pooled<B> {
    /// Closed by the upstream, or ready but unused for `idle_timeout`.
    fn stale(&self, now: Instant, idle_timeout: Duration) -> bool {
        self.sender.is_closed()
            || (self.sender.is_ready() && now.saturating_duration_since(self.since) >= idle_timeout)
    }
}

/// HTTP/1 connections per origin, made with connector `C`, carrying request bodies of type `B`.
pub struct Pool<C, B> {
    connector: C,
    limits: PoolLimits,
    origins: RwLock<HashMap<Key, Mutex<Vec<Pooled<B>>>>>,
}

impl<C, B> Pool<C, B>
where
    C: tower_service::Service<Uri> + Clone + Send + Sync + 'static,
    C::Response: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// An empty pool.
    pub fn new(connector: C, limits: PoolLimits) -> Pool<C, B> {
        Pool {
            connector,
            limits,
            origins: RwLock::new(HashMap::new()),
        }
    }

    /// Sends `req` (absolute URI) in origin form and returns the response with its body streaming.
    pub async fn send(&self, mut req: Request<B>) -> Result<Response<Incoming>, SendError> {
        let key = (thread_index(), take_origin(&mut req)?);
        if let Some(mut sender) = self.checkout(&key) {
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    self.checkin(key, sender);
                    return Ok(resp);
                }
                // Handed back unwritten: the upstream closed the connection as we picked it.
                Err(mut e) => match e.take_message() {
                    Some(unsent) => req = unsent,
                    None => return Err(SendError::Request(e.into_error())),
                },
            }
        }
        let mut sender = self.connect(&key.1).await?;
        let resp = sender.send_request(req).await.map_err(SendError::Request)?;
        self.checkin(key, sender);
        Ok(resp)
    }

    /// The newest ready sender for `key`, dropping closed and expired ones on the way.
    fn checkout(&self, key: &Key) -> Option<SendRequest<B>> {
        let origins = self.origins.read().unwrap_or_else(PoisonError::into_inner);
        let mut pooled = lock(origins.get(key)?);
        let now = Instant::now();
        let mut i = pooled.len();
        while i > 0 {
            i -= 1;
            let p = &pooled[i];
            if p.stale(now, self.limits.idle_timeout) {
                pooled.remove(i);
            } else if p.sender.is_ready() {
                return Some(pooled.remove(i).sender);
            }
            // Otherwise still streaming a response body: it stays for later.
        }
        None
    }

    /// Puts a sender back, unless the origin keeps its maximum already.
    fn checkin(&self, key: Key, sender: SendRequest<B>) {
        let p = Pooled {
            sender,
            since: Instant::now(),
        };
        {
            let origins = self.origins.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(pooled) = origins.get(&key) {
                push(&mut lock(pooled), p, self.limits.max_idle);
                return;
            }
        }
        let mut origins = self.origins.write().unwrap_or_else(PoisonError::into_inner);
        let pooled = origins.entry(key).or_default();
        push(&mut lock(pooled), p, self.limits.max_idle);
    }

    /// Opens a connection (through the connector, so through its resolver) and spawns its task.
    async fn connect(&self, origin: &Origin) -> Result<SendRequest<B>, SendError> {
        let uri = Uri::builder()
            .scheme(origin.0.clone())
            .authority(origin.1.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| SendError::Connect(e.into()))?;
        let mut connector = self.connector.clone();
        poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(|e| SendError::Connect(e.into()))?;
        let io = connector
            .call(uri)
            .await
            .map_err(|e| SendError::Connect(e.into()))?;
        let (sender, conn) = http1::handshake(io).await.map_err(SendError::Request)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }

    /// Drops closed senders and idle ones past the idle timeout, for every origin.
    pub fn sweep(&self) {
        let now = Instant::now();
        let origins = self.origins.read().unwrap_or_else(PoisonError::into_inner);
        for pooled in origins.values() {
            lock(pooled).retain(|p| !p.stale(now, self.limits.idle_timeout));
        }
    }

    /// Sweeps every idle timeout while the pool lives (a no-op outside a tokio runtime), so idle
    /// connections close even when no request comes to find them expired.
    pub fn start_sweeping(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool = Arc::downgrade(self);
        let period = self.limits.idle_timeout;
        runtime.spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = pool.upgrade() else { return };
                pool.sweep();
            }
        });
    }

    /// Senders kept for `origin` by every thread (ready or still streaming).
    #[cfg(test)]
    pub fn pooled(&self, origin: &Uri) -> usize {
        let (Some(scheme), Some(authority)) = (origin.scheme(), origin.authority()) else {
            return 0;
        };
        let origins = self.origins.read().unwrap_or_else(PoisonError::into_inner);
        let origin = (scheme.clone(), authority.clone());
        origins
            .iter()
            .filter(|((_, o), _)| *o == origin)
            .map(|(_, p)| lock(p).len())
            .sum()
    }
}

fn push<B>(pooled: &mut Vec<Pooled<B>>, p: Pooled<B>, max: usize) {
    // Over the cap the returning sender is dropped: its connection closes once its response is read.
    if pooled.len() < max {
        pooled.push(p);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the scheme and authority out of the request URI, leaving the origin form (path and query)
/// that HTTP/1.1 sends to an origin server, and sets `Host` from the authority if it is missing.
fn take_origin<B>(req: &mut Request<B>) -> Result<Origin, SendError> {
    let mut parts = std::mem::take(req.uri_mut()).into_parts();
    let (Some(scheme), Some(authority)) = (parts.scheme.take(), parts.authority.take()) else {
        return Err(SendError::NotAbsolute);
    };
    let target = parts
        .path_and_query
        .take()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    *req.uri_mut() = Uri::from(target);
    if !req.headers().contains_key(http::header::HOST) {
        // As the legacy client did: the host, and the port unless it is the scheme's default.
        let default = if scheme == Scheme::HTTPS { 443 } else { 80 };
        let host = match authority.port_u16() {
            Some(port) if port != default => format!("{}:{port}", authority.host()),
            _ => authority.host().to_string(),
        };
        let host = HeaderValue::from_str(&host).map_err(|_| SendError::NotAbsolute)?;
        req.headers_mut().insert(http::header::HOST, host);
    }
    Ok((scheme, authority))
}

#[cfg(test)]
mod tests;
