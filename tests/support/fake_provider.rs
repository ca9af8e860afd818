//! A fake provider: a real HTTP server on a free loopback port that answers like a geocoding API,
//! records every arrival (time, request line, headers, body) and enforces its own limit.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::HeaderMap;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::Instant;

/// One request as the provider saw it.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// When it arrived (headers read).
    pub at: Instant,
    /// Method.
    pub method: String,
    /// Path and query exactly as received.
    pub target: String,
    /// Headers as received.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

/// How the provider answers.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// 200 with a geocoding-style JSON body.
    Ok,
    /// 429 with this `Retry-After`.
    TooMany(&'static str),
    /// Wait this long, then answer 200.
    Slow(Duration),
    /// 302 to this location.
    Redirect(&'static str),
}

/// The provider's own limit: answers 429 to an arrival that would break `capacity + rate*(T + jitter)`.
#[derive(Debug, Clone, Copy)]
pub struct OwnLimit {
    /// Tokens per second.
    pub rate: f64,
    /// Burst.
    pub capacity: f64,
    /// Delivery-jitter allowance.
    pub jitter: Duration,
}

struct State {
    arrivals: Mutex<Vec<Arrival>>,
    behaviour: Mutex<Behaviour>,
    limit: Option<OwnLimit>,
    breaches: Mutex<u64>,
    /// Released by the test to let `/stream` send its last chunk.
    stream_gate: Notify,
    /// Connections accepted.
    connections: AtomicUsize,
}

/// A running fake provider; stops on drop.
pub struct FakeProvider {
    addr: SocketAddr,
    state: Arc<State>,
    stop: Option<oneshot::Sender<()>>,
}

impl FakeProvider {
    /// Starts a provider with no limit of its own.
    pub async fn start() -> FakeProvider {
        FakeProvider::start_with(None).await
    }

    /// Starts a provider that enforces `limit` itself.
    pub async fn start_with(limit: Option<OwnLimit>) -> FakeProvider {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind provider");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("provider addr");
        let state = Arc::new(State {
            arrivals: Mutex::new(Vec::new()),
            behaviour: Mutex::new(Behaviour::Ok),
            limit,
            breaches: Mutex::new(0),
            stream_gate: Notify::new(),
            connections: AtomicUsize::new(0),
        });
        let st = state.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        // Its own thread and runtime: arrival times are taken when requests arrive, not when a
        // runtime busy with the test's clients gets round to them.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("provider runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("provider listener");
                let serve = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        st.connections.fetch_add(1, Ordering::SeqCst);
                        let st = st.clone();
                        tokio::spawn(async move {
                            let svc = service_fn(move |req| answer(st.clone(), req));
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), svc)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    () = serve => {}
                    _ = stopped => {}
                }
            });
        });
        FakeProvider {
            addr,
            state,
            stop: Some(stop),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Changes how later requests are answered.
    pub fn set(&self, behaviour: Behaviour) {
        *self.state.behaviour.lock().expect("lock") = behaviour;
    }

    /// Every arrival so far.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.state.arrivals.lock().expect("lock").clone()
    }

    /// Arrival times so far.
    pub fn arrival_times(&self) -> Vec<Instant> {
        self.arrivals().iter().map(|a| a.at).collect()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Arrivals its own limit answered 429.
    pub fn breaches(&self) -> u64 {
        *self.state.breaches.lock().expect("lock")
    }

    /// Lets a `/stream` response send its final chunk.
    pub fn release_stream(&self) {
        self.state.stream_gate.notify_one();
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

type Body = http_body_util::Either<
    Full<Bytes>,
    StreamBody<tokio_stream::wrappers::ReceiverStream<Result<Frame<Bytes>, Infallible>>>,
>;

async fn answer(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let at = Instant::now();
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let target = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str().to_string())
        .unwrap_or_default();
    let breach = {
        let mut arrivals = state.arrivals.lock().expect("lock");
        arrivals.push(Arrival {
            at,
            method: parts.method.to_string(),
            target: target.clone(),
            headers: parts.headers.clone(),
            body,
        });
        state.limit.is_some_and(|l| breaks(&arrivals, l))
    };
    if breach {
        *state.breaches.lock().expect("lock") += 1;
        return Ok(reply(
            StatusCode::TOO_MANY_REQUESTS,
            Some("1"),
            "{\"error\":\"rate limit exceeded\"}",
        ));
    }
    if parts.uri.path() == "/stream" {
        let (tx, rx) = mpsc::channel(4);
        let st = state.clone();
        tokio::spawn(async move {
            let _ = tx
                .send(Ok(Frame::data(Bytes::from_static(b"first;"))))
                .await;
            // The last chunk waits for the test to have read the first through the proxy.
            let _ = tokio::time::timeout(Duration::from_secs(5), st.stream_gate.notified()).await;
            let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"last")))).await;
        });
        let mut resp = Response::new(http_body_util::Either::Right(StreamBody::new(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )));
        resp.headers_mut()
            .insert("content-type", "text/plain".parse().expect("value"));
        return Ok(resp);
    }
    let behaviour = state.behaviour.lock().expect("lock").clone();
    Ok(match behaviour {
        Behaviour::Ok => geocode(&target),
        Behaviour::TooMany(retry_after) => reply(
            StatusCode::TOO_MANY_REQUESTS,
            Some(retry_after),
            "{\"error\":\"slow down\"}",
        ),
        Behaviour::Slow(d) => {
            tokio::time::sleep(d).await;
            geocode(&target)
        }
        Behaviour::Redirect(location) => {
            let mut resp = reply(StatusCode::FOUND, None, "");
            resp.headers_mut()
                .insert("location", location.parse().expect("location"));
            resp
        }
    })
}

/// Whether the newest arrival puts some window over the limit.
fn breaks(arrivals: &[Arrival], l: OwnLimit) -> bool {
    let Some(last) = arrivals.last() else {
        return false;
    };
    let n = arrivals.len();
    arrivals.iter().enumerate().any(|(i, a)| {
        let len = last.at.saturating_duration_since(a.at).as_secs_f64();
        (n - i) as f64 > l.capacity + l.rate * (len + l.jitter.as_secs_f64()) + 1e-9
    })
}

fn geocode(target: &str) -> Response<Body> {
    let body = serde_json::json!([{
        "lat": "51.5073",
        "lon": "-0.1277",
        "display_name": "London, Greater London, England, United Kingdom",
        "query": target,
    }]);
    reply(StatusCode::OK, None, &body.to_string())
}

fn reply(status: StatusCode, retry_after: Option<&str>, body: &str) -> Response<Body> {
    let mut resp = Response::new(http_body_util::Either::Left(Full::new(Bytes::from(
        body.to_string(),
    ))));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert("content-type", "application/json".parse().expect("value"));
    // A hop-by-hop header the proxy must not pass back.
    h.insert("keep-alive", "timeout=5".parse().expect("value"));
    h.insert("x-provider", "fake".parse().expect("value"));
    if let Some(r) = retry_after {
        h.insert("retry-after", r.parse().expect("value"));
    }
    resp
}
