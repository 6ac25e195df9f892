//! The embedded eBPF object: loading it with pinned maps, attaching its programs, and detaching
//! exactly what was attached.

pub mod grace;
pub mod guard;
pub mod host_config;
pub mod labels;
pub mod layout;
pub mod lookup;
pub mod maps;
pub mod meter_maps;
mod syscall;
pub mod tc_hook;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        tc::{SchedClassifierLink, TcAttachOptions},
        xdp::XdpLink,
    },
};
use tracing::warn;

use self::guard::{GUARD_LINK_PIN, GUARD_PROGRAM};
pub use self::maps::MapSet;
use crate::error::{Error, Result};

/// The eBPF object built by aya-build from `sopa-ebpf`.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/sopa"));

pub const STAMP_PROGRAM: &str = "tc_stamp";
pub const STRIP_PROGRAM: &str = "xdp_strip";
pub const FORWARD_PROGRAM: &str = "tc_forward";

/// `BPF_FS_MAGIC` from linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Fails unless bpffs is mounted at /sys/fs/bpf.
pub fn check_bpffs() -> Result<()> {
    let path = c"/sys/fs/bpf";
    // SAFETY: statfs on a NUL-terminated path into a zeroed struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::statfs(path.as_ptr(), &mut st) } == 0;
    if ok && st.f_type as i64 == BPF_FS_MAGIC {
        Ok(())
    } else {
        Err(Error::NoBpffs)
    }
}

/// The oldest kernel the agent runs on. Its programs use `bpf_check_mtu` (Linux 5.12), the
/// encapsulation flags of `bpf_skb_adjust_room` (5.2), `bpf_redirect_neigh` (5.10), XDP links
/// (5.9) and fetching atomics (5.12); below 6.6 its TC programs attach as cls_bpf filters
/// instead of TCX links (`tc_hook`). 5.15 is the oldest long-term kernel above all of them.
pub const MIN_KERNEL: (u8, u8) = (5, 15);

/// Fails, naming the running kernel, when it is older than [`MIN_KERNEL`].
pub fn check_kernel() -> Result<()> {
    require_min(crate::probe::kernel_version()?)
}

fn require_min(v: aya::util::KernelVersion) -> Result<()> {
    let (major, minor) = MIN_KERNEL;
    if v >= aya::util::KernelVersion::new(major, minor, 0) {
        return Ok(());
    }
    Err(Error::Kernel(format!(
        "Linux {v} is too old: the datapath's programs need Linux {major}.{minor} or newer \
         (bpf_check_mtu, the encapsulation flags of bpf_skb_adjust_room, XDP links); upgrade \
         the kernel (`sopa-agent doctor` shows what it has)"
    )))
}

/// Where our TC programs go in a device's TCX chain, relative to other tools' programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TcxOrder {
    /// Before every program attached so far.
    First,
    /// After every program attached so far: others see packets as the stack sent them.
    #[default]
    Last,
}

