//! Configuration: TOML (plus `TOLLGATE__…` environment overrides) parsed into raw serde structs, then
//! validated once into types that cannot be wrong. Every mistake becomes one [`ConfigError`] line that names
//! the file, the key path and the problem.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use http::uri::{Authority, Scheme};
use http::Uri;
use serde::Deserialize;

/// A configuration mistake: which file, which key, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("{file}: cannot read config: {reason}")]
    Read {
        /// The config file's path.
        file: String,
        /// Why it could not be read.
        reason: String,
    },
    /// The file is not valid TOML.
    #[error("{file}: invalid TOML: {reason}")]
    Syntax {
        /// The config file's path.
        file: String,
        /// The parser's message (it names the line).
        reason: String,
    },
    /// A key has a wrong, missing or unknown value.
    #[error("{file}: {key}: {problem}")]
    Invalid {
        /// The config file's path.
        file: String,
        /// The dotted key path, e.g. `providers.geo.regions.eu.rate`.
        key: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where the configuration was read from (for messages).
    pub source: String,
    /// Listeners and request-holding limits.
    pub server: ServerConfig,
    /// Where bucket state lives.
    pub store: StoreConfig,
    /// What happens while the store is unreachable.
    pub fallback: FallbackConfig,
    /// Every bucket, in a stable order (provider, then region).
    pub buckets: Vec<BucketConfig>,
}

/// `[server]`: listeners, waits and timeouts.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The proxy listener.
    pub listen: SocketAddr,
    /// The admin listener (`/metrics`, `/healthz`, `/readyz`, `/buckets`).
    pub admin_listen: SocketAddr,
    /// The longest a request may be held; a longer wait is refused at once.
    pub max_wait: Duration,
    /// How long held and in-flight requests may take to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Deadline for opening a connection to an upstream.
    pub upstream_connect_timeout: Duration,
    /// Deadline for an upstream's response headers (the body streams without one).
    pub upstream_timeout: Duration,
    /// Most requests held at once, in total (past it: 503).
    pub max_held: usize,
    /// Most requests held at once in one bucket (past it: 503).
    pub max_held_per_bucket: usize,
    /// Largest request body accepted (past it: 413); `None`: no limit.
    pub max_body_bytes: Option<u64>,
    /// Most request headers (past it: 431).
    pub max_headers: usize,
    /// Largest request head in bytes (past it: 431).
    pub max_header_bytes: usize,
    /// Deadline for a client to send a request's headers, and for an idle keep-alive connection.
    pub header_read_timeout: Duration,
    /// Threads serving requests, each with its own event loop (default: one per core).
    pub threads: usize,
}

/// Which store keeps the buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreBackend {
    /// In-process: one replica only.
    Memory,
    /// Redis, shared by every replica.
    Redis,
}

/// Whose clock the reservation math uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// The store's own clock (Redis `TIME`): replicas' clocks do not matter.
    Redis,
    /// The calling replica's wall clock.
    Local,
}

/// `[store]`.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Which store.
    pub backend: StoreBackend,
    /// Redis URL (used when `backend = "redis"`).
    pub url: RedisUrl,
    /// Deadline for one store call; past it the call counts as a failure.
    pub timeout: Duration,
    /// Whose clock the script uses.
    pub clock: ClockSource,
    /// Connections each replica keeps to Redis (default: one per request thread); concurrent calls
    /// share them, pipelined.
    pub pool_size: usize,
}

/// A Redis URL whose `Display` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL with its password, for connecting only — never for logs.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}

/// Replaces the password in `scheme://user:password@host` with `***`.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    let hidden = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        "***".to_string()
    };
    format!("{}{}{}", &url[..scheme_end + 3], hidden, &rest[at..])
}

/// What the proxy does while the store is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackMode {
    /// Each replica limits alone at `rate / expected_replicas`.
    Local,
    /// Refuse with 503.
    Closed,
    /// No limit at all (logged loudly).
    Open,
}

/// `[fallback]`.
#[derive(Debug, Clone)]
pub struct FallbackConfig {
    /// The mode.
    pub mode: FallbackMode,
    /// How many replicas share each bucket; the local limiter runs at `rate / expected_replicas`.
    pub expected_replicas: NonZeroU32,
}

