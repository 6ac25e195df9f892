//! The modes a run compares (`sopa`, `ecmp`, `hedera`, `mptcp`, `ideal`, the ablations such as
//! `sopa+r3`) and how a running fabric is switched to one.

use crate::fabric::Fabric;

/// A mode of a run: a datapath mode (`sopa`, `rps`, `single` for every flow on its first path,
/// `hedera` for the Hedera baseline, `ecmp` for the switches' kernel multipath with no option,
/// `mptcp` for MPTCP over that with 1 + 4 subflows; in the entropy encoding `random` for a
/// random flow label per packet and `rr-blind` for round robin over as many random labels as
/// paths, no discovery), optionally with ablations after `+`: `r3` (`tcp_reordering` 3
/// instead of 10), `norack` (`tcp_recovery` 0: no RACK), `burst` (GSO bursts instead of packets),
/// `cellN` (flowcells of N segments instead of packets), `first0` (new flows start at path 0 as
/// in the paper, not at their hash).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModeSpec {
    pub base: String,
    pub reordering: u32,
    pub rack: bool,
    /// The agents' unit of spraying (`sopa-agent granularity`): packet, flowcell:N or burst.
    pub granularity: String,
    /// New flows start their round robin at path 0, as the paper's algorithm does, instead of
    /// at their hash.
    pub first0: bool,
}

impl std::str::FromStr for ModeSpec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut parts = s.split('+');
        let base = parts.next().unwrap_or_default().to_owned();
        if ![
            "sopa", "rps", "ecmp", "hedera", "single", "mptcp", "ideal", "random", "rr-blind",
        ]
        .contains(&base.as_str())
        {
            return Err(format!(
                "mode {s:?}: sopa, rps, ecmp, hedera, single, mptcp, ideal, or in the entropy encoding random or rr-blind, optionally +r3, +norack, +burst, +cellN, +first0"
            ));
        }
        let mut m = Self {
            base,
            reordering: 10,
            rack: true,
            granularity: "packet".into(),
            first0: false,
        };
        for p in parts {
            match p {
                "r3" => m.reordering = 3,
                "norack" => m.rack = false,
                "burst" => m.granularity = "burst".into(),
                cell if cell
                    .strip_prefix("cell")
                    .and_then(|n| n.parse::<u32>().ok())
                    .is_some_and(|n| (1..=65_535).contains(&n)) =>
                {
                    m.granularity = format!("flowcell:{}", &cell[4..]);
                }
                "first0" => m.first0 = true,
                other => {
                    return Err(format!(
                        "mode {s:?}: unknown ablation {other:?} (r3, norack, burst, cellN with N from 1 to 65535, first0)"
                    ));
                }
            }
        }
        Ok(m)
    }
}

/// Puts every host in `mode`: the datapath mode, and the ablation settings of its TCP and its
/// fabric interface.
pub fn set_mode(f: &Fabric, mode: &str) {
    let m: ModeSpec = mode.parse().unwrap_or_else(|e| panic!("{e}"));
    let host_mode = match m.base.as_str() {
        // No option: the switches' kernel multipath (MPTCP's subflows are spread by it too).
        "ecmp" | "mptcp" => "off",
        "hedera" => "pinned",
        // The big switch of the non-blocking ideal: nothing to stamp.
        "ideal" => "off",
        // Round robin over the path indexes; the labels say where they go.
        "random" | "rr-blind" => "sopa",
        other => other,
    };
    set_labels(f, m.labels()).unwrap_or_else(|e| panic!("{e}"));
    f.use_ideal(m.base == "ideal")
        .unwrap_or_else(|e| panic!("{e}"));
    for (id, agent) in &f.hosts {
        let first = if m.first0 { "zero" } else { "hash" };
        crate::agent::set_mode_with(&agent.node, host_mode, &["--first-path", first])
            .unwrap_or_else(|e| panic!("{e}"));
        let ns = f.ns(f.topo.graph().name(*id));
        ns.sysctl("net.ipv4.tcp_reordering", &m.reordering.to_string())
            .expect("tcp_reordering");
        ns.sysctl("net.ipv4.tcp_recovery", if m.rack { "1" } else { "0" })
            .expect("tcp_recovery");
        crate::agent::set_granularity(&agent.node, &m.granularity)
            .unwrap_or_else(|e| panic!("{e}"));
        if m.base == "mptcp" {
            // fabric.md: 1 + 4 subflows, the server announcing four more ports of its address.
            ns.ip(&[
                "mptcp",
                "limits",
                "set",
                "subflow",
                "4",
                "add_addr_accepted",
                "4",
            ])
            .expect("ip mptcp limits");
            let addr = f.topo.graph().node(*id).addr.expect("a host").to_string();
            // Announcements already in place stay: removing and re-adding one (modes are
            // interleaved per round) fails while the last round's subflows on its port linger
            // in TIME_WAIT (the kernel's listener does not reuse addresses). They do nothing to
            // plain TCP in the other modes.
            let present = ns
                .ip(&["mptcp", "endpoint", "show"])
                .expect("ip mptcp endpoint show");
            for port in MPTCP_PORTS {
                if present.contains(&format!("{addr} port {port} ")) {
                    continue;
                }
                ns.ip(&[
                    "mptcp",
                    "endpoint",
                    "add",
                    &addr,
                    "port",
                    &port.to_string(),
                    "signal",
                ])
                .expect("ip mptcp endpoint add");
            }
        }
    }
}

impl ModeSpec {
    /// The entropy encoding's label source the mode needs (`sopa-agent labels`): a baseline's,
    /// or the labels discovery found.
    pub fn labels(&self) -> &'static str {
        match self.base.as_str() {
            "random" => "per-packet",
            "rr-blind" => "blind",
            _ => "discovered",
        }
    }

    /// Whether the mode is a baseline of the entropy encoding only.
    pub fn entropy_only(&self) -> bool {
        self.labels() != "discovered"
    }
}

/// Every host of an entropy fabric takes its labels from `source`, all at once, each once its
/// labels are in place; a host already there is left alone. A fabric of another encoding has
/// no labels: only `discovered` applies to it.
pub fn set_labels(f: &Fabric, source: &str) -> crate::Result<()> {
    if f.encoding != sopa_topology::srv6::Encoding::Entropy {
        if source == "discovered" {
            return Ok(());
        }
        return Err(crate::Error::Failed(format!(
            "labels {source}: a baseline of the entropy encoding, and this fabric's is {}",
            f.encoding
        )));
    }
    std::thread::scope(|scope| {
        let jobs: Vec<_> = f
            .hosts
            .values()
            .filter(|a| {
                a.status()
                    .map(|st| st["entropy"]["source"] != source || st["entropy"]["done"] != true)
                    .unwrap_or(true)
            })
            .map(|a| scope.spawn(move || crate::agent::set_labels(&a.node, source)))
            .collect();
        jobs.into_iter()
            .try_for_each(|j| j.join().expect("a labels thread").map(drop))
    })
}

/// The extra ports every host announces in `mptcp` mode (one subflow each). Below the
/// ephemeral range (32768-60999): an earlier connection's local port there would make the
/// announcement's listening socket fail with EADDRINUSE.
pub const MPTCP_PORTS: [u16; 4] = [31_001, 31_002, 31_003, 31_004];
