use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // The run wrapper (hidden): what this tool's runs execute under (rubick_launch::wrap).
    let mut args = std::env::args_os();
    if args.nth(1).is_some_and(|a| a == rubick_launch::wrap::SUBCOMMAND) {
        let code = rubick_launch::wrap::main(args);
        return ExitCode::from(u8::try_from(code).unwrap_or(1));
    }
    let cli = rubick_profile::Cli::parse();
    rubick_io::cli::init_logging(&cli.log);
    rubick_io::cli::report(rubick_profile::run(cli))
}
