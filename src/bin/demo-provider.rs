//! `demo-provider`: a stand-in geocoding API (`GET /search?q=...` → JSON) with a strict limit of its own.
//!
//! It records when each request arrives, answers 429 to any request that would put some window over
//! `capacity + rate × (T + jitter)` (the exact check the tests use), and on SIGTERM/SIGINT or after
//! `--duration` prints a report: one line per second with a bar of the requests received, the limit
//! marked, and a summary. `GET /report` serves the same report while it runs; `GET /healthz` answers 200.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tollgate::config::Limit;

#[derive(Parser)]
#[command(
    version,
    about = "A demo geocoding API with a strict limit of its own; prints a per-second report on exit"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// The provider's limit: requests per second.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// The burst it tolerates, in requests (at least 1).
    #[arg(long, default_value_t = 10.0)]
    capacity: f64,
    /// Delivery-jitter allowance added to every window, e.g. "10ms" (default: none, the strictest).
    #[arg(long, default_value = "0ms", value_parser = humantime::parse_duration)]
    jitter: Duration,
    /// Refused requests count against the limit too (by default only served ones do).
    #[arg(long)]
    count_refused: bool,
    /// Print the report and exit after this long, e.g. "60s" (default: run until SIGTERM/SIGINT).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
}

/// The provider's limit as configured.
#[derive(Debug, Clone, Copy)]
struct OwnLimit {
    rate: f64,
    capacity: f64,
    jitter: f64,
    count_refused: bool,
}

/// One request as received: seconds since the provider started, and whether it was refused.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at: f64,
    refused: bool,
}

/// Every arrival plus the running state of the exact window check.
#[derive(Debug)]
struct Recorder {
    limit: OwnLimit,
    arrivals: Vec<Arrival>,
    /// Over the arrivals that count so far: the largest `count − rate × length` of any window ending at
    /// the last of them, and when that was.
    level: f64,
    last: Option<f64>,
}

impl Recorder {
    fn new(limit: OwnLimit) -> Recorder {
        Recorder {
            limit,
            arrivals: Vec::new(),
            level: 0.0,
            last: None,
        }
    }

    /// Records an arrival at `at` (seconds, non-decreasing) and says whether it breaks the limit.
    ///
    /// Every window `[t_i, t_k]` must hold `k − i + 1 ≤ capacity + rate × (t_k − t_i + jitter)`. With
    /// `L_k = max_i (k − i + 1 − rate × (t_k − t_i))`, `L_k = max(1, L_{k−1} + 1 − rate × (t_k − t_{k−1}))`,
    /// so checking the newest arrival against all earlier ones is one step.
    fn arrive(&mut self, at: f64) -> bool {
        let l = self.limit;
        let candidate = match self.last {
            None => 1.0,
            Some(last) => (self.level + 1.0 - l.rate * (at - last).max(0.0)).max(1.0),
        };
        let refused = candidate > l.capacity + l.rate * l.jitter + 1e-9;
        if !refused || l.count_refused {
            self.level = candidate;
            self.last = Some(at.max(self.last.unwrap_or(at)));
        }
        self.arrivals.push(Arrival { at, refused });
        refused
    }
}

/// The most arrivals in any half-open window `[t, t + len)`; `times` sorted.
fn max_in_window(times: &[f64], len: f64) -> usize {
    let mut best = 0;
    let mut start = 0;
    for (end, &t) in times.iter().enumerate() {
        while times[start] <= t - len {
            start += 1;
        }
        best = best.max(end - start + 1);
    }
    best
}

/// Formats a rate or capacity without a needless ".0".
fn num(x: f64) -> String {
    format!("{x}")
}

