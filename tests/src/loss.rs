//! Packets lost in the fabric, counted one by one: a flow's packets captured where they enter
//! the fabric (the sender's rack switch port) and where they leave it (the receiver's
//! interface), matched by IPv4 ID (in the SRv6 encoding, the IPv4 packet inside the outer
//! header; its uSID list tells the path). A packet lost is one that entered and never left; the times
//! are the kernel's receive times at the entry, so the loss window can be set against the
//! moment of a failure.

use std::{
    collections::{BTreeSet, HashMap},
    net::Ipv4Addr,
    time::SystemTime,
};

use sopa_common::srv6::{LIB_BASE, USID_SLOTS};
use sopa_topology::{
    PathTable,
    paths::Failures,
    srv6::{Encoding, host_plan},
};

use crate::{
    Result,
    capture::{Capture, Captured, unwrap_ids},
    fabric::Fabric,
};

/// A packet a capture saw: unwrapped IPv4 ID, receive time, and the path its option named
/// (hop0, hop1), if it carried the fabric's option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub id: i64,
    pub at: SystemTime,
    pub hops: Option<(u8, u8)>,
}

/// A flow's paths in the SRv6 encoding: the uSIDs of its list before the destination host's
/// -> the path's hop bytes.
pub type UsidPaths = HashMap<Vec<u16>, (u8, u8)>;

/// The paths of `src`'s flows to `dst` (host names) as uSID lists, for a fabric in the SRv6
/// encoding (empty in the option's).
pub fn usid_paths(f: &Fabric, src: &str, dst: &str) -> Result<UsidPaths> {
    if f.encoding != Encoding::Srv6 {
        return Ok(UsidPaths::new());
    }
    let fail = |e: sopa_topology::Error| crate::Error::Failed(e.to_string());
    let g = f.topo.graph();
    let (s, d) = (g.find(src).expect("a host"), g.find(dst).expect("a host"));
    let table = PathTable::compute(&f.topo, s, &Failures::none(g)).map_err(fail)?;
    let plan = host_plan(&f.topo, &table).map_err(fail)?;
    let rack = f.topo.rack_of(d).map_err(fail)?;
    let mut out = UsidPaths::new();
    for dest in plan.destinations.iter().filter(|x| x.prefix == rack.prefix) {
        for (hops, list) in &dest.chosen {
            let key = list.iter().chain(&dest.tail).copied().collect();
            out.insert(key, (hops.hop0, hops.hop1));
        }
    }
    Ok(out)
}

/// The TCP packets from `src` to `dst` a capture saw, in capture order; SRv6 frames are read
/// by the IPv4 packet inside, their path looked up in `usids`.
pub fn packets(c: &Captured, src: Ipv4Addr, dst: Ipv4Addr, usids: &UsidPaths) -> Vec<Seen> {
    let mut raw = Vec::new();
    for (frame, at) in c.frames.iter().zip(&c.times) {
        let srv6 = crate::capture::srv6(frame).filter(|f| {
            f.inner_next == sopa_common::srv6::NEXTHDR_IPV4 && frame.len() > f.inner + 20
        });
        let (inner, path) = if let Some(f) = srv6 {
            let list: Vec<u16> = f.dst.octets()[4..]
                .chunks(2)
                .take(USID_SLOTS)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .take_while(|u| *u != 0 && *u < LIB_BASE)
                .collect();
            (f.inner, Some(usids.get(&list).copied()))
        } else if frame.len() >= 34 && frame[12..14] == [8, 0] {
            (14, None)
        } else {
            continue;
        };
        let Ok(ip) = etherparse::Ipv4HeaderSlice::from_slice(&frame[inner..]) else {
            continue;
        };
        if ip.source_addr() == src
            && ip.destination_addr() == dst
            && ip.protocol() == etherparse::IpNumber::TCP
        {
            let o = crate::capture::unmarked(ip.options());
            let hops = path.unwrap_or_else(|| {
                (o.len() == 4
                    && o[0] == sopa_common::wire::OPTION_TYPE
                    && o[1] == sopa_common::wire::OPTION_LEN)
                    .then(|| (o[2], o[3]))
            });
            raw.push((ip.identification(), *at, hops));
        }
    }
    let ids: Vec<(u16, u8, usize)> = raw
        .iter()
        .enumerate()
        .map(|(i, (id, _, _))| (*id, 0, i))
        .collect();
    unwrap_ids(&ids)
        .into_iter()
        .map(|(id, _, i)| Seen {
            id,
            at: raw[i].1,
            hops: raw[i].2,
        })
        .collect()
}

