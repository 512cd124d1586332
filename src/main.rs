//! `leasehold`: a runner in the foreground and the operator's tool for a leasehold database.
//!
//! A thin client of the library: it parses, calls and prints. Exit 0 on success, 1 when the
//! operation is refused or fails (the database, the job's state), 2 on a usage error; always
//! one line on stderr saying why.

mod cli;

use std::process::ExitCode;

use crate::cli::Failure;

fn main() -> ExitCode {
    let cli = match cli::parse() {
        Ok(cli) => cli,
        Err(e) => return cli::report_clap(&e),
    };
    cli::init_logging(&cli);
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match Failure::classify(&e) {
            // The reader of our output went away (`leasehold jobs logs 1 | head`): not an error.
            Failure::BrokenPipe => ExitCode::SUCCESS,
            failure => {
                eprintln!("leasehold: {}", cli::one_line(&format!("{e:#}")));
                failure.exit_code()
            }
        },
    }
}
