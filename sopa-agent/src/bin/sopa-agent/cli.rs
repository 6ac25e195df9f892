//! The command line: every subcommand and flag, each with its `SOPA_*` variable.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use sopa_agent::{
    datapath::{TcxOrder, tc_hook::AttachMode},
    entropy::source::LabelSource,
    granularity::Granularity,
    host::XdpAttach,
    switch::usid::UsidMode,
};
use sopa_ops::{allow::AllowList, duration::Dur};

/// SOPA host agent: spreads every TCP/UDP flow over all equal-cost fabric paths in strict
/// round-robin, carrying the chosen path in the packet (the IPv4 option, SRv6 or a learned flow
/// label); as `switch`, a fabric switch's agent.
#[derive(Parser)]
#[command(version, about, after_help = sopa_ops::exit::help())]
pub struct Cli {
    #[command(flatten)]
    pub log: sopa_ops::logging::LogArgs,
    /// Enter this network namespace (a name under /run/netns, or a path) first. Unlike
    /// `ip netns exec`, this keeps the mount namespace, so the bpffs pins stay shared.
    #[arg(long, global = true, env = "SOPA_NETNS")]
    pub netns: Option<String>,
    /// Where the agent reads and writes sysctls: PROC_ROOT/sys/net/… A container that may not
    /// write its own /proc/sys mounts the host's /proc elsewhere (e.g. /hostproc) and names it.
    #[arg(long, global = true, env = "SOPA_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Attach the datapath to the fabric interface and run until SIGINT/SIGTERM.
    Run(Box<RunArgs>),
    /// The switch role: forward by the controller's topology until SIGINT/SIGTERM.
    Switch(Box<SwitchArgs>),
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
        /// The path selection.
        #[arg(value_enum)]
        mode: Mode,
        /// Where new flows start their round robin: `hash` (the default, which every start
        /// of the agent restores) or `zero` (path 0, the paper's algorithm, for comparisons).
        #[arg(long, value_enum)]
        first_path: Option<FirstPath>,
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
        /// Measure it, or not.
        #[arg(value_enum)]
        state: OnOff,
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
    /// Print a shell completion script (e.g. `sopa-agent completions bash >
    /// /usr/share/bash-completion/completions/sopa-agent`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: sopa_ops::cli::Shell,
    },
    /// Write the man pages (sopa-agent.1 and one per subcommand) into DIR (the packages'
    /// build).
    #[command(hide = true)]
    Man {
        /// Where the pages go.
        dir: PathBuf,
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
    /// Path selection. Without it, a mode set at run time with `sopa-agent mode` is kept
    /// across restarts; otherwise sopa.
    #[arg(long, env = "SOPA_MODE", value_enum)]
    pub mode: Option<Mode>,
    /// The unit of spraying: packet (gso_max_segs 1), flowcell:N (at most N segments per
    /// unit: gso_max_segs N) or burst (GSO super-packets as the interface makes them). Without
    /// it, one set at run time with `sopa-agent granularity` is kept across restarts;
    /// otherwise flowcell:4 (docs/operate.md, "Granularity", says why).
    #[arg(long, env = "SOPA_GRANULARITY")]
    pub granularity: Option<Granularity>,
    /// How xdp_strip attaches: auto (generic on veth, native elsewhere), generic, native.
    #[arg(long, env = "SOPA_XDP_MODE", value_enum, default_value_t = XdpAttach::Auto)]
    pub xdp_mode: XdpAttach,
    /// net.ipv4.tcp_reordering while the agent runs (restored on exit).
    #[arg(long, env = "SOPA_TCP_REORDERING", default_value_t = 10)]
    pub tcp_reordering: u32,
    #[command(flatten)]
    pub metrics: MetricsFlags,
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
    /// How often pinned mode reports elephants to the controller (500ms, 2s; a bare number is
    /// milliseconds).
    #[arg(long, env = "SOPA_REPORT_INTERVAL", alias = "report-interval-ms", default_value_t = Dur::ms(1000))]
    pub report_interval: Dur,
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
    /// The path meter's period of alternate marking, fixed (250ms; 0 turns metering off).
    /// Without it the agent runs the controller's period and epoch (from its snapshot; 250 ms
    /// until then): a controller refuses the reports of a host whose period differs from its
    /// own.
    #[arg(long, env = "SOPA_METER_PERIOD", alias = "meter-period-ms")]
    pub meter_period: Option<Dur>,
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
    /// How often LLDP frames go out on each port (neighbours are kept four times as long):
    /// 100ms to 1h.
    #[arg(long, env = "SOPA_LLDP_INTERVAL", alias = "lldp-interval-ms", default_value_t = Dur::ms(5000))]
    pub lldp_interval: Dur,
    #[command(flatten)]
    pub metrics: MetricsFlags,
}

