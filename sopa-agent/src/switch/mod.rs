//! The switch role: a software switch of the fabric (a testbed namespace, or a Linux box). From
//! the topology the controller pushes it computes its forwarding plan, finds its ports by their
//! link addresses, installs destination routes (multipath where several next hops are equal),
//! fills `tc_forward`'s decisions and attaches it to every port. The kernel multipath-hashes
//! packets without the option by 5-tuple with a seed of this switch's own, as independent
//! hardware switches would (notes/fabric.md: policy 1, or one seed everywhere, is polarized).
//!
//! Only trusted ports may bring the option: links to other switches, and links to hosts whose
//! agent the controller reports live (a host without one could choose hop bytes itself, with
//! `IP_OPTIONS` or a raw socket). On every other port `tc_forward` neutralizes the option.

mod applier;
pub mod cabling;
mod failover;
pub mod metrics;
mod ports;
mod routes;
pub mod usid;

pub use applier::SwitchApplier;
use ports::Port;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::Ipv4Addr,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use sopa_channel::{
    client::Applier,
    proto::{Delta, LinkReport, PeerAgents, Snapshot},
    view::FabricView,
};
use sopa_common::maps::trust;
use sopa_topology::{
    LinkId, NodeKind, Prefix, Topology,
    forwarding::{self, SwitchPlan},
    paths::Failures,
    srv6::{self as plan6, Encoding, Srv6Route},
};
use tracing::{info, warn};

use crate::{
    changes::{Change, ControllerState, Journal, Record},
    datapath::{Datapath, TcxOrder},
    error::{Error, Result},
    host::{check_privileges, pin_dir, run_dir, validate_node},
    netlink::{Action6, Netlink, Route, Route6},
    sysctl,
};

/// What a switch's record says in the host's granularity field: it sprays nothing.
pub const GRANULARITY: &str = "-";

pub struct SwitchOptions {
    pub node: String,
    pub hash_seed: u32,
    /// Restore and unpin whatever a previous agent of this node left, instead of adopting it.
    pub reset: bool,
    /// The namespace the agent runs in (recorded for `sopa-agent detach`).
    pub netns: Option<String>,
    /// Where `tc_forward` goes in each port's TCX ingress chain.
    pub tcx_order: TcxOrder,
    /// Who consumes the switch's uSID in the SRv6 encoding (`--usid`).
    pub usid: usid::UsidMode,
    /// How `tc_forward` attaches to the ports: TCX links or cls_bpf filters (`--attach`).
    pub attach: crate::datapath::tc_hook::AttachMode,
    /// When the switch speaks LLDP for the cabling check, and how often.
    pub lldp: cabling::LldpMode,
    pub lldp_interval: std::time::Duration,
}

pub struct Switch {
    datapath: Datapath,
    /// `tc_forward`'s maps and entries, shared with the port watcher, which repairs the entries
    /// the moment a port loses its carrier.
    repair: Arc<Mutex<failover::Repair>>,
    journal: Option<Journal>,
    netlink: Netlink,
    attached: Vec<u32>,
    /// ifindex -> the link's two node names, for link-state reports.
    port_links: HashMap<u32, (String, String)>,
    /// ifindex -> the host behind a port facing a host; every other port faces a switch.
    host_ports: BTreeMap<u32, String>,
    /// The hosts whose agent the controller last reported live; `None` until it reported any
    /// (a controller older than the trust rule never does: every host port stays trusted).
    live_hosts: Option<BTreeSet<String>>,
    tcx_order: TcxOrder,
    /// Counters of an older layout's datapath, carried over once the first plan replaced its
    /// programs.
    carry: Option<crate::datapath::layout::Carry>,
    /// How the hosts carry the path: in SRv6 this switch is a plain Linux SRv6 node (IPv6
    /// routes, and `seg6local` End where the kernel has it), `tc_forward` there to repair
    /// lists around dead ports and, without `seg6local`, to consume the switch's uSID.
    encoding: Encoding,
    /// Who consumes this switch's uSID in the SRv6 encoding.
    usid: usid::UsidEnd,
    /// How `tc_forward` attaches to the ports.
    tc_hook: crate::datapath::tc_hook::TcHook,
    lldp: cabling::LldpMode,
    lldp_interval: std::time::Duration,
    /// The interfaces of the plan's ports, where LLDP speaks.
    lldp_ports: Vec<String>,
    /// What the metrics show beyond the maps.
    gauges: metrics::SwitchGauges,
    /// LLDP, once a plan says where (and the mode says whether).
    cabling: Option<cabling::Cabling>,
}

