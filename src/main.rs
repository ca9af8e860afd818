//! The `tollgate` command: parse arguments, load config, run or check.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tollgate::telemetry::{init_logging, LogFormat};
use tollgate::{App, Config};

/// jemalloc, not glibc's malloc: it keeps no header beside an allocation, so the 8 KiB buffers hyper
/// gives each connection cost no memory until written (bench/PROFILE.md, 10k held requests).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    version,
    about = "A rate-limiting proxy that keeps workers inside a provider's quota"
)]
struct Cli {
    /// The TOML config file.
    #[arg(long, global = true, default_value = "config/example.toml")]
    config: PathBuf,
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Start the proxy (the default).
    Run,
    /// Validate the config and print the resolved buckets.
    Check,
}

// The caller's runtime only loads the config, runs the admin listener, signals and probes: requests are
// served by `server.threads` single-threaded runtimes of their own (see `App::run`).
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let config = match Config::load(&cli.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Check) = cli.command {
        print!("{}", config.summary());
        return ExitCode::SUCCESS;
    }
    match App::build(config).await {
        Ok(app) => app.run(tollgate::app::shutdown_signal()).await,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
