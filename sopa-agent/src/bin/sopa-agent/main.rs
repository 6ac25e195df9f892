//! `sopa-agent`: the SOPA host agent. Parses the command line, enters the namespace, and runs
//! one subcommand on a single-threaded runtime; each role waits for its signals itself.

mod channel;
mod cli;
mod detach;
mod doctor;
mod granularity;
mod labels;
mod run;
mod switch;

use std::process::ExitCode;

use clap::Parser as _;
use cli::{Cli, Command};
use sopa_agent::{Error, host, path_table::PathTable, status};

/// The `SOPA_*_MS` variables of the flags that became durations, read under their new names.
const RENAMED_VARIABLES: [(&str, &str); 4] = [
    ("SOPA_HEARTBEAT_MS", "SOPA_HEARTBEAT"),
    ("SOPA_REPORT_INTERVAL_MS", "SOPA_REPORT_INTERVAL"),
    ("SOPA_METER_PERIOD_MS", "SOPA_METER_PERIOD"),
    ("SOPA_LLDP_INTERVAL_MS", "SOPA_LLDP_INTERVAL"),
];

fn main() -> ExitCode {
    sopa_ops::duration::env_aliases(&RENAMED_VARIABLES);
    let cli = Cli::parse();
    sopa_ops::logging::init(cli.log.log_format, "info,netlink_packet_route=error");
    match &cli.command {
        Command::Run(_) => sopa_ops::logging::starting("sopa-agent", "agent"),
        Command::Switch(_) => sopa_ops::logging::starting("sopa-agent", "switch"),
        _ => {}
    }
    sopa_agent::sysctl::set_proc_root(&cli.proc_root);
    // Before any thread exists: threads inherit the namespace of the one that spawns them.
    if let Some(netns) = &cli.netns
        && let Err(err) = host::enter_netns(netns)
    {
        eprintln!("sopa-agent: {err}");
        return ExitCode::from(err.exit_code());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(dispatch(cli.command, cli.netns)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sopa-agent: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

async fn dispatch(command: Command, netns: Option<String>) -> Result<(), Error> {
    match command {
        Command::Run(args) => run::run(*args, netns).await,
        Command::Granularity { node, granularity } => {
            granularity::granularity(&node.node, granularity)
        }
        Command::Labels { node, source } => labels::labels(&node.node, source),
        Command::Detach { node } => detach::detach(&node.node, netns.as_deref()).await,
        Command::Switch(args) => switch::switch(*args, netns).await,
        Command::Doctor { json } => doctor::doctor(json).await,
        Command::Status { node, json } => {
            host::validate_node(&node.node)?;
            let status = status::read(
                &node.node,
                &host::run_dir(&node.node),
                &host::pin_dir(&node.node),
            )?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&status).expect("status serializes")
                );
            } else {
                print!("{}", status.render());
            }
            Ok(())
        }
        Command::Mode {
            node,
            mode,
            first_path,
        } => {
            let mode = mode.code();
            let mut maps = running_maps(&node.node)?;
            let first = first_path.map(cli::FirstPath::code);
            // Refused before anything changes: a datapath an older agent left has no such
            // setting (and starts flows at their hash already).
            if let Some(f) = first
                && maps.first_path()? != f
                && !maps.has_first_path()
            {
                return Err(Error::Config(format!(
                    "--first-path: the datapath of node {} was left by an older agent and starts every flow at its hash; start this agent version on the node first",
                    node.node
                )));
            }
            let mut config = maps.config()?;
            config.mode = mode;
            maps.set_config(config)?;
            if let Some(f) = first
                && maps.first_path()? != f
            {
                maps.set_first_path(f)?;
            }
            // Kept across restarts of the agent until a `run --mode` says otherwise.
            sopa_agent::runtime::RuntimeMode::new(mode).save(&host::run_dir(&node.node))?;
            println!(
                "node {}: mode {} (kept across restarts; `run --mode` or SOPA_MODE replaces it)",
                node.node,
                status::mode_name(mode)
            );
            Ok(())
        }
        Command::Reordering { node, state } => {
            let mut maps = running_maps(&node.node)?;
            let on = state == cli::OnOff::On;
            maps.set_reordering_measured(on)?;
            println!(
                "node {}: reordering {} (until the agent's next start, which sets what --measure-reordering says)",
                node.node,
                if on { "measured" } else { "not measured" }
            );
            Ok(())
        }
        Command::Completions { shell } => {
            sopa_ops::cli::print_completions(<Cli as clap::CommandFactory>::command(), shell);
            Ok(())
        }
        Command::Man { dir } => {
            let pages =
                sopa_ops::cli::write_man_pages(<Cli as clap::CommandFactory>::command(), &dir)
                    .map_err(|e| {
                        Error::io(format!("writing man pages into {}", dir.display()), e)
                    })?;
            println!("{} man pages in {}", pages.len(), dir.display());
            Ok(())
        }
        Command::CheckPaths { file } => {
            let table = PathTable::load(&file)?;
            println!("{}: {} prefixes", file.display(), table.len());
            for (prefix, hops) in &table.destinations {
                let hops: Vec<String> = hops.iter().map(ToString::to_string).collect();
                println!("  {prefix:<18} {}", hops.join(" "));
            }
            Ok(())
        }
    }
}

/// The maps of node `node`'s running agent, from its pins.
/// The run folder and journal record of node `node`'s live agent, for a command that changes
/// it at run time; an error naming the node when none runs.
fn live_agent(node: &str) -> Result<(std::path::PathBuf, sopa_agent::changes::Record), Error> {
    host::validate_node(node)?;
    let run_dir = host::run_dir(node);
    let record = sopa_agent::changes::Journal::read(&run_dir)?
        .filter(|r| r.is_live())
        .ok_or_else(|| Error::NotRunning {
            node: node.to_owned(),
            dir: run_dir.clone(),
        })?;
    Ok((run_dir, record))
}

fn running_maps(node: &str) -> Result<sopa_agent::datapath::MapSet, Error> {
    host::validate_node(node)?;
    let pins = host::pin_dir(node);
    if !pins.exists() {
        return Err(Error::NotRunning {
            node: node.to_owned(),
            dir: pins,
        });
    }
    sopa_agent::datapath::MapSet::from_pins(&pins)
}
