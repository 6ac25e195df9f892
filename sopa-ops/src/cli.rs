//! What every binary's command line offers beyond its own flags (shell completions, man pages)
//! and the check it passes in its tests: each flag, argument and subcommand says what it is
//! for (`--help` is the operator's first manual).

use std::path::{Path, PathBuf};

pub use clap_complete::Shell;

/// Writes `cmd`'s completion script for `shell` to stdout.
pub fn print_completions(mut cmd: clap::Command, shell: Shell) {
    let name = cmd.get_name().to_owned();
    clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
}

/// Writes `cmd`'s man page and one per subcommand (`sopa-agent.1`, `sopa-agent-run.1`, …)
/// into `dir`, returning their paths.
pub fn write_man_pages(cmd: clap::Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let before: Vec<PathBuf> = list(dir)?;
    clap_mangen::generate_to(cmd, dir)?;
    Ok(list(dir)?
        .into_iter()
        .filter(|p| !before.contains(p))
        .collect())
}

fn list(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    out.sort();
    Ok(out)
}

/// The flags, arguments and subcommands of `cmd` (and of its subcommands, recursively) that
/// have no help text, as `sopa-agent run --iface`.
pub fn undocumented(cmd: &clap::Command) -> Vec<String> {
    let mut out = Vec::new();
    walk(cmd, cmd.get_name(), &mut out);
    out
}

fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if id == "help" || id == "version" || arg.is_hide_set() {
            continue;
        }
        if arg.get_help().is_none() && arg.get_long_help().is_none() {
            let name = arg
                .get_long()
                .map(|l| format!("--{l}"))
                .unwrap_or_else(|| id.to_uppercase());
            out.push(format!("{path} {name}"));
        }
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" || sub.is_hide_set() {
            continue;
        }
        let sub_path = format!("{path} {}", sub.get_name());
        if sub.get_about().is_none() && sub.get_long_about().is_none() {
            out.push(sub_path.clone());
        }
        walk(sub, &sub_path, out);
    }
}
