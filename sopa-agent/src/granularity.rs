//! The unit of spraying, and the interface setting that makes it: one path per packet
//! (`gso_max_segs 1`), per flowcell of N segments (`gso_max_segs N`: TCP's GSO super-packets
//! hold at most N segments, and `tc_stamp` picks one path per super-packet), or per GSO burst
//! (the interface as it was). It is set at start (`run --granularity`) and at run time
//! (`sopa-agent granularity`, which asks the running agent with SIGHUP); either way the value
//! the interface had before any agent is what the journal restores at exit.

use std::{fmt, path::Path, str::FromStr};

use serde::{Deserialize, Serialize};
use tracing::info;

use crate::{
    changes::{Change, SharedJournal},
    error::{Error, Result},
    netlink::Netlink,
    runtime,
};

/// The largest flowcell in segments: the kernel's `GSO_MAX_SEGS`.
pub const MAX_FLOWCELL: u32 = 65_535;

/// The unit of spraying.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    /// One path per packet: `gso_max_segs 1`.
    Packet,
    /// One path per flowcell of at most N segments (2 or more): `gso_max_segs N`.
    Flowcell(u32),
    /// One path per GSO burst (up to 64 KB): the interface's GSO as it was.
    Burst,
}

impl Granularity {
    /// The agent's default: flowcells of 4 segments. On the emulated Fat-Tree they kept 0.98-0.99
    /// of per-packet throughput, and sender, router and receiver spent 0.36-0.52 of per packet's
    /// CPU per GB (docs/RESULTS.md, "Flowcells"); units of 8 and more lost throughput there.
    /// `packet` is the paper's unit.
    pub const DEFAULT: Self = Self::Flowcell(4);

    /// The `gso_max_segs` it sets, or `None` to leave the interface's own.
    pub fn segs(self) -> Option<u32> {
        match self {
            Self::Packet => Some(1),
            Self::Flowcell(n) => Some(n),
            Self::Burst => None,
        }
    }
}

impl fmt::Display for Granularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Packet => f.write_str("packet"),
            Self::Flowcell(n) => write!(f, "flowcell:{n}"),
            Self::Burst => f.write_str("burst"),
        }
    }
}

impl FromStr for Granularity {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || {
            format!(
                "granularity {s:?}: give packet, burst or flowcell:N (N segments per unit, 1 to {MAX_FLOWCELL})"
            )
        };
        match s {
            "packet" => Ok(Self::Packet),
            "burst" => Ok(Self::Burst),
            _ => {
                let n: u32 = s
                    .strip_prefix("flowcell:")
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(bad)?;
                match n {
                    // A flowcell of one segment is a packet: one name for one setting.
                    1 => Ok(Self::Packet),
                    2..=MAX_FLOWCELL => Ok(Self::Flowcell(n)),
                    _ => Err(bad()),
                }
            }
        }
    }
}

impl Serialize for Granularity {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Granularity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

const FILE: &str = "granularity.json";

/// A granularity an operator set at run time, kept across restarts of the agent until a
/// `run --granularity` says otherwise.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeGranularity {
    pub granularity: Granularity,
    pub set_unix: u64,
}

impl RuntimeGranularity {
    pub fn new(granularity: Granularity) -> Self {
        Self {
            granularity,
            set_unix: runtime::unix_now(),
        }
    }

    pub fn save(&self, run_dir: &Path) -> Result<()> {
        runtime::save(run_dir, FILE, self)
    }

    pub fn load(run_dir: &Path) -> Result<Option<Self>> {
        runtime::load(run_dir, FILE, "--granularity")
    }

    pub fn clear(run_dir: &Path) -> Result<()> {
        runtime::clear(run_dir, FILE)
    }
}

/// Puts the interface `ifname` (index `index`) at the granularity `g`, journaled before it
/// changes: the journal's record of the interface keeps the value it had before any agent, so
/// the exit restores that one whatever was set in between. A failure leaves the interface and
/// the journal as they were.
pub async fn apply(
    netlink: &Netlink,
    journal: &SharedJournal,
    ifname: &str,
    index: u32,
    g: Granularity,
) -> Result<()> {
    let ours = |c: &Change| matches!(c, Change::GsoMaxSegs { index: i, .. } if *i == index);
    let current = netlink.link(ifname).await?.gso_max_segs;
    let recorded = journal.changes().into_iter().find(|c| ours(c));
    let original = match &recorded {
        Some(Change::GsoMaxSegs { old, .. }) => *old,
        _ => current,
    };
    let target = g.segs().unwrap_or(original);
    if target == original {
        // Back to the interface's own value: changed first, then forgotten (a crash between
        // leaves a record the exit finds "not ours" and leaves alone, which is right).
        if current != target {
            netlink.set_gso_max_segs(index, target).await?;
        }
        journal.forget(ours)?;
    } else {
        let change = Change::GsoMaxSegs {
            ifname: ifname.to_owned(),
            index,
            old: original,
            new: target,
            // What the interface holds until the change below is made.
            before: (current != original && current != target).then_some(current),
        };
        // Write-ahead: the record says what the interface will hold before it does.
        journal.replace(ours, change)?;
        if current != target
            && let Err(err) = netlink.set_gso_max_segs(index, target).await
        {
            let undo = match &recorded {
                Some(previous) => journal.replace(ours, previous.clone()),
                None => journal.forget(ours),
            };
            if let Err(undo) = undo {
                tracing::warn!(%undo, "putting the journal's record of gso_max_segs back");
            }
            return Err(err);
        }
    }
    if current != target {
        reroute_sockets();
    }
    journal
        .with(|j| {
            j.record.granularity = g.to_string();
            j.save()
        })
        .unwrap_or(Ok(()))?;
    info!(iface = ifname, granularity = %g, gso_max_segs = target, "granularity set");
    Ok(())
}

