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

use super::free_port;

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

/// The tollgate binary built for these tests (`TOLLGATE_BIN` overrides it, e.g. with a release build).
pub fn binary() -> PathBuf {
    std::env::var_os("TOLLGATE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_tollgate")))
}

/// A tollgate child process; killed on drop.
pub struct TollgateProcess {
    /// The child.
    pub child: Child,
    /// Its stderr log file.
    pub log: PathBuf,
    /// Its proxy base URL.
    pub proxy: String,
    /// Its admin base URL.
    pub admin: String,
    /// Its temp dir (config and log), removed on drop.
    dir: PathBuf,
}

impl TollgateProcess {
    /// Writes `body` (everything but `[server]` listen addresses, which it picks) to a temp config,
    /// starts `tollgate run --log-format json` on it and waits until the admin listener answers.
    pub async fn launch(server_extra: &str, body: &str) -> TollgateProcess {
        TollgateProcess::launch_with_env(server_extra, body, &[]).await
    }

    /// [`TollgateProcess::launch`] with extra environment variables (e.g. `RUST_LOG`).
    pub async fn launch_with_env(
        server_extra: &str,
        body: &str,
        env: &[(&str, &str)],
    ) -> TollgateProcess {
        let (port, admin) = (free_port(), free_port());
        let dir = std::env::temp_dir().join(format!("tollgate-test-{port}-{admin}"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let cfg = dir.join("tollgate.toml");
        std::fs::write(
            &cfg,
            format!("[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin}\"\n{server_extra}\n{body}"),
        )
        .expect("write config");
        let err = std::fs::File::create(dir.join("stderr.log")).expect("log file");
        let child = Command::new(binary())
            .args(["run", "--log-format", "json", "--config"])
            .arg(&cfg)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn tollgate");
        let proc = TollgateProcess {
            child,
            log: dir.join("stderr.log"),
            proxy: format!("http://127.0.0.1:{port}"),
            admin: format!("http://127.0.0.1:{admin}"),
            dir,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", admin))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "tollgate did not start: {}",
                proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proc
    }

    /// Log lines whose message contains `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        self.log_text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(String::from)
            .collect()
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
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A provider section pointing at `upstream`.
pub fn provider(name: &str, upstream: &str, rate: f64, capacity: f64) -> String {
    format!("[providers.{name}]\nupstream = \"{upstream}\"\nrate = {rate}\ncapacity = {capacity}\n")
}

/// `[store]` and `[fallback]` sections for a Redis store at `url`.
pub fn redis_sections(url: &str, timeout: &str, clock: &str, mode: &str, replicas: u32) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout = \"{timeout}\"\nclock = \"{clock}\"\n\
         [fallback]\nmode = \"{mode}\"\nexpected_replicas = {replicas}\n"
    )
}
