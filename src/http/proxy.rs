//! The proxy service: route → gate → forward → observe. Each step lives in its own module; this file
//! only strings them together and records what happened.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::header::{HeaderValue, HOST};
use http::{Method, Request, Response, Uri, Version};
use http_body_util::Either;
use hyper::body::Incoming;
use tokio::time::Instant;

use super::error::ProxyError;
use super::headers::{strip_hop_by_hop, strip_tollgate};
use super::{Body, HEADER_BUCKET, HEADER_COST, HEADER_MAX_WAIT, HEADER_REGION, HEADER_WAIT_MS};
use crate::config::BucketConfig;
use crate::gate::{Gate, GateError};
use crate::route::{Route, Router};
use crate::store::{Bucket, Refusal};
use crate::telemetry::{BucketMetrics, Metrics, Outcome};
use crate::upstream::{UpstreamClient, UpstreamError};

/// A configured bucket with everything the request path needs, resolved at start-up.
pub struct BucketEntry {
    /// The bucket as configured.
    pub config: BucketConfig,
    /// What the store needs of it.
    pub store: Bucket,
    /// Its metric handles.
    pub metrics: BucketMetrics,
    /// `provider` or `provider:region`, as a header value.
    pub name: HeaderValue,
    /// The upstream's authority, as the `Host` header value.
    host: HeaderValue,
    /// Requests reserving or held in this bucket right now.
    held: AtomicUsize,
}

/// Everything the proxy service shares across requests.
pub struct Proxy {
    router: Router,
    buckets: Vec<BucketEntry>,
    gate: Gate,
    upstream: Arc<dyn UpstreamClient>,
    limits: Limits,
    /// Requests reserving or held across all buckets right now.
    held: AtomicUsize,
}

/// Request-path limits, all answered before a token is taken.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest a request may be held.
    pub max_wait: Duration,
    /// Most requests held at once, in total.
    pub max_held: usize,
    /// Most requests held at once in one bucket.
    pub max_held_per_bucket: usize,
    /// Largest request body accepted, if limited.
    pub max_body_bytes: Option<u64>,
}

impl Proxy {
    /// Resolves buckets, metrics and routes once.
    pub fn new(
        buckets: &[BucketConfig],
        gate: Gate,
        upstream: Arc<dyn UpstreamClient>,
        metrics: &Metrics,
        limits: Limits,
    ) -> Proxy {
        let entries = buckets
            .iter()
            .map(|b| {
                let name = b.name();
                BucketEntry {
                    store: Bucket::from(b),
                    metrics: metrics.bucket(&name),
                    // Names are [a-z0-9_:-] and authorities are valid URI parts: both are valid header values.
                    name: HeaderValue::from_str(&name)
                        .unwrap_or(HeaderValue::from_static("invalid")),
                    host: HeaderValue::from_str(b.upstream.authority.as_str())
                        .unwrap_or(HeaderValue::from_static("invalid")),
                    config: b.clone(),
                    held: AtomicUsize::new(0),
                }
            })
            .collect();
        Proxy {
            router: Router::new(buckets),
            buckets: entries,
            gate,
            upstream,
            limits,
            held: AtomicUsize::new(0),
        }
    }

    /// The configured buckets, in config order.
    pub fn buckets(&self) -> &[BucketEntry] {
        &self.buckets
    }

