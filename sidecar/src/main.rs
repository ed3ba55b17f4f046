fn main() -> std::process::ExitCode {
    clawback_sidecar::cli::main()
}
