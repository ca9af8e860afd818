//! The one place where a failure becomes a response, its status chosen by who failed: the client
//! (4xx), the limit (429), the store (503) or the upstream (502/504). 5xx bodies never carry internals.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::{Either, Full};

use super::{Body, HEADER_BUCKET, HEADER_REASON};
use crate::route::RouteError;

/// Why the proxy answered a request itself instead of forwarding it.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No bucket for this path or region.
    #[error(transparent)]
    Route(#[from] RouteError),
    /// A method or upgrade the proxy cannot gate (CONNECT, websocket, h2c).
    #[error("{0}")]
    NotAllowed(&'static str),
    /// A malformed tollgate header or request.
    #[error("{0}")]
    BadRequest(String),
    /// The bucket's next slot is further away than the max wait.
    #[error("the next slot is {wait:?} away, more than the max wait of {max_wait:?}")]
    MaxWait {
        /// The wait the request would have had.
        wait: Duration,
        /// The max wait that applied.
        max_wait: Duration,
    },
    /// The request's cost can never fit the bucket.
    #[error("cost {cost} can never be served: it is more than the bucket's capacity of {capacity} tokens")]
    CostOverCapacity {
        /// The requested cost.
        cost: f64,
        /// The bucket's capacity.
        capacity: f64,
    },
    /// Too many requests are held already (in the bucket or in total).
    #[error("too many requests are held already; retry shortly")]
    TooManyHeld,
    /// The request body is over `server.max_body_bytes`.
    #[error("the request body is larger than the limit of {limit} bytes (chunked bodies are refused when a limit is set)")]
    BodyTooLarge {
        /// The limit.
        limit: u64,
    },
    /// The store could not be asked and the fallback refuses.
    #[error("the rate-limit store is unavailable")]
    Unavailable,
    /// The upstream could not be reached.
    #[error("the upstream could not be reached")]
    UpstreamConnect,
    /// The upstream did not answer in time.
    #[error("the upstream did not answer within {0:?}")]
    UpstreamTimeout(Duration),
    /// The upstream connection broke before an answer.
    #[error("the upstream connection failed before an answer")]
    UpstreamFailed,
}

impl ProxyError {
    /// The status code, chosen by who failed.
    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::Route(RouteError::HostNotAllowed { .. }) => StatusCode::FORBIDDEN,
            ProxyError::Route(_) => StatusCode::NOT_FOUND,
            ProxyError::NotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ProxyError::BadRequest(_) | ProxyError::CostOverCapacity { .. } => {
                StatusCode::BAD_REQUEST
            }
            ProxyError::MaxWait { .. } => StatusCode::TOO_MANY_REQUESTS,
            ProxyError::Unavailable | ProxyError::TooManyHeld => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::UpstreamConnect | ProxyError::UpstreamFailed => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The short machine-readable reason (JSON `error` field and `X-Tollgate-Reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            ProxyError::Route(RouteError::HostNotAllowed { .. }) => "host-not-allowed",
            ProxyError::Route(_) => "unknown-route",
            ProxyError::NotAllowed(_) => "method-not-allowed",
            ProxyError::BadRequest(_) => "bad-request",
            ProxyError::MaxWait { .. } => "max-wait",
            ProxyError::CostOverCapacity { .. } => "cost-over-capacity",
            ProxyError::Unavailable => "store-unavailable",
            ProxyError::TooManyHeld => "too-many-held",
            ProxyError::BodyTooLarge { .. } => "body-too-large",
            ProxyError::UpstreamConnect => "upstream-connect",
            ProxyError::UpstreamTimeout(_) => "upstream-timeout",
            ProxyError::UpstreamFailed => "upstream-failed",
        }
    }

    /// The response: status, `{"error": reason, "message": …}`, and `Retry-After` where a retry helps.
    pub fn into_response(self, bucket: Option<&HeaderValue>) -> Response<Body> {
        let status = self.status();
        let body = serde_json::json!({ "error": self.reason(), "message": self.to_string() });
        let mut resp = json_response(status, &body);
        let headers = resp.headers_mut();
        headers.insert(HEADER_REASON, HeaderValue::from_static(self.reason()));
        if let Some(bucket) = bucket {
            headers.insert(HEADER_BUCKET, bucket.clone());
        }
        let retry_after = match &self {
            // When a retry's wait would fit again; whole seconds, at least one.
            ProxyError::MaxWait { wait, max_wait } => {
                Some(wait.saturating_sub(*max_wait).as_secs_f64().ceil().max(1.0) as u64)
            }
            ProxyError::Unavailable | ProxyError::TooManyHeld => Some(1),
            _ => None,
        };
        if let Some(secs) = retry_after {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        resp
    }
}

/// A JSON response with the given status.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(
        body.to_string() + "\n",
    ))));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_wait_refusal_says_when_to_retry() {
        let e = ProxyError::MaxWait {
            wait: Duration::from_millis(3500),
            max_wait: Duration::from_secs(1),
        };
        let r = e.into_response(None);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[RETRY_AFTER], "3");
        assert_eq!(r.headers()[HEADER_REASON], "max-wait");
    }

    #[test]
    fn upstream_failures_map_to_502_and_504() {
        assert_eq!(
            ProxyError::UpstreamConnect.status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            ProxyError::UpstreamTimeout(Duration::from_secs(1)).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
    }
}
