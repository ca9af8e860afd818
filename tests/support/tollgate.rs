//! tollgate for tests: in-process on port 0 (`Tollgate`), or the real binary as a child process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::telemetry::Metrics;
use tollgate::{App, Config, Parts};

/// `[server]` lines binding both listeners to free loopback ports.
pub const EPHEMERAL: &str = "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n";

/// An in-process tollgate; shut down (and drained) by [`Tollgate::shutdown`] or aborted on drop.
pub struct Tollgate {
    /// The proxy listener.
    pub proxy: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Tollgate {
    /// Starts tollgate with this TOML (which should include [`EPHEMERAL`]-style listeners).
    pub async fn start(toml: &str) -> Tollgate {
        let config = Config::from_toml("test.toml", toml).expect("test config is valid");
        let app = App::build(config).await.expect("tollgate builds");
        Tollgate::run(app)
    }

    /// Starts tollgate with replaced parts.
    pub async fn start_with(toml: &str, parts: Parts) -> Tollgate {
        let config = Config::from_toml("test.toml", toml).expect("test config is valid");
        let app = App::build_with(config, parts)
            .await
            .expect("tollgate builds");
        Tollgate::run(app)
    }

    fn run(app: App) -> Tollgate {
        let (proxy, admin, metrics) = (app.proxy_addr(), app.admin_addr(), app.metrics());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(app.run(async {
            let _ = stopped.await;
        }));
        Tollgate {
            proxy,
            admin,
            metrics,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// `http://PROXY{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.proxy, path)
    }

    /// `http://ADMIN{path}`.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{}", self.admin, path)
    }

    /// Signals shutdown and returns the task that finishes when the drain is over.
    pub fn begin_shutdown(&mut self) -> JoinHandle<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.take().expect("running")
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The tollgate binary built for these tests.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tollgate"))
}

/// A tollgate child process; killed on drop.
pub struct TollgateProcess {
    /// The child.
    pub child: Child,
    /// Its stderr log file.
    pub log: PathBuf,
}

impl TollgateProcess {
    /// Starts `tollgate run --config FILE` with fixed listen addresses written in the file.
    pub fn start(config_file: &std::path::Path, log: PathBuf) -> TollgateProcess {
        let err = std::fs::File::create(&log).expect("log file");
        let child = Command::new(binary())
            .arg("run")
            .arg("--config")
            .arg(config_file)
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn tollgate");
        TollgateProcess { child, log }
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits up to `timeout` for exit; returns the exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::SystemTime::now() + timeout;
        while std::time::SystemTime::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for TollgateProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port (bound then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A provider section pointing at `upstream`.
pub fn provider(name: &str, upstream: &str, rate: f64, capacity: f64) -> String {
    format!("[providers.{name}]\nupstream = \"{upstream}\"\nrate = {rate}\ncapacity = {capacity}\n")
}
