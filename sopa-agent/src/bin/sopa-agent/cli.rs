//! The command line: every subcommand and flag, each with its `SOPA_*` variable.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand};
use sopa_agent::{
    datapath::{TcxOrder, tc_hook::AttachMode},
    entropy::source::LabelSource,
    granularity::Granularity,
    host::XdpAttach,
    switch::usid::UsidMode,
};

/// SOPA host agent: spreads every TCP/UDP flow over all equal-cost fabric paths in strict
/// round-robin, written into a 4-byte IPv4 source-route option.
#[derive(Parser)]
#[command(version, about)]
pub struct Cli {
    /// Enter this network namespace (a name under /run/netns, or a path) first. Unlike
    /// `ip netns exec`, this keeps the mount namespace, so the bpffs pins stay shared.
    #[arg(long, global = true, env = "SOPA_NETNS")]
    pub netns: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Attach the datapath to the fabric interface and run until SIGINT/SIGTERM.
    Run(Box<RunArgs>),
    /// The switch role: forward by the controller's topology until SIGINT/SIGTERM.
    Switch(SwitchArgs),
    /// Show a running agent's mode, path table and counters.
    Status {
        #[command(flatten)]
        node: NodeArg,
        /// Print JSON instead of the report for people.
        #[arg(long)]
        json: bool,
    },
    /// Switch a running agent's path-selection mode, without reloading its programs.
    Mode {
        #[command(flatten)]
        node: NodeArg,
        /// sopa, rps, ecmp, pinned, single or off.
        mode: String,
        /// Where new flows start their round robin: `hash` (the default, which every start
        /// of the agent restores) or `zero` (path 0, the paper's algorithm, for comparisons).
        #[arg(long, value_parser = ["hash", "zero"])]
        first_path: Option<String>,
    },
    /// Change a running agent's unit of spraying (it applies it on SIGHUP, journaled like
    /// every host change and restored at exit); kept across restarts.
    Granularity {
        #[command(flatten)]
        node: NodeArg,
        /// packet, flowcell:N (N segments per unit) or burst.
        granularity: Granularity,
    },
    /// Change where a running agent's entropy labels come from (applied on SIGHUP; until its
    /// next start, which takes `run --labels`), and wait until its labels are in place.
    Labels {
        #[command(flatten)]
        node: NodeArg,
        /// discovered, blind or per-packet.
        #[arg(value_enum)]
        source: LabelSource,
    },
    /// Turn a running agent's measurement of TCP reordering on or off (until its next start,
    /// which sets what `run --measure-reordering` says).
    Reordering {
        #[command(flatten)]
        node: NodeArg,
        /// on or off.
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Remove a datapath left attached (`run --keep-attached`, or after a crash): detach the
    /// programs, unpin the maps and restore every host setting the agent changed.
    Detach {
        #[command(flatten)]
        node: NodeArg,
    },
    /// What this kernel has of what the agent uses (TCX, cls_bpf, XDP, the helpers, BTF,
    /// seg6local, CLOCK_TAI, IPv6) and what the agent does where a feature is missing.
    Doctor {
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Validate a path table file and print it.
    CheckPaths {
        /// The TOML path table.
        file: PathBuf,
    },
}

#[derive(clap::Args)]
pub struct NodeArg {
    /// This node's name: the folder of its pins and state (/sys/fs/bpf/sopa/NODE, /run/sopa/NODE).
    #[arg(long, env = "SOPA_NODE", default_value_t = default_node())]
    pub node: String,
}

#[derive(clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub node: NodeArg,
    /// The host's fabric interface.
    #[arg(long, env = "SOPA_IFACE")]
    pub iface: String,
    /// TOML path table: destination prefix -> candidate paths (offline mode).
    #[arg(
        long,
        env = "SOPA_PATHS",
        required_unless_present = "controller",
        conflicts_with = "controller"
    )]
    pub paths: Option<PathBuf>,
    /// The controller (https://HOST:7470), or its replicas as a list
    /// (https://c1:7470,https://c2:7470, tried in turn): paths come from the topology it
    /// pushes, and this agent's --node must be a host of that topology.
    #[arg(long, env = "SOPA_CONTROLLER")]
    pub controller: Option<String>,
    #[command(flatten)]
    pub channel: ChannelFlags,
    /// This host's name in the controller's topology (e.g. h0), or its address there, or
    /// `auto`: the inventory's host whose address --iface has (no naming convention needed);
    /// defaults to --node.
    #[arg(long, env = "SOPA_HOST")]
    pub host: Option<String>,
    /// Path selection: sopa (per-flow round-robin), rps (random per packet), ecmp (5-tuple
    /// hash), pinned (Hedera: controller pins, else the hash), single (the first path), off.
    /// Without it, a mode set at run time with `sopa-agent mode` is kept across restarts;
    /// otherwise sopa.
    #[arg(long, env = "SOPA_MODE")]
    pub mode: Option<String>,
    /// The unit of spraying: packet (gso_max_segs 1), flowcell:N (at most N segments per
    /// unit: gso_max_segs N) or burst (GSO super-packets as the interface makes them). Without
    /// it, one set at run time with `sopa-agent granularity` is kept across restarts;
    /// otherwise flowcell:4 (the README says why).
    #[arg(long, env = "SOPA_GRANULARITY")]
    pub granularity: Option<Granularity>,
    /// How xdp_strip attaches: auto (generic on veth, native elsewhere), generic, native.
    #[arg(long, env = "SOPA_XDP_MODE", value_enum, default_value_t = XdpAttach::Auto)]
    pub xdp_mode: XdpAttach,
    /// net.ipv4.tcp_reordering while the agent runs (restored on exit).
    #[arg(long, env = "SOPA_TCP_REORDERING", default_value_t = 10)]
    pub tcp_reordering: u32,
    /// Loopback address of the Prometheus metrics endpoint (GET /metrics).
    #[arg(long, env = "SOPA_METRICS_ADDR", default_value = "127.0.0.1:9470")]
    pub metrics_addr: SocketAddr,
    /// Serve no metrics.
    #[arg(long, env = "SOPA_NO_METRICS")]
    pub no_metrics: bool,
    /// Leave the fabric routes' MTU alone (for fabrics whose links carry MTU + 4 bytes).
    /// Otherwise the agent lowers it by 4 (a plain `mtu`, DF kept), so full-size packets fit
    /// stamped; every other attribute of the route is kept.
    #[arg(long, env = "SOPA_KEEP_ROUTE_MTU")]
    pub keep_route_mtu: bool,
    /// Seed of the 5-tuple hash (ecmp mode and the stateless fallback).
    #[arg(long, env = "SOPA_HASH_SEED", default_value_t = 0x5eed)]
    pub hash_seed: u32,
    /// The NIC rate elephants are measured against (pinned mode): Mbit/s. Defaults to the
    /// interface's link speed.
    #[arg(long, env = "SOPA_NIC_RATE_MBIT")]
    pub nic_rate_mbit: Option<u64>,
    /// How often pinned mode reports elephants to the controller.
    #[arg(long, env = "SOPA_REPORT_INTERVAL_MS", default_value_t = 1000)]
    pub report_interval_ms: u64,
    /// Entropy encoding: the time between two probes. A router answers each prober at a
    /// limited rate (Linux's `net.ipv6.icmp.ratelimit`, 100 ms after a burst of 6, allows
    /// about 10 replies a second): probes past it go unanswered and cost the labels they tried.
    #[arg(long, env = "SOPA_PROBE_INTERVAL", default_value = "2ms", value_parser = humantime::parse_duration)]
    pub probe_interval: std::time::Duration,
    /// Entropy encoding: how long to wait for a label's replies after its last probe.
    #[arg(long, env = "SOPA_PROBE_WAIT", default_value = "300ms", value_parser = humantime::parse_duration)]
    pub probe_wait: std::time::Duration,
    /// Entropy encoding: where the labels come from: `discovered` (one per distinct path, by
    /// probing), or a baseline to measure it against: `blind` (as many random labels as paths,
    /// no probing) or `per-packet` (a random label on every packet).
    #[arg(long, env = "SOPA_LABELS", value_enum, default_value_t = LabelSource::Discovered)]
    pub labels: LabelSource,
    /// The path meter's period of alternate marking, fixed (0 turns metering off). Without it
    /// the agent runs the controller's period and epoch (from its snapshot; 250 ms until
    /// then): a controller refuses the reports of a host whose period differs from its own.
    #[arg(long, env = "SOPA_METER_PERIOD_MS")]
    pub meter_period_ms: Option<u64>,
    /// Measure the reordering of arriving TCP flows (`status`, `sopa_tcp_reordered_packets`):
    /// a flow-table lookup per data packet, about half of xdp_strip's cost, so off unless
    /// asked for. Every start sets what this says; `sopa-agent reordering` changes it at run
    /// time.
    #[arg(long, env = "SOPA_MEASURE_REORDERING")]
    pub measure_reordering: bool,
    /// Where the socket-option guard goes: `root` (the cgroup v2 root: every process of the
    /// host; mounted by the agent where the host has no cgroup v2 mount), the absolute path of
    /// a cgroup v2 directory, or `off`. It refuses `PACKET_QDISC_BYPASS` and `AF_XDP` sockets,
    /// which send around tc_stamp with CAP_NET_RAW alone (a switch honours this host's option
    /// while its agent is live): off, a process with CAP_NET_RAW can choose its packets' path.
    #[arg(long, env = "SOPA_GUARD_CGROUP", default_value = "root")]
    pub guard_cgroup: sopa_agent::datapath::guard::GuardCgroup,
    /// On exit, leave the datapath attached and the host settings it needs in place: traffic
    /// keeps its paths while no agent runs. The next agent adopts it; `detach` removes it.
    #[arg(long, env = "SOPA_KEEP_ATTACHED")]
    pub keep_attached: bool,
    /// Do not adopt what a previous agent of this node left: restore it and start clean.
    #[arg(long, env = "SOPA_RESET", conflicts_with = "takeover")]
    pub reset: bool,
    /// Take over from a running agent of this node in place (an upgrade): it exits leaving
    /// the datapath attached, and this one adopts it, replacing the programs atomically.
    #[arg(long, env = "SOPA_TAKEOVER")]
    pub takeover: bool,
    /// Where tc_stamp goes among the interface's other TCX egress programs: last (others see
    /// packets as the stack sent them) or first. An adopted datapath keeps its place.
    #[arg(long, env = "SOPA_TCX_ORDER", value_enum, default_value_t = TcxOrder::Last)]
    pub tcx_order: TcxOrder,
    /// How the TC programs attach: auto (TCX links where the kernel has them, Linux 6.6;
    /// cls_bpf filters on a clsact qdisc otherwise), tcx (refused without them) or tc.
    #[arg(long, env = "SOPA_ATTACH", value_enum, default_value_t = AttachMode::Auto)]
    pub attach: AttachMode,
}

