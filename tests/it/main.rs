//! Integration tests: real tollgate, real fake provider, real sockets, real Redis.

#[path = "../support/mod.rs"]
mod support;

mod config_files;
mod forward_proxy;
mod forwarding;
mod hardening;
mod lifecycle;
mod limiting;
mod properties;
mod shared;
mod store_suite;
