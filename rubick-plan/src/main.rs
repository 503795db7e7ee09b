use std::process::ExitCode;

use clap::Parser;

/// A round allocates and frees many small vectors (candidates, node states, the
/// placements they hold): mimalloc's size classes take the whole Philly trace on
/// 4,096 GPUs in less time than the system allocator's bins.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = rubick_plan::Cli::parse();
    rubick_io::cli::init_logging(&cli.log);
    rubick_io::cli::report(rubick_plan::run(cli))
}