/// The report: one line per second since the first request, then the summary line.
fn render(limit: OwnLimit, arrivals: &[Arrival]) -> String {
    let mut out = String::new();
    let jitter = if limit.jitter > 0.0 {
        format!(", jitter allowance {} ms", num(limit.jitter * 1000.0))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "demo-provider report: limit {}/s (capacity {}){jitter}",
        num(limit.rate),
        num(limit.capacity)
    );
    let Some(first) = arrivals.first().map(|a| a.at) else {
        let _ = writeln!(out, "(no requests)");
        let _ = writeln!(out, "{}", summary(limit, arrivals));
        return out;
    };
    // One bin per second since the first request: (received, refused).
    let mut bins: Vec<(usize, usize)> = Vec::new();
    for a in arrivals {
        let i = ((a.at - first).max(0.0)) as usize;
        if bins.len() <= i {
            bins.resize(i + 1, (0, 0));
        }
        bins[i].0 += 1;
        bins[i].1 += usize::from(a.refused);
    }
    let busiest = bins.iter().map(|b| b.0).max().unwrap_or(0);
    // Requests per character: 1 unless the busiest second would not fit in 60 columns.
    let per_cell = (busiest.max(limit.rate.ceil() as usize))
        .div_ceil(60)
        .max(1);
    let cells = |n: usize| n.div_ceil(per_cell);
    let limit_col = (limit.rate / per_cell as f64).round() as usize;
    let width = cells(busiest).max(limit_col) + 1;
    let unit = if per_cell == 1 {
        "one request".to_string()
    } else {
        format!("{per_cell} requests")
    };
    let _ = writeln!(
        out,
        "one line per second since the first request; # = {unit} served, x = {unit} refused with 429,\n\
         | = the limit of {r} per second (after idle time it also accepts a burst of up to {c})",
        r = num(limit.rate),
        c = num(limit.capacity)
    );
    for (second, &(received, refused)) in bins.iter().enumerate() {
        let total = cells(received);
        let served = cells(received - refused).min(total);
        let mut bar: Vec<char> = std::iter::repeat_n('#', served)
            .chain(std::iter::repeat_n('x', total - served))
            .collect();
        if bar.len() < limit_col {
            bar.resize(limit_col, ' ');
        }
        bar.insert(limit_col, '|');
        bar.resize(width, ' ');
        let bar: String = bar.into_iter().collect();
        let note = if refused > 0 {
            format!("  ({refused} refused)")
        } else {
            String::new()
        };
        let _ = writeln!(out, "{second:>4}s {bar} {received:>4}{note}");
    }
    let _ = writeln!(out, "{}", summary(limit, arrivals));
    out
}

/// `received N requests in T s, limit R/s (capacity C): max in any 1 s window = X, breaches = B`.
fn summary(limit: OwnLimit, arrivals: &[Arrival]) -> String {
    let times: Vec<f64> = arrivals.iter().map(|a| a.at).collect();
    let span = match (times.first(), times.last()) {
        (Some(a), Some(b)) => b - a,
        _ => 0.0,
    };
    format!(
        "received {} requests in {:.1} s, limit {}/s (capacity {}): max in any 1 s window = {}, breaches = {}",
        arrivals.len(),
        span,
        num(limit.rate),
        num(limit.capacity),
        max_in_window(&times, 1.0),
        arrivals.iter().filter(|a| a.refused).count()
    )
}

struct State {
    start: Instant,
    recorder: Mutex<Recorder>,
}

impl State {
    fn report(&self) -> String {
        match self.recorder.lock() {
            Ok(r) => render(r.limit, &r.arrivals),
            Err(poisoned) => {
                let r = poisoned.into_inner();
                render(r.limit, &r.arrivals)
            }
        }
    }
}

type Body = Full<Bytes>;

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    reply(status, "application/json", value.to_string())
}

