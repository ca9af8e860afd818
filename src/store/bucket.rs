//! The reservation math of one bucket, as pure functions of its state and `now` (microseconds).
//!
//! A token bucket that may go into debt: every granted acquire subtracts its cost at once, and the debt
//! says when the caller's slot is (`wait = -tokens / rate`). Each caller gets its own slot, in arrival
//! order, from one call. `lua/acquire.lua` is the same algorithm in Redis; keep the two in step.

use std::time::Duration;

use super::{Decision, Grant, Refusal};
use crate::config::Limit;

/// Microseconds per second, as a float for the rate arithmetic.
const MICROS: f64 = 1_000_000.0;

/// One bucket's stored state.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketState {
    /// Tokens at `ts`; negative while reservations are outstanding (debt).
    pub tokens: f64,
    /// When `tokens` was computed, in the clock's microseconds. Never moves backwards.
    pub ts: u64,
    /// Number of the latest reservation; a slot is given back only if it is still the latest.
    pub seq: u64,
    /// When this state was created (the clock's microseconds).
    pub epoch: u64,
}

impl BucketState {
    /// A full bucket at `now`. The sequence starts at `now` so that a reservation from an earlier
    /// incarnation of the state (e.g. before a store restart) cannot match a new one.
    pub fn full(limit: Limit, now: u64) -> BucketState {
        BucketState {
            tokens: limit.capacity(),
            ts: now,
            seq: now,
            epoch: now,
        }
    }

    /// Tokens available at `now` (negative: debt), without changing the state.
    pub fn tokens_at(&self, limit: Limit, now: u64) -> f64 {
        let elapsed = now.saturating_sub(self.ts) as f64 / MICROS;
        (self.tokens + elapsed * limit.rate()).min(limit.capacity())
    }

    /// Reserves `cost` tokens at `now`; refuses, changing nothing, when the slot would be more than
    /// `max_wait` away or the cost can never fit.
    pub fn reserve(&mut self, limit: Limit, now: u64, cost: f64, max_wait: Duration) -> Decision {
        if !(cost > 0.0 && cost <= limit.capacity()) {
            return Decision::Refused(Refusal::CostOverCapacity);
        }
        // A caller's clock behind the stored time must not credit the same interval twice.
        let now = now.max(self.ts);
        let after = self.tokens_at(limit, now) - cost;
        let wait_us = if after >= 0.0 {
            0
        } else {
            (-after / limit.rate() * MICROS).ceil() as u64
        };
        let wait = Duration::from_micros(wait_us);
        if wait > max_wait {
            return Decision::Refused(Refusal::TooLong { wait });
        }
        self.tokens = after;
        self.ts = now;
        self.seq += 1;
        Decision::Granted(Grant {
            wait,
            seq: self.seq,
            epoch: self.epoch,
        })
    }

    /// Gives `cost` tokens of reservation `seq` back, if no reservation was made after it (then the
    /// state becomes exactly what it would have been without it). Returns whether it did.
    pub fn give_back(&mut self, seq: u64, cost: f64) -> bool {
        if self.seq != seq {
            return false;
        }
        self.tokens += cost;
        self.seq -= 1;
        true
    }

