//! `demo-workers`: a swarm of W concurrent workers calling a geocoding API for D seconds.
//!
//! By default each worker loops `GET {target}/search?q=...` as fast as answers come back, worker i using
//! target i mod n (point them at tollgate replicas; tollgate does the limiting). With `--local-limit R`
//! each worker instead paces itself with its own in-process token bucket at R requests per second and
//! is pointed straight at the provider: the "one local limiter per worker" setup a shared bucket replaces.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;
use tollgate::config::Limit;

#[derive(Parser)]
#[command(
    version,
    about = "A swarm of workers calling a geocoding API, through tollgate or each with its own local limiter"
)]
struct Args {
    /// Base URL to call, e.g. http://127.0.0.1:8080/geo (repeat or comma-separate for several:
    /// worker i uses target i mod n).
    #[arg(long = "target", required = true, value_delimiter = ',')]
    targets: Vec<String>,
    /// Number of concurrent workers.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// How long the workers keep starting requests, e.g. "10s".
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Each worker paces itself with its own token bucket at this many requests per second.
    #[arg(long)]
    local_limit: Option<f64>,
    /// Burst of each worker's own token bucket (with --local-limit).
    #[arg(long, default_value_t = 1.0)]
    local_capacity: f64,
    /// Deadline for one request (tollgate may hold a request up to its max_wait).
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// After the run, fetch this URL (the provider's /report) and print it.
    #[arg(long)]
    report_from: Option<String>,
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// Places the workers look up, in turn.
const PLACES: &[&str] = &[
    "London",
    "Paris",
    "Berlin",
    "Madrid",
    "Rome",
    "Vienna",
    "Lisbon",
    "Dublin",
    "Amsterdam",
    "Prague",
];

/// A worker's own token bucket (the local limiter).
struct LocalBucket {
    limit: Limit,
    tokens: f64,
    at: Instant,
}

impl LocalBucket {
    fn new(limit: Limit) -> LocalBucket {
        LocalBucket {
            limit,
            tokens: limit.capacity(),
            at: Instant::now(),
        }
    }

    /// Waits until a token is available and takes it.
    async fn take(&mut self) {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.limit.rate()).min(self.limit.capacity());
        self.at = now;
        if self.tokens < 1.0 {
            let wait = (1.0 - self.tokens) / self.limit.rate();
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
            self.tokens = 1.0;
            self.at = Instant::now();
        }
        self.tokens -= 1.0;
    }
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    first_error: Option<String>,
    latency: Duration,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.latency += other.latency;
    }

    fn answered(&self) -> u64 {
        self.statuses.values().sum()
    }
}

