//! A small HTTP/1.1 load generator for `bench/run`, loopback only.
//!
//! - `closed`: C keep-alive connections, each sending its next GET as soon as the last answer is read,
//!   for a fixed time. No request starts after the deadline; those in flight then finish and count.
//!   Prints one `key=value` line: requests, ok (2xx), non2xx, errors, rps, p50_us, p99_us. It is the
//!   fallback when `wrk` is not installed, and the callers of the contended-rate step.
//! - `held`: N connections opened first (idle), then one GET each, all held by tollgate at once (two
//!   priming requests of cost = capacity put the bucket's next slot `capacity / rate` seconds away
//!   first), then released at the bucket's rate. Watches the admin `/metrics` for `tollgate_held_requests` and the proxy's
//!   `/proc/PID` for memory and CPU. Prints one `key=value` line.
//!
//! ```text
//! cargo run --release --example loadgen -- closed --url http://127.0.0.1:8080/p/ --connections 64 --duration 10s
//! cargo run --release --example loadgen -- held --url http://127.0.0.1:8080/p/ --admin 127.0.0.1:9090 \
//!     --pid 1234 --requests 10000 --prime-cost 100000
//! ```

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};
use tokio::time::{sleep, sleep_until, timeout, Instant};

#[derive(Parser)]
#[command(about = "HTTP/1.1 load for tollgate's benchmarks (loopback only)")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Closed loop: fixed connections, each sending its next request when the last one is answered.
    Closed {
        /// The URL to GET (http://127.0.0.1:PORT/path).
        #[arg(long)]
        url: String,
        /// Connections (and so requests in flight).
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// How long requests are started for.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Requests answered within this first part of the duration are not counted.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        warmup: Duration,
    },
    /// Held load: many connections, one request each, all held at once.
    Held {
        /// The URL to GET through tollgate.
        #[arg(long)]
        url: String,
        /// tollgate's admin listener (host:port), for `/metrics`.
        #[arg(long)]
        admin: SocketAddr,
        /// tollgate's process id, for /proc/PID/status and /proc/PID/stat.
        #[arg(long)]
        pid: u32,
        /// Requests (one connection each).
        #[arg(long, default_value_t = 10_000)]
        requests: usize,
        /// Cost of the two priming requests: the bucket's capacity.
        #[arg(long)]
        prime_cost: f64,
        /// Connects in progress at once.
        #[arg(long, default_value_t = 128)]
        connect_concurrency: usize,
        /// Connections opened before waiting for the proxy to accept them (keeps its accept queue,
        /// 1024 deep by default, from overflowing).
        #[arg(long, default_value_t = 500)]
        connect_batch: usize,
        /// How long CPU is sampled while everything is held.
        #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
        cpu_window: Duration,
        /// Give up waiting for answers after this long.
        #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
        deadline: Duration,
    },
}

/// Where to send requests: the socket address and the request target.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    host: String,
    path: String,
}

impl Target {
    fn parse(url: &str) -> Result<Target, String> {
        let uri: Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("{url}: only http:// URLs"));
        }
        let authority = uri.authority().ok_or(format!("{url}: no host"))?;
        let addr: SocketAddr = format!("{}:{}", authority.host(), uri.port_u16().unwrap_or(80))
            .parse()
            .map_err(|e| format!("{url}: the host must be an IP address: {e}"))?;
        if !addr.ip().is_loopback() {
            return Err(format!("{url}: loopback addresses only"));
        }
        Ok(Target {
            addr,
            host: authority.as_str().to_string(),
            path: uri
                .path_and_query()
                .map_or("/".to_string(), |p| p.as_str().to_string()),
        })
    }

    fn request(&self, cost: Option<f64>) -> Request<Empty<Bytes>> {
        let mut builder = Request::get(self.path.as_str()).header(http::header::HOST, &self.host);
        if let Some(cost) = cost {
            builder = builder.header("x-tollgate-cost", cost.to_string());
        }
        builder
            .body(Empty::new())
            .expect("a GET with valid headers")
    }
}

