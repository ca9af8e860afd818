//! A store that degrades on purpose: it wraps the shared store and, while that is unreachable, answers
//! from a conservative local limiter (`local`), refuses (`closed`) or lets everything through (`open`).
//!
//! A circuit breaker keeps requests off a dead store: after the first failure no request calls it again
//! until a background probe sees it answer. Transitions are logged once each (and a reminder every minute
//! while degraded), and both directions reconcile: the limiter taking over is charged for what this replica
//! issued through the other in the last `capacity / rate` seconds, so the provider-side bound holds across
//! the switch.

use std::collections::{HashMap, VecDeque};

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Bucket, Decision, Grant, MemoryStore, MonotonicClock, Refusal, Store, StoreError};
use crate::config::{FallbackConfig, FallbackMode, Limit};
use crate::telemetry::Metrics;
use prometheus_client::metrics::gauge::Gauge;

/// How often a degraded store is probed.
const PROBE_EVERY: Duration = Duration::from_millis(200);
/// How often a degraded store is reported again.
const REMIND_EVERY: Duration = Duration::from_secs(60);
/// A charge that may queue for this long is always accepted (reconciliation is never refused).
const CHARGE_MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The shared store with a fallback for when it is unreachable.
pub struct FallbackStore {
    inner: Arc<Inner>,
}

struct Inner {
    primary: Arc<dyn Store>,
    local: MemoryStore,
    config: FallbackConfig,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
    /// Every configured bucket with its `tollgate_store_fallback_active` gauge.
    buckets: Vec<(Bucket, Gauge)>,
    /// Grants this replica issued recently, per bucket key, for reconciliation.
    recent: Mutex<HashMap<Arc<str>, Recent>>,
}

struct State {
    /// `Some(since)` while degraded.
    down_since: Option<Instant>,
}

/// Slots (time, cost) issued in the last `capacity / rate` seconds, and the wait of the latest grant.
#[derive(Default)]
struct Recent {
    slots: VecDeque<(Instant, f64)>,
    last_wait: Duration,
    /// The shared state's creation time as last seen (0: unknown).
    epoch: u64,
}

