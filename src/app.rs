//! Wiring: build the store, gate, upstream client and both listeners from a [`Config`], then serve
//! until a shutdown future resolves, draining held and in-flight requests.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;

use crate::config::{Config, StoreBackend};
use crate::gate::Gate;
use crate::http::admin::Admin;
use crate::http::proxy::{Limits, Proxy};
use crate::http::ConnLimits;
use crate::store::{
    Bucket, FallbackStore, MemoryStore, MonotonicClock, RedisStore, Store, WallClock,
};
use crate::telemetry::Metrics;
use crate::upstream::{GuardedResolver, HttpClient, Timeouts, UpstreamClient};

/// Why the application could not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The configured store cannot be used.
    #[error("store: {0}")]
    Store(String),
}

/// The parts a test (or an embedding program) may replace.
pub struct Parts {
    /// Where bucket state lives.
    pub store: Arc<dyn Store>,
    /// How requests reach providers.
    pub upstream: Arc<dyn UpstreamClient>,
}

/// A built, bound, not yet running tollgate.
pub struct App {
    config: Config,
    proxy_listener: TcpListener,
    admin_listener: TcpListener,
    proxy: Arc<Proxy>,
    metrics: Arc<Metrics>,
}

impl App {
    /// Builds the configured store and upstream client, and binds both listeners.
    pub async fn build(config: Config) -> Result<App, AppError> {
        let store: Arc<dyn Store> = match config.store.backend {
            StoreBackend::Memory => Arc::new(MemoryStore::new(Arc::new(MonotonicClock::new()))),
            StoreBackend::Redis => Arc::new(
                RedisStore::connect(&config.store, Arc::new(WallClock))
                    .map_err(|e| AppError::Store(e.message))?,
            ),
        };
        let allow_private = config
            .buckets
            .iter()
            .filter(|b| b.allow_private)
            .map(|b| b.upstream.host().to_ascii_lowercase())
            .collect();
        let upstream = Arc::new(HttpClient::new(
            Timeouts {
                connect: config.server.upstream_connect_timeout,
                response: config.server.upstream_timeout,
            },
            GuardedResolver::new(allow_private),
        ));
        App::build_with(config, Parts { store, upstream }).await
    }

    /// Binds both listeners around the given parts.
    pub async fn build_with(config: Config, parts: Parts) -> Result<App, AppError> {
        let proxy_listener = bind(config.server.listen)?;
        let admin_listener = bind(config.server.admin_listen)?;
        let metrics = Arc::new(Metrics::new());
        let store: Arc<dyn Store> = if parts.store.can_fail() {
            let buckets = config
                .buckets
                .iter()
                .map(|b| (Bucket::from(b), metrics.bucket(&b.name()).fallback_active))
                .collect();
            Arc::new(FallbackStore::new(
                parts.store,
                config.fallback.clone(),
                buckets,
                metrics.clone(),
            ))
        } else {
            parts.store
        };
        let proxy = Arc::new(Proxy::new(
            &config.buckets,
            Gate::new(store),
            parts.upstream,
            &metrics,
            Limits {
                max_wait: config.server.max_wait,
                max_held: config.server.max_held,
                max_held_per_bucket: config.server.max_held_per_bucket,
                max_body_bytes: config.server.max_body_bytes,
            },
        ));
        Ok(App {
            config,
            proxy_listener,
            admin_listener,
            proxy,
            metrics,
        })
    }

