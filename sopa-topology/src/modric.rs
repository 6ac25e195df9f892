//! MODRIC(m, n, q, x, y): an m x n grid of containers. Each container has four end-point switch
//! clusters (EPSC, ranks 0..3) of q end-point switches (EPS, layers 0..q-1), full mesh inside an
//! EPSC and full mesh between the same-layer EPSes of the four EPSCs; x access switches (AS),
//! each with one S1 link to one EPS of every EPSC (AS a to layer a mod q) and y hosts on S2
//! links. EPSCs of the same rank are linked across every container of the same row and column;
//! when x > m+n-2 (section III-B) each adjacent pair gets ceil(x / (m+n-2)) parallel links so
//! that every EPSC has at least x inter-container links. The t-th inter-container link of an
//! EPSC ends on its layer t mod q.
//!
//! Addressing (section VI-A): a host is `10.<row | col | AS | host>` with a configurable bit
//! split summing to 24 (default 6/6/6/6); the host field is index + 1. Each AS is one
//! destination prefix of length 8 + row + col + AS bits.
//!
//! Names: `eps.R.C.K.L` (row, column, rank, layer), `as.R.C.A`, `h.R.C.A.I`.

use std::{collections::HashMap, net::Ipv4Addr};

use serde::{Deserialize, Serialize};
use sopa_common::wire::HOP_NONE;

use crate::{
    Error, Result,
    graph::{Graph, LinkId, NodeId, NodeKind, Speed},
    prefix::Prefix,
};

/// How the 24 host bits of `10.0.0.0/8` are split.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddressBits {
    pub row: u8,
    pub col: u8,
    pub access: u8,
    pub host: u8,
}

