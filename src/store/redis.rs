//! The Redis store: each bucket is one Redis key (`tollgate:{provider:region}`) shared by every
//! replica, changed only by the scripts in `lua/` (the math of `bucket.rs`, run atomically in Redis).
//!
//! Every operation is exactly one script call (EVALSHA; redis-rs loads the script again when the
//! server has lost it, after a restart or `SCRIPT FLUSH`). Calls share a few multiplexed connections
//! (`store.pool_size`; each thread keeps to one): concurrent calls on one connection are pipelined,
//! so they share its writes and reads, on both sides. Every call has a deadline of `store.timeout`: a
//! slow Redis is a down Redis. Errors are classified transient or not where they are converted.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use deadpool::managed::Manager as _;
use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::redis::{
    self, AsyncConnectionConfig, ErrorKind, RedisError, RedisResult, Script, ServerErrorKind, Value,
};

use super::{Bucket, Clock, Decision, Grant, Refusal, Store, StoreError};
use crate::affinity::thread_index;
use crate::config::{ClockSource, StoreConfig};

const ACQUIRE_LUA: &str = include_str!("../../lua/acquire.lua");
const GIVE_BACK_LUA: &str = include_str!("../../lua/give_back.lua");
const PEEK_LUA: &str = include_str!("../../lua/peek.lua");

/// Buckets in Redis, shared by every replica that points at the same server.
pub struct RedisStore {
    /// Opens connections (deadpool-redis's manager: the URL, TLS, AUTH and the connect deadline).
    manager: deadpool_redis::Manager,
    /// A thread's calls always take the same lane (see [`crate::affinity`]).
    lanes: Box<[Lane]>,
    /// Numbers connections, so that a failed call forgets only the connection it failed on.
    next_id: AtomicU64,
    acquire: Script,
    give_back: Script,
    peek: Script,
    clock: Arc<dyn Clock>,
    clock_source: ClockSource,
    timeout: Duration,
    /// The URL with its password hidden: the only form that goes into messages.
    url: String,
    /// The URL's password, scrubbed from any message a driver error might carry.
    secrets: Vec<String>,
}

/// One shared connection slot: empty until first used, and again after its connection failed.
#[derive(Default)]
struct Lane {
    current: Mutex<Option<Shared>>,
    /// Held while connecting, so that a burst of calls on an empty lane opens one connection.
    connecting: tokio::sync::Mutex<()>,
}

/// A connection in a lane; clones share its socket.
#[derive(Clone)]
struct Shared {
    id: u64,
    conn: MultiplexedConnection,
}

impl Lane {
    fn get(&self) -> Option<Shared> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, shared: Shared) {
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(shared);
    }

    /// Empties the lane if it still holds connection `id` (another call may have replaced it).
    fn forget(&self, id: Option<u64>) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if id.is_none() || current.as_ref().map(|s| s.id) == id {
            *current = None;
        }
    }
}