    /// The proxy listener's address (useful with port 0).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_listener
            .local_addr()
            .unwrap_or(self.config.server.listen)
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_listener
            .local_addr()
            .unwrap_or(self.config.server.admin_listen)
    }

    /// The metrics registry.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Serves until `shutdown` resolves, then drains held and in-flight requests for up to
    /// `server.shutdown_grace`. The admin listener answers until the drain is over.
    ///
    /// Requests are served by `server.threads` threads, each with its own single-threaded event loop
    /// accepting from the same listener: a request, its upstream connection and its Redis connection
    /// then live on one thread, with no wake-ups across threads (bench/PROFILE.md §8). The admin
    /// listener, signals and background probes stay on the caller's runtime.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let grace = self.config.server.shutdown_grace;
        let threads = self.config.server.threads.max(1);
        tracing::info!(
            proxy = %self.proxy_addr(),
            admin = %self.admin_addr(),
            store = self.proxy.gate().store().backend(),
            buckets = self.config.buckets.len(),
            threads,
            "tollgate is serving"
        );
        let admin = Arc::new(Admin::new(self.proxy.clone(), self.metrics.clone()));
        let admin_service = service_fn(move |req| {
            let admin = admin.clone();
            async move { Ok::<_, Infallible>(admin.handle(req).await) }
        });
        let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
        let admin_task = tokio::spawn(crate::http::serve(
            self.admin_listener,
            ConnLimits::default(),
            Gauge::default(),
            admin_service,
            async {
                let _ = admin_stopped.await;
            },
            grace,
        ));

        let conn_limits = ConnLimits {
            max_headers: self.config.server.max_headers,
            max_header_bytes: self.config.server.max_header_bytes,
            header_read_timeout: self.config.server.header_read_timeout,
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let workers = match self.proxy_listener.into_std() {
            Ok(listener) => (0..threads)
                .filter_map(|i| {
                    spawn_worker(
                        i,
                        &listener,
                        conn_limits,
                        self.metrics.connections.clone(),
                        self.proxy.clone(),
                        stopped.clone(),
                        grace,
                    )
                })
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot hand the proxy listener to the request threads");
                Vec::new()
            }
        };
        if workers.len() < threads {
            tracing::error!(
                started = workers.len(),
                threads,
                "not every request thread started"
            );
        }

        shutdown.await;
        tracing::info!(grace = ?grace, "shutting down: no new connections; draining held and in-flight requests");
        let _ = stop.send(true);
        let mut drained = !workers.is_empty();
        for worker in workers {
            drained &= worker.await.unwrap_or(false);
        }
        if drained {
            tracing::info!("drained; exiting");
        } else {
            tracing::warn!(grace = ?grace, "shutdown grace elapsed with requests still open; exiting anyway");
        }
        let _ = admin_stop.send(());
        let _ = admin_task.await;
    }
}

/// Starts request thread `index`: a single-threaded runtime serving `listener` (a duplicate of the
/// shared socket) until `stop` turns true, then draining for up to `grace`. The receiver gets whether
/// it drained in time; `None` if the thread could not be started.
fn spawn_worker(
    index: usize,
    listener: &std::net::TcpListener,
    limits: ConnLimits,
    connections: Gauge,
    proxy: Arc<Proxy>,
    mut stop: tokio::sync::watch::Receiver<bool>,
    grace: std::time::Duration,
) -> Option<tokio::sync::oneshot::Receiver<bool>> {
    let listener = match listener.try_clone() {
        Ok(listener) => listener,
        Err(e) => {
            tracing::error!(thread = index, error = %e, "cannot share the proxy listener");
            return None;
        }
    };
    let (done, finished) = tokio::sync::oneshot::channel();
    let body = move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                tracing::error!(thread = index, error = %e, "cannot start a request thread's runtime");
                let _ = done.send(false);
                return;
            }
        };
        let drained = runtime.block_on(async move {
            let listener = match TcpListener::from_std(listener) {
                Ok(listener) => listener,
                Err(e) => {
                    tracing::error!(thread = index, error = %e, "cannot listen on a request thread");
                    return false;
                }
            };
            let service = service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(proxy.handle(req).await) }
            });
            crate::http::serve(
                listener,
                limits,
                connections,
                service,
                async move {
                    let _ = stop.wait_for(|stopped| *stopped).await;
                },
                grace,
            )
            .await
        });
        let _ = done.send(drained);
    };
    match std::thread::Builder::new()
        .name(format!("tollgate-{index}"))
        .spawn(body)
    {
        Ok(_) => Some(finished),
        Err(e) => {
            tracing::error!(thread = index, error = %e, "cannot start a request thread");
            None
        }
    }
}

/// Binds a listener with a deep accept queue: a fleet of workers reconnecting at once (after a deploy,
/// say) should wait in the kernel's queue, not see connection resets.
fn bind(addr: SocketAddr) -> Result<TcpListener, AppError> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    };
    socket
        .and_then(|s| {
            s.set_reuseaddr(true)?;
            s.bind(addr)?;
            s.listen(4096)
        })
        .map_err(|source| AppError::Bind { addr, source })
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
