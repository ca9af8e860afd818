//! The clock seam: where the reservation math's `now` comes from.

use std::time::{SystemTime, UNIX_EPOCH};

/// A source of `now` in microseconds. Stores take one so tests can pause or skew time.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since this clock's epoch.
    fn now_micros(&self) -> u64;
}

/// Tokio's monotonic clock since start-up: cannot jump, and pauses with `tokio::time::pause`.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: tokio::time::Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> MonotonicClock {
        MonotonicClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn now_micros(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }
}

/// The host's wall clock (Unix microseconds): comparable across replicas only as far as their clocks agree.
#[derive(Debug, Clone, Copy, Default)]
pub struct WallClock;

impl Clock for WallClock {
    fn now_micros(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0)
    }
}