impl RedisStore {
    /// A store on `config.url`. Connects lazily: Redis need not be up yet, and calls fail
    /// (transiently) until it is. `clock` is used only with `store.clock = "local"`.
    pub fn connect(config: &StoreConfig, clock: Arc<dyn Clock>) -> Result<RedisStore, StoreError> {
        let url = config.url.to_string();
        let secrets = secrets_of(config.url.expose());
        let fail = |what: String| StoreError {
            transient: false,
            message: scrub(&format!("redis {url}: {what}"), &secrets),
        };

        // Connecting has redis-rs's deadline too; a call's deadline is only ours (see `run`), which
        // covers the retry as well: one timer per call, not two (timers are a visible share of the
        // Redis row's profile, bench/PROFILE.md).
        let connection = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.timeout))
            .set_response_timeout(None);
        let manager = deadpool_redis::Manager::new_with_config(config.url.expose(), connection)
            .map_err(|e| fail(format!("not a usable redis URL: {e}")))?;
        let lanes = (0..config.pool_size.max(1))
            .map(|_| Lane::default())
            .collect();

        Ok(RedisStore {
            manager,
            lanes,
            next_id: AtomicU64::new(0),
            acquire: Script::new(ACQUIRE_LUA),
            give_back: Script::new(GIVE_BACK_LUA),
            peek: Script::new(PEEK_LUA),
            clock,
            clock_source: config.clock,
            timeout: config.timeout,
            url,
            secrets,
        })
    }

    /// The caller's clock for the scripts' `now_us`, or `None` to have them read Redis `TIME`.
    fn now_arg(&self) -> Option<u64> {
        match self.clock_source {
            // The scripts read 0 as "use TIME"; a real clock is never at 0 anyway.
            ClockSource::Local => Some(self.clock.now_micros().max(1)),
            ClockSource::Redis => None,
        }
    }

    fn error(&self, op: &str, transient: bool, detail: &str) -> StoreError {
        StoreError {
            transient,
            message: scrub(
                &format!("redis {}: {op}: {detail}", self.url),
                &self.secrets,
            ),
        }
    }

    /// The lane's connection, opening one if it has none.
    async fn connection(&self, op: &str, lane: &Lane) -> Result<Shared, StoreError> {
        if let Some(shared) = lane.get() {
            return Ok(shared);
        }
        let _connecting = lane.connecting.lock().await;
        // Another call may have connected while this one waited.
        if let Some(shared) = lane.get() {
            return Ok(shared);
        }
        let conn = self
            .manager
            .create()
            .await
            .map_err(|e| self.error(op, is_transient(&e), &e.to_string()))?;
        let shared = Shared {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            conn,
        };
        lane.set(shared.clone());
        Ok(shared)
    }

    /// Runs `call` on the next lane's connection within the store's deadline.
    ///
    /// A transient failure (the connection, the network, the server's state) empties the lane: the
    /// next call there opens a fresh connection. A connection found closed (the server restarted or
    /// dropped it while idle) empties every lane, since they all went to the same server, and the
    /// call is retried once on a fresh one. That retry can only cost a slot, never add one: if the
    /// first script did run before the connection broke, its reservation is simply never used.
    async fn run<T, F, Fut>(&self, op: &str, call: F) -> Result<T, StoreError>
    where
        F: Fn(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let lane = &self.lanes[thread_index() % self.lanes.len()];
        // The connection last tried, forgotten if the deadline passes on it: it may be dead without
        // saying so (a network that drops packets), and must not take every later call down too.
        let tried = AtomicU64::new(u64::MAX);
        let attempts = async {
            let mut retried = false;
            loop {
                let shared = self.connection(op, lane).await?;
                tried.store(shared.id, Ordering::Relaxed);
                match call(shared.conn).await {
                    Ok(value) => return Ok(value),
                    Err(e) => {
                        let transient = is_transient(&e);
                        if e.is_connection_dropped() {
                            for other in self.lanes.iter() {
                                other.forget(None);
                            }
                            if !retried {
                                retried = true;
                                continue;
                            }
                        } else if transient {
                            lane.forget(Some(shared.id));
                        }
                        return Err(self.error(op, transient, &e.to_string()));
                    }
                }
            }
        };
        match tokio::time::timeout(self.timeout, attempts).await {
            Ok(result) => result,
            Err(_) => {
                let id = tried.load(Ordering::Relaxed);
                if id != u64::MAX {
                    lane.forget(Some(id));
                }
                Err(self.error(op, true, &format!("no answer within {:?}", self.timeout)))
            }
        }
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.url)
            .field("timeout", &self.timeout)
            .field("clock", &self.clock_source)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for RedisStore {
    async fn acquire(
        &self,
        bucket: &Bucket,
        cost: f64,
        max_wait: Duration,
    ) -> Result<Decision, StoreError> {
        let limit = bucket.limit;
        // The script refuses these too; checked here as well because NaN or infinity would not
        // survive as an argument, and a cost that can never fit needs no round trip.
        if !(cost > 0.0 && cost <= limit.capacity()) {
            return Ok(Decision::Refused(Refusal::CostOverCapacity));
        }
        let max_wait_us = u64::try_from(max_wait.as_micros()).unwrap_or(u64::MAX);
        let mut invocation = self.acquire.key(&*bucket.key);
        invocation
            .arg(limit.rate())
            .arg(limit.capacity())
            .arg(cost)
            .arg(max_wait_us);
        if let Some(now) = self.now_arg() {
            invocation.arg(now);
        }
        let reply: Value = self
            .run("acquire", |mut conn| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        decode_acquire(&reply).map_err(|e| self.error("acquire", e.transient, &e.message))
    }

    async fn give_back(
        &self,
        bucket: &Bucket,
        grant: Grant,
        cost: f64,
    ) -> Result<bool, StoreError> {
        let mut invocation = self.give_back.key(&*bucket.key);
        invocation.arg(grant.seq).arg(cost);
        let reply: Value = self
            .run("give_back", |mut conn| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        decode_give_back(&reply).map_err(|e| self.error("give_back", e.transient, &e.message))
    }

    async fn tokens(&self, bucket: &Bucket) -> Result<f64, StoreError> {
        let mut invocation = self.peek.key(&*bucket.key);
        invocation
            .arg(bucket.limit.rate())
            .arg(bucket.limit.capacity());
        if let Some(now) = self.now_arg() {
            invocation.arg(now);
        }
        let reply: Value = self
            .run("tokens", |mut conn| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut conn).await }
            })
            .await?;
        decode_tokens(&reply).map_err(|e| self.error("tokens", e.transient, &e.message))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let reply: String = self
            .run("ping", |mut conn| async move {
                redis::cmd("PING").query_async(&mut conn).await
            })
            .await?;
        if reply == "PONG" {
            Ok(())
        } else {
            Err(self.error("ping", false, &format!("answered {reply:?}")))
        }
    }

    fn backend(&self) -> &'static str {
        "redis"
    }
}