/// Checks a base URL: plain http with a host (the workers speak no TLS), no query.
fn parse_target(text: &str) -> Result<String, String> {
    let base = text.trim().trim_end_matches('/');
    let uri: Uri = base
        .parse()
        .map_err(|e| format!("--target {text:?}: not a URL ({e})"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        return Err(format!(
            "--target {text:?}: must be an http:// URL with a host"
        ));
    }
    if uri.query().is_some() {
        return Err(format!("--target {text:?}: must not have a query"));
    }
    Ok(base.to_string())
}

/// One GET; the status, or why there was none.
async fn get(client: &HttpClient, url: &str, timeout: Duration) -> Result<u16, String> {
    let uri: Uri = url.parse().map_err(|e| format!("bad URL {url:?}: {e}"))?;
    let request = async {
        let resp = client.get(uri).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        // Read the whole body so the connection can be reused.
        resp.into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(status)
    };
    tokio::time::timeout(timeout, request)
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
}

async fn worker(
    index: usize,
    base: String,
    stop_at: Instant,
    mut bucket: Option<LocalBucket>,
    timeout: Duration,
) -> Tally {
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let mut tally = Tally::default();
    let mut n = index;
    while Instant::now() < stop_at {
        if let Some(bucket) = bucket.as_mut() {
            bucket.take().await;
            if Instant::now() >= stop_at {
                break;
            }
        }
        let url = format!("{base}/search?q={}&format=json", PLACES[n % PLACES.len()]);
        n += 1;
        let started = Instant::now();
        match get(&client, &url, timeout).await {
            Ok(status) => {
                *tally.statuses.entry(status).or_default() += 1;
                tally.latency += started.elapsed();
            }
            Err(e) => {
                tally.errors += 1;
                tally.first_error.get_or_insert(e);
                // An unreachable target answers at once; do not spin on it.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    tally
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let targets: Vec<String> = match args.targets.iter().map(|t| parse_target(t)).collect() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("demo-workers: {e}");
            return ExitCode::from(2);
        }
    };
    if args.workers == 0 {
        eprintln!("demo-workers: --workers must be at least 1");
        return ExitCode::from(2);
    }
    let local = match args.local_limit {
        None => None,
        Some(rate) => match Limit::new(rate, args.local_capacity) {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("demo-workers: --local-limit/--local-capacity: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let how = match local {
        Some(l) => format!(
            "each pacing itself with its own token bucket at {}/s (capacity {})",
            l.rate(),
            l.capacity()
        ),
        None => "as fast as answers come back (the limiting is the target's job)".to_string(),
    };
    println!(
        "demo-workers: {} workers for {:?}, {how}, against {}",
        args.workers,
        args.duration,
        targets.join(" and ")
    );

    let start = Instant::now();
    let stop_at = start + args.duration;
    let tasks: Vec<_> = (0..args.workers)
        .map(|i| {
            tokio::spawn(worker(
                i,
                targets[i % targets.len()].clone(),
                stop_at,
                local.map(LocalBucket::new),
                args.timeout,
            ))
        })
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        match task.await {
            Ok(tally) => total.add(tally),
            Err(e) => {
                total.errors += 1;
                total
                    .first_error
                    .get_or_insert(format!("worker failed: {e}"));
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let answered = total.answered();
    let statuses: Vec<String> = total
        .statuses
        .iter()
        .map(|(status, n)| format!("{status} x{n}"))
        .collect();
    let mean_ms = if answered > 0 {
        total.latency.as_secs_f64() * 1000.0 / answered as f64
    } else {
        0.0
    };
    println!(
        "demo-workers: {} answers in {elapsed:.1} s ({:.1}/s): {}; errors {}; mean latency {mean_ms:.0} ms",
        answered,
        answered as f64 / elapsed.max(1e-9),
        if statuses.is_empty() {
            "none".to_string()
        } else {
            statuses.join(", ")
        },
        total.errors,
    );
    if let Some(e) = &total.first_error {
        println!("demo-workers: first error: {e}");
    }

    if let Some(url) = &args.report_from {
        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let report = async {
            let uri: Uri = url.parse().map_err(|e| format!("bad URL {url:?}: {e}"))?;
            let resp = client.get(uri).await.map_err(|e| e.to_string())?;
            let body = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(String::from_utf8_lossy(&body.to_bytes()).into_owned())
        };
        match tokio::time::timeout(Duration::from_secs(5), report).await {
            Ok(Ok(text)) => print!("\n{text}"),
            Ok(Err(e)) => eprintln!("demo-workers: cannot fetch the report from {url}: {e}"),
            Err(_) => eprintln!("demo-workers: no report from {url} within 5 s"),
        }
    }

    if answered == 0 {
        eprintln!("demo-workers: no request got an answer");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_must_be_plain_http_base_urls() {
        assert_eq!(
            parse_target("http://tollgate-a:8080/geo/").as_deref(),
            Ok("http://tollgate-a:8080/geo")
        );
        assert!(parse_target("https://api.example/geo").is_err());
        assert!(parse_target("tollgate:8080").is_err());
        assert!(parse_target("http://h/geo?x=1").is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn local_bucket_paces_at_its_rate() {
        let limit = Limit::new(10.0, 1.0).expect("limit");
        let mut bucket = LocalBucket::new(limit);
        let start = Instant::now();
        for _ in 0..11 {
            bucket.take().await;
        }
        // One at once, then one every 100 ms.
        let elapsed = start.elapsed();
        assert!(
            elapsed >= Duration::from_millis(999) && elapsed <= Duration::from_millis(1001),
            "{elapsed:?}"
        );
    }
}
