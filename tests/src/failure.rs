//! Failures under traffic: an element of the fabric (a link, a switch) failed for real while
//! flows run, and what the flows saw, sampled from the receivers' interfaces.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, SystemTime},
};

use sopa_topology::{LinkId, PathTable, paths::Failures};

use crate::{Error, Result, fabric::Fabric};

/// What fails.
#[derive(Clone, Debug, PartialEq)]
pub enum Element {
    /// The link between two switches, cut (one end set down: nothing crosses it either way).
    Link(String, String),
    /// A switch: every interface of it set down, so every neighbour loses its carrier.
    Switch(String),
    /// A gray link: the first switch's port to the second drops this percentage of what it
    /// sends, carrier up (`crate::lossy::LossyLink`, which the caller holds: see
    /// [`Element::gray`]).
    Gray(String, String, f64),
}

impl std::str::FromStr for Element {
    type Err = String;

    /// `a0:c0` a link, `a2` a switch, `gray:a0:c0:2` a link dropping 2% from a0 to c0.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if let Some(rest) = s.strip_prefix("gray:") {
            let parts: Vec<&str> = rest.split(':').collect();
            return match parts[..] {
                [a, b, p] if !a.is_empty() && !b.is_empty() => match p.parse::<f64>() {
                    Ok(p) if p > 0.0 && p <= 100.0 => Ok(Self::Gray(a.into(), b.into(), p)),
                    _ => Err(format!("{s:?}: the loss is a percentage, 0 to 100")),
                },
                _ => Err(format!("{s:?}: a gray link is gray:A:B:PERCENT")),
            };
        }
        match s.split_once(':') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok(Self::Link(a.into(), b.into())),
            Some(_) => Err(format!("{s:?}: a link is A:B (two switch names)")),
            None if !s.is_empty() => Ok(Self::Switch(s.into())),
            None => Err("an element is a link A:B or a switch name".into()),
        }
    }
}

impl std::fmt::Display for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Link(a, b) => write!(f, "link {a}:{b}"),
            Self::Switch(s) => write!(f, "switch {s}"),
            Self::Gray(a, b, p) => write!(f, "gray {a}:{b} {p}%"),
        }
    }
}

impl Element {
    /// (namespace owner, interface) of every interface set down.
    fn ifaces(&self, f: &Fabric) -> Vec<(String, String)> {
        match self {
            Self::Link(a, b) | Self::Gray(a, b, _) => vec![(a.clone(), f.link_iface(a, b))],
            Self::Switch(s) => {
                let g = f.topo.graph();
                let n = g.find(s).unwrap_or_else(|| panic!("no switch {s}"));
                g.ports(n)
                    .iter()
                    .map(|(_, peer)| (s.clone(), f.link_iface(s, g.name(*peer))))
                    .collect()
            }
        }
    }

    /// Fails it; returns the time just before the first interface went down.
    pub fn fail(&self, f: &Fabric) -> Result<SystemTime> {
        self.fail_timed(f).map(|(before, _)| before)
    }

