//! The swarm: many concurrent clients looping requests through one or more tollgate replicas for a
//! bounded time, then the provider's arrivals checked against the sliding-window bound.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::client::{client, get};
use super::fake_provider::FakeProvider;
use super::window::{self, WindowReport};

/// Delivery-jitter allowance: a request released on its slot may reach the provider this much later
/// than the one after it (scheduling on a loaded 2-core machine).
pub const JITTER: Duration = Duration::from_millis(10);

/// What a swarm run saw.
#[derive(Debug)]
pub struct SwarmRun {
    /// Every status the clients got.
    pub statuses: Vec<u16>,
    /// The exact window check at the provider.
    pub report: WindowReport,
    /// Arrivals ÷ what the bucket allowed from start to the last arrival.
    pub utilisation: f64,
    /// From start to the last arrival.
    pub span: Duration,
}

impl SwarmRun {
    /// Requests the clients sent.
    pub fn requests(&self) -> usize {
        self.statuses.len()
    }

    /// Answers in the 5xx range.
    pub fn server_errors(&self) -> usize {
        self.statuses.iter().filter(|s| **s >= 500).count()
    }
}

/// Runs `clients` loops for `duration`, client i through `urls[i % urls.len()]`, and checks the
/// provider's arrivals against `capacity + rate*(T + JITTER)`.
pub async fn run(
    provider: &FakeProvider,
    urls: &[String],
    clients: usize,
    duration: Duration,
    rate: f64,
    capacity: f64,
) -> SwarmRun {
    let before = provider.arrivals().len();
    let start = Instant::now();
    let stop_at = start + duration;
    let mut tasks = Vec::new();
    for i in 0..clients {
        let c = client();
        let url = Arc::new(urls[i % urls.len()].clone());
        tasks.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            while Instant::now() < stop_at {
                statuses.push(get(&c, &url, &[]).await.status.as_u16());
            }
            statuses
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.extend(t.await.expect("client"));
    }
    let times: Vec<Duration> = provider.arrival_times()[before..]
        .iter()
        .map(|a| a.saturating_duration_since(start))
        .collect();
    let report = window::check(&times, rate, capacity, JITTER);
    let span = times.iter().max().copied().unwrap_or_default();
    let utilisation = times.len() as f64 / (capacity + rate * span.as_secs_f64());
    if std::env::var_os("TOLLGATE_DUMP_ARRIVALS").is_some() {
        let mut ms: Vec<u128> = times.iter().map(|t| t.as_millis()).collect();
        ms.sort();
        let _ = std::fs::write("/tmp/arrivals.txt", format!("{ms:?}"));
    }
    let run = SwarmRun {
        statuses,
        report,
        utilisation,
        span,
    };
    eprintln!(
        "swarm: {} requests, {} arrivals over {:.3}s; worst window {} in {:?} from {:?} vs bound {:.2} (excess {:+.2}); utilisation {:.3}; 5xx {}",
        run.requests(),
        times.len(),
        span.as_secs_f64(),
        report.worst_count,
        report.worst_len,
        report.worst_start,
        report.worst_bound,
        report.max_excess,
        utilisation,
        run.server_errors()
    );
    run
}
