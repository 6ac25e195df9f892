//! The controller's fabric: the topology spec, which links and switches are down, and a version
//! per change, with the recent deltas kept so a reconnecting agent can catch up without a
//! snapshot.

use std::{
    collections::{BTreeSet, VecDeque},
    path::Path,
};

use serde::Deserialize;
use sopa_topology::{Topology, paths::Failures, topology::TopologySpec};

use crate::proto::{Change, Delta, LinkChange, LinkRef, Snapshot, SwitchChange, change};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FabricError {
    #[error("topology spec {path}: {message}")]
    Spec { path: String, message: String },
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    #[error("no link between {0} and {1}")]
    NoLink(String, String),
    #[error("{0} is a host, not a switch")]
    NotASwitch(String),
    #[error("invalid topology: {0}")]
    Topology(String),
}

/// The topology spec file the controller loads.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpecFile {
    topology: TopologySpec,
}

/// How many deltas the controller keeps for agents catching up.
pub const HISTORY: usize = 4096;

pub struct Fabric {
    spec_json: String,
    topology: Topology,
    epoch: u64,
    version: u64,
    down_links: BTreeSet<(String, String)>,
    down_switches: BTreeSet<String>,
    history: VecDeque<Delta>,
}

/// A link named by its ends, in a canonical order.
fn key(a: &str, b: &str) -> (String, String) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

impl Fabric {
    /// A fabric at version 1 with everything up; `epoch` identifies this controller run.
    pub fn new(spec: TopologySpec, epoch: u64) -> Result<Self, FabricError> {
        let topology = Topology::build(&spec).map_err(|e| FabricError::Topology(e.to_string()))?;
        Ok(Self {
            spec_json: serde_json::to_string(&spec).expect("specs serialize"),
            topology,
            epoch,
            version: 1,
            down_links: BTreeSet::new(),
            down_switches: BTreeSet::new(),
            history: VecDeque::new(),
        })
    }

    /// Parses a topology spec file:
    ///
    /// ```toml
    /// [topology]
    /// kind = "fat-tree"      # or "modric" with m, n, q, x, y [, s1_gbps, s2_gbps, [topology.bits]]
    /// k = 4
    /// ```
    pub fn parse_spec(text: &str, path: &str) -> Result<TopologySpec, FabricError> {
        let file: SpecFile = toml::from_str(text).map_err(|e| FabricError::Spec {
            path: path.to_owned(),
            message: e.to_string().trim().to_owned(),
        })?;
        // Building it is the consistency check.
        Topology::build(&file.topology).map_err(|e| FabricError::Spec {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Ok(file.topology)
    }

    pub fn load(path: &Path, epoch: u64) -> Result<Self, FabricError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| FabricError::Spec {
            path: name.clone(),
            message: format!("cannot read it: {e}"),
        })?;
        Self::new(Self::parse_spec(&text, &name)?, epoch)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn spec_json(&self) -> &str {
        &self.spec_json
    }

    pub fn down_links(&self) -> Vec<LinkRef> {
        self.down_links
            .iter()
            .map(|(a, b)| LinkRef {
                a: a.clone(),
                b: b.clone(),
            })
            .collect()
    }

    pub fn down_switches(&self) -> Vec<String> {
        self.down_switches.iter().cloned().collect()
    }

    /// The down links and switches as the path computation takes them.
    pub fn failures(&self) -> Failures {
        let g = self.topology.graph();
        let mut f = Failures::none(g);
        for (a, b) in &self.down_links {
            if let (Some(na), Some(nb)) = (g.find(a), g.find(b)) {
                for l in g.links_between(na, nb).collect::<Vec<_>>() {
                    f.set_link(l, true);
                }
            }
        }
        for name in &self.down_switches {
            if let Some(n) = g.find(name) {
                f.set_node(g, n, true);
            }
        }
        f
    }

    /// Checks that `a`-`b` is a link of the topology.
    pub fn check_link(&self, a: &str, b: &str) -> Result<(), FabricError> {
        let g = self.topology.graph();
        let na = g
            .find(a)
            .ok_or_else(|| FabricError::UnknownNode(a.to_owned()))?;
        let nb = g
            .find(b)
            .ok_or_else(|| FabricError::UnknownNode(b.to_owned()))?;
        if g.links_between(na, nb).next().is_none() {
            return Err(FabricError::NoLink(a.to_owned(), b.to_owned()));
        }
        Ok(())
    }

    pub fn check_switch(&self, name: &str) -> Result<(), FabricError> {
        let g = self.topology.graph();
        let n = g
            .find(name)
            .ok_or_else(|| FabricError::UnknownNode(name.to_owned()))?;
        if !g.node(n).kind.is_switch() {
            return Err(FabricError::NotASwitch(name.to_owned()));
        }
        Ok(())
    }

    /// Marks a link down or up (every parallel link between the two nodes). Returns the new
    /// version's delta, or `None` when nothing changed.
    pub fn set_link(&mut self, a: &str, b: &str, down: bool) -> Result<Option<Delta>, FabricError> {
        self.check_link(a, b)?;
        let k = key(a, b);
        let changed = if down {
            self.down_links.insert(k.clone())
        } else {
            self.down_links.remove(&k)
        };
        Ok(changed.then(|| {
            self.record(Change {
                kind: Some(change::Kind::Link(LinkChange {
                    link: Some(LinkRef { a: k.0, b: k.1 }),
                    down,
                })),
            })
        }))
    }

    pub fn set_switch(&mut self, name: &str, down: bool) -> Result<Option<Delta>, FabricError> {
        self.check_switch(name)?;
        let changed = if down {
            self.down_switches.insert(name.to_owned())
        } else {
            self.down_switches.remove(name)
        };
        Ok(changed.then(|| {
            self.record(Change {
                kind: Some(change::Kind::Switch(SwitchChange {
                    name: name.to_owned(),
                    down,
                })),
            })
        }))
    }

    fn record(&mut self, change: Change) -> Delta {
        let delta = Delta {
            epoch: self.epoch,
            version: self.version + 1,
            base_version: self.version,
            changes: vec![change],
        };
        self.version += 1;
        self.history.push_back(delta.clone());
        if self.history.len() > HISTORY {
            self.history.pop_front();
        }
        delta
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            epoch: self.epoch,
            version: self.version,
            topology: self.spec_json.clone(),
            down_links: self.down_links(),
            down_switches: self.down_switches(),
        }
    }

