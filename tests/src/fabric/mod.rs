//! A whole fabric of the topology model in network namespaces: one namespace per host and
//! switch, a veth pair per link (addressed as `sopa_topology::forwarding` says), optionally
//! shaped (HTB at the link rate with a byte-limited drop-tail bfifo), a controller on a Unix
//! socket (the management path every namespace reaches), a switch agent per switch and a host
//! agent per host. Everything is stopped and deleted on drop, processes first.
//!
//! Here the fabric's namespaces and links are built (and the non-blocking ideal's big switch);
//! `options.rs` is what a fabric is asked for, `agents.rs` its host and switch agents,
//! `controller.rs` its controller or replicas, `links.rs` its links and their interfaces,
//! `detached.rs` a fabric left running for `cargo xtask testbed up`.

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

mod agents;
mod controller;
mod detached;
mod links;
mod options;

pub use detached::{Detached, stop_pid};
pub use options::{FabricOptions, LinkQdisc, SRV6_FABRIC_MTU, parse_topo};

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
