//! The host role: stamp on egress, strip on ingress, and the host settings they need
//! (tcp_reordering, fabric route MTUs, GSO granularity), all undone on exit.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use aya::programs::XdpMode;
use sopa_common::maps::Config;
use tracing::{info, warn};

use crate::{
    BPFFS_ROOT, RUN_ROOT,
    changes::{Change, Journal, Record, SharedJournal},
    datapath::{Datapath, MapSet},
    error::{Error, Result},
    granularity::{self, Granularity},
    metrics,
    netlink::{self, Netlink},
    path_table::{PathTable, Prefix},
    routes::RouteKeeper,
    status::mode_name,
    sysctl,
};

/// How `xdp_strip` attaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum XdpAttach {
    /// Generic on veth (native XDP there disables the peer's TSO), native elsewhere.
    Auto,
    Generic,
    Native,
}

#[derive(Clone, Debug)]
pub struct HostOptions {
    pub node: String,
    pub iface: String,
    pub paths: PathTable,
    pub paths_file: Option<PathBuf>,
    pub mode: u32,
    pub granularity: Granularity,
    pub xdp: XdpAttach,
    pub tcp_reordering: u32,
    pub metrics_addr: Option<SocketAddr>,
    /// Who may reach the metrics address besides loopback (`--metrics-allow`), and its TLS.
    pub metrics_access: sopa_ops::http::Access,
    /// This node's certificate (`--certs DIR/node.pem`), whose expiry the metrics show.
    pub certificate: Option<PathBuf>,
    pub hash_seed: u32,
    /// Lower the fabric routes' MTU by the option's 4 bytes (a plain `mtu`: DF stays on).
    pub lower_route_mtu: bool,
    /// The paths come from a controller: an adopted datapath keeps its path map until the
    /// controller's snapshot replaces it (an empty start table would cut traffic).
    pub paths_from_controller: bool,
    /// Restore and unpin whatever a previous agent of this node left, instead of adopting it.
    pub reset: bool,
    /// The namespace the agent runs in (recorded for `sopa-agent detach`).
    pub netns: Option<String>,
    /// A live agent of this node hands its datapath over (SIGUSR1: it exits keeping it
    /// attached) and this one adopts it: an upgrade in place.
    pub takeover: bool,
    /// Where `tc_stamp` goes in the interface's TCX egress chain (or among its egress filters).
    pub tcx_order: crate::datapath::TcxOrder,
    /// How `tc_stamp` attaches: a TCX link, or a cls_bpf filter (`--attach`).
    pub attach: crate::datapath::tc_hook::AttachMode,
    /// The mode was given at start (`--mode`): a mode set at run time is forgotten, before
    /// the agent says it is up.
    pub forget_runtime_mode: bool,
    /// The path meter's period of alternate marking (zero: no metering).
    pub meter_period: std::time::Duration,
    /// `xdp_strip` measures the reordering of arriving TCP flows.
    pub measure_reordering: bool,
    /// Where the socket-option guard goes (`--guard-cgroup`).
    pub guard_cgroup: crate::datapath::guard::GuardCgroup,
}

/// `/readyz`: the endpoints serve once the datapath is attached; with a controller, the agent
/// is ready once its datapath holds the controller's topology (before, it forwards by an
/// adopted datapath's paths or by none).
fn readiness(gauges: metrics::AgentGauges, from_controller: bool) -> sopa_ops::http::Readiness {
    Arc::new(move || {
        if from_controller && gauges.version.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            Err(
                "the datapath is attached; waiting for the controller's first topology \
                 (`sopa-agent status` shows the channel)"
                    .into(),
            )
        } else {
            Ok(())
        }
    })
}

/// Bytes the table's encoding adds to every IPv4 packet it carries a path in.
fn overhead(table: &PathTable) -> u32 {
    if table.srv6.is_some() {
        // The outer header and the meter's mark, whether or not the meter runs now.
        sopa_common::srv6::MAX_OVERHEAD as u32
    } else if table.entropy.is_some() {
        // The outer header (IPv6 grows by nothing: its label is rewritten in place).
        sopa_common::srv6::IPV6_HLEN as u32
    } else {
        u32::from(sopa_common::wire::OPTION_LEN)
    }
}