/// Whether a later retry of a call that failed with `e` may succeed: the connection, the network or
/// the server's current state (loading, failing over, busy) failed, not the request itself.
fn is_transient(e: &RedisError) -> bool {
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    if matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        )
    ) {
        return true;
    }
    // Codes redis-rs has no kind for: a long script running, or memory full for now.
    matches!(e.code(), Some("BUSY" | "OOM"))
}

/// Decodes `acquire.lua`'s reply `{status, wait_us, seq[, epoch]}` (see the script's header).
pub fn decode_acquire(reply: &Value) -> Result<Decision, StoreError> {
    let bad = || StoreError {
        transient: false,
        message: format!("acquire.lua replied {reply:?}, expected [status, wait_us, seq, epoch]"),
    };
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let (status, wait_us, seq, epoch) = match items.as_slice() {
        [Value::Int(status), Value::Int(wait_us), Value::Int(seq), Value::Int(epoch)] => {
            (status, wait_us, seq, *epoch)
        }
        // Refusals carry no epoch.
        [Value::Int(status), Value::Int(wait_us), Value::Int(seq)] => (status, wait_us, seq, 0),
        _ => return Err(bad()),
    };
    let wait = u64::try_from(*wait_us)
        .map(Duration::from_micros)
        .map_err(|_| bad())?;
    match status {
        1 => Ok(Decision::Granted(Grant {
            wait,
            seq: u64::try_from(*seq).map_err(|_| bad())?,
            epoch: u64::try_from(epoch).map_err(|_| bad())?,
        })),
        0 => Ok(Decision::Refused(Refusal::TooLong { wait })),
        -1 => Ok(Decision::Refused(Refusal::CostOverCapacity)),
        _ => Err(bad()),
    }
}

/// Decodes `give_back.lua`'s reply: 1 returned, 0 not.
fn decode_give_back(reply: &Value) -> Result<bool, StoreError> {
    match reply {
        Value::Int(1) => Ok(true),
        Value::Int(0) => Ok(false),
        other => Err(StoreError {
            transient: false,
            message: format!("give_back.lua replied {other:?}, expected 0 or 1"),
        }),
    }
}

/// Decodes `peek.lua`'s reply: the tokens as a decimal string.
fn decode_tokens(reply: &Value) -> Result<f64, StoreError> {
    let tokens = match reply {
        Value::BulkString(bytes) => std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| text.parse::<f64>().ok()),
        Value::SimpleString(text) => text.parse::<f64>().ok(),
        Value::Int(n) => Some(*n as f64),
        _ => None,
    };
    tokens.filter(|t| t.is_finite()).ok_or_else(|| StoreError {
        transient: false,
        message: format!("peek.lua replied {reply:?}, expected a number"),
    })
}

