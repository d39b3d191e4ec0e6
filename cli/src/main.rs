//! `postmesh`, the Postmesh command-line client: parses the command line, runs the command on
//! a single-threaded runtime, and reports a failure as one `error: ...` line and exit code 1.

mod api;
mod cli;
mod commands;
mod config;
mod output;
mod progress;

use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
        .and_then(|runtime| runtime.block_on(commands::run(cli)));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            output::note(&output::error_line(&error));
            ExitCode::FAILURE
        }
    }
}