async fn connect(target: &Target) -> Result<SendRequest<Empty<Bytes>>, String> {
    let stream = TcpStream::connect(target.addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// Sends one request and reads the whole answer; returns its status.
async fn exchange(
    sender: &mut SendRequest<Empty<Bytes>>,
    request: Request<Empty<Bytes>>,
) -> Result<StatusCode, String> {
    sender.ready().await.map_err(|e| format!("ready: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = response.status();
    response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?;
    Ok(status)
}

#[derive(Default)]
struct Tally {
    requests: u64,
    ok: u64,
    non2xx: u64,
    errors: u64,
    latencies_us: Vec<u32>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.ok += other.ok;
        self.non2xx += other.non2xx;
        self.errors += other.errors;
        self.latencies_us.extend(other.latencies_us);
    }
}

fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

async fn closed(target: Target, connections: usize, duration: Duration, warmup: Duration) {
    let start = Instant::now();
    let counted_from = start + warmup;
    let deadline = start + duration;
    let target = Arc::new(target);
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let target = target.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut sender = None;
                while Instant::now() < deadline {
                    let s = match sender.as_mut() {
                        Some(s) => s,
                        None => match connect(&target).await {
                            Ok(s) => sender.insert(s),
                            Err(_) => {
                                tally.errors += 1;
                                sleep(Duration::from_millis(10)).await;
                                continue;
                            }
                        },
                    };
                    let sent = Instant::now();
                    let result = exchange(s, target.request(None)).await;
                    let done = Instant::now();
                    let counted = sent >= counted_from;
                    match result {
                        Ok(status) if counted => {
                            tally.requests += 1;
                            if status.is_success() {
                                tally.ok += 1;
                            } else {
                                tally.non2xx += 1;
                            }
                            let us = (done - sent).as_micros();
                            tally
                                .latencies_us
                                .push(u32::try_from(us).unwrap_or(u32::MAX));
                        }
                        Ok(_) => {}
                        Err(_) => {
                            if counted {
                                tally.errors += 1;
                            }
                            sender = None;
                        }
                    }
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        total.merge(task.await.expect("a load task"));
    }
    let window = deadline
        .saturating_duration_since(counted_from)
        .as_secs_f64();
    total.latencies_us.sort_unstable();
    println!(
        "requests={} ok={} non2xx={} errors={} rps={:.1} p50_us={} p99_us={}",
        total.requests,
        total.ok,
        total.non2xx,
        total.errors,
        total.requests as f64 / window,
        percentile(&total.latencies_us, 50.0),
        percentile(&total.latencies_us, 99.0),
    );
}

/// A field of /proc/PID/status in kB (VmRSS, VmHWM).
fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// File descriptors `pid` has open (its sockets, mostly).
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// utime + stime of /proc/PID/stat, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start at state, field 3.
    let after = text.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn clock_ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// The sum of every `tollgate_held_requests{...}` sample in the admin `/metrics`.
async fn held_now(admin: &Target) -> Result<u64, String> {
    let mut sender = connect(admin).await?;
    sender.ready().await.map_err(|e| format!("ready: {e}"))?;
    let response = sender
        .send_request(admin.request(None))
        .await
        .map_err(|e| format!("metrics: {e}"))?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("metrics body: {e}"))?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    Ok(text
        .lines()
        .filter(|l| l.starts_with("tollgate_held_requests{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

/// CPU use of `pid` between two samples, in percent of one core.
struct CpuSample {
    at: Instant,
    ticks: u64,
}

impl CpuSample {
    fn take(pid: u32) -> Option<CpuSample> {
        Some(CpuSample {
            at: Instant::now(),
            ticks: cpu_ticks(pid)?,
        })
    }

    fn percent_since(&self, earlier: &CpuSample, hz: f64) -> f64 {
        let secs = (self.at - earlier.at).as_secs_f64().max(1e-9);
        (self.ticks.saturating_sub(earlier.ticks)) as f64 / hz / secs * 100.0
    }
}

#[allow(clippy::too_many_arguments)]
async fn held(
    target: Target,
    admin: SocketAddr,
    pid: u32,
    requests: usize,
    prime_cost: f64,
    connect_concurrency: usize,
    connect_batch: usize,
    cpu_window: Duration,
    deadline: Duration,
) {
    let hz = clock_ticks_per_second();
    let admin = Target {
        addr: admin,
        host: admin.to_string(),
        path: "/metrics".to_string(),
    };
    let start = Instant::now();
    let give_up = start + deadline;
    let rss_before = proc_status_kb(pid, "VmRSS").unwrap_or(0);
    let fds_before = open_fds(pid);

    // First the connections, each then waiting for the go: memory with connections open but idle.
    // They are opened in batches, each waiting (bounded) until the proxy has accepted the previous
    // ones: a connect completes in the kernel before the proxy accepts it, and an unpaced burst of
    // thousands overflows the listener's accept queue (see `listen_overflows` in bench/run).
    let connects = Arc::new(Semaphore::new(connect_concurrency));
    let connected = Arc::new(AtomicUsize::new(0));
    let slow_connects = Arc::new(AtomicUsize::new(0));
    let (go, ready) = watch::channel(false);
    let mut tasks = Vec::with_capacity(requests);
    let mut accept_waits_timed_out = 0u32;
    while tasks.len() < requests {
        let batch = connect_batch.min(requests - tasks.len());
        for _ in 0..batch {
            let target = target.clone();
            let connects = connects.clone();
            let connected = connected.clone();
            let slow = slow_connects.clone();
            let mut ready = ready.clone();
            tasks.push(tokio::spawn(async move {
                let permit = connects.acquire_owned().await.expect("semaphore open");
                let began = Instant::now();
                let sender = connect(&target).await;
                drop(permit);
                // Over half a second on loopback: the SYN was dropped (full accept queue) and resent.
                if began.elapsed() > Duration::from_millis(500) {
                    slow.fetch_add(1, Ordering::AcqRel);
                }
                connected.fetch_add(1, Ordering::AcqRel);
                let _ = ready.wait_for(|go| *go).await;
                let result = match sender {
                    Ok(mut s) => timeout(
                        give_up.saturating_duration_since(Instant::now()),
                        exchange(&mut s, target.request(None)),
                    )
                    .await
                    .unwrap_or_else(|_| Err("no answer before the deadline".to_string())),
                    Err(e) => Err(e),
                };
                (result, Instant::now())
            }));
        }
        let wait_until = Instant::now() + Duration::from_secs(5);
        while (connected.load(Ordering::Acquire) < tasks.len()
            || open_fds(pid) < fds_before + tasks.len())
            && Instant::now() < wait_until
        {
            sleep(Duration::from_millis(50)).await;
        }
        if Instant::now() >= wait_until {
            accept_waits_timed_out += 1;
        }
    }
    let connected_after = (Instant::now() - start).as_secs_f64();
    // The last ones: wait (bounded) until the proxy holds them all.
    let accepted_by = Instant::now() + Duration::from_secs(15);
    while open_fds(pid) < fds_before + requests && Instant::now() < accepted_by {
        sleep(Duration::from_millis(50)).await;
    }
    let accepted_after = (Instant::now() - start).as_secs_f64();
    // A moment more for their first reads.
    sleep(Duration::from_millis(500)).await;
    let rss_connected = proc_status_kb(pid, "VmRSS").unwrap_or(0);
    let proxy_fds = open_fds(pid);

    // Priming: the first takes the whole (full) bucket at once, the second waits capacity / rate.
    let mut first = connect(&target).await.expect("priming connection");
    let status = exchange(&mut first, target.request(Some(prime_cost)))
        .await
        .expect("first priming request");
    assert!(status.is_success(), "first priming request: {status}");
    let primed_target = target.clone();
    let primer = tokio::spawn(async move {
        let mut second = connect(&primed_target).await.expect("priming connection");
        let status = exchange(&mut second, primed_target.request(Some(prime_cost))).await;
        (status, Instant::now())
    });
    // Only once the second one is held (its reservation made) may the others go, or some would
    // take the slots before it.
    let primed_by = Instant::now() + Duration::from_secs(5);
    while held_now(&admin).await.unwrap_or(0) < 1 && Instant::now() < primed_by {
        sleep(Duration::from_millis(10)).await;
    }
    // Then every connection sends its request at once.
    let sent_at = Instant::now();
    go.send_replace(true);

    // Wait until the proxy reports them all held, then sample memory and CPU while they are.
    // RSS is taken whenever the held count reaches a new peak, so it is reported even if not all
    // requests got held before the first release.
    let mut peak = 0u64;
    let mut rss_holding = 0;
    let mut all_held_at = None;
    let mut held_after = f64::NAN;
    while Instant::now() < give_up && !primer.is_finished() {
        let held = held_now(&admin).await.unwrap_or(0);
        if held > peak {
            peak = held;
            rss_holding = proc_status_kb(pid, "VmRSS").unwrap_or(0);
        }
        if held >= requests as u64 {
            all_held_at = Some(Instant::now());
            held_after = (Instant::now() - sent_at).as_secs_f64();
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    let mut cpu_holding = f64::NAN;
    if let Some(at) = all_held_at {
        let before = CpuSample::take(pid);
        sleep_until(at + cpu_window).await;
        let after = CpuSample::take(pid);
        let still = held_now(&admin).await.unwrap_or(0);
        peak = peak.max(still);
        rss_holding = rss_holding.max(proc_status_kb(pid, "VmRSS").unwrap_or(0));
        if let (Some(b), Some(a)) = (before, after) {
            // Only a window with every request still held counts as "CPU while holding".
            if still >= requests as u64 {
                cpu_holding = a.percent_since(&b, hz);
            }
        }
    }

    let (primer_status, released_at) = primer.await.expect("priming task");
    let release_cpu_from = CpuSample::take(pid);
    let primer_ok = primer_status.is_ok_and(|s| s.is_success());
    let mut ok = 0u64;
    let mut non2xx = 0u64;
    let mut errors = 0u64;
    let mut first_error = None;
    let mut last_done = released_at;
    for task in tasks {
        let (result, done) = task.await.expect("a held request task");
        match result {
            Ok(s) if s.is_success() => ok += 1,
            Ok(_) => non2xx += 1,
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e);
            }
        }
        last_done = last_done.max(done);
    }
    let release_cpu_to = CpuSample::take(pid);
    let cpu_release = match (release_cpu_to, release_cpu_from) {
        (Some(a), Some(b)) => a.percent_since(&b, hz),
        _ => f64::NAN,
    };
    println!(
        "requests={requests} ok={ok} non2xx={non2xx} errors={errors} primer_ok={primer_ok} \
         connected_after_s={connected_after:.2} accepted_after_s={accepted_after:.2} proxy_fds={proxy_fds} \
         accept_waits_timed_out={accept_waits_timed_out} slow_connects={} held_peak={peak} \
         all_held_after_s={held_after:.2} rss_before_kb={rss_before} rss_connected_kb={rss_connected} \
         rss_holding_kb={rss_holding} vmhwm_kb={} cpu_holding_pct={cpu_holding:.1} release_s={:.3} \
         cpu_release_pct={cpu_release:.1}",
        slow_connects.load(Ordering::Acquire),
        proc_status_kb(pid, "VmHWM").unwrap_or(0),
        (last_done - released_at).as_secs_f64(),
    );
    if let Some(e) = first_error {
        eprintln!("loadgen held: first error: {e}");
    }
}

fn main() {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    match cli.mode {
        Mode::Closed {
            url,
            connections,
            duration,
            warmup,
        } => {
            let target = Target::parse(&url).unwrap_or_else(|e| panic!("--url {e}"));
            runtime.block_on(closed(target, connections, duration, warmup));
        }
        Mode::Held {
            url,
            admin,
            pid,
            requests,
            prime_cost,
            connect_concurrency,
            connect_batch,
            cpu_window,
            deadline,
        } => {
            let target = Target::parse(&url).unwrap_or_else(|e| panic!("--url {e}"));
            assert!(
                admin.ip().is_loopback(),
                "--admin must be a loopback address"
            );
            runtime.block_on(held(
                target,
                admin,
                pid,
                requests,
                prime_cost,
                connect_concurrency,
                connect_batch,
                cpu_window,
                deadline,
            ));
        }
    }
}
