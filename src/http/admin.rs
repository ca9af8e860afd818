//! The admin listener: `/healthz`, `/readyz`, `/metrics`, `/buckets`.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use hyper::body::Incoming;

use super::error::json_response;
use super::proxy::Proxy;
use super::Body;
use crate::telemetry::{Metrics, METRICS_CONTENT_TYPE};

/// What the admin endpoints read.
pub struct Admin {
    proxy: Arc<Proxy>,
    metrics: Arc<Metrics>,
}

impl Admin {
    /// Admin endpoints over the proxy's buckets and the metrics registry.
    pub fn new(proxy: Arc<Proxy>, metrics: Arc<Metrics>) -> Admin {
        Admin { proxy, metrics }
    }

    /// Answers one admin request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return json_response(
                StatusCode::METHOD_NOT_ALLOWED,
                &serde_json::json!({"error": "method-not-allowed", "message": "admin endpoints answer GET only"}),
            );
        }
        match req.uri().path() {
            "/healthz" => text(
                StatusCode::OK,
                "text/plain; charset=utf-8",
                "ok\n".to_string(),
            ),
            "/readyz" => self.readyz().await,
            "/metrics" => text(StatusCode::OK, METRICS_CONTENT_TYPE, self.metrics.encode()),
            "/buckets" => self.buckets().await,
            _ => json_response(
                StatusCode::NOT_FOUND,
                &serde_json::json!({"error": "not-found", "message": "admin endpoints: /healthz /readyz /metrics /buckets"}),
            ),
        }
    }

    async fn readyz(&self) -> Response<Body> {
        let store = self.proxy.gate().store();
        let reachable = store.ping().await;
        json_response(
            StatusCode::OK,
            &serde_json::json!({
                "ready": true,
                "store": {
                    "backend": store.backend(),
                    "mode": store.mode(),
                    "reachable": reachable.is_ok(),
                    "error": reachable.err().map(|e| e.message),
                },
            }),
        )
    }

    async fn buckets(&self) -> Response<Body> {
        let store = self.proxy.gate().store();
        let mut list = Vec::new();
        for b in self.proxy.buckets() {
            let tokens = store.tokens(&b.store).await.ok();
            list.push(serde_json::json!({
                "name": b.config.name(),
                "key": b.config.key(),
                "provider": b.config.provider,
                "region": b.config.region,
                "upstream": b.config.upstream.to_string(),
                "rate": b.config.limit.rate(),
                "capacity": b.config.limit.capacity(),
                "tokens": tokens,
                "held": b.metrics.held.get(),
                "upstream_429": b.metrics.upstream_429.get(),
                "store": store.backend(),
                "store_mode": store.mode(),
            }));
        }
        json_response(StatusCode::OK, &serde_json::json!({ "buckets": list }))
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
