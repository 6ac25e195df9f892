//! `sopactl`: the operator CLI of SOPA.

mod exit;
mod fabric;
mod hedera;
mod inventory;
mod topo;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// SOPA operator CLI.
#[derive(Parser)]
#[command(name = "sopactl", version, about, after_help = exit::help())]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Fabric models: properties, cost, candidate paths, the MODRIC paper's tables.
    #[command(subcommand)]
    Topo(topo::TopoCommand),
    /// An operator's fabric: generate a starting inventory, check one.
    #[command(subcommand)]
    Fabric(inventory::FabricCommand),
    /// Take a link down or bring it up (pushed to every agent as a new version), or trust it
    /// over the path meter's evidence (trust / untrust).
    Link {
        #[command(flatten)]
        conn: fabric::Connection,
        /// down or up.
        state: fabric::State,
        /// One end of the link (a node's name).
        a: String,
        /// The other end.
        b: String,
        #[command(flatten)]
        why: fabric::Why,
    },
    /// Take a switch down or bring it up.
    Switch {
        #[command(flatten)]
        conn: fabric::Connection,
        /// down or up.
        state: fabric::State,
        /// The switch's name.
        name: String,
        #[command(flatten)]
        why: fabric::Why,
    },
    /// Who changed what and why: the newest changes to the fabric (operators' drains, switches'
    /// reports, the path meter's suspects), oldest first.
    History {
        #[command(flatten)]
        conn: fabric::Connection,
        /// The newest N (0: every one kept, up to 1,000).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Print JSON instead of the report for people.
        #[arg(long)]
        json: bool,
    },
    /// Every agent: role, applied version, last ACK/NACK, connection state.
    Status {
        #[command(flatten)]
        conn: fabric::Connection,
        /// Print JSON instead of the report for people.
        #[arg(long)]
        json: bool,
    },
    /// The Hedera baseline's scheduler.
    #[command(subcommand)]
    Hedera(hedera::HederaCommand),
    /// Certificates for the channel's mutual TLS.
    #[command(subcommand)]
    Certs(fabric::CertsCommand),
    /// Print a shell completion script (e.g. `sopactl completions bash >
    /// /usr/share/bash-completion/completions/sopactl`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: sopa_ops::cli::Shell,
    },
    /// Write the man pages (sopactl.1 and one per subcommand) into DIR (the packages' build).
    #[command(hide = true)]
    Man {
        /// Where the pages go.
        dir: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    sopa_ops::duration::env_aliases(&[("SOPA_TIMEOUT_MS", "SOPA_TIMEOUT")]);
    let cli = Cli::parse();
    // What a command that only reads what it was given exits with when that is refused; one
    // that asks a controller: a failure, unless the answer says more (`exit::code`).
    let otherwise = match cli.command {
        Command::Topo(_) | Command::Fabric(_) | Command::Certs(_) => sopa_ops::exit::CONFIG,
        _ => sopa_ops::exit::FAILURE,
    };
    let result = match cli.command {
        Command::Topo(cmd) => topo::run(cmd),
        Command::Fabric(cmd) => inventory::run(cmd),
        Command::Link {
            conn,
            state,
            a,
            b,
            why,
        } => fabric::link(&conn, state, &a, &b, &why),
        Command::Switch {
            conn,
            state,
            name,
            why,
        } => fabric::switch(&conn, state, &name, &why),
        Command::History { conn, limit, json } => fabric::history(&conn, limit, json),
        Command::Status { conn, json } => fabric::status(&conn, json),
        Command::Hedera(cmd) => hedera::run(cmd),
        Command::Certs(cmd) => fabric::certs(cmd),
        Command::Completions { shell } => {
            sopa_ops::cli::print_completions(<Cli as clap::CommandFactory>::command(), shell);
            Ok(())
        }
        Command::Man { dir } => {
            sopa_ops::cli::write_man_pages(<Cli as clap::CommandFactory>::command(), &dir)
                .map(|pages| println!("{} man pages in {}", pages.len(), dir.display()))
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sopactl: {err:#}");
            ExitCode::from(exit::code(&err, otherwise))
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent_and_every_flag_has_help() {
        super::Cli::command().debug_assert();
        assert_eq!(
            sopa_ops::cli::undocumented(&super::Cli::command()),
            Vec::<String>::new()
        );
    }
}
