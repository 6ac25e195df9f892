//! Starting the host role: the journal, the host settings, the maps written and the programs
//! attached, and everything undone when a step fails.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use aya::programs::XdpMode;
use sopa_common::maps::Config;
use tracing::{info, warn};

use crate::{
    changes::{Change, Journal, Record, SharedJournal},
    datapath::{Datapath, MapSet},
    error::{Error, Result},
    granularity, metrics,
    netlink::{self, Netlink},
    routes::RouteKeeper,
    status::mode_name,
    sysctl,
};

use super::{
    Host, HostOptions, XdpAttach, check_privileges, leftovers::leftovers, overhead, pin_dir,
    run_dir, validate_node,
};

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

impl Host {
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
}

/// Attaches the socket-option guard where `--guard-cgroup` says (the cgroup v2 hierarchy
/// mounted first where the host has no mount of it, journaled).
fn guard(opts: &HostOptions, datapath: &mut Datapath, journal: &SharedJournal) -> Result<()> {
    use crate::datapath::guard::{self, GuardCgroup};
    let cgroup = match &opts.guard_cgroup {
        GuardCgroup::Off => {
            warn!(
                "--guard-cgroup off: a process with CAP_NET_RAW alone can send around tc_stamp (PACKET_QDISC_BYPASS, AF_XDP) with hop bytes of its choosing"
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