    /// [`Element::fail`], also returning when the kernel had taken the first interface down.
    /// Every interface is set down from a thread of its own, at once (one after another, each
    /// would wait for the kernel's teardown of the one before).
    pub fn fail_timed(&self, f: &Fabric) -> Result<(SystemTime, SystemTime)> {
        if let Self::Gray(..) = self {
            return Err(Error::Failed(format!(
                "{self} is made lossy with Element::gray, not set down"
            )));
        }
        let ifaces = self.ifaces(f);
        let times: Vec<Result<(SystemTime, SystemTime)>> = std::thread::scope(|s| {
            let handles: Vec<_> = ifaces
                .iter()
                .map(|(node, iface)| {
                    let ns = f.ns(node);
                    s.spawn(move || ns.set_up_timed(iface, false))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Failed("a set-down thread panicked".into())))
                })
                .collect()
        });
        let times = times.into_iter().collect::<Result<Vec<_>>>()?;
        self.report(f, false)?;
        let now = SystemTime::now();
        let first = times.iter().map(|t| t.0).min().unwrap_or(now);
        let first_done = times.iter().map(|t| t.1).min().unwrap_or(now);
        Ok((first, first_done))
    }

    /// A gray link's `tc_lossy`, attached and dropping nothing yet (`None` for other elements).
    pub fn gray(&self, f: &Fabric) -> Result<Option<(crate::lossy::LossyLink, f64)>> {
        match self {
            Self::Gray(a, b, p) => Ok(Some((
                crate::lossy::LossyLink::attach(f.ns(a), &f.link_iface(a, b))?,
                *p,
            ))),
            _ => Ok(None),
        }
    }

    pub fn restore(&self, f: &Fabric) -> Result<()> {
        if let Self::Gray(..) = self {
            // Its `LossyLink` heals it; a drain by the path meter ends with the operator's
            // trust, handed back to the meter at once.
            return Ok(());
        }
        for (node, iface) in self.ifaces(f) {
            f.ns(&node).set_up(&iface, true)?;
        }
        self.report(f, true)
    }

    /// Switches without agents (hashing routers) report no port: their routing converges
    /// and the testbed tells the controller of its links going down or up, as
    /// `Fabric::cut_link` does.
    fn report(&self, f: &Fabric, up: bool) -> Result<()> {
        if crate::routers::switches_have_agents(f) {
            return Ok(());
        }
        crate::routers::reroute(f)?;
        let g = f.topo.graph();
        let ends: Vec<(String, String)> = match self {
            Self::Link(a, b) | Self::Gray(a, b, _) => vec![(a.clone(), b.clone())],
            Self::Switch(s) => {
                let n = g.find(s).unwrap_or_else(|| panic!("no switch {s}"));
                g.ports(n)
                    .iter()
                    .map(|(_, peer)| (s.clone(), g.name(*peer).to_owned()))
                    .collect()
            }
        };
        for (a, b) in ends {
            f.sopactl(&["link", if up { "up" } else { "down" }, &a, &b])?;
        }
        Ok(())
    }

    /// The links the controller reports down once it knows.
    pub fn links(&self, f: &Fabric) -> usize {
        self.ifaces(f).len()
    }

    /// The switches that see this element's failure on a port of their own (and repair it).
    pub fn neighbours(&self, f: &Fabric) -> Vec<String> {
        let g = f.topo.graph();
        match self {
            Self::Link(a, b) => vec![a.clone(), b.clone()],
            // No carrier is lost: nobody repairs locally.
            Self::Gray(..) => Vec::new(),
            Self::Switch(s) => {
                let n = g.find(s).unwrap_or_else(|| panic!("no switch {s}"));
                g.ports(n)
                    .iter()
                    .filter(|(_, p)| g.node(*p).kind.is_switch())
                    .map(|(_, p)| g.name(*p).to_owned())
                    .collect()
            }
        }
    }
}

/// When a switch agent repaired `tc_forward` after a port of its own went down, at or after
/// `since`, from its log: (when the link event reached the agent, when the maps were written).
pub fn repairs(log: &str, since: SystemTime) -> Vec<(SystemTime, SystemTime)> {
    let since_us = since
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let field = |l: &str, name: &str| -> Option<u64> {
        let v = l.split(&format!("{name}=")).nth(1)?;
        let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    };
    let at = |us: u64| std::time::UNIX_EPOCH + Duration::from_micros(us);
    log.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("tc_forward repaired locally") && l.contains("up=false"))
        .filter_map(|l| {
            Some((
                field(&l, "received_unix_us")?,
                field(&l, "written_unix_us")?,
            ))
        })
        .filter(|(received, _)| *received >= since_us)
        .map(|(received, written)| (at(received), at(written)))
        .collect()
}

/// `line` without terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The links a failure of `element` takes down.
pub fn element_links(f: &Fabric, element: &Element) -> Vec<LinkId> {
    let g = f.topo.graph();
    let id = |n: &str| g.find(n).unwrap_or_else(|| panic!("no node {n}"));
    match element {
        Element::Link(a, b) | Element::Gray(a, b, _) => g.links_between(id(a), id(b)).collect(),
        Element::Switch(s) => g.ports(id(s)).iter().map(|(l, _)| *l).collect(),
    }
}

/// Flow `src -> dst`'s candidate paths: hops, and whether the path crosses a link of `dead`.
pub fn paths_through(f: &Fabric, src: &str, dst: &str, dead: &[LinkId]) -> Vec<((u8, u8), bool)> {
    let g = f.topo.graph();
    let (s, d) = (g.find(src).unwrap(), g.find(dst).unwrap());
    let table = PathTable::compute(&f.topo, s, &Failures::none(g)).expect("a path table");
    let rack = f.topo.rack_of(d).expect("a host");
    let mut out = Vec::new();
    for dest in table.destinations.iter().filter(|x| x.rack.tor == rack.tor) {
        for c in &dest.candidates {
            out.push((
                (c.hops.hop0, c.hops.hop1),
                table.links(c).iter().any(|l| dead.contains(l)),
            ));
        }
    }
    out
}

/// (time, cumulative bytes received) of one interface.
pub type Samples = Vec<(SystemTime, u64)>;