    /// The gate (and through it the store).
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// Handles one request; never fails (errors become responses).
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let mut bucket = None;
        match self.proxy(req, &mut bucket).await {
            Ok(resp) => resp,
            Err(e) => {
                let entry = bucket.map(|i| &self.buckets[i]);
                if let Some(entry) = entry {
                    entry.metrics.outcome(match &e {
                        ProxyError::MaxWait { .. } => Outcome::MaxWait,
                        ProxyError::Unavailable | ProxyError::TooManyHeld => Outcome::Unavailable,
                        ProxyError::UpstreamConnect
                        | ProxyError::UpstreamTimeout(_)
                        | ProxyError::UpstreamFailed => Outcome::UpstreamError,
                        _ => Outcome::Rejected,
                    });
                }
                e.into_response(entry.map(|b| &b.name))
            }
        }
    }

    async fn proxy(
        &self,
        mut req: Request<Incoming>,
        bucket_out: &mut Option<usize>,
    ) -> Result<Response<Body>, ProxyError> {
        let arrived = Instant::now();
        if req.method() == Method::CONNECT {
            return Err(ProxyError::NotAllowed(
                "CONNECT is not supported: tollgate must see each request to gate it; use base-URL mode (http://PROXY/{provider}/...) for https providers",
            ));
        }
        if req.headers().contains_key(http::header::UPGRADE) {
            return Err(ProxyError::NotAllowed(
                "protocol upgrades (websocket, h2c) are not supported: tollgate gates individual HTTP requests",
            ));
        }
        let headers = req.headers();
        let region = header_str(headers.get(HEADER_REGION), HEADER_REGION)?;
        let cost = parse_cost(headers.get(HEADER_COST))?;
        let max_wait = match parse_max_wait(headers.get(HEADER_MAX_WAIT))? {
            Some(client) => client.min(self.limits.max_wait),
            None => self.limits.max_wait,
        };
        let route = match (req.uri().host(), req.uri().scheme_str()) {
            // Absolute form: a worker using tollgate as its HTTP_PROXY.
            (Some(host), Some("http" | "https")) => {
                self.router
                    .route_host(host, req.uri().port_u16(), req.uri().path(), region)?
            }
            (Some(_), _) => {
                return Err(ProxyError::BadRequest(
                    "absolute-form requests must use http:// URLs".into(),
                ))
            }
            (None, _) => self.router.route(req.uri().path(), region)?,
        };
        let index = route.bucket;
        *bucket_out = Some(index);
        let entry = &self.buckets[index];
        let uri = upstream_uri(&entry.config, &route, req.uri().query())?;
        if let Some(limit) = self.limits.max_body_bytes {
            let declared = req
                .headers()
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit)
                || (declared.is_none()
                    && req.headers().contains_key(http::header::TRANSFER_ENCODING))
            {
                return Err(ProxyError::BodyTooLarge { limit });
            }
        }
        let mut holding =
            Holding::try_start(entry, &self.held, &self.limits).ok_or(ProxyError::TooManyHeld)?;

        // Reserve, then hold. If the client goes away meanwhile, this future is dropped: the ticket gives
        // its slot back and the Holding guard counts the cancellation.
        let ticket = match self.gate.reserve(&entry.store, cost, max_wait).await {
            Ok(ticket) => ticket,
            Err(GateError::Refused(Refusal::TooLong { wait })) => {
                return Err(ProxyError::MaxWait { wait, max_wait })
            }
            Err(GateError::Refused(Refusal::CostOverCapacity)) => {
                return Err(ProxyError::CostOverCapacity {
                    cost,
                    capacity: entry.config.limit.capacity(),
                })
            }
            Err(GateError::Store(e)) => {
                tracing::error!(bucket = %entry.config.name(), error = %e, "store call failed");
                return Err(ProxyError::Unavailable);
            }
        };
        holding.held();
        ticket.hold().await;
        holding.finish();
        let waited = arrived.elapsed();
        entry.metrics.wait.observe(waited.as_secs_f64());

        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_11;
        let headers = req.headers_mut();
        strip_hop_by_hop(headers);
        strip_tollgate(headers);
        headers.insert(HOST, entry.host.clone());

        let upstream_resp = self.upstream.send(req).await.map_err(|e| {
            tracing::warn!(bucket = %entry.config.name(), error = %e, "upstream request failed");
            match e {
                UpstreamError::Connect(_) => ProxyError::UpstreamConnect,
                UpstreamError::Timeout(d) => ProxyError::UpstreamTimeout(d),
                UpstreamError::Failed(_) => ProxyError::UpstreamFailed,
                UpstreamError::RequestBody(_) => {
                    ProxyError::BadRequest("the request body could not be read".into())
                }
            }
        })?;

        let status = upstream_resp.status();
        entry.metrics.outcome(Outcome::Forwarded);
        entry.metrics.upstream_response(status.as_u16());
        if status == http::StatusCode::TOO_MANY_REQUESTS {
            entry.metrics.upstream_429.inc();
            let retry_after = upstream_resp
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-");
            tracing::warn!(bucket = %entry.config.name(), retry_after, "upstream answered 429: the provider's limit was breached");
        }
        let (mut parts, body) = upstream_resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.insert(HEADER_BUCKET, entry.name.clone());
        parts
            .headers
            .insert(HEADER_WAIT_MS, HeaderValue::from(waited.as_millis() as u64));
        Ok(Response::from_parts(parts, Either::Left(body)))
    }
}

/// A request's place among the held: counted against the limits from before its reservation until it
/// leaves the gate. Dropped while held, it counts as cancelled (the client went away).
struct Holding<'a> {
    entry: &'a BucketEntry,
    total: &'a AtomicUsize,
    held: bool,
}

impl<'a> Holding<'a> {
    /// Takes a place, or `None` when the bucket or the whole proxy holds its maximum already.
    fn try_start(
        entry: &'a BucketEntry,
        total: &'a AtomicUsize,
        limits: &Limits,
    ) -> Option<Holding<'a>> {
        if total.fetch_add(1, Ordering::AcqRel) >= limits.max_held {
            total.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        if entry.held.fetch_add(1, Ordering::AcqRel) >= limits.max_held_per_bucket {
            entry.held.fetch_sub(1, Ordering::AcqRel);
            total.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Holding {
            entry,
            total,
            held: false,
        })
    }

    /// The reservation was granted: the request now waits for its slot.
    fn held(&mut self) {
        self.held = true;
        self.entry.metrics.held.inc();
    }

    /// The slot has come.
    fn finish(mut self) {
        self.entry.metrics.held.dec();
        self.held = false;
    }
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.entry.held.fetch_sub(1, Ordering::AcqRel);
        self.total.fetch_sub(1, Ordering::AcqRel);
        if self.held {
            self.entry.metrics.held.dec();
            self.entry.metrics.outcome(Outcome::Cancelled);
        }
    }
}

