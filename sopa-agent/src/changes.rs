//! The journal of what a running agent changed on its host, persisted before every change
//! (write-ahead) so that a clean exit, a failed start and the next start after a crash can all
//! undo it exactly, restoring only what still holds the value the agent set.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    error::{Error, Result},
    netlink::{Netlink, Route},
    sysctl,
};

/// One change to the host, with what is needed to undo it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Change {
    /// Maps pinned under `dir` (undo: unpin them).
    Pins {
        dir: PathBuf,
    },
    Sysctl {
        key: String,
        old: String,
        new: String,
    },
    GsoMaxSegs {
        ifname: String,
        index: u32,
        old: u32,
        new: u32,
        /// The value the agent had set before `new` (a granularity changed at run time): the
        /// record is written before the interface changes, so an agent that stopped between
        /// the two left the interface at this value, which is ours too.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before: Option<u32>,
    },
    RouteAdded {
        route: Route,
    },
    RouteReplaced {
        old: Route,
        new: Route,
    },
    /// An IPv6 route a switch installed (SRv6 encoding; undo: remove it).
    Route6Added {
        route: crate::netlink::Route6,
    },
    /// A clsact qdisc the agent added for its filters (a kernel without TCX; undo: remove it,
    /// once no filter but the agent's own is under it).
    Clsact {
        ifname: String,
        index: u32,
    },
    /// A cls_bpf filter of the agent's (undo: remove it).
    TcFilter {
        filter: crate::netlink::tc::Filter,
    },
    /// The cgroup v2 hierarchy, mounted for the socket-option guard on a host that has no
    /// mount of it (undo: unmount it; the guard's pinned link holds the cgroup itself).
    Cgroup2Mount {
        dir: PathBuf,
    },
}

impl Record {
    /// What the agent does without features its kernel lacks, one `feature: instead` each
    /// (for the controller's view of the fleet).
    pub fn fallback_lines(&self) -> Vec<String> {
        self.fallbacks
            .iter()
            .map(|(f, instead)| format!("{f}: {instead}"))
            .collect()
    }
}

/// What a running agent records about itself.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub node: String,
    pub pid: u32,
    /// The process's start time (clock ticks since boot, `/proc/PID/stat`): with the PID it
    /// names one process, even after the PID is reused. Absent in records of older agents.
    #[serde(default)]
    pub start_time: Option<u64>,
    pub iface: String,
    pub ifindex: u32,
    pub paths_file: Option<PathBuf>,
    pub granularity: String,
    pub xdp_mode: String,
    pub started_unix: u64,
    pub changes: Vec<Change>,
    /// Set when the paths come from a controller.
    #[serde(default)]
    pub controller: Option<ControllerState>,
    /// The network namespace the agent ran in (`--netns`), for `sopa-agent detach`.
    #[serde(default)]
    pub netns: Option<String>,
    /// The agent exited leaving the datapath attached (`--keep-attached`); the next agent
    /// adopts it, `sopa-agent detach` removes it.
    #[serde(default)]
    pub kept_attached: bool,
    /// The agent that left the datapath this one adopted, and how it ended.
    #[serde(default)]
    pub adopted: Option<Adoption>,
    /// The programs attached now.
    #[serde(default)]
    pub programs: Option<ProgramIds>,
    /// The agent applies a run-time granularity on SIGHUP (absent in records of older agents,
    /// for which SIGHUP's default action would end them).
    #[serde(default)]
    pub reloads_on_sighup: bool,
    /// Switch role, SRv6: who consumes the switch's own uSID, `kernel` (its `seg6local` End
    /// route) or `ebpf` (`tc_forward`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usid: Option<String>,
    /// How the TC programs attach: `tcx` (links) or `tc` (cls_bpf filters); absent in records
    /// of agents before the choice, which attached with TCX.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attach: Option<String>,
    /// Features this kernel lacks and what the agent does instead (feature -> instead).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fallbacks: BTreeMap<String, String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adoption {
    pub pid: u32,
    /// "kept attached" (a clean exit with --keep-attached) or "crashed".
    pub how: String,
    pub stamp_prog_replaced: Option<u32>,
    pub strip_prog_replaced: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramIds {
    pub stamp: u32,
    pub strip: u32,
}