impl Default for AddressBits {
    fn default() -> Self {
        Self {
            row: 6,
            col: 6,
            access: 6,
            host: 6,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModricParams {
    pub m: u32,
    pub n: u32,
    pub q: u32,
    pub x: u32,
    pub y: u32,
    /// Capacity C of S1 links and c of S2 links, Gbit/s.
    #[serde(default = "default_s1")]
    pub s1_gbps: f64,
    #[serde(default = "default_s2")]
    pub s2_gbps: f64,
    #[serde(default)]
    pub bits: AddressBits,
}

fn default_s1() -> f64 {
    10.0
}
fn default_s2() -> f64 {
    1.0
}

impl ModricParams {
    pub fn new(m: u32, n: u32, q: u32, x: u32, y: u32) -> Self {
        Self {
            m,
            n,
            q,
            x,
            y,
            s1_gbps: default_s1(),
            s2_gbps: default_s2(),
            bits: AddressBits::default(),
        }
    }

    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Invalid(format!("MODRIC: {msg}")));
        let b = self.bits;
        if u32::from(b.row) + u32::from(b.col) + u32::from(b.access) + u32::from(b.host) != 24 {
            return bad(format!(
                "address bits {}+{}+{}+{} must sum to 24",
                b.row, b.col, b.access, b.host
            ));
        }
        for (name, v, min) in [
            ("m", self.m, 1),
            ("n", self.n, 1),
            ("q", self.q, 1),
            ("x", self.x, 1),
            ("y", self.y, 1),
        ] {
            if v < min {
                return bad(format!("{name} = {v} must be at least {min}"));
            }
        }
        if self.q > 254 {
            return bad(format!("q = {} EPSes per EPSC is more than 254", self.q));
        }
        let fits = |v: u32, bits: u8| u64::from(v) <= 1u64 << bits;
        if !fits(self.m, b.row) || !fits(self.n, b.col) {
            return bad(format!(
                "a {}x{} grid needs more than {} row bits / {} column bits",
                self.m, self.n, b.row, b.col
            ));
        }
        if !fits(self.x, b.access) {
            return bad(format!(
                "x = {} ASes do not fit {} AS bits",
                self.x, b.access
            ));
        }
        if u64::from(self.y) + 2 > 1u64 << b.host {
            return bad(format!(
                "y = {} hosts per AS do not fit {} host bits (at most {})",
                self.y,
                b.host,
                (1u64 << b.host) - 2
            ));
        }
        if !(self.s1_gbps > 0.0 && self.s2_gbps > 0.0) {
            return bad("link speeds must be positive".into());
        }
        let nodes = u64::from(self.m)
            * u64::from(self.n)
            * u64::from(4 * self.q + self.x + self.x * self.y);
        if nodes > 20_000_000 {
            return bad(format!(
                "{nodes} nodes is more than this model builds (20 million)"
            ));
        }
        Ok(())
    }

    pub fn containers(&self) -> u32 {
        self.m * self.n
    }

    /// Adjacent containers of an EPSC: m-1 in its column and n-1 in its row.
    pub fn neighbours(&self) -> u32 {
        self.m + self.n - 2
    }

    /// Parallel links between two adjacent EPSCs.
    pub fn multiplicity(&self) -> u32 {
        match self.neighbours() {
            0 => 0,
            nb => self.x.div_ceil(nb).max(1),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Modric {
    pub p: ModricParams,
    pub graph: Graph,
    eps: Vec<NodeId>,
    access: Vec<NodeId>,
    host_links: Vec<LinkId>,
    access_links: Vec<LinkId>,
    /// (container, rank) -> q x q matrix of intra-EPSC links.
    intra: Vec<LinkId>,
    inter: HashMap<InterKey, Vec<InterLink>>,
    block: u32,
}

/// A host's coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostAt {
    pub container: u32,
    pub access: u32,
    pub index: u32,
}

const NONE: LinkId = LinkId::MAX;

/// (from container, to container, rank).
type InterKey = (u32, u32, u8);
/// (link, layer at the from side, layer at the to side).
type InterLink = (LinkId, u32, u32);

impl Modric {
    pub fn new(p: ModricParams) -> Result<Self> {
        p.validate()?;
        let (q, x, y) = (p.q, p.x, p.y);
        let mut g = Graph::default();
        let mut eps = Vec::new();
        let mut access = Vec::new();
        let mut host_links = Vec::new();
        let mut access_links = Vec::new();
        let mut intra = vec![NONE; (p.containers() * 4 * q * q) as usize];
        let block = 4 * q + x + x * y;
        let mut s = Self {
            p,
            graph: Graph::default(),
            eps: Vec::new(),
            access: Vec::new(),
            host_links: Vec::new(),
            access_links: Vec::new(),
            intra: Vec::new(),
            inter: HashMap::new(),
            block,
        };
        for c in 0..p.containers() {
            let (row, col) = (c / p.n, c % p.n);
            for r in 0..4 {
                for l in 0..q {
                    eps.push(g.add_node(NodeKind::Eps, format!("eps.{row}.{col}.{r}.{l}"), None));
                }
            }
            for a in 0..x {
                access.push(g.add_node(NodeKind::Access, format!("as.{row}.{col}.{a}"), None));
            }
            for a in 0..x {
                for i in 0..y {
                    let addr = s.host_addr_of(row, col, a, i);
                    g.add_node(NodeKind::Host, format!("h.{row}.{col}.{a}.{i}"), Some(addr));
                }
            }
            let e = |r: u32, l: u32| eps[((c * 4 + r) * q + l) as usize];
            for r in 0..4 {
                for l1 in 0..q {
                    for l2 in l1 + 1..q {
                        let link = g.add_link(e(r, l1), e(r, l2), Speed::S1);
                        let base = ((c * 4 + r) * q * q) as usize;
                        intra[base + (l1 * q + l2) as usize] = link;
                        intra[base + (l2 * q + l1) as usize] = link;
                    }
                }
            }
            for l in 0..q {
                for r1 in 0..4 {
                    for r2 in r1 + 1..4 {
                        g.add_link(e(r1, l), e(r2, l), Speed::S1);
                    }
                }
            }
            for a in 0..x {
                for r in 0..4 {
                    access_links.push(g.add_link(
                        access[(c * x + a) as usize],
                        e(r, a % q),
                        Speed::S1,
                    ));
                }
            }
            for a in 0..x {
                let as_node = access[(c * x + a) as usize];
                for i in 0..y {
                    let host = c * block + 4 * q + x + a * y + i;
                    host_links.push(g.add_link(host, as_node, Speed::S2));
                }
            }
        }
        let mut next_layer = vec![0u32; (p.containers() * 4) as usize];
        let mult = p.multiplicity();
        for r in 0..4u32 {
            for c1 in 0..p.containers() {
                for c2 in c1 + 1..p.containers() {
                    let same_row = c1 / p.n == c2 / p.n;
                    let same_col = c1 % p.n == c2 % p.n;
                    if !(same_row || same_col) {
                        continue;
                    }
                    for _ in 0..mult {
                        let take = |c: u32, next: &mut Vec<u32>| {
                            let slot = &mut next[(c * 4 + r) as usize];
                            let l = *slot % q;
                            *slot += 1;
                            l
                        };
                        let (l1, l2) = (take(c1, &mut next_layer), take(c2, &mut next_layer));
                        let link = g.add_link(
                            eps[((c1 * 4 + r) * q + l1) as usize],
                            eps[((c2 * 4 + r) * q + l2) as usize],
                            Speed::S1,
                        );
                        s.inter
                            .entry((c1, c2, r as u8))
                            .or_default()
                            .push((link, l1, l2));
                        s.inter
                            .entry((c2, c1, r as u8))
                            .or_default()
                            .push((link, l2, l1));
                    }
                }
            }
        }
        s.graph = g;
        s.eps = eps;
        s.access = access;
        s.host_links = host_links;
        s.access_links = access_links;
        s.intra = intra;
        Ok(s)
    }

    fn host_field(&self, row: u32, col: u32, a: u32, i: u32) -> u32 {
        let b = self.p.bits;
        (row << (b.col + b.access + b.host))
            | (col << (b.access + b.host))
            | (a << b.host)
            | (i + 1)
    }

    fn host_addr_of(&self, row: u32, col: u32, a: u32, i: u32) -> Ipv4Addr {
        Ipv4Addr::from((10u32 << 24) | self.host_field(row, col, a, i))
    }

    pub fn hosts(&self) -> u32 {
        self.p.containers() * self.p.x * self.p.y
    }

    /// The node id of host (container, access, index).
    pub fn host(&self, container: u32, a: u32, i: u32) -> NodeId {
        container * self.block + 4 * self.p.q + self.p.x + a * self.p.y + i
    }

    pub fn host_at(&self, host: NodeId) -> Option<HostAt> {
        let (c, off) = (host / self.block, host % self.block);
        let first = 4 * self.p.q + self.p.x;
        (c < self.p.containers() && off >= first).then(|| HostAt {
            container: c,
            access: (off - first) / self.p.y,
            index: (off - first) % self.p.y,
        })
    }

    /// All hosts, in node order.
    pub fn host_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        (0..self.p.containers()).flat_map(move |c| {
            (0..self.p.x * self.p.y).map(move |k| c * self.block + 4 * self.p.q + self.p.x + k)
        })
    }

    pub fn access_switch(&self, container: u32, a: u32) -> NodeId {
        self.access[(container * self.p.x + a) as usize]
    }

    pub fn eps(&self, container: u32, rank: u32, layer: u32) -> NodeId {
        self.eps[((container * 4 + rank) * self.p.q + layer) as usize]
    }

    pub fn access_prefix(&self, container: u32, a: u32) -> Prefix {
        let b = self.p.bits;
        let (row, col) = (container / self.p.n, container % self.p.n);
        let addr = self.host_addr_of(row, col, a, 0);
        Prefix::of(addr, 8 + b.row + b.col + b.access)
    }

    pub fn host_by_addr(&self, addr: Ipv4Addr) -> Option<NodeId> {
        let v = u32::from(addr);
        if v >> 24 != 10 {
            return None;
        }
        let b = self.p.bits;
        let field = |shift: u8, bits: u8| (v >> shift) & ((1u32 << bits) - 1);
        let i = field(0, b.host).checked_sub(1)?;
        let a = field(b.host, b.access);
        let col = field(b.host + b.access, b.col);
        let row = field(b.host + b.access + b.col, b.row);
        (row < self.p.m && col < self.p.n && a < self.p.x && i < self.p.y)
            .then(|| self.host(row * self.p.n + col, a, i))
    }

    fn intra_link(&self, c: u32, r: u32, l1: u32, l2: u32) -> LinkId {
        let q = self.p.q;
        self.intra[((c * 4 + r) * q * q + l1 * q + l2) as usize]
    }

    /// One inter-container hop of rank `r` from `from` (currently at layer `layer`) to `to`:
    /// the parallel link leaving from the current layer if there is one, else the first, reached
    /// through the intra-EPSC mesh. Returns the arrival layer.
    fn hop(&self, from: u32, to: u32, r: u32, layer: u32, links: &mut Vec<LinkId>) -> u32 {
        let choices = &self.inter[&(from, to, r as u8)];
        let &(link, from_layer, to_layer) = choices
            .iter()
            .find(|(_, l, _)| *l == layer)
            .unwrap_or(&choices[0]);
        if from_layer != layer {
            links.push(self.intra_link(from, r, layer, from_layer));
        }
        links.push(link);
        to_layer
    }

    /// Appends the candidate paths from `src` to the hosts of AS `a2` in container `c2` as
    /// (hop0, hop1, links); the destination host's own link is not included. This is the
    /// paper's Algorithm 1 with its choices made explicit: hop0 picks the EPSC rank at the
    /// source AS, hop1 row-first (0) or column-first (1) between containers in neither the same
    /// row nor the same column.
    pub fn paths_to_access(
        &self,
        src: NodeId,
        c2: u32,
        a2: u32,
        mut push: impl FnMut(u8, u8, &[LinkId]),
    ) {
        let Some(s) = self.host_at(src) else { return };
        let (c1, a1) = (s.container, s.access);
        if c1 == c2 && a1 == a2 {
            return;
        }
        let (q, n, x) = (self.p.q, self.p.n, self.p.x);
        let (l1, l2) = (a1 % q, a2 % q);
        let first = self.host_links[((c1 * x + a1) * self.p.y + s.index) as usize];
        let up = |r: u32| self.access_links[((c1 * x + a1) * 4 + r) as usize];
        let down = |r: u32| self.access_links[((c2 * x + a2) * 4 + r) as usize];
        let mut links = Vec::with_capacity(12);
        let finish = |links: &mut Vec<LinkId>, r: u32, layer: u32| {
            if layer != l2 {
                links.push(self.intra_link(c2, r, layer, l2));
            }
            links.push(down(r));
        };
        let (row1, col1, row2, col2) = (c1 / n, c1 % n, c2 / n, c2 % n);
        for r in 0..4 {
            if c1 == c2 || row1 == row2 || col1 == col2 {
                links.clear();
                links.extend([first, up(r)]);
                let layer = if c1 == c2 {
                    l1
                } else {
                    self.hop(c1, c2, r, l1, &mut links)
                };
                finish(&mut links, r, layer);
                push(r as u8, HOP_NONE, &links);
                continue;
            }
            for (dir, mid) in [(0u8, row1 * n + col2), (1u8, row2 * n + col1)] {
                links.clear();
                links.extend([first, up(r)]);
                let layer = self.hop(c1, mid, r, l1, &mut links);
                let layer = self.hop(mid, c2, r, layer, &mut links);
                finish(&mut links, r, layer);
                push(r as u8, dir, &links);
            }
        }
    }

    /// The host link of `host`.
    pub fn host_link(&self, host: NodeId) -> Option<LinkId> {
        let h = self.host_at(host)?;
        Some(self.host_links[((h.container * self.p.x + h.access) * self.p.y + h.index) as usize])
    }
}

impl Modric {
    /// The container a node belongs to.
    pub fn container_of(&self, node: NodeId) -> Option<u32> {
        let c = node / self.block;
        (c < self.p.containers()).then_some(c)
    }
}