fn header_str<'a>(
    value: Option<&'a HeaderValue>,
    name: &str,
) -> Result<Option<&'a str>, ProxyError> {
    value
        .map(|v| {
            v.to_str()
                .map_err(|_| ProxyError::BadRequest(format!("{name} is not valid text")))
        })
        .transpose()
}

/// `X-Tollgate-Cost`: a positive number of tokens (default 1).
fn parse_cost(value: Option<&HeaderValue>) -> Result<f64, ProxyError> {
    let Some(text) = header_str(value, HEADER_COST)? else {
        return Ok(1.0);
    };
    match text.trim().parse::<f64>() {
        Ok(cost) if cost.is_finite() && cost > 0.0 => Ok(cost),
        _ => Err(ProxyError::BadRequest(format!(
            "{HEADER_COST} must be a positive number of tokens, got {text:?}"
        ))),
    }
}

/// `X-Tollgate-Max-Wait`: a duration (`2s`, `500ms`) or a number of seconds.
fn parse_max_wait(value: Option<&HeaderValue>) -> Result<Option<Duration>, ProxyError> {
    let Some(text) = header_str(value, HEADER_MAX_WAIT)? else {
        return Ok(None);
    };
    let text = text.trim();
    let parsed = match text.parse::<f64>() {
        Ok(secs) if secs.is_finite() && secs >= 0.0 => Some(Duration::from_secs_f64(secs)),
        Ok(_) => None,
        Err(_) => humantime::parse_duration(text).ok(),
    };
    parsed.map(Some).ok_or_else(|| {
        ProxyError::BadRequest(format!(
            "{HEADER_MAX_WAIT} must be a duration like \"2s\" or \"500ms\", got {text:?}"
        ))
    })
}

/// The upstream URI: the bucket's base path (base-URL mode only) plus the rest of the path and the
/// query, byte for byte.
fn upstream_uri(
    bucket: &BucketConfig,
    route: &Route<'_>,
    query: Option<&str>,
) -> Result<Uri, ProxyError> {
    let base = if route.absolute {
        ""
    } else {
        bucket.upstream.base_path.as_str()
    };
    let rest = route.rest;
    let mut pq =
        String::with_capacity(base.len() + rest.len() + query.map_or(0, |q| q.len() + 1) + 1);
    pq.push_str(base);
    pq.push_str(rest);
    if pq.is_empty() {
        pq.push('/');
    }
    if let Some(q) = query {
        pq.push('?');
        pq.push_str(q);
    }
    Uri::builder()
        .scheme(bucket.upstream.scheme.clone())
        .authority(bucket.upstream.authority.clone())
        .path_and_query(pq)
        .build()
        .map_err(|_| ProxyError::BadRequest("the request path cannot be forwarded".to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn bucket(upstream: &str) -> BucketConfig {
        let c = Config::from_toml(
            "t.toml",
            &format!("[providers.p]\nupstream = \"{upstream}\"\nrate = 1\n"),
        )
        .expect("valid");
        c.buckets[0].clone()
    }

    #[test]
    fn upstream_uri_keeps_path_and_query_bytes() {
        let based = |rest| Route {
            bucket: 0,
            rest,
            absolute: false,
        };
        let b = bucket("https://api.example/v1/");
        let uri =
            upstream_uri(&b, &based("/search/a%2Fb"), Some("q=S%C3%A3o+Paulo&x=%20")).expect("uri");
        assert_eq!(
            uri.to_string(),
            "https://api.example/v1/search/a%2Fb?q=S%C3%A3o+Paulo&x=%20"
        );
        // Forward-proxy mode sends the request's own path, without the base path.
        let absolute = Route {
            bucket: 0,
            rest: "/v1/search",
            absolute: true,
        };
        assert_eq!(
            upstream_uri(&b, &absolute, None).expect("uri").to_string(),
            "https://api.example/v1/search"
        );
        let b = bucket("http://127.0.0.1:9");
        assert_eq!(
            upstream_uri(&b, &based(""), None).expect("uri").to_string(),
            "http://127.0.0.1:9/"
        );
        assert_eq!(
            upstream_uri(&b, &based(""), Some("a=1"))
                .expect("uri")
                .to_string(),
            "http://127.0.0.1:9/?a=1"
        );
    }

    #[test]
    fn cost_and_max_wait_headers_are_validated() {
        assert_eq!(parse_cost(None).expect("default"), 1.0);
        assert_eq!(
            parse_cost(Some(&HeaderValue::from_static("2.5"))).expect("cost"),
            2.5
        );
        for bad in ["0", "-1", "x", "inf", "NaN"] {
            assert!(
                parse_cost(Some(&HeaderValue::from_static(bad))).is_err(),
                "{bad}"
            );
        }
        assert_eq!(
            parse_max_wait(Some(&HeaderValue::from_static("2s"))).expect("ok"),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            parse_max_wait(Some(&HeaderValue::from_static("0.25"))).expect("ok"),
            Some(Duration::from_millis(250))
        );
        assert!(parse_max_wait(Some(&HeaderValue::from_static("soon"))).is_err());
        assert!(parse_max_wait(Some(&HeaderValue::from_static("-1"))).is_err());
    }
}
