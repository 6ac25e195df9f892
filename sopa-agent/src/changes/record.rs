//! What a running agent records about itself: its interface, programs, adoption, controller
//! state and fallbacks, and which network namespace the record belongs to.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

use super::Change;

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