/// Makes established IPv4 sockets take the new limit: TCP copies the device's
/// `gso_max_segs` into a socket when it routes, and a connection keeps its cached route (and
/// its burst size) until that route is invalidated. A bump of the route generation does that
/// for every socket of the namespace at its next send; nothing else changes. (IPv6 sockets,
/// the SRv6 encoding's /96, keep their size until their route changes.)
fn reroute_sockets() {
    if let Err(err) = crate::sysctl::write(crate::sysctl::IPV4_ROUTE_FLUSH, "1") {
        tracing::warn!(%err, "established connections keep their burst size until they re-route");
    }
}

/// What `sopa-agent granularity` needs of a running agent: it answers SIGHUP by reading the
/// node's run-time granularity and applying it.
pub struct Control {
    netlink: Netlink,
    journal: SharedJournal,
    ifname: String,
    index: u32,
    run_dir: std::path::PathBuf,
}

impl Control {
    pub fn new(
        journal: SharedJournal,
        ifname: String,
        index: u32,
        run_dir: std::path::PathBuf,
    ) -> Result<Self> {
        Ok(Self {
            netlink: Netlink::connect()?,
            journal,
            ifname,
            index,
            run_dir,
        })
    }

    /// Applies the run-time granularity, if one is recorded. On failure the record goes back
    /// to what the agent runs, so that the file never says what is not in force.
    pub async fn reload(&self) -> Result<()> {
        let Some(wanted) = RuntimeGranularity::load(&self.run_dir)? else {
            return Ok(());
        };
        match apply(
            &self.netlink,
            &self.journal,
            &self.ifname,
            self.index,
            wanted.granularity,
        )
        .await
        {
            Ok(()) => Ok(()),
            Err(err) => {
                let running = self
                    .journal
                    .with(|j| j.record.granularity.clone())
                    .and_then(|g| g.parse().ok());
                if let Some(g) = running {
                    RuntimeGranularity::new(g).save(&self.run_dir)?;
                }
                Err(Error::Config(format!(
                    "granularity {}: {err}; the agent keeps the one it had",
                    wanted.granularity
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_every_granularity() {
        for (s, g) in [
            ("packet", Granularity::Packet),
            ("burst", Granularity::Burst),
            ("flowcell:8", Granularity::Flowcell(8)),
            ("flowcell:65535", Granularity::Flowcell(65_535)),
        ] {
            assert_eq!(s.parse::<Granularity>().unwrap(), g);
            assert_eq!(g.to_string(), s);
        }
        assert_eq!(
            "flowcell:1".parse::<Granularity>().unwrap(),
            Granularity::Packet
        );
        for bad in [
            "flowcell:0",
            "flowcell:65536",
            "flowcell:",
            "cell:4",
            "Packet",
        ] {
            let err = bad.parse::<Granularity>().unwrap_err();
            assert!(
                err.contains(bad) && err.contains("flowcell:N"),
                "{bad}: {err}"
            );
        }
        assert_eq!(Granularity::Flowcell(4).segs(), Some(4));
        assert_eq!(Granularity::Burst.segs(), None);
    }

    #[test]
    fn a_run_time_granularity_is_saved_read_back_and_cleared() {
        let dir = tempfile::Builder::new()
            .prefix("sopa-granularity-")
            .tempdir()
            .unwrap();
        let node = dir.path().join("h0");
        assert_eq!(RuntimeGranularity::load(&node).unwrap(), None);
        let g = RuntimeGranularity::new(Granularity::Flowcell(8));
        g.save(&node).unwrap();
        assert_eq!(RuntimeGranularity::load(&node).unwrap(), Some(g));
        RuntimeGranularity::clear(&node).unwrap();
        assert_eq!(RuntimeGranularity::load(&node).unwrap(), None);
        std::fs::create_dir_all(&node).unwrap();
        std::fs::write(
            node.join(FILE),
            "{\"granularity\":\"flowcell:0\",\"set_unix\":1}",
        )
        .unwrap();
        let err = RuntimeGranularity::load(&node).unwrap_err().to_string();
        assert!(
            err.contains("flowcell:0") && err.contains("--granularity"),
            "{err}"
        );
    }
}
