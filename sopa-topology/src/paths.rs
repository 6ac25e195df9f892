//! A host's candidate paths: per destination prefix, each path's hop bytes and the exact links
//! it crosses, with the paths that cross a failed link or switch marked dead. Built once, then
//! updated incrementally per failure through a link -> paths index.

use std::fmt;

use serde::Serialize;
use sopa_common::wire::HOP_NONE;

use crate::{
    graph::{Graph, LinkId, NodeId},
    prefix::Prefix,
    topology::{Rack, Topology},
};

/// One path's option bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Hops {
    pub hop0: u8,
    /// [`HOP_NONE`] when the path has one decision.
    pub hop1: u8,
}

impl fmt::Display for Hops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.hop1 == HOP_NONE {
            write!(f, "[{}]", self.hop0)
        } else {
            write!(f, "[{}, {}]", self.hop0, self.hop1)
        }
    }
}

/// Which links and switches are down. A link is usable when it and both its ends are up.
#[derive(Clone, Debug)]
pub struct Failures {
    link_down: Vec<bool>,
    node_down: Vec<bool>,
}

impl Failures {
    pub fn none(graph: &Graph) -> Self {
        Self {
            link_down: vec![false; graph.links.len()],
            node_down: vec![false; graph.nodes.len()],
        }
    }

    /// Marks `link` down or up; returns the links whose usability may have changed.
    pub fn set_link(&mut self, link: LinkId, down: bool) -> Vec<LinkId> {
        self.link_down[link as usize] = down;
        vec![link]
    }

    /// Marks a switch down or up; returns its links.
    pub fn set_node(&mut self, graph: &Graph, node: NodeId, down: bool) -> Vec<LinkId> {
        self.node_down[node as usize] = down;
        graph.ports(node).iter().map(|(l, _)| *l).collect()
    }

    pub fn usable(&self, graph: &Graph, link: LinkId) -> bool {
        let l = &graph.links[link as usize];
        !self.link_down[link as usize]
            && !self.node_down[l.a as usize]
            && !self.node_down[l.b as usize]
    }

    pub fn down_links(&self) -> impl Iterator<Item = LinkId> + '_ {
        self.link_down
            .iter()
            .enumerate()
            .filter(|(_, d)| **d)
            .map(|(i, _)| i as LinkId)
    }

    pub fn down_nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.node_down
            .iter()
            .enumerate()
            .filter(|(_, d)| **d)
            .map(|(i, _)| i as NodeId)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub hops: Hops,
    start: u32,
    len: u32,
    pub alive: bool,
}

#[derive(Clone, Debug)]
pub struct Destination {
    pub rack: Rack,
    pub candidates: Vec<Candidate>,
    pub alive: u32,
}

impl Destination {
    pub fn prefix(&self) -> Prefix {
        self.rack.prefix
    }

    pub fn alive_hops(&self) -> impl Iterator<Item = Hops> + '_ {
        self.candidates.iter().filter(|c| c.alive).map(|c| c.hops)
    }
}

/// Compressed rows: the paths through link `l` are `entries[offsets[l]..offsets[l + 1]]`, each
/// (destination index, candidate index).
type LinkIndex = (Vec<u32>, Vec<(u32, u32)>);

/// The candidate paths of one source host to every other rack.
#[derive(Clone, Debug)]
pub struct PathTable {
    pub source: NodeId,
    pub destinations: Vec<Destination>,
    arena: Vec<LinkId>,
    /// link -> (destination, candidate), built on the first update.
    index: Option<LinkIndex>,
}

impl PathTable {
    /// Every candidate path of `src`, with the dead ones marked under `failures`.
    pub fn compute(topo: &Topology, src: NodeId, failures: &Failures) -> crate::Result<Self> {
        let own = topo.rack_of(src)?;
        let graph = topo.graph();
        let mut arena = Vec::new();
        let mut destinations = Vec::new();
        for rack in topo.racks() {
            if rack.tor == own.tor {
                continue;
            }
            let mut candidates = Vec::new();
            let mut alive = 0;
            topo.paths_to_rack(src, &rack, |hop0, hop1, links| {
                let ok = links.iter().all(|l| failures.usable(graph, *l));
                alive += u32::from(ok);
                candidates.push(Candidate {
                    hops: Hops { hop0, hop1 },
                    start: arena.len() as u32,
                    len: links.len() as u32,
                    alive: ok,
                });
                arena.extend_from_slice(links);
            });
            destinations.push(Destination {
                rack,
                candidates,
                alive,
            });
        }
        Ok(Self {
            source: src,
            destinations,
            arena,
            index: None,
        })
    }

    /// The links `candidate` crosses, in order, from the source host to the destination rack's
    /// switch.
    pub fn links(&self, candidate: &Candidate) -> &[LinkId] {
        &self.arena[candidate.start as usize..(candidate.start + candidate.len) as usize]
    }

    pub fn path_count(&self) -> usize {
        self.destinations.iter().map(|d| d.candidates.len()).sum()
    }

    pub fn alive_count(&self) -> usize {
        self.destinations.iter().map(|d| d.alive as usize).sum()
    }

    fn build_index(&mut self, links: usize) {
        let mut offsets = vec![0u32; links + 1];
        for d in &self.destinations {
            for c in &d.candidates {
                for l in self.links(c) {
                    offsets[*l as usize + 1] += 1;
                }
            }
        }
        for i in 0..links {
            offsets[i + 1] += offsets[i];
        }
        let mut fill = offsets.clone();
        let mut entries = vec![(0u32, 0u32); offsets[links] as usize];
        for (di, d) in self.destinations.iter().enumerate() {
            for (ci, c) in d.candidates.iter().enumerate() {
                for l in &self.arena[c.start as usize..(c.start + c.len) as usize] {
                    let slot = &mut fill[*l as usize];
                    entries[*slot as usize] = (di as u32, ci as u32);
                    *slot += 1;
                }
            }
        }
        self.index = Some((offsets, entries));
    }

    /// Re-evaluates only the paths crossing `changed` links under `failures`; returns the
    /// indices of destinations whose set of live paths changed.
    pub fn update(&mut self, graph: &Graph, failures: &Failures, changed: &[LinkId]) -> Vec<usize> {
        if self.index.is_none() {
            self.build_index(graph.links.len());
        }
        let (offsets, entries) = self.index.take().expect("built above");
        let mut touched = Vec::new();
        for &link in changed {
            let range = offsets[link as usize] as usize..offsets[link as usize + 1] as usize;
            for &(di, ci) in &entries[range] {
                let c = self.destinations[di as usize].candidates[ci as usize];
                let ok = self.links(&c).iter().all(|l| failures.usable(graph, *l));
                if ok != c.alive {
                    let d = &mut self.destinations[di as usize];
                    d.candidates[ci as usize].alive = ok;
                    if ok {
                        d.alive += 1;
                    } else {
                        d.alive -= 1;
                    }
                    touched.push(di as usize);
                }
            }
        }
        self.index = Some((offsets, entries));
        touched.sort_unstable();
        touched.dedup();
        touched
    }

    /// The table as the datapath takes it: prefix -> live hop pairs (prefixes with none left
    /// are listed with an empty set).
    pub fn hops_by_prefix(&self) -> Vec<(Prefix, Vec<Hops>)> {
        self.destinations
            .iter()
            .map(|d| (d.prefix(), d.alive_hops().collect()))
            .collect()
    }
}
