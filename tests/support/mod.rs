//! Support code for the integration tests: real processes on ephemeral loopback ports.

pub mod redis_server;