impl TcxOrder {
    fn options(self) -> TcAttachOptions {
        TcAttachOptions::TcxOrder(match self {
            Self::First => LinkOrder::first(),
            Self::Last => LinkOrder::last(),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::First => "first",
            Self::Last => "last",
        }
    }
}

/// The loaded programs and their maps, pinned under one folder.
pub struct Datapath {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    /// The host role's attached links (pinned; their fds close with this struct).
    links: Vec<FdLink>,
    /// The cls_bpf filters attached (a kernel without TCX): removed by [`Datapath::detach`],
    /// left to the kernel otherwise.
    filters: Vec<tc_hook::Filter>,
}

/// Where a TC program goes: a TCX link in its place in the chain, or a cls_bpf filter of ours
/// (`replaces`: the filter there is an adopted datapath's, running that program, which this
/// one replaces in place).
#[derive(Clone, Debug)]
pub enum Hook {
    Tcx(TcxOrder),
    Filter {
        filter: tc_hook::Filter,
        replaces: Option<u32>,
    },
}

/// Every map of this datapath layout, as pinned: a `SOPA_*` pin not in this list belongs to
/// another layout (see [`layout`]).
pub const MAP_NAMES: [&str; 30] = {
    use sopa_common::maps::*;
    [
        CONFIG_MAP,
        START_MAP,
        MEASURE_MAP,
        PATHS_MAP,
        PATHS_EXACT_MAP,
        HOST_MAP,
        HOST_INDEX_MAP,
        SRV6_DESTS_MAP,
        SRV6_DESTS_EXACT_MAP,
        SRV6_SEGS_MAP,
        EV_MAP,
        FLOWS_MAP,
        PINS_MAP,
        REORDER_MAP,
        STAMP_STATS_MAP,
        GUARD_STATS_MAP,
        HOP_STATS_MAP,
        STRIP_STATS_MAP,
        FWD_MAP,
        FWD_STATS_MAP,
        FWD_UPLINK_STATS_MAP,
        TRUST_MAP,
        usid_repair::CONFIG_MAP,
        usid_repair::RULES_MAP,
        meter::SENT_MAPS[0],
        meter::SENT_MAPS[1],
        meter::RECEIVED_MAPS[0],
        meter::RECEIVED_MAPS[1],
        meter::COLOR_MAP,
        meter::PEERS_MAP,
    ]
};

/// Where the host programs' links are pinned, inside the node's pin folder.
pub const STAMP_LINK_PIN: &str = "link_stamp";
pub const STRIP_LINK_PIN: &str = "link_strip";
/// Where a TC program attached as a cls_bpf filter is pinned (the filter holds the program;
/// the pin tells which one it is).
pub const STAMP_PROG_PIN: &str = "prog_stamp";
pub const FORWARD_PROG_PIN: &str = "prog_fwd";

/// One program's attachment: the program's id, and the id of the program it replaced when the
/// link was adopted from a previous agent.
#[derive(Clone, Copy, Debug)]
pub struct LinkState {
    pub prog_id: u32,
    pub replaced: Option<u32>,
}

#[derive(Clone, Copy, Debug)]
pub struct Attached {
    pub stamp: LinkState,
    pub strip: LinkState,
}

impl Attached {
    pub fn adopted(&self) -> bool {
        self.stamp.replaced.is_some() || self.strip.replaced.is_some()
    }
}

fn link_err<E: std::fmt::Display>(pin: &Path) -> impl Fn(E) -> Error + '_ {
    move |e| {
        Error::io(
            format!("the pinned link {}", pin.display()),
            std::io::Error::other(e.to_string()),
        )
    }
}

/// The link a previous agent pinned at `pin`, with the id of the program it runs; `None` when
/// nothing is pinned there.
/// The OS error code somewhere in `err`'s chain of sources.
fn os_error(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(code) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.raw_os_error())
        {
            return Some(code);
        }
        cur = e.source();
    }
    None
}

fn adopt_link(pin: &Path) -> Result<Option<(FdLink, u32)>> {
    if !pin.exists() {
        return Ok(None);
    }
    let fd = FdLink::from(PinnedLink::from_pin(pin).map_err(link_err(pin))?);
    let replaced = fd.info().map_err(link_err(pin))?.program_id();
    Ok(Some((fd, replaced)))
}

/// The program ids behind the host links pinned in `pin_dir` (stamp, strip), for status; a
/// `tc_stamp` attached as a filter by the program pinned beside it.
pub fn pinned_program_ids(pin_dir: &Path) -> (Option<u32>, Option<u32>) {
    let id = |name: &str| {
        let link = PinnedLink::from_pin(pin_dir.join(name)).ok()?;
        FdLink::from(link).info().ok().map(|i| i.program_id())
    };
    (
        id(STAMP_LINK_PIN).or_else(|| pinned_program_id(&pin_dir.join(STAMP_PROG_PIN))),
        id(STRIP_LINK_PIN),
    )
}

/// The id of the program pinned at `pin`.
pub fn pinned_program_id(pin: &Path) -> Option<u32> {
    SchedClassifier::from_pin(pin)
        .ok()?
        .info()
        .ok()
        .map(|i| i.id())
}

/// Pins `program` at `pin`, in place of what was pinned there.
fn repin(program: &mut SchedClassifier, pin: &Path) -> Result<()> {
    match std::fs::remove_file(pin) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            return Err(Error::io(format!("unpinning {}", pin.display()), err));
        }
        _ => {}
    }
    program.pin(pin).map_err(|e| {
        Error::io(
            format!("pinning {}", pin.display()),
            std::io::Error::other(e.to_string()),
        )
    })
}

