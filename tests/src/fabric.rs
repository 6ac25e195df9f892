//! A whole fabric of the topology model in network namespaces: one namespace per host and
//! switch, a veth pair per link (addressed as `sopa_topology::forwarding` says), optionally
//! shaped (HTB at the link rate with a byte-limited drop-tail bfifo), a controller on a Unix
//! socket (the management path every namespace reaches), a switch agent per switch and a host
//! agent per host. Everything is stopped and deleted on drop, processes first.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use sopa_topology::{
    LinkId, NodeId, NodeKind, Topology,
    forwarding::{gateway, link_addresses},
    srv6::{Encoding, link_addresses6},
    topology::TopologySpec,
};

use crate::{Error, NetNs, Process, Result, agent::Agent, bins, netns::veth, run_name};

/// Whether `name` can name a Linux interface: 1 to 15 bytes, no slash, colon or whitespace,
/// not `.` or `..`.
fn is_ifname(name: &str) -> bool {
    (1..16).contains(&name.len())
        && name != "."
        && name != ".."
        && !name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace())
}

/// `fat-tree:K`, `modric:MxN[:q:x:y]` (q=1, x=2, y=2 by default), or the path of an
/// inventory file (`sopa_topology::inventory`; checked here, every refusal named).
pub fn parse_topo(s: &str) -> std::result::Result<TopologySpec, String> {
    let path = std::path::Path::new(s);
    if s.ends_with(".toml") || path.is_file() {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("reading the inventory {s}: {e}"))?;
        let inv = sopa_topology::inventory::Inventory::from_toml(&text)
            .map_err(|e| format!("inventory {s}: {e}"))?;
        let spec = TopologySpec::Inventory(Box::new(inv));
        Topology::build(&spec).map_err(|e| format!("inventory {s}: {e}"))?;
        return Ok(spec);
    }
    let bad = || {
        format!("topology {s:?}: write fat-tree:K, modric:MxN[:q:x:y] or an inventory file's path")
    };
    let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
    match kind {
        "fat-tree" => Ok(TopologySpec::FatTree {
            k: rest.parse().map_err(|_| bad())?,
        }),
        "modric" => {
            let mut parts = rest.split(':');
            let (m, n) = parts
                .next()
                .and_then(|d| d.split_once('x'))
                .ok_or_else(bad)?;
            let nums: Vec<u32> = parts
                .map(|p| p.parse().map_err(|_| bad()))
                .collect::<std::result::Result<_, _>>()?;
            let (q, x, y) = match nums[..] {
                [] => (1, 2, 2),
                [q, x, y] => (q, x, y),
                _ => return Err(bad()),
            };
            Ok(TopologySpec::Modric(
                sopa_topology::modric::ModricParams::new(
                    m.parse().map_err(|_| bad())?,
                    n.parse().map_err(|_| bad())?,
                    q,
                    x,
                    y,
                ),
            ))
        }
        _ => Err(bad()),
    }
}

#[derive(Clone, Debug)]
pub struct FabricOptions {
    /// Link rate in Mbit/s; `None` leaves links unshaped.
    pub rate_mbit: Option<u32>,
    /// Drop-tail queue per link direction, in full-size packets (counted in bytes).
    pub queue_packets: u32,
    /// Extra flags for every host agent (mode, granularity, ...). Without `--granularity`,
    /// the hosts spray per packet, as the paper does.
    pub host_args: Vec<String>,
    /// Also wire every host to one big switch (the non-blocking ideal), with links shaped like
    /// the fabric's: the `ideal` mode of the experiments routes the hosts through it.
    pub ideal: bool,
    /// Controller replicas: 1 runs one controller with a state file; 2 or more run that many
    /// replicas on a three-member etcd cluster (in a namespace of their own), one elected.
    pub controllers: usize,
    /// How hosts carry the path. SRv6 gives every link IPv6 addresses (the topology's plan)
    /// and runs every link at [`SRV6_FABRIC_MTU`], the hosts' 1500 plus the outer header and the
    /// path meter's mark.
    pub encoding: Encoding,
    /// How a shaped link serializes its packets.
    pub link_qdisc: LinkQdisc,
    /// Extra flags for every switch agent (e.g. `--usid ebpf`).
    pub switch_args: Vec<String>,
}

/// The qdisc that makes a veth a link of the fabric's rate (this kernel has htb, tbf and
/// pfifo/bfifo, no netem or fq).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LinkQdisc {
    /// HTB at the rate (quantum one full packet) with a byte-limited bfifo below it.
    #[default]
    Htb,
    /// TBF at the rate with a bucket of one packet: a packet leaves only once the link would
    /// have finished sending the one before, as a switch port serializes.
    Tbf,
}

impl std::fmt::Display for LinkQdisc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Htb => "htb",
            Self::Tbf => "tbf",
        })
    }
}

impl std::str::FromStr for LinkQdisc {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "htb" => Ok(Self::Htb),
            "tbf" => Ok(Self::Tbf),
            other => Err(format!("link qdisc {other:?}: htb or tbf")),
        }
    }
}

/// Fabric links' MTU in the SRv6 encoding: hosts keep 1500 on their routes.
pub const SRV6_FABRIC_MTU: u32 = 1548;

impl Default for FabricOptions {
    fn default() -> Self {
        Self {
            rate_mbit: Some(100),
            queue_packets: 100,
            host_args: Vec::new(),
            ideal: false,
            controllers: 1,
            encoding: Encoding::default(),
            link_qdisc: LinkQdisc::default(),
            switch_args: Vec::new(),
        }
    }
}