/// Sets `key` to `value`, recorded in `journal` with the value from before any agent: one entry
/// per setting, however many restarts (an adopted journal already holds it). A kernel without
/// the setting is said and left.
fn set_sysctl(journal: &mut Journal, key: &str, value: &str) -> Result<()> {
    let Ok(old) = sysctl::read(key) else {
        warn!(key, "this kernel lacks the sysctl; leaving it");
        return Ok(());
    };
    let recorded = journal.record.changes.iter_mut().find_map(|c| match c {
        Change::Sysctl { key: k, new, .. } if k == key => Some(new),
        _ => None,
    });
    match recorded {
        Some(new) if *new == value => {}
        Some(new) => {
            *new = value.to_owned();
            journal.save()?;
        }
        None => journal.push(Change::Sysctl {
            key: key.into(),
            old,
            new: value.to_owned(),
        })?,
    }
    sysctl::write(key, value)
}

impl Switch {
    pub async fn start(opts: &SwitchOptions) -> Result<Self> {
        validate_node(&opts.node)?;
        check_privileges()?;
        crate::datapath::check_kernel()?;
        crate::datapath::check_bpffs()?;
        let netlink = Netlink::connect()?;
        // Before anything changes: a forced choice the kernel cannot honour is a refusal.
        let (usid, usid_fallback) = usid::choose(opts.usid, &netlink).await?;
        let (tc_hook, tc_fallback) = crate::datapath::tc_hook::choose(opts.attach)?;
        let dir = run_dir(&opts.node);
        // A previous run left its forwarding in place (pinned links, routes, maps), after a
        // crash or on purpose (--keep-attached): adopt it, so traffic never stops, and take
        // over its undo list; with --reset, restore it instead.
        let pins = pin_dir(&opts.node);
        let mut adopted = Vec::new();
        let mut adoption = None;
        if let Some(record) = Journal::read(&dir)? {
            if record.is_live() && record.pid != std::process::id() {
                return Err(Error::AlreadyRunning {
                    node: opts.node.clone(),
                    pid: record.pid,
                });
            }
            if record.namespace(opts.netns.as_deref())? == crate::changes::RecordNamespace::Gone {
                warn!(
                    pid = record.pid,
                    netns = ?record.netns,
                    "the previous agent's network namespace is gone, and with it what it changed; removing its pins and record"
                );
                crate::host::forget(&pins, &dir)?;
            } else if opts.reset {
                warn!(
                    pid = record.pid,
                    "--reset: restoring what the previous agent of this node left"
                );
                let errors = Journal::resume(&dir, record).undo(&netlink).await;
                if let Some(err) = errors.into_iter().next() {
                    return Err(err);
                }
                if pins.exists() {
                    std::fs::remove_dir_all(&pins)
                        .map_err(|e| Error::io(format!("removing {}", pins.display()), e))?;
                }
            } else {
                crate::datapath::layout::check(&pins)?;
                info!(
                    pid = record.pid,
                    changes = record.changes.len(),
                    how = if record.kept_attached {
                        "kept attached"
                    } else {
                        "crashed"
                    },
                    "adopting the forwarding a previous run left"
                );
                adoption = Some(crate::changes::Adoption {
                    pid: record.pid,
                    how: if record.kept_attached {
                        "kept attached"
                    } else {
                        "crashed"
                    }
                    .into(),
                    stamp_prog_replaced: None,
                    strip_prog_replaced: None,
                });
                adopted = record.changes;
            }
        }
        let record = Record {
            node: opts.node.clone(),
            pid: std::process::id(),
            start_time: crate::changes::process_start_time(std::process::id()),
            iface: "(switch ports)".into(),
            ifindex: 0,
            paths_file: None::<PathBuf>,
            granularity: GRANULARITY.into(),
            xdp_mode: "-".into(),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            changes: adopted,
            controller: None,
            netns: opts.netns.clone(),
            kept_attached: false,
            adopted: adoption,
            programs: None,
            reloads_on_sighup: false,
            usid: Some(usid.name().into()),
            attach: Some(tc_hook.name().into()),
            fallbacks: usid_fallback
                .into_iter()
                .map(|instead| ("seg6local".to_owned(), instead))
                .chain(tc_fallback.map(|instead| ("tcx".to_owned(), instead)))
                .collect(),
        };
        let adopting = !record.changes.is_empty();
        let mut journal = Journal::create(&dir, record)?;
        let setup = async {
            if !journal
                .record
                .changes
                .iter()
                .any(|c| matches!(c, Change::Pins { .. }))
            {
                journal.push(Change::Pins { dir: pins.clone() })?;
            }
            let mut datapath = Datapath::load_switch(&pins)?;
            let repair =
                failover::Repair::new(datapath.take_forward_maps()?, usid == usid::UsidEnd::Ebpf)?;
            // Counters an agent of an older layout left, set into ours before anything counts
            // there.
            let carry = crate::datapath::layout::Carry::start(&pins)
                .inspect_err(|err| {
                    warn!(%err, "counters of an older datapath layout could not be carried over");
                })
                .ok();
            for (key, value) in [
                ("net.ipv4.ip_forward", "1".to_owned()),
                ("net.ipv4.fib_multipath_hash_policy", "3".to_owned()),
                ("net.ipv4.fib_multipath_hash_fields", "0x0037".to_owned()),
                // A next hop whose port lost its carrier is skipped at once (the kernel keeps
                // such routes, marked linkdown, and would go on hashing packets onto them).
                (
                    "net.ipv4.conf.all.ignore_routes_with_linkdown",
                    "1".to_owned(),
                ),
                (
                    "net.ipv4.fib_multipath_hash_seed",
                    opts.hash_seed.to_string(),
                ),
            ] {
                set_sysctl(&mut journal, key, &value)?;
            }
            Ok::<_, Error>((datapath, repair, carry))
        };
        match setup.await {
            Ok((datapath, repair, carry)) => Ok(Self {
                gauges: metrics::SwitchGauges {
                    dead_ports: repair.down_count(),
                    ..Default::default()
                },
                datapath,
                repair: Arc::new(Mutex::new(repair)),
                journal: Some(journal),
                netlink,
                attached: Vec::new(),
                port_links: HashMap::new(),
                host_ports: BTreeMap::new(),
                live_hosts: None,
                tcx_order: opts.tcx_order,
                carry,
                encoding: Encoding::default(),
                usid,
                tc_hook,
                lldp: opts.lldp,
                lldp_interval: opts.lldp_interval,
                lldp_ports: Vec::new(),
                cabling: None,
            }),
            Err(e) => {
                if !adopting {
                    let _ = journal.undo(&netlink).await;
                }
                Err(e)
            }
        }
    }

