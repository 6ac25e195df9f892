//! `cargo xtask`: the project's own build, test, demo and benchmark commands.
//!
//! xtask depends on nothing that needs the eBPF toolchain, so `setup` can run on a fresh machine
//! before the first eBPF build.

mod bench;
mod demo;
mod fabric_demo;
mod fuzz;
mod setup;
mod smoke;
mod test;
mod testbed;

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
    /// Run the whole test suite (unit, BPF_PROG_TEST_RUN fixtures, namespace suites, a smoke
    /// pass of every benchmark, then the fuzz targets for a bounded time), each suite under a
    /// time limit, with a summary table. Needs root.
    Test(test::TestArgs),
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
            setup::run()?;
            test::run(&args)
        }
        Command::Fuzz { seconds } => fuzz::run(seconds),
        Command::Demo(args) => {
            setup::run()?;
            demo::run(&args)
        }
        Command::Testbed(cmd) => {
            setup::run()?;
            testbed::run(cmd)
        }
        Command::Bench { name, args } => {
            setup::run()?;
            bench::run(&name, &args)
        }
    }
}
