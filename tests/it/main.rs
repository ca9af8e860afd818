//! Integration tests: real tollgate, real fake provider, real sockets (and real Redis where needed).

#[path = "../support/mod.rs"]
mod support;

mod config_files;
mod forward_proxy;
mod forwarding;
mod hardening;
mod lifecycle;
mod limiting;
mod properties;