impl Datapath {
    /// Loads the object, creating (or reusing, when their layout-versioned names match) the maps
    /// pinned in `pin_dir`, and loads both programs into the kernel without attaching them.
    pub fn load(pin_dir: &Path) -> Result<Self> {
        Self::load_programs(
            pin_dir,
            &[STAMP_PROGRAM, STRIP_PROGRAM, GUARD_PROGRAM],
            None,
        )
    }

    /// Like [`Datapath::load`] with a flow table of `capacity` entries instead of
    /// [`sopa_common::maps::FLOWS_CAPACITY`] (fixtures that fill it).
    pub fn load_with_flow_capacity(pin_dir: &Path, capacity: u32) -> Result<Self> {
        Self::load_programs(
            pin_dir,
            &[STAMP_PROGRAM, STRIP_PROGRAM, GUARD_PROGRAM],
            Some(capacity),
        )
    }

    /// Loads every program of both roles into the kernel (the verifier passes them or says
    /// why not), with the maps pinned in `pin_dir`, and lets them go: what `sopa-agent doctor`
    /// asks of this kernel.
    pub fn verify_all(pin_dir: &Path) -> Result<()> {
        Self::load_programs(
            pin_dir,
            &[STAMP_PROGRAM, STRIP_PROGRAM, GUARD_PROGRAM, FORWARD_PROGRAM],
            None,
        )
        .map(drop)
    }

    /// The switch role's datapath: `tc_forward` only.
    pub fn load_switch(pin_dir: &Path) -> Result<Self> {
        Self::load_programs(pin_dir, &[FORWARD_PROGRAM], None)
    }

