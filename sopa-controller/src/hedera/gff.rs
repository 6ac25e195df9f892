//! Global First Fit (Hedera, section 4.3): an elephant goes on the first candidate path whose
//! every link, in the direction it is crossed, has room left for the flow's demand; the
//! reservation holds until the flow ends or goes quiet.

use std::collections::HashMap;

use sopa_topology::{
    Topology,
    graph::{LinkId, NodeId, Speed},
    modric::ModricParams,
    paths::{Failures, Hops},
    topology::TopologySpec,
};

/// A link in the direction a flow crosses it: `true` from the link's `a` end to its `b` end.
pub type Directed = (LinkId, bool);

/// Reserved demand per directed link, in units of the host NIC rate.
#[derive(Clone, Debug, Default)]
pub struct Reservations(HashMap<Directed, f64>);

impl Reservations {
    pub fn reserve(&mut self, links: &[Directed], demand: f64) {
        for l in links {
            *self.0.entry(*l).or_default() += demand;
        }
    }

    pub fn load(&self, link: Directed) -> f64 {
        self.0.get(&link).copied().unwrap_or(0.0)
    }
}

/// A candidate path of one flow: its hop bytes and every link from the source host to the
/// destination host, directed.
#[derive(Clone, Debug)]
pub struct Route {
    pub hops: Hops,
    pub links: Vec<Directed>,
}

/// Each link's capacity in NIC units: S2 links run at the host rate, S1 at s1/s2 of it.
pub fn capacity(topo: &Topology, link: LinkId) -> f64 {
    match topo.graph().links[link as usize].speed {
        Speed::S2 => 1.0,
        Speed::S1 => match topo.spec() {
            TopologySpec::Modric(ModricParams {
                s1_gbps, s2_gbps, ..
            }) if s2_gbps > 0.0 => s1_gbps / s2_gbps,
            _ => 1.0,
        },
    }
}

/// The live candidate paths from host `src` to host `dst`, in the topology's order (the order
/// First Fit searches). Empty when both hosts share a rack: there is nothing to choose.
pub fn routes(topo: &Topology, failures: &Failures, src: NodeId, dst: NodeId) -> Vec<Route> {
    let g = topo.graph();
    let Ok(rack) = topo.rack_of(dst) else {
        return Vec::new();
    };
    let last = topo.host_link(dst);
    let mut out = Vec::new();
    topo.paths_to_rack(src, &rack, |hop0, hop1, links| {
        let mut all: Vec<LinkId> = links.to_vec();
        all.push(last);
        if !all.iter().all(|l| failures.usable(g, *l)) {
            return;
        }
        let mut at = src;
        let links = all
            .iter()
            .map(|&l| {
                let link = &g.links[l as usize];
                let forward = link.a == at;
                at = link.other(at);
                (l, forward)
            })
            .collect();
        out.push(Route {
            hops: Hops { hop0, hop1 },
            links,
        });
    });
    out
}

/// The first route with room for `demand` on every link, by index.
pub fn first_fit(
    topo: &Topology,
    routes: &[Route],
    demand: f64,
    reserved: &Reservations,
) -> Option<usize> {
    const SLACK: f64 = 1e-9;
    routes.iter().position(|r| {
        r.links
            .iter()
            .all(|&l| reserved.load(l) + demand <= capacity(topo, l.0) + SLACK)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ft4() -> Topology {
        Topology::build(&TopologySpec::FatTree { k: 4 }).unwrap()
    }

    fn host(t: &Topology, name: &str) -> NodeId {
        t.graph().find(name).unwrap()
    }

    #[test]
    fn routes_cover_every_path_and_both_host_links() {
        let t = ft4();
        let f = Failures::none(t.graph());
        let r = routes(&t, &f, host(&t, "h0"), host(&t, "h4"));
        assert_eq!(r.len(), 4, "(k/2)^2 inter-pod paths");
        for route in &r {
            assert_eq!(route.links.len(), 6, "h0 e0 a c a e h4");
            assert_eq!(route.links[0].0, t.host_link(host(&t, "h0")));
            assert_eq!(route.links[5].0, t.host_link(host(&t, "h4")));
        }
        assert!(routes(&t, &f, host(&t, "h0"), host(&t, "h1")).is_empty());
    }

    /// Two elephants from different racks of pod 0 to different racks of pod 1: both take
    /// path (0, 0) under a colliding hash, sharing a0-c0 and c0-a2. First Fit puts the second on
    /// the first path that shares no full link.
    #[test]
    fn colliding_elephants_end_up_disjoint() {
        let t = ft4();
        let f = Failures::none(t.graph());
        let mut res = Reservations::default();
        let r1 = routes(&t, &f, host(&t, "h0"), host(&t, "h4"));
        let first = first_fit(&t, &r1, 1.0, &res).unwrap();
        assert_eq!(r1[first].hops, Hops { hop0: 0, hop1: 0 });
        res.reserve(&r1[first].links, 1.0);
        let r2 = routes(&t, &f, host(&t, "h2"), host(&t, "h6"));
        let second = first_fit(&t, &r2, 1.0, &res).unwrap();
        assert_eq!(r2[second].hops, Hops { hop0: 0, hop1: 1 });
        let shared: Vec<_> = r2[second]
            .links
            .iter()
            .filter(|l| r1[first].links.contains(l))
            .collect();
        assert!(shared.is_empty(), "disjoint: {shared:?}");
    }

    #[test]
    fn a_full_fabric_leaves_the_flow_unplaced_and_reverse_directions_are_separate() {
        let t = ft4();
        let f = Failures::none(t.graph());
        let mut res = Reservations::default();
        let there = routes(&t, &f, host(&t, "h0"), host(&t, "h4"));
        let back = routes(&t, &f, host(&t, "h4"), host(&t, "h0"));
        // h0's own NIC is full after one flow of demand 1: nothing else fits from h0.
        res.reserve(&there[0].links, 1.0);
        assert_eq!(first_fit(&t, &there, 0.5, &res), None);
        // The opposite direction of the same links is free.
        assert_eq!(first_fit(&t, &back, 1.0, &res), Some(0));
    }

    #[test]
    fn failed_links_remove_routes() {
        let t = ft4();
        let mut f = Failures::none(t.graph());
        let l = t.resolve_link("a0:c0").unwrap();
        f.set_link(l, true);
        let r = routes(&t, &f, host(&t, "h0"), host(&t, "h4"));
        assert_eq!(r.len(), 3);
        assert!(r.iter().all(|r| r.hops != Hops { hop0: 0, hop1: 0 }));
    }
}