    /// How long until the bucket is full again from `now` (when its stored state may be forgotten).
    pub fn time_to_full(&self, limit: Limit, now: u64) -> Duration {
        let missing = limit.capacity() - self.tokens_at(limit, now);
        Duration::from_micros((missing.max(0.0) / limit.rate() * MICROS).ceil() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000;

    fn limit(rate: f64, capacity: f64) -> Limit {
        Limit::new(rate, capacity).expect("valid limit")
    }

    fn granted(d: Decision) -> Grant {
        match d {
            Decision::Granted(g) => g,
            Decision::Refused(r) => panic!("refused: {r:?}"),
        }
    }

    const LONG: Duration = Duration::from_secs(3600);

    #[test]
    fn a_full_bucket_grants_its_capacity_at_once_then_queues_one_slot_per_token() {
        let l = limit(10.0, 5.0);
        let mut s = BucketState::full(l, 0);
        for _ in 0..5 {
            assert_eq!(granted(s.reserve(l, 0, 1.0, LONG)).wait, Duration::ZERO);
        }
        for n in 1..=20u64 {
            let g = granted(s.reserve(l, 0, 1.0, LONG));
            assert_eq!(g.wait, Duration::from_millis(100 * n), "slot {n}");
        }
    }

    #[test]
    fn slots_are_fifo_and_spaced_by_cost_over_rate_for_every_arrival_pattern() {
        // Arrivals at assorted times: each slot (now + wait) is the previous slot + cost/rate,
        // or now when the bucket has tokens.
        let l = limit(4.0, 2.0);
        let mut s = BucketState::full(l, 0);
        let mut last_slot = 0u64;
        let arrivals = [
            0,
            0,
            0,
            10_000,
            20_000,
            400_000,
            1_900_000,
            1_900_001,
            5 * SEC,
        ];
        for (i, &t) in arrivals.iter().enumerate() {
            let g = granted(s.reserve(l, t, 1.0, LONG));
            let slot = t + g.wait.as_micros() as u64;
            assert!(
                slot >= last_slot,
                "arrival {i}: slot {slot} before {last_slot}"
            );
            last_slot = slot;
        }
    }

    #[test]
    fn cost_greater_than_one_takes_that_many_tokens() {
        let l = limit(2.0, 4.0);
        let mut s = BucketState::full(l, 0);
        assert_eq!(granted(s.reserve(l, 0, 3.0, LONG)).wait, Duration::ZERO);
        // 1 token left; 3 more needed → 2 tokens of debt → 1 s.
        assert_eq!(
            granted(s.reserve(l, 0, 3.0, LONG)).wait,
            Duration::from_secs(1)
        );
        assert_eq!(
            granted(s.reserve(l, 0, 0.5, LONG)).wait,
            Duration::from_millis(1250)
        );
    }

    #[test]
    fn cost_above_capacity_or_not_positive_is_refused_and_takes_nothing() {
        let l = limit(2.0, 4.0);
        let mut s = BucketState::full(l, 0);
        let before = s;
        for cost in [4.5, 100.0, 0.0, -1.0, f64::NAN] {
            assert_eq!(
                s.reserve(l, 0, cost, LONG),
                Decision::Refused(Refusal::CostOverCapacity)
            );
            assert_eq!(s, before);
        }
        assert!(matches!(s.reserve(l, 0, 4.0, LONG), Decision::Granted(_)));
    }

    #[test]
    fn a_wait_past_max_wait_is_refused_and_takes_nothing() {
        let l = limit(1.0, 1.0);
        let mut s = BucketState::full(l, 0);
        granted(s.reserve(l, 0, 1.0, Duration::ZERO));
        let before = s;
        assert_eq!(
            s.reserve(l, 0, 1.0, Duration::from_millis(999)),
            Decision::Refused(Refusal::TooLong {
                wait: Duration::from_secs(1)
            })
        );
        assert_eq!(s, before);
        assert_eq!(
            granted(s.reserve(l, 0, 1.0, Duration::from_secs(1))).wait,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn debt_never_exceeds_rate_times_max_wait() {
        let l = limit(5.0, 3.0);
        let max_wait = Duration::from_secs(2);
        let mut s = BucketState::full(l, 0);
        let mut granted_n = 0;
        for t in (0..3 * SEC).step_by(7_000) {
            for _ in 0..3 {
                if let Decision::Granted(_) = s.reserve(l, t, 1.0, max_wait) {
                    granted_n += 1;
                }
                assert!(s.tokens >= -(5.0 * 2.0) - 1e-9, "debt {} at {t}", s.tokens);
            }
        }
        // Over 3 s plus the 2 s of allowed debt: capacity + rate * (3 + 2) slots at most.
        assert!(granted_n as f64 <= 3.0 + 5.0 * 5.0, "granted {granted_n}");
    }

    #[test]
    fn time_never_runs_backwards_in_the_state() {
        let l = limit(10.0, 10.0);
        let mut s = BucketState::full(l, 10 * SEC);
        for _ in 0..10 {
            granted(s.reserve(l, 10 * SEC, 1.0, LONG));
        }
        // A caller whose clock is 5 s behind must not make the bucket refill twice later.
        let g = granted(s.reserve(l, 5 * SEC, 1.0, LONG));
        assert_eq!(g.wait, Duration::from_millis(100));
        assert_eq!(s.ts, 10 * SEC);
        // 1 s later: 10 tokens refilled minus 1 debt: 9, then 1 more slot waits 0.
        let g = granted(s.reserve(l, 11 * SEC, 1.0, LONG));
        assert_eq!(g.wait, Duration::ZERO);
        assert!((s.tokens - 8.0).abs() < 1e-9, "tokens {}", s.tokens);
    }

    #[test]
    fn refill_is_capped_at_capacity() {
        let l = limit(100.0, 5.0);
        let mut s = BucketState::full(l, 0);
        granted(s.reserve(l, 0, 5.0, LONG));
        assert_eq!(s.tokens_at(l, 3600 * SEC), 5.0);
        assert_eq!(s.time_to_full(l, 0), Duration::from_millis(50));
        assert_eq!(s.time_to_full(l, SEC), Duration::ZERO);
    }

    #[test]
    fn giving_back_the_latest_slot_restores_the_state_exactly() {
        let l = limit(2.0, 2.0);
        let mut s = BucketState::full(l, 0);
        granted(s.reserve(l, 0, 2.0, LONG));
        let before = s;
        let g = granted(s.reserve(l, 100_000, 1.0, LONG));
        assert!(s.give_back(g.seq, 1.0));
        assert_eq!(s.seq, before.seq);
        assert!((s.tokens_at(l, 500_000) - before.tokens_at(l, 500_000)).abs() < 1e-9);
        // The next caller gets the slot the cancelled one had.
        let again = granted(s.reserve(l, 100_000, 1.0, LONG));
        assert_eq!(again.wait, g.wait);
    }

    #[test]
    fn a_slot_with_later_reservations_after_it_is_not_given_back() {
        let l = limit(1.0, 1.0);
        let mut s = BucketState::full(l, 0);
        let a = granted(s.reserve(l, 0, 1.0, LONG));
        let b = granted(s.reserve(l, 0, 1.0, LONG));
        let before = s;
        assert!(!s.give_back(a.seq, 1.0));
        assert_eq!(s, before);
        // Giving back b first makes a the latest again: the chain unwinds in reverse order.
        assert!(s.give_back(b.seq, 1.0));
        assert!(s.give_back(a.seq, 1.0));
        assert_eq!(s.tokens, 1.0);
    }

    #[test]
    fn a_fresh_state_does_not_accept_a_previous_incarnations_sequence() {
        let l = limit(1.0, 1.0);
        let mut old = BucketState::full(l, 0);
        let g = granted(old.reserve(l, 0, 1.0, LONG));
        let mut fresh = BucketState::full(l, 7 * SEC);
        granted(fresh.reserve(l, 7 * SEC, 1.0, LONG));
        assert!(!fresh.give_back(g.seq, 1.0));
    }

    /// The invariant, exhaustively over a grid of schedules: slots handed out never put more than
    /// `capacity + rate*T` into any window of length T.
    #[test]
    fn granted_slots_never_exceed_capacity_plus_rate_times_t_in_any_window() {
        for &(rate, cap) in &[
            (1.0, 1.0),
            (3.0, 2.0),
            (20.0, 10.0),
            (0.5, 4.0),
            (1000.0, 50.0),
        ] {
            let l = limit(rate, cap);
            for step in [0u64, 1_000, 13_000, 250_000] {
                let mut s = BucketState::full(l, 0);
                let mut slots = Vec::new();
                let mut t = 0;
                for i in 0..300u64 {
                    let cost = if i % 7 == 0 { cap.min(2.0) } else { 1.0 };
                    if let Decision::Granted(g) = s.reserve(l, t, cost, Duration::from_secs(5)) {
                        slots.push((t + g.wait.as_micros() as u64, cost));
                    }
                    t += step;
                }
                slots.sort_by_key(|&(at, _)| at);
                for i in 0..slots.len() {
                    let mut used = 0.0;
                    for j in i..slots.len() {
                        used += slots[j].1;
                        let window = (slots[j].0 - slots[i].0) as f64 / MICROS;
                        // One micro of ceil() rounding per slot is allowed for.
                        let bound = cap + rate * (window + 1e-6 * (j - i + 1) as f64);
                        assert!(
                            used <= bound + 1e-9,
                            "rate {rate} cap {cap} step {step}: {used} > {bound}"
                        );
                    }
                }
            }
        }
    }
}