/// Bytes each receiver's interface received, sampled at a fixed period on a thread inside its
/// namespace (`/proc/thread-self/net/dev`: no process started per sample).
pub struct Timeline {
    stop: Arc<AtomicBool>,
    threads: Vec<(String, JoinHandle<Result<Samples>>)>,
}

/// Cumulative received bytes of `iface` in the calling thread's namespace.
fn rx_bytes(iface: &str) -> Option<u64> {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").ok()?;
    dev.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        (name.trim() == iface).then(|| rest.split_whitespace().next()?.parse().ok())?
    })
}

impl Timeline {
    /// Starts sampling the fabric interface of every host in `hosts` each `period`.
    pub fn start(f: &Fabric, hosts: &[String], period: Duration) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let g = f.topo.graph();
        let mut threads = Vec::new();
        for h in hosts {
            let id = g
                .find(h)
                .ok_or_else(|| Error::Failed(format!("no host {h}")))?;
            let iface = f.host_ifaces[&id].clone();
            let flag = Arc::clone(&stop);
            let t = f.ns(h).spawn(move || {
                let mut out = Vec::new();
                while !flag.load(Ordering::Relaxed) {
                    if let Some(b) = rx_bytes(&iface) {
                        out.push((SystemTime::now(), b));
                    }
                    std::thread::sleep(period);
                }
                out
            });
            threads.push((h.clone(), t));
        }
        Ok(Self { stop, threads })
    }

    /// Stops sampling: host -> (time, cumulative bytes received).
    pub fn finish(self) -> Result<BTreeMap<String, Samples>> {
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|(h, t)| {
                let samples = t
                    .join()
                    .map_err(|_| Error::Failed(format!("the sampler of {h} panicked")))??;
                Ok((h, samples))
            })
            .collect()
    }
}

/// Goodput in Mbit/s per `bin` from `start`, from cumulative byte samples (bins after the last
/// sample are left out).
pub fn rates(samples: &[(SystemTime, u64)], start: SystemTime, bin: Duration) -> Vec<f64> {
    let Some(&(last_t, _)) = samples.last() else {
        return Vec::new();
    };
    let span = last_t.duration_since(start).unwrap_or_default();
    let bins = (span.as_secs_f64() / bin.as_secs_f64()).floor() as usize;
    // Bytes at time t: the last sample at or before it.
    let at = |t: SystemTime| {
        samples
            .iter()
            .take_while(|(s, _)| *s <= t)
            .last()
            .map_or(samples[0].1, |(_, b)| *b)
    };
    (0..bins)
        .map(|i| {
            let (a, b) = (start + bin * i as u32, start + bin * (i as u32 + 1));
            (at(b) - at(a)) as f64 * 8.0 / 1e6 / bin.as_secs_f64()
        })
        .collect()
}

/// How a flow came through a failure at bin `onset`.
#[derive(Clone, Debug, PartialEq)]
pub struct Recovery {
    /// Mean rate before the failure (Mbit/s).
    pub before: f64,
    /// Whether the averaged rate after the onset fell below `share` of it at any time.
    pub affected: bool,
    /// From the onset until the averaged rate was back at `share` of the rate before
    /// (seconds); `None`: never within the samples.
    pub back_after_s: Option<f64>,
}

/// The recovery of a flow whose per-bin rates are `rates`, failed at bin `onset`: its rate
/// before is the mean of the bins before the onset after the first `skip` (slow start left
/// out); after the onset, the rate averaged over `window` bins is compared with `share` of it.
pub fn recovery(
    rates: &[f64],
    bin: Duration,
    onset: usize,
    skip: usize,
    share: f64,
    window: usize,
) -> Recovery {
    let before_bins = &rates[skip.min(onset)..onset.min(rates.len())];
    let before = before_bins.iter().sum::<f64>() / before_bins.len().max(1) as f64;
    let after = rates.get(onset..).unwrap_or(&[]);
    let window = window.max(1);
    let averaged: Vec<f64> = (0..after.len().saturating_sub(window - 1))
        .map(|i| after[i..i + window].iter().sum::<f64>() / window as f64)
        .collect();
    let good = |r: &f64| *r >= share * before;
    let affected = averaged.iter().any(|r| !good(r));
    let back = averaged.iter().position(good);
    Recovery {
        before,
        affected,
        back_after_s: back.map(|i| i as f64 * bin.as_secs_f64()),
    }
}

/// From bin `onset` until the rate averaged over `window` bins reaches `target` (seconds).
pub fn recovery_to(
    rates: &[f64],
    bin: Duration,
    onset: usize,
    target: f64,
    window: usize,
) -> Option<f64> {
    let after = rates.get(onset..).unwrap_or(&[]);
    let window = window.max(1);
    (0..after.len().saturating_sub(window - 1))
        .position(|i| after[i..i + window].iter().sum::<f64>() / window as f64 >= target)
        .map(|i| i as f64 * bin.as_secs_f64())
}