/// The push channel as the agent last saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerState {
    pub endpoint: String,
    pub connected: bool,
    pub epoch: u64,
    pub version: u64,
    /// Unix time of the last connect or disconnect.
    pub since_unix: u64,
    pub last_error: String,
    /// Fabric hosts whose agent the controller reports lost (they receive unstripped packets).
    #[serde(default)]
    pub peers_down: Vec<String>,
    /// Switch role: hosts behind this switch's ports whose agent is not live (the option from
    /// their ports is neutralized).
    #[serde(default)]
    pub untrusted_hosts: Vec<String>,
}

impl Record {
    /// Whether the process that wrote this record is still running: the same PID with the
    /// same start time. (A record of an older agent, without a start time, falls back to the
    /// PID's command line naming sopa-agent.)
    pub fn is_live(&self) -> bool {
        match self.start_time {
            // A zombie (exited, not yet reaped by its parent) is not running.
            Some(started) => proc_stat(self.pid)
                .is_some_and(|(state, at)| state != 'Z' && state != 'X' && at == started),
            None => fs::read(format!("/proc/{}/cmdline", self.pid))
                .map(|cmdline| String::from_utf8_lossy(&cmdline).contains("sopa-agent"))
                .unwrap_or(false),
        }
    }
}

/// Fields 3 (the state: R, S, D, Z for a zombie ...) and 22 (the start time, clock ticks after
/// boot) of `/proc/PID/stat`, read once.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or ')'; the rest
    // starts at field 3, so field 22 is its 20th word.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.nth(18)?.parse().ok()?))
}

#[cfg(test)]
fn process_state(pid: u32) -> Option<char> {
    proc_stat(pid).map(|(state, _)| state)
}

/// When the process started, in clock ticks after boot.
pub fn process_start_time(pid: u32) -> Option<u64> {
    proc_stat(pid).map(|(_, started)| started)
}

/// Sends `signal` to the agent a record names, through a pidfd: the process is checked to be
/// that agent (PID and start time) after the pidfd pins it, so a PID reused meanwhile is never
/// signalled.
pub fn signal_agent(record: &Record, signal: i32) -> std::io::Result<()> {
    use std::os::fd::{FromRawFd as _, OwnedFd};
    // SAFETY: pidfd_open with flags 0 returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, record.pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    if !record.is_live() {
        return Err(std::io::Error::other(format!(
            "process {} is no longer the agent that wrote the record",
            record.pid
        )));
    }
    use std::os::fd::AsRawFd as _;
    // SAFETY: a pidfd we hold, a valid signal number, no siginfo, flags 0.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub struct Journal {
    path: PathBuf,
    pub record: Record,
}

pub const JOURNAL_FILE: &str = "state.json";

impl Journal {
    pub fn path_in(dir: &Path) -> PathBuf {
        dir.join(JOURNAL_FILE)
    }

