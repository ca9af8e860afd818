//! tollgate: an HTTP proxy that keeps a fleet of workers inside a provider's rate limit.
//!
//! ```text
//!  worker ──http──▶ http::proxy ──▶ route ──▶ gate ──▶ «Store» ◀── memory | redis | fallback
//!                        │                      │ hold until the slot
//!                        └────────▶ upstream ───┴──https──▶ provider
//! ```
//!
//! A request finds its bucket (`route`), reserves a slot in one store call and waits for it (`gate`),
//! goes upstream (`upstream`) and comes back with `X-Tollgate-*` headers (`http`).

pub mod affinity;
pub mod app;
pub mod config;
pub mod gate;
pub mod http;
pub mod route;
pub mod store;
pub mod telemetry;
pub mod upstream;

pub use app::{App, AppError, Parts};
pub use config::{Config, ConfigError};