/// The metrics and health endpoints (GET /metrics, /healthz, /readyz).
#[derive(clap::Args)]
pub struct MetricsFlags {
    /// Address of the metrics and health endpoints (GET /metrics, /healthz, /readyz). Off
    /// loopback (e.g. 0.0.0.0:9470) it needs --metrics-allow or --metrics-client-ca.
    #[arg(long, env = "SOPA_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// Who may reach the endpoints besides loopback: networks, comma-separated
    /// (10.0.0.0/8,2001:db8::/32). Others are answered 403 (over TLS: closed unanswered).
    #[arg(long, env = "SOPA_METRICS_ALLOW", default_value = "")]
    pub metrics_allow: AllowList,
    /// Serve no metrics and no health endpoints.
    #[arg(long, env = "SOPA_NO_METRICS")]
    pub no_metrics: bool,
    #[command(flatten)]
    pub tls: sopa_ops::tls::TlsFlags,
}

impl MetricsFlags {
    /// The address to serve on: --metrics-addr, else `default`, unless --no-metrics.
    pub fn addr(&self, default: SocketAddr) -> Option<SocketAddr> {
        (!self.no_metrics).then_some(self.metrics_addr.unwrap_or(default))
    }

    /// Who may reach the endpoints, the TLS files read and checked now (a bad one is the
    /// configuration's error, named by its flag).
    pub fn access(&self) -> sopa_agent::error::Result<sopa_ops::http::Access> {
        let tls = if self.no_metrics {
            None
        } else {
            self.tls
                .load()
                .map_err(|e| sopa_agent::error::Error::Config(e.to_string()))?
        };
        Ok(sopa_ops::http::Access {
            allow: self.metrics_allow.clone(),
            tls,
        })
    }
}

/// Path selection (the `sopa-agent mode` and `run --mode` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Per-flow round robin over every path (SOPA).
    Sopa,
    /// A random path per packet (random packet spraying).
    Rps,
    /// A path by the 5-tuple's hash.
    Ecmp,
    /// Hedera: the controller's pins for elephants, the hash otherwise.
    Pinned,
    /// The first path only.
    Single,
    /// No path in the packet: the fabric routes it.
    Off,
}

impl Mode {
    /// The datapath's mode number.
    pub fn code(self) -> u32 {
        use sopa_common::maps::mode;
        match self {
            Self::Sopa => mode::SOPA,
            Self::Rps => mode::RPS,
            Self::Ecmp => mode::ECMP,
            Self::Pinned => mode::PINNED,
            Self::Single => mode::SINGLE,
            Self::Off => mode::OFF,
        }
    }
}

/// Where new flows start their round robin.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FirstPath {
    /// At the flow's hash (the default; every start of the agent restores it).
    Hash,
    /// At path 0, the paper's algorithm, for comparisons.
    Zero,
}

impl FirstPath {
    pub fn code(self) -> u32 {
        match self {
            Self::Hash => sopa_common::maps::first_path::HASH,
            Self::Zero => sopa_common::maps::first_path::ZERO,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
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
    /// heartbeat states (500ms, 1s; a bare number is milliseconds).
    #[arg(long, env = "SOPA_HEARTBEAT", alias = "heartbeat-ms", default_value_t = Dur::ms(1000))]
    pub heartbeat: Dur,
}

fn default_node() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_is_consistent_and_every_flag_has_help() {
        Cli::command().debug_assert();
        assert_eq!(
            sopa_ops::cli::undocumented(&Cli::command()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn modes_are_named_as_the_datapath_names_them() {
        for mode in Mode::value_variants() {
            let name = mode.to_possible_value().unwrap().get_name().to_owned();
            assert_eq!(name, sopa_agent::status::mode_name(mode.code()));
        }
        assert_eq!(
            Mode::value_variants().len(),
            sopa_common::maps::mode::COUNT as usize
        );
    }

    #[test]
    fn durations_take_units_and_the_old_flags_milliseconds() {
        let cli = Cli::try_parse_from([
            "sopa-agent",
            "switch",
            "--controller",
            "unix:/x",
            "--heartbeat-ms",
            "250",
            "--lldp-interval",
            "2s",
        ])
        .unwrap();
        let Command::Switch(s) = cli.command else {
            panic!()
        };
        assert_eq!(s.channel.heartbeat, Dur::ms(250));
        assert_eq!(s.lldp_interval, Dur::ms(2000));
    }
}
