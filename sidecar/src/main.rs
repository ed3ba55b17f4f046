//! `clawback-sidecar`: see [`clawback_sidecar::cli`].

// The request path allocates small buffers per call; mimalloc's thread-local free lists keep
// that off glibc malloc's locks (measured: malloc was ~10 % of the sidecar's CPU under load).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    clawback_sidecar::cli::main()
}