pub struct Fabric {
    // Dropped in this order: agents, switches, controller, then the namespaces.
    pub hosts: BTreeMap<NodeId, Agent>,
    switches: BTreeMap<String, Process>,
    controller: Option<Process>,
    /// With replicas: the controllers, the etcd cluster they share, and their namespace.
    replicas: Vec<Process>,
    etcd: Option<crate::etcd::EtcdCluster>,
    ctl_ns: Option<NetNs>,
    pub topo: Topology,
    pub prefix: String,
    pub socket: PathBuf,
    namespaces: BTreeMap<NodeId, NetNs>,
    /// Each host's fabric interface.
    pub host_ifaces: BTreeMap<NodeId, String>,
    /// The big switch of the non-blocking ideal ([`FabricOptions::ideal`]).
    ideal: Option<NetNs>,
    dir: PathBuf,
    pub encoding: Encoding,
    /// Extra flags for the controller (set before [`Fabric::start`]).
    pub controller_args: Vec<String>,
    /// Host agents serve their metrics (on 127.0.0.1:9470 of their namespace); otherwise
    /// `--no-metrics` (set before [`Fabric::start`]).
    pub host_metrics: bool,
    /// The options [`Fabric::start`] started the hosts with, for [`Fabric::start_host`].
    opts: FabricOptions,
    /// Switch nodes whose agent runs with `--keep-attached`, with their namespace: what such an
    /// agent leaves attached is detached when the fabric goes, also after a failure.
    kept_attached: BTreeMap<String, String>,
}

/// The big switch's address on every host link of the ideal, and the routing table and rule
/// preference that send a host's fabric traffic through it.
const IDEAL_GW: &str = "172.31.255.254";
const IDEAL_TABLE: &str = "100";
const IDEAL_PREF: &str = "100";

impl Fabric {
    /// Builds the namespaces and links of `spec` (no processes yet).
    pub fn build(spec: &TopologySpec, opts: &FabricOptions) -> Result<Self> {
        let topo = Topology::build(spec).map_err(|e| Error::Failed(e.to_string()))?;
        let prefix = run_name("f");
        let dir = std::env::temp_dir().join(format!("sopa-fabric-{prefix}"));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating the fabric folder", e))?;
        let mut fabric = Self {
            hosts: BTreeMap::new(),
            switches: BTreeMap::new(),
            controller: None,
            replicas: Vec::new(),
            etcd: None,
            ctl_ns: None,
            socket: dir.join("controller.sock"),
            namespaces: BTreeMap::new(),
            host_ifaces: BTreeMap::new(),
            ideal: None,
            topo,
            prefix,
            dir,
            encoding: opts.encoding,
            // The path meter judges a link's load against the rate it is shaped to.
            controller_args: opts
                .rate_mbit
                .map(|r| vec!["--link-rate-mbit".to_owned(), r.to_string()])
                .unwrap_or_default(),
            host_metrics: false,
            opts: opts.clone(),
            kept_attached: Default::default(),
        };
        // Both carry IPv4 in an outer IPv6 header: every link IPv6, and room for the header.
        let srv6 = matches!(opts.encoding, Encoding::Srv6 | Encoding::Entropy);
        // IPv6 on every link: the SRv6 and entropy encodings', or an inventory's IPv6 racks.
        let six = srv6 || fabric.topo.routes_ipv6();
        let g = fabric.topo.graph().clone();
        for (id, node) in g.nodes.iter().enumerate() {
            let ns = NetNs::new(&format!("{}-{}", fabric.prefix, node.name))?;
            if node.kind.is_switch() {
                ns.sysctl("net.ipv4.ip_forward", "1")?;
            } else {
                // Every transfer starts as on a fresh host: no connection inherits the
                // ssthresh or reordering that an earlier one (another mode's, in an experiment
                // that interleaves modes) left cached per destination. Seen: one flow alone
                // reached 0.765 of the rate right after an rps round, 0.94-0.95 otherwise.
                ns.sysctl("net.ipv4.tcp_no_metrics_save", "1")?;
            }
            if six {
                // A link set down and up again keeps its IPv6 addresses, as IPv4 ones are kept.
                ns.sysctl("net.ipv6.conf.all.keep_addr_on_down", "1")?;
            }
            fabric.namespaces.insert(id as NodeId, ns);
        }
        for (l, link) in g.links.iter().enumerate() {
            let (ia, ib) = (
                fabric.dev(l as LinkId, link.a),
                fabric.dev(l as LinkId, link.b),
            );
            let (na, nb) = (&fabric.namespaces[&link.a], &fabric.namespaces[&link.b]);
            veth(na, &ia, nb, &ib)?;
            if srv6 {
                let mtu = SRV6_FABRIC_MTU.to_string();
                na.ip(&["link", "set", &ia, "mtu", &mtu])?;
                nb.ip(&["link", "set", &ib, "mtu", &mtu])?;
            }
            let host_end = [(link.a, &ia, link.b, &ib), (link.b, &ib, link.a, &ia)]
                .into_iter()
                .find(|(n, ..)| g.node(*n).kind == NodeKind::Host);
            match host_end {
                Some((host, host_if, tor, tor_if)) => {
                    let h = g.node(host).addr.expect("hosts have addresses").to_string();
                    let gw = gateway(
                        &fabric.topo,
                        &fabric
                            .topo
                            .rack_of(host)
                            .map_err(|e| Error::Failed(e.to_string()))?,
                    )
                    .to_string();
                    let (hns, tns) = (&fabric.namespaces[&host], &fabric.namespaces[&tor]);
                    hns.ip(&[
                        "addr",
                        "add",
                        &h,
                        "peer",
                        &format!("{gw}/32"),
                        "dev",
                        host_if,
                    ])?;
                    hns.ip(&["route", "add", "default", "via", &gw, "dev", host_if])?;
                    tns.ip(&[
                        "addr",
                        "add",
                        &gw,
                        "peer",
                        &format!("{h}/32"),
                        "dev",
                        tor_if,
                    ])?;
                    if six {
                        let rack = fabric
                            .topo
                            .rack_of(host)
                            .map_err(|e| Error::Failed(e.to_string()))?;
                        let h6 = fabric.topo.host_ipv6(host).to_string();
                        let gw6 = fabric.topo.gateway_ipv6(&rack).to_string();
                        for (ns, local, peer, dev) in
                            [(hns, &h6, &gw6, host_if), (tns, &gw6, &h6, tor_if)]
                        {
                            ns.ip(&[
                                "-6",
                                "addr",
                                "add",
                                local,
                                "peer",
                                &format!("{peer}/128"),
                                "dev",
                                dev,
                                "nodad",
                            ])?;
                        }
                        hns.ip(&["-6", "route", "add", "default", "via", &gw6, "dev", host_if])?;
                    }
                    fabric.host_ifaces.insert(host, host_if.clone());
                }
                None => {
                    let (a, b, len) = link_addresses(&fabric.topo, l as u32);
                    na.ip(&["addr", "add", &format!("{a}/{len}"), "dev", &ia])?;
                    nb.ip(&["addr", "add", &format!("{b}/{len}"), "dev", &ib])?;
                    if six {
                        let (a, b, len) = link_addresses6(&fabric.topo, l as u32);
                        for (ns, addr, dev) in [(na, a, &ia), (nb, b, &ib)] {
                            ns.ip(&[
                                "-6",
                                "addr",
                                "add",
                                &format!("{addr}/{len}"),
                                "dev",
                                dev,
                                "nodad",
                            ])?;
                        }
                    }
                }
            }
            if let Some(rate) = opts.rate_mbit {
                let limit = (opts.queue_packets * 1514).to_string();
                for (ns, dev) in [(na, &ia), (nb, &ib)] {
                    shape(ns, dev, rate, &limit, opts.link_qdisc)?;
                }
            }
        }
        if opts.ideal {
            fabric.build_ideal(opts)?;
        }
        Ok(fabric)
    }

