//! `sopa-agent status`: what a running agent's datapath is doing, for people and as JSON.

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use serde::Serialize;
use sopa_common::{
    maps::{mode, stamp_reason, strip_reason},
    wire::HOP_NONE,
};

use crate::{
    changes::{Journal, Record},
    datapath::MapSet,
    error::{Error, Result},
};

pub fn mode_name(m: u32) -> &'static str {
    match m {
        mode::OFF => "off",
        mode::SOPA => "sopa",
        mode::RPS => "rps",
        mode::ECMP => "ecmp",
        mode::PINNED => "pinned",
        mode::SINGLE => "single",
        _ => "unknown",
    }
}

/// Parses a mode name as the CLI and config take it.
pub fn parse_mode(name: &str) -> Result<u32> {
    (0..mode::COUNT)
        .find(|m| mode_name(*m) == name)
        .ok_or_else(|| {
            Error::Config(format!(
                "mode {name:?} is not one of {}",
                (0..mode::COUNT)
                    .map(mode_name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
}

#[derive(Debug, Serialize)]
pub struct Status {
    pub node: String,
    pub running: bool,
    pub pid: u32,
    pub iface: String,
    pub ifindex: u32,
    pub mode: String,
    /// How paths travel: `ipv4-option` or `srv6`.
    pub encoding: String,
    /// The SRv6 encoding's outer source and receive addresses.
    pub srv6: Option<Srv6Addresses>,
    /// The entropy encoding's discovery: per destination host, the paths found of those the
    /// topology has.
    pub entropy: Option<crate::entropy::runner::Summary>,
    /// The mode an operator set at run time (`sopa-agent mode`), kept across restarts.
    pub mode_set_at_run_time: Option<crate::runtime::RuntimeMode>,
    /// Where new flows start their round robin: `hash` (the default) or `zero` (the paper's).
    pub first_path: String,
    pub granularity: String,
    pub xdp_mode: String,
    pub paths_file: Option<String>,
    pub uptime_s: u64,
    pub prefixes: usize,
    pub paths: usize,
    /// The length `tc_stamp` matches destinations at exactly (every prefix has it), or `None`
    /// where it finds the longest match in the trie.
    pub exact_length: Option<u8>,
    /// The prefix covering every destination prefix: `tc_stamp` looks nothing up outside it.
    pub fabric_cover: Option<String>,
    /// prefix -> paths as "hop0,hop1" strings ("none" for 0xFF).
    pub path_table: BTreeMap<String, Vec<String>>,
    pub stamp: BTreeMap<String, u64>,
    pub strip: BTreeMap<String, u64>,
    pub hop0: BTreeMap<String, u64>,
    pub hop1: BTreeMap<String, u64>,
    /// Whether `xdp_strip` measures reordering now (`run --measure-reordering`, `sopa-agent
    /// reordering`); the counters keep what it measured before.
    pub reordering_measured: bool,
    pub reordered_fraction: f64,
    pub changes: Vec<crate::changes::Change>,
    /// The push channel, when the paths come from a controller.
    pub controller: Option<crate::changes::ControllerState>,
    /// Switch role: tc_forward's verdicts and the packets redirected per uplink index.
    pub forward: BTreeMap<String, u64>,
    pub uplinks: Vec<u64>,
    /// Switch role: the tc_forward program id behind each port's pinned link.
    pub forward_programs: BTreeMap<String, u32>,
    /// Switch role, SRv6: the uSID rules that take lists around this switch's dead ports.
    #[serde(default)]
    pub usid_rules: usize,
    /// Switch role, SRv6: who consumes the switch's uSID, `kernel` or `ebpf`.
    pub usid: Option<String>,
    /// How the TC programs attach: `tcx` (links) or `tc` (cls_bpf filters).
    pub attach: Option<String>,
    /// Features this kernel lacks and what the agent does instead.
    pub fallbacks: BTreeMap<String, String>,
    /// The host programs' links are pinned and attached (with or without a running agent).
    pub attached: bool,
    /// The program ids behind the pinned links now.
    pub stamp_prog_id: Option<u32>,
    pub strip_prog_id: Option<u32>,
    /// The last agent exited with --keep-attached.
    pub kept_attached: bool,
    /// The socket-option guard is attached (`--guard-cgroup`), and what it refused by reason.
    pub guard_attached: bool,
    pub guard_refused: BTreeMap<String, u64>,
    /// What this agent adopted from the previous one.
    pub adopted: Option<crate::changes::Adoption>,
    /// The programs the agent attached, as it recorded them (set once attaching is done).
    pub programs: Option<crate::changes::ProgramIds>,
    /// Hedera pins held by the datapath (pinned mode).
    pub pins: usize,
    /// The sender's flow table: entries now, capacity, flows created, evictions.
    pub flow_table: FlowTable,
}

#[derive(Debug, Serialize)]
pub struct Srv6Addresses {
    pub source: std::net::Ipv6Addr,
    pub receive: std::net::Ipv6Addr,
}

#[derive(Debug, Serialize)]
pub struct FlowTable {
    pub entries: u64,
    pub capacity: u64,
    pub created: u64,
    pub evictions: u64,
    /// TCP connections of this host's own sockets whose round robin their socket holds
    /// instead (`SOCKET_FLOWS_MAP`): never in the table, never evicted.
    pub socket_flows_created: u64,
}

fn hop_label(v: usize) -> String {
    if v == usize::from(HOP_NONE) {
        "none".into()
    } else {
        v.to_string()
    }
}

/// Reads the status of the agent of `node`, whose state is under `run_dir` and pins under
/// `pin_dir`.
pub fn read(node: &str, run_dir: &Path, pin_dir: &Path) -> Result<Status> {
    let record: Record = Journal::read(run_dir)?.ok_or_else(|| Error::NotRunning {
        node: node.to_owned(),
        dir: run_dir.to_owned(),
    })?;
    let maps = MapSet::from_pins(pin_dir)?;
    let config = maps.config()?;
    let encap = maps.encap()?;
    let table = maps.paths()?;
    let stamp = maps.stamp_counters()?;
    let strip = maps.strip_counters()?;
    let hops = maps.hop_counters()?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (forward, uplinks, usid_rules) =
        match crate::datapath::maps::ForwardMaps::from_pins(pin_dir) {
            Ok(f) => (
                f.counters()?
                    .into_iter()
                    .zip(sopa_common::maps::forward_reason::NAMES)
                    .map(|(v, n)| (n.to_owned(), v))
                    .collect(),
                f.uplink_counters()?,
                f.usid_rules().map_or(0, |r| r.len()),
            ),
            Err(_) => (BTreeMap::new(), Vec::new(), 0),
        };
    let data = strip[strip_reason::TCP_DATA as usize];
    let reordered = strip[strip_reason::TCP_REORDERED as usize];
    let (stamp_prog_id, strip_prog_id) = crate::datapath::pinned_program_ids(pin_dir);
    let mut forward_programs = crate::datapath::Datapath::pinned_forward_program_ids(pin_dir);
    // Ports where tc_forward is a cls_bpf filter: the program pinned beside the maps.
    if let Some(id) =
        crate::datapath::pinned_program_id(&pin_dir.join(crate::datapath::FORWARD_PROG_PIN))
    {
        for c in &record.changes {
            if let crate::changes::Change::TcFilter { filter } = c
                && filter.ingress
            {
                forward_programs.insert(filter.ifname.clone(), id);
            }
        }
    }
    let pins = maps.pins().map(|p| p.len()).unwrap_or(0);
    let entries = maps.flow_entries() as u64;
    let created = stamp[stamp_reason::FLOWS_CREATED as usize];
    let flow_table = FlowTable {
        entries,
        capacity: u64::from(sopa_common::maps::FLOWS_CAPACITY),
        created,
        evictions: created.saturating_sub(entries),
        socket_flows_created: stamp[stamp_reason::SOCKET_FLOWS_CREATED as usize],
    };
    let (guard_attached, guard_refused) = crate::datapath::guard::guard_status(pin_dir);
    Ok(Status {
        guard_attached,
        guard_refused,
        flow_table,
        attached: stamp_prog_id.is_some() && strip_prog_id.is_some(),
        stamp_prog_id,
        strip_prog_id,
        kept_attached: record.kept_attached,
        forward_programs,
        usid_rules,
        usid: record.usid.clone(),
        attach: record.attach.clone(),
        fallbacks: record.fallbacks.clone(),
        adopted: record.adopted.clone(),
        programs: record.programs,
        pins,
        node: record.node.clone(),
        running: record.is_live(),
        pid: record.pid,
        iface: record.iface.clone(),
        ifindex: record.ifindex,
        mode: mode_name(config.mode).to_owned(),
        encoding: sopa_common::maps::encoding::NAMES
            .get(encap.encoding as usize)
            .copied()
            .unwrap_or("unknown")
            .to_owned(),
        srv6: (encap.encoding == sopa_common::maps::encoding::SRV6).then(|| Srv6Addresses {
            source: encap.source.into(),
            receive: encap.receive.into(),
        }),
        entropy: (encap.encoding == sopa_common::maps::encoding::ENTROPY)
            .then(|| {
                let text =
                    std::fs::read_to_string(run_dir.join(crate::entropy::runner::SUMMARY_FILE));
                text.ok().and_then(|t| serde_json::from_str(&t).ok())
            })
            .flatten(),
        mode_set_at_run_time: crate::runtime::RuntimeMode::load(run_dir).ok().flatten(),
        first_path: sopa_common::maps::first_path::NAMES
            .get(maps.first_path()? as usize)
            .copied()
            .unwrap_or("unknown")
            .to_owned(),
        granularity: record.granularity.clone(),
        xdp_mode: record.xdp_mode.clone(),
        paths_file: record.paths_file.as_ref().map(|p| p.display().to_string()),
        uptime_s: now.saturating_sub(record.started_unix),
        prefixes: table.len(),
        exact_length: maps.exact_length()?,
        fabric_cover: maps.fabric_cover()?.map(|p| p.to_string()),
        paths: table.destinations.values().map(Vec::len).sum(),
        path_table: table
            .destinations
            .iter()
            .map(|(p, hops)| {
                let hops = hops
                    .iter()
                    .map(|h| format!("{},{}", h.hop0, hop_label(usize::from(h.hop1))))
                    .collect();
                (p.to_string(), hops)
            })
            .collect(),
        stamp: stamp_reason::NAMES
            .iter()
            .zip(&stamp)
            .map(|(n, v)| ((*n).to_owned(), *v))
            .collect(),
        strip: strip_reason::NAMES
            .iter()
            .zip(&strip)
            .map(|(n, v)| ((*n).to_owned(), *v))
            .collect(),
        hop0: (0..256)
            .filter(|i| hops[*i] > 0)
            .map(|i| (hop_label(i), hops[i]))
            .collect(),
        hop1: (0..256)
            .filter(|i| hops[256 + *i] > 0)
            .map(|i| (hop_label(i), hops[256 + i]))
            .collect(),
        reordering_measured: maps.reordering_measured()?,
        reordered_fraction: if data == 0 {
            0.0
        } else {
            reordered as f64 / data as f64
        },
        changes: record.changes,
        controller: record.controller,
        forward,
        uplinks,
    })
}

fn nonzero(counters: &BTreeMap<String, u64>, order: &[&str]) -> String {
    let parts: Vec<String> = order
        .iter()
        .filter_map(|name| {
            counters
                .get(*name)
                .filter(|v| **v > 0)
                .map(|v| format!("{name} {v}"))
        })
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

impl Status {
    /// The report for people.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let state = match (self.running, self.attached, self.kept_attached) {
            (true, _, _) => "running",
            (false, true, true) => "NOT RUNNING, datapath kept attached (the next agent adopts it)",
            (false, true, false) => "NOT RUNNING, datapath still attached (the agent died)",
            (false, false, _) => "NOT RUNNING (stale state)",
        };
        let _ = writeln!(
            s,
            "node {}: {state}, pid {}, up {} s",
            self.node, self.pid, self.uptime_s
        );
        let mut set = match &self.mode_set_at_run_time {
            Some(m) => format!(" (mode {} set at run time, kept across restarts)", m.mode),
            None => String::new(),
        };
        if self.first_path != "hash" {
            set += &format!(", new flows start at path {}", self.first_path);
        }
        let _ = writeln!(
            s,
            "interface {} (ifindex {}), mode {}{set}, encoding {}, granularity {}, xdp {}",
            self.iface, self.ifindex, self.mode, self.encoding, self.granularity, self.xdp_mode
        );
        if let Some(a) = &self.srv6 {
            let _ = writeln!(
                s,
                "srv6: outer source {}, receives on {}",
                a.source, a.receive
            );
        }
        if let Some(e) = &self.entropy {
            let probes: u32 = e.destinations.iter().map(|d| d.probes).sum();
            let _ = writeln!(
                s,
                "entropy: labels {}, {} destinations probed{} with {probes} probes ({} again \
                 for loss); fewer paths than the topology has: {}",
                e.source,
                e.destinations.len(),
                if e.done { "" } else { " so far" },
                e.reprobed_for_loss,
                if e.incomplete.is_empty() {
                    "none".to_owned()
                } else {
                    e.incomplete.join(", ")
                }
            );
        }
        if let (Some(stamp), Some(strip)) = (self.stamp_prog_id, self.strip_prog_id) {
            let how = if self.attach.as_deref() == Some("tc") {
                "a cls_bpf filter and a pinned XDP link"
            } else {
                "links pinned"
            };
            let _ = writeln!(
                s,
                "programs: tc_stamp id {stamp}, xdp_strip id {strip} ({how})"
            );
        }
        if let Some(a) = &self.adopted {
            let _ = writeln!(
                s,
                "adopted the datapath of pid {} ({}): programs replaced in place ({} -> {}, {} -> {})",
                a.pid,
                a.how,
                a.stamp_prog_replaced.map_or("-".into(), |i| i.to_string()),
                self.stamp_prog_id.map_or("-".into(), |i| i.to_string()),
                a.strip_prog_replaced.map_or("-".into(), |i| i.to_string()),
                self.strip_prog_id.map_or("-".into(), |i| i.to_string()),
            );
        }
        if self.pins > 0 {
            let _ = writeln!(s, "hedera pins: {}", self.pins);
        }
        let ft = &self.flow_table;
        let _ = writeln!(
            s,
            "flow table: {} of {} entries, {} flows created, {} evicted; {} TCP connections \
             of this host's sockets held by the sockets",
            ft.entries, ft.capacity, ft.created, ft.evictions, ft.socket_flows_created
        );
        let _ = writeln!(
            s,
            "path table: {} prefixes, {} paths, {}{}",
            self.prefixes,
            self.paths,
            match (self.exact_length, &self.fabric_cover) {
                (Some(len), Some(cover)) => format!("matched exactly at /{len} within {cover}"),
                (None, Some(cover)) => format!("longest match (trie) within {cover}"),
                _ => "longest match (trie)".into(),
            },
            self.paths_file
                .as_ref()
                .map(|f| format!(" (from {f})"))
                .unwrap_or_default()
        );
        for (prefix, hops) in &self.path_table {
            let _ = writeln!(s, "  {prefix:<18} {}", hops.join("  "));
        }
        let _ = writeln!(
            s,
            "tc_stamp:  {}",
            nonzero(&self.stamp, &stamp_reason::NAMES)
        );
        let hops = |m: &BTreeMap<String, u64>| {
            let mut v: Vec<(&String, &u64)> = m.iter().collect();
            v.sort_by_key(|(k, _)| k.parse::<u32>().unwrap_or(u32::MAX));
            v.iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let _ = writeln!(s, "  hop0:    {}", hops(&self.hop0));
        let _ = writeln!(s, "  hop1:    {}", hops(&self.hop1));
        let _ = writeln!(
            s,
            "xdp_strip: {}",
            nonzero(
                &self.strip,
                &strip_reason::NAMES
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| strip_reason::is_verdict(*i as u32))
                    .map(|(_, n)| *n)
                    .collect::<Vec<_>>()
            )
        );
        if self.reordering_measured {
            let _ = writeln!(
                s,
                "  reordered: {:.3}% of {} TCP data packets",
                100.0 * self.reordered_fraction,
                self.strip["tcp_data"]
            );
        } else {
            let _ = writeln!(
                s,
                "  reordering: not measured (`sopa-agent reordering on`, or run --measure-reordering){}",
                if self.strip["tcp_data"] > 0 {
                    format!(
                        "; before: {:.3}% of {} TCP data packets",
                        100.0 * self.reordered_fraction,
                        self.strip["tcp_data"]
                    )
                } else {
                    String::new()
                }
            );
        }
        if let Some(attach) = &self.attach {
            let how = if attach == "tc" {
                "cls_bpf filters on a clsact qdisc"
            } else {
                "TCX links"
            };
            let _ = writeln!(s, "TC programs attached as {how}");
        }
        if let Some(usid) = &self.usid {
            let _ = writeln!(s, "SRv6: this switch's uSID consumed by {usid}");
        }
        for (feature, instead) in &self.fallbacks {
            let _ = writeln!(s, "without {feature}: {instead}");
        }
        if self.forward.values().any(|v| *v > 0) {
            let _ = writeln!(
                s,
                "tc_forward: {}",
                nonzero(&self.forward, &sopa_common::maps::forward_reason::NAMES)
            );
            if self.usid_rules > 0 {
                let _ = writeln!(
                    s,
                    "SRv6 repair: {} uSID rules take lists around dead ports",
                    self.usid_rules
                );
            }
            let used: Vec<String> = self
                .uplinks
                .iter()
                .enumerate()
                .filter(|(_, v)| **v > 0)
                .map(|(i, v)| format!("{i}={v}"))
                .collect();
            let _ = writeln!(s, "  per uplink: {}", used.join(" "));
        }
        if let Some(c) = &self.controller {
            let state = if c.connected {
                "connected".to_owned()
            } else {
                "DISCONNECTED (forwarding with the last good paths)".to_owned()
            };
            let _ = writeln!(
                s,
                "controller {}: {state} since {}, epoch {:x} version {}{}",
                c.endpoint,
                c.since_unix,
                c.epoch,
                c.version,
                if c.last_error.is_empty() {
                    String::new()
                } else {
                    format!(", last error: {}", c.last_error)
                }
            );
            if !c.untrusted_hosts.is_empty() {
                let _ = writeln!(
                    s,
                    "hosts without a live agent (their option is neutralized here): {}",
                    c.untrusted_hosts.join(", ")
                );
            }
            if !c.peers_down.is_empty() {
                let _ = writeln!(
                    s,
                    "ALARM: hosts without their agent (receiving unstripped packets): {}",
                    c.peers_down.join(", ")
                );
            }
        }
        let _ = writeln!(s, "host changes to restore on exit: {}", self.changes.len());
        s
    }
}
