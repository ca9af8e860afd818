//! One behaviour suite for every [`Store`], written once over `Arc<dyn Store>` and run against the
//! memory store and the Redis store (a real `redis-server` per test). Both run on a manual clock
//! (the Redis store with `store.clock = "local"`), so the two must agree to the microsecond. Below
//! the suite: what only Redis has (its own clock, round trips, losing scripts, going away).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::config::{Limit, StoreConfig};
use tollgate::store::{
    Bucket, Clock, Decision, Grant, MemoryStore, RedisStore, Refusal, Store, StoreError,
};
use tollgate::Config;

use crate::support::redis_server::RedisServer;
use crate::support::tollgate::redis_sections;

const SEC: u64 = 1_000_000;
const LONG: Duration = Duration::from_secs(3600);
/// The Redis store's deadline in these tests.
const TIMEOUT: Duration = Duration::from_millis(100);

/// A clock the test moves by hand (and may move backwards, as a lagging replica's would look).
struct ManualClock(AtomicU64);

impl ManualClock {
    fn at(micros: u64) -> Arc<ManualClock> {
        Arc::new(ManualClock(AtomicU64::new(micros)))
    }

    fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }

    fn set(&self, micros: u64) {
        self.0.store(micros, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_micros(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A store under test with the clock it reads; keeps its Redis server alive as long as itself.
struct Harness {
    store: Arc<dyn Store>,
    clock: Arc<ManualClock>,
    redis: Option<RedisServer>,
}

/// An arbitrary, realistic start: about 2026 in Unix microseconds.
const T0: u64 = 1_795_000_000 * SEC;

fn memory() -> Harness {
    let clock = ManualClock::at(T0);
    Harness {
        store: Arc::new(MemoryStore::new(clock.clone())),
        clock,
        redis: None,
    }
}

fn redis_local() -> Harness {
    let redis = RedisServer::start();
    let clock = ManualClock::at(T0);
    let store = redis_store(&redis.url(), "local", clock.clone());
    Harness {
        store: Arc::new(store),
        clock,
        redis: Some(redis),
    }
}

fn store_config(url: &str, clock: &str) -> StoreConfig {
    let timeout = format!("{}ms", TIMEOUT.as_millis());
    let text = format!(
        "{}{}",
        redis_sections(url, &timeout, clock, "local", 1),
        crate::support::tollgate::provider("p", "http://127.0.0.1:1", 1.0, 1.0)
    );
    Config::from_toml("test.toml", &text)
        .expect("valid test config")
        .store
}

fn redis_store(url: &str, clock_source: &str, clock: Arc<dyn Clock>) -> RedisStore {
    RedisStore::connect(&store_config(url, clock_source), clock).expect("store builds")
}

fn bucket(name: &str, rate: f64, capacity: f64) -> Bucket {
    Bucket {
        key: format!("tollgate:{{{name}}}").into(),
        limit: Limit::new(rate, capacity).expect("valid limit"),
    }
}

fn granted(decision: Result<Decision, StoreError>) -> Grant {
    match decision.expect("store answers") {
        Decision::Granted(g) => g,
        Decision::Refused(r) => panic!("refused: {r:?}"),
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The suite: each case takes a fresh harness.
mod cases {
    use super::*;

    pub async fn full_bucket_grants_capacity_then_queues_slots_cost_over_rate_apart(h: Harness) {
        let b = bucket("geo:eu", 10.0, 5.0);
        let mut last_seq = None;
        for _ in 0..5 {
            let g = granted(h.store.acquire(&b, 1.0, LONG).await);
            assert_eq!(g.wait, Duration::ZERO);
            if let Some(last) = last_seq {
                assert_eq!(g.seq, last + 1, "sequence numbers count reservations");
            }
            last_seq = Some(g.seq);
        }
        for n in 1..=5u64 {
            let g = granted(h.store.acquire(&b, 1.0, LONG).await);
            assert_eq!(g.wait, ms(100 * n), "queued slot {n}");
        }
        // Cost 2 takes two slots at once: 500 ms of debt + 200 ms.
        let g = granted(h.store.acquire(&b, 2.0, LONG).await);
        assert_eq!(g.wait, ms(700));
        // Fractional costs and rates keep exact microseconds (ceil of 0.5/3 s).
        let c = bucket("frac", 3.0, 1.0);
        granted(h.store.acquire(&c, 1.0, LONG).await);
        let g = granted(h.store.acquire(&c, 0.5, LONG).await);
        assert_eq!(g.wait, Duration::from_micros(166_667));
    }

    pub async fn cost_outside_zero_to_capacity_is_refused_and_takes_nothing(h: Harness) {
        let b = bucket("cost", 2.0, 4.0);
        for cost in [4.5, 100.0, 0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(
                h.store.acquire(&b, cost, LONG).await.expect("answers"),
                Decision::Refused(Refusal::CostOverCapacity),
                "cost {cost}"
            );
        }
        assert_eq!(h.store.tokens(&b).await.expect("answers"), 4.0);
        assert_eq!(
            granted(h.store.acquire(&b, 4.0, LONG).await).wait,
            Duration::ZERO
        );
    }

    pub async fn a_wait_past_max_wait_is_refused_and_takes_nothing(h: Harness) {
        let b = bucket("wait", 1.0, 1.0);
        granted(h.store.acquire(&b, 1.0, Duration::ZERO).await);
        let before = h.store.tokens(&b).await.expect("answers");
        assert_eq!(
            h.store.acquire(&b, 1.0, ms(999)).await.expect("answers"),
            Decision::Refused(Refusal::TooLong {
                wait: Duration::from_secs(1)
            })
        );
        assert_eq!(h.store.tokens(&b).await.expect("answers"), before);
        assert_eq!(
            granted(h.store.acquire(&b, 1.0, Duration::from_secs(1)).await).wait,
            Duration::from_secs(1)
        );
    }

    pub async fn giving_back_the_latest_slot_hands_it_to_the_next_caller(h: Harness) {
        let b = bucket("back", 2.0, 2.0);
        granted(h.store.acquire(&b, 2.0, LONG).await);
        h.clock.advance(ms(100));
        let g = granted(h.store.acquire(&b, 1.0, LONG).await);
        assert_eq!(g.wait, ms(400));
        let debt = h.store.tokens(&b).await.expect("answers");
        assert!(h.store.give_back(&b, g, 1.0).await.expect("answers"));
        let after = h.store.tokens(&b).await.expect("answers");
        assert!((after - (debt + 1.0)).abs() < 1e-9, "{debt} -> {after}");
        let again = granted(h.store.acquire(&b, 1.0, LONG).await);
        assert_eq!(again, g, "the same slot and number again");
    }

    pub async fn a_slot_with_later_reservations_is_not_given_back(h: Harness) {
        let b = bucket("chain", 1.0, 1.0);
        let a = granted(h.store.acquire(&b, 1.0, LONG).await);
        let c = granted(h.store.acquire(&b, 1.0, LONG).await);
        let before = h.store.tokens(&b).await.expect("answers");
        assert!(!h.store.give_back(&b, a, 1.0).await.expect("answers"));
        assert_eq!(h.store.tokens(&b).await.expect("answers"), before);
        // Giving back the later one first makes the earlier the latest again.
        assert!(h.store.give_back(&b, c, 1.0).await.expect("answers"));
        assert!(h.store.give_back(&b, a, 1.0).await.expect("answers"));
        assert_eq!(h.store.tokens(&b).await.expect("answers"), 1.0);
        // Nothing to give back twice.
        assert!(!h.store.give_back(&b, a, 1.0).await.expect("answers"));
        let unknown = bucket("never-used", 1.0, 1.0);
        assert!(!h.store.give_back(&unknown, a, 1.0).await.expect("answers"));
    }

    pub async fn tokens_show_use_debt_and_refill_up_to_capacity(h: Harness) {
        let b = bucket("peek", 2.0, 4.0);
        assert_eq!(h.store.tokens(&b).await.expect("answers"), 4.0);
        granted(h.store.acquire(&b, 3.0, LONG).await);
        assert_eq!(h.store.tokens(&b).await.expect("answers"), 1.0);
        h.clock.advance(ms(250));
        assert_eq!(h.store.tokens(&b).await.expect("answers"), 1.5);
        granted(h.store.acquire(&b, 4.0, LONG).await);
        assert_eq!(h.store.tokens(&b).await.expect("answers"), -2.5);
        h.clock.advance(Duration::from_secs(60));
        assert_eq!(h.store.tokens(&b).await.expect("answers"), 4.0);
        // Buckets are independent.
        assert_eq!(
            h.store
                .tokens(&bucket("other", 2.0, 4.0))
                .await
                .expect("answers"),
            4.0
        );
    }

    pub async fn a_clock_behind_the_stored_time_never_credits_time_twice(h: Harness) {
        let b = bucket("skew", 10.0, 10.0);
        for _ in 0..10 {
            granted(h.store.acquire(&b, 1.0, LONG).await);
        }
        // A caller 5 s behind: the bucket has not refilled for it.
        h.clock.set(T0 - 5 * SEC);
        assert_eq!(granted(h.store.acquire(&b, 1.0, LONG).await).wait, ms(100));
        // 1 s after the stored time: 10 tokens back, minus the 1 of debt, minus this one.
        h.clock.set(T0 + SEC);
        assert_eq!(
            granted(h.store.acquire(&b, 1.0, LONG).await).wait,
            Duration::ZERO
        );
        assert!((h.store.tokens(&b).await.expect("answers") - 8.0).abs() < 1e-9);
    }

    pub async fn concurrent_callers_get_distinct_fifo_slots(h: Harness) {
        let b = Arc::new(bucket("swarm", 10.0, 5.0));
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                let store = h.store.clone();
                let b = b.clone();
                tokio::spawn(async move { granted(store.acquire(&b, 1.0, LONG).await) })
            })
            .collect();
        let mut grants = Vec::new();
        for t in tasks {
            grants.push(t.await.expect("task"));
        }
        grants.sort_by_key(|g| g.seq);
        let waits: Vec<Duration> = grants.iter().map(|g| g.wait).collect();
        let want: Vec<Duration> = (0..40u64).map(|i| ms(100 * i.saturating_sub(4))).collect();
        assert_eq!(
            waits, want,
            "in sequence order, each slot 100 ms after the last"
        );
        for pair in grants.windows(2) {
            assert_eq!(pair[1].seq, pair[0].seq + 1);
        }
    }
}

macro_rules! store_suite {
    ($backend:ident, $harness:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_full_bucket_grants_its_capacity_then_queues_slots_cost_over_rate_apart() {
                cases::full_bucket_grants_capacity_then_queues_slots_cost_over_rate_apart($harness)
                    .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_cost_outside_zero_to_capacity_is_refused_and_takes_nothing() {
                cases::cost_outside_zero_to_capacity_is_refused_and_takes_nothing($harness).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_wait_past_max_wait_is_refused_and_takes_nothing() {
                cases::a_wait_past_max_wait_is_refused_and_takes_nothing($harness).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn giving_back_the_latest_slot_hands_it_to_the_next_caller() {
                cases::giving_back_the_latest_slot_hands_it_to_the_next_caller($harness).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_slot_with_later_reservations_is_not_given_back() {
                cases::a_slot_with_later_reservations_is_not_given_back($harness).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tokens_show_use_debt_and_refill_up_to_capacity() {
                cases::tokens_show_use_debt_and_refill_up_to_capacity($harness).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_clock_behind_the_stored_time_never_credits_time_twice() {
                cases::a_clock_behind_the_stored_time_never_credits_time_twice($harness).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn concurrent_callers_get_distinct_fifo_slots() {
                cases::concurrent_callers_get_distinct_fifo_slots($harness).await;
            }
        }
    };
}

store_suite!(memory_store, memory());
store_suite!(redis_store, redis_local());

/// What only the Redis store has.
mod redis_only {
    use super::*;

    /// `calls=N` of one `cmdstat_NAME` line of `INFO commandstats`, 0 when absent.
    fn calls(info: &str, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("calls is a number"))
    }

    /// Every command Redis ran, from `INFO commandstats`, but the test's own CONFIG and INFO: those
    /// a client sent and those the scripts ran inside Redis (commandstats counts both).
    fn commands(info: &str) -> std::collections::BTreeMap<String, u64> {
        info.lines()
            .filter_map(|line| line.strip_prefix("cmdstat_"))
            .filter_map(|line| line.split_once(":calls="))
            .filter(|(name, _)| !name.starts_with("config") && *name != "info")
            .map(|(name, rest)| {
                let n = rest.split(',').next().unwrap_or("0");
                (name.to_string(), n.parse().expect("calls is a number"))
            })
            .collect()
    }

    fn counts(pairs: &[(&str, u64)]) -> std::collections::BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_acquire_is_exactly_one_script_call_and_nothing_else() {
        let h = redis_local();
        let redis = h.redis.as_ref().expect("redis harness");
        let b = bucket("count", 10.0, 3.0);
        // The first use of each script connects and loads it (EVALSHA, NOSCRIPT, SCRIPT LOAD,
        // EVALSHA); what is counted is the steady state after that.
        let g = granted(h.store.acquire(&b, 1.0, LONG).await);
        h.store.tokens(&b).await.expect("answers");
        assert!(h.store.give_back(&b, g, 1.0).await.expect("answers"));
        granted(h.store.acquire(&b, 1.0, LONG).await);
        assert_eq!(redis.command(&["CONFIG", "RESETSTAT"]), "OK");
        const N: u64 = 25;
        let mut grants = 0;
        for _ in 0..N {
            // Grants and refusals alike: the last ones exceed the max wait.
            let decision = h.store.acquire(&b, 1.0, ms(1500)).await.expect("answers");
            grants += u64::from(matches!(decision, Decision::Granted(_)));
        }
        assert!(grants > 0 && grants < N, "both kinds: {grants} grants");
        let info = redis.command(&["INFO", "commandstats"]);
        assert_eq!(
            calls(&info, "evalsha") + calls(&info, "eval"),
            N,
            "one script call per acquire:\n{info}"
        );
        // Inside each script: one GET, and one SET when it grants (the clock is local: no TIME).
        // Nothing else reaches Redis: no PING per checkout, no GET or EXPIRE of the client's own.
        assert_eq!(
            commands(&info),
            counts(&[("evalsha", N), ("get", N), ("set", grants)]),
            "{info}"
        );
        // tokens and give_back are one call each too (a GET each; give_back's SET KEEPTTL).
        let g = granted(h.store.acquire(&b, 1.0, LONG).await);
        h.store.tokens(&b).await.expect("answers");
        assert!(h.store.give_back(&b, g, 1.0).await.expect("answers"));
        let info = redis.command(&["INFO", "commandstats"]);
        assert_eq!(
            commands(&info),
            counts(&[("evalsha", N + 3), ("get", N + 3), ("set", grants + 2)]),
            "{info}"
        );
    }

    /// A small deterministic generator (xorshift64*), so a failure replays exactly.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_scripts_decide_exactly_as_the_memory_store_on_random_schedules() {
        let redis = RedisServer::start();
        let clock = ManualClock::at(T0);
        let memory = MemoryStore::new(clock.clone());
        let remote = redis_store(&redis.url(), "local", clock.clone());
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for (rate, capacity) in [
            (10.0, 5.0),
            (3.0, 2.0),
            (0.5, 4.0),
            (1000.0, 50.0),
            (7.3, 1.5),
        ] {
            let b = bucket(&format!("diff-{rate}-{capacity}"), rate, capacity);
            // The memory store creates a bucket's state even on a call refused for its cost (the
            // script writes nothing then), which only moves where its seq starts: so open each
            // bucket with a grant, after which both must agree on everything, seq included.
            let first = memory.acquire(&b, 1.0, LONG).await.expect("memory");
            assert_eq!(remote.acquire(&b, 1.0, LONG).await.expect("redis"), first);
            let mut grants: Vec<(Grant, f64)> = Vec::new();
            for step in 0..250 {
                match rng.below(10) {
                    // Time moves on, by nothing to a few seconds; now and then a caller lags.
                    0..=2 => clock.advance(Duration::from_micros(rng.below(3 * SEC))),
                    3 => clock.set(clock.now_micros() - rng.below(2 * SEC)),
                    _ => {}
                }
                if rng.below(5) == 0 && !grants.is_empty() {
                    // Give back the latest grant, or an older one that no longer can be.
                    let index = grants.len() - 1 - rng.below(grants.len().min(3) as u64) as usize;
                    let (grant, cost) = grants[index];
                    let want = memory.give_back(&b, grant, cost).await.expect("memory");
                    let got = remote.give_back(&b, grant, cost).await.expect("redis");
                    assert_eq!(got, want, "give_back at step {step} of {b:?}");
                    if want {
                        grants.truncate(index);
                    }
                    continue;
                }
                let cost = [0.5, 1.0, 1.0, 2.0, capacity, capacity + 1.0][rng.below(6) as usize];
                let max_wait = [0, 250_000, SEC, 5 * SEC][rng.below(4) as usize];
                let max_wait = Duration::from_micros(max_wait);
                let want = memory.acquire(&b, cost, max_wait).await.expect("memory");
                let got = remote.acquire(&b, cost, max_wait).await.expect("redis");
                assert_eq!(got, want, "acquire {cost} at step {step} of {b:?}");
                if let Decision::Granted(grant) = want {
                    grants.push((grant, cost));
                }
                let want = memory.tokens(&b).await.expect("memory");
                let got = remote.tokens(&b).await.expect("redis");
                assert_eq!(got, want, "tokens at step {step} of {b:?}");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn flushing_the_script_cache_mid_run_causes_no_error() {
        let h = redis_local();
        let redis = h.redis.as_ref().expect("redis harness");
        let b = bucket("flush", 10.0, 2.0);
        let mut waits = Vec::new();
        for i in 0..6 {
            if i % 2 == 1 {
                redis.script_flush();
            }
            waits.push(granted(h.store.acquire(&b, 1.0, LONG).await).wait);
        }
        assert_eq!(
            waits,
            [0, 0, 100, 200, 300, 400].map(ms),
            "no slot lost or doubled by reloading"
        );
        redis.script_flush();
        assert_eq!(h.store.tokens(&b).await.expect("answers"), -4.0);
        redis.script_flush();
        let g = granted(h.store.acquire(&b, 1.0, LONG).await);
        redis.script_flush();
        assert!(h.store.give_back(&b, g, 1.0).await.expect("answers"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_redis_fails_acquires_transiently_within_the_timeout() {
        let mut h = redis_local();
        let b = bucket("down", 10.0, 2.0);
        granted(h.store.acquire(&b, 1.0, LONG).await);
        h.redis.as_mut().expect("redis harness").stop();
        for _ in 0..3 {
            let started = tokio::time::Instant::now();
            let e = h
                .store
                .acquire(&b, 1.0, LONG)
                .await
                .expect_err("redis is down");
            let took = started.elapsed();
            assert!(e.transient, "transient: {e}");
            assert!(took <= TIMEOUT + ms(100), "took {took:?}: {e}");
            assert!(e.message.starts_with("redis redis://127.0.0.1:"), "{e}");
        }
        assert!(h.store.ping().await.expect_err("down").transient);
        assert!(h.store.tokens(&b).await.expect_err("down").transient);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_paused_redis_is_a_down_redis_and_then_answers_again() {
        let h = redis_local();
        let redis = h.redis.as_ref().expect("redis harness");
        let b = bucket("slow", 10.0, 2.0);
        granted(h.store.acquire(&b, 1.0, LONG).await);
        redis.pause(ms(600));
        let started = tokio::time::Instant::now();
        let e = h.store.acquire(&b, 1.0, LONG).await.expect_err("paused");
        let took = started.elapsed();
        assert!(e.transient, "{e}");
        assert!(took <= TIMEOUT + ms(100), "took {took:?}: {e}");
        tokio::time::sleep(ms(700)).await;
        // The timed-out call may or may not have reached the script: its slot is lost or not,
        // never doubled. Either way the store answers again.
        let g = granted(h.store.acquire(&b, 1.0, LONG).await);
        assert!(g.wait <= ms(100), "{g:?}");
        h.store.ping().await.expect("answers again");
    }

    /// A TCP relay to Redis whose open connections can be made to swallow everything silently (as
    /// a dropped NAT entry or a dead peer looks), while new connections still go through.
    struct Relay {
        port: u16,
        /// Connections opened before the latest `freeze` forward nothing any more.
        frozen_before: Arc<AtomicU64>,
        accepted: Arc<AtomicU64>,
    }

    impl Relay {
        async fn start(target: u16) -> Relay {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind relay");
            let port = listener.local_addr().expect("addr").port();
            let frozen_before = Arc::new(AtomicU64::new(0));
            let accepted = Arc::new(AtomicU64::new(0));
            let (frozen, count) = (frozen_before.clone(), accepted.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                    let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        continue;
                    };
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let (f1, f2) = (frozen.clone(), frozen.clone());
                    // Each direction copies until frozen; then it reads and drops.
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4096];
                        while let Ok(len @ 1..) = cr.read(&mut buf).await {
                            if n > f1.load(Ordering::SeqCst)
                                && sw.write_all(&buf[..len]).await.is_err()
                            {
                                break;
                            }
                        }
                    });
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4096];
                        while let Ok(len @ 1..) = sr.read(&mut buf).await {
                            if n > f2.load(Ordering::SeqCst)
                                && cw.write_all(&buf[..len]).await.is_err()
                            {
                                break;
                            }
                        }
                    });
                }
            });
            Relay {
                port,
                frozen_before,
                accepted,
            }
        }

        /// Every connection open now goes silent.
        fn freeze(&self) {
            self.frozen_before
                .store(self.accepted.load(Ordering::SeqCst), Ordering::SeqCst);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_gone_silent_is_dropped_after_one_deadline_and_replaced() {
        let redis = RedisServer::start();
        let relay = Relay::start(redis.port()).await;
        let clock = ManualClock::at(T0);
        let store = redis_store(
            &format!("redis://127.0.0.1:{}/0", relay.port),
            "local",
            clock,
        );
        let b = bucket("silent", 10.0, 2.0);
        granted(store.acquire(&b, 1.0, LONG).await);
        assert_eq!(
            relay.accepted.load(Ordering::SeqCst),
            1,
            "one shared connection"
        );

        relay.freeze();
        let started = tokio::time::Instant::now();
        let e = store.acquire(&b, 1.0, LONG).await.expect_err("silent");
        assert!(e.transient, "{e}");
        assert!(started.elapsed() <= TIMEOUT + ms(100), "{e}");
        // The next call does not wait on the silent connection again: it opens a new one.
        granted(store.acquire(&b, 1.0, LONG).await);
        store.ping().await.expect("answers");
        assert_eq!(relay.accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_restart_on_the_same_port_acquires_work_again_without_noscript_errors() {
        let mut h = redis_local();
        let b = bucket("restart", 10.0, 2.0);
        // Several pooled connections, all of which the restart will break.
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let store = h.store.clone();
                let b = bucket("restart", 10.0, 2.0);
                tokio::spawn(async move { granted(store.acquire(&b, 1.0, LONG).await) })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        let redis = h.redis.as_mut().expect("redis harness");
        let port = redis.port();

        // Down, a failed call, then up again.
        redis.stop();
        assert!(
            h.store
                .acquire(&b, 1.0, LONG)
                .await
                .expect_err("down")
                .transient
        );
        redis.restart();
        assert_eq!(redis.port(), port);
        let g = granted(h.store.acquire(&b, 1.0, LONG).await);
        assert_eq!(g.wait, Duration::ZERO, "a fresh server starts full");

        // Restarted while idle: no call saw it go; the first one after must still succeed.
        redis.restart();
        for n in 0..4u64 {
            let g = granted(h.store.acquire(&b, 1.0, LONG).await);
            assert_eq!(g.wait, ms(100 * n.saturating_sub(1)), "acquire {n}");
        }
        h.store.ping().await.expect("answers");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bucket_is_one_hash_tagged_key_that_expires_once_full_again() {
        let h = redis_local();
        let redis = h.redis.as_ref().expect("redis harness");
        let config = Config::from_toml(
            "test.toml",
            "[providers.geo]\nupstream = \"http://127.0.0.1:1\"\n\
             [providers.geo.regions.eu]\nrate = 10\ncapacity = 2\n",
        )
        .expect("valid config");
        let b = Bucket {
            key: config.buckets[0].key().into(),
            limit: config.buckets[0].limit,
        };
        assert_eq!(&*b.key, "tollgate:{geo:eu}");
        granted(h.store.acquire(&b, 1.0, LONG).await);
        assert_eq!(redis.command(&["KEYS", "*"]), "tollgate:{geo:eu}");
        // One string: four packed doubles (tokens, ts, seq, epoch), read back here by Redis's Lua.
        assert_eq!(redis.command(&["TYPE", &b.key]), "string");
        assert_eq!(redis.command(&["STRLEN", &b.key]), "32");
        const UNPACK: &str =
            "local t, ts, seq, epoch = struct.unpack('<dddd', redis.call('GET', KEYS[1])) \
             return {string.format('%.17g', t), string.format('%.17g', ts), \
             string.format('%.17g', seq), string.format('%.17g', epoch)}";
        let fields = redis.command(&["EVAL", UNPACK, "1", &b.key]);
        let fields: Vec<&str> = fields.lines().collect();
        assert_eq!(
            fields,
            ["1", &T0.to_string(), &(T0 + 1).to_string(), &T0.to_string()],
            "integers stored exactly"
        );
        // One token missing at 10/s: full in 100 ms, kept at most a second past that.
        let ttl: i64 = redis.command(&["PTTL", &b.key]).parse().expect("integer");
        assert!(ttl > 100 && ttl <= 1100, "pttl {ttl}");
        // More debt, a longer life.
        granted(h.store.acquire(&b, 2.0, LONG).await);
        let ttl: i64 = redis.command(&["PTTL", &b.key]).parse().expect("integer");
        assert!(ttl > 1100 && ttl <= 1300, "pttl {ttl}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_of_another_shape_reads_as_a_lost_state_and_is_replaced() {
        let h = redis_local();
        let redis = h.redis.as_ref().expect("redis harness");
        let b = bucket("foreign", 10.0, 2.0);
        // A hash (the layout of tollgate before packed state) and a string of the wrong length.
        redis.command(&["HSET", &b.key, "tokens", "0", "ts", "1", "seq", "7"]);
        assert!((h.store.tokens(&b).await.expect("peek") - 2.0).abs() < 1e-9);
        assert!(!h
            .store
            .give_back(
                &b,
                Grant {
                    wait: Duration::ZERO,
                    seq: 7,
                    epoch: 0
                },
                1.0
            )
            .await
            .expect("give back"));
        let g = granted(h.store.acquire(&b, 1.0, LONG).await);
        assert_eq!(
            (g.wait, g.epoch),
            (Duration::ZERO, T0),
            "a fresh, full state"
        );
        assert_eq!(redis.command(&["TYPE", &b.key]), "string");
        redis.command(&["SET", &b.key, "garbage"]);
        let g = granted(h.store.acquire(&b, 2.0, LONG).await);
        assert_eq!(g.wait, Duration::ZERO, "a fresh, full state again");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn with_the_redis_clock_slots_follow_redis_time_whatever_the_callers_clocks_say() {
        let redis = RedisServer::start();
        // Two replicas whose own clocks are wildly wrong: with clock = "redis" they do not matter.
        let a = redis_store(&redis.url(), "redis", ManualClock::at(1));
        let b_store = redis_store(&redis.url(), "redis", ManualClock::at(T0 * 3));
        let b = bucket("redis-time", 10.0, 2.0);
        let first = granted(a.acquire(&b, 1.0, LONG).await);
        let second = granted(b_store.acquire(&b, 1.0, LONG).await);
        assert_eq!((first.wait, second.wait), (Duration::ZERO, Duration::ZERO));
        // seq starts at Redis TIME in microseconds and survives exactly.
        let time = redis.command(&["TIME"]);
        let mut parts = time.lines().map(|p| p.parse::<u64>().expect("integer"));
        let now = parts.next().expect("seconds") * SEC + parts.next().expect("micros");
        assert!(
            first.seq > now - 5 * SEC && first.seq <= now,
            "{first:?} vs {now}"
        );
        assert_eq!(second.seq, first.seq + 1);
        for n in 1..=4u64 {
            let store = if n % 2 == 0 { &a } else { &b_store };
            let g = granted(store.acquire(&b, 1.0, LONG).await);
            // Real time passes between calls: a little less than the exact slot, never more.
            let exact = ms(100 * n);
            assert!(
                g.wait <= exact && g.wait > exact - ms(50),
                "slot {n}: {:?}",
                g.wait
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicas_with_skewed_local_clocks_share_one_bucket_without_double_credit() {
        let redis = RedisServer::start();
        let ahead = ManualClock::at(T0);
        let behind = ManualClock::at(T0 - 5 * SEC);
        let a = redis_store(&redis.url(), "local", ahead.clone());
        let b_store = redis_store(&redis.url(), "local", behind.clone());
        let b = bucket("skewed", 10.0, 10.0);
        for _ in 0..10 {
            granted(a.acquire(&b, 1.0, LONG).await);
        }
        // The lagging replica sees the stored time, not its own: its slot is queued.
        assert_eq!(granted(b_store.acquire(&b, 1.0, LONG).await).wait, ms(100));
        // Its clock moves on 1 s, still 4 s behind the stored time: nothing refilled for it.
        behind.advance(Duration::from_secs(1));
        assert_eq!(granted(b_store.acquire(&b, 1.0, LONG).await).wait, ms(200));
        ahead.advance(ms(300));
        assert_eq!(granted(a.acquire(&b, 1.0, LONG).await).wait, Duration::ZERO);
    }
}
