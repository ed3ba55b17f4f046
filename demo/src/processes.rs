//! The demo's child processes: the reference backend, the sidecars and the trainer, each with
//! its output in a log file, started and waited on until it says where it listens, stopped
//! with SIGTERM (so the trainer checkpoints) and killed when the demo ends in any way.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A running child, killed on drop.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    /// Signals go to its whole process group (it starts processes of its own, as vLLM does).
    group: bool,
}

/// What to start: the program and its arguments, and whether it leads a process group of its
/// own that is signalled as a whole.
pub struct Spawn {
    pub command: Command,
    pub group: bool,
}

impl Spawn {
    pub fn new(program: &Path, args: &[String]) -> Self {
        let mut command = Command::new(program);
        command.args(args);
        Spawn {
            command,
            group: false,
        }
    }

    /// The child leads a process group of its own, stopped and killed as one.
    pub fn grouped(mut self) -> Self {
        use std::os::unix::process::CommandExt;
        self.command.process_group(0);
        self.group = true;
        self
    }
}

impl Process {
    /// Starts `program args`, its stdout and stderr appended to `<log_dir>/<name>.log`. With a
    /// `banner`, waits (up to `wait`) for the stdout line that starts with it and returns the
    /// rest of that line (the address the process listens on).
    pub fn start(
        name: &str,
        program: &Path,
        args: &[String],
        log_dir: &Path,
        banner: Option<&str>,
        wait: Duration,
    ) -> Result<(Self, Option<String>)> {
        Self::spawn(name, Spawn::new(program, args), log_dir, banner, wait)
    }

    /// [`Process::start`] for a prepared [`Spawn`].
    pub fn spawn(
        name: &str,
        spawn: Spawn,
        log_dir: &Path,
        banner: Option<&str>,
        wait: Duration,
    ) -> Result<(Self, Option<String>)> {
        let Spawn { mut command, group } = spawn;
        let program = command.get_program().to_string_lossy().into_owned();
        let log = log_dir.join(format!("{name}.log"));
        let open = || {
            File::options()
                .create(true)
                .append(true)
                .open(&log)
                .with_context(|| format!("opening {}", log.display()))
        };
        let mut stdout_log = open()?;
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(open()?)
            .spawn()
            .with_context(|| format!("starting {name}: {program}"))?;
        let stdout = child.stdout.take().context("the child's stdout")?;
        let (found, banner_line) = mpsc::channel();
        let wanted = banner.map(str::to_owned);
        std::thread::spawn(move || {
            let mut found = Some(found);
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(stdout_log, "{line}");
                if let (Some(prefix), Some(_)) = (&wanted, &found) {
                    if let Some(rest) = line.strip_prefix(prefix.as_str()) {
                        let _ = found.take().map(|tx| tx.send(rest.trim().to_owned()));
                    }
                }
            }
        });
        let mut process = Self {
            name: name.to_owned(),
            child,
            log,
            group,
        };
        let Some(banner) = banner else {
            return Ok((process, None));
        };
        let started = Instant::now();
        loop {
            match banner_line.recv_timeout(Duration::from_millis(100)) {
                Ok(rest) => return Ok((process, Some(rest))),
                Err(mpsc::RecvTimeoutError::Timeout) if started.elapsed() < wait => {
                    if let Some(status) = process.child.try_wait()? {
                        bail!(
                            "{name} exited ({status}) before it listened: {}",
                            process.tail()
                        );
                    }
                }
                Err(_) => {
                    process.kill();
                    bail!(
                        "{name} did not print {banner:?} within {wait:?}: {}",
                        process.tail()
                    );
                }
            }
        }
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then up to `grace` to exit, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        if !self.running() {
            return;
        }
        self.signal("-TERM");
        let started = Instant::now();
        while started.elapsed() < grace {
            if !self.running() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }

    /// SIGKILL (to the whole group when it leads one), and reaps it.
    pub fn kill(&mut self) {
        if self.group {
            self.signal("-KILL");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The process's id as `kill` takes it: negative for its whole group.
    fn signal(&self, signal: &str) {
        let pid = self.child.id().to_string();
        let target = if self.group { format!("-{pid}") } else { pid };
        // A group whose processes all exited already is no news.
        let _ = Command::new("kill")
            .args([signal, "--", &target])
            .stderr(Stdio::null())
            .status();
    }

    /// The last lines of its log, for error messages.
    pub fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(8);
        format!(
            "{} (log {}):\n{}",
            self.name,
            self.log.display(),
            lines[start..].join("\n")
        )
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}