/// A bucket's limit: a positive finite rate and a capacity of at least one token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    rate: f64,
    capacity: f64,
}

impl Limit {
    /// Validates a rate (tokens/s, > 0) and a capacity (tokens, ≥ 1).
    pub fn new(rate: f64, capacity: f64) -> Result<Limit, LimitError> {
        if !rate.is_finite() || rate <= 0.0 {
            return Err(LimitError::Rate(rate));
        }
        if !capacity.is_finite() || capacity < 1.0 {
            return Err(LimitError::Capacity(capacity));
        }
        Ok(Limit { rate, capacity })
    }

    /// The default capacity for a rate: three seconds of it, at least one token.
    pub fn default_capacity(rate: f64) -> f64 {
        (rate * 3.0).max(1.0)
    }

    /// Tokens per second.
    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Burst size in tokens.
    pub fn capacity(&self) -> f64 {
        self.capacity
    }

    /// This limit divided among `parts` replicas (the local fallback's share).
    pub fn share(&self, parts: NonZeroU32) -> Limit {
        let n = f64::from(parts.get());
        Limit {
            rate: self.rate / n,
            capacity: (self.capacity / n).max(1.0),
        }
    }
}

/// Why a rate or capacity is invalid.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum LimitError {
    /// Rate not a positive finite number.
    #[error("must be > 0 tokens per second, got {0}")]
    Rate(f64),
    /// Capacity below one token.
    #[error("must be >= 1 token, got {0}")]
    Capacity(f64),
}

/// Where a bucket's requests go: scheme, authority and a base path to prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Host and optional port.
    pub authority: Authority,
    /// Path prefix without a trailing slash (`""` for none).
    pub base_path: String,
}

impl Upstream {
    /// Parses and checks an upstream URL: http(s), a host, no credentials, query or fragment.
    pub fn parse(text: &str) -> Result<Upstream, String> {
        let uri: Uri = text
            .parse()
            .map_err(|e| format!("not a valid URL ({e}): {text:?}"))?;
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::HTTP,
            Some("https") => Scheme::HTTPS,
            Some(other) => return Err(format!("scheme must be http or https, got {other:?}")),
            None => return Err(format!("must be an absolute http(s) URL, got {text:?}")),
        };
        let authority = uri
            .authority()
            .cloned()
            .ok_or_else(|| format!("has no host: {text:?}"))?;
        if authority.as_str().contains('@') {
            return Err("must not contain credentials; send them as headers".to_string());
        }
        if authority.host().is_empty() {
            return Err(format!("has no host: {text:?}"));
        }
        if uri.query().is_some() {
            return Err("must not contain a query string".to_string());
        }
        let base_path = uri.path().trim_end_matches('/').to_string();
        Ok(Upstream {
            scheme,
            authority,
            base_path,
        })
    }

    /// The host without port, lowercased (for forward-proxy matching and `Host`).
    pub fn host(&self) -> &str {
        self.authority.host()
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}{}", self.scheme, self.authority, self.base_path)
    }
}

/// One bucket: a provider, or one region of it, with its own limit and upstream.
#[derive(Debug, Clone)]
pub struct BucketConfig {
    /// Provider name (lowercase `[a-z0-9_-]`).
    pub provider: String,
    /// Region name, or `None` for the provider's own bucket.
    pub region: Option<String>,
    /// Where requests go.
    pub upstream: Upstream,
    /// Rate and capacity.
    pub limit: Limit,
    /// Extra host names matched in forward-proxy mode.
    pub hosts: Vec<String>,
    /// Whether the upstream may resolve to private addresses.
    pub allow_private: bool,
}

impl BucketConfig {
    /// The bucket's short name, `provider` or `provider:region` (metrics label, header value).
    pub fn name(&self) -> String {
        match &self.region {
            Some(region) => format!("{}:{}", self.provider, region),
            None => self.provider.clone(),
        }
    }

    /// The store key: `tollgate:{provider:region}` (braces: a Redis Cluster hash tag).
    pub fn key(&self) -> String {
        format!("tollgate:{{{}}}", self.name())
    }
}