impl FallbackStore {
    /// Wraps `primary` for the configured `buckets` (each with its fallback gauge); `metrics` receives
    /// the store error count and latency.
    pub fn new(
        primary: Arc<dyn Store>,
        config: FallbackConfig,
        buckets: Vec<(Bucket, Gauge)>,
        metrics: Arc<Metrics>,
    ) -> FallbackStore {
        FallbackStore {
            inner: Arc::new(Inner {
                primary,
                local: MemoryStore::new(Arc::new(MonotonicClock::new())),
                config,
                metrics,
                state: Mutex::new(State { down_since: None }),
                buckets,
                recent: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Whether the fallback is in charge right now.
    pub fn degraded(&self) -> bool {
        self.inner.state().down_since.is_some()
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn recent(&self) -> MutexGuard<'_, HashMap<Arc<str>, Recent>> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The local limiter's share of a bucket.
    fn local_bucket(&self, bucket: &Bucket) -> Bucket {
        Bucket {
            key: bucket.key.clone(),
            limit: bucket.limit.share(self.config.expected_replicas),
        }
    }

    fn remember(&self, bucket: &Bucket, grant: &Grant, cost: f64) {
        let now = Instant::now();
        let window = Duration::from_secs_f64(bucket.limit.capacity() / bucket.limit.rate());
        let mut recent = self.recent();
        let r = recent.entry(bucket.key.clone()).or_default();
        r.slots.push_back((now + grant.wait, cost));
        r.last_wait = grant.wait;
        while r.slots.front().is_some_and(|(at, _)| *at + window < now) {
            r.slots.pop_front();
        }
    }

    /// Records the epoch a grant came with; true when it differs from the last one seen, i.e. the
    /// store lost the bucket's state (and the queue in it) since this replica's previous grant.
    fn epoch_changed(&self, bucket: &Bucket, epoch: u64) -> bool {
        if epoch == 0 {
            return false;
        }
        let mut recent = self.recent();
        let r = recent.entry(bucket.key.clone()).or_default();
        let changed = r.epoch != 0 && r.epoch != epoch;
        r.epoch = epoch;
        changed
    }

    /// Brings the shared bucket down to this replica's takeover level; returns the charge.
    async fn reconcile_shared(&self, bucket: &Bucket) -> Result<f64, StoreError> {
        let level = self.takeover_level(bucket, bucket.limit);
        let tokens = self.primary.tokens(bucket).await?;
        let charge = (tokens - level).max(0.0);
        Inner::charge(self.primary.as_ref(), bucket, charge).await?;
        Ok(charge)
    }

    /// Tokens this replica issued for `bucket` whose slots lie in the last `capacity / rate` seconds or later.
    fn issued_recently(&self, bucket: &Bucket) -> f64 {
        let now = Instant::now();
        let window = Duration::from_secs_f64(bucket.limit.capacity() / bucket.limit.rate());
        let recent = self.recent();
        recent.get(&bucket.key).map_or(0.0, |r| {
            r.slots
                .iter()
                .filter(|(at, _)| *at + window >= now)
                .map(|(_, cost)| cost)
                .sum()
        })
    }

    /// How many tokens a limiter with `limit` taking over `bucket` from this replica may hold now.
    ///
    /// Two things bound it. What this replica issued in the last `capacity / rate` seconds counts
    /// against the new limiter's burst. And the queue: the slots the old limiter handed out run ahead
    /// of real time, interleaved across replicas, so the new limiter issues nothing until the queue as
    /// this replica last saw it (its latest grant's wait, plus one slot per replica) has gone out.
    /// Counts alone would let a replica whose own slots happen to end early start while the others'
    /// queued slots are still going out.
    fn takeover_level(&self, bucket: &Bucket, limit: Limit) -> f64 {
        let replicas = f64::from(self.config.expected_replicas.get());
        let mut level = limit.capacity() - self.issued_recently(bucket);
        let last_wait = self
            .recent()
            .get(&bucket.key)
            .map_or(Duration::ZERO, |r| r.last_wait);
        if !last_wait.is_zero() {
            let queued = last_wait.as_secs_f64() + replicas / bucket.limit.rate();
            level = level.min(-queued * limit.rate());
        }
        level
    }

    /// Takes `tokens` from `store`'s bucket whatever the wait, in chunks no larger than its capacity.
    async fn charge(store: &dyn Store, bucket: &Bucket, mut tokens: f64) -> Result<(), StoreError> {
        while tokens > 1e-9 {
            let chunk = tokens.min(bucket.limit.capacity());
            store.acquire(bucket, chunk, CHARGE_MAX_WAIT).await?;
            tokens -= chunk;
        }
        Ok(())
    }

    fn mode_name(&self) -> &'static str {
        match self.config.mode {
            FallbackMode::Local => "local",
            FallbackMode::Closed => "closed",
            FallbackMode::Open => "open",
        }
    }

    fn set_gauges(&self, active: bool) {
        for (_, gauge) in &self.buckets {
            gauge.set(i64::from(active));
        }
    }

    /// Takes `tokens` from the local limiter's share of `bucket` whatever the wait.
    /// Brings the local limiter's share of `bucket` down to its takeover level; returns the charge.
    fn charge_local(&self, bucket: &Bucket) -> f64 {
        let local = self.local_bucket(bucket);
        let level = self.takeover_level(bucket, local.limit);
        let charge = (self.local.tokens_now(&local) - level).max(0.0);
        let mut tokens = charge;
        while tokens > 1e-9 {
            let chunk = tokens.min(local.limit.capacity());
            self.local.acquire_now(&local, chunk, CHARGE_MAX_WAIT);
            tokens -= chunk;
        }
        charge
    }

    /// Records a failure; the first one flips to degraded, logs it and starts the probe.
    fn failed(self: &Arc<Self>, error: &StoreError) {
        self.metrics.store_errors.inc();
        let mut charged = 0.0;
        {
            let mut state = self.state();
            if state.down_since.is_some() {
                return;
            }
            state.down_since = Some(Instant::now());
            if self.config.mode == FallbackMode::Local {
                // Under the lock, so no request uses a local limiter before it is charged: the local
                // limiters start where this replica's shared usage left them.
                for (b, _) in &self.buckets {
                    charged += self.charge_local(b);
                }
            }
        }
        self.set_gauges(true);
        let (backend, replicas) = (self.primary.backend(), self.config.expected_replicas.get());
        match self.config.mode {
            FallbackMode::Local => tracing::warn!(
                backend, error = %error, fallback = "local", expected_replicas = replicas, charged,
                "store unreachable: limiting locally at rate / expected_replicas until it answers again"
            ),
            FallbackMode::Closed => tracing::error!(
                backend, error = %error, fallback = "closed",
                "store unreachable: refusing requests with 503 until it answers again"
            ),
            FallbackMode::Open => tracing::error!(
                backend, error = %error, fallback = "open",
                "store unreachable: forwarding WITHOUT ANY LIMIT until it answers again"
            ),
        }
        let me = self.clone();
        tokio::spawn(async move { me.probe().await });
    }

    /// Pings the store until it answers, reminding every minute; then reconciles and flips back.
    async fn probe(self: Arc<Self>) {
        let mut last_reminder = Instant::now();
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            match self.primary.ping().await {
                Ok(()) => break,
                Err(e) => {
                    if last_reminder.elapsed() >= REMIND_EVERY {
                        last_reminder = Instant::now();
                        let since = self
                            .state()
                            .down_since
                            .map(|s| s.elapsed())
                            .unwrap_or_default();
                        match self.config.mode {
                            FallbackMode::Local => {
                                tracing::warn!(error = %e, down_for = ?since, fallback = self.mode_name(), "store still unreachable; still limiting locally")
                            }
                            _ => {
                                tracing::error!(error = %e, down_for = ?since, fallback = self.mode_name(), "store still unreachable")
                            }
                        }
                    }
                }
            }
        }
        // Charge the shared bucket for what this replica issued meanwhile, so that the refilled shared
        // bucket does not release a second capacity right after the local traffic.
        let mut charged = 0.0;
        for (b, _) in &self.buckets {
            match self.reconcile_shared(b).await {
                Ok(charge) => charged += charge,
                Err(e) => {
                    tracing::debug!(bucket = %b.key, error = %e, "reconciliation charge failed")
                }
            }
        }
        let since = {
            let mut state = self.state();
            state.down_since.take()
        };
        self.set_gauges(false);
        let down_for = since.map(|s| s.elapsed()).unwrap_or_default();
        tracing::warn!(backend = self.primary.backend(), down_for = ?down_for, charged, "store reachable again: shared limiting resumed");
    }
}

#[async_trait]
impl Store for FallbackStore {
    async fn acquire(
        &self,
        bucket: &Bucket,
        cost: f64,
        max_wait: Duration,
    ) -> Result<Decision, StoreError> {
        let inner = &self.inner;
        if inner.state().down_since.is_none() {
            let started = Instant::now();
            let result = inner.primary.acquire(bucket, cost, max_wait).await;
            inner
                .metrics
                .store_seconds
                .observe(started.elapsed().as_secs_f64());
            match result {
                Ok(Decision::Granted(grant)) if inner.epoch_changed(bucket, grant.epoch) => {
                    // The store forgot the bucket (a restart without persistence, a flush): the slots
                    // already handed out are no longer in it, and this grant came from a full bucket.
                    // Put this replica's share of the queue back, then reserve again behind it.
                    match inner.reconcile_shared(bucket).await {
                        Ok(charged) => {
                            tracing::warn!(bucket = %bucket.key, charged, "the store lost this bucket's state (restarted without persistence?); charged it with this replica's recent use")
                        }
                        Err(e) => {
                            tracing::warn!(bucket = %bucket.key, error = %e, "the store lost this bucket's state and it could not be reconciled")
                        }
                    }
                    match inner.primary.acquire(bucket, cost, max_wait).await {
                        Ok(decision) => {
                            if let Decision::Granted(grant) = &decision {
                                inner.remember(bucket, grant, cost);
                            }
                            return Ok(decision);
                        }
                        Err(e) => inner.failed(&e),
                    }
                }
                Ok(decision) => {
                    if let Decision::Granted(grant) = &decision {
                        inner.remember(bucket, grant, cost);
                    }
                    return Ok(decision);
                }
                Err(e) => inner.failed(&e),
            }
        }
        match inner.config.mode {
            FallbackMode::Local => {
                let decision = inner
                    .local
                    .acquire_now(&inner.local_bucket(bucket), cost, max_wait);
                if let Decision::Granted(grant) = &decision {
                    inner.remember(bucket, grant, cost);
                }
                // A cost over the local share's capacity can still fit the shared bucket: not the client's fault.
                if decision == Decision::Refused(Refusal::CostOverCapacity)
                    && cost <= bucket.limit.capacity()
                {
                    return Err(StoreError {
                        transient: true,
                        message:
                            "the local fallback's capacity is smaller than this request's cost"
                                .into(),
                    });
                }
                Ok(decision)
            }
            FallbackMode::Closed => Err(StoreError {
                transient: true,
                message: "store unreachable and fallback.mode is closed".into(),
            }),
            FallbackMode::Open => Ok(Decision::Granted(Grant {
                epoch: 0,
                wait: Duration::ZERO,
                seq: 0,
            })),
        }
    }

    async fn give_back(
        &self,
        bucket: &Bucket,
        grant: Grant,
        cost: f64,
    ) -> Result<bool, StoreError> {
        // Only while the store that granted it is in charge; otherwise the slot is simply lost.
        if self.degraded() {
            if self.inner.config.mode == FallbackMode::Local {
                return self
                    .inner
                    .local
                    .give_back(&self.inner.local_bucket(bucket), grant, cost)
                    .await;
            }
            return Ok(false);
        }
        self.inner.primary.give_back(bucket, grant, cost).await
    }

    async fn tokens(&self, bucket: &Bucket) -> Result<f64, StoreError> {
        if self.degraded() {
            return self
                .inner
                .local
                .tokens(&self.inner.local_bucket(bucket))
                .await;
        }
        self.inner.primary.tokens(bucket).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.primary.ping().await
    }

    fn backend(&self) -> &'static str {
        self.inner.primary.backend()
    }

    fn mode(&self) -> &'static str {
        if !self.degraded() {
            return "shared";
        }
        match self.inner.config.mode {
            FallbackMode::Local => "fallback-local",
            FallbackMode::Closed => "fallback-closed",
            FallbackMode::Open => "fallback-open",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::*;
    use crate::config::Limit;

    /// A memory store that can be switched off, counting the calls it receives.
    struct Switchable {
        store: MemoryStore,
        down: AtomicBool,
        calls: AtomicUsize,
    }

    impl Switchable {
        fn check(&self) -> Result<(), StoreError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.down.load(Ordering::SeqCst) {
                Err(StoreError {
                    transient: true,
                    message: "connection refused".into(),
                })
            } else {
                Ok(())
            }
        }
    }

    #[async_trait]
    impl Store for Switchable {
        async fn acquire(
            &self,
            b: &Bucket,
            cost: f64,
            max_wait: Duration,
        ) -> Result<Decision, StoreError> {
            self.check()?;
            self.store.acquire(b, cost, max_wait).await
        }
        async fn give_back(&self, b: &Bucket, g: Grant, cost: f64) -> Result<bool, StoreError> {
            self.check()?;
            self.store.give_back(b, g, cost).await
        }
        async fn tokens(&self, b: &Bucket) -> Result<f64, StoreError> {
            self.check()?;
            self.store.tokens(b).await
        }
        async fn ping(&self) -> Result<(), StoreError> {
            self.check()
        }
        fn backend(&self) -> &'static str {
            "switchable"
        }
    }

    fn setup(mode: FallbackMode) -> (FallbackStore, Arc<Switchable>, Bucket, Gauge) {
        let primary = Arc::new(Switchable {
            store: MemoryStore::new(Arc::new(MonotonicClock::new())),
            down: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
        });
        let bucket = Bucket {
            key: "tollgate:{t}".into(),
            limit: Limit::new(10.0, 10.0).expect("limit"),
        };
        let gauge = Gauge::default();
        let config = FallbackConfig {
            mode,
            expected_replicas: NonZeroU32::new(2).expect("2"),
        };
        let store = FallbackStore::new(
            primary.clone(),
            config,
            vec![(bucket.clone(), gauge.clone())],
            Arc::new(Metrics::new()),
        );
        (store, primary, bucket, gauge)
    }

    const MAX: Duration = Duration::from_secs(60);

    fn wait(d: Decision) -> Duration {
        match d {
            Decision::Granted(g) => g.wait,
            Decision::Refused(r) => panic!("refused {r:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_switches_to_a_local_limiter_at_rate_over_replicas_charged_with_recent_use() {
        let (store, primary, b, gauge) = setup(FallbackMode::Local);
        for _ in 0..4 {
            wait(store.acquire(&b, 1.0, MAX).await.expect("shared"));
        }
        primary.down.store(true, Ordering::SeqCst);
        // Local share: rate 5/s, capacity 5, charged with the 4 tokens this replica just used.
        let first = wait(store.acquire(&b, 1.0, MAX).await.expect("fallback"));
        assert_eq!(first, Duration::ZERO);
        assert!(store.degraded());
        assert_eq!(gauge.get(), 1);
        assert_eq!(store.mode(), "fallback-local");
        let next = wait(store.acquire(&b, 1.0, MAX).await.expect("fallback"));
        assert_eq!(
            next,
            Duration::from_millis(200),
            "one token per 1/(rate/2) s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_do_not_touch_a_store_known_to_be_down() {
        let (store, primary, b, _) = setup(FallbackMode::Local);
        primary.down.store(true, Ordering::SeqCst);
        store.acquire(&b, 1.0, MAX).await.expect("fallback");
        let calls = primary.calls.load(Ordering::SeqCst);
        for _ in 0..20 {
            store.acquire(&b, 1.0, MAX).await.expect("fallback");
        }
        assert_eq!(
            primary.calls.load(Ordering::SeqCst),
            calls,
            "no request called the dead store"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn recovery_is_noticed_by_the_probe_and_charges_the_shared_bucket() {
        let (store, primary, b, gauge) = setup(FallbackMode::Local);
        primary.down.store(true, Ordering::SeqCst);
        for _ in 0..5 {
            store.acquire(&b, 1.0, MAX).await.expect("fallback");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(store.degraded());
        primary.down.store(false, Ordering::SeqCst);
        let healed = Instant::now();
        while store.degraded() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            healed.elapsed() <= PROBE_EVERY + Duration::from_millis(2),
            "switched back at the next probe"
        );
        assert_eq!(gauge.get(), 0);
        // The shared bucket (full: 10) was charged the 5 tokens issued locally.
        let tokens = primary.store.tokens(&b).await.expect("tokens");
        assert!((tokens - 5.0).abs() < 0.1, "shared tokens {tokens}");
    }

    #[tokio::test(start_paused = true)]
    async fn two_replicas_switching_to_local_together_keep_the_shared_bound() {
        let shared = Arc::new(Switchable {
            store: MemoryStore::new(Arc::new(MonotonicClock::new())),
            down: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
        });
        let bucket = Bucket {
            key: "tollgate:{t}".into(),
            limit: Limit::new(20.0, 10.0).expect("limit"),
        };
        let config = FallbackConfig {
            mode: FallbackMode::Local,
            expected_replicas: NonZeroU32::new(2).expect("2"),
        };
        let replicas: Vec<FallbackStore> = (0..2)
            .map(|_| {
                FallbackStore::new(
                    shared.clone(),
                    config.clone(),
                    vec![(bucket.clone(), Gauge::default())],
                    Arc::new(Metrics::new()),
                )
            })
            .collect();
        let start = Instant::now();
        let mut slots = Vec::new();
        // Saturated: every 25 ms each replica asks once; Redis dies at 1 s.
        for tick in 0..160u32 {
            if tick == 40 {
                shared.down.store(true, Ordering::SeqCst);
            }
            for (i, r) in replicas.iter().enumerate() {
                if (tick + i as u32) % 2 == 0 {
                    let w = wait(r.acquire(&bucket, 1.0, MAX).await.expect("granted"));
                    slots.push((Instant::now() + w - start).as_secs_f64());
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        slots.sort_by(f64::total_cmp);
        let mut worst = f64::NEG_INFINITY;
        for i in 0..slots.len() {
            for j in i..slots.len() {
                worst = worst.max((j - i + 1) as f64 - (10.0 + 20.0 * (slots[j] - slots[i])));
            }
        }
        assert!(worst <= 1e-6, "excess {worst}");
    }

    #[tokio::test(start_paused = true)]
    async fn closed_refuses_and_open_lets_everything_through() {
        let (closed, primary, b, _) = setup(FallbackMode::Closed);
        primary.down.store(true, Ordering::SeqCst);
        assert!(closed.acquire(&b, 1.0, MAX).await.is_err());
        let (open, primary, b, _) = setup(FallbackMode::Open);
        primary.down.store(true, Ordering::SeqCst);
        for _ in 0..100 {
            assert_eq!(
                wait(open.acquire(&b, 1.0, MAX).await.expect("open")),
                Duration::ZERO
            );
        }
    }
}
