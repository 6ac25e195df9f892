//! A fabric as a graph: nodes (hosts and switches) with numbered ports, and links between ports.

use std::{collections::HashMap, net::Ipv4Addr};

use serde::Serialize;

pub type NodeId = u32;
pub type LinkId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeKind {
    Host,
    /// Fat-Tree edge (top-of-rack) switch.
    Edge,
    /// Fat-Tree aggregation switch.
    Aggregation,
    /// Fat-Tree core switch.
    Core,
    /// MODRIC access switch (top-of-rack).
    Access,
    /// MODRIC end-point switch (a member of an EPSC).
    Eps,
}

impl NodeKind {
    pub fn is_switch(self) -> bool {
        self != NodeKind::Host
    }
}

/// Link speed classes of the MODRIC paper: S1 the high capacity C, S2 the lower capacity c.
/// Fat-Tree links are all S2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Speed {
    S1,
    S2,
}

#[derive(Clone, Debug, Serialize)]
pub struct Node {
    pub kind: NodeKind,
    pub name: String,
    /// Hosts: their address. Switches: their management address where the scheme defines one.
    pub addr: Option<Ipv4Addr>,
}

#[derive(Clone, Copy, Debug, Serialize)]
pub struct Link {
    pub a: NodeId,
    pub a_port: u16,
    pub b: NodeId,
    pub b_port: u16,
    pub speed: Speed,
}

impl Link {
    pub fn other(&self, node: NodeId) -> NodeId {
        if self.a == node { self.b } else { self.a }
    }
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub links: Vec<Link>,
    /// Per node, per port: (link, neighbour), in port order.
    adjacency: Vec<Vec<(LinkId, NodeId)>>,
    by_name: HashMap<String, NodeId>,
}

impl Graph {
    pub fn add_node(&mut self, kind: NodeKind, name: String, addr: Option<Ipv4Addr>) -> NodeId {
        let id = self.nodes.len() as NodeId;
        self.by_name.insert(name.clone(), id);
        self.nodes.push(Node { kind, name, addr });
        self.adjacency.push(Vec::new());
        id
    }

    /// Links `a` and `b` on their next free ports.
    pub fn add_link(&mut self, a: NodeId, b: NodeId, speed: Speed) -> LinkId {
        let id = self.links.len() as LinkId;
        let a_port = self.adjacency[a as usize].len() as u16;
        let b_port = self.adjacency[b as usize].len() as u16;
        self.links.push(Link {
            a,
            a_port,
            b,
            b_port,
            speed,
        });
        self.adjacency[a as usize].push((id, b));
        self.adjacency[b as usize].push((id, a));
        id
    }

    /// (link, neighbour) per port of `node`.
    pub fn ports(&self, node: NodeId) -> &[(LinkId, NodeId)] {
        &self.adjacency[node as usize]
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    pub fn name(&self, id: NodeId) -> &str {
        &self.nodes[id as usize].name
    }

    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.by_name.get(name).copied()
    }

    /// The links between `a` and `b` (several where the design adds parallel links).
    pub fn links_between(&self, a: NodeId, b: NodeId) -> impl Iterator<Item = LinkId> + '_ {
        self.ports(a)
            .iter()
            .filter(move |(_, n)| *n == b)
            .map(|(l, _)| *l)
    }

    pub fn link_name(&self, link: LinkId) -> String {
        let l = &self.links[link as usize];
        format!("{}:{}", self.name(l.a), self.name(l.b))
    }

    pub fn nodes_of(&self, kind: NodeKind) -> impl Iterator<Item = NodeId> + '_ {
        self.nodes
            .iter()
            .enumerate()
            .filter(move |(_, n)| n.kind == kind)
            .map(|(i, _)| i as NodeId)
    }
}
