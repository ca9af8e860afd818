//! Logs (tracing, human or JSON) and the Prometheus metrics registry with its names.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global tracing subscriber; `RUST_LOG` filters (default `info`).
pub fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // try_init: a second call (tests) keeps the first subscriber.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Label set with the bucket only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabel {
    bucket: String,
}

/// Label set for request outcomes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    bucket: String,
    outcome: &'static str,
}

/// Label set for upstream status codes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    bucket: String,
    code: u16,
}

type HistogramFamily = Family<BucketLabel, Histogram, fn() -> Histogram>;

fn wait_histogram() -> Histogram {
    // 1 ms … ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric tollgate exports, registered once.
pub struct Metrics {
    registry: Registry,
    requests: Family<OutcomeLabels, Counter>,
    wait: HistogramFamily,
    upstream_responses: Family<CodeLabels, Counter>,
    upstream_429: Family<BucketLabel, Counter>,
    held: Family<BucketLabel, Gauge>,
    fallback_active: Family<BucketLabel, Gauge>,
    /// Store calls that failed or timed out.
    pub store_errors: Counter,
    /// Store call latency in seconds.
    pub store_seconds: Histogram,
    /// Client connections open on the proxy listener.
    pub connections: Gauge,
}

/// How a request ended, as the `outcome` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Sent upstream and answered.
    Forwarded,
    /// Refused because its slot was past the max wait.
    MaxWait,
    /// Refused because the store was unreachable (fallback closed) or full.
    Unavailable,
    /// The upstream could not be reached or timed out.
    UpstreamError,
    /// The client went away while the request was held.
    Cancelled,
    /// The request can never be served by its bucket (e.g. cost over capacity).
    Rejected,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::MaxWait => "max_wait",
            Outcome::Unavailable => "unavailable",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Cancelled => "cancelled",
            Outcome::Rejected => "rejected",
        }
    }

    const ALL: [Outcome; 6] = [
        Outcome::Forwarded,
        Outcome::MaxWait,
        Outcome::Unavailable,
        Outcome::UpstreamError,
        Outcome::Cancelled,
        Outcome::Rejected,
    ];
}

/// One bucket's metric handles, resolved once at start-up so the request path allocates nothing.
#[derive(Clone)]
pub struct BucketMetrics {
    name: String,
    outcomes: [Counter; 6],
    /// Time requests were held before going upstream.
    pub wait: Histogram,
    /// Upstream 429 answers.
    pub upstream_429: Counter,
    /// Requests held right now.
    pub held: Gauge,
    /// 1 while the bucket runs on the fallback limiter.
    pub fallback_active: Gauge,
    responses: Family<CodeLabels, Counter>,
    /// The 200 answers' counter, resolved once: the common case allocates nothing.
    responses_200: Counter,
}

impl BucketMetrics {
    /// Counts one request outcome.
    pub fn outcome(&self, outcome: Outcome) {
        let i = Outcome::ALL.iter().position(|o| *o == outcome).unwrap_or(0);
        self.outcomes[i].inc();
    }

    /// Counts one upstream answer by status code.
    pub fn upstream_response(&self, code: u16) {
        if code == 200 {
            self.responses_200.inc();
            return;
        }
        self.responses
            .get_or_create(&CodeLabels {
                bucket: self.name.clone(),
                code,
            })
            .inc();
    }
}

impl Metrics {
    /// Registers every metric under its exported name.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "tollgate_requests",
            "Requests by bucket and outcome",
            requests.clone(),
        );
        let wait: HistogramFamily = Family::new_with_constructor(wait_histogram);
        registry.register(
            "tollgate_wait_seconds",
            "Time a request was held before going upstream",
            wait.clone(),
        );
        let upstream_responses = Family::<CodeLabels, Counter>::default();
        registry.register(
            "tollgate_upstream_responses",
            "Upstream answers by status code",
            upstream_responses.clone(),
        );
        let upstream_429 = Family::<BucketLabel, Counter>::default();
        registry.register(
            "tollgate_upstream_429",
            "Upstream 429 answers: the provider says its limit was breached",
            upstream_429.clone(),
        );
        let held = Family::<BucketLabel, Gauge>::default();
        registry.register(
            "tollgate_held_requests",
            "Requests held right now",
            held.clone(),
        );
        let fallback_active = Family::<BucketLabel, Gauge>::default();
        registry.register(
            "tollgate_store_fallback_active",
            "1 while the bucket runs on the fallback limiter",
            fallback_active.clone(),
        );
        let store_errors = Counter::default();
        registry.register(
            "tollgate_store_errors",
            "Store calls that failed or timed out",
            store_errors.clone(),
        );
        let store_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 14));
        registry.register(
            "tollgate_store_seconds",
            "Store call latency",
            store_seconds.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "tollgate_connections",
            "Client connections open on the proxy listener",
            connections.clone(),
        );
        Metrics {
            connections,
            registry,
            requests,
            wait,
            upstream_responses,
            upstream_429,
            held,
            fallback_active,
            store_errors,
            store_seconds,
        }
    }

    /// Resolves (and so exports, at zero) one bucket's metrics.
    pub fn bucket(&self, name: &str) -> BucketMetrics {
        let label = BucketLabel {
            bucket: name.to_string(),
        };
        let outcomes = Outcome::ALL.map(|o| {
            self.requests
                .get_or_create(&OutcomeLabels {
                    bucket: name.to_string(),
                    outcome: o.as_str(),
                })
                .clone()
        });
        BucketMetrics {
            name: name.to_string(),
            outcomes,
            wait: self.wait.get_or_create(&label).clone(),
            upstream_429: self.upstream_429.get_or_create(&label).clone(),
            held: self.held.get_or_create(&label).clone(),
            fallback_active: self.fallback_active.get_or_create(&label).clone(),
            responses: self.upstream_responses.clone(),
            responses_200: self
                .upstream_responses
                .get_or_create(&CodeLabels {
                    bucket: name.to_string(),
                    code: 200,
                })
                .clone(),
        }
    }

    /// The registry in Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The content type of [`Metrics::encode`]'s output.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