    /// Where `tc_forward` goes on port `name` (see `tc_hook::place`), recorded in the journal.
    async fn forward_hook(&mut self, name: &str, ifindex: u32) -> Result<crate::datapath::Hook> {
        let tcx_pinned = self
            .datapath
            .pin_dir()
            .join(format!("link_fwd_{}", name.replace('.', ":")))
            .exists();
        let seen = crate::datapath::tc_hook::look(&self.netlink, ifindex).await?;
        let journal = self.journal.as_mut().expect("running");
        let recorded = journal.record.changes.clone();
        let journal = std::cell::RefCell::new(journal);
        crate::datapath::tc_hook::place(
            self.tc_hook,
            self.tcx_order,
            (name, ifindex, true),
            tcx_pinned,
            &seen,
            &recorded,
            &mut |c| journal.borrow_mut().push(c),
            &mut |gone| {
                let mut j = journal.borrow_mut();
                j.record.changes.retain(|c| c != gone);
                j.save()
            },
        )
    }

    /// What this switch does without features its kernel lacks, one `feature: instead` each
    /// (for the controller's view of the fleet).
    pub fn fallbacks(&self) -> Vec<String> {
        self.journal
            .as_ref()
            .map(|j| j.record.fallback_lines())
            .unwrap_or_default()
    }

