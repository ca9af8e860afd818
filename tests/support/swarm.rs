//! The swarm: many concurrent clients looping requests through one or more tollgate replicas for a
//! bounded time, then the provider's arrivals checked against the sliding-window bound.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::client::{client, get, TestClient};
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
    /// Requests sent while warming up, before the measured run.
    pub warm_up: usize,
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
    Swarm::warm(provider, urls, clients, rate, capacity)
        .await
        .run(duration)
        .await
}

/// A swarm whose connections are open and warm (client → tollgate → provider), its bucket full again.
pub struct Swarm<'a> {
    provider: &'a FakeProvider,
    clients: Vec<(TestClient, Arc<String>)>,
    rate: f64,
    capacity: f64,
}

impl<'a> Swarm<'a> {
    /// Sends one request per client (opening every connection the run will use), then waits until the
    /// bucket is full again: cold TCP connects would otherwise delay parts of the opening burst by
    /// several ms, which is the test's set-up, not tollgate's timing.
    pub async fn warm(
        provider: &'a FakeProvider,
        urls: &[String],
        clients: usize,
        rate: f64,
        capacity: f64,
    ) -> Swarm<'a> {
        let clients: Vec<(TestClient, Arc<String>)> = (0..clients)
            .map(|i| (client(), Arc::new(urls[i % urls.len()].clone())))
            .collect();
        let warm: Vec<_> = clients
            .iter()
            .map(|(c, url)| {
                let (c, url) = (c.clone(), url.clone());
                tokio::spawn(async move { get(&c, &url, &[]).await.status })
            })
            .collect();
        for w in warm {
            let _ = w.await;
        }
        tokio::time::sleep(Duration::from_secs_f64(capacity / rate * 2.0 + 0.1)).await;
        Swarm {
            provider,
            clients,
            rate,
            capacity,
        }
    }

    /// Requests sent while warming.
    pub fn warm_up_requests(&self) -> usize {
        self.clients.len()
    }

    /// Loops every client for `duration`, then checks the provider's arrivals.
    pub async fn run(self, duration: Duration) -> SwarmRun {
        let warm_up = self.warm_up_requests();
        let Swarm {
            provider,
            clients,
            rate,
            capacity,
        } = self;
        let before = provider.arrivals().len();
        let start = Instant::now();
        let stop_at = start + duration;
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|(c, url)| {
                tokio::spawn(async move {
                    let mut statuses = Vec::new();
                    while Instant::now() < stop_at {
                        statuses.push(get(&c, &url, &[]).await.status.as_u16());
                    }
                    statuses
                })
            })
            .collect();
        let mut statuses = Vec::new();
        for t in tasks {
            statuses.extend(t.await.expect("client"));
        }
        let mut run = check(provider, before, start, statuses, rate, capacity);
        run.warm_up = warm_up;
        run
    }
}

fn check(
    provider: &FakeProvider,
    before: usize,
    start: Instant,
    statuses: Vec<u16>,
    rate: f64,
    capacity: f64,
) -> SwarmRun {
    let times: Vec<Duration> = provider.arrival_times()[before..]
        .iter()
        .map(|a| a.saturating_duration_since(start))
        .collect();
    let report = window::check(&times, rate, capacity, JITTER);
    let span = times.iter().max().copied().unwrap_or_default();
    let utilisation = times.len() as f64 / (capacity + rate * span.as_secs_f64());
    let run = SwarmRun {
        statuses,
        report,
        utilisation,
        span,
        warm_up: 0,
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
