//! The sidecar binary, built inside the test crate so process-level tests (signals, exit
//! codes) can run it: `env!("CARGO_BIN_EXE_sidecar")`.

fn main() -> std::process::ExitCode {
    clawback_sidecar::cli::main()
}
