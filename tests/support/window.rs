//! The invariant, checked exactly: over every window [a_i, a_j] between two arrivals the count must stay
//! within `capacity + rate * (T + jitter)`. Checking every pair covers every window length.

use std::time::Duration;

/// The worst window found.
#[derive(Debug, Clone, Copy)]
pub struct WindowReport {
    /// Arrivals checked.
    pub arrivals: usize,
    /// Largest `count - (capacity + rate*(T + jitter))` over all windows; ≤ 0 means the bound holds.
    pub max_excess: f64,
    /// Count in the window with the largest count relative to its bound.
    pub worst_count: usize,
    /// Its length.
    pub worst_len: Duration,
    /// Its bound.
    pub worst_bound: f64,
    /// Where it starts (offset of its first arrival).
    pub worst_start: Duration,
}

impl WindowReport {
    /// Whether no window exceeded its bound.
    pub fn holds(&self) -> bool {
        self.max_excess <= 1e-9
    }
}

/// Checks arrival offsets (any order) against `capacity + rate * (T + jitter)` for every window.
pub fn check(arrivals: &[Duration], rate: f64, capacity: f64, jitter: Duration) -> WindowReport {
    let mut t: Vec<f64> = arrivals.iter().map(|d| d.as_secs_f64()).collect();
    t.sort_by(|a, b| a.total_cmp(b));
    let j = jitter.as_secs_f64();
    let mut report = WindowReport {
        arrivals: t.len(),
        max_excess: f64::NEG_INFINITY,
        worst_count: 0,
        worst_len: Duration::ZERO,
        worst_bound: 0.0,
        worst_start: Duration::ZERO,
    };
    for i in 0..t.len() {
        for k in i..t.len() {
            let len = t[k] - t[i];
            let count = (k - i + 1) as f64;
            let bound = capacity + rate * (len + j);
            if count - bound > report.max_excess {
                report.max_excess = count - bound;
                report.worst_count = k - i + 1;
                report.worst_len = Duration::from_secs_f64(len);
                report.worst_bound = bound;
                report.worst_start = Duration::from_secs_f64(t[i]);
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_burst_over_capacity() {
        let ms = |v: u64| Duration::from_millis(v);
        let ok = [0, 0, 0, 100, 200, 300].map(ms);
        assert!(check(&ok, 10.0, 3.0, ms(0)).holds());
        let burst = [0, 0, 0, 0, 100].map(ms);
        let r = check(&burst, 10.0, 3.0, ms(0));
        assert!(!r.holds());
        assert_eq!(r.worst_count, 4);
    }
}