    /// Reads the record a previous or running agent left in `dir`, if any.
    pub fn read(dir: &Path) -> Result<Option<Record>> {
        let path = Self::path_in(dir);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|err| {
                Error::Config(format!(
                    "{} is not an agent record ({err}); remove it if no agent runs",
                    path.display()
                ))
            }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(Error::io(format!("reading {}", path.display()), err)),
        }
    }

    /// Starts a journal in `dir` (created if missing).
    pub fn create(dir: &Path, record: Record) -> Result<Self> {
        fs::create_dir_all(dir)
            .map_err(|err| Error::io(format!("creating {}", dir.display()), err))?;
        let journal = Self {
            path: Self::path_in(dir),
            record,
        };
        journal.persist()?;
        Ok(journal)
    }

    /// Resumes the journal of a run that did not exit cleanly, to undo it.
    pub fn resume(dir: &Path, record: Record) -> Self {
        Self {
            path: Self::path_in(dir),
            record,
        }
    }

    fn persist(&self) -> Result<()> {
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&self.record).expect("record serializes");
        fs::write(&tmp, bytes)
            .and_then(|()| fs::rename(&tmp, &self.path))
            .map_err(|err| Error::io(format!("writing {}", self.path.display()), err))
    }

    /// Marks the record as left attached on purpose (`--keep-attached`) and saves it: the next
    /// agent adopts what it lists, `sopa-agent detach` undoes it.
    pub fn leave_attached(mut self) -> Result<()> {
        self.record.kept_attached = true;
        self.persist()
    }

    /// Rewrites the record (after changing fields other than the change list).
    pub fn save(&self) -> Result<()> {
        self.persist()
    }

    pub fn set_controller(&mut self, state: ControllerState) -> Result<()> {
        self.record.controller = Some(state);
        self.persist()
    }

    /// Records a change about to be made (write-ahead): a crash right after the change still
    /// finds it in the journal, and a change that then failed or never happened is skipped at
    /// undo, which restores only what still holds the value we set.
    pub fn push(&mut self, change: Change) -> Result<()> {
        self.record.changes.push(change);
        self.persist()
    }

    /// Undoes every change, newest first, and removes the journal. Failures are logged and
    /// returned; undo goes on with the rest.
    pub async fn undo(mut self, netlink: &Netlink) -> Vec<Error> {
        let mut errors = Vec::new();
        while let Some(change) = self.record.changes.pop() {
            if let Err(err) = undo_one(&change, netlink).await {
                warn!(?change, %err, "could not undo a change");
                errors.push(err);
            } else {
                info!(?change, "restored");
            }
            if let Err(err) = self.persist() {
                errors.push(err);
            }
        }
        if let Err(err) = fs::remove_file(&self.path)
            && err.kind() != std::io::ErrorKind::NotFound
        {
            errors.push(Error::io(format!("removing {}", self.path.display()), err));
        }
        if let Some(dir) = self.path.parent() {
            // Only succeeds when empty, which is what we want.
            let _ = fs::remove_dir(dir);
        }
        errors
    }
}

/// A running agent's journal, shared by the role and the tasks that change the host on their
/// own (the route keeper). The lock is never held across an await.
#[derive(Clone)]
pub struct SharedJournal(std::sync::Arc<std::sync::Mutex<Option<Journal>>>);

impl SharedJournal {
    pub fn new(journal: Journal) -> Self {
        Self(std::sync::Arc::new(std::sync::Mutex::new(Some(journal))))
    }

    /// Runs `f` on the journal; `None` once it was taken (the agent is stopping).
    pub fn with<R>(&self, f: impl FnOnce(&mut Journal) -> R) -> Option<R> {
        self.0.lock().expect("journal lock").as_mut().map(f)
    }

    /// Records a change about to be made (write-ahead, see [`Journal::push`]).
    pub fn push(&self, change: Change) -> Result<()> {
        self.with(|j| j.push(change)).unwrap_or_else(|| {
            Err(Error::Config(
                "the agent is stopping; no further changes are made".into(),
            ))
        })
    }

    /// The changes recorded so far.
    pub fn changes(&self) -> Vec<Change> {
        self.with(|j| j.record.changes.clone()).unwrap_or_default()
    }

    /// Drops the recorded changes `gone` says are no longer in effect, and saves.
    pub fn forget(&self, gone: impl Fn(&Change) -> bool) -> Result<()> {
        self.with(|j| {
            let before = j.record.changes.len();
            j.record.changes.retain(|c| !gone(c));
            if j.record.changes.len() == before {
                Ok(())
            } else {
                j.save()
            }
        })
        .unwrap_or(Ok(()))
    }

