//! The store seam: where bucket state lives. The gate talks only to [`Store`]; the memory store and
//! the Redis store implement it with the same reservation semantics (`bucket.rs`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::config::{BucketConfig, Limit};

pub mod bucket;
pub mod clock;
pub mod fallback;
pub mod memory;
pub mod redis;

pub use clock::{Clock, MonotonicClock, WallClock};
pub use fallback::FallbackStore;
pub use memory::MemoryStore;
pub use redis::RedisStore;

/// What a store needs to know of a bucket: its key and its limit.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// The store key, `tollgate:{provider:region}`.
    pub key: Arc<str>,
    /// Rate and capacity.
    pub limit: Limit,
}

impl From<&BucketConfig> for Bucket {
    fn from(b: &BucketConfig) -> Bucket {
        Bucket {
            key: b.key().into(),
            limit: b.limit,
        }
    }
}

/// A granted reservation: when the caller may go, and its number for giving it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// How long from the store's `now` until the slot.
    pub wait: Duration,
    /// The reservation's sequence number in the bucket.
    pub seq: u64,
    /// When the bucket's stored state was created: a change means the store lost it (e.g. a Redis
    /// restart without persistence) and with it the queue of slots already handed out.
    pub epoch: u64,
}

/// Why a reservation was refused (nothing was taken).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The slot would be `wait` away, more than the caller's max wait.
    TooLong {
        /// The wait the caller would have had.
        wait: Duration,
    },
    /// The cost is not positive or exceeds the bucket's capacity: it can never be served.
    CostOverCapacity,
}

/// The answer to an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Go after `wait`.
    Granted(Grant),
    /// Not now; nothing was taken.
    Refused(Refusal),
}

/// A store call that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct StoreError {
    /// Whether retrying later may succeed (connection lost, timeout) as opposed to a bug or bad reply.
    pub transient: bool,
    /// What went wrong (never contains secrets).
    pub message: String,
}

/// Where bucket state lives; one implementation per backend.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reserves `cost` tokens in one round trip, unless the slot would be more than `max_wait` away.
    async fn acquire(
        &self,
        bucket: &Bucket,
        cost: f64,
        max_wait: Duration,
    ) -> Result<Decision, StoreError>;

    /// Gives back a reservation whose request never went upstream, if no later reservation depends on
    /// it. Returns whether the tokens were returned.
    async fn give_back(&self, bucket: &Bucket, grant: Grant, cost: f64)
        -> Result<bool, StoreError>;

    /// Tokens available now (negative: reserved ahead), for `/buckets`.
    async fn tokens(&self, bucket: &Bucket) -> Result<f64, StoreError>;

    /// Checks the store answers (for `/readyz`).
    async fn ping(&self) -> Result<(), StoreError>;

    /// The backend's name, for logs and `/buckets`.
    fn backend(&self) -> &'static str;

    /// Who is limiting right now (`shared`, or a fallback mode), for `/readyz` and `/buckets`.
    fn mode(&self) -> &'static str {
        "shared"
    }

    /// Whether calls can fail (a remote store), so the app wraps it in a fallback.
    fn can_fail(&self) -> bool {
        true
    }
}
