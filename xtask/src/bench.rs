//! `cargo xtask bench NAME`: benchmarks that measure the product against its baseline side by
//! side in one run and print the ratios.

use anyhow::{Result, bail};

use crate::setup::{self, cargo};

pub fn run(name: &str, extra: &[String]) -> Result<()> {
    match name {
        "datapath" => {
            if !setup::is_root() {
                bail!(
                    "the datapath benchmark loads eBPF programs and creates namespaces: run as root"
                );
            }
            let mut args = vec!["bench", "-p", "sopa-agent", "--bench", "datapath", "--"];
            args.extend(extra.iter().map(String::as_str));
            cargo(&args)
        }
        "topology" => {
            let mut args = vec!["bench", "-p", "sopa-topology", "--bench", "topology", "--"];
            args.extend(extra.iter().map(String::as_str));
            cargo(&args)
        }
        "channel" => {
            let mut args = vec!["bench", "-p", "sopa-controller", "--bench", "channel", "--"];
            args.extend(extra.iter().map(String::as_str));
            cargo(&args)
        }
        "meter" => {
            let mut args = vec!["bench", "-p", "sopa-controller", "--bench", "meter", "--"];
            args.extend(extra.iter().map(String::as_str));
            cargo(&args)
        }
        "fabric" => {
            if !setup::is_root() {
                bail!("the fabric benchmark creates namespaces: run as root");
            }
            crate::demo::build_release()?;
            let mut args = vec!["bench", "-p", "sopa-testbed", "--bench", "fabric", "--"];
            args.extend(extra.iter().map(String::as_str));
            cargo(&args)
        }
        "failure" => {
            if !setup::is_root() {
                bail!("the failure benchmark creates namespaces: run as root");
            }
            crate::demo::build_release()?;
            let mut args = vec!["bench", "-p", "sopa-testbed", "--bench", "failure", "--"];
            args.extend(extra.iter().map(String::as_str));
            cargo(&args)
        }
        "host-cost" => {
            if !setup::is_root() {
                bail!(
                    "the host-cost benchmark creates namespaces and loads eBPF programs: run as root"
                );
            }
            crate::demo::build_release()?;
            let mut args = vec!["bench", "-p", "sopa-testbed", "--bench", "host_cost", "--"];
            args.extend(extra.iter().map(String::as_str));
            cargo(&args)
        }
        "resilience" => {
            if !setup::is_root() {
                bail!(
                    "the resilience benchmark creates namespaces and loads eBPF programs: run as root"
                );
            }
            crate::demo::build_release()?;
            let mut args = vec!["bench", "-p", "sopa-testbed", "--bench", "resilience", "--"];
            args.extend(extra.iter().map(String::as_str));
            cargo(&args)?;
            // Both programs on a million generated packets each, then every fuzz target for a
            // minute.
            println!("\nBPF_PROG_TEST_RUN fuzzing, 1,000,000 packets per program");
            let cargo_bin = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let st = std::process::Command::new(cargo_bin)
                .args([
                    "test",
                    "--release",
                    "-p",
                    "sopa-agent",
                    "--test",
                    "fuzz_datapath",
                    "--",
                    "--nocapture",
                ])
                .env("SOPA_FUZZ_PACKETS", "1000000")
                .current_dir(setup::workspace_root())
                .status()?;
            if !st.success() {
                bail!("the datapath fuzz run failed");
            }
            crate::fuzz::run(60)
        }
        "smoke" => {
            // Every benchmark and experiment at toy size, as `cargo xtask test --full` runs them.
            let rows = crate::smoke::full(std::time::Duration::from_secs(900))?;
            let failed = crate::test::print_table("smoke", &rows);
            if failed > 0 {
                bail!("{failed} of the smoke runs failed: see the table");
            }
            Ok(())
        }
        other => {
            bail!(
                "unknown benchmark {other:?}; available: datapath, topology, channel, meter, fabric, failure, host-cost, resilience, smoke"
            )
        }
    }
}