/// One direction of one flow.
#[derive(Clone, Debug)]
pub struct Loss {
    pub what: String,
    pub entered: usize,
    /// The packets that entered and never left, as they entered.
    pub lost: Vec<Seen>,
    /// Frames a capture could not keep up with (the count is a lower bound if not 0).
    pub capture_drops: u32,
}

impl Loss {
    pub fn of(
        what: &str,
        (entered, left): (&Captured, &Captured),
        src: Ipv4Addr,
        dst: Ipv4Addr,
        usids: &UsidPaths,
    ) -> Self {
        let sent = packets(entered, src, dst, usids);
        let arrived: BTreeSet<i64> = packets(left, src, dst, usids)
            .into_iter()
            .map(|p| p.id)
            .collect();
        // A packet still on its way when the captures stopped is not lost: only those sent
        // before the last one that arrived count.
        let last = arrived.iter().next_back().copied().unwrap_or(i64::MIN);
        let lost = sent
            .iter()
            .filter(|p| p.id < last && !arrived.contains(&p.id))
            .copied()
            .collect();
        Self {
            what: what.to_owned(),
            entered: sent.len(),
            lost,
            capture_drops: entered.dropped + left.dropped,
        }
    }

    /// From the first lost packet's entry to the last's, in milliseconds after `onset`
    /// (negative before it).
    pub fn window_ms(&self, onset: SystemTime) -> Option<(f64, f64)> {
        let first = self.lost.iter().map(|p| p.at).min()?;
        let last = self.lost.iter().map(|p| p.at).max()?;
        Some((ms_after(first, onset), ms_after(last, onset)))
    }

    /// Lost packets that entered at or after `onset` minus `slack_ms`: those a failure at
    /// `onset` can have cost (a loss long before it is the queues' own).
    pub fn since(&self, onset: SystemTime, slack_ms: f64) -> usize {
        self.lost
            .iter()
            .filter(|p| ms_after(p.at, onset) >= -slack_ms)
            .count()
    }

    pub fn report(&self, onset: SystemTime) -> String {
        format!(
            "{}: {} of {} packets lost{}",
            self.what,
            self.lost.len(),
            self.entered,
            match self.window_ms(onset) {
                Some((a, b)) => format!(", entered {a:.1} .. {b:.1} ms after the onset"),
                None => String::new(),
            }
        )
    }
}

/// Milliseconds from `onset` to `t` (negative before it).
pub fn ms_after(t: SystemTime, onset: SystemTime) -> f64 {
    match t.duration_since(onset) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    }
}

/// Captures at both ends of every flow `(src, dst)` (host names) of a fabric.
pub struct FlowCaptures {
    flows: Vec<(String, String, Capture, Capture)>,
    addrs: Vec<(Ipv4Addr, Ipv4Addr)>,
    usids: Vec<UsidPaths>,
}

impl FlowCaptures {
    /// Starts capturing where each flow's packets enter the fabric (the port of the sender's
    /// rack switch that faces it) and where they leave it (the receiver's interface).
    pub fn start(f: &Fabric, flows: &[(String, String)]) -> Result<Self> {
        let g = f.topo.graph();
        let mut out = Vec::new();
        let mut addrs = Vec::new();
        let mut usids = Vec::new();
        for (src, dst) in flows {
            usids.push(usid_paths(f, src, dst)?);
            let (s, d) = (g.find(src).expect("a host"), g.find(dst).expect("a host"));
            let tor = f
                .topo
                .rack_of(s)
                .map_err(|e| crate::Error::Failed(e.to_string()))?
                .tor;
            let tor = g.name(tor);
            let entering = Capture::start(f.ns(tor), &f.link_iface(tor, src))?;
            let leaving = Capture::start(f.ns(dst), &f.host_ifaces[&d])?;
            out.push((src.clone(), dst.clone(), entering, leaving));
            addrs.push((
                g.node(s).addr.expect("hosts have addresses"),
                g.node(d).addr.expect("hosts have addresses"),
            ));
        }
        Ok(Self {
            flows: out,
            addrs,
            usids,
        })
    }

    /// Stops every capture; one [`Loss`] per flow, in the order given.
    pub fn finish(self) -> Result<Vec<Loss>> {
        let mut out = Vec::new();
        for (((src, dst, entering, leaving), (s, d)), usids) in
            self.flows.into_iter().zip(self.addrs).zip(self.usids)
        {
            let (entering, leaving) = (entering.finish()?, leaving.finish()?);
            out.push(Loss::of(
                &format!("{src} -> {dst}"),
                (&entering, &leaving),
                s,
                d,
                &usids,
            ));
        }
        Ok(out)
    }
}
