//! `sopactl`: the operator CLI of SOPA.

mod topo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// SOPA operator CLI.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fabric models: properties, cost, candidate paths, the MODRIC paper's tables.
    #[command(subcommand)]
    Topo(topo::TopoCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Topo(cmd) => topo::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sopactl: {err:#}");
            // Bad flags and topologies are configuration errors (sysexits' EX_USAGE family).
            ExitCode::from(64)
        }
    }
}