// ---------------------------------------------------------------------------------------------
// Raw, as written.

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    fallback: RawFallback,
    #[serde(default)]
    providers: BTreeMap<String, RawProvider>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    admin_listen: Option<String>,
    max_wait: Option<String>,
    shutdown_grace: Option<String>,
    upstream_connect_timeout: Option<String>,
    upstream_timeout: Option<String>,
    max_held: Option<i64>,
    max_held_per_bucket: Option<i64>,
    max_body_bytes: Option<i64>,
    max_headers: Option<i64>,
    max_header_bytes: Option<i64>,
    header_read_timeout: Option<String>,
    threads: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    backend: Option<String>,
    url: Option<String>,
    timeout: Option<String>,
    clock: Option<String>,
    pool_size: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFallback {
    mode: Option<String>,
    expected_replicas: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    upstream: Option<String>,
    rate: Option<f64>,
    capacity: Option<f64>,
    hosts: Option<Vec<String>>,
    allow_private: Option<bool>,
    regions: Option<BTreeMap<String, RawRegion>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegion {
    upstream: Option<String>,
    rate: Option<f64>,
    capacity: Option<f64>,
    hosts: Option<Vec<String>>,
    allow_private: Option<bool>,
}

// ---------------------------------------------------------------------------------------------
// Loading.

impl Config {
    /// Reads `path`, applies `TOLLGATE__…` environment overrides and validates the result.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            file: file.clone(),
            reason: e.to_string(),
        })?;
        Config::from_toml_with_env(&file, &text, std::env::vars())
    }

    /// Parses TOML text (no environment overrides); `file` names it in messages.
    pub fn from_toml(file: &str, text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_with_env(file, text, std::iter::empty())
    }

    /// Parses TOML text with the given environment variables as overrides (only `TOLLGATE__…` ones count).
    pub fn from_toml_with_env(
        file: &str,
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            file: file.to_string(),
            reason: e.message().to_string() + &line_of(text, e.span()),
        })?;
        check_names(&table).map_err(|(key, problem)| invalid(file, key, problem))?;

        let env: config::Map<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("TOLLGATE__"))
            .collect();
        let merged = config::Config::builder()
            .add_source(config::File::from_str(text, config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix("TOLLGATE")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true)
                    .source(Some(env)),
            )
            .build()
            .map_err(|e| invalid(file, String::new(), e.to_string()))?;
        let raw: RawConfig = serde_path_to_error::deserialize(merged).map_err(|e| {
            let (key, problem) =
                describe_serde_error(&e.path().to_string(), &e.inner().to_string());
            invalid(file, key, problem)
        })?;
        validate(file, raw)
    }
}

impl Config {
    /// A readable table of the resolved buckets and the store, as `tollgate check` prints it.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "config {} is valid\nstore: {} ({}), fallback: {} with expected_replicas = {}\n\n",
            self.source,
            match self.store.backend {
                StoreBackend::Memory => "memory".to_string(),
                StoreBackend::Redis => format!("redis {}", self.store.url),
            },
            match self.store.clock {
                ClockSource::Redis => "clock: redis",
                ClockSource::Local => "clock: local",
            },
            match self.fallback.mode {
                FallbackMode::Local => "local",
                FallbackMode::Closed => "closed",
                FallbackMode::Open => "open",
            },
            self.fallback.expected_replicas
        );
        let rows: Vec<[String; 5]> = self
            .buckets
            .iter()
            .map(|b| {
                let share = b.limit.share(self.fallback.expected_replicas);
                [
                    b.key(),
                    b.upstream.to_string(),
                    format!("{}/s", b.limit.rate()),
                    format!("{}", b.limit.capacity()),
                    format!("{:.3}/s", share.rate()),
                ]
            })
            .collect();
        let header = ["KEY", "UPSTREAM", "RATE", "CAPACITY", "FALLBACK RATE"].map(String::from);
        let mut widths = header.clone().map(|h| h.len());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        for row in std::iter::once(&header).chain(&rows) {
            let line: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(cell, w)| format!("{cell:<w$}"))
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        out
    }
}

fn invalid(file: &str, key: String, problem: String) -> ConfigError {
    ConfigError::Invalid {
        file: file.to_string(),
        key: if key.is_empty() {
            "(top level)".to_string()
        } else {
            key
        },
        problem,
    }
}

fn line_of(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    match span {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!(" (line {line})")
        }
        None => String::new(),
    }
}