    /// The deltas that bring an agent at (`epoch`, `version`) up to date, or `None` when it
    /// needs a snapshot (another epoch, or older than the history, or ahead of us).
    pub fn deltas_since(&self, epoch: u64, version: u64) -> Option<Vec<Delta>> {
        if epoch != self.epoch || version > self.version || version == 0 {
            return None;
        }
        if version == self.version {
            return Some(Vec::new());
        }
        let first = self.history.front()?.base_version;
        if version < first {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|d| d.base_version >= version)
                .cloned()
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fabric() -> Fabric {
        Fabric::new(TopologySpec::FatTree { k: 4 }, 7).unwrap()
    }

    #[test]
    fn every_change_is_a_version() {
        let mut f = fabric();
        assert_eq!(f.version(), 1);
        let d = f.set_link("e0", "a0", true).unwrap().unwrap();
        assert_eq!((d.base_version, d.version, d.epoch), (1, 2, 7));
        assert!(
            f.set_link("a0", "e0", true).unwrap().is_none(),
            "already down, either order"
        );
        let d = f.set_switch("c0", true).unwrap().unwrap();
        assert_eq!(d.version, 3);
        assert_eq!(
            f.snapshot().down_links,
            vec![LinkRef {
                a: "a0".into(),
                b: "e0".into()
            }]
        );
        assert_eq!(f.snapshot().down_switches, vec!["c0".to_owned()]);
        f.set_link("e0", "a0", false).unwrap().unwrap();
        assert!(f.snapshot().down_links.is_empty());
    }

    #[test]
    fn bad_changes_are_refused_and_change_nothing() {
        let mut f = fabric();
        assert_eq!(
            f.set_link("e0", "c0", true),
            Err(FabricError::NoLink("e0".into(), "c0".into()))
        );
        assert_eq!(
            f.set_link("e0", "zz", true),
            Err(FabricError::UnknownNode("zz".into()))
        );
        assert_eq!(
            f.set_switch("h0", true),
            Err(FabricError::NotASwitch("h0".into()))
        );
        assert_eq!(f.version(), 1);
    }

    #[test]
    fn deltas_since_or_snapshot() {
        let mut f = fabric();
        for (a, b) in [("e0", "a0"), ("e0", "a1"), ("a0", "c0")] {
            f.set_link(a, b, true).unwrap();
        }
        assert_eq!(f.deltas_since(7, 4).unwrap().len(), 0);
        let catch_up = f.deltas_since(7, 2).unwrap();
        assert_eq!(
            catch_up.iter().map(|d| d.version).collect::<Vec<_>>(),
            [3, 4]
        );
        assert!(f.deltas_since(8, 2).is_none(), "another epoch: snapshot");
        assert!(f.deltas_since(7, 9).is_none(), "ahead of us: snapshot");
        assert!(f.deltas_since(7, 0).is_none(), "nothing applied: snapshot");
    }

    #[test]
    fn spec_files_parse_and_are_checked() {
        let ft = Fabric::parse_spec("[topology]\nkind = \"fat-tree\"\nk = 4\n", "t.toml").unwrap();
        assert_eq!(ft, TopologySpec::FatTree { k: 4 });
        let m = Fabric::parse_spec(
            "[topology]\nkind = \"modric\"\nm = 2\nn = 2\nq = 1\nx = 2\ny = 4\n[topology.bits]\nrow = 4\ncol = 4\naccess = 8\nhost = 8\n",
            "m.toml",
        )
        .unwrap();
        assert!(matches!(m, TopologySpec::Modric(p) if p.bits.access == 8));
        for (text, needle) in [
            ("[topology]\nkind = \"fat-tree\"\nk = 5\n", "k must be even"),
            ("[topology]\nkind = \"torus\"\n", "torus"),
            (
                "[topology]\nkind = \"fat-tree\"\nk = 4\nextra = 1\n",
                "extra",
            ),
            ("[topology\n", "line 1"),
            (
                "[topology]\nkind = \"modric\"\nm = 2\nn = 2\nq = 1\nx = 2\ny = 70\n",
                "host bits",
            ),
        ] {
            let err = Fabric::parse_spec(text, "bad.toml")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("bad.toml") && err.contains(needle),
                "{text:?}: {err}"
            );
        }
    }
}