    /// Replaces the records `old` matches with `change` (appended if none matched), in one
    /// save: a setting changed again keeps one record, with the value from before any agent.
    pub fn replace(&self, old: impl Fn(&Change) -> bool, change: Change) -> Result<()> {
        self.with(|j| {
            let at = j.record.changes.iter().position(&old);
            j.record.changes.retain(|c| !old(c));
            let at = at.unwrap_or(j.record.changes.len());
            j.record.changes.insert(at, change);
            j.save()
        })
        .unwrap_or_else(|| {
            Err(Error::Config(
                "the agent is stopping; no further changes are made".into(),
            ))
        })
    }

    /// Drops the newest record of `change` (a change that was refused, so never made), and
    /// saves.
    pub fn retract(&self, change: &Change) -> Result<()> {
        self.with(
            |j| match j.record.changes.iter().rposition(|c| c == change) {
                Some(i) => {
                    j.record.changes.remove(i);
                    j.save()
                }
                None => Ok(()),
            },
        )
        .unwrap_or(Ok(()))
    }

    /// Takes the journal out (to undo it or leave it for the next agent).
    pub fn take(&self) -> Option<Journal> {
        self.0.lock().expect("journal lock").take()
    }
}

impl Journal {
    /// Undoes the changes that are not in `keep`, newest first, and leaves `keep` as the
    /// record: an agent that could not adopt a datapath undoes its own changes only, so the
    /// datapath stays as the previous agent left it, adoptable by the next.
    pub async fn undo_beyond(mut self, netlink: &Netlink, keep: Record) -> Vec<Error> {
        let mut errors = Vec::new();
        let own: Vec<Change> = self
            .record
            .changes
            .iter()
            .filter(|c| !keep.changes.contains(c))
            .cloned()
            .collect();
        for change in own.iter().rev() {
            match undo_one(change, netlink).await {
                Ok(()) => info!(?change, "restored"),
                Err(err) => {
                    warn!(?change, %err, "could not undo a change");
                    errors.push(err);
                }
            }
        }
        // What this agent took back of the adopted state (GSO given back, a copied route
        // replaced) is put back as the previous agent left it.
        let taken: Vec<Change> = keep
            .changes
            .iter()
            .filter(|c| !self.record.changes.contains(c))
            .cloned()
            .collect();
        for change in &taken {
            match redo_one(change, netlink).await {
                Ok(()) => info!(?change, "put back as the previous agent left it"),
                Err(err) => {
                    warn!(?change, %err, "could not put a change back");
                    errors.push(err);
                }
            }
        }
        self.record = keep;
        if let Err(err) = self.persist() {
            errors.push(err);
        }
        errors
    }
}

/// Where the agent that left a record ran, against where this one runs.
#[derive(Debug, PartialEq, Eq)]
pub enum RecordNamespace {
    /// The same network namespace: the record's changes are this namespace's.
    Same,
    /// Its namespace is gone, and with it every interface, route and setting it changed:
    /// only its pins and the record itself are left.
    Gone,
}

impl Record {
    /// Checks that this record's changes belong to the namespace this agent runs in (`now`,
    /// as `--netns` names it; `None` for the namespace the agent was started in). A record of
    /// another namespace that still exists is refused: undoing or adopting it here would
    /// change this namespace's settings (the root namespace's `ip_forward`, say).
    pub fn namespace(&self, now: Option<&str>) -> Result<RecordNamespace> {
        if self.netns.as_deref() == now {
            return Ok(RecordNamespace::Same);
        }
        let name = |ns: Option<&str>| match ns {
            Some(ns) => format!("network namespace {ns:?}"),
            None => "the namespace it was started in (no --netns)".to_owned(),
        };
        if let Some(ns) = &self.netns {
            let path = if ns.contains('/') {
                PathBuf::from(ns)
            } else {
                Path::new("/run/netns").join(ns)
            };
            if !path.exists() {
                return Ok(RecordNamespace::Gone);
            }
        }
        let flag = match &self.netns {
            Some(ns) => format!("--netns {ns} "),
            None => String::new(),
        };
        Err(Error::Config(format!(
            "the previous agent of node {:?} ran in {}, this one in {}: start it there, or \
             remove what the previous one left with `sopa-agent {flag}detach --node {}`",
            self.node,
            name(self.netns.as_deref()),
            name(now),
            self.node
        )))
    }
}