/// Turns serde's wording into `(key path, problem)`; an unknown field's name joins the path.
fn describe_serde_error(path: &str, message: &str) -> (String, String) {
    let path = if path == "." { "" } else { path };
    // The config crate appends its own (lowercased, sometimes partial) key; ours is the exact one.
    let message = match message.find(" for key `") {
        Some(i) => &message[..i],
        None => message,
    };
    if let Some(rest) = message.strip_prefix("unknown field `") {
        if let Some(end) = rest.find('`') {
            let field = &rest[..end];
            let key = if path.is_empty() {
                field.to_string()
            } else if path == field || path.ends_with(&format!(".{field}")) {
                path.to_string()
            } else {
                format!("{path}.{field}")
            };
            let expected = rest[end + 1..].trim_start_matches(", ");
            return (key, format!("unknown key ({expected})"));
        }
    }
    (path.to_string(), message.to_string())
}

/// Provider and region names must already be lowercase `[a-z0-9_-]`: the config crate lowercases
/// keys, so `EU` and `eu` would otherwise merge silently.
fn check_names(table: &toml::Table) -> Result<(), (String, String)> {
    let Some(providers) = table.get("providers").and_then(|p| p.as_table()) else {
        return Ok(());
    };
    for (name, provider) in providers {
        check_name(name).map_err(|p| (format!("providers.{name}"), p))?;
        let regions = provider
            .as_table()
            .and_then(|p| p.get("regions"))
            .and_then(|r| r.as_table());
        for region in regions.into_iter().flat_map(|r| r.keys()) {
            check_name(region).map_err(|p| (format!("providers.{name}.regions.{region}"), p))?;
        }
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name {name:?} must be 1-64 characters of lowercase a-z, 0-9, '_' or '-'"
        ))
    }
}

fn duration(
    key: &str,
    value: Option<&str>,
    default: Duration,
) -> Result<Duration, (String, String)> {
    match value {
        None => Ok(default),
        Some(text) => humantime::parse_duration(text.trim()).map_err(|e| {
            (
                key.to_string(),
                format!("bad duration {text:?} ({e}); write e.g. \"250ms\", \"30s\", \"5m\""),
            )
        }),
    }
}

/// A whole number of at least `min`.
fn count(
    key: &str,
    value: Option<i64>,
    default: usize,
    min: usize,
) -> Result<usize, (String, String)> {
    let Some(n) = value else {
        return Ok(default);
    };
    usize::try_from(n)
        .ok()
        .filter(|&n| n >= min)
        .ok_or_else(|| {
            (
                key.to_string(),
                format!("must be a whole number >= {min}, got {n}"),
            )
        })
}

/// One of a fixed set of words.
fn choice<T: Copy>(
    key: &str,
    value: Option<&str>,
    options: &[(&str, T)],
    default: T,
) -> Result<T, (String, String)> {
    let Some(text) = value else {
        return Ok(default);
    };
    options
        .iter()
        .find(|(name, _)| *name == text)
        .map(|&(_, v)| v)
        .ok_or_else(|| {
            let names: Vec<String> = options.iter().map(|(n, _)| format!("{n:?}")).collect();
            (
                key.to_string(),
                format!("must be one of {}, got {text:?}", names.join(", ")),
            )
        })
}

fn socket_addr(
    key: &str,
    value: Option<&str>,
    default: &str,
) -> Result<SocketAddr, (String, String)> {
    let text = value.unwrap_or(default);
    text.parse().map_err(|_| {
        (
            key.to_string(),
            format!("not an address like \"127.0.0.1:8080\": {text:?}"),
        )
    })
}

fn validate(file: &str, raw: RawConfig) -> Result<Config, ConfigError> {
    validate_raw(file, raw).map_err(|(key, problem)| invalid(file, key, problem))
}