/// What must never appear in a message: the URL's password (or token), if it has one.
fn secrets_of(url: &str) -> Vec<String> {
    let Some((_, rest)) = url.split_once("://") else {
        return Vec::new();
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    let Some((userinfo, _)) = authority.rsplit_once('@') else {
        return Vec::new();
    };
    let password = userinfo.split_once(':').map_or(userinfo, |(_, pw)| pw);
    if password.is_empty() {
        Vec::new()
    } else {
        vec![password.to_string()]
    }
}

fn scrub(message: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .fold(message.to_string(), |m, secret| m.replace(secret, "***"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::WallClock;
    use crate::Config;

    fn ints(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&v| Value::Int(v)).collect())
    }

    fn store_config(url: &str) -> StoreConfig {
        let text = format!(
            "[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout = \"50ms\"\n\
             [providers.p]\nupstream = \"http://127.0.0.1:1\"\nrate = 1\n"
        );
        Config::from_toml("t.toml", &text)
            .expect("valid config")
            .store
    }

    #[test]
    fn a_grant_decodes_its_wait_and_an_exact_sequence_number() {
        // seq starts at Redis TIME in microseconds: well past 2^50, still exact.
        let seq = 1_795_945_838_359_517_i64;
        assert_eq!(
            decode_acquire(&ints(&[1, 250_000, seq, seq - 40])).expect("decodes"),
            Decision::Granted(Grant {
                wait: Duration::from_millis(250),
                seq: seq as u64,
                epoch: seq as u64 - 40,
            })
        );
        assert_eq!(
            decode_acquire(&ints(&[1, 0, 7])).expect("decodes"),
            Decision::Granted(Grant {
                wait: Duration::ZERO,
                seq: 7,
                epoch: 0,
            })
        );
    }

    #[test]
    fn refusals_decode_to_their_reason() {
        assert_eq!(
            decode_acquire(&ints(&[0, 1_500_001, 0])).expect("decodes"),
            Decision::Refused(Refusal::TooLong {
                wait: Duration::from_micros(1_500_001)
            })
        );
        assert_eq!(
            decode_acquire(&ints(&[-1, 0, 0])).expect("decodes"),
            Decision::Refused(Refusal::CostOverCapacity)
        );
    }

    #[test]
    fn malformed_acquire_replies_are_permanent_errors_that_show_the_reply() {
        let cases = [
            Value::Nil,
            Value::Int(1),
            ints(&[1, 0]),
            ints(&[1, 0, 5, 6, 7]),
            ints(&[1, 0, 5, -6]),
            ints(&[2, 0, 5]),
            ints(&[1, -3, 5]),
            ints(&[1, 0, -5]),
            Value::Array(vec![
                Value::Int(1),
                Value::BulkString(b"0.5".to_vec()),
                Value::Int(5),
            ]),
        ];
        for reply in cases {
            let e = decode_acquire(&reply).expect_err("malformed");
            assert!(!e.transient, "{reply:?}");
            assert!(
                e.message.starts_with("acquire.lua replied"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn give_back_replies_decode_to_whether_tokens_returned() {
        assert!(decode_give_back(&Value::Int(1)).expect("decodes"));
        assert!(!decode_give_back(&Value::Int(0)).expect("decodes"));
        assert!(decode_give_back(&Value::Int(2)).is_err());
        assert!(decode_give_back(&Value::Nil).is_err());
    }

    #[test]
    fn token_replies_keep_fractions_and_debt() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(decode_tokens(&bulk("3")).expect("decodes"), 3.0);
        assert_eq!(decode_tokens(&bulk("-1.5")).expect("decodes"), -1.5);
        assert_eq!(
            decode_tokens(&bulk("0.10000000000000001")).expect("decodes"),
            0.1
        );
        assert_eq!(decode_tokens(&Value::Int(2)).expect("decodes"), 2.0);
        for bad in [bulk("many"), bulk("nan"), Value::Nil] {
            assert!(!decode_tokens(&bad).expect_err("bad").transient);
        }
    }

    #[test]
    fn connection_and_server_state_failures_are_transient_request_failures_are_not() {
        use std::io;
        for kind in [
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::TimedOut,
            io::ErrorKind::UnexpectedEof,
        ] {
            assert!(
                is_transient(&RedisError::from(io::Error::from(kind))),
                "{kind:?}"
            );
        }
        for kind in [
            ServerErrorKind::BusyLoading,
            ServerErrorKind::TryAgain,
            ServerErrorKind::MasterDown,
            ServerErrorKind::ReadOnly,
        ] {
            let e = RedisError::from((ErrorKind::Server(kind), "server busy"));
            assert!(is_transient(&e), "{kind:?}");
        }
        for kind in [
            ErrorKind::Server(ServerErrorKind::ResponseError),
            ErrorKind::Server(ServerErrorKind::NoPerm),
            ErrorKind::AuthenticationFailed,
            ErrorKind::Parse,
            ErrorKind::UnexpectedReturnType,
            ErrorKind::InvalidClientConfig,
        ] {
            assert!(!is_transient(&RedisError::from((kind, "bad"))), "{kind:?}");
        }
    }

    #[test]
    fn messages_never_carry_the_password() {
        let url = "redis://user:s3cret-pw@10.0.0.1:6379/0";
        let secrets = secrets_of(url);
        let message = scrub(
            &format!("connecting to {url} failed; auth s3cret-pw rejected"),
            &secrets,
        );
        assert!(!message.contains("s3cret-pw"), "{message}");
        let token = secrets_of("rediss://tok3n@h:1");
        assert!(!scrub("tok3n", &token).contains("tok3n"));
        // Without credentials nothing is scrubbed.
        assert!(secrets_of("redis://h:1/0").is_empty());
    }

    #[tokio::test]
    async fn a_store_is_built_without_a_server_and_then_fails_transiently_and_quickly() {
        // Port 1 on loopback: nothing listens there, so connecting is refused at once.
        let config = store_config("redis://:pw123456@127.0.0.1:1/0");
        let store = RedisStore::connect(&config, Arc::new(WallClock)).expect("builds");
        assert_eq!(store.backend(), "redis");
        let started = tokio::time::Instant::now();
        let e = store.ping().await.expect_err("nothing listens");
        assert!(e.transient, "{e}");
        assert!(started.elapsed() < Duration::from_millis(500), "{e}");
        assert!(!e.message.contains("pw123456"), "{e}");
        assert!(e.message.contains("127.0.0.1:1"), "{e}");
    }
}
