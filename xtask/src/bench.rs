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
        "fabric" => {
            if !setup::is_root() {
                bail!("the fabric benchmark creates namespaces: run as root");
            }
            crate::demo::build_release()?;
            let mut args = vec!["bench", "-p", "sopa-testbed", "--bench", "fabric", "--"];
            args.extend(extra.iter().map(String::as_str));
            cargo(&args)
        }
        other => {
            bail!("unknown benchmark {other:?}; available: datapath, topology, channel, fabric")
        }
    }
}