fn validate_raw(file: &str, raw: RawConfig) -> Result<Config, (String, String)> {
    let s = raw.server;
    let server = ServerConfig {
        listen: socket_addr("server.listen", s.listen.as_deref(), "127.0.0.1:8080")?,
        admin_listen: socket_addr(
            "server.admin_listen",
            s.admin_listen.as_deref(),
            "127.0.0.1:9090",
        )?,
        max_wait: duration(
            "server.max_wait",
            s.max_wait.as_deref(),
            Duration::from_secs(30),
        )?,
        shutdown_grace: duration(
            "server.shutdown_grace",
            s.shutdown_grace.as_deref(),
            Duration::from_secs(30),
        )?,
        upstream_connect_timeout: duration(
            "server.upstream_connect_timeout",
            s.upstream_connect_timeout.as_deref(),
            Duration::from_secs(5),
        )?,
        upstream_timeout: duration(
            "server.upstream_timeout",
            s.upstream_timeout.as_deref(),
            Duration::from_secs(60),
        )?,
        max_held: count("server.max_held", s.max_held, 10_000, 1)?,
        max_held_per_bucket: count(
            "server.max_held_per_bucket",
            s.max_held_per_bucket,
            10_000,
            1,
        )?,
        max_body_bytes: s
            .max_body_bytes
            .map(|n| count("server.max_body_bytes", Some(n), 0, 1).map(|n| n as u64))
            .transpose()?,
        max_headers: count("server.max_headers", s.max_headers, 100, 1)?,
        max_header_bytes: count("server.max_header_bytes", s.max_header_bytes, 65_536, 8_192)?,
        header_read_timeout: duration(
            "server.header_read_timeout",
            s.header_read_timeout.as_deref(),
            Duration::from_secs(30),
        )?,
        threads: count(
            "server.threads",
            s.threads,
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            1,
        )?,
    };
    if server.header_read_timeout.is_zero() {
        return Err(("server.header_read_timeout".into(), "must be > 0".into()));
    }
    if server.upstream_connect_timeout.is_zero() {
        return Err((
            "server.upstream_connect_timeout".into(),
            "must be > 0".into(),
        ));
    }
    if server.upstream_timeout.is_zero() {
        return Err(("server.upstream_timeout".into(), "must be > 0".into()));
    }

    let st = raw.store;
    let url = st
        .url
        .unwrap_or_else(|| "redis://127.0.0.1:6379/0".to_string());
    if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
        return Err((
            "store.url".into(),
            format!(
                "must start with redis:// or rediss://, got {:?}",
                redact_url(&url)
            ),
        ));
    }
    let store = StoreConfig {
        backend: choice(
            "store.backend",
            st.backend.as_deref(),
            &[
                ("memory", StoreBackend::Memory),
                ("redis", StoreBackend::Redis),
            ],
            StoreBackend::Memory,
        )?,
        url: RedisUrl(url),
        timeout: duration(
            "store.timeout",
            st.timeout.as_deref(),
            Duration::from_millis(100),
        )?,
        clock: choice(
            "store.clock",
            st.clock.as_deref(),
            &[("redis", ClockSource::Redis), ("local", ClockSource::Local)],
            ClockSource::Redis,
        )?,
        // One connection per request thread: each thread pipelines its calls on its own.
        pool_size: count("store.pool_size", st.pool_size, server.threads, 1)?,
    };
    if store.timeout.is_zero() {
        return Err(("store.timeout".into(), "must be > 0".into()));
    }

    let expected = raw.fallback.expected_replicas.unwrap_or(1);
    let expected_replicas = u32::try_from(expected)
        .ok()
        .and_then(NonZeroU32::new)
        .ok_or_else(|| {
            (
                "fallback.expected_replicas".to_string(),
                format!("must be a whole number >= 1, got {expected}"),
            )
        })?;
    let fallback = FallbackConfig {
        mode: choice(
            "fallback.mode",
            raw.fallback.mode.as_deref(),
            &[
                ("local", FallbackMode::Local),
                ("closed", FallbackMode::Closed),
                ("open", FallbackMode::Open),
            ],
            FallbackMode::Local,
        )?,
        expected_replicas,
    };

    let mut buckets = Vec::new();
    if raw.providers.is_empty() {
        return Err((
            "providers".into(),
            "no provider is configured; add a [providers.NAME] table with upstream and rate".into(),
        ));
    }
    for (name, p) in raw.providers {
        check_name(&name).map_err(|e| (format!("providers.{name}"), e))?;
        let at = format!("providers.{name}");
        let has_regions = p.regions.as_ref().is_some_and(|r| !r.is_empty());
        let provider_upstream = p
            .upstream
            .as_deref()
            .map(|u| Upstream::parse(u).map_err(|e| (format!("{at}.upstream"), e)))
            .transpose()?;
        let provider_allow_private = p.allow_private.unwrap_or(false);

        if p.rate.is_some() || !has_regions {
            let upstream = provider_upstream
                .clone()
                .ok_or_else(|| (format!("{at}.upstream"), "is required".to_string()))?;
            let rate = p.rate.ok_or_else(|| {
                (
                    format!("{at}.rate"),
                    "is required (tokens per second)".to_string(),
                )
            })?;
            buckets.push(BucketConfig {
                provider: name.clone(),
                region: None,
                upstream,
                limit: limit(&at, rate, p.capacity)?,
                hosts: hosts(&at, p.hosts.clone())?,
                allow_private: provider_allow_private,
            });
        } else if p.capacity.is_some() {
            return Err((
                format!("{at}.capacity"),
                "is set but rate is not; a provider-level bucket needs both".into(),
            ));
        }

        for (region, r) in p.regions.into_iter().flatten() {
            check_name(&region).map_err(|e| (format!("{at}.regions.{region}"), e))?;
            let rat = format!("{at}.regions.{region}");
            let upstream = match r.upstream.as_deref() {
                Some(u) => Upstream::parse(u).map_err(|e| (format!("{rat}.upstream"), e))?,
                None => provider_upstream.clone().ok_or_else(|| {
                    (
                        format!("{rat}.upstream"),
                        "is required (neither the region nor its provider sets one)".to_string(),
                    )
                })?,
            };
            let rate = r.rate.ok_or_else(|| {
                (
                    format!("{rat}.rate"),
                    "is required (tokens per second)".to_string(),
                )
            })?;
            buckets.push(BucketConfig {
                provider: name.clone(),
                region: Some(region.clone()),
                upstream,
                limit: limit(&rat, rate, r.capacity)?,
                hosts: hosts(&rat, r.hosts)?,
                allow_private: r.allow_private.unwrap_or(provider_allow_private),
            });
        }
    }

    // The guard works per host name (and pooled connections are shared per host), so one host cannot be
    // both allowed and refused private addresses.
    for (i, a) in buckets.iter().enumerate() {
        if let Some(b) = buckets[..i].iter().find(|b| {
            b.upstream.host().eq_ignore_ascii_case(a.upstream.host())
                && b.allow_private != a.allow_private
        }) {
            let at = match &a.region {
                Some(r) => format!("providers.{}.regions.{r}.allow_private", a.provider),
                None => format!("providers.{}.allow_private", a.provider),
            };
            return Err((
                at,
                format!(
                    "differs from bucket {} for the same host {}; set it the same on every bucket of a host",
                    b.name(),
                    a.upstream.host()
                ),
            ));
        }
    }

    Ok(Config {
        source: file.to_string(),
        server,
        store,
        fallback,
        buckets,
    })
}

