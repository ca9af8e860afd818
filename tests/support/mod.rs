//! Real parts for integration tests, on ephemeral loopback ports: a fake provider, tollgate, an HTTP
//! client, redis-server, and the sliding-window check.
#![allow(dead_code)]

pub mod client;
pub mod fake_provider;
pub mod raw_provider;
pub mod redis_server;
pub mod tollgate;
pub mod window;