    /// One big switch with a link to every host, shaped like the fabric's links: the
    /// non-blocking ideal. Each host gets its address on its ideal link too, and a routing table
    /// through the big switch that [`Fabric::use_ideal`] turns on.
    fn build_ideal(&mut self, opts: &FabricOptions) -> Result<()> {
        let big = NetNs::new(&format!("{}-ideal", self.prefix))?;
        big.sysctl("net.ipv4.ip_forward", "1")?;
        let g = self.topo.graph().clone();
        let racks = self.topo.racks();
        let hosts_cover = sopa_topology::prefix::cover(racks.iter().map(|r| &r.prefix)).to_string();
        for (id, node) in g.nodes.iter().enumerate() {
            if node.kind != NodeKind::Host {
                continue;
            }
            let host = &self.namespaces[&(id as NodeId)];
            let h = node.addr.expect("hosts have addresses").to_string();
            let (hif, sif) = (
                format!("{}i{id}h", self.prefix),
                format!("{}i{id}s", self.prefix),
            );
            veth(host, &hif, &big, &sif)?;
            // The same unit as the fabric's hosts run by default here: one packet per skb (the
            // agents set it on the fabric interface, `--granularity packet`), not 64 KB GSO
            // bursts. A fabric whose hosts are given another unit still has its ideal per packet.
            host.ip(&["link", "set", &hif, "gso_max_segs", "1"])?;
            host.ip(&[
                "addr",
                "add",
                &h,
                "peer",
                &format!("{IDEAL_GW}/32"),
                "dev",
                &hif,
            ])?;
            host.ip(&[
                "route",
                "add",
                &hosts_cover,
                "via",
                IDEAL_GW,
                "dev",
                &hif,
                "table",
                IDEAL_TABLE,
            ])?;
            big.ip(&[
                "addr",
                "add",
                IDEAL_GW,
                "peer",
                &format!("{h}/32"),
                "dev",
                &sif,
            ])?;
            if let Some(rate) = opts.rate_mbit {
                let limit = (opts.queue_packets * 1514).to_string();
                shape(host, &hif, rate, &limit, opts.link_qdisc)?;
                shape(&big, &sif, rate, &limit, opts.link_qdisc)?;
            }
        }
        self.ideal = Some(big);
        Ok(())
    }

    /// The big switch's namespace, on a fabric built with the ideal.
    pub fn ideal_ns(&self) -> Option<&NetNs> {
        self.ideal.as_ref()
    }

