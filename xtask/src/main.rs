//! `cargo xtask`: the project's own build, test, demo and benchmark commands.
//!
//! xtask builds on a fresh machine, before `setup` installed the eBPF toolchain: the agent's
//! build then embeds no programs (its build script says so), and every command that runs
//! `setup` first starts itself again through cargo once the toolchain is there, so that it runs
//! with the programs built (the testbed loads its lossy link from them).

mod bench;
mod demo;
mod fabric_demo;
mod fuzz;
mod inventory_demo;
mod package;
mod setup;
mod smoke;
mod test;
mod testbed;
mod watch;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "SOPA's build, test, demo and benchmark commands")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what a fresh machine lacks (idempotent): rust-src for the nightly, bpf-linker,
    /// Debian packages; mount bpffs.
    Setup,
    /// Build the agent (release) with its embedded eBPF object.
    Build,
    /// Run the whole test suite (unit, BPF_PROG_TEST_RUN fixtures, namespace suites, the fuzz
    /// targets' seeds, a smoke pass of every benchmark), each suite under a time limit and a
    /// budget, with a summary table sorted by time; `--full` adds today's sizes and timed
    /// fuzzing. Needs root.
    Test(test::TestArgs),
    /// Build the Debian packages (cargo-deb): the binaries, the systemd units, a default
    /// config, man pages and shell completions, into target/debian/.
    Package,
    /// Build the OCI images of the agent and the controller (ghcr.io/sopa/…:VERSION) offline
    /// from the packages, on a Debian base made by mmdebstrap, with podman.
    Image,
    /// Run every cargo-fuzz target (fuzz/) for a bounded time.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
    },
    /// The main job on an embedded default: namespaces, agents, traffic, a result table.
    Demo(demo::DemoArgs),
    /// A fabric in namespaces to explore by hand: up, exec, fail, restore, status, down, clean.
    #[command(subcommand)]
    Testbed(testbed::TestbedCommand),
    /// Benchmarks measured side by side in one run, printed as tables of ratios.
    Bench {
        /// datapath, topology, channel, meter, fabric, failure, host-cost, resilience, or smoke (all of them at toy
        /// size)
        name: String,
        /// Extra arguments for the benchmark.
        #[arg(last = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Setup => setup::run(),
        Command::Build => {
            setup::run()?;
            setup::cargo(&["build", "--release", "-p", "sopa-agent", "--bins"])
        }
        Command::Test(args) => {
            setup_and_rebuilt()?;
            test::run(&args)
        }
        Command::Fuzz { seconds } => fuzz::run(seconds),
        Command::Package => {
            setup_and_rebuilt()?;
            for deb in package::packages()? {
                println!("{}", deb.display());
            }
            Ok(())
        }
        Command::Image => {
            setup_and_rebuilt()?;
            for tag in package::image()? {
                println!("{tag}");
            }
            Ok(())
        }
        Command::Demo(args) => {
            setup_and_rebuilt()?;
            demo::run(&args)
        }
        Command::Testbed(cmd) => {
            setup_and_rebuilt()?;
            testbed::run(cmd)
        }
        Command::Bench { name, args } => {
            setup_and_rebuilt()?;
            bench::run(&name, &args)
        }
    }
}

/// Runs `setup`; if this xtask was built before the eBPF toolchain was there (its programs not
/// embedded), runs the same command again through cargo, which now builds them, and exits with
/// its status.
fn setup_and_rebuilt() -> Result<()> {
    setup::run()?;
    if sopa_testbed::datapath_built() {
        return Ok(());
    }
    const AGAIN: &str = "SOPA_XTASK_REBUILT";
    if std::env::var_os(AGAIN).is_some() {
        anyhow::bail!(
            "xtask was rebuilt after setup and still embeds no eBPF programs: the agent's build \
             printed why (cargo build -p sopa-agent -vv shows its warnings)"
        );
    }
    eprintln!("[setup] the eBPF toolchain is installed: building xtask again with the programs");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::process::Command::new(cargo)
        .args(["run", "--quiet", "--package", "xtask", "--"])
        .args(std::env::args_os().skip(1))
        .env(AGAIN, "1")
        .current_dir(setup::workspace_root())
        .status()
        .map_err(|e| anyhow::anyhow!("running xtask again through cargo: {e}"))?;
    std::process::exit(status.code().unwrap_or(1));
}
