//! Integration tests: real tollgate, real fake provider, real sockets, real Redis. Tests whose
//! assertions are timing bounds live in `tests/timing` and run one at a time.

#[path = "../support/mod.rs"]
mod support;

mod config_files;
mod forward_proxy;
mod forwarding;
mod hardening;
mod lifecycle;
mod properties;
mod store_suite;
mod upstream_pool;
