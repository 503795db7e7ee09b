use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = rubick_profile::Cli::parse();
    rubick_io::cli::init_logging(&cli.log);
    rubick_io::cli::report(rubick_profile::run(cli))
}