fn limit(at: &str, rate: f64, capacity: Option<f64>) -> Result<Limit, (String, String)> {
    let capacity = capacity.unwrap_or_else(|| Limit::default_capacity(rate));
    Limit::new(rate, capacity).map_err(|e| match e {
        LimitError::Rate(_) => (format!("{at}.rate"), e.to_string()),
        LimitError::Capacity(_) => (format!("{at}.capacity"), e.to_string()),
    })
}

fn hosts(at: &str, hosts: Option<Vec<String>>) -> Result<Vec<String>, (String, String)> {
    let hosts = hosts.unwrap_or_default();
    for h in &hosts {
        if h.is_empty() || h.contains(['/', '@', ' ', '?', '#']) {
            return Err((format!("{at}.hosts"), format!("not a host name: {h:?}")));
        }
    }
    Ok(hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml("t.toml", text)
    }

    fn err(text: &str) -> String {
        match parse(text) {
            Ok(_) => panic!("expected an error for:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    const MINIMAL: &str =
        "[providers.nominatim]\nupstream = \"https://nominatim.example\"\nrate = 1.0\n";

    #[test]
    fn minimal_config_gets_documented_defaults() {
        let c = parse(MINIMAL).expect("valid");
        assert_eq!(c.server.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.server.admin_listen.to_string(), "127.0.0.1:9090");
        assert_eq!(c.server.max_wait, Duration::from_secs(30));
        assert_eq!(c.store.backend, StoreBackend::Memory);
        assert_eq!(c.store.timeout, Duration::from_millis(100));
        assert_eq!(c.store.clock, ClockSource::Redis);
        assert_eq!(c.fallback.mode, FallbackMode::Local);
        assert_eq!(c.buckets.len(), 1);
        assert_eq!(c.buckets[0].limit.capacity(), 3.0);
        assert_eq!(c.buckets[0].key(), "tollgate:{nominatim}");
    }

    #[test]
    fn regions_make_one_bucket_each_plus_the_provider_when_it_sets_rate() {
        let c = parse(
            r#"
[providers.geo]
upstream = "https://api.geo.example"
rate = 50
[providers.geo.regions.eu]
upstream = "https://eu.api.geo.example/v1/"
rate = 20
capacity = 60
[providers.geo.regions.us]
rate = 30
"#,
        )
        .expect("valid");
        let names: Vec<String> = c.buckets.iter().map(|b| b.key()).collect();
        assert_eq!(
            names,
            ["tollgate:{geo}", "tollgate:{geo:eu}", "tollgate:{geo:us}"]
        );
        assert_eq!(c.buckets[1].upstream.base_path, "/v1");
        assert_eq!(c.buckets[2].upstream.to_string(), "https://api.geo.example");
        assert_eq!(c.buckets[2].limit.capacity(), 90.0);
    }

    #[test]
    fn environment_overrides_keys() {
        let env = vec![
            (
                "TOLLGATE__STORE__URL".to_string(),
                "redis://u:secret@10.0.0.1:6379/0".to_string(),
            ),
            (
                "TOLLGATE__PROVIDERS__NOMINATIM__RATE".to_string(),
                "7.5".to_string(),
            ),
            ("UNRELATED".to_string(), "x".to_string()),
        ];
        let c = Config::from_toml_with_env("t.toml", MINIMAL, env).expect("valid");
        assert_eq!(c.buckets[0].limit.rate(), 7.5);
        assert_eq!(c.store.url.expose(), "redis://u:secret@10.0.0.1:6379/0");
        assert_eq!(c.store.url.to_string(), "redis://u:***@10.0.0.1:6379/0");
    }

    #[test]
    fn redaction_hides_passwords_only() {
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        assert_eq!(redact_url("rediss://:pw@h:1/0"), "rediss://:***@h:1/0");
        assert_eq!(redact_url("redis://token@h"), "redis://***@h");
    }

    #[test]
    fn mistakes_name_file_key_and_problem() {
        let cases: &[(&str, &str)] = &[
            (
                "[server]\nlistn = \"x\"\n",
                "t.toml: server.listn: unknown key",
            ),
            (
                "[providers.a]\nrate = 1\n",
                "t.toml: providers.a.upstream: is required",
            ),
            (
                "[providers.a]\nupstream = \"http://a\"\nrate = 0\n",
                "providers.a.rate: must be > 0 tokens per second, got 0",
            ),
            (
                "[providers.a]\nupstream = \"http://a\"\nrate = 1\ncapacity = 0.5\n",
                "providers.a.capacity: must be >= 1 token, got 0.5",
            ),
            (
                "[server]\nmax_wait = \"soon\"\n[providers.a]\nupstream = \"http://a\"\nrate = 1\n",
                "server.max_wait: bad duration",
            ),
            (
                "[providers.a]\nupstream = \"ftp://a\"\nrate = 1\n",
                "providers.a.upstream: scheme must be http or https",
            ),
            (
                "[providers.a]\nupstream = \"http://a\"\nrate = \"fast\"\n",
                "providers.a.rate: ",
            ),
            (
                "[providers.A]\nupstream = \"http://a\"\nrate = 1\n",
                "providers.A: name",
            ),
            (
                "[store]\nbackend = \"etcd\"\n[providers.a]\nupstream = \"http://a\"\nrate = 1\n",
                "store.backend: must be one of \"memory\", \"redis\", got \"etcd\"",
            ),
            ("", "providers: no provider is configured"),
            (
                "[providers.a]\nupstream = \"http://a\"\nrate = 1\n[providers.a]\nrate = 2\n",
                "invalid TOML",
            ),
        ];
        for (text, want) in cases {
            let got = err(text);
            assert!(
                got.contains(want),
                "for {text:?}\n  got: {got}\n want: {want}"
            );
            assert!(!got.contains('\n'), "one line: {got}");
        }
    }
}