#[derive(clap::Args)]
pub struct SwitchArgs {
    #[command(flatten)]
    pub node: NodeArg,
    /// This switch's name in the controller's topology (e.g. e0, eps.0.0.1.0); defaults to --node.
    #[arg(long, env = "SOPA_HOST")]
    pub host: Option<String>,
    /// The controller: https://HOST:PORT (with --certs), http:// (with --insecure), or unix:PATH;
    /// replicas as a list (https://c1:7470,https://c2:7470, tried in turn).
    #[arg(long, env = "SOPA_CONTROLLER")]
    pub controller: String,
    #[command(flatten)]
    pub channel: ChannelFlags,
    /// This switch's multipath hash seed (distinct per switch, or the fabric polarizes).
    #[arg(long, env = "SOPA_HASH_SEED")]
    pub hash_seed: Option<u32>,
    /// Where tc_forward goes among each port's other TCX ingress programs: last or first.
    #[arg(long, env = "SOPA_TCX_ORDER", value_enum, default_value_t = TcxOrder::Last)]
    pub tcx_order: TcxOrder,
    /// How the TC programs attach: auto (TCX links where the kernel has them, Linux 6.6;
    /// cls_bpf filters on a clsact qdisc otherwise), tcx (refused without them) or tc.
    #[arg(long, env = "SOPA_ATTACH", value_enum, default_value_t = AttachMode::Auto)]
    pub attach: AttachMode,
    /// SRv6: who consumes this switch's uSID. auto: the kernel's seg6local End route where the
    /// kernel has it (CONFIG_IPV6_SEG6_LWTUNNEL), tc_forward otherwise; kernel: refused at
    /// start without it; ebpf: tc_forward on any kernel.
    #[arg(long, env = "SOPA_USID", value_enum, default_value_t = UsidMode::Auto)]
    pub usid: UsidMode,
    /// On exit, leave the forwarding in place (tc_forward on every port, routes, settings):
    /// the switch keeps forwarding while no agent runs. The next agent adopts it, replacing
    /// the programs in place; `detach` removes it.
    #[arg(long, env = "SOPA_KEEP_ATTACHED")]
    pub keep_attached: bool,
    /// Do not adopt what a previous agent of this node left: restore it and start clean.
    #[arg(long, env = "SOPA_RESET")]
    pub reset: bool,
    /// LLDP on every port of the plan, for the controller's cabling check: auto (on an
    /// inventory's fabric, whose ports are named), on, or off (where lldpd already speaks and
    /// the agent would send a second frame per port).
    #[arg(long, env = "SOPA_LLDP", value_enum, default_value_t = sopa_agent::switch::cabling::LldpMode::Auto)]
    pub lldp: sopa_agent::switch::cabling::LldpMode,
    /// How often LLDP frames go out on each port (neighbours are kept four times as long).
    #[arg(long, env = "SOPA_LLDP_INTERVAL_MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub lldp_interval_ms: u64,
}

/// How to talk to the controller, for either role.
#[derive(clap::Args)]
pub struct ChannelFlags {
    /// This node's certificate folder (ca.pem, node.pem, node.key, from `sopactl certs issue
    /// --role host|switch --node NAME`) for the controller's mutual TLS. The certificate names
    /// the node: the controller refuses a hello that claims another.
    #[arg(long, env = "SOPA_CERTS", conflicts_with = "insecure")]
    pub certs: Option<PathBuf>,
    /// Talk to the controller in plaintext (http://). For tests only.
    #[arg(long, env = "SOPA_INSECURE")]
    pub insecure: bool,
    /// The name in the controller's certificate.
    #[arg(long, env = "SOPA_CONTROLLER_NAME", default_value = sopa_channel::tls::CONTROLLER_NAME)]
    pub controller_name: String,
    /// This agent's heartbeat interval on the channel: the controller counts it gone after
    /// three silent ones (or three of its own, if longer), and it counts the controller gone
    /// after three of the longer of this and the controller's, which the controller's first
    /// heartbeat states.
    #[arg(long, env = "SOPA_HEARTBEAT_MS", default_value_t = 1000)]
    pub heartbeat_ms: u64,
}

fn default_node() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}
