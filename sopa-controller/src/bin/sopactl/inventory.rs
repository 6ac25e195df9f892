//! `sopactl fabric generate | check`: inventories of an operator's fabric.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use clap::Subcommand;
use sopa_controller::fabric::Fabric;
use sopa_topology::{
    Topology,
    inventory::generate::{self, LeafSpine},
    paths::{Failures, PathTable},
    prefix::Prefix,
    prefix6::Prefix6,
    srv6::Encoding,
    topology::TopologySpec,
};

#[derive(Subcommand)]
pub enum FabricCommand {
    /// Write the inventory of a regular fabric (to stdout, or --out): a starting point to edit
    /// into the operator's own.
    #[command(subcommand)]
    Generate(Generate),
    /// Check an inventory: every refusal with the entry at fault, or a summary of the fabric
    /// it describes (racks, hosts, paths between racks).
    Check {
        /// The inventory (TOML).
        file: PathBuf,
    },
    /// Write a draft inventory from what the agents' LLDP heard: switches, tiers, cables,
    /// racks and their hosts (link addresses, gateways and IPv6 left for you to fill in).
    Discover {
        #[command(flatten)]
        conn: crate::fabric::Connection,
        /// The file to write (never overwritten); stdout without.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum Generate {
    /// A two-tier leaf-spine, every leaf cabled to every spine.
    LeafSpine {
        /// Leaf switches (one rack each).
        #[arg(long)]
        leaves: u32,
        /// Spine switches (every leaf cabled to each).
        #[arg(long)]
        spines: u32,
        /// Hosts in each rack.
        #[arg(long)]
        hosts_per_leaf: u32,
        /// Carved into one rack prefix per leaf (the smallest holding its hosts).
        #[arg(long, default_value = "10.0.0.0/16")]
        prefix: Prefix,
        /// Carved into one IPv6 /64 per leaf.
        #[arg(long)]
        prefix6: Option<Prefix6>,
        /// Carved into one /31 per leaf-spine link.
        #[arg(long, default_value = "172.16.0.0/16")]
        links: Prefix,
        /// Carved into one /127 per link.
        #[arg(long)]
        links6: Option<Prefix6>,
        #[command(flatten)]
        out: Out,
    },
    /// The SOPA paper's Fat-Tree(k), with its names and addresses.
    FatTree {
        /// The Fat-Tree's k (even): k pods of k switches, k^3/4 hosts.
        #[arg(long)]
        k: u32,
        #[command(flatten)]
        out: Out,
    },
}

#[derive(clap::Args)]
pub struct Out {
    /// How hosts carry the path.
    #[arg(long, default_value = "ipv4-option")]
    encoding: Encoding,
    /// SRv6: the /32 uSID block every path address begins with (`fcbb:bb00::/32` without).
    #[arg(long)]
    usid_block: Option<Prefix6>,
    /// The file to write (never overwritten); stdout without.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(cmd: FabricCommand) -> Result<()> {
    match cmd {
        FabricCommand::Generate(g) => {
            let (mut inv, out) = match g {
                Generate::LeafSpine {
                    leaves,
                    spines,
                    hosts_per_leaf,
                    prefix,
                    prefix6,
                    links,
                    links6,
                    out,
                } => (
                    generate::leaf_spine(&LeafSpine {
                        leaves,
                        spines,
                        hosts_per_leaf,
                        prefix,
                        prefix6,
                        links,
                        links6,
                    })?,
                    out,
                ),
                Generate::FatTree { k, out } => (generate::fat_tree(k)?, out),
            };
            inv.encoding = Some(out.encoding);
            inv.usid_block = out.usid_block;
            let text = format!(
                "# SOPA inventory, written by `sopactl fabric generate`: edit the names, \
                 addresses and cabling into your fabric's, then `sopactl fabric check FILE`.\n{}",
                inv.to_toml()
            );
            // What is written is what the controller accepts.
            Fabric::parse_spec_file(&text, "the generated inventory")?;
            match out.out {
                None => print!("{text}"),
                Some(path) => write_new(&path, &text)?,
            }
            Ok(())
        }
        FabricCommand::Discover { conn, out } => {
            let status =
                crate::fabric::runtime().block_on(crate::fabric::call(
                    &conn,
                    "status",
                    |mut control| async move {
                        control.status(sopa_channel::proto::StatusRequest {}).await
                    },
                ))?;
            if status.neighbours.is_empty() {
                anyhow::bail!(
                    "no agent has reported an LLDP table: switch agents speak LLDP on an \
                     inventory's fabric or with --lldp on"
                );
            }
            let draft = sopa_controller::cabling::draft_inventory(&status.neighbours);
            let text = format!(
                "# SOPA inventory drafted by `sopactl fabric discover` from {} agents' LLDP \
                 tables: check the tiers and prefixes, add link addresses, gateways and IPv6, \
                 then `sopactl fabric check FILE`.\n{}",
                status.neighbours.len(),
                draft.to_toml()
            );
            match out {
                None => print!("{text}"),
                Some(path) => write_new(&path, &text)?,
            }
            Ok(())
        }
        FabricCommand::Check { file } => {
            let (spec, encoding) = read(&file)?;
            let topo = Topology::build(&spec)?;
            print!("{}", summary(&topo, encoding));
            Ok(())
        }
    }
}

fn write_new(path: &Path, text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| {
            format!(
                "creating {} (an existing file is never overwritten)",
                path.display()
            )
        })?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// A spec or inventory file as the controller reads it.
pub fn read(path: &Path) -> Result<(TopologySpec, Encoding)> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Fabric::parse_spec_file(&text, &path.display().to_string())?)
}

fn summary(topo: &Topology, encoding: Encoding) -> String {
    let g = topo.graph();
    let racks = topo.racks();
    let switches = g.nodes.iter().filter(|n| n.kind.is_switch()).count();
    let mut lo = usize::MAX;
    let mut hi = 0;
    for rack in &racks {
        let Some(src) =
            (0..g.nodes.len() as u32).find(|h| topo.rack_of(*h).is_ok_and(|r| r.tor == rack.tor))
        else {
            continue;
        };
        if let Ok(table) = PathTable::compute(topo, src, &Failures::none(g)) {
            for d in &table.destinations {
                lo = lo.min(d.candidates.len());
                hi = hi.max(d.candidates.len());
            }
        }
    }
    let paths = if hi == 0 {
        "no rack pair".to_owned()
    } else if lo == hi {
        format!("{lo} paths between every two racks")
    } else {
        format!("{lo} to {hi} paths between two racks")
    };
    let block = match encoding {
        Encoding::Srv6 => {
            let b = topo.usid_block();
            format!(
                " (uSID block {}/32)",
                std::net::Ipv6Addr::from(sopa_common::srv6::address(b, &[]))
            )
        }
        Encoding::Ipv4Option | Encoding::Entropy => String::new(),
    };
    format!(
        "ok: {}; {switches} switches, {} links, {} racks, {} hosts; {paths}; encoding {encoding}{block}\n",
        topo.name(),
        g.links.len() - topo.host_count() as usize,
        racks.len(),
        topo.host_count()
    )
}