/// A few places and where they are; anything else is not found (`[]`).
const PLACES: &[(&str, &str, &str)] = &[
    ("London, England, United Kingdom", "51.5073", "-0.1277"),
    ("Paris, Ile-de-France, France", "48.8535", "2.3484"),
    ("Berlin, Germany", "52.5170", "13.3889"),
    ("Madrid, Community of Madrid, Spain", "40.4167", "-3.7036"),
    ("Rome, Lazio, Italy", "41.8933", "12.4829"),
    ("Vienna, Austria", "48.2084", "16.3725"),
    ("Lisbon, Portugal", "38.7078", "-9.1366"),
    ("Dublin, Leinster, Ireland", "53.3494", "-6.2606"),
    ("Amsterdam, North Holland, Netherlands", "52.3731", "4.8924"),
    ("Prague, Czechia", "50.0875", "14.4213"),
];

/// The value of `name` in a query string, percent-decoded (`+` as space); invalid escapes kept as written.
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| percent_decode(value))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn geocode(query: &str) -> Response<Body> {
    let q = query_param(query, "q").unwrap_or_default();
    let wanted = q.trim().to_lowercase();
    let hits: Vec<serde_json::Value> = PLACES
        .iter()
        .filter(|(name, _, _)| {
            !wanted.is_empty() && name.to_lowercase().split(',').next() == Some(wanted.as_str())
        })
        .map(|(name, lat, lon)| serde_json::json!({"lat": lat, "lon": lon, "display_name": name}))
        .collect();
    json(StatusCode::OK, &serde_json::Value::Array(hits))
}

async fn answer(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path();
    if req.method() == Method::GET && path == "/healthz" {
        return Ok(reply(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "ok\n".into(),
        ));
    }
    if req.method() == Method::GET && path == "/report" {
        return Ok(reply(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            state.report(),
        ));
    }
    // Everything else counts against the limit, as at a real provider.
    // The time is read under the lock so that arrivals are recorded in order.
    let refused = match state.recorder.lock() {
        Ok(mut r) => r.arrive(state.start.elapsed().as_secs_f64()),
        Err(poisoned) => poisoned
            .into_inner()
            .arrive(state.start.elapsed().as_secs_f64()),
    };
    if refused {
        let mut resp = json(
            StatusCode::TOO_MANY_REQUESTS,
            &serde_json::json!({"error": "rate limit exceeded"}),
        );
        resp.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        return Ok(resp);
    }
    Ok(match (req.method(), path) {
        (&Method::GET, "/search") => geocode(req.uri().query().unwrap_or("")),
        _ => json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "not found", "message": "try GET /search?q=London"}),
        ),
    })
}

