//! A deliberately wrong store for proving the swarm tests have teeth: it reads the bucket, does the
//! reservation math in the proxy, then writes the result back — two round trips with no atomicity, so
//! replicas that read the same state hand out the same slot twice. Test-only; never ship this.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::AsyncCommands;
use tollgate::store::bucket::BucketState;
use tollgate::store::{Bucket, Clock, Decision, Grant, Store, StoreError, WallClock};

/// Get-then-set over Redis.
pub struct NaiveStore {
    conn: redis::aio::MultiplexedConnection,
    clock: Arc<dyn Clock>,
}

fn err(e: redis::RedisError) -> StoreError {
    StoreError {
        transient: true,
        message: e.to_string(),
    }
}

impl NaiveStore {
    /// Connects to `url`.
    pub async fn connect(url: &str) -> NaiveStore {
        let client = redis::Client::open(url).expect("redis url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        NaiveStore {
            conn,
            clock: Arc::new(WallClock),
        }
    }
}

#[async_trait]
impl Store for NaiveStore {
    async fn acquire(
        &self,
        b: &Bucket,
        cost: f64,
        max_wait: Duration,
    ) -> Result<Decision, StoreError> {
        let mut conn = self.conn.clone();
        let (tokens, ts, seq): (Option<f64>, Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(&*b.key)
            .arg("tokens")
            .arg("ts")
            .arg("seq")
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        let now = self.clock.now_micros();
        let mut state = match (tokens, ts, seq) {
            (Some(tokens), Some(ts), Some(seq)) => BucketState {
                tokens,
                ts,
                seq,
                epoch: 0,
            },
            _ => BucketState::full(b.limit, now),
        };
        let decision = state.reserve(b.limit, now, cost, max_wait);
        if let Decision::Granted(_) = decision {
            let _: () = conn
                .hset_multiple(
                    &*b.key,
                    &[
                        ("tokens", state.tokens.to_string()),
                        ("ts", state.ts.to_string()),
                        ("seq", state.seq.to_string()),
                    ],
                )
                .await
                .map_err(err)?;
        }
        Ok(decision)
    }

    async fn give_back(&self, _: &Bucket, _: Grant, _: f64) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn tokens(&self, b: &Bucket) -> Result<f64, StoreError> {
        Ok(b.limit.capacity())
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn backend(&self) -> &'static str {
        "naive"
    }

    fn can_fail(&self) -> bool {
        false
    }
}

/// A wall clock shifted by a fixed offset: one replica's badly set clock.
pub struct OffsetClock(pub Duration);

impl Clock for OffsetClock {
    fn now_micros(&self) -> u64 {
        WallClock.now_micros() + self.0.as_micros() as u64
    }
}