    /// Routes every host's fabric traffic through the big switch (`true`) or the fabric
    /// (`false`), by a policy rule in each host. Refused on a fabric built without the ideal.
    pub fn use_ideal(&self, on: bool) -> Result<()> {
        if self.ideal.is_none() {
            if on {
                return Err(Error::Failed(
                    "the ideal mode needs the fabric built with the big switch \
                     (FabricOptions::ideal; bench fabric does it when --modes has ideal)"
                        .into(),
                ));
            }
            return Ok(());
        }
        let g = self.topo.graph();
        for (id, ns) in &self.namespaces {
            if g.node(*id).kind != NodeKind::Host {
                continue;
            }
            let has = ns
                .ip(&["rule", "show", "pref", IDEAL_PREF])?
                .contains("lookup");
            match (on, has) {
                (true, false) => {
                    ns.ip(&["rule", "add", "pref", IDEAL_PREF, "table", IDEAL_TABLE])?;
                }
                (false, true) => {
                    ns.ip(&["rule", "del", "pref", IDEAL_PREF])?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    pub fn ns(&self, name: &str) -> &NetNs {
        let id = self
            .topo
            .graph()
            .find(name)
            .unwrap_or_else(|| panic!("no node {name}"));
        &self.namespaces[&id]
    }

    /// Starts the controller, then every switch agent, then every host agent.
    pub fn start(&mut self, opts: &FabricOptions) -> Result<()> {
        let text = format!("encoding = \"{}\"\n", self.encoding)
            + &match self.topo.spec() {
                TopologySpec::FatTree { k } => {
                    format!("[topology]\nkind = \"fat-tree\"\nk = {k}\n")
                }
                TopologySpec::Modric(p) => format!(
                    "[topology]\nkind = \"modric\"\nm = {}\nn = {}\nq = {}\nx = {}\ny = {}\n",
                    p.m, p.n, p.q, p.x, p.y
                ),
                // The inventory file itself, with the fabric's encoding in it.
                TopologySpec::Inventory(inv) => {
                    return self.start_with_spec(
                        opts,
                        &sopa_topology::inventory::Inventory {
                            encoding: Some(self.encoding),
                            ..*inv
                        }
                        .to_toml(),
                    );
                }
            };
        self.start_with_spec(opts, &text)
    }

    fn start_with_spec(&mut self, opts: &FabricOptions, text: &str) -> Result<()> {
        let spec = self.dir.join("topology.toml");
        std::fs::write(&spec, text).map_err(|e| Error::io("writing the topology spec", e))?;
        if opts.controllers > 1 {
            self.start_replicas(opts.controllers)?;
        } else {
            self.start_controller()?;
        }
        self.opts = opts.clone();
        let g = self.topo.graph().clone();
        if crate::routers::switches_have_agents(self) {
            for node in g.nodes.iter().filter(|n| n.kind.is_switch()) {
                self.start_switch(&node.name)?;
            }
        } else {
            crate::routers::configure(self)?;
        }
        for node in g.nodes.iter().filter(|n| n.kind == NodeKind::Host) {
            self.start_host(&node.name)?;
        }
        Ok(())
    }

    /// Starts (or starts again, after [`Fabric::stop_host`]) host `name`'s agent with the
    /// flags [`Fabric::start`] gave every host.
    pub fn start_host(&mut self, name: &str) -> Result<()> {
        self.start_host_with(name, &[])
    }

    /// [`Fabric::start_host`] with `extra` flags after every host's.
    pub fn start_host_with(&mut self, name: &str, extra: &[&str]) -> Result<()> {
        self.start_host_as(name, name, extra)
    }

    /// [`Fabric::start_host_with`], the agent told `--host host` (a name, an address, or
    /// `auto`: found by its interface's address in the inventory).
    pub fn start_host_as(&mut self, name: &str, host: &str, extra: &[&str]) -> Result<()> {
        let id = self.topo.graph().find(name).expect("a host");
        let opts = &self.opts;
        // Elephants (Hedera's pinned mode) are measured against the shaped rate.
        let nic = opts.rate_mbit.map(|r| r.to_string());
        // The experiments report the receivers' reordering. They reproduce the paper's
        // per-packet spraying unless the options choose a unit (the agent's own default is a
        // flowcell).
        let per_packet = !opts
            .host_args
            .iter()
            .any(|a| a == "--granularity" || a.starts_with("--granularity="));
        let args: Vec<&str> = std::iter::once("--measure-reordering")
            .chain(
                per_packet
                    .then_some(["--granularity", "packet"])
                    .into_iter()
                    .flatten(),
            )
            .chain((!self.host_metrics).then_some("--no-metrics"))
            .chain(
                nic.as_deref()
                    .map(|r| ["--nic-rate-mbit", r])
                    .into_iter()
                    .flatten(),
            )
            .chain(opts.host_args.iter().map(String::as_str))
            .chain(extra.iter().copied())
            .collect();
        let agent = Agent::start_with_controller(
            &self.namespaces[&id],
            &format!("{}-{}", self.prefix, name),
            host,
            &self.host_ifaces[&id],
            &self.controller_address(),
            &args,
        )?;
        self.hosts.insert(id, agent);
        Ok(())
    }

    /// Packets that left `switch` by the port each hop value names for destination `dst`
    /// (`tc_forward`'s decision for it, from the topology's forwarding plan), as the
    /// interfaces counted them: element `h` is hop value `h`'s port.
    /// Starts the controller on the testbed's socket, with the testbed's state file (so a
    /// restarted controller keeps its drains).
    pub fn start_controller(&mut self) -> Result<()> {
        let spec = self.dir.join("topology.toml");
        let socket = format!("unix:{}", self.socket.display());
        // The testbed's own state file: a restarted controller keeps its drains.
        let store = format!("file:{}", self.controller_state_file().display());
        let _ = std::fs::remove_file(&self.socket);
        self.controller = Some(Process::spawn(
            None,
            &bins::sopa_controller(),
            &[
                "--topology",
                spec.to_str().expect("utf-8"),
                "--listen",
                &socket,
                "--insecure",
                "--store",
                &store,
                // The experiments take links down and up on purpose, mode after mode: no
                // flap damping here (the controller's suites test it).
                "--flap-limit",
                "0",
                "--heartbeat-ms",
                "500",
            ]
            .into_iter()
            .chain(self.controller_args.iter().map(String::as_str))
            .collect::<Vec<_>>(),
            &self.dir.join("controller.log"),
        )?);
        wait("the controller's socket", Duration::from_secs(10), || {
            self.socket.exists()
        })?;
        Ok(())
    }

    /// Where agents and `sopactl` reach the controller: its socket, or every replica's.
    pub fn controller_address(&self) -> String {
        if self.replicas.is_empty() {
            format!("unix:{}", self.socket.display())
        } else {
            replica_address(&self.dir, self.replicas.len())
        }
    }

    /// Starts `n` controller replicas on a three-member etcd cluster, all in a namespace of
    /// their own (`<prefix>-ctl`), each serving on a socket of its own; returns once one is
    /// elected and serves.
    pub fn start_replicas(&mut self, n: usize) -> Result<()> {
        let ns = NetNs::new(&format!("{}-ctl", self.prefix))?;
        let etcd = crate::etcd::EtcdCluster::start(&ns, &self.dir, 3)?;
        let spec = self.dir.join("topology.toml");
        let store = etcd.store_flag();
        for i in 0..n {
            let socket = format!("unix:{}", replica_socket(&self.dir, i).display());
            let name = format!("replica-{i}");
            self.replicas.push(Process::spawn(
                Some(&ns),
                &bins::sopa_controller(),
                &[
                    "--topology",
                    spec.to_str().expect("utf-8"),
                    "--listen",
                    &socket,
                    "--insecure",
                    "--store",
                    &store,
                    "--name",
                    &name,
                    "--flap-limit",
                    "0",
                    "--heartbeat-ms",
                    "500",
                ],
                &self.dir.join(format!("controller-{i}.log")),
            )?);
        }
        self.etcd = Some(etcd);
        self.ctl_ns = Some(ns);
        // Only the elected replica binds its socket.
        wait(
            "an elected controller's socket",
            Duration::from_secs(30),
            || (0..n).any(|i| replica_socket(&self.dir, i).exists()),
        )?;
        Ok(())
    }

    /// The address the controller serves its metrics on, where its flags give one
    /// (`--metrics-addr` in [`Fabric::controller_args`]).
    pub fn controller_metrics_addr(&self) -> Option<&str> {
        self.controller_args
            .iter()
            .position(|a| a == "--metrics-addr")
            .and_then(|i| self.controller_args.get(i + 1))
            .map(String::as_str)
    }

    /// Stops the controller and starts it again (its drains kept in its state file, the rest of
    /// its memory gone: the path meter's evidence and strikes, its counters), then waits until
    /// every agent has applied its state again.
    pub fn restart_controller(&mut self) -> Result<()> {
        self.stop_controller();
        self.start_controller()?;
        self.wait_applied(|_| true, "the restarted controller's state")
    }

    /// Where the testbed's controller keeps its state.
    pub fn controller_state_file(&self) -> std::path::PathBuf {
        self.dir.join("controller-state.json")
    }

    /// Stops the controller (SIGTERM); agents keep their state and retry.
    pub fn stop_controller(&mut self) {
        if let Some(mut p) = self.controller.take() {
            p.stop_with(libc::SIGTERM, Duration::from_secs(10));
        }
    }

    pub fn hop_ports_tx(&self, switch: &str, dst: std::net::Ipv4Addr) -> Vec<u64> {
        let g = self.topo.graph();
        let n = g.find(switch).expect("a switch");
        let plan = sopa_topology::forwarding::plan(&self.topo, n);
        let decision = plan
            .decisions
            .iter()
            .find(|d| d.prefix.contains_addr(dst))
            .unwrap_or_else(|| panic!("{switch} has no decision for {dst}"));
        decision
            .uplinks
            .iter()
            .map(|&l| {
                let dev = self.dev(l, n);
                self.ns(switch).tx_packets(&dev).expect("tx packets")
            })
            .collect()
    }

    /// Waits until the controller's down links satisfy `done` (their count) and every agent of
    /// the fabric (each host and switch agent running) is connected and has ACKed the
    /// controller's version: the change has been applied
    /// everywhere (a switch ACKs once its routes are installed, a host once its datapath is
    /// written). At most 30 s.
    pub fn wait_applied(&self, done: impl Fn(usize) -> bool, what: &str) -> Result<()> {
        self.wait_applied_within(done, what, Duration::from_secs(30))
    }

    /// [`Fabric::wait_applied`], for at most `within`.
    pub fn wait_applied_within(
        &self,
        done: impl Fn(usize) -> bool,
        what: &str,
        within: Duration,
    ) -> Result<()> {
        let start = Instant::now();
        loop {
            let st: serde_json::Value = serde_json::from_str(&self.sopactl(&["status", "--json"])?)
                .map_err(|e| Error::Failed(format!("sopactl status --json: {e}")))?;
            let down = st["down_links"].as_array().map_or(0, Vec::len);
            // Every agent reaches the controller over the management socket, which no fabric
            // failure touches: one that is not connected now (heartbeats missed on a starved
            // machine) has not applied the change yet, and its host still sends on the old paths.
            // Every agent of the fabric: a controller that restarted lists only those that have
            // reconnected so far, and one still in its backoff has not applied anything.
            let expected = self.hosts.len() + self.switches.len();
            let applied = st["agents"].as_array().is_some_and(|agents| {
                agents.len() >= expected
                    && agents
                        .iter()
                        .all(|a| a["connected"] == true && a["applied_version"] == st["version"])
            });
            if done(down) && applied {
                return Ok(());
            }
            if start.elapsed() > within {
                return Err(Error::Failed(format!(
                    "{what} did not reach the controller and every agent within {within:?}: {st}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every host's namespace and IPv4 address.
    pub fn host_addresses(&self) -> Vec<(&NetNs, std::net::Ipv4Addr)> {
        let g = self.topo.graph();
        g.nodes_of(NodeKind::Host)
            .map(|h| {
                (
                    &self.namespaces[&h],
                    g.node(h).addr.expect("hosts have addresses"),
                )
            })
            .collect()
    }

    /// Every host's namespace and IPv6 address (an inventory's, or its IPv4 one embedded).
    pub fn host_addresses6(&self) -> Vec<(&NetNs, std::net::Ipv6Addr)> {
        let g = self.topo.graph();
        g.nodes_of(NodeKind::Host)
            .map(|h| (&self.namespaces[&h], self.topo.host_ipv6(h)))
            .collect()
    }

    /// The interface of the link between `node` and `peer`, on `node`'s side.
    pub fn link_iface(&self, node: &str, peer: &str) -> String {
        let g = self.topo.graph();
        let (n, p) = (g.find(node).expect("a node"), g.find(peer).expect("a node"));
        let l = g
            .links_between(n, p)
            .next()
            .unwrap_or_else(|| panic!("no link {node}:{peer}"));
        self.dev(l, n)
    }

    /// The interface of `link` at `node`'s end: an inventory's port name where it makes a
    /// Linux interface name (interfaces are created in their namespaces, so names repeat
    /// across switches as on real ones), else `<prefix><link>a|b`.
    pub fn dev(&self, link: LinkId, node: NodeId) -> String {
        if let Topology::Clos(c) = &self.topo
            && let Some(port) = c.port_name(link, node)
            && is_ifname(port)
        {
            return port.to_owned();
        }
        let a = self.topo.graph().links[link as usize].a == node;
        format!("{}{link}{}", self.prefix, if a { "a" } else { "b" })
    }

    /// Swaps the cables of `switch`'s ports `p1` and `p2` (an inventory's port names), as a
    /// technician would: both ports go dark, each interface takes the other's name and the
    /// other's configured addresses (configuration belongs to the port, the cable moves), and
    /// both come back up facing the other's neighbour. Calling it again puts them back.
    pub fn swap_ports(&self, switch: &str, p1: &str, p2: &str) -> Result<()> {
        let ns = self.ns(switch);
        let g = self.topo.graph();
        let me = g.find(switch).expect("a switch");
        let six = self.encoding == Encoding::Srv6 || self.topo.routes_ipv6();
        let addresses = |port: &str| -> Vec<(bool, String)> {
            let Some(&(l, _)) = g.ports(me).iter().find(|(l, _)| self.dev(*l, me) == port) else {
                panic!("{switch} has no port {port}")
            };
            let a_end = g.links[l as usize].a == me;
            let (a, b, len) = link_addresses(&self.topo, l);
            let mut out = vec![(false, format!("{}/{len}", if a_end { a } else { b }))];
            if six {
                let (a, b, len) = link_addresses6(&self.topo, l);
                out.push((true, format!("{}/{len}", if a_end { a } else { b })));
            }
            out
        };
        let (a1, a2) = (addresses(p1), addresses(p2));
        let tmp = format!("{}swap", self.prefix);
        for p in [p1, p2] {
            ns.ip(&["link", "set", p, "down"])?;
            ns.ip(&["addr", "flush", "dev", p])?;
        }
        ns.ip(&["link", "set", p1, "name", &tmp])?;
        ns.ip(&["link", "set", p2, "name", p1])?;
        ns.ip(&["link", "set", &tmp, "name", p2])?;
        for (p, addrs) in [(p1, a1), (p2, a2)] {
            for (v6, a) in addrs {
                let mut args = vec!["addr", "add", &a, "dev", p];
                if v6 {
                    args.insert(0, "-6");
                    args.push("nodad");
                }
                ns.ip(&args)?;
            }
            ns.ip(&["link", "set", p, "up"])?;
        }
        Ok(())
    }

    /// Cuts the link between `a` and `b` for real: `a`'s end set down, so the link carries
    /// nothing either way (the other end of the veth loses its carrier), as a pulled cable or a
    /// dead optic would. Returns the time just before the cut.
    pub fn cut_link(&self, a: &str, b: &str) -> Result<std::time::SystemTime> {
        let iface = self.link_iface(a, b);
        let at = self.ns(a).set_up(&iface, false)?;
        // Switches without agents report nothing: the routers' routing converges, and the
        // testbed tells the controller.
        if !crate::routers::switches_have_agents(self) {
            crate::routers::reroute(self)?;
            self.sopactl(&["link", "down", a, b])?;
        }
        Ok(at)
    }

    /// Brings back a link [`Fabric::cut_link`] cut.
    pub fn mend_link(&self, a: &str, b: &str) -> Result<()> {
        let iface = self.link_iface(a, b);
        self.ns(a).set_up(&iface, true)?;
        if !crate::routers::switches_have_agents(self) {
            crate::routers::reroute(self)?;
            self.sopactl(&["link", "up", a, b])?;
        }
        Ok(())
    }

    /// Every switch's links to other switches: switch -> peer -> its interface towards it.
    pub fn link_ifaces(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let g = self.topo.graph();
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for l in g
            .links
            .iter()
            .filter(|l| g.node(l.a).kind.is_switch() && g.node(l.b).kind.is_switch())
        {
            let (a, b) = (g.name(l.a), g.name(l.b));
            out.entry(a.into())
                .or_default()
                .insert(b.into(), self.link_iface(a, b));
            out.entry(b.into())
                .or_default()
                .insert(a.into(), self.link_iface(b, a));
        }
        out
    }

    /// Starts (or restarts) the switch agent of switch `name`.
    pub fn start_switch(&mut self, name: &str) -> Result<()> {
        self.start_switch_with(name, &[])
    }

    /// Starts (or restarts) the switch agent of switch `name` with `extra` flags (e.g.
    /// `--keep-attached`).
    pub fn start_switch_with(&mut self, name: &str, extra: &[&str]) -> Result<()> {
        let id = self.topo.graph().find(name).expect("a switch");
        let ns = self.namespaces[&id].name().to_owned();
        let socket = self.controller_address();
        let agent_node = self.switch_node(name);
        let log = self.dir.join(format!("{name}.log"));
        let mut args = vec![
            "--netns",
            &ns,
            "switch",
            "--node",
            &agent_node,
            "--host",
            name,
            "--controller",
            &socket,
            "--heartbeat-ms",
            "500",
        ];
        args.extend(self.opts.switch_args.iter().map(String::as_str));
        args.extend_from_slice(extra);
        if extra.contains(&"--keep-attached") {
            self.kept_attached.insert(agent_node.clone(), ns.clone());
        } else {
            self.kept_attached.remove(&agent_node);
        }
        let p = Process::spawn(None, &bins::sopa_agent(), &args, &log)?;
        self.switches.insert(name.to_owned(), p);
        Ok(())
    }

    /// Stops the switch agent of `name` with SIGTERM (it restores what it changed) and returns
    /// its exit code.
    pub fn stop_switch(&mut self, name: &str) -> Option<i32> {
        let mut p = self.switches.remove(name)?;
        p.stop_with(libc::SIGTERM, Duration::from_secs(15))
            .and_then(|s| s.code())
    }

    /// SIGKILLs the switch agent of `name` (its forwarding state stays behind in the kernel).
    pub fn kill_switch(&mut self, name: &str) {
        if let Some(mut p) = self.switches.remove(name) {
            p.stop_with(libc::SIGKILL, Duration::from_secs(5));
        }
    }

    /// Waits until switch `name`'s agent runs, holds the controller's state and has
    /// `tc_forward` on its ports (at most `within`); otherwise an error with its log.
    pub fn wait_switch_synced(&self, name: &str, within: Duration) -> Result<()> {
        wait(&format!("{name}'s agent"), within, || {
            self.switch_status(name).is_ok_and(|s| {
                s["running"] == true
                    && s["controller"]["version"].as_u64().unwrap_or(0) >= 1
                    && s["forward_programs"]
                        .as_object()
                        .is_some_and(|p| !p.is_empty())
            })
        })
        .map_err(|e| Error::Failed(format!("{e}:\n{}", self.switch_log(name))))
    }

    /// The agent node name of switch `name` (its pin and run folders).
    pub fn switch_node(&self, name: &str) -> String {
        format!("{}-{}", self.prefix, name)
    }

    /// The log of switch `name`'s agent.
    pub fn switch_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// The host agent of host `name`.
    pub fn host(&self, name: &str) -> &Agent {
        &self.hosts[&self.topo.graph().find(name).expect("a host")]
    }

    /// Stops host `name`'s agent with SIGTERM (it restores the host: no program stays) and
    /// returns its exit code.
    pub fn stop_host(&mut self, name: &str) -> Option<i32> {
        let id = self.topo.graph().find(name).expect("a host");
        self.hosts.remove(&id)?.stop()
    }

    /// `sopa-agent status --json` of switch `name`.
    pub fn switch_status(&self, name: &str) -> Result<serde_json::Value> {
        let out = std::process::Command::new(bins::sopa_agent())
            .args([
                "status",
                "--json",
                "--node",
                &format!("{}-{}", self.prefix, name),
            ])
            .output()
            .map_err(|e| Error::io("sopa-agent status", e))?;
        if !out.status.success() {
            return Err(Error::Failed(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| Error::Failed(e.to_string()))
    }

    /// The single controller's log so far (empty with replicas or before it started), for
    /// what a failing test prints.
    pub fn controller_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("controller.log")).unwrap_or_default()
    }

    /// `sopactl ARGS --controller unix:SOCKET` (every replica's socket, with replicas).
    pub fn sopactl(&self, args: &[&str]) -> Result<String> {
        let socket = self.controller_address();
        let out = std::process::Command::new(bins::sopactl())
            .args(args)
            .args(["--controller", &socket])
            .output()
            .map_err(|e| Error::io("sopactl", e))?;
        if !out.status.success() {
            return Err(Error::Failed(
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// [`Fabric::wait_ready`], then every agent on the controller's version with no link
    /// down: the state a phase of a shared fabric starts from (an agent's late first report of
    /// a port can still change it after `wait_ready`).
    pub fn wait_settled(&self, timeout: Duration) -> Result<()> {
        self.wait_ready(timeout)?;
        self.wait_applied_within(|down| down == 0, "a settled fabric", timeout)
    }

    /// [`Fabric::wait_settled`] for a phase harness's check (a phase ends settled, so 20 s is
    /// long): what is not settled, in words.
    pub fn settled(&mut self) -> std::result::Result<(), String> {
        self.wait_settled(Duration::from_secs(20))
            .map_err(|e| e.to_string())
    }

    /// Waits until every switch has installed its plan (its status shows the controller's
    /// version) and every host holds a path to every other rack.
    pub fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let g = self.topo.graph();
        // Switches without agents (hashing routers) have nothing to wait for.
        let switches: Vec<&str> = g
            .nodes
            .iter()
            .filter(|n| n.kind.is_switch() && crate::routers::switches_have_agents(self))
            .map(|n| n.name.as_str())
            .collect();
        let racks = self.topo.racks().len() as u64;
        // A plan installed, and every host port trusted (its host's agent live): until then
        // the option from that host is neutralized.
        wait("every switch's plan and trusted ports", timeout, || {
            switches.iter().all(|s| {
                self.switch_status(s).is_ok_and(|st| {
                    st["controller"]["version"].as_u64().unwrap_or(0) >= 1
                        && st["controller"]["untrusted_hosts"]
                            .as_array()
                            .is_some_and(|h| h.is_empty())
                })
            })
        })?;
        wait("every host's paths", timeout, || {
            self.hosts.values().all(|a| {
                a.status()
                    .is_ok_and(|st| st["prefixes"].as_u64() == Some(racks - 1))
            })
        })
    }
}

/// Polls `f` until it holds (a state the fabric reports, such as a switch's status), or fails
/// after `timeout` naming `what`.
pub fn wait(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Result<()> {
    wait_for(
        what,
        timeout,
        || if f() { Ok(()) } else { Err(String::new()) },
    )
}

/// Polls `f` every 50 ms until it gives a value (a state the fabric reports reached), or fails
/// after `timeout` naming `what` and the last state `f` described.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> std::result::Result<T, String>,
) -> Result<T> {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(last) if start.elapsed() >= timeout => {
                let last = if last.is_empty() {
                    last
                } else {
                    format!(": {last}")
                };
                return Err(Error::Failed(format!("timed out waiting for {what}{last}")));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// `dev` sending at `rate` Mbit/s, `limit` bytes queued at most (drop-tail).
fn shape(ns: &NetNs, dev: &str, rate: u32, limit: &str, qdisc: LinkQdisc) -> Result<()> {
    let rate = format!("{rate}mbit");
    if qdisc == LinkQdisc::Tbf {
        // The bucket holds the largest frame of either encoding (an SRv6 fabric's links carry
        // 1554-byte frames), and TBF drops a packet larger than its bucket.
        let burst = (SRV6_FABRIC_MTU as usize + 14).to_string();
        ns.tc(&[
            "qdisc", "add", "dev", dev, "root", "tbf", "rate", &rate, "burst", &burst, "limit",
            limit,
        ])?;
        return Ok(());
    }
    ns.tc(&[
        "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1",
    ])?;
    ns.tc(&[
        "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", &rate, "ceil",
        &rate, "quantum", "1514",
    ])?;
    ns.tc(&[
        "qdisc", "add", "dev", dev, "parent", "1:1", "bfifo", "limit", limit,
    ])?;
    Ok(())
}

/// A fabric left running after the process that built it exits (`cargo xtask testbed up`):
/// enough to reach it and to tear it down later.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Detached {
    pub prefix: String,
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// Where agents and `sopactl` reach the controller (every replica's socket); empty for
    /// the one controller on `socket`.
    #[serde(default)]
    pub controller: String,
    pub topology: String,
    /// Node name -> namespace.
    pub namespaces: BTreeMap<String, String>,
    /// Node name -> agent node name (for `sopa-agent status --node`).
    pub agents: BTreeMap<String, String>,
    /// Host agents, switch agents, then the controller: the order to stop them in.
    pub pids: Vec<u32>,
    /// Every switch's links to other switches: switch -> peer -> its interface towards it.
    #[serde(default)]
    pub links: BTreeMap<String, BTreeMap<String, String>>,
}

impl Fabric {
    /// Leaves everything running and returns what is needed to find and remove it.
    pub fn detach(mut self) -> Detached {
        let g = self.topo.graph().clone();
        let links = self.link_ifaces();
        let mut pids: Vec<u32> = std::mem::take(&mut self.hosts)
            .into_values()
            .map(Agent::leak)
            .collect();
        pids.extend(
            std::mem::take(&mut self.switches)
                .into_values()
                .map(Process::leak),
        );
        pids.extend(self.controller.take().map(Process::leak));
        let controller = if self.replicas.is_empty() {
            String::new()
        } else {
            self.controller_address()
        };
        pids.extend(
            std::mem::take(&mut self.replicas)
                .into_iter()
                .map(Process::leak),
        );
        if let Some(etcd) = self.etcd.take() {
            pids.extend(etcd.members.into_iter().flatten().map(Process::leak));
        }
        let mut namespaces: BTreeMap<String, String> = std::mem::take(&mut self.namespaces)
            .into_iter()
            .map(|(id, ns)| (g.name(id).to_owned(), ns.leak()))
            .collect();
        if let Some(big) = self.ideal.take() {
            namespaces.insert("ideal".into(), big.leak());
        }
        if let Some(ctl) = self.ctl_ns.take() {
            namespaces.insert("ctl".into(), ctl.leak());
        }
        let agents = g
            .nodes
            .iter()
            .map(|n| (n.name.clone(), format!("{}-{}", self.prefix, n.name)))
            .collect();
        let detached = Detached {
            prefix: self.prefix.clone(),
            dir: self.dir.clone(),
            socket: self.socket.clone(),
            controller,
            topology: self.topo.name(),
            namespaces,
            agents,
            pids,
            links,
        };
        std::mem::forget(self);
        detached
    }
}

impl Detached {
    /// Where `sopactl` reaches the controller.
    pub fn controller_address(&self) -> String {
        if self.controller.is_empty() {
            format!("unix:{}", self.socket.display())
        } else {
            self.controller.clone()
        }
    }

    /// The namespace and interface of switch `a`'s end of its link to switch `b`.
    pub fn link_end(&self, a: &str, b: &str) -> Option<(String, String)> {
        let iface = self.links.get(a)?.get(b)?;
        Some((self.namespaces.get(a)?.clone(), iface.clone()))
    }

    /// Every end switch `name` has of a link to another switch: (namespace, interface).
    pub fn switch_ends(&self, name: &str) -> Vec<(String, String)> {
        let Some(ns) = self.namespaces.get(name) else {
            return Vec::new();
        };
        self.links
            .get(name)
            .into_iter()
            .flat_map(|peers| peers.values())
            .map(|iface| (ns.clone(), iface.clone()))
            .collect()
    }

    /// Stops every process (SIGTERM, then SIGKILL) and deletes every namespace and file.
    pub fn teardown(&self) {
        for &pid in &self.pids {
            stop_pid(pid);
        }
        for ns in self.namespaces.values() {
            let _ = crate::netns::ip(&["netns", "del", ns]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SIGTERM `pid`, then SIGKILL after 5 s; only for processes a testbed started.
pub fn stop_pid(pid: u32) {
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    // Only a process that is still ours: a recycled PID belongs to someone else.
    let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains("sopa-"));
    if pid == 0 || !alive(pid) || !ours {
        return;
    }
    // SAFETY: signalling a process this testbed started, by its recorded PID.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(pid) {
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // `sopa-agent mode` and `granularity` leave each host node run-time choices that
        // outlive its agent by design; the fabric's nodes go with the fabric.
        let nodes: Vec<String> = self.hosts.values().map(|a| a.node.clone()).collect();
        self.hosts.clear();
        for node in nodes {
            crate::agent::forget_run_time_choices(&node);
        }
        for p in self.switches.values_mut() {
            p.stop();
        }
        self.switches.clear();
        // An agent stopped with --keep-attached left its programs and pins for the next one.
        for (node, ns) in std::mem::take(&mut self.kept_attached) {
            let _ = std::process::Command::new(bins::sopa_agent())
                .args(["--netns", &ns, "detach", "--node", &node])
                .output();
        }
        self.controller = None;
        self.replicas.clear();
        self.etcd = None;
        self.ctl_ns = None;
        self.namespaces.clear();
        self.ideal = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Replica `i`'s socket.
fn replica_socket(dir: &std::path::Path, i: usize) -> PathBuf {
    dir.join(format!("controller-{i}.sock"))
}

/// Every replica's socket, as a `--controller` list.
fn replica_address(dir: &std::path::Path, n: usize) -> String {
    (0..n)
        .map(|i| format!("unix:{}", replica_socket(dir, i).display()))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::LinkQdisc;

    #[test]
    fn link_qdiscs_parse_and_print_by_name() {
        for q in [LinkQdisc::Htb, LinkQdisc::Tbf] {
            assert_eq!(q.to_string().parse::<LinkQdisc>(), Ok(q));
        }
        assert_eq!("tbf".parse::<LinkQdisc>(), Ok(LinkQdisc::Tbf));
        let err = "netem".parse::<LinkQdisc>().unwrap_err();
        assert!(err.contains("netem") && err.contains("htb or tbf"), "{err}");
    }
}
