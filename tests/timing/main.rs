//! Tests whose assertions are timing bounds: the sliding-window invariant at the provider (with a
//! 10 ms delivery-jitter allowance) and release-time accuracy. They run one at a time
//! (`--test-threads=1`, see scripts/test) so that one test's load is not another's jitter.

#[path = "../support/mod.rs"]
mod support;

mod held;
mod limiting;
mod outage;
mod shared;
