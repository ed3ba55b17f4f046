//! The mock inference engine as a process, for the load harness and local experiments.
//! Prints `mock-upstream listening on http://ADDR` once it serves.

use std::net::SocketAddr;

use clap::Parser;

#[derive(Parser)]
struct Args {
    /// Address to listen on (port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// Answer every chat call with a text of this many bytes (one token per word, each with
    /// its logprob when asked) instead of the usual reply.
    #[arg(long)]
    answer_bytes: Option<usize>,
    /// Wait this long before every response head, as an engine busy prefilling and decoding.
    #[arg(long, default_value_t = 0)]
    head_delay_ms: u64,
    /// Streamed answers to requests with an `x-mock-paced` header send their events this many
    /// ms apart, each stamped with when it was sent (the bench's paced phase).
    #[arg(long, default_value_t = 25)]
    paced_gap_ms: u64,
}

/// Words up to `bytes` bytes, as a model's answer reads.
fn answer_of(bytes: usize) -> String {
    const WORDS: &str = "The forecast for Paris shows mild temperatures with light winds and a \
        chance of rain in the evening, so an umbrella is a sensible choice for the walk home.";
    let mut text = String::with_capacity(bytes + WORDS.len());
    while text.len() < bytes {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS);
    }
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
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
        mock.set_behaviour(clawback_tests::mock::Behaviour {
            answer_text: args.answer_bytes.map(answer_of),
            head_delay: std::time::Duration::from_millis(args.head_delay_ms),
            paced: Some(std::time::Duration::from_millis(args.paced_gap_ms)),
            ..Default::default()
        });
        println!("mock-upstream listening on {}", mock.url());
        let _ = tokio::signal::ctrl_c().await;
    });
    std::process::ExitCode::SUCCESS
}
