//! Fat-Tree(k) of Al-Fares et al.: k pods of k/2 edge and k/2 aggregation switches, (k/2)^2 core
//! switches, k^3/4 hosts. Host (pod p, edge e, index i) is `10.p.e.(2+i)`; edge switch (p, e) is
//! `10.p.e.1`, aggregation switch (p, a) `10.p.(k/2+a).1`, core (group a, index j)
//! `10.k.(a+1).(j+1)`.
//!
//! Ports: an edge switch's ports 0..k/2 face its hosts and k/2+a faces aggregation switch a; an
//! aggregation switch's port e faces edge e and k/2+j faces core j of its group; a core switch's
//! port p faces pod p. Core group a is the (k/2) cores that aggregation switches of index a reach.
//!
//! Node names follow the SOPA paper's figures, numbered from 0: hosts `h0..`, edge switches
//! `e0..`, aggregation switches `a0..` (pod-major), cores `c0..` (group-major).

use std::net::Ipv4Addr;

use crate::{
    Error, Result,
    graph::{Graph, LinkId, NodeId, NodeKind, Speed},
    prefix::Prefix,
};

#[derive(Clone, Debug)]
pub struct FatTree {
    pub k: u32,
    pub graph: Graph,
}

/// A host's coordinates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostAt {
    pub pod: u32,
    pub edge: u32,
    pub index: u32,
}

impl FatTree {
    pub const MIN_K: u32 = 4;
    pub const MAX_K: u32 = 64;

    pub fn new(k: u32) -> Result<Self> {
        if !(Self::MIN_K..=Self::MAX_K).contains(&k) || !k.is_multiple_of(2) {
            return Err(Error::Invalid(format!(
                "Fat-Tree k = {k}: k must be even, from {} to {}",
                Self::MIN_K,
                Self::MAX_K
            )));
        }
        let h = k / 2;
        let mut g = Graph::default();
        for pod in 0..k {
            for edge in 0..h {
                for i in 0..h {
                    let id = (pod * h + edge) * h + i;
                    let addr = Ipv4Addr::new(10, pod as u8, edge as u8, (2 + i) as u8);
                    g.add_node(NodeKind::Host, format!("h{id}"), Some(addr));
                }
            }
        }
        for pod in 0..k {
            for edge in 0..h {
                let addr = Ipv4Addr::new(10, pod as u8, edge as u8, 1);
                g.add_node(NodeKind::Edge, format!("e{}", pod * h + edge), Some(addr));
            }
        }
        for pod in 0..k {
            for a in 0..h {
                let addr = Ipv4Addr::new(10, pod as u8, (h + a) as u8, 1);
                g.add_node(
                    NodeKind::Aggregation,
                    format!("a{}", pod * h + a),
                    Some(addr),
                );
            }
        }
        for a in 0..h {
            for j in 0..h {
                let addr = Ipv4Addr::new(10, k as u8, (a + 1) as u8, (j + 1) as u8);
                g.add_node(NodeKind::Core, format!("c{}", a * h + j), Some(addr));
            }
        }
        let ft = Self { k, graph: g };
        let mut g = ft.graph.clone();
        // Link order is fixed so that link ids are computable (see the *_link functions).
        for host in 0..ft.hosts() {
            let at = ft.host_at(host);
            g.add_link(host, ft.edge(at.pod, at.edge), Speed::S2);
        }
        for pod in 0..k {
            for edge in 0..h {
                for a in 0..h {
                    g.add_link(ft.edge(pod, edge), ft.agg(pod, a), Speed::S2);
                }
            }
        }
        for pod in 0..k {
            for a in 0..h {
                for j in 0..h {
                    g.add_link(ft.agg(pod, a), ft.core(a, j), Speed::S2);
                }
            }
        }
        Ok(Self { k, graph: g })
    }

    fn half(&self) -> u32 {
        self.k / 2
    }

    pub fn hosts(&self) -> u32 {
        self.k * self.k * self.k / 4
    }

    pub fn host_at(&self, host: NodeId) -> HostAt {
        let h = self.half();
        HostAt {
            pod: host / (h * h),
            edge: (host / h) % h,
            index: host % h,
        }
    }

    pub fn host(&self, pod: u32, edge: u32, index: u32) -> NodeId {
        let h = self.half();
        (pod * h + edge) * h + index
    }

    pub fn edge(&self, pod: u32, edge: u32) -> NodeId {
        self.hosts() + pod * self.half() + edge
    }

    pub fn agg(&self, pod: u32, a: u32) -> NodeId {
        self.hosts() + self.k * self.half() + pod * self.half() + a
    }

    pub fn core(&self, group: u32, j: u32) -> NodeId {
        self.hosts() + 2 * self.k * self.half() + group * self.half() + j
    }

    /// The link between host `host` and its edge switch.
    pub fn host_link(&self, host: NodeId) -> LinkId {
        host
    }

    /// The link between edge (pod, edge) and aggregation (pod, a).
    pub fn edge_link(&self, pod: u32, edge: u32, a: u32) -> LinkId {
        let h = self.half();
        self.hosts() + (pod * h + edge) * h + a
    }

    /// The link between aggregation (pod, a) and core (a, j).
    pub fn core_link(&self, pod: u32, a: u32, j: u32) -> LinkId {
        let h = self.half();
        2 * self.hosts() + (pod * h + a) * h + j
    }

    /// The destination prefix of the hosts under edge (pod, edge).
    pub fn edge_prefix(&self, pod: u32, edge: u32) -> Prefix {
        Prefix::of(Ipv4Addr::new(10, pod as u8, edge as u8, 0), 24)
    }

    /// The host with address `addr`.
    pub fn host_by_addr(&self, addr: Ipv4Addr) -> Option<NodeId> {
        let [a, pod, edge, i] = addr.octets();
        let (pod, edge, i) = (u32::from(pod), u32::from(edge), u32::from(i));
        (a == 10 && pod < self.k && edge < self.half() && (2..2 + self.half()).contains(&i))
            .then(|| self.host(pod, edge, i - 2))
    }

    /// Appends the candidate paths from `src` to the hosts of edge (pod, edge), as
    /// (hop0, hop1, links) through `push`; the destination host's own link is not included.
    pub fn paths_to_edge(
        &self,
        src: NodeId,
        pod: u32,
        edge: u32,
        mut push: impl FnMut(u8, u8, &[LinkId]),
    ) {
        let s = self.host_at(src);
        let h = self.half();
        let first = self.host_link(src);
        if s.pod == pod && s.edge == edge {
            return;
        }
        for a in 0..h {
            if s.pod == pod {
                push(
                    a as u8,
                    sopa_common::wire::HOP_NONE,
                    &[
                        first,
                        self.edge_link(s.pod, s.edge, a),
                        self.edge_link(pod, edge, a),
                    ],
                );
                continue;
            }
            for j in 0..h {
                push(
                    a as u8,
                    j as u8,
                    &[
                        first,
                        self.edge_link(s.pod, s.edge, a),
                        self.core_link(s.pod, a, j),
                        self.core_link(pod, a, j),
                        self.edge_link(pod, edge, a),
                    ],
                );
            }
        }
    }
}