/// Resolves when the run should end: SIGTERM/SIGINT, or `duration` elapsed.
async fn stop(duration: Option<Duration>) {
    let timer = async {
        match duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = tollgate::app::shutdown_signal() => {},
        () = timer => {},
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let limit = match Limit::new(args.rate, args.capacity) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("demo-provider: --rate/--capacity: {e}");
            return ExitCode::from(2);
        }
    };
    let limit = OwnLimit {
        rate: limit.rate(),
        capacity: limit.capacity(),
        jitter: args.jitter.as_secs_f64(),
        count_refused: args.count_refused,
    };
    let listener = match TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("demo-provider: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = listener.local_addr().unwrap_or(args.listen);
    let state = Arc::new(State {
        start: Instant::now(),
        recorder: Mutex::new(Recorder::new(limit)),
    });
    eprintln!(
        "demo-provider: listening on http://{addr}, limit {}/s (capacity {}); GET /search?q=London, /report, /healthz",
        num(limit.rate),
        num(limit.capacity)
    );
    let accept = {
        let state = state.clone();
        async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let state = state.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| answer(state.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        }
    };
    tokio::select! {
        () = accept => {},
        () = stop(args.duration) => {},
    }
    print!("{}", state.report());
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rate: f64, capacity: f64) -> OwnLimit {
        OwnLimit {
            rate,
            capacity,
            jitter: 0.0,
            count_refused: false,
        }
    }

    /// The check the tests use (tests/support/window.rs): every pair of arrivals.
    fn brute_force_breaks(times: &[f64], l: OwnLimit) -> bool {
        let last = times.len() - 1;
        (0..=last).any(|i| {
            (last - i + 1) as f64 > l.capacity + l.rate * (times[last] - times[i] + l.jitter) + 1e-9
        })
    }

    #[test]
    fn burst_over_capacity_is_refused() {
        let mut r = Recorder::new(limit(10.0, 3.0));
        let refused: Vec<bool> = [0.0, 0.0, 0.0, 0.0, 0.1, 0.2, 0.3]
            .iter()
            .map(|&t| r.arrive(t))
            .collect();
        assert_eq!(refused, [false, false, false, true, false, false, false]);
    }

    #[test]
    fn one_step_check_matches_every_window_when_refused_count() {
        // Arrivals that sometimes come too fast; with count_refused every arrival is in the set checked.
        let l = OwnLimit {
            count_refused: true,
            jitter: 0.01,
            ..limit(5.0, 2.0)
        };
        let mut r = Recorder::new(l);
        let mut t = 0.0;
        let mut times = Vec::new();
        let mut refused = 0;
        for i in 0..300u32 {
            t += f64::from((i * 7919) % 13) * 0.04;
            times.push(t);
            let expected = brute_force_breaks(&times, l);
            assert_eq!(r.arrive(t), expected, "arrival {i}");
            refused += usize::from(expected);
        }
        assert!(
            refused > 10 && refused < 290,
            "{refused} refused: both outcomes tested"
        );
    }

    #[test]
    fn one_step_check_matches_every_window_over_served_requests() {
        let l = limit(4.0, 3.0);
        let mut r = Recorder::new(l);
        let mut t = 0.0;
        let mut served = Vec::new();
        for i in 0..300u32 {
            t += f64::from((i * 104_729) % 11) * 0.02;
            let mut with = served.clone();
            with.push(t);
            let expected = brute_force_breaks(&with, l);
            assert_eq!(r.arrive(t), expected, "arrival {i}");
            if !expected {
                served = with;
            }
        }
        assert!(
            served.len() > 10 && served.len() < 290,
            "{} served: both outcomes tested",
            served.len()
        );
    }

    #[test]
    fn max_in_window_is_half_open() {
        assert_eq!(max_in_window(&[], 1.0), 0);
        assert_eq!(max_in_window(&[0.0, 0.5, 0.99, 1.0, 1.2], 1.0), 4);
        assert_eq!(max_in_window(&[0.0, 1.0, 2.0], 1.0), 1);
    }

    #[test]
    fn report_marks_the_limit_and_refusals() {
        let mut r = Recorder::new(limit(4.0, 4.0));
        for i in 0..12 {
            r.arrive(f64::from(i) * 0.05);
        }
        for i in 0..4 {
            r.arrive(1.0 + f64::from(i) * 0.25);
        }
        let text = render(r.limit, &r.arrivals);
        let lines: Vec<&str> = text.lines().collect();
        // Served at 0, .05, .1, .15 (the burst), then .25 and .5 as the limit refills.
        assert_eq!(lines[3], "   0s ####|##xxxxxx   12  (6 refused)", "{text}");
        assert_eq!(lines[4], "   1s ####|            4", "{text}");
        assert_eq!(
            lines[5],
            "received 16 requests in 1.8 s, limit 4/s (capacity 4): max in any 1 s window = 12, breaches = 6"
        );
    }

    #[test]
    fn query_is_decoded() {
        assert_eq!(
            query_param("format=json&q=New+York%2C%20NY", "q").as_deref(),
            Some("New York, NY")
        );
        assert_eq!(query_param("q=100%", "q").as_deref(), Some("100%"));
        assert_eq!(query_param("q=%zz", "q").as_deref(), Some("%zz"));
        assert_eq!(query_param("format=json", "q"), None);
    }
}