    fn load_programs(
        pin_dir: &Path,
        programs: &[&'static str],
        flow_capacity: Option<u32>,
    ) -> Result<Self> {
        check_bpffs()?;
        if OBJECT.is_empty() {
            return Err(Error::Config(
                "this sopa-agent was built without its eBPF programs (the nightly's rust-src or \
                 bpf-linker was missing): run `cargo xtask setup`, then build it again"
                    .to_owned(),
            ));
        }
        std::fs::create_dir_all(pin_dir)
            .map_err(|err| Error::io(format!("creating {}", pin_dir.display()), err))?;
        let mut loader = EbpfLoader::new();
        loader.default_map_pin_directory(pin_dir);
        if let Some(capacity) = flow_capacity {
            loader.map_max_entries(sopa_common::maps::FLOWS_MAP, capacity);
        }
        let mut ebpf = loader.load(OBJECT).map_err(|err| match &err {
            aya::EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. })
                if io_error.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                Error::Privileges(format!("creating eBPF maps: {io_error}"))
            }
            _ => Error::Ebpf(Box::new(err)),
        })?;
        for &name in programs {
            let program = ebpf
                .program_mut(name)
                .expect("the object defines every program");
            let result = match name {
                STRIP_PROGRAM => <&mut Xdp>::try_from(program).and_then(|p| p.load()),
                GUARD_PROGRAM => {
                    <&mut aya::programs::CgroupSockopt>::try_from(program).and_then(|p| p.load())
                }
                _ => <&mut SchedClassifier>::try_from(program).and_then(|p| p.load()),
            };
            result.map_err(Error::program(name))?;
        }
        Ok(Self {
            ebpf,
            pin_dir: pin_dir.to_owned(),
            links: Vec::new(),
            filters: Vec::new(),
        })
    }

    /// Attaches `name` (a TC program) as the cls_bpf filter `filter`, or replaces the program
    /// of the filter already there (`replaces` names it), and pins the program at `prog_pin`
    /// (status reads which program our filters run there).
    fn attach_filter(
        &mut self,
        name: &'static str,
        filter: &tc_hook::Filter,
        replaces: Option<u32>,
        prog_pin: &Path,
    ) -> Result<()> {
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(name)
            .expect("the object defines every program")
            .try_into()
            .map_err(Error::program(name))?;
        tc_hook::attach(filter, program, replaces.is_some()).map_err(|err| {
            if tc_hook::is_taken(&err) {
                Error::Config(format!(
                    "{} of {} has a filter at priority {} handle {:#x} that is not ours; remove it \
                     or start with --tcx-order first",
                    if filter.ingress { "ingress" } else { "egress" },
                    filter.ifname,
                    filter.priority,
                    filter.handle
                ))
            } else {
                Error::program(name)(err)
            }
        })?;
        self.filters.push(filter.clone());
        repin(program, prog_pin)
    }
    /// Attaches `tc_forward` to `iface`'s ingress the way `hook` says; returns the id of the
    /// program it replaced in place (an adopted datapath's).
    pub fn attach_forward(&mut self, iface: &str, hook: &Hook) -> Result<Option<u32>> {
        match hook {
            Hook::Tcx(order) => self.attach_forward_pinned(iface, *order),
            Hook::Filter { filter, replaces } => {
                let pin = self.pin_dir.join(FORWARD_PROG_PIN);
                self.attach_filter(FORWARD_PROGRAM, filter, *replaces, &pin)?;
                Ok(*replaces)
            }
        }
    }

    /// Attaches `tc_forward` to `iface`'s TCX ingress, its link pinned as `link_fwd_<iface>`
    /// in the pin folder, so forwarding outlives this process (a crash, `--keep-attached`, an
    /// upgrade). A link a previous run pinned is adopted: this process's program replaces
    /// the old one in it atomically (`bpf_link_update`), so the port never goes without a
    /// program and an upgrade runs the new code. A pinned link whose interface is gone (the
    /// port was recreated) is unpinned and the program attached anew. Returns the program id
    /// the adopted link held.
    fn attach_forward_pinned(&mut self, iface: &str, order: TcxOrder) -> Result<Option<u32>> {
        let pin = self
            .pin_dir
            .join(format!("link_fwd_{}", iface.replace('.', ":")));
        let name = FORWARD_PROGRAM;
        if let Some((fd, replaced)) = adopt_link(&pin)? {
            let link = SchedClassifierLink::try_from(fd).map_err(link_err(&pin))?;
            let program = self.forward_program();
            match program.attach_to_link(link) {
                Ok(id) => {
                    let link = program.take_link(id).map_err(Error::program(name))?;
                    let fd: FdLink = link.try_into().map_err(link_err(&pin))?;
                    self.links.push(fd);
                    return Ok(Some(replaced));
                }
                // ENOLINK: the link's interface is gone (the port was recreated under the same
                // name). Any other error leaves the working link as it is.
                Err(err) if os_error(&err) == Some(libc::ENOLINK) => {
                    tracing::warn!(port = iface, %err, "the pinned forwarding link is of an interface that is gone; attaching anew");
                    std::fs::remove_file(&pin)
                        .map_err(|e| Error::io(format!("unpinning {}", pin.display()), e))?;
                }
                Err(err) => return Err(Error::program(name)(err)),
            }
        }
        let program = self.forward_program();
        let id = program
            .attach_with_options(iface, TcAttachType::Ingress, order.options())
            .map_err(Error::program(name))?;
        let link = program.take_link(id).map_err(Error::program(name))?;
        let fd: FdLink = link.try_into().map_err(link_err(&pin))?;
        self.keep_link(fd, &pin, false)?;
        Ok(None)
    }

    /// The program ids behind the forwarding links pinned in `pin_dir`, by port.
    pub fn pinned_forward_program_ids(pin_dir: &Path) -> BTreeMap<String, u32> {
        let Ok(entries) = std::fs::read_dir(pin_dir) else {
            return BTreeMap::new();
        };
        entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let port = name.strip_prefix("link_fwd_")?.replace(':', ".");
                let link = PinnedLink::from_pin(e.path()).ok()?;
                let id = FdLink::from(link).info().ok()?.program_id();
                Some((port, id))
            })
            .collect()
    }

    /// The forward program, for attaching and BPF_PROG_TEST_RUN.
    pub fn forward_program(&mut self) -> &mut SchedClassifier {
        self.ebpf
            .program_mut(FORWARD_PROGRAM)
            .expect("defined")
            .try_into()
            .expect("tc_forward is a classifier")
    }

    /// The switch role's maps, taken out of the object.
    pub fn take_forward_maps(&mut self) -> Result<maps::ForwardMaps> {
        maps::ForwardMaps::from_ebpf(&mut self.ebpf)
    }

    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Forwards the programs' aya-log lines to tracing.
    pub fn start_logger(&mut self) {
        match aya_log::EbpfLogger::init(&mut self.ebpf) {
            Ok(logger) => {
                // The logger reads the ring buffer from a tokio task.
                tokio::spawn(async move {
                    // SAFETY: the logger owns its ring buffer fd for as long as the AsyncFd
                    // holds the logger.
                    let mut logger = match unsafe {
                        tokio::io::unix::AsyncFd::register_with_interest(
                            logger,
                            tokio::io::Interest::READABLE,
                        )
                    } {
                        Ok(logger) => logger,
                        Err(err) => {
                            warn!(%err, "eBPF log forwarding unavailable");
                            return;
                        }
                    };
                    loop {
                        let mut guard = match logger.readable_mut().await {
                            Ok(guard) => guard,
                            Err(_) => return,
                        };
                        guard.get_inner_mut().flush();
                        guard.clear_ready();
                    }
                });
            }
            Err(err) => warn!(%err, "eBPF log forwarding unavailable"),
        }
    }

    /// The maps, taken out of the object (the programs keep using them).
    pub fn take_maps(&mut self) -> Result<MapSet> {
        MapSet::from_ebpf(&mut self.ebpf)
    }

    /// Attaches `tc_stamp` (TCX egress) and `xdp_strip` to `iface` through links pinned in the
    /// pin folder, so the datapath outlives this process (a crash, `--keep-attached`, an
    /// upgrade). Links a previous agent pinned are adopted: this process's programs replace
    /// theirs atomically (`bpf_link_update`), with no moment without a program. Strip first,
    /// so by the time anything is stamped the peer-facing side strips.
    /// `order` places a new `tc_stamp` link in the egress chain; an adopted one keeps its place.
    pub fn attach_host(&mut self, iface: &str, xdp_mode: XdpMode, hook: &Hook) -> Result<Attached> {
        let strip = self.attach_strip_pinned(iface, xdp_mode)?;
        let stamp = match hook {
            Hook::Tcx(order) => self.attach_stamp_pinned(iface, *order)?,
            Hook::Filter { filter, replaces } => {
                let pin = self.pin_dir.join(STAMP_PROG_PIN);
                self.attach_filter(STAMP_PROGRAM, filter, *replaces, &pin)?;
                let prog_id = pinned_program_id(&pin).unwrap_or_default();
                LinkState {
                    prog_id,
                    replaced: *replaces,
                }
            }
        };
        Ok(Attached { stamp, strip })
    }

    fn attach_stamp_pinned(&mut self, iface: &str, order: TcxOrder) -> Result<LinkState> {
        let name = STAMP_PROGRAM;
        let pin = self.pin_dir.join(STAMP_LINK_PIN);
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(name)
            .expect("the object defines tc_stamp")
            .try_into()
            .map_err(Error::program(name))?;
        let prog_id = program.info().map_err(Error::program(name))?.id();
        let (link, replaced) = if let Some((fd, replaced)) = adopt_link(&pin)? {
            let link = SchedClassifierLink::try_from(fd).map_err(link_err(&pin))?;
            let id = program.attach_to_link(link).map_err(Error::program(name))?;
            (
                program.take_link(id).map_err(Error::program(name))?,
                Some(replaced),
            )
        } else {
            let id = program
                .attach_with_options(iface, TcAttachType::Egress, order.options())
                .map_err(Error::program(name))?;
            (program.take_link(id).map_err(Error::program(name))?, None)
        };
        let fd: FdLink = link.try_into().map_err(link_err(&pin))?;
        self.keep_link(fd, &pin, replaced.is_some())?;
        Ok(LinkState { prog_id, replaced })
    }

    fn attach_strip_pinned(&mut self, iface: &str, mode: XdpMode) -> Result<LinkState> {
        let name = STRIP_PROGRAM;
        let pin = self.pin_dir.join(STRIP_LINK_PIN);
        let program: &mut Xdp = self
            .ebpf
            .program_mut(name)
            .expect("the object defines xdp_strip")
            .try_into()
            .map_err(Error::program(name))?;
        let prog_id = program.info().map_err(Error::program(name))?.id();
        let (link, replaced) = if let Some((fd, replaced)) = adopt_link(&pin)? {
            let link = XdpLink::try_from(fd).map_err(link_err(&pin))?;
            let id = program.attach_to_link(link).map_err(Error::program(name))?;
            (
                program.take_link(id).map_err(Error::program(name))?,
                Some(replaced),
            )
        } else {
            let id = program.attach(iface, mode).map_err(Error::program(name))?;
            (program.take_link(id).map_err(Error::program(name))?, None)
        };
        let fd: FdLink = link.try_into().map_err(link_err(&pin))?;
        self.keep_link(fd, &pin, replaced.is_some())?;
        Ok(LinkState { prog_id, replaced })
    }

    /// Pins a new link (an adopted one is pinned already) and keeps its fd.
    fn keep_link(&mut self, fd: FdLink, pin: &Path, adopted: bool) -> Result<()> {
        if adopted {
            self.links.push(fd);
            return Ok(());
        }
        let pinned = fd.pin(pin).map_err(|e| {
            Error::io(
                format!("pinning {}", pin.display()),
                std::io::Error::other(e.to_string()),
            )
        })?;
        self.links.push(FdLink::from(pinned));
        Ok(())
    }

    /// Detaches the programs: removes the link pins and closes the links.
    /// A role's stop: with `keep_attached`, leaves everything in place and records it for the
    /// next agent (or `sopa-agent detach`); otherwise detaches and undoes the journal.
    pub async fn stop(
        &mut self,
        journal: Option<crate::changes::Journal>,
        netlink: &crate::netlink::Netlink,
        keep_attached: bool,
    ) -> Vec<Error> {
        if keep_attached {
            self.keep_attached();
            return journal
                .and_then(|j| j.leave_attached().err())
                .into_iter()
                .collect();
        }
        let mut errors = self.detach();
        if let Some(journal) = journal {
            errors.extend(journal.undo(netlink).await);
        }
        errors
    }

    pub fn detach(&mut self) -> Vec<Error> {
        let mut errors = Vec::new();
        for filter in std::mem::take(&mut self.filters) {
            if let Err(err) = tc_hook::detach(&filter) {
                errors.push(err);
            }
        }
        for name in [
            STAMP_LINK_PIN,
            STRIP_LINK_PIN,
            STAMP_PROG_PIN,
            GUARD_LINK_PIN,
        ] {
            let pin = self.pin_dir.join(name);
            if let Err(err) = std::fs::remove_file(&pin)
                && err.kind() != std::io::ErrorKind::NotFound
            {
                errors.push(Error::io(format!("unpinning {}", pin.display()), err));
            }
        }
        // Closing the last fd of an unpinned link detaches its program.
        self.links.clear();
        errors
    }

    /// Leaves the programs attached after this process: only the fds close, the pins hold
    /// (and the filters, which the kernel keeps).
    pub fn keep_attached(&mut self) {
        self.links.clear();
        self.filters.clear();
    }

    /// The stamp program, for BPF_PROG_TEST_RUN.
    pub fn stamp_program(&mut self) -> &mut SchedClassifier {
        self.ebpf
            .program_mut(STAMP_PROGRAM)
            .expect("defined")
            .try_into()
            .expect("tc_stamp is a classifier")
    }

    /// The strip program, for BPF_PROG_TEST_RUN.
    pub fn strip_program(&mut self) -> &mut Xdp {
        self.ebpf
            .program_mut(STRIP_PROGRAM)
            .expect("defined")
            .try_into()
            .expect("xdp_strip is an XDP program")
    }
}