/// The node's pin folder. bpffs refuses names containing '.', so dots become ':' there.
pub fn pin_dir(node: &str) -> PathBuf {
    Path::new(BPFFS_ROOT).join(node.replace('.', ":"))
}

pub fn run_dir(node: &str) -> PathBuf {
    Path::new(RUN_ROOT).join(node)
}

/// Checks a node name: it names folders, so only `[A-Za-z0-9._-]`, 1 to 64 characters.
pub fn validate_node(node: &str) -> Result<()> {
    let ok = !node.is_empty()
        && node.len() <= 64
        && node != "."
        && node != ".."
        && node
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "node name {node:?} must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' or '-'"
        )))
    }
}

/// Moves the calling thread into the network namespace `netns` (a name under /run/netns, or a
/// path to a namespace file).
pub fn enter_netns(netns: &str) -> Result<()> {
    use std::os::fd::AsRawFd as _;
    let path = if netns.contains('/') {
        PathBuf::from(netns)
    } else {
        Path::new("/run/netns").join(netns)
    };
    let file = std::fs::File::open(&path).map_err(|err| {
        Error::Config(format!(
            "network namespace {netns:?} ({}): {err}; create it with `ip netns add {netns}`",
            path.display()
        ))
    })?;
    // SAFETY: setns on an open namespace file descriptor.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(Error::io(
            format!("entering network namespace {netns:?}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Fails early, before anything is changed, when the process lacks the capabilities it needs.
pub fn check_privileges() -> Result<()> {
    check_capabilities(true)
}

/// What `detach` needs: it loads no program, so the verifier's CAP_PERFMON is not asked for.
pub fn check_undo_privileges() -> Result<()> {
    check_capabilities(false)
}

fn check_capabilities(load_programs: bool) -> Result<()> {
    const CAP_NET_ADMIN: u32 = 12;
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|err| Error::io("reading /proc/self/status", err))?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    let has = |cap: u32| eff & (1 << cap) != 0;
    // Without CAP_SYS_ADMIN the verifier wants CAP_BPF and CAP_PERFMON both (the programs
    // read packet pointers and call tracing-class helpers).
    let mut missing = Vec::new();
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !has(CAP_SYS_ADMIN) {
        if !has(CAP_BPF) {
            missing.push("CAP_BPF");
        }
        if load_programs && !has(CAP_PERFMON) {
            missing.push("CAP_PERFMON");
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Privileges(format!(
            "missing {} to load eBPF programs and change network settings",
            missing.join(", ")
        )))
    }
}

/// A started host datapath. Dropping it without [`Host::stop`] leaves the journal for the next
/// start to restore.
pub struct Host {
    datapath: Datapath,
    maps: Arc<Mutex<MapSet>>,
    journal: SharedJournal,
    netlink: Netlink,
    metrics: Option<tokio::task::JoinHandle<()>>,
    /// The fabric routes' MTU (absent with `--keep-route-mtu`), and the task that keeps it
    /// lowered when routes change under the agent.
    routes: Option<(
        Arc<tokio::sync::Mutex<RouteKeeper>>,
        tokio::task::JoinHandle<()>,
    )>,
    gauges: metrics::AgentGauges,
}

impl Host {
    /// This agent's run folder (its journal and what `status` reads besides the maps).
    pub fn run_dir(&self) -> Option<PathBuf> {
        self.journal.with(|j| run_dir(&j.record.node))
    }

    /// The handle that applies a granularity set at run time (`sopa-agent granularity`,
    /// delivered by SIGHUP) to this agent's interface; the record then says the agent takes
    /// SIGHUP, which `sopa-agent granularity` requires (the caller installs the handler).
    pub fn granularity_control(&self) -> Result<granularity::Control> {
        let (ifname, index, node) = self
            .journal
            .with(|j| {
                (
                    j.record.iface.clone(),
                    j.record.ifindex,
                    j.record.node.clone(),
                )
            })
            .ok_or_else(|| Error::Config("the agent is stopping".into()))?;
        let control =
            granularity::Control::new(self.journal.clone(), ifname, index, run_dir(&node))?;
        self.journal
            .with(|j| {
                j.record.reloads_on_sighup = true;
                j.save()
            })
            .unwrap_or(Ok(()))?;
        Ok(control)
    }

    /// Validates, changes the host and attaches the programs. On any failure everything done
    /// so far is undone before the error is returned.
    pub async fn start(opts: &HostOptions) -> Result<Self> {
        validate_node(&opts.node)?;
        if opts.tcp_reordering == 0 || opts.tcp_reordering > 300 {
            return Err(Error::Config(format!(
                "--tcp-reordering {} must be from 1 to 300",
                opts.tcp_reordering
            )));
        }
        check_privileges()?;
        crate::datapath::check_kernel()?;
        // A forced choice the kernel cannot honour is refused before anything changes.
        let (tc_hook, tc_fallback) = crate::datapath::tc_hook::choose(opts.attach)?;
        crate::datapath::check_bpffs()?;
        let netlink = Netlink::connect()?;
        let link = netlink.link(&opts.iface).await?;
        let run_dir = run_dir(&opts.node);
        // Before anything changes (a crashed agent's leftovers restored included), an address
        // in use fails with nothing to undo; with --takeover, once the running agent has
        // handed over and let go of it.
        let mut metrics_listener = None;
        if let (Some(addr), false) = (opts.metrics_addr, opts.takeover) {
            metrics_listener = Some(metrics::bind(addr, &opts.metrics_access).await?);
        }
        let (previous, mut preloaded) = leftovers(opts, &run_dir, &link, &netlink).await?;
        if let (Some(addr), true) = (opts.metrics_addr, opts.takeover) {
            metrics_listener = Some(metrics::bind(addr, &opts.metrics_access).await?);
        }
        let adopted_from = previous.clone();

        let xdp_mode = match (opts.xdp, link.is_veth) {
            (XdpAttach::Generic, _) | (XdpAttach::Auto, true) => XdpMode::Skb,
            (XdpAttach::Native, _) | (XdpAttach::Auto, false) => XdpMode::Driver,
        };
        let record = Record {
            node: opts.node.clone(),
            pid: std::process::id(),
            start_time: crate::changes::process_start_time(std::process::id()),
            iface: opts.iface.clone(),
            ifindex: link.index,
            paths_file: opts.paths_file.clone(),
            granularity: opts.granularity.to_string(),
            xdp_mode: if xdp_mode == XdpMode::Skb {
                "generic"
            } else {
                "native"
            }
            .into(),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            changes: Vec::new(),
            controller: None,
            netns: opts.netns.clone(),
            kept_attached: false,
            adopted: None,
            programs: None,
            reloads_on_sighup: false,
            usid: None,
            attach: Some(tc_hook.name().into()),
            fallbacks: tc_fallback
                .into_iter()
                .map(|instead| ("tcx".to_owned(), instead))
                .collect(),
        };
        let adopting = previous.is_some();
        let journal = match previous {
            // The previous agent's changes stay in effect and in the journal: this agent now
            // owns them, and undoes them when it exits (unless it keeps the datapath too).
            Some(old) => {
                let how = if old.kept_attached {
                    "kept attached"
                } else {
                    "crashed"
                };
                let mut j = Journal::resume(&run_dir, old.clone());
                j.record = Record {
                    changes: old.changes,
                    adopted: Some(crate::changes::Adoption {
                        pid: old.pid,
                        how: how.into(),
                        stamp_prog_replaced: None,
                        strip_prog_replaced: None,
                    }),
                    ..record
                };
                j.save()?;
                j
            }
            None => Journal::create(&run_dir, record)?,
        };
        let journal = SharedJournal::new(journal);
        let gauges = metrics::AgentGauges::default();
        let mut keeper = None;
        let started = async {
            if opts.lower_route_mtu {
                let mut k = RouteKeeper::new(link.clone(), journal.clone())?;
                k.set_overhead(overhead(&opts.paths));
                k.ensure6(opts.paths.srv6.as_ref().and_then(|s| s.fabric6))
                    .await?;
                // Routes first: by the time the first packet is stamped, they fit it.
                k.ensure(opts.paths.destinations.keys()).await?;
                keeper = Some(k);
            }
            let (datapath, maps, metrics) = Self::setup(
                opts,
                &link,
                (xdp_mode, tc_hook),
                &netlink,
                &journal,
                &gauges,
                adopting,
                metrics_listener,
                preloaded.take(),
            )
            .await?;
            let routes = match keeper.take() {
                Some(k) => {
                    let k = Arc::new(tokio::sync::Mutex::new(k));
                    let watch = crate::routes::watch(Arc::clone(&k))?;
                    Some((k, watch))
                }
                None => None,
            };
            Ok::<_, Error>((datapath, maps, metrics, routes))
        };
        match started.await {
            Ok((datapath, maps, metrics, routes)) => {
                match journal.with(|j| j.record.adopted.clone()).flatten() {
                    Some(a) => info!(
                        node = %opts.node,
                        iface = %opts.iface,
                        mode = mode_name(opts.mode),
                        previous_pid = a.pid,
                        previous = %a.how,
                        "adopted the attached datapath: programs replaced in place, maps and host settings kept"
                    ),
                    None => info!(
                        node = %opts.node,
                        iface = %opts.iface,
                        mode = mode_name(opts.mode),
                        prefixes = opts.paths.len(),
                        "host datapath attached"
                    ),
                }
                Ok(Self {
                    datapath,
                    maps,
                    journal,
                    netlink,
                    metrics,
                    routes,
                    gauges,
                })
            }
            Err(err) => {
                let Some(journal) = journal.take() else {
                    return Err(err);
                };
                let undo_errors = match adopted_from {
                    // An upgrade that cannot start: only what this agent changed is undone;
                    // the datapath it was adopting stays attached as it was left, with its
                    // record, for the next agent (or `sopa-agent detach`).
                    Some(old) => {
                        warn!(
                            %err,
                            previous_pid = old.pid,
                            "could not start; the datapath this agent was adopting stays attached as it was left"
                        );
                        journal.undo_beyond(&netlink, old).await
                    }
                    None => journal.undo(&netlink).await,
                };
                for undo_err in undo_errors {
                    warn!(%undo_err, "while undoing a failed start");
                }
                Err(err)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn setup(
        opts: &HostOptions,
        link: &netlink::Link,
        (xdp_mode, tc_hook): (XdpMode, crate::datapath::tc_hook::TcHook),
        netlink: &Netlink,
        journal: &SharedJournal,
        gauges: &metrics::AgentGauges,
        adopting: bool,
        metrics_listener: Option<tokio::net::TcpListener>,
        preloaded: Option<Datapath>,
    ) -> Result<(
        Datapath,
        Arc<Mutex<MapSet>>,
        Option<tokio::task::JoinHandle<()>>,
    )> {
        let pins = pin_dir(&opts.node);
        if !journal
            .changes()
            .iter()
            .any(|c| matches!(c, Change::Pins { .. }))
        {
            journal.push(Change::Pins { dir: pins.clone() })?;
        }
        // Pinned maps of the same layout-versioned names are reused: an adopted datapath
        // keeps its paths, flow state and counters. With --takeover it was loaded (and
        // verified) before the running agent was asked to hand over.
        let mut datapath = match preloaded {
            Some(d) => d,
            None => Datapath::load(&pins)?,
        };
        // Counters an agent of an older layout left, set into ours before anything counts there.
        let carry = crate::datapath::layout::Carry::start(&pins)
            .inspect_err(|err| {
                warn!(%err, "counters of an older datapath layout could not be carried over");
            })
            .ok();
        datapath.start_logger();
        let mut maps = datapath.take_maps()?;

        let old = sysctl::read(sysctl::TCP_REORDERING)?;
        let new = opts.tcp_reordering.to_string();
        if old != new {
            journal.push(Change::Sysctl {
                key: sysctl::TCP_REORDERING.into(),
                old,
                new: new.clone(),
            })?;
            sysctl::write(sysctl::TCP_REORDERING, &new)?;
        }

        if opts.granularity.segs().is_some() {
            granularity::apply(netlink, journal, &link.name, link.index, opts.granularity).await?;
        }

        let registry = match metrics_listener {
            Some(listener) => Some((
                listener,
                metrics::registry(
                    &pins,
                    gauges.clone(),
                    &opts.node,
                    opts.certificate.as_deref(),
                )?,
            )),
            None => None,
        };

        // The configuration and the path table, last before the programs: an adopted
        // datapath's old programs read them as soon as they are written, so an upgrade that
        // fails from here on writes the previous ones back.
        let previous = if adopting {
            Some((
                maps.config()?,
                maps.paths()?,
                maps.first_path()?,
                maps.reordering_measured()?,
            ))
        } else {
            None
        };
        let hook = stamp_hook(opts, link, tc_hook, netlink, journal).await?;
        let written = (|| {
            maps.set_config(Config {
                mode: opts.mode,
                hash_seed: opts.hash_seed,
            })?;
            // A start of the agent returns new flows to the default (`sopa-agent mode
            // --first-path` changes it at run time, for comparisons).
            maps.set_first_path(sopa_common::maps::first_path::HASH)?;
            maps.set_reordering_measured(opts.measure_reordering)?;
            maps.set_meter_period(opts.meter_period.as_nanos() as u64)?;
            if !(adopting && opts.paths_from_controller) {
                maps.apply_paths(&opts.paths)?;
                maps.apply_encoding(&opts.paths)?;
            }
            guard(opts, &mut datapath, journal)?;
            // Programs last: by the time the first packet is stamped, the routes fit it.
            datapath.attach_host(&opts.iface, xdp_mode, &hook)
        })();
        let attached = match written {
            Ok(attached) => attached,
            Err(err) => {
                if let Some((config, paths, first, reordering)) = previous
                    && let Err(restore) = maps
                        .set_config(config)
                        .and_then(|()| maps.set_first_path(first))
                        .and_then(|()| maps.set_reordering_measured(reordering))
                        .and_then(|()| maps.apply_paths(&paths))
                {
                    warn!(%restore, "writing the adopted datapath's configuration back");
                }
                return Err(err);
            }
        };
        if opts.granularity.segs().is_none() {
            // An adopted datapath may have run per packet: give the interface its GSO back,
            // once this agent's programs run (nothing after this can fail the start).
            if let Err(err) =
                granularity::apply(netlink, journal, &link.name, link.index, opts.granularity).await
            {
                warn!(%err, "giving the interface its GSO back");
            }
        }
        let maps = Arc::new(Mutex::new(maps));
        let metrics = registry.map(|(listener, registry)| {
            metrics::serve(
                listener,
                registry,
                readiness(gauges.clone(), opts.paths_from_controller),
                opts.metrics_access.clone(),
            )
        });
        // Our programs run now: what the old ones counted meanwhile is carried over too.
        if let Some(carry) = carry
            && let Err(err) = carry.finish()
        {
            warn!(%err, "counters of an older datapath layout could not be carried over");
        }
        if opts.forget_runtime_mode && crate::runtime::RuntimeMode::exists(&run_dir(&opts.node)) {
            match crate::runtime::RuntimeMode::clear(&run_dir(&opts.node)) {
                Ok(()) => info!("--mode (or SOPA_MODE) replaces the mode set at run time"),
                Err(err) => warn!(%err, "forgetting the mode set at run time"),
            }
        }
        journal
            .with(|j| {
                j.record.programs = Some(crate::changes::ProgramIds {
                    stamp: attached.stamp.prog_id,
                    strip: attached.strip.prog_id,
                });
                if let Some(a) = j.record.adopted.as_mut() {
                    a.stamp_prog_replaced = attached.stamp.replaced;
                    a.strip_prog_replaced = attached.strip.replaced;
                }
                j.save()
            })
            .unwrap_or(Ok(()))?;
        Ok((datapath, maps, metrics))
    }

    /// What this host's agent does without features its kernel lacks, one `feature: instead`
    /// each (for the controller's view of the fleet).
    pub fn fallbacks(&self) -> Vec<String> {
        self.journal
            .with(|j| j.record.fallback_lines())
            .unwrap_or_default()
    }

    pub fn maps(&self) -> Arc<Mutex<MapSet>> {
        Arc::clone(&self.maps)
    }

    /// Installs `table` as the datapath's whole path table (make-before-break), first giving
    /// new fabric prefixes their lowered route MTU. Used when the controller pushes paths.
    pub async fn apply_table(&mut self, table: &PathTable) -> Result<()> {
        if let Some((keeper, _)) = &self.routes {
            let mut keeper = keeper.lock().await;
            keeper.set_overhead(overhead(table));
            keeper
                .ensure6(table.srv6.as_ref().and_then(|s| s.fabric6))
                .await?;
        }
        self.prepare_routes(table.destinations.keys()).await?;
        let mut maps = self.maps.lock().expect("maps lock");
        // Paths and their uSIDs both in place before the encoding that needs them; a stale
        // entry of either goes after.
        if table.srv6.is_some() || table.entropy.is_some() {
            maps.apply_paths(table)?;
            maps.apply_encoding(table)
        } else {
            maps.apply_encoding(table)?;
            maps.apply_paths(table)
        }
    }

    /// Rewrites the path sets of some prefixes only (each one atomically).
    pub async fn update_prefixes(&mut self, changed: &PathTable) -> Result<()> {
        self.prepare_routes(changed.destinations.keys()).await?;
        let mut maps = self.maps.lock().expect("maps lock");
        for (prefix, hops) in &changed.destinations {
            maps.set_paths(prefix, hops)?;
        }
        Ok(())
    }

    async fn prepare_routes<'a>(
        &mut self,
        prefixes: impl Iterator<Item = &'a Prefix>,
    ) -> Result<()> {
        match &self.routes {
            Some((keeper, _)) => keeper.lock().await.ensure(prefixes).await,
            None => Ok(()),
        }
    }

    /// The path meter's counts of periods and late turns, which the agent's metrics show.
    pub fn meter_stats(&self) -> Arc<crate::meter::MeterStats> {
        Arc::clone(&self.gauges.meter)
    }

    /// Records the controller channel's state where `sopa-agent status` reads it.
    pub fn set_controller_state(&mut self, state: crate::changes::ControllerState) {
        use std::sync::atomic::Ordering::Relaxed;
        self.gauges.state.store(i64::from(state.connected), Relaxed);
        self.gauges.version.store(state.version, Relaxed);
        *self.gauges.peers_down.lock().expect("peers lock") = state.peers_down.clone();
        if let Some(Err(err)) = self.journal.with(|j| j.set_controller(state)) {
            warn!(%err, "recording the controller state");
        }
    }

    /// Detaches the programs and restores every host setting the agent changed; with
    /// `keep_attached`, leaves the datapath and the settings it needs as they are, recorded for
    /// the next agent to adopt (or `sopa-agent detach` to remove).
    pub async fn stop(mut self, keep_attached: bool) -> Vec<Error> {
        if let Some(metrics) = self.metrics.take() {
            metrics.abort();
        }
        if let Some((keeper, watch)) = self.routes.take() {
            // No route change of ours after this point: a check under way finishes first
            // (it holds the keeper), then the watch ends.
            let idle = keeper.lock().await;
            watch.abort();
            let _ = watch.await;
            drop(idle);
        }
        self.datapath
            .stop(self.journal.take(), &self.netlink, keep_attached)
            .await
    }
}

/// Refuses to start beside a live agent of the same node. What a previous agent left (after a
/// crash, or attached on purpose) is adopted when it is this interface's datapath of this
/// layout, and restored otherwise (or with `--reset`). Returns the record to adopt.
/// Attaches the socket-option guard where `--guard-cgroup` says (the cgroup v2 hierarchy
/// mounted first where the host has no mount of it, journaled).
fn guard(opts: &HostOptions, datapath: &mut Datapath, journal: &SharedJournal) -> Result<()> {
    use crate::datapath::guard::{self, GuardCgroup};
    let cgroup = match &opts.guard_cgroup {
        GuardCgroup::Off => {
            warn!(
                "--guard-cgroup off: a process with CAP_NET_RAW alone can send around tc_stamp                  (PACKET_QDISC_BYPASS, AF_XDP) with hop bytes of its choosing"
            );
            return Ok(());
        }
        GuardCgroup::Path(p) => p.clone(),
        GuardCgroup::Root => match guard::cgroup2_mount() {
            Some(p) => p,
            None => {
                let dir = PathBuf::from(guard::CGROUP2_MOUNT);
                journal.push(Change::Cgroup2Mount { dir: dir.clone() })?;
                guard::mount_cgroup2(&dir)?;
                dir
            }
        },
    };
    datapath.attach_guard(&cgroup).map(drop)
}

/// What a previous agent left: its record where its datapath is adopted, and, with
/// --takeover, this agent's datapath, loaded before the running agent was asked to hand over.
async fn leftovers(
    opts: &HostOptions,
    run_dir: &Path,
    link: &netlink::Link,
    netlink: &Netlink,
) -> Result<(Option<Record>, Option<Datapath>)> {
    let pins = pin_dir(&opts.node);
    if !opts.reset {
        crate::datapath::layout::check(&pins)?;
    }
    let Some(record) = Journal::read(run_dir)? else {
        if opts.reset && pins.exists() {
            warn!(dir = %pins.display(), "--reset: removing the pins left without an agent record");
            std::fs::remove_dir_all(&pins)
                .map_err(|e| Error::io(format!("removing {}", pins.display()), e))?;
            return Ok((None, None));
        }
        if pins.join(crate::datapath::STAMP_LINK_PIN).exists() {
            // Pins without a journal: nothing says what the host looked like before.
            warn!(dir = %pins.display(), "pins without an agent record; removing them");
            std::fs::remove_dir_all(&pins)
                .map_err(|e| Error::io(format!("removing {}", pins.display()), e))?;
        }
        return Ok((None, None));
    };
    if record.namespace(opts.netns.as_deref())? == crate::changes::RecordNamespace::Gone {
        warn!(
            pid = record.pid,
            netns = ?record.netns,
            "the previous agent's network namespace is gone, and with it what it changed; removing its pins and record"
        );
        forget(&pins, run_dir)?;
        return Ok((None, None));
    }
    let (record, mut preloaded) = if record.pid != std::process::id() && record.is_live() {
        if !opts.takeover {
            return Err(Error::AlreadyRunning {
                node: opts.node.clone(),
                pid: record.pid,
            });
        }
        // Everything that can fail without touching the running agent first: the programs
        // through the verifier, the pinned maps reused by name.
        let loaded = preload(&pins, record.pid)?;
        (hand_over(&opts.node, run_dir, &record).await?, Some(loaded))
    } else {
        (record, None)
    };
    // tc_stamp behind its pinned TCX link, or as our filter (the kernel still lists it).
    let stamp_attached = if pins.join(crate::datapath::STAMP_LINK_PIN).exists() {
        true
    } else if let Some(f) = record.changes.iter().find_map(|c| match c {
        Change::TcFilter { filter } if filter.index == link.index && !filter.ingress => {
            Some(filter)
        }
        _ => None,
    }) {
        pins.join(crate::datapath::STAMP_PROG_PIN).exists()
            && netlink
                .tc_filters(link.index)
                .await?
                .iter()
                .any(|k| !k.ingress && k.priority == f.priority && k.handle == f.handle)
    } else {
        false
    };
    let attached = stamp_attached && pins.join(crate::datapath::STRIP_LINK_PIN).exists();
    let same_iface = record.iface == opts.iface && record.ifindex == link.index;
    if attached && same_iface && !opts.reset {
        return Ok((Some(record), preloaded));
    }
    // Restored instead of adopted: its pins go, and this agent loads anew.
    preloaded.take();
    let why = if opts.reset {
        "--reset"
    } else if !attached {
        "its programs are no longer attached"
    } else {
        "it ran on another interface"
    };
    warn!(
        pid = record.pid,
        changes = record.changes.len(),
        reason = why,
        "the previous agent of this node left state behind; restoring what it changed"
    );
    let errors = Journal::resume(run_dir, record).undo(netlink).await;
    match errors.into_iter().next() {
        Some(err) => Err(err),
        None => Ok(()),
    }?;
    if opts.reset && pins.exists() {
        // Whatever is left there (maps of another layout included) goes too.
        std::fs::remove_dir_all(&pins)
            .map_err(|e| Error::io(format!("removing {}", pins.display()), e))?;
    }
    Ok((None, None))
}

/// Loads this agent's datapath beside the running agent `pid`'s, attaching nothing and writing
/// no map: a failure leaves that agent running as it was (the pins this load created, maps of
/// a newer layout, are removed again).
fn preload(pins: &Path, pid: u32) -> Result<Datapath> {
    let before = pin_names(pins);
    Datapath::load(pins).map_err(|err| {
        for name in pin_names(pins).difference(&before) {
            let _ = std::fs::remove_file(pins.join(name));
        }
        Error::TakeoverRefused {
            pid,
            source: Box::new(err),
        }
    })
}

fn pin_names(dir: &Path) -> std::collections::BTreeSet<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes a node's pins and record, undoing nothing (what they describe is gone).
pub(crate) fn forget(pins: &Path, run_dir: &Path) -> Result<()> {
    for dir in [pins, run_dir] {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(format!("removing {}", dir.display()), e));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Asks the live agent `pid` to exit leaving its datapath attached (SIGUSR1), waits for it,
/// and returns the record it left.
async fn hand_over(node: &str, run_dir: &Path, live: &Record) -> Result<Record> {
    let pid = live.pid;
    info!(
        pid,
        "--takeover: asking the running agent to hand its datapath over"
    );
    crate::changes::signal_agent(live, libc::SIGUSR1)
        .map_err(|e| Error::io(format!("signalling agent {pid} of node {node}"), e))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        // Liveness first, then the record: a record read after the agent was seen gone is the
        // one it left. (Judged the other way round, an agent that marked its record and exited
        // between the read and the check looked as if it had crashed.)
        let running = live.is_live();
        let record = Journal::read(run_dir)?;
        match record {
            Some(r) if r.pid == pid && running => {}
            Some(r) if r.kept_attached => return Ok(r),
            Some(r) if r.pid == pid => {
                // It ended some other way (its teardown failed, or it was killed): what it
                // left is adopted or restored as after a crash, as any start would.
                warn!(
                    pid,
                    "the running agent exited without marking its datapath handed over; taking what it left as after a crash"
                );
                return Ok(r);
            }
            Some(r) => {
                return Err(Error::Config(format!(
                    "agent {pid} of node {node} exited and agent {} now holds the node; stop it first or start with --takeover again",
                    r.pid
                )));
            }
            None => {
                return Err(Error::Config(format!(
                    "agent {pid} of node {node} detached its datapath instead of handing it over"
                )));
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Config(format!(
                "agent {pid} of node {node} did not hand over within 20 s"
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Where `tc_stamp` goes on `link` (see `tc_hook::place`), recorded in `journal`.
async fn stamp_hook(
    opts: &HostOptions,
    link: &netlink::Link,
    tc_hook: crate::datapath::tc_hook::TcHook,
    netlink: &Netlink,
    journal: &SharedJournal,
) -> Result<crate::datapath::Hook> {
    let tcx_pinned = pin_dir(&opts.node)
        .join(crate::datapath::STAMP_LINK_PIN)
        .exists();
    let seen = crate::datapath::tc_hook::look(netlink, link.index).await?;
    crate::datapath::tc_hook::place(
        tc_hook,
        opts.tcx_order,
        (&link.name, link.index, false),
        tcx_pinned,
        &seen,
        &journal.changes(),
        &mut |c| journal.push(c),
        &mut |gone| journal.forget(|c| c == gone),
    )
}