    /// Installs the plan of `node` in `topo` under `failures`: routes, `tc_forward` on each
    /// port, and, for the IPv4 option, its decisions; for SRv6, the IPv6 routes and the
    /// `seg6local` End locator (none where `tc_forward` consumes the uSID), `tc_forward` there
    /// to repair uSID lists around dead ports.
    pub async fn apply(
        &mut self,
        topo: &Topology,
        node: &str,
        failures: &Failures,
        encoding: Encoding,
    ) -> Result<()> {
        let g = topo.graph();
        let me = g
            .find(node)
            .filter(|n| g.node(*n).kind.is_switch())
            .ok_or_else(|| {
                Error::Config(format!(
                    "node {node:?} is not a switch of the pushed topology ({})",
                    topo.name()
                ))
            })?;
        let plan: SwitchPlan = forwarding::plan_under(topo, me, failures);
        let ports = self.ports(topo, me).await?;
        self.install_routes(&plan.routes, &ports).await?;
        self.note_lldp_ports(topo, &ports).await?;
        if encoding == Encoding::Srv6 || topo.routes_ipv6() {
            // No duplicate address detection on the ports: while a port's link-local address
            // is tentative (1-2 s after every flap) the kernel cannot resolve a neighbour
            // through it, and forwards nothing there (measured: a transfer at 28 Mbit/s instead
            // of 360 after a flap, its packets queued or dropped). Fabric links are
            // point to point. The kernel skips DAD only where `all` says so too.
            let mut names = Vec::new();
            for p in ports.values() {
                names.push(self.netlink.link_name(p.ifindex).await?);
            }
            let journal = self.journal.as_mut().expect("running");
            set_sysctl(journal, "net.ipv6.conf.all.forwarding", "1")?;
            set_sysctl(journal, "net.ipv6.conf.all.accept_dad", "0")?;
            for name in names {
                let key = crate::sysctl::interface_key("ipv6", &name, "accept_dad");
                set_sysctl(journal, &key, "0")?;
            }
        }
        self.encoding = encoding;
        self.install_srv6(topo, me, failures, &ports).await?;
        let decisions = if encoding == Encoding::Srv6 {
            0
        } else {
            plan.decisions.len()
        };
        self.port_links = ports
            .iter()
            .map(|(l, p)| {
                let link = &g.links[*l as usize];
                (
                    p.ifindex,
                    (g.name(link.a).to_owned(), g.name(link.b).to_owned()),
                )
            })
            .collect();
        self.host_ports = ports
            .iter()
            .filter_map(|(l, p)| {
                let link = &g.links[*l as usize];
                let other = if link.a == me { link.b } else { link.a };
                (g.node(other).kind == NodeKind::Host)
                    .then(|| (p.ifindex, g.name(other).to_owned()))
            })
            .collect();
        // Trust before attaching: a program replaced in place finds its ports already known.
        self.write_trust()?;
        let mut ifindexes: Vec<u32> = ports.values().map(|p| p.ifindex).collect();
        ifindexes.sort_unstable();
        ifindexes.dedup();
        for ifindex in ifindexes {
            if !self.attached.contains(&ifindex) {
                let name = self.netlink.link_name(ifindex).await?;
                let hook = self.forward_hook(&name, ifindex).await?;
                if let Some(old) = self.datapath.attach_forward(&name, &hook)? {
                    info!(port = %name, replaced_program = old, "adopted the forwarding link a previous run pinned: its program replaced in place");
                }
                self.attached.push(ifindex);
            }
        }
        // The entries after the programs: a program replaced in place (an upgrade) finds the
        // decisions the previous agent left, and never sees an entry kind it does not know.
        let srv6 = failover::srv6_plan(topo, me, failures, encoding)?;
        let repaired = self.lock().install(
            Some((topo.clone(), me, failures.clone(), ports.clone())),
            srv6,
        )?;
        if !repaired.dead.is_empty() {
            info!(dead = ?repaired.dead, substituted = repaired.substituted, detours = repaired.detours, "ports without carrier repaired around in the new plan");
        }
        if let Some(carry) = self.carry.take()
            && let Err(err) = carry.finish()
        {
            warn!(%err, "counters of an older datapath layout could not be carried over");
        }
        info!(
            node,
            %encoding,
            routes = plan.routes.len(),
            decisions,
            ports = self.attached.len(),
            "switch plan installed"
        );
        Ok(())
    }

    /// Takes the hosts whose agent the controller reports live and trusts exactly their ports
    /// (and the links to other switches). Returns the hosts behind this switch's ports whose
    /// option is now neutralized.
    pub fn set_live_hosts(&mut self, live: &[String]) -> Result<Vec<String>> {
        self.live_hosts = Some(live.iter().cloned().collect());
        // Before the first plan the ports are unknown: the trusted ports a previous agent left
        // stay until the plan writes them.
        if !self.port_links.is_empty() {
            self.write_trust()?;
        }
        Ok(self.untrusted_hosts())
    }

    /// The hosts behind this switch's ports whose agent is not live.
    pub fn untrusted_hosts(&self) -> Vec<String> {
        let Some(live) = &self.live_hosts else {
            return Vec::new();
        };
        self.host_ports
            .values()
            .filter(|h| !live.contains(*h))
            .cloned()
            .collect()
    }

