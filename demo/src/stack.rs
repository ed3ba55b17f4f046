//! The processes of one demo run: the engine on the taught model, the sidecar replicas in front
//! of it and the trainer behind them — started in that order, each told where the others are by
//! the config files a deployment would write, and stopped together.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::engine::{Backend, Engine, Lora, Served};
use crate::files::{self, Plugin, RunDir, Training, Wiring};
use crate::processes::Process;
use crate::{say, DemoTenant};

/// What to start.
pub struct StackSpec<'a> {
    pub run: &'a RunDir,
    pub engine: &'a Engine,
    /// What the engine serves from the run's model folder.
    pub served: Served,
    pub trainer: &'a Path,
    /// The reference backend's binary (`clawback-serve`).
    pub serve: &'a Path,
    pub sidecar: &'a Path,
    pub redis: Option<&'a str>,
    pub tenants: &'a [DemoTenant],
    pub replicas: u32,
    /// The plugins the sidecars run, each from `<plugins>/<name>.wasm`.
    pub plugins: &'a [Plugin],
    pub plugin_dir: &'a Path,
    pub idle_timeout: &'a str,
    pub training: Training,
}

/// The running processes; killed when dropped, [`Stack::stop`] lets the trainer checkpoint.
pub struct Stack {
    pub backend: Backend,
    pub sidecars: Vec<Process>,
    pub sidecar_urls: Vec<String>,
    pub trainer: Process,
    pub admin_token: String,
}

impl Stack {
    pub fn start(spec: &StackSpec<'_>) -> Result<Stack> {
        let run = spec.run;
        for plugin in spec.plugins {
            let file = format!("{}.wasm", plugin.name);
            let source = spec.plugin_dir.join(&file);
            std::fs::copy(&source, run.plugins().join(&file)).with_context(|| {
                format!(
                    "copying {}: build the plugins (cd wasm-plugins && cargo build --release \
                     --target wasm32-wasip2)",
                    source.display()
                )
            })?;
        }
        say(&format!("starting {}", spec.engine.describe()));
        let lora = Lora {
            // Each tenant's live version and the one replacing it, side by side while it drains.
            max_adapters: 2 * spec.tenants.len(),
            max_rank: spec.training.rank,
        };
        let backend = Backend::start(
            spec.engine,
            spec.serve.to_owned(),
            run,
            0,
            lora,
            spec.served,
        )?;
        let model = match spec.served {
            Served::Tiny => "tiny model",
            Served::Pretrained => "real model",
        };
        say(&format!(
            "{} ({model}) on {}",
            spec.engine.describe(),
            backend.url()
        ));
        let admin_token = format!("demo-admin-{:x}", std::process::id());
        let backend_url = backend.url();
        let wiring = Wiring {
            run,
            backend: &backend_url,
            redis: spec.redis,
            admin_token: &admin_token,
            tenants: spec.tenants,
            engine: spec.engine,
            plugins: spec.plugins,
            idle_timeout: spec.idle_timeout,
        };
        let config = run.write("sidecar.toml", &files::sidecar_toml(&wiring))?;
        let mut sidecars = Vec::new();
        let mut sidecar_urls = Vec::new();
        for replica in 0..spec.replicas {
            let (process, addr) = Process::start(
                &format!("sidecar-{replica}"),
                spec.sidecar,
                &[
                    "serve".into(),
                    "--config".into(),
                    config.display().to_string(),
                ],
                &run.logs(),
                Some("clawback-sidecar listening on "),
                Duration::from_secs(120),
            )?;
            let url = addr.context("the sidecar's address")?;
            say(&format!("sidecar {replica} on {url}"));
            sidecars.push(process);
            sidecar_urls.push(url);
        }
        if let Some(first) = sidecar_urls.first() {
            say(&format!(
                "watch the trajectories, next states, rewards and hints arrive: {first}/ui#token={admin_token}"
            ));
        }
        let trainer_config = run.write(
            "trainer.toml",
            &files::trainer_toml(&wiring, &sidecar_urls, &spec.training),
        )?;
        let (trainer, _) = Process::start(
            "trainer",
            spec.trainer,
            &[
                "train".into(),
                "--config".into(),
                trainer_config.display().to_string(),
            ],
            &run.logs(),
            None,
            Duration::ZERO,
        )?;
        say(&format!(
            "trainer: one LoRA adapter per tenant, publishing into the backend and {} sidecar(s)",
            sidecar_urls.len()
        ));
        Ok(Stack {
            backend,
            sidecars,
            sidecar_urls,
            trainer,
            admin_token,
        })
    }

    /// Stops everything: the trainer first, with time to checkpoint on SIGTERM.
    pub fn stop(&mut self) {
        self.trainer.stop(Duration::from_secs(20));
        for sidecar in &mut self.sidecars {
            sidecar.stop(Duration::from_secs(5));
        }
        self.backend.process.stop(Duration::from_secs(5));
    }
}

/// `name` beside the running executable (`clawback-sidecar`, `clawback-trainer`).
pub fn beside_this_binary(name: &str) -> Result<PathBuf> {
    Ok(std::env::current_exe()
        .context("finding this executable")?
        .with_file_name(name))
}
