//! The in-process store: the reservation math behind a mutex. One replica only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::bucket::BucketState;
use super::{Bucket, Clock, Decision, Grant, Store, StoreError};

/// Buckets in this process's memory.
pub struct MemoryStore {
    clock: Arc<dyn Clock>,
    states: Mutex<HashMap<Arc<str>, BucketState>>,
}

impl MemoryStore {
    /// An empty store on `clock`; buckets start full on first use.
    pub fn new(clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            clock,
            states: Mutex::new(HashMap::new()),
        }
    }

    fn states(&self) -> MutexGuard<'_, HashMap<Arc<str>, BucketState>> {
        // The critical sections cannot panic half-way, so a poisoned lock still holds consistent state.
        self.states.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tokens available now, synchronously.
    pub fn tokens_now(&self, bucket: &Bucket) -> f64 {
        let now = self.clock.now_micros();
        self.states()
            .get(&bucket.key)
            .map_or(bucket.limit.capacity(), |s| s.tokens_at(bucket.limit, now))
    }

    /// Reserves synchronously (the store has no I/O).
    pub fn acquire_now(&self, bucket: &Bucket, cost: f64, max_wait: Duration) -> Decision {
        let now = self.clock.now_micros();
        let mut states = self.states();
        let state = states
            .entry(bucket.key.clone())
            .or_insert_with(|| BucketState::full(bucket.limit, now));
        state.reserve(bucket.limit, now, cost, max_wait)
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn acquire(
        &self,
        bucket: &Bucket,
        cost: f64,
        max_wait: Duration,
    ) -> Result<Decision, StoreError> {
        Ok(self.acquire_now(bucket, cost, max_wait))
    }

    async fn give_back(
        &self,
        bucket: &Bucket,
        grant: Grant,
        cost: f64,
    ) -> Result<bool, StoreError> {
        let mut states = self.states();
        Ok(states
            .get_mut(&bucket.key)
            .is_some_and(|s| s.give_back(grant.seq, cost)))
    }

    async fn tokens(&self, bucket: &Bucket) -> Result<f64, StoreError> {
        Ok(self.tokens_now(bucket))
    }

    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn backend(&self) -> &'static str {
        "memory"
    }

    fn mode(&self) -> &'static str {
        "memory"
    }

    fn can_fail(&self) -> bool {
        false
    }
}