#[cfg(test)]
mod tests {
    use aya::util::KernelVersion;

    use super::*;

    #[test]
    fn a_link_update_on_a_gone_interface_is_told_from_other_failures() {
        let failed = |code| {
            aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
                call: "bpf_link_update",
                io_error: std::io::Error::from_raw_os_error(code),
            })
        };
        assert_eq!(os_error(&failed(libc::ENOLINK)), Some(libc::ENOLINK));
        assert_eq!(os_error(&failed(libc::EINVAL)), Some(libc::EINVAL));
        let other = aya::programs::ProgramError::NotLoaded;
        assert_eq!(os_error(&other), None);
    }

    #[test]
    fn kernels_below_the_floor_are_refused_by_version() {
        for (v, ok) in [
            (KernelVersion::new(5, 10, 200), false),
            (KernelVersion::new(5, 14, 0), false),
            (KernelVersion::new(5, 15, 160), true),
            (KernelVersion::new(6, 1, 0), true),
            (KernelVersion::new(6, 18, 2), true),
        ] {
            let got = require_min(v);
            assert_eq!(got.is_ok(), ok, "{v}: {got:?}");
            if let Err(e) = got {
                assert_eq!(e.exit_code(), sopa_ops::exit::KERNEL);
                let text = e.to_string();
                assert!(
                    text.contains(&v.to_string()) && text.contains("5.15"),
                    "{text}"
                );
            }
        }
    }
}