/// Sends `bytes` from `src` to `dst` (at `addr`, TCP `port`) and, once `a`'s port to `b` has
/// sent `after` more packets (the event that the transfer is under way on that link), cuts the
/// link `a`-`b` ([`Fabric::cut_link`]). Returns the transfer, which must complete, and the
/// time of the cut.
pub fn transfer_cut_midway(
    f: &Fabric,
    (src, dst, addr, port): (&str, &str, std::net::Ipv4Addr, u16),
    (a, b): (&str, &str),
    after: u64,
    bytes: u64,
) -> Result<(crate::traffic::Transfer, SystemTime)> {
    let iface = f.link_iface(a, b);
    let start = f.ns(a).tx_packets(&iface)?;
    std::thread::scope(|s| {
        let (from, to) = (f.ns(src), f.ns(dst));
        let t = s.spawn(move || {
            crate::traffic::tcp_transfer(
                from,
                to,
                addr,
                port,
                bytes,
                &crate::traffic::SendOptions::default(),
            )
        });
        while f.ns(a).tx_packets(&iface)? < start + after {
            if t.is_finished() {
                return Err(Error::Failed(format!(
                    "the transfer ended before {a}:{b} carried {after} packets"
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let cut = f.cut_link(a, b)?;
        let t = t
            .join()
            .map_err(|_| Error::Failed("the transfer's thread panicked".into()))??;
        Ok((t, cut))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repairs_are_read_off_the_switch_log() {
        let log = "2026-12-02T21:00:00Z  INFO sopa_agent::switch::failover: port changed: tc_forward repaired locally port=\"a0:c0\" up=false took_us=40 received_unix_us=1700000000000060 \u{1b}[3mwritten_unix_us\u{1b}[0m\u{1b}[2m=\u{1b}[0m1700000000000100\n\
                   2026-12-02T21:00:01Z  INFO sopa_agent::switch::failover: port changed: tc_forward repaired locally port=\"a0:c0\" up=true received_unix_us=1700000001000000 written_unix_us=1700000001000000\n\
                   ... received_unix_us=1600000000000000 written_unix_us=1600000000000000 tc_forward repaired locally up=false\n";
        let since = std::time::UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_000);
        assert_eq!(
            repairs(log, since),
            vec![(
                std::time::UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_060),
                std::time::UNIX_EPOCH + Duration::from_micros(1_700_000_000_000_100)
            )]
        );
    }

    #[test]
    fn elements_parse() {
        assert_eq!("a0:c0".parse(), Ok(Element::Link("a0".into(), "c0".into())));
        assert_eq!("a2".parse(), Ok(Element::Switch("a2".into())));
        assert!("a0:".parse::<Element>().is_err());
        assert!("".parse::<Element>().is_err());
    }

    #[test]
    fn rates_come_from_cumulative_samples() {
        let t0 = SystemTime::UNIX_EPOCH;
        let ms = |m: u64| t0 + Duration::from_millis(m);
        // 125,000 bytes per 100 ms = 10 Mbit/s, then nothing for 200 ms, then 10 again.
        let samples = vec![
            (ms(0), 0),
            (ms(100), 125_000),
            (ms(200), 250_000),
            (ms(300), 250_000),
            (ms(400), 250_000),
            (ms(500), 375_000),
        ];
        let r = rates(&samples, t0, Duration::from_millis(100));
        assert_eq!(r, vec![10.0, 10.0, 0.0, 0.0, 10.0]);
        let rec = recovery(&r, Duration::from_millis(100), 2, 0, 0.9, 1);
        assert_eq!(rec.before, 10.0);
        assert!(rec.affected);
        assert_eq!(rec.back_after_s, Some(0.2));
        // Averaged over two bins: bin 3 with bin 4 is 5 Mbit/s, not back; then the samples end.
        let rec = recovery(&r, Duration::from_millis(100), 2, 0, 0.9, 2);
        assert_eq!(rec.back_after_s, None);
        assert_eq!(
            recovery_to(&r, Duration::from_millis(100), 2, 9.0, 1),
            Some(0.2)
        );
        assert_eq!(
            recovery_to(&r, Duration::from_millis(100), 2, 11.0, 1),
            None
        );
        let steady = recovery(&[10.0; 6], Duration::from_millis(100), 3, 1, 0.9, 2);
        assert!(!steady.affected);
        assert_eq!(steady.back_after_s, Some(0.0));
    }
}
