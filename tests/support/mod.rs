//! Real parts for integration tests: a fake provider, tollgate on port 0, an HTTP client, and the
//! sliding-window check.
#![allow(dead_code)]

pub mod client;
pub mod fake_provider;
pub mod raw_provider;
pub mod tollgate;
pub mod window;