/// Makes one recorded change again (its `new` value), for a record being handed back.
async fn redo_one(change: &Change, netlink: &Netlink) -> Result<()> {
    match change {
        Change::Pins { .. } => Ok(()),
        Change::Sysctl { key, new, .. } => sysctl::write(key, new),
        Change::GsoMaxSegs { index, new, .. } => netlink.set_gso_max_segs(*index, *new).await,
        Change::RouteAdded { route } => netlink.add_route(route, true).await,
        Change::RouteReplaced { new, .. } => netlink.add_route(new, true).await,
        Change::Route6Added { route } => netlink.add_route6(route).await,
        // A filter comes back with its program when the role attaches; a qdisc is not taken
        // back by any agent.
        Change::Clsact { .. } | Change::TcFilter { .. } | Change::Cgroup2Mount { .. } => Ok(()),
    }
}

/// Undoes one change if the host still holds the value we set. Something another program or
/// an operator changed since is theirs now: left as it is, and said so.
async fn undo_one(change: &Change, netlink: &Netlink) -> Result<()> {
    let not_ours = |what: &str| {
        warn!(
            ?change,
            "{what} changed since the agent set it; leaving it as it is"
        );
        Ok(())
    };
    match change {
        Change::Cgroup2Mount { dir } => crate::datapath::guard::unmount_cgroup2(dir),
        Change::Pins { dir } => match fs::remove_dir_all(dir) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("unpinning {}", dir.display()), err))
            }
            _ => Ok(()),
        },
        Change::Sysctl { key, old, new } => match sysctl::read(key) {
            Ok(now) if sysctl::same_value(&now, new) => sysctl::write(key, old),
            Ok(_) => not_ours(key),
            Err(err) => Err(err),
        },
        Change::GsoMaxSegs {
            ifname,
            index,
            old,
            new,
            before,
        } => match netlink.link(ifname).await {
            Ok(link)
                if link.index == *index
                    && (link.gso_max_segs == *new || Some(link.gso_max_segs) == *before) =>
            {
                netlink.set_gso_max_segs(*index, *old).await
            }
            Ok(link) if link.index == *index => not_ours("gso_max_segs"),
            // The interface is gone or is another one now: nothing of ours to restore.
            Ok(_) | Err(Error::UnknownInterface(_)) => Ok(()),
            Err(err) => Err(err),
        },
        Change::RouteAdded { route } => {
            if netlink
                .routes()
                .await?
                .iter()
                .any(|r| route.still_installed_as(r))
            {
                netlink.delete_route(route).await
            } else {
                not_ours("the route")
            }
        }
        // Only our change goes back: the route as it is now (whatever else an operator or a
        // daemon changed since: initcwnd, prefsrc, next hops) with its MTU as it was, where the
        // MTU is still the one we set.
        Change::RouteReplaced { old, new } => {
            let routes = netlink.routes().await?;
            match routes.iter().find(|r| new.holds_our_mtu(r)) {
                Some(current) => {
                    let mut back = current.clone();
                    back.mtu = old.mtu;
                    back.mtu_locked = old.mtu_locked;
                    netlink.add_route(&back, true).await
                }
                None => not_ours("the route's MTU"),
            }
        }
        // Removed only as we added it: a route someone replaced since stays. (A seg6local
        // route is not listed, and goes with its behaviour.)
        Change::Route6Added { route } => match route.action {
            crate::netlink::Action6::UsidEnd { .. } => netlink.delete_route6(route).await,
            crate::netlink::Action6::Via { .. } => {
                if netlink
                    .routes6()
                    .await?
                    .iter()
                    .any(|r| route.still_installed_as(r))
                {
                    netlink.delete_route6(route).await
                } else {
                    not_ours("the IPv6 route")
                }
            }
        },
        Change::TcFilter { filter } => {
            // Only a filter at our place that runs one of our programs is ours to remove.
            let listed = if netlink.has_clsact(filter.index).await.unwrap_or(false) {
                netlink.tc_filters(filter.index).await?
            } else {
                Vec::new()
            };
            match listed.iter().find(|k| k.is_at(filter)) {
                None => Ok(()),
                Some(k)
                    if k.program.as_ref().is_some_and(|(_, name)| {
                        crate::datapath::tc_hook::OUR_PROGRAMS.contains(&name.as_str())
                    }) =>
                {
                    crate::datapath::tc_hook::detach(filter)
                }
                Some(_) => not_ours("the filter at our place"),
            }
        }
        Change::Clsact { ifname, index } => {
            // The interface may be another one by now, or hold other tools' filters: only the
            // qdisc we added, once empty, goes.
            match netlink.link(ifname).await {
                Ok(link) if link.index == *index => {}
                Ok(_) | Err(Error::UnknownInterface(_)) => return Ok(()),
                Err(err) => return Err(err),
            }
            if !netlink.has_clsact(*index).await? {
                return Ok(());
            }
            if netlink.tc_filters(*index).await?.is_empty() {
                netlink.delete_clsact(*index).await
            } else {
                not_ours("the clsact qdisc (other filters are under it)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(node: &str) -> Record {
        Record {
            node: node.into(),
            pid: std::process::id(),
            start_time: None,
            iface: "eth0".into(),
            ifindex: 2,
            paths_file: None,
            granularity: "packet".into(),
            xdp_mode: "generic".into(),
            started_unix: 0,
            changes: Vec::new(),
            controller: None,
            netns: None,
            kept_attached: false,
            adopted: None,
            programs: None,
            reloads_on_sighup: false,
            usid: None,
            attach: None,
            fallbacks: BTreeMap::new(),
        }
    }

    fn scratch() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("sopa-journal-")
            .tempdir()
            .unwrap()
    }

    #[test]
    fn a_record_of_another_namespace_is_refused_unless_that_namespace_is_gone() {
        let mut r = record("h0");
        assert_eq!(r.namespace(None).unwrap(), RecordNamespace::Same);
        r.netns = Some("sopa-no-such-namespace-here".into());
        assert_eq!(
            r.namespace(None).unwrap(),
            RecordNamespace::Gone,
            "its namespace is gone: nothing of it left to undo"
        );
        assert_eq!(
            r.namespace(Some("sopa-no-such-namespace-here")).unwrap(),
            RecordNamespace::Same
        );
        // A record of the namespace the agent was started in, read from another: refused,
        // since undoing it there would change that namespace's settings.
        r.netns = None;
        let err = r.namespace(Some("s1")).unwrap_err().to_string();
        assert!(
            err.contains("\"s1\"") && err.contains("detach --node h0"),
            "{err}"
        );
    }

    #[test]
    fn every_change_is_on_disk_before_the_next() {
        let tmp = scratch();
        let dir = tmp.path().join("h0");
        let mut j = Journal::create(&dir, record("h0")).unwrap();
        assert_eq!(Journal::read(&dir).unwrap().unwrap().changes, []);
        let sysctl = Change::Sysctl {
            key: "net.ipv4.tcp_reordering".into(),
            old: "3".into(),
            new: "10".into(),
        };
        j.push(sysctl.clone()).unwrap();
        // A crash now leaves exactly this change for the next agent to undo.
        assert_eq!(
            Journal::read(&dir).unwrap().unwrap().changes,
            std::slice::from_ref(&sysctl)
        );
        let pins = Change::Pins {
            dir: tmp.path().join("pins"),
        };
        j.push(pins.clone()).unwrap();
        let back = Journal::read(&dir).unwrap().unwrap();
        assert_eq!(back.changes, [sysctl, pins]);
        assert_eq!(back.node, "h0");
        // No temporary file is left behind by the atomic rewrite.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [JOURNAL_FILE]);
    }

    #[test]
    fn no_record_is_none_and_a_damaged_one_is_refused_by_name() {
        let tmp = scratch();
        assert!(Journal::read(tmp.path()).unwrap().is_none());
        std::fs::write(Journal::path_in(tmp.path()), b"{\"node\": ").unwrap();
        let err = Journal::read(tmp.path()).unwrap_err().to_string();
        assert!(
            err.contains("state.json") && err.contains("remove it if no agent runs"),
            "{err}"
        );
    }

    #[test]
    fn liveness_is_the_pid_and_its_start_time_not_a_command_line() {
        // An unrelated process whose command line says sopa-agent.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30; true", "sopa-agent"])
            .spawn()
            .unwrap();
        let mut r = record("h1");
        r.pid = child.id();
        // Until the child has exec'd sh, its command line is this test's.
        let cmdline = || std::fs::read(format!("/proc/{}/cmdline", r.pid)).unwrap_or_default();
        while !String::from_utf8_lossy(&cmdline()).contains("sopa-agent") {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let started = process_start_time(r.pid).expect("a start time");
        r.start_time = Some(started + 1);
        assert!(
            !r.is_live(),
            "same PID, another start time: another process"
        );
        assert!(
            signal_agent(&r, libc::SIGUSR1).is_err(),
            "never signalled as the agent"
        );
        assert!(child.try_wait().unwrap().is_none(), "still running");
        r.start_time = Some(started);
        assert!(r.is_live());
        r.start_time = None;
        assert!(r.is_live(), "an older record: the command line decides");
        r.start_time = Some(started);
        child.kill().unwrap();
        // Exited but not reaped: a zombie keeps its PID and start time, and is not running.
        while process_state(r.pid) != Some('Z') {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!r.is_live(), "a zombie is not a live agent");
        child.wait().unwrap();
    }

    #[test]
    fn a_record_of_a_dead_process_is_not_live() {
        let mut r = record("h1");
        // PID 1 runs, but it is not an agent.
        r.pid = 1;
        assert!(!r.is_live());
        r.pid = u32::MAX;
        assert!(!r.is_live());
    }

    #[tokio::test]
    async fn undo_goes_on_past_a_failure_and_removes_the_journal() {
        let tmp = scratch();
        let dir = tmp.path().join("run");
        let (older, newer) = (tmp.path().join("older"), tmp.path().join("older/newer"));
        std::fs::create_dir_all(&newer).unwrap();
        std::fs::write(newer.join("map"), b"x").unwrap();
        // A change that cannot be undone: "unpinning" a path that is a file.
        let blocked = tmp.path().join("not-a-folder");
        std::fs::write(&blocked, b"x").unwrap();
        let mut j = Journal::create(&dir, record("h2")).unwrap();
        for d in [&older, &blocked, &newer] {
            j.push(Change::Pins { dir: d.clone() }).unwrap();
        }
        let netlink = Netlink::connect().unwrap();
        let errors = j.undo(&netlink).await;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].to_string().contains("not-a-folder"), "{errors:?}");
        assert!(!older.exists() && !newer.exists(), "the rest was undone");
        assert!(blocked.exists());
        assert!(!Journal::path_in(&dir).exists(), "the journal is removed");
        assert!(!dir.exists(), "and its empty folder");
    }
}
