//! The gate: reserve a slot through the store, hold the request until it, and give the slot back
//! when the request is dropped while still held.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::{Bucket, Decision, Grant, Refusal, Store, StoreError};

/// Reserves slots and holds requests until them.
#[derive(Clone)]
pub struct Gate {
    store: Arc<dyn Store>,
}

/// Why the gate did not admit a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GateError {
    /// The store refused (nothing was taken).
    #[error("refused: {0:?}")]
    Refused(Refusal),
    /// The store could not be asked.
    #[error("store unavailable: {0}")]
    Store(#[from] StoreError),
}

/// A granted slot. Dropping it before [`Ticket::hold`] finishes gives the slot back when that is safe.
pub struct Ticket {
    store: Arc<dyn Store>,
    bucket: Bucket,
    grant: Grant,
    cost: f64,
    slot: Instant,
    used: bool,
}

impl Gate {
    /// A gate on `store`.
    pub fn new(store: Arc<dyn Store>) -> Gate {
        Gate { store }
    }

    /// The store behind the gate.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Reserves `cost` tokens, refusing (taking nothing) if the slot is more than `max_wait` away.
    pub async fn reserve(
        &self,
        bucket: &Bucket,
        cost: f64,
        max_wait: Duration,
    ) -> Result<Ticket, GateError> {
        match self.store.acquire(bucket, cost, max_wait).await? {
            Decision::Granted(grant) => Ok(Ticket {
                store: self.store.clone(),
                bucket: bucket.clone(),
                grant,
                cost,
                // Measured after the store answered: any round-trip time only delays the slot.
                slot: Instant::now() + grant.wait,
                used: false,
            }),
            Decision::Refused(refusal) => Err(GateError::Refused(refusal)),
        }
    }
}

impl Ticket {
    /// The wait the store computed.
    pub fn wait(&self) -> Duration {
        self.grant.wait
    }

    /// When the request may go.
    pub fn slot(&self) -> Instant {
        self.slot
    }

    /// Sleeps until the slot; from then on the slot counts as used.
    pub async fn hold(mut self) {
        // A slot that is already due needs no timer: tokio rounds deadlines up to its next 1 ms tick,
        // which would park every pass-through request for about a millisecond.
        if !self.grant.wait.is_zero() {
            tokio::time::sleep_until(self.slot).await;
        }
        self.used = true;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Dropped before its slot: the request will never go upstream. Give the slot back; the store
        // does so only if no later reservation depends on it.
        if self.used || Instant::now() >= self.slot {
            return;
        }
        let store = self.store.clone();
        let bucket = self.bucket.clone();
        let (grant, cost) = (self.grant, self.cost);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                match store.give_back(&bucket, grant, cost).await {
                    Ok(returned) => tracing::debug!(bucket = %bucket.key, returned, "cancelled request's slot"),
                    Err(e) => tracing::debug!(bucket = %bucket.key, error = %e, "could not give a slot back"),
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limit;
    use crate::store::{MemoryStore, MonotonicClock};

    fn setup(rate: f64, capacity: f64) -> (Gate, Bucket, Arc<MemoryStore>) {
        let store = Arc::new(MemoryStore::new(Arc::new(MonotonicClock::new())));
        let bucket = Bucket {
            key: "tollgate:{t}".into(),
            limit: Limit::new(rate, capacity).expect("valid"),
        };
        (Gate::new(store.clone()), bucket, store)
    }

    const MAX: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn holds_each_queued_request_until_n_over_rate() {
        let (gate, bucket, _) = setup(20.0, 10.0);
        for _ in 0..10 {
            gate.reserve(&bucket, 1.0, MAX)
                .await
                .expect("granted")
                .hold()
                .await;
        }
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..40 {
            let t = gate.reserve(&bucket, 1.0, MAX).await.expect("granted");
            tasks.push(tokio::spawn(async move {
                t.hold().await;
                Instant::now()
            }));
        }
        let mut worst = Duration::ZERO;
        for (i, task) in tasks.into_iter().enumerate() {
            let released = task.await.expect("task");
            let expected = start + Duration::from_secs_f64((i + 1) as f64 / 20.0);
            let error = released
                .duration_since(expected)
                .max(expected.duration_since(released));
            worst = worst.max(error);
        }
        assert!(
            worst <= Duration::from_millis(1),
            "worst release error {worst:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_a_held_ticket_gives_its_slot_to_the_next_caller() {
        let (gate, bucket, store) = setup(1.0, 1.0);
        gate.reserve(&bucket, 1.0, MAX)
            .await
            .expect("granted")
            .hold()
            .await;
        let held = gate.reserve(&bucket, 1.0, MAX).await.expect("granted");
        assert_eq!(held.wait(), Duration::from_secs(1));
        drop(held);
        tokio::task::yield_now().await;
        let next = gate.reserve(&bucket, 1.0, MAX).await.expect("granted");
        assert_eq!(next.wait(), Duration::from_secs(1), "slot reused");
        assert!((store.tokens(&bucket).await.expect("tokens") + 1.0).abs() < 1e-6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slot_with_later_reservations_is_not_given_back() {
        let (gate, bucket, _) = setup(1.0, 1.0);
        gate.reserve(&bucket, 1.0, MAX)
            .await
            .expect("granted")
            .hold()
            .await;
        let first = gate.reserve(&bucket, 1.0, MAX).await.expect("granted");
        let second = gate.reserve(&bucket, 1.0, MAX).await.expect("granted");
        drop(first);
        tokio::task::yield_now().await;
        let third = gate.reserve(&bucket, 1.0, MAX).await.expect("granted");
        assert_eq!(second.wait(), Duration::from_secs(2));
        assert_eq!(
            third.wait(),
            Duration::from_secs(3),
            "first slot lost, never reissued"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_used_slot_is_never_given_back() {
        let (gate, bucket, _) = setup(1.0, 1.0);
        let t = gate.reserve(&bucket, 1.0, MAX).await.expect("granted");
        t.hold().await;
        tokio::task::yield_now().await;
        let next = gate.reserve(&bucket, 1.0, MAX).await.expect("granted");
        assert_eq!(next.wait(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn refuses_a_slot_past_max_wait_and_takes_nothing() {
        let (gate, bucket, _) = setup(2.0, 1.0);
        gate.reserve(&bucket, 1.0, MAX)
            .await
            .expect("granted")
            .hold()
            .await;
        match gate.reserve(&bucket, 1.0, Duration::from_millis(100)).await {
            Err(GateError::Refused(Refusal::TooLong { wait })) => {
                assert_eq!(wait, Duration::from_millis(500))
            }
            other => panic!("expected refusal, got {:?}", other.map(|t| t.wait())),
        }
        let t = gate.reserve(&bucket, 1.0, MAX).await.expect("granted");
        assert_eq!(t.wait(), Duration::from_millis(500));
    }
}
