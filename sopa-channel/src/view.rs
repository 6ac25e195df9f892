//! An agent's view of the fabric, built from a snapshot and moved forward by deltas. Every
//! message is checked completely before anything changes: a bad delta leaves the view as it was.

use sopa_topology::{LinkId, Topology, paths::Failures, srv6::Encoding, topology::TopologySpec};

use crate::proto::{Delta, LinkRef, Snapshot, change};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ViewError {
    #[error("topology spec does not parse: {0}")]
    BadSpec(String),
    #[error("invalid topology: {0}")]
    BadTopology(String),
    #[error("delta of epoch {got} on a view of epoch {have}: resync")]
    WrongEpoch { have: u64, got: u64 },
    #[error("delta {version} builds on version {base}, but this view is at {have}: resync")]
    Gap { have: u64, base: u64, version: u64 },
    #[error("version {version} is not newer than the applied {have}")]
    Stale { have: u64, version: u64 },
    #[error("unknown link {0}:{1}")]
    UnknownLink(String, String),
    #[error("unknown switch {0:?}")]
    UnknownSwitch(String),
    #[error("a change without content")]
    Empty,
    #[error("{0}")]
    BadEncoding(String),
}

impl ViewError {
    /// Whether the agent should ask for a fresh snapshot rather than just reject the message.
    pub fn needs_resync(&self) -> bool {
        matches!(self, Self::WrongEpoch { .. } | Self::Gap { .. })
    }
}

pub struct FabricView {
    pub epoch: u64,
    pub version: u64,
    pub spec: TopologySpec,
    pub topology: Topology,
    pub failures: Failures,
    pub encoding: Encoding,
}

/// A validated change: the links whose state to set, or the switch.
enum Resolved {
    Links(Vec<LinkId>, bool),
    Switch(u32, bool),
}

impl FabricView {
    pub fn from_snapshot(s: &Snapshot) -> Result<Self, ViewError> {
        let spec: TopologySpec =
            serde_json::from_str(&s.topology).map_err(|e| ViewError::BadSpec(e.to_string()))?;
        let topology = Topology::build(&spec).map_err(|e| ViewError::BadTopology(e.to_string()))?;
        let encoding = match s.encoding.as_str() {
            "" => Encoding::Ipv4Option,
            e => e.parse().map_err(ViewError::BadEncoding)?,
        };
        if encoding == Encoding::Srv6 {
            // Every switch needs a uSID: refused before anything is applied.
            sopa_topology::srv6::Usids::of(&topology)
                .map_err(|e| ViewError::BadTopology(e.to_string()))?;
        }
        if encoding == Encoding::Entropy {
            sopa_topology::entropy::check(&topology)
                .map_err(|e| ViewError::BadTopology(e.to_string()))?;
        }
        let mut failures = Failures::none(topology.graph());
        let mut resolved = Vec::new();
        for l in &s.down_links {
            resolved.push(resolve_link(&topology, l, true)?);
        }
        for n in &s.down_switches {
            resolved.push(resolve_switch(&topology, n, true)?);
        }
        for r in &resolved {
            apply(&topology, &mut failures, r);
        }
        Ok(Self {
            epoch: s.epoch,
            version: s.version,
            spec,
            topology,
            failures,
            encoding,
        })
    }

    /// Applies `d` on top of this view; returns the links whose usability may have changed.
    pub fn apply_delta(&mut self, d: &Delta) -> Result<Vec<LinkId>, ViewError> {
        if d.epoch != self.epoch {
            return Err(ViewError::WrongEpoch {
                have: self.epoch,
                got: d.epoch,
            });
        }
        if d.version <= self.version {
            return Err(ViewError::Stale {
                have: self.version,
                version: d.version,
            });
        }
        if d.base_version != self.version {
            return Err(ViewError::Gap {
                have: self.version,
                base: d.base_version,
                version: d.version,
            });
        }
        let mut resolved = Vec::with_capacity(d.changes.len());
        for c in &d.changes {
            resolved.push(match &c.kind {
                Some(change::Kind::Link(l)) => resolve_link(
                    &self.topology,
                    l.link.as_ref().ok_or(ViewError::Empty)?,
                    l.down,
                )?,
                Some(change::Kind::Switch(s)) => resolve_switch(&self.topology, &s.name, s.down)?,
                None => return Err(ViewError::Empty),
            });
        }
        let mut changed = Vec::new();
        for r in &resolved {
            changed.extend(apply(&self.topology, &mut self.failures, r));
        }
        self.version = d.version;
        Ok(changed)
    }
}

fn resolve_link(t: &Topology, l: &LinkRef, down: bool) -> Result<Resolved, ViewError> {
    let g = t.graph();
    let unknown = || ViewError::UnknownLink(l.a.clone(), l.b.clone());
    let a = g.find(&l.a).ok_or_else(unknown)?;
    let b = g.find(&l.b).ok_or_else(unknown)?;
    let links: Vec<LinkId> = g.links_between(a, b).collect();
    if links.is_empty() {
        return Err(unknown());
    }
    Ok(Resolved::Links(links, down))
}

fn resolve_switch(t: &Topology, name: &str, down: bool) -> Result<Resolved, ViewError> {
    let g = t.graph();
    let n = g.find(name).filter(|n| g.node(*n).kind.is_switch());
    n.map(|n| Resolved::Switch(n, down))
        .ok_or_else(|| ViewError::UnknownSwitch(name.to_owned()))
}

fn apply(t: &Topology, failures: &mut Failures, r: &Resolved) -> Vec<LinkId> {
    match r {
        Resolved::Links(links, down) => links
            .iter()
            .flat_map(|l| failures.set_link(*l, *down))
            .collect(),
        Resolved::Switch(n, down) => failures.set_node(t.graph(), *n, *down),
    }
}
