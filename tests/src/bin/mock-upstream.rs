//! The mock inference engine as a process, for the load harness and local experiments.
//! Prints `mock-upstream listening on http://ADDR` once it serves.

use std::net::SocketAddr;

use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Address to listen on (port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("mock-upstream: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let mock = clawback_tests::mock::MockUpstream::start_on(args.listen).await;
        mock.stop_recording();
        println!("mock-upstream listening on {}", mock.url());
        let _ = tokio::signal::ctrl_c().await;
    });
    std::process::ExitCode::SUCCESS
}
