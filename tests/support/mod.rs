//! Real parts for integration tests, on ephemeral loopback ports: a fake provider, tollgate, an HTTP
//! client, redis-server, and the sliding-window check.
#![allow(dead_code)]

pub mod client;
pub mod fake_provider;
pub mod naive_store;
pub mod raw_provider;
pub mod redis_server;
pub mod swarm;
pub mod tollgate;
pub mod window;

/// A loopback port the OS had free a moment ago (it lives in redis_server.rs, which the benches
/// include on its own).
pub use redis_server::free_port;
