//! The `clawback-sidecar` command line. Every flag can also be given as a `CLAWBACK_*` variable
//! or in the TOML file; `--set key=value` reaches any other field.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use clawback_datapool::{NextState, Step, TenantId, UnixMs};
use clawback_filters::standalone::Standalone;
use clawback_filters::FiltersConfig;

use crate::app::App;
use crate::config::{Config, FilterOverrides, Overrides, UpstreamKind};
use crate::control_plane::export::{self, Format};
use crate::data_plane::server;
use crate::telemetry;
use tokio::net::TcpListener;

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
    /// Print the configuration file's JSON Schema (for editors that check TOML against one).
    ConfigSchema,
    /// Write a tenant's completed trajectories as training rows (the book: Exporting trajectories).
    Export(ExportArgs),
    /// Check or try out a filter plugin (the book: Writing a reward plugin).
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Load a plugin as the sidecar would, check its world, print what it exports.
    Check {
        /// The plugin component (`NAME.wasm`).
        file: PathBuf,
    },
    /// Run a plugin's `evaluate-step` on a recorded step and print the evaluation (JSON).
    Run {
        /// The plugin component (`NAME.wasm`).
        file: PathBuf,
        /// A recorded step (the datapool's Step JSON).
        #[arg(long)]
        step: PathBuf,
        /// What followed it (a NextState JSON); default: the step's own `next_state`.
        #[arg(long)]
        next: Option<PathBuf>,
        /// The trajectory metadata plugins see (a JSON object).
        #[arg(long)]
        metadata: Option<PathBuf>,
        /// TOML configuration file: `[filters]` gives the judge, limits and plugin config.
        #[arg(long, env = "CLAWBACK_CONFIG")]
        config: Option<PathBuf>,
        /// Any other config field, as `section.key=value` (repeatable).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        set: Vec<String>,
    },
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
    /// Directory of filter plugins (`*.wasm`) that score recorded steps; hot-reloaded.
    #[arg(long, env = "CLAWBACK_PLUGINS")]
    plugins: Option<PathBuf>,
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

/// The command line as clap knows it: what `--help` prints, and what the book's reference is
/// generated from.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
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
            println!("{}", crate::data_plane::tenant::key_hash(key.trim()));
            ExitCode::SUCCESS
        }
        Command::ConfigSchema => match serde_json::to_string_pretty(&crate::config::schema()) {
            Ok(schema) => {
                println!("{schema}");
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e),
        },
        Command::Export(args) => export(args),
        Command::Plugin(command) => plugin(command),
    }
}

fn plugin(command: PluginCommand) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&e),
    };
    match command {
        PluginCommand::Check { file } => runtime.block_on(async {
            match Standalone::load(&file, FiltersConfig::default()).await {
                Ok(plugin) => {
                    print!("{}", plugin.report());
                    ExitCode::SUCCESS
                }
                Err(e) => fail(&e),
            }
        }),
        PluginCommand::Run {
            file,
            step,
            next,
            metadata,
            config,
            set,
        } => {
            let overrides = Overrides {
                set,
                ..Overrides::default()
            };
            let config = match Config::load(config.as_deref(), &overrides) {
                Ok(config) => config,
                Err(e) => return fail(&e),
            };
            let inputs = read_json::<Step>(&step).and_then(|step| {
                let next = match &next {
                    Some(path) => read_json::<NextState>(path)?,
                    None => step.next_state.clone().ok_or_else(|| {
                        PluginInputError(format!(
                            "{} has no next_state: give one with --next",
                            step_path(&step)
                        ))
                    })?,
                };
                let metadata = match &metadata {
                    Some(path) => read_json(path)?,
                    None => serde_json::Map::new(),
                };
                Ok((step, next, metadata))
            });
            let (step, next, metadata) = match inputs {
                Ok(inputs) => inputs,
                Err(e) => return fail(&e),
            };
            runtime.block_on(async {
                let plugin = match Standalone::load(&file, config.filters).await {
                    Ok(plugin) => plugin,
                    Err(e) => return fail(&e),
                };
                let called = plugin
                    .run_step(step.tenant.as_str(), &step, &next, &metadata)
                    .await;
                // The fuel it burnt: what an operator sizes `filters.fuel` from.
                let evaluation = match called.result {
                    Ok(evaluation) => serde_json::json!({
                        "kind": "score",
                        "reward": evaluation.reward,
                        "hint": evaluation.hint,
                        "labels": evaluation.labels.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
                        "fuel_used": called.fuel_used,
                    }),
                    Err(failure) => serde_json::json!({
                        "kind": "filter_error",
                        "reason": failure.reason,
                        "fuel_used": called.fuel_used,
                    }),
                };
                println!("{evaluation}");
                ExitCode::SUCCESS
            })
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct PluginInputError(String);

fn step_path(step: &Step) -> String {
    format!("step {}", step.id)
}

fn read_json<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
) -> Result<T, PluginInputError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| PluginInputError(format!("cannot read {}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| PluginInputError(format!("{} is not what was expected: {e}", path.display())))
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
        let store = export::open_store(config.store()).await?;
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
        filters: args.plugins.map(|dir| FilterOverrides { dir }),
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
        let (listen, admin_listen) = (config.listen, config.admin.listen);
        // Ready first (datapool, plugins, a predecessor's journal under way), then listening:
        // a replica that is starting accepts no connection it would only leave waiting, so a
        // front door sends the call to another one meanwhile.
        let app = match App::new(config).await {
            Ok(app) => app,
            Err(e) => return fail(&e),
        };
        let listener = match server::bind(listen).await {
            Ok(listener) => listener,
            Err(e) => return fail(&e),
        };
        let admin = match admin_listen {
            Some(addr) => match server::bind(addr).await {
                Ok(listener) => Some(listener),
                Err(e) => return fail(&e),
            },
            None => None,
        };
        if let Some(Ok(addr)) = admin.as_ref().map(TcpListener::local_addr) {
            println!("clawback-sidecar admin API listening on http://{addr}");
        }
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
        let mut listeners = vec![(listener, server::Port::Agent)];
        listeners.extend(admin.map(|admin| (admin, server::Port::Admin)));
        crate::app::serve_on(listeners, app, shutdown_signal()).await;
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
