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

use crate::{Error, Result, fabric::Fabric};

/// What fails.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Element {
    /// The link between two switches, cut (one end set down: nothing crosses it either way).
    Link(String, String),
    /// A switch: every interface of it set down, so every neighbour loses its carrier.
    Switch(String),
}

impl std::str::FromStr for Element {
    type Err = String;

    /// `a0:c0` a link, `a2` a switch.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
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
        }
    }
}

impl Element {
    /// (namespace owner, interface) of every interface set down.
    fn ifaces(&self, f: &Fabric) -> Vec<(String, String)> {
        match self {
            Self::Link(a, b) => vec![(a.clone(), f.link_iface(a, b))],
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
        let at = SystemTime::now();
        for (node, iface) in self.ifaces(f) {
            f.ns(&node).ip(&["link", "set", &iface, "down"])?;
        }
        Ok(at)
    }

    pub fn restore(&self, f: &Fabric) -> Result<()> {
        for (node, iface) in self.ifaces(f) {
            f.ns(&node).ip(&["link", "set", &iface, "up"])?;
        }
        Ok(())
    }

    /// The links the controller reports down once it knows.
    pub fn links(&self, f: &Fabric) -> usize {
        self.ifaces(f).len()
    }
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
    /// Whether any bin after the onset fell below `share` of it.
    pub affected: bool,
    /// From the onset until the flow held `share` of its rate before for `hold` bins in a row
    /// (seconds); `None`: never within the samples.
    pub back_after_s: Option<f64>,
}

/// The recovery of a flow whose per-bin rates are `rates`, failed at bin `onset`: its rate
/// before is the mean of the `onset - skip` bins before it after `skip` (slow start left out).
pub fn recovery(
    rates: &[f64],
    bin: Duration,
    onset: usize,
    skip: usize,
    share: f64,
    hold: usize,
) -> Recovery {
    let before_bins = &rates[skip.min(onset)..onset.min(rates.len())];
    let before = before_bins.iter().sum::<f64>() / before_bins.len().max(1) as f64;
    let after = rates.get(onset..).unwrap_or(&[]);
    let good = |r: &f64| *r >= share * before;
    let affected = after.iter().any(|r| !good(r));
    let back =
        (0..after.len()).find(|&i| after.len() >= i + hold && after[i..i + hold].iter().all(good));
    Recovery {
        before,
        affected,
        back_after_s: back.map(|i| i as f64 * bin.as_secs_f64()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let steady = recovery(&[10.0; 6], Duration::from_millis(100), 3, 1, 0.9, 2);
        assert!(!steady.affected);
        assert_eq!(steady.back_after_s, Some(0.0));
    }
}
