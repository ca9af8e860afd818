//! Integration tests.

#[path = "../support/mod.rs"]
mod support;

mod store_suite;
