//! The `tracepass` binary: mimalloc as the allocator, then the command line.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tracepass_cli::alloc::keep_freed_memory();
    tracepass_cli::main()
}
