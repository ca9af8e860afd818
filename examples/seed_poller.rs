//! The seed article's distributed limiter, reimplemented for comparison: its Lua script (refill, check,
//! decrement; the caller passes `now`) called through EVALSHA with the EVAL fallback, and its acquire
//! loop (`allowed`? done : sleep `min(wait, 5 s) or 10 ms`, then call again).
//!
//! N callers share one bucket in one Redis for a fixed time, each acquiring again as soon as it was
//! granted; no acquire starts after the deadline and those in flight finish. Prints one `key=value`
//! line: grants, script calls made, calls per grant. `bench/run` also counts the server's calls with
//! `CONFIG RESETSTAT` / `INFO commandstats`.
//!
//! ```text
//! cargo run --release --example seed_poller -- --redis redis://127.0.0.1:6379/0 --rate 200 --capacity 1 \
//!     --callers 50 --duration 5s
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{self, Script, Value};
use tokio::time::{sleep, Instant};

/// The seed's script, verbatim.
const SEED_LUA: &str = r"
local capacity  = tonumber(ARGV[1])
local rate      = tonumber(ARGV[2])
local now       = tonumber(ARGV[3])
local requested = tonumber(ARGV[4])

local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(state[1])
local ts     = tonumber(state[2])
if tokens == nil then
  tokens = capacity
  ts = now
end

-- Lazy refill: credit whatever has accrued since the last call.
local elapsed = math.max(0, now - ts)
tokens = math.min(capacity, tokens + elapsed * rate)

local allowed = tokens >= requested
local wait = 0
if allowed then
  tokens = tokens - requested
else
  wait = (requested - tokens) / rate
end

redis.call('HMSET', KEYS[1], 'tokens', tokens, 'ts', now)
redis.call('EXPIRE', KEYS[1], math.ceil(capacity / rate) * 2)
return { allowed and 1 or 0, tostring(wait) }
";

#[derive(Parser)]
#[command(about = "The seed article's polling Redis limiter, for comparison with tollgate")]
struct Cli {
    /// Redis URL (loopback).
    #[arg(long)]
    redis: String,
    /// The bucket key.
    #[arg(long, default_value = "seed:bench")]
    key: String,
    /// Tokens per second.
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Burst in tokens (the seed's default is max(1, 3 s of rate)).
    #[arg(long, default_value_t = 1.0)]
    capacity: f64,
    /// Concurrent callers.
    #[arg(long, default_value_t = 50)]
    callers: usize,
    /// How long acquires are started for.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
}

/// The seed's `DistributedLimiter`.
struct SeedLimiter {
    conn: MultiplexedConnection,
    script: Script,
    key: String,
    rate: f64,
    capacity: f64,
    calls: AtomicU64,
}

impl SeedLimiter {
    /// The seed's `acquire`: call the script until it allows, sleeping the returned wait between calls.
    async fn acquire(&self, tokens: f64) -> redis::RedisResult<()> {
        let mut conn = self.conn.clone();
        loop {
            // Like `time.time()`: the caller's wall clock in float seconds.
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            self.calls.fetch_add(1, Ordering::Relaxed);
            let reply: Value = self
                .script
                .key(&self.key)
                .arg(self.capacity)
                .arg(self.rate)
                .arg(now)
                .arg(tokens)
                .invoke_async(&mut conn)
                .await?;
            let (allowed, wait) = decode(&reply).ok_or_else(|| {
                redis::RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "seed script reply",
                    format!("{reply:?}"),
                ))
            })?;
            if allowed {
                return Ok(());
            }
            // `asyncio.sleep(min(float(wait), 5.0) or 0.01)`
            let secs = wait.min(5.0);
            let secs = if secs == 0.0 { 0.01 } else { secs };
            sleep(Duration::from_secs_f64(secs.max(0.0))).await;
        }
    }
}

/// `{allowed (0/1), tostring(wait)}`.
fn decode(reply: &Value) -> Option<(bool, f64)> {
    let Value::Array(items) = reply else {
        return None;
    };
    let [Value::Int(allowed), wait] = items.as_slice() else {
        return None;
    };
    let wait = match wait {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok()?,
        Value::SimpleString(s) => s.parse().ok()?,
        _ => return None,
    };
    Some((*allowed == 1, wait))
}

async fn run(cli: Cli) {
    let client = redis::Client::open(cli.redis.as_str()).expect("a redis URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis");
    let _: () = redis::cmd("DEL")
        .arg(&cli.key)
        .query_async(&mut conn)
        .await
        .expect("DEL the bench key");
    let limiter = Arc::new(SeedLimiter {
        conn,
        script: Script::new(SEED_LUA),
        key: cli.key.clone(),
        rate: cli.rate,
        capacity: cli.capacity,
        calls: AtomicU64::new(0),
    });
    let deadline = Instant::now() + cli.duration;
    let tasks: Vec<_> = (0..cli.callers)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let mut grants = 0u64;
                while Instant::now() < deadline {
                    limiter.acquire(1.0).await.expect("seed acquire");
                    grants += 1;
                }
                grants
            })
        })
        .collect();
    let mut grants = 0u64;
    for task in tasks {
        grants += task.await.expect("a caller");
    }
    let calls = limiter.calls.load(Ordering::Relaxed);
    println!(
        "grants={grants} script_calls={calls} calls_per_grant={:.2} grants_per_s={:.1}",
        calls as f64 / grants.max(1) as f64,
        grants as f64 / cli.duration.as_secs_f64(),
    );
}

fn main() {
    let cli = Cli::parse();
    tokio::runtime::Runtime::new()
        .expect("a tokio runtime")
        .block_on(run(cli));
}
