//! The `clawback-sidecar` command line. Every flag can also be given as a `CLAWBACK_*` variable
//! or in the TOML file; `--set key=value` reaches any other field.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use clawback_datapool::{TenantId, UnixMs};

use crate::app::App;
use crate::config::{Config, Overrides, UpstreamKind};
use crate::export::{self, Format};
use crate::{server, telemetry};

#[derive(Debug, Parser)]
#[command(name = "clawback-sidecar", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the OpenAI API and forward it to the upstream(s).
    Serve(ServeArgs),
    /// Print the `sha256:<hex>` form of an API key (read from stdin) for `[tenants.keys]`.
    HashKey,
    /// Write a tenant's completed trajectories as training rows (see sidecar/EXPORT.md).
    Export(ExportArgs),
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// TOML configuration file (see deploy/clawback.example.toml).
    #[arg(long, env = "CLAWBACK_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on, e.g. 127.0.0.1:8100 (port 0 picks a free port).
    #[arg(long, env = "CLAWBACK_LISTEN")]
    listen: Option<SocketAddr>,
    /// Upstream base URL; repeat (or comma-separate) for several.
    #[arg(long = "upstream", env = "CLAWBACK_UPSTREAM", value_delimiter = ',')]
    upstreams: Vec<String>,
    /// What the upstream is.
    #[arg(long, env = "CLAWBACK_UPSTREAM_KIND", value_enum)]
    upstream_kind: Option<UpstreamKind>,
    /// Redis for recorded trajectories (redis://, rediss://; AUTH in the URL).
    #[arg(long, env = "CLAWBACK_REDIS")]
    redis: Option<String>,
    /// Directory of the embedded store and the spool.
    #[arg(long, env = "CLAWBACK_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Any other config field, as `section.key=value` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

#[derive(Debug, Args)]
struct ExportArgs {
    /// The tenant whose trajectories are exported; never any other tenant's.
    #[arg(long)]
    tenant: TenantId,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
    /// Output file; JSONL goes to stdout without it, Parquet needs it.
    #[arg(long, required_if_eq("format", "parquet"))]
    out: Option<PathBuf>,
    /// Only trajectories completed since: an RFC 3339 time or a duration back from now (24h).
    #[arg(long, value_parser = export::parse_since)]
    since: Option<UnixMs>,
    /// At most this many trajectories, oldest first.
    #[arg(long)]
    limit: Option<usize>,
    /// TOML configuration file: the store is chosen as for `serve`.
    #[arg(long, env = "CLAWBACK_CONFIG")]
    config: Option<PathBuf>,
    /// Redis the sidecar records into (redis://, rediss://; AUTH in the URL).
    #[arg(long, env = "CLAWBACK_REDIS")]
    redis: Option<String>,
    /// Directory of the embedded store (used when no Redis is configured).
    #[arg(long, env = "CLAWBACK_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

/// Parses the command line and runs it; the binary's whole `main`.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::HashKey => {
            let mut key = String::new();
            if let Err(e) = std::io::stdin().read_line(&mut key) {
                return fail(&e);
            }
            println!("{}", crate::tenant::key_hash(key.trim()));
            ExitCode::SUCCESS
        }
        Command::Export(args) => export(args),
    }
}

fn export(args: ExportArgs) -> ExitCode {
    let overrides = Overrides {
        redis: args.redis,
        data_dir: args.data_dir,
        ..Overrides::default()
    };
    let config = match Config::load(args.config.as_deref(), &overrides) {
        Ok(config) => config,
        Err(e) => return fail(&e),
    };
    let options = export::Options {
        tenant: args.tenant,
        format: args.format,
        out: args.out,
        since: args.since,
        limit: args.limit,
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&e),
    };
    let result = runtime.block_on(async {
        let store = export::open_store(&config).await?;
        export::run(store.as_ref(), &options).await
    });
    match result {
        Ok(summary) => {
            // stderr: stdout may be the JSONL itself.
            eprintln!("clawback-sidecar: {summary}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    let overrides = Overrides {
        listen: args.listen,
        upstreams: (!args.upstreams.is_empty()).then_some(args.upstreams),
        upstream_kind: args.upstream_kind,
        redis: args.redis,
        data_dir: args.data_dir,
        set: args.set,
    };
    let config = match Config::load(args.config.as_deref(), &overrides) {
        Ok(config) => config,
        Err(e) => return fail(&e),
    };
    if let Err(e) = telemetry::init(&config.log) {
        return fail(&e);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&e),
    };
    runtime.block_on(async move {
        let listener = match server::bind(config.listen).await {
            Ok(listener) => listener,
            Err(e) => return fail(&e),
        };
        let app = match App::new(config).await {
            Ok(app) => app,
            Err(e) => return fail(&e),
        };
        match listener.local_addr() {
            // A fixed, plain line on stdout: scripts and tests wait for it.
            Ok(addr) => println!("clawback-sidecar listening on http://{addr}"),
            Err(e) => return fail(&e),
        }
        tracing::info!(
            upstreams = ?app.config.upstreams,
            kind = ?app.config.upstream_kind,
            "serving"
        );
        server::serve(listener, app, shutdown_signal()).await;
        ExitCode::SUCCESS
    })
}

fn fail(error: &dyn std::error::Error) -> ExitCode {
    let mut message = format!("clawback-sidecar: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    eprintln!("{message}");
    ExitCode::FAILURE
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