    /// Writes the trusted ports: every port of the plan that faces a switch, and the ports
    /// facing live hosts.
    fn write_trust(&mut self) -> Result<()> {
        let ports: BTreeMap<u32, u32> = self
            .port_links
            .keys()
            .filter_map(|ifindex| match self.host_ports.get(ifindex) {
                None => Some((*ifindex, trust::SWITCH)),
                Some(h) if self.live_hosts.as_ref().is_none_or(|l| l.contains(h)) => {
                    Some((*ifindex, trust::HOST))
                }
                Some(_) => None,
            })
            .collect();
        self.lock().maps().set_trusted(&ports)
    }

    /// Recomputes the kernel routes under `failures` (after a pushed change) and installs the
    /// difference: changed routes replaced, racks no longer reachable from here unrouted.
    pub async fn update_routes(
        &mut self,
        topo: &Topology,
        node: &str,
        failures: &Failures,
    ) -> Result<()> {
        let me = topo
            .graph()
            .find(node)
            .ok_or_else(|| Error::Config(format!("node {node:?} is not in the topology")))?;
        let routes = forwarding::routes(topo, me, failures);
        let ports = self.ports(topo, me).await?;
        self.install_routes(&routes, &ports).await?;
        self.note_lldp_ports(topo, &ports).await?;
        self.install_srv6(topo, me, failures, &ports).await?;
        // The detours simulate the rest of the fabric as the controller now has it.
        let srv6 = failover::srv6_plan(topo, me, failures, self.encoding)?;
        self.lock().set_failures(failures, srv6)?;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, failover::Repair> {
        // A panic while holding it left entries at worst half rewritten; the next write
        // rewrites them all.
        self.repair.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where LLDP speaks: every interface that carries a link of the plan; and whether it
    /// speaks at all (`--lldp`, on an inventory's fabric by default).
    async fn note_lldp_ports(
        &mut self,
        topo: &Topology,
        ports: &HashMap<LinkId, Port>,
    ) -> Result<()> {
        let wanted = match self.lldp {
            cabling::LldpMode::On => true,
            cabling::LldpMode::Off => false,
            cabling::LldpMode::Auto => matches!(topo, Topology::Clos(_)),
        };
        let mut names = Vec::new();
        if wanted {
            for p in ports.values() {
                names.push(self.netlink.link_name(p.ifindex).await?);
            }
            names.sort();
            names.dedup();
        }
        if let Some(c) = &self.cabling {
            c.set_ports(names.clone());
        }
        self.lldp_ports = names;
        Ok(())
    }

    /// Starts LLDP on the plan's ports (once; where the mode wants it), its table sent to
    /// `reports`. Idempotent.
    pub fn start_cabling(
        &mut self,
        node: &str,
        reports: &tokio::sync::mpsc::Sender<sopa_channel::proto::agent_message::Kind>,
    ) -> Result<()> {
        if self.cabling.is_none() && !self.lldp_ports.is_empty() {
            self.cabling = Some(cabling::Cabling::start(
                node,
                true,
                self.lldp_ports.clone(),
                Vec::new(),
                self.lldp_interval,
                reports.clone(),
            )?);
        }
        Ok(())
    }

    /// Sends the LLDP table again (a new session).
    pub fn resend_cabling(&self) {
        if let Some(c) = &self.cabling {
            c.resend();
        }
    }

    pub fn set_controller_state(&mut self, state: ControllerState) {
        use std::sync::atomic::Ordering::Relaxed;
        self.gauges
            .connected
            .store(i64::from(state.connected), Relaxed);
        self.gauges.version.store(state.version, Relaxed);
        if let Some(j) = self.journal.as_mut() {
            let _ = j.set_controller(state);
        }
    }

    /// What the switch's metrics read beyond its maps.
    pub fn gauges(&self) -> metrics::SwitchGauges {
        self.gauges.clone()
    }

    pub fn forward_counters(&self) -> Result<Vec<u64>> {
        self.lock().maps_ref().counters()
    }

    /// Detaches and restores (removing the pin folder releases the pinned forward links); with
    /// `keep_attached`, leaves the forwarding as it is (programs, routes, settings), recorded
    /// for the next agent to adopt or `sopa-agent detach` to remove.
    pub async fn stop(mut self, keep_attached: bool) -> Vec<Error> {
        self.datapath
            .stop(self.journal.take(), &self.netlink, keep_attached)
            .await
    }
}
